"""``verifiers``: an environment of Prime Intellect's ``verifiers`` hub as a horizonrl environment.

::

    env:
      name: verifiers
      knobs: {id: my_env, args: {difficulty: 2}}   # path: a directory with my_env.py, if not installed

Supported API: the classic (v0) environment API of ``verifiers`` 0.3.1 (``vf.load_environment``,
``vf.Environment`` with a dataset, a rubric, and ``SingleTurnEnv`` / ``MultiTurnEnv`` / ``ToolEnv``
rollouts), pinned in ``requirements/lock-hubs.txt`` and run in its own venv (``make test-hubs``):
verifiers pins ``mcp<2`` and ``openai>=2.9``, which the main lock does not share. Its ``verifiers.v1``
API (tasksets, harnesses in runtimes) is not supported.

Two routes, one task list (rows of the environment's dataset; see :func:`verifiers_tasks`):

- **in process** (``env.name: verifiers``, every trainer): the environment's own ``rollout`` runs on a
  background event loop with a client (:class:`_Bridge`) whose every model request is handed to the
  horizonrl agent and answered with the policy's message. ``reset`` returns the first request's user
  message (its system message becomes the system prompt); ``step`` answers the pending request with the
  assistant message (``<tool_call>`` blocks become OpenAI ``tool_calls``, so ``ToolEnv`` runs its own
  tools) and returns the messages the environment adds before its next request, each its own message
  (tool results: role ``tool`` with their ``tool_call_id``, else ``user``), so two parallel calls are
  answered by two tool messages as the chat template renders them. When the rollout ends, the
  environment's rubric scores it (``rubric.score_rollout``): the last step's reward is the rubric's
  reward, success is a reward of at least the environment's ``pass_threshold``, and the rubric's
  metrics are in ``Turn.info["env_metrics"]``;
- **through the gateway** (``gateway.callable: horizonrl.envs.hubs.verifiers_env:gateway_rollout``): the
  same rollout code talks to horizonrl's recording gateway with verifiers' own OpenAI client, for
  environments with custom loops; the gateway records the sessions token-exactly and the rubric's
  reward is the episode's.

What does not map, refused when the environment loads or the episode starts (a ConfigError naming
it): few-shot examples or other multi-message prompts, a system prompt that differs between rows,
non-text message content, per-row ``tool_defs``, group-level reward functions (``score_group``), a
prompt rewritten between turns (``get_prompt_messages`` overridden) and the v1 API. The rollout lives
in a coroutine, so there is no snapshot/restore (``can_fork`` is false: RTPO refuses the
environment). An exception inside the environment ends that episode with ``info["env_error"]``: a
``vf.Error`` (recorded by verifiers in its state) keeps the rubric's score, any other exception gives
reward 0 (as a reward that is not a finite number does); a rollout that neither asks nor finishes
within ``timeout_s`` is cancelled.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import functools
import json
import os
import queue
import random
import sys
import threading
import time
from typing import Any, ClassVar

from horizonrl.envs.core.base import Env, EnvMessage, StepResult, Task
from horizonrl.envs.core.common import check_seconds, fill_knobs, finite_number, split_of
from horizonrl.envs.core.registry import register_env
from horizonrl.envs.core.tools import TOOL_CLOSE, TOOL_OPEN, Tool, ToolCall, ToolCallError, parse_tool_calls
from horizonrl.errors import ConfigError
from horizonrl.textparse import strip_blocks

__all__ = ["VerifiersEnv", "gateway_rollout", "load_verifiers_env", "verifiers_tasks"]

SUPPORTED = "0.3.1"
_MODEL = "horizonrl-policy"


def _vf():
    try:
        import verifiers as vf
    except ImportError:
        raise ConfigError(
            f"env.name=verifiers needs the 'verifiers' package ({SUPPORTED}): it cannot share the main "
            "venv (it pins mcp<2); `make test-hubs` builds .venv-hubs with it"
        ) from None
    if not hasattr(vf, "load_environment") or not hasattr(vf, "Environment"):
        raise ConfigError(f"verifiers {vf.__version__}: the classic API (vf.load_environment) is missing")
    return vf


@functools.cache
def _load(env_id: str, args_json: str, path: str | None = None):
    vf = _vf()
    if path is not None and path not in sys.path:
        sys.path.insert(0, path)
    try:
        env = vf.load_environment(env_id, **json.loads(args_json))
    except Exception as e:  # an unknown id, a bad argument: one line, no traceback
        raise ConfigError(
            f"env.knobs.id={env_id!r}: verifiers could not load it: {type(e).__name__}: {e}"
        ) from None
    _check_supported(env_id, env)
    return env


def load_verifiers_env(env_id: str, args: dict[str, Any] | None = None, path: str | None = None):
    """The ``vf.Environment`` of ``env_id`` (its module, importable, or in directory ``path``) built with
    ``args`` (once per process), checked for the features this adapter maps."""
    return _load(env_id, json.dumps(args or {}, sort_keys=True), path)


def _check_supported(env_id: str, env: Any) -> None:
    vf = _vf()
    where = f"verifiers environment {env_id!r}"
    if not isinstance(env, vf.Environment):
        raise ConfigError(f"{where}: load_environment returned {type(env).__name__}, not a vf.Environment")
    if getattr(env, "few_shot", None):
        raise ConfigError(f"{where}: few-shot examples (few_shot) are not supported")
    rubric = env.rubric
    if getattr(rubric, "has_group_rewards", False):
        raise ConfigError(f"{where}: group-level reward functions (score_group) are not supported")
    if not isinstance(env, vf.MultiTurnEnv):
        raise ConfigError(
            f"{where}: {type(env).__name__} is not a MultiTurnEnv (SingleTurnEnv, ToolEnv, ...)"
        )
    if type(env).get_prompt_messages is not vf.MultiTurnEnv.get_prompt_messages:
        raise ConfigError(f"{where}: get_prompt_messages is overridden (non-linear message sequences)")
    for name in ("rollout", "_run_rollout_state", "get_dataset"):
        if not hasattr(env, name):
            raise ConfigError(f"{where}: {name} is missing (verifiers {SUPPORTED}'s classic API expected)")


def _text(content: Any, where: str) -> str:
    """A message's content as text; ConfigError for images and other non-text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
        text = part.get("text") if isinstance(part, dict) else getattr(part, "text", None)
        if kind != "text" or not isinstance(text, str):
            raise ConfigError(f"{where}: non-text message content ({kind!r}) is not supported")
        parts.append(text)
    return "".join(parts)


