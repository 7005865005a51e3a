"""``openenv``: an OpenEnv environment server (Meta / Hugging Face ``openenv-core``) as an environment.

::

    env:
      name: openenv
      knobs: {app: my_env.server.app:app, action_field: message}   # or url: http://127.0.0.1:8000

OpenEnv serves an environment over HTTP and WebSocket (``create_app(EnvCls, ActionCls,
ObservationCls)``). Its HTTP ``/reset`` and ``/step`` build a fresh environment per request, so
multi-step episodes go through the persistent WebSocket session of OpenEnv's own client
(``openenv.core.GenericEnvClient``): one session per horizonrl episode, opened at ``reset`` and
closed with the environment. The server needs ``max_concurrent_envs`` at least the number of
episodes that run at once (``rollout.group_size`` x ``rollout.tasks_per_step``; an evaluation runs
``env.test_tasks`` x ``train.eval_samples``): a session it refuses stops the run with one line saying
so, rather than counting the episode as a failure.

The server is given by ``url``, or by ``app`` (``module:attribute`` of the FastAPI app), which
horizonrl starts once per process as ``python -m uvicorn APP --host 127.0.0.1 --port FREE_PORT``
(``cwd`` and ``env`` for the process; no container) and stops at exit. Either way the server must
answer ``/health`` within ``startup_timeout_s``, or the run stops at start with one line naming it.

One assistant message is one action ``{action_field: text, **action_extra}`` (text: the message
without ``<think>``, or ``action_pattern``'s first group). The observation dict is the step's
``info``: its ``obs_field`` (or, with one string field, that field; else the dict as JSON) is the
next user message, ``obs_key: info.<field>`` picks a field as the CCPO/GiGPO key, and a boolean
``success`` field decides success (else a return of at least ``success_reward``; OpenEnv drops
``metadata`` from what it sends). The reward and ``done`` are OpenEnv's (a ``None`` reward is 0).
Tasks are reset seeds (``reset(seed=...)``). See :mod:`horizonrl.envs.hubs.episodic` for the shared
protocol: errors mid-episode (a refused action, a dropped connection) end the episode with an error
observation, reward 0 and ``rollout/env_error_rate``.

OpenEnv's protocol has no snapshot/restore, so ``can_fork`` is false and RTPO refuses the
environment at start.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from typing import Any, ClassVar

from horizonrl.envs.core.common import check_env_vars, check_one_of, check_optional_str, check_seconds
from horizonrl.envs.core.registry import register_env
from horizonrl.envs.hubs.episodic import EPISODIC_KNOBS, EpisodicAdapter
from horizonrl.errors import ConfigError

__all__ = ["OpenEnvEnv", "OpenEnvError", "server_url"]

_RESERVED = ("done", "reward", "metadata")


class OpenEnvError(ConfigError):
    """The OpenEnv server could not be started or did not answer (one line, naming it)."""


def _healthy(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _wait_healthy(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _healthy(url):
            return True
        if proc is not None and proc.poll() is not None:
            return False
        time.sleep(0.2)
    return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _LocalServer:
    """One ``uvicorn APP`` process on 127.0.0.1, its output in a temporary log file."""

    def __init__(self, app: str, cwd: str | None, env: dict[str, str] | None, timeout_s: float) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # kept open for the server's lifetime (its stdout/stderr); removed in close()
        self.log = tempfile.NamedTemporaryFile(prefix="horizonrl-openenv-", suffix=".log", delete=False)  # noqa: SIM115
        penv = dict(os.environ, **(env or {}))
        where = os.path.abspath(cwd or os.getcwd())
        penv["PYTHONPATH"] = os.pathsep.join(p for p in (where, penv.get("PYTHONPATH", "")) if p)
        cmd = [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd, cwd=where, env=penv, stdout=self.log, stderr=subprocess.STDOUT)
        if not _wait_healthy(self.url, timeout_s, self.proc):
            tail = self._tail()
            self.close()
            raise OpenEnvError(
                f"env.knobs.app={app!r}: the OpenEnv server did not answer {self.url}/health within "
                f"{timeout_s:g} s{f' (last output: {tail})' if tail else ''}"
            )

    def _tail(self) -> str:
        try:
            with open(self.log.name, errors="replace") as f:
                lines = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
        except OSError:
            return ""
        return " | ".join(lines[-3:])[-400:]

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)


_servers: dict[str, _LocalServer] = {}
_servers_lock = threading.Lock()
_checked: set[str] = set()


def server_url(knobs: dict[str, Any]) -> str:
    """The base URL of the configured server: ``url`` (checked once per process) or the process-wide
    server started from ``app`` (started on first use, restarted if it died)."""
    timeout = float(knobs["startup_timeout_s"])
    if knobs["url"] is not None:
        url = knobs["url"].rstrip("/")
        if url not in _checked:
            if not _wait_healthy(url, timeout):
                raise OpenEnvError(
                    f"env.knobs.url={url!r}: the OpenEnv server did not answer /health in {timeout:g} s"
                )
            _checked.add(url)
        return url
    key = json.dumps([knobs["app"], knobs["cwd"], knobs["env"]], sort_keys=True)
    with _servers_lock:
        server = _servers.get(key)
        if server is None or not server.alive:
            server = _LocalServer(knobs["app"], knobs["cwd"], knobs["env"], timeout)
            _servers[key] = server
        return server.url


@atexit.register
def _close_all() -> None:
    for server in list(_servers.values()):
        server.close()
    _servers.clear()


@register_env("openenv")
class OpenEnvEnv(EpisodicAdapter):
    """An OpenEnv server's environment behind horizonrl's :class:`Env` (see the module docstring)."""

    KNOBS: ClassVar[dict[str, Any]] = {
        "url": None,
        "app": None,
        "cwd": None,
        "env": None,
        "action_field": "message",
        "action_extra": {},
        "startup_timeout_s": 60.0,
        "message_timeout_s": 60.0,
        **EPISODIC_KNOBS,
    }
    system_prompt: ClassVar[str] = "Reply to each observation with your next action."
    #: WebSocket sessions open in this process (named in the error when the server refuses one)
    live_sessions: ClassVar[int] = 0

    @classmethod
    def _check_own_knobs(cls, k: dict[str, Any]) -> None:
        check_one_of(cls.name, k, "url", "app", "a running server, or module:attribute of its FastAPI app")
        if k["url"] is not None and not (
            isinstance(k["url"], str) and k["url"].startswith(("http://", "https://"))
        ):
            raise ValueError(f"{cls.name}: knob 'url' must be an http(s):// URL, got {k['url']!r}")
        if k["app"] is not None and not (isinstance(k["app"], str) and ":" in k["app"]):
            raise ValueError(f"{cls.name}: knob 'app' must be module:attribute, got {k['app']!r}")
        check_optional_str(cls.name, k, "cwd", "action_field")
        check_env_vars(cls.name, "env", k["env"])
        if not isinstance(k["action_extra"], dict):
            raise ValueError(f"{cls.name}: knob 'action_extra' must be a mapping, got {k['action_extra']!r}")
        for name in ("startup_timeout_s", "message_timeout_s"):
            check_seconds(cls.name, name, k[name])

    @classmethod
    def _label(cls, knobs: dict[str, Any]) -> str:
        return knobs["app"] or knobs["url"]

    def __init__(self, **knobs: Any) -> None:
        super().__init__(**knobs)
        try:
            from openenv.core.generic_client import GenericEnvClient
        except ImportError:
            raise OpenEnvError(
                "env.name=openenv needs the OpenEnv client: pip install 'horizonrl[hubs]' (openenv-core)"
            ) from None
        self._client_cls = GenericEnvClient
        self.url = server_url(self.knobs)
        self._client: Any = None

    @property
    def can_fork(self) -> bool:
        return False

    def _session(self) -> Any:
        """This episode's WebSocket session (a new one per ``reset``)."""
        self._disconnect()
        client = self._client_cls(
            base_url=self.url,
            connect_timeout_s=10.0,
            message_timeout_s=float(self.knobs["message_timeout_s"]),
        ).sync()
        client.connect()
        self._client = client
        OpenEnvEnv.live_sessions += 1
        return client

    def _start(self, seed: int | None) -> tuple[Any, dict[str, Any]]:
        try:
            result = self._session().reset(**({} if seed is None else {"seed": seed}))
        except Exception as e:
            # depending on timing the client reads the server's CAPACITY_REACHED error or finds the
            # socket already closed
            if type(e).__name__.startswith("ConnectionClosed") or "CAPACITY_REACHED" in str(e):
                # OpenEnv answers a session over its max_concurrent_envs with an error and closes it:
                # every further episode would fail the same way (and an evaluation would count them
                # as failures), so the run stops here with what to change.
                raise OpenEnvError(
                    f"the OpenEnv server at {self.url} closed a new session ({type(e).__name__}) with "
                    f"{OpenEnvEnv.live_sessions} open in this process: its create_app(..., "
                    "max_concurrent_envs=N) must cover the episodes that run at once (rollout.group_size "
                    "x rollout.tasks_per_step; evaluation: env.test_tasks x train.eval_samples)"
                ) from None
            raise
        return self._observation(result.observation)

    def _act(self, action: str) -> tuple[Any, Any, bool, dict[str, Any]]:
        payload = {**self.knobs["action_extra"], self.knobs["action_field"]: action}
        result = self._client.step(payload)
        obs, info = self._observation(result.observation)
        reward = 0.0 if result.reward is None else result.reward
        return obs, reward, bool(result.done), info

    def _observation(self, obs: Any) -> tuple[Any, dict[str, Any]]:
        """``(what becomes the message, info)``: info is the observation's fields."""
        info = {k: v for k, v in obs.items() if k not in _RESERVED} if isinstance(obs, dict) else {}
        if self.knobs["obs_field"] is None:
            texts = [v for v in info.values() if isinstance(v, str)]
            if len(texts) == 1:
                return texts[0], info
            return info, info
        return obs, info

    def _disconnect(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            OpenEnvEnv.live_sessions -= 1
            with contextlib.suppress(Exception):  # a dead session must not lose the run
                client.close()

    def close(self) -> None:
        self._disconnect()
