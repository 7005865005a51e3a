"""``mcp``: the tools of a local MCP server (stdio) as the policy's tools.

::

    env:
      name: mcp
      knobs: {command: [python, my_server.py]}
      tasks: {path: tasks.jsonl}
      reward: exact_match

:class:`MCPServer` starts the server with the ``mcp`` SDK (``stdio_client`` + ``ClientSession``
on an event loop in a background thread, so the environment stays synchronous), lists its tools
once and answers ``tools/call`` requests. :class:`MCPEnv` declares the listed tools (name,
description, input schema) as :class:`~horizonrl.envs.core.tools.Tool`\\ s, so calls are parsed and
validated like any other tool call, and a call's result (its text content; structured content as
JSON) is the observation of an ordinary tool turn; a result flagged ``is_error``, a timeout or a
transport failure is an ``Error: ...`` observation with the step marked invalid. It is a QA-style
:class:`~horizonrl.envs.core.custom.CustomEnv`: tasks from ``env.tasks``, the final answer graded by
``env.reward`` (default normalized exact match); subclasses may add ``@tool`` methods.

Servers are shared: every environment of a process with the same ``command``/``env``/``cwd`` talks
to one server process (started on first use, stopped at exit), so a server must not keep
per-episode state, or the episodes would see each other. For the same reason ``can_fork`` is false
(RTPO cannot restore a server) unless ``stateless: true`` declares that it is safe.

Knobs: ``command`` (a list, or a string split like a shell would), ``env`` (extra environment
variables of the server), ``cwd``, ``stateless`` (default false), ``call_timeout_s`` (default 30),
``startup_timeout_s`` (default 60), ``max_output_chars`` (default 4000), ``log`` (a file that
receives the server's stderr; default: discarded).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import json
import os
import shlex
import threading
from typing import Any, ClassVar

from horizonrl.envs.core.common import check_bool, check_env_vars, check_seconds
from horizonrl.envs.core.custom import CustomEnv
from horizonrl.envs.core.registry import register_env
from horizonrl.envs.core.tools import Tool, ToolCall

__all__ = ["MCPEnv", "MCPError", "MCPServer", "server_for"]


class MCPError(RuntimeError):
    """The MCP server could not be started or listed (one line, with the command)."""


class MCPServer:
    """One running MCP server over stdio with a synchronous interface."""

    def __init__(
        self,
        command: list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        startup_timeout_s: float = 60.0,
        log: str | None = None,
    ) -> None:
        try:
            from mcp import ClientSession, StdioServerParameters, stdio_client
        except ImportError:
            raise MCPError(
                "the mcp environment needs the 'mcp' package: pip install 'horizonrl[mcp]'"
            ) from None
        self.command = list(command)
        self._sdk = (ClientSession, StdioServerParameters, stdio_client)
        self._params = StdioServerParameters(command=command[0], args=command[1:], env=env, cwd=cwd)
        self._errlog = open(log or os.devnull, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._loop = asyncio.new_event_loop()
        self._queue: asyncio.Queue | None = None
        self._ready: concurrent.futures.Future = concurrent.futures.Future()
        self._done: concurrent.futures.Future = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, name=f"mcp:{command[0]}", daemon=True)
        self._thread.start()
        try:
            self.tools: list[Any] = self._ready.result(timeout=startup_timeout_s)
        except concurrent.futures.TimeoutError:
            self.close()
            raise MCPError(
                f"MCP server {shlex.join(command)} did not start in {startup_timeout_s:g} s"
            ) from None
        except Exception as e:
            self.close()
            raise MCPError(
                f"MCP server {shlex.join(command)} failed to start: {type(e).__name__}: {e}"
            ) from None

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()

    async def _main(self) -> None:
        session_cls, _, stdio_client = self._sdk
        self._queue = asyncio.Queue()
        try:
            async with (
                stdio_client(self._params, errlog=self._errlog) as (read, write),
                session_cls(read, write) as session,
            ):
                await session.initialize()
                tools, cursor = [], None
                for _ in range(100):  # paginated listing, bounded
                    listed = await (session.list_tools(cursor=cursor) if cursor else session.list_tools())
                    tools.extend(listed.tools)
                    cursor = getattr(listed, "next_cursor", None) or getattr(listed, "nextCursor", None)
                    if not cursor:
                        break
                self._ready.set_result(tools)
                while (item := await self._queue.get()) is not None:
                    name, arguments, timeout_s, future = item
                    try:
                        result = await asyncio.wait_for(session.call_tool(name, arguments), timeout_s)
                    except BaseException as e:  # reported to the caller, never kills the loop
                        if not future.done():
                            future.set_exception(e if isinstance(e, Exception) else RuntimeError(repr(e)))
                    else:
                        if not future.done():
                            future.set_result(result)
        except BaseException as e:
            if not self._ready.done():
                self._ready.set_exception(e if isinstance(e, Exception) else RuntimeError(repr(e)))
        finally:
            self._done.set_result(None)

    @property
    def alive(self) -> bool:
        return self._ready.done() and not self._done.done()

    def call(self, name: str, arguments: dict[str, Any], timeout_s: float) -> Any:
        """The ``CallToolResult`` of ``tools/call`` (raises on timeout or a dead server)."""
        if not self.alive:
            raise MCPError(f"MCP server {shlex.join(self.command)} is not running")
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._loop.call_soon_threadsafe(self._queue.put_nowait, (name, arguments, timeout_s, future))  # type: ignore[union-attr]
        return future.result(timeout=timeout_s + 5)

    def close(self) -> None:
        """Stop the server (its process ends with the SDK's stdio client)."""
        if self._thread.is_alive() and self._queue is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._queue.put_nowait, None)
        self._thread.join(timeout=10)
        with contextlib.suppress(OSError):
            self._errlog.close()