def _role(message: Any) -> str:
    return message["role"] if isinstance(message, dict) else message.role


def _content(message: Any) -> Any:
    return message.get("content") if isinstance(message, dict) else message.content


def _env_message(message: Any, where: str) -> EnvMessage:
    """A message the environment added, as an :class:`EnvMessage` (``tool`` keeps its call id)."""
    content = _text(_content(message), where)
    if _role(message) != "tool":
        return EnvMessage("user", content)
    get = message.get if isinstance(message, dict) else lambda k: getattr(message, k, None)
    call_id = get("tool_call_id")
    return EnvMessage("tool", content, tool_call_id=call_id or None)


def _split_prompt(prompt: list[Any], where: str) -> tuple[str | None, str]:
    """``(system, user)`` of a prompt ``[system?, user]``; ConfigError for anything longer."""
    roles = [_role(m) for m in prompt]
    if roles not in (["user"], ["system", "user"]):
        raise ConfigError(
            f"{where}: prompts of roles {roles} are not supported (few-shot or multi-message prompts); "
            "expected [system, user] or [user]"
        )
    system = _text(_content(prompt[0]), where) if roles[0] == "system" else None
    return system, _text(_content(prompt[-1]), where)


@functools.cache
def _rows(env_id: str, args_json: str, path: str | None, split: str) -> tuple[dict[str, Any], ...]:
    """The dataset rows of ``split``: the eval dataset for ``test`` where the environment has one,
    else the train rows split by hash (disjoint)."""
    env = _load(env_id, args_json, path)
    has_eval = env.build_eval_dataset() is not None
    data = env.get_eval_dataset() if split == "test" and has_eval else env.get_dataset()
    rows = []
    for i, row in enumerate(data):
        key = f"verifiers-{env_id}-{row.get('example_id', i)}"
        if has_eval or split_of(key) == split:
            rows.append({**row, "_index": i, "_split": "eval" if split == "test" and has_eval else "train"})
    return tuple(rows)


def verifiers_tasks(
    env_id: str, args: dict[str, Any], n: int, *, seed: int, split: str, path: str | None = None
) -> list[Task]:
    """``n`` tasks of ``split``: a seeded shuffle of the split's rows, cycled when ``n`` exceeds them
    (a repeated row's id gets ``#k``). ``meta`` holds what a rollout needs to rebuild its input."""
    args_json = json.dumps(args or {}, sort_keys=True)
    rows = list(_rows(env_id, args_json, path, split))
    if not rows:
        raise ConfigError(f"verifiers environment {env_id!r}: no {split} rows in its dataset")
    random.Random(f"verifiers-{env_id}-{seed}-{split}").shuffle(rows)
    tasks = []
    for j in range(n):
        row = rows[j % len(rows)]
        _, user = _split_prompt(row["prompt"], f"verifiers environment {env_id!r}")
        rid = f"verifiers-{env_id}-{split}-{row.get('example_id', row['_index'])}"
        meta = {
            "env": "verifiers",
            "split": split,
            "id": env_id,
            "args": json.loads(args_json),
            "path": path,
            "row": row["_index"],
            "source_split": row["_split"],
        }
        answer = row.get("answer")
        tasks.append(
            Task(rid + (f"#{j // len(rows)}" if j >= len(rows) else ""), user, str(answer or ""), (), meta)
        )
    return tasks


def _rollout_input(task: Task) -> dict[str, Any]:
    """The ``RolloutInput`` of ``task``'s dataset row."""
    m = task.meta
    env = load_verifiers_env(m["id"], m["args"], m.get("path"))
    data = env.get_eval_dataset() if m["source_split"] == "eval" else env.get_dataset()
    row = data[int(m["row"])]
    out = {"prompt": row["prompt"], "example_id": row.get("example_id", m["row"])}
    for k in ("answer", "info", "task"):
        if row.get(k) is not None:
            out[k] = row[k]
    return out


class _Loop:
    """One background event loop per process for the environments' coroutines."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None or cls._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="verifiers-loop", daemon=True).start()
                cls._loop = loop
            return cls._loop


@atexit.register
def _stop_loop() -> None:
    loop = _Loop._loop
    if loop is not None and not loop.is_closed():
        loop.call_soon_threadsafe(loop.stop)


@functools.cache
def _bridge_class():
    """``vf.Client`` whose native call hands the request to the agent thread (built lazily: verifiers is
    an optional dependency)."""
    vf = _vf()
    from verifiers.types import Response, ResponseMessage
    from verifiers.types import ToolCall as VFToolCall

    class _Bridge(vf.Client):
        """Requests go out on ``outbox`` as ``("request", messages, tools)``; the agent thread answers
        with :meth:`answer`. The native prompt, tool and response formats are verifiers' own."""

        def __init__(self) -> None:
            super().__init__(None)
            self.outbox: queue.Queue = queue.Queue()
            self.pending: asyncio.Future | None = None

        def setup_client(self, config):
            return None

        async def to_native_tool(self, tool):
            return tool

        async def to_native_prompt(self, messages):
            return list(messages), {}

        async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
            self.pending = asyncio.get_running_loop().create_future()
            self.outbox.put(("request", prompt, tools))
            return await self.pending

        async def raise_from_native_response(self, response):
            return None

        async def from_native_response(self, response):
            return response

        async def close(self):
            return None

        def answer(
            self, loop: asyncio.AbstractEventLoop, text: str, calls: list[ToolCall], turn: int
        ) -> None:
            tool_calls = [
                VFToolCall(id=f"call_{turn}_{i}", name=c.name, arguments=json.dumps(c.arguments))
                for i, c in enumerate(calls)
            ]
            message = ResponseMessage(
                content=text,
                tool_calls=tool_calls or None,
                finish_reason="tool_calls" if tool_calls else "stop",
                is_truncated=False,
            )
            response = Response(
                id=f"horizonrl-{turn}", created=int(time.time()), model=_MODEL, message=message
            )
            fut = self.pending
            loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(response))

        def abort(self, loop: asyncio.AbstractEventLoop) -> None:
            fut = self.pending
            if fut is not None:
                loop.call_soon_threadsafe(
                    lambda: fut.done() or fut.set_exception(RuntimeError("episode closed"))
                )

    return _Bridge