_servers: dict[str, MCPServer] = {}
_servers_lock = threading.Lock()


def server_for(
    command: list[str],
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    startup_timeout_s: float = 60.0,
    log: str | None = None,
) -> MCPServer:
    """The process-wide server for this command (started on first use, restarted if it died)."""
    key = json.dumps([command, env, cwd], sort_keys=True)
    with _servers_lock:
        server = _servers.get(key)
        if server is None or not server.alive:
            server = MCPServer(command, env=env, cwd=cwd, startup_timeout_s=startup_timeout_s, log=log)
            _servers[key] = server
        return server


@atexit.register
def _close_all() -> None:
    for server in list(_servers.values()):
        server.close()
    _servers.clear()


def _field(obj: Any, *names: str) -> Any:
    for n in names:
        value = getattr(obj, n, None)
        if value is not None:
            return value
    return None


def _result_text(result: Any) -> tuple[str, bool]:
    """The observation text of a ``CallToolResult`` and whether it reports an error."""
    parts = []
    for block in _field(result, "content") or []:
        text = getattr(block, "text", None)
        parts.append(text if isinstance(text, str) else f"[{getattr(block, 'type', 'content')}]")
    structured = _field(result, "structured_content", "structuredContent")
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False))
    return "\n".join(parts) or "(no output)", bool(_field(result, "is_error", "isError"))


@register_env("mcp")
class MCPEnv(CustomEnv):
    """The tools of a local MCP server (stdio), with tasks from a file (see module docstring)."""

    KNOBS: ClassVar[dict[str, Any]] = {
        "command": None,
        "env": None,
        "cwd": None,
        "stateless": False,
        "call_timeout_s": 30.0,
        "startup_timeout_s": 60.0,
        "max_output_chars": 4000,
        "log": None,
    }
    system_prompt: ClassVar[str] = (
        "Use the tools to find what the task asks. Call a tool with "
        '<tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>. '
        "Give the final answer as <answer>...</answer>."
    )

    @classmethod
    def _check_knobs(cls, knobs: dict[str, Any]) -> None:
        command = knobs["command"]
        if isinstance(command, str):
            command = shlex.split(command)
        if not isinstance(command, list) or not command or not all(isinstance(c, str) and c for c in command):
            raise ValueError(
                f"{cls.name}: knob 'command' must be the server's command line, got {knobs['command']!r}"
            )
        knobs["command"] = command
        check_env_vars(cls.name, "env", knobs["env"])
        for k in ("cwd", "log"):
            if knobs[k] is not None and not (isinstance(knobs[k], str) and knobs[k]):
                raise ValueError(f"{cls.name}: knob {k!r} must be a path or null, got {knobs[k]!r}")
        check_bool(cls.name, "stateless", knobs["stateless"])
        for k in ("call_timeout_s", "startup_timeout_s"):
            check_seconds(cls.name, k, knobs[k])
        v = knobs["max_output_chars"]
        if isinstance(v, bool) or not isinstance(v, int) or not 100 <= v <= 1_000_000:
            raise ValueError(
                f"{cls.name}: knob 'max_output_chars' must be an integer in [100, 1000000], got {v!r}"
            )

    def __init__(self, **knobs: Any) -> None:
        super().__init__(**knobs)
        k = self.knobs
        self.server = server_for(k["command"], k["env"], k["cwd"], float(k["startup_timeout_s"]), k["log"])
        own = [t.name for t in super().tools]
        self._server_tools = {}
        for t in self.server.tools:
            schema = _field(t, "input_schema", "inputSchema") or {"type": "object", "properties": {}}
            if t.name in own:
                raise MCPError(f"MCP tool {t.name!r} has the name of a @tool method of {type(self).__name__}")
            self._server_tools[t.name] = Tool(t.name, _field(t, "description") or t.name, dict(schema))

    @property
    def tools(self) -> list[Tool]:
        return [*super().tools, *self._server_tools.values()]

    @property
    def can_fork(self) -> bool:
        return bool(self.knobs["stateless"])

    def _call_tool(self, call: ToolCall) -> tuple[str, bool]:
        if call.name not in self._server_tools:
            return super()._call_tool(call)
        timeout = float(self.knobs["call_timeout_s"])
        try:
            result = self.server.call(call.name, dict(call.arguments), timeout)
        except (TimeoutError, concurrent.futures.TimeoutError):
            return f"Error: {call.name} did not answer in {timeout:g} s", True
        except Exception as e:
            return f"Error: {call.name} failed: {type(e).__name__}: {e}", True
        text, is_error = _result_text(result)
        cap = self.knobs["max_output_chars"]
        if len(text) > cap:
            text = text[:cap] + f"\n[... {len(text) - cap} more characters]"
        if is_error and not text.lower().startswith("error"):
            text = f"Error: {text}"
        return text, is_error