@register_env("verifiers")
class VerifiersEnv(Env):
    """A ``verifiers`` environment behind :class:`Env` (see the module docstring)."""

    KNOBS: ClassVar[dict[str, Any]] = {
        "id": None,
        "args": {},
        "path": None,
        "obs_key": "observation",
        "timeout_s": 120.0,
    }
    system_prompt = "You are a helpful assistant."

    @classmethod
    def validate_knobs(cls, knobs: dict[str, Any]) -> dict[str, Any]:
        """``knobs`` with defaults filled in; ValueError naming any unknown or bad knob."""
        return fill_knobs(cls.name, cls.KNOBS, knobs, cls._check_knobs)

    @classmethod
    def _check_knobs(cls, k: dict[str, Any]) -> None:
        if not isinstance(k["id"], str) or not k["id"]:
            raise ValueError(f"verifiers: knob 'id' must name the environment (its module), got {k['id']!r}")
        if not isinstance(k["args"], dict):
            raise ValueError(
                f"verifiers: knob 'args' must be a mapping of load_environment arguments, got {k['args']!r}"
            )
        if k["path"] is not None:
            if not (isinstance(k["path"], str) and os.path.isdir(k["path"])):
                raise ValueError(
                    f"verifiers: knob 'path' must be a directory holding the module, got {k['path']!r}"
                )
            k["path"] = os.path.abspath(k["path"])
        if k["obs_key"] not in ("observation", "none"):
            raise ValueError(
                f"verifiers: knob 'obs_key' must be 'observation' or 'none', got {k['obs_key']!r}"
            )
        check_seconds(cls.name, "timeout_s", k["timeout_s"])

    def __init__(self, **knobs: Any) -> None:
        super().__init__(**self.validate_knobs(knobs))
        self.vf_env = load_verifiers_env(self.knobs["id"], self.knobs["args"], self.knobs["path"])
        self.where = f"verifiers environment {self.knobs['id']!r}"
        defs = getattr(self.vf_env, "tool_defs", None) or []
        self._tools = [Tool(t.name, t.description or t.name, dict(t.parameters)) for t in defs]
        # the rows' system message (verifiers puts its system_prompt there); without one, the default
        self._system: str | None = self.vf_env.system_prompt or None
        if self._system:
            self.system_prompt = self._system
        self._bridge: Any = None
        self._future: concurrent.futures.Future | None = None
        self._sent: list[Any] = []

    @property
    def tools(self) -> list[Tool]:
        return self._tools

    @property
    def can_fork(self) -> bool:
        return False  # the rollout is a running coroutine

    @classmethod
    def make_tasks(cls, n: int, *, seed: int, split: str = "train", **knobs: Any) -> list[Task]:
        k = cls.validate_knobs(knobs)
        return verifiers_tasks(k["id"], k["args"], n, seed=seed, split=split, path=k["path"])

    def expert_action(self, rng: random.Random, noise: float = 0.0) -> str:
        raise NotImplementedError("verifiers environments have no scripted expert (SFT needs demonstrations)")

    def state_key(self) -> str | None:
        return self.state.get("key") if self.knobs["obs_key"] == "observation" else None

    # -- the episode ----------------------------------------------------------------------------------

    def reset(self, task: Task) -> str:
        if task.meta.get("env") != self.name:
            raise ValueError(f"task {task.id!r} is for env {task.meta.get('env')!r}, not {self.name!r}")
        self.close()
        self.state = {"turn": 0, "done": False, "key": None, "error": None}
        loop = _Loop.get()
        self._bridge = _bridge_class()()
        coro = self.vf_env._run_rollout_state(_rollout_input(task), self._bridge, _MODEL, {})
        self._future = asyncio.run_coroutine_threadsafe(coro, loop)
        kind, messages, tools = self._next()
        if kind != "request":
            self.state["done"] = True
            self.state["error"] = f"the rollout ended before its first model request ({self._outcome()[2]})"
            return f"Error: {self.state['error']}"
        try:
            names = sorted(t.name for t in tools or [])
            if names != sorted(t.name for t in self._tools):
                raise ConfigError(f"{self.where}: per-row tool_defs ({names}) are not supported")
            system, user = _split_prompt(messages, self.where)
            if system is not None and self._system is None:  # a dataset with its own prompt column
                self._system = self.system_prompt = system
            if system != self._system:
                raise ConfigError(f"{self.where}: a system prompt that differs between rows is not supported")
        except ConfigError:
            self.close()
            raise
        self._sent = list(messages)
        self.state["key"] = user
        return user

    def step(self, action: str) -> StepResult:
        st = self.state
        if st["done"]:
            info = self._info()
            if st["error"] and not st["turn"]:  # the rollout failed before its first request
                st["turn"] += 1
                info["env_error"] = st["error"]
            return StepResult("The episode is over.", role="user", done=True, invalid=True, info=info)
        st["turn"] += 1
        calls = parse_tool_calls(action, self._tools) if self._tools else []
        errors = [c for c in calls if isinstance(c, ToolCallError)]
        if errors:  # the environment is not stepped; the policy sees why, one tool message per bad call
            return StepResult(
                messages=[EnvMessage("tool", e.message, name=e.name) for e in errors],
                invalid=True,
                obs_key=self.state_key(),
                info={"tool_errors": len(errors)},
            )
        good = [c for c in calls if isinstance(c, ToolCall)]
        text = (
            strip_blocks(action, TOOL_OPEN, TOOL_CLOSE).strip() if good else action
        )  # calls go as tool_calls
        self._bridge.answer(_Loop.get(), text, good, st["turn"])
        kind, messages, _ = self._next()
        if kind == "request":
            return self._observe(messages, len(good))
        return self._finish(len(good))

    def _observe(self, messages: list[Any], n_calls: int) -> StepResult:
        """The messages the environment added after the assistant's (the next request's tail), each its
        own :class:`EnvMessage`: a tool result keeps its ``tool_call_id``; any other role is a user
        message."""
        k = len(self._sent) + 1
        if len(messages) < k:
            raise ConfigError(f"{self.where}: the prompt was rewritten between turns (non-linear messages)")
        added = [_env_message(m, self.where) for m in messages[k:]]
        self._sent = list(messages)
        if not added:  # two requests in a row with nothing between: an empty user message, as before
            added = [EnvMessage("user", "")]
        result = StepResult(
            messages=added,
            obs_key=None,
            tool_calls=n_calls,
            info={"turn": self.state["turn"]},
        )
        self.state["key"] = result.observation
        result.obs_key = self.state_key()
        return result

    def _finish(self, n_calls: int) -> StepResult:
        st = self.state
        st["done"] = True
        reward, success, error = self._outcome()
        info = self._info()
        if error:
            info["env_error"] = error
        return StepResult(
            st.get("final") or "The episode is over.",
            reward=reward,
            done=True,
            success=success,
            role="user",
            obs_key=self.state_key(),
            tool_calls=n_calls,
            info=info,
        )

    def _outcome(self) -> tuple[float, bool, str | None]:
        """``(reward, success, error)`` of the finished rollout (scored by the environment's rubric)."""
        st = self.state
        timeout = float(self.knobs["timeout_s"])
        try:
            vf_state = self._future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            self.close()
            return 0.0, False, f"the rollout did not finish within timeout_s={timeout:g}"
        except Exception as e:
            return 0.0, False, f"the rollout raised {type(e).__name__}: {e}"
        error = vf_state.get("error")
        reward = finite_number(vf_state.get("reward"))
        st["metrics"] = {
            k: v for k, v in (vf_state.get("metrics") or {}).items() if finite_number(v) is not None
        }
        final = vf_state.get("final_env_response")
        if final:
            st["final"] = "\n".join(_text(_content(m), self.where) for m in final)
        if reward is None:
            return 0.0, False, f"reward {vf_state.get('reward')!r} is not a finite number; counted as 0"
        threshold = float(getattr(self.vf_env, "pass_threshold", 0.5))
        return reward, reward >= threshold, (f"{type(error).__name__}: {error}" if error else None)

    def _info(self) -> dict[str, Any]:
        return {"turn": self.state.get("turn", 0), "env_metrics": dict(self.state.get("metrics") or {})}

    def _next(self) -> tuple[str, Any, Any]:
        """The rollout's next model request, or ``("done", None, None)`` when it has ended."""
        deadline = time.monotonic() + float(self.knobs["timeout_s"])
        while time.monotonic() < deadline:
            try:
                return self._bridge.outbox.get(timeout=0.05)
            except queue.Empty:
                if self._future.done() and self._bridge.outbox.empty():
                    break
        return "done", None, None  # finished, or stuck: _outcome reports which

    def close(self) -> None:
        if self._bridge is not None and self._future is not None and not self._future.done():
            self._bridge.abort(_Loop.get())  # a pending request fails: the rollout ends and cleans up
            with contextlib.suppress(Exception):  # the aborted rollout's own error is not the caller's
                self._future.result(timeout=2)
            self._future.cancel()  # stuck elsewhere (a slow env_response): cancelled
        self._bridge = self._future = None


def gateway_rollout(task: dict[str, Any], base_url: str, api_key: str) -> float:
    """Route (b), a gateway harness callable: the environment's rollout against the recording gateway
    with verifiers' own OpenAI chat client; returns the rubric's reward (0 if not a finite number)."""
    from openai import AsyncOpenAI

    vf = _vf()
    t = Task(task["id"], task["prompt"], task.get("answer", ""), tuple(task.get("aliases", ())), task["meta"])
    env = load_verifiers_env(t.meta["id"], t.meta["args"], t.meta.get("path"))

    async def run() -> Any:
        client = vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url=base_url, api_key=api_key))
        return await env._run_rollout_state(_rollout_input(t), client, "policy", {})

    state = asyncio.run(run())
    return finite_number(state.get("reward")) or 0.0
