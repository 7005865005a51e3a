"""Launch a user's agent harness once per episode: a shell-free command or a Python callable.

Each episode gets its own OpenAI ``base_url`` (``{gateway}/episodes/{episode_id}/v1``). A *callable*
(``"package.module:function"``) is called in a thread with the keyword arguments it names among
``task`` (a dict: ``id``, ``prompt``, ``answer``, ``aliases``, ``meta``), ``base_url``, ``episode_id``,
``reward_url`` and ``api_key``; a number it returns is the episode's reward. A *command* is split with
:func:`shlex.split` (no shell), its ``{base_url}``, ``{episode_id}``, ``{reward_url}`` and
``{task_file}`` placeholders filled in, and run with the same values in the environment
(``HORIZONRL_BASE_URL`` = ``OPENAI_BASE_URL``, ``HORIZONRL_EPISODE_ID``, ``HORIZONRL_REWARD_URL``,
``HORIZONRL_TASK_FILE``, ``OPENAI_API_KEY``); its last stdout line, if it is a number, is the reward.
A harness that runs longer than ``timeout_s`` is stopped (a command's process group is killed; a
callable's thread is abandoned and its later calls are refused once the episode is closed).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import math
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from horizonrl.envs.core.base import Task

__all__ = ["EpisodeRun", "Harness", "HarnessResult", "resolve_callable"]

API_KEY = "horizonrl-gateway"
_ARGS = ("task", "base_url", "episode_id", "reward_url", "api_key")


@dataclass(frozen=True)
class EpisodeRun:
    episode_id: str
    task: Task
    gateway_url: str

    @property
    def base_url(self) -> str:
        return f"{self.gateway_url}/episodes/{self.episode_id}/v1"

    @property
    def reward_url(self) -> str:
        return f"{self.gateway_url}/v1/episodes/{self.episode_id}/reward"


@dataclass
class HarnessResult:
    episode_id: str
    reward: float | None = None
    error: str | None = None
    timed_out: bool = False
    seconds: float = 0.0


def resolve_callable(spec: str, field: str = "gateway.callable") -> Callable[..., Any]:
    """``"package.module:function"`` -> the function (ValueError naming ``field`` otherwise)."""
    mod, sep, name = spec.partition(":")
    if not sep or not mod or not name:
        raise ValueError(f"{field}={spec!r}: expected 'package.module:function'")
    try:
        obj = importlib.import_module(mod)
    except ImportError as e:
        raise ValueError(f"{field}={spec!r}: cannot import {mod!r}: {e}") from e
    for part in name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ValueError(f"{field}={spec!r}: {mod!r} has no attribute {name!r}")
    if not callable(obj):
        raise ValueError(f"{field}={spec!r}: {name!r} is not callable")
    return obj


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


class Harness:
    """Runs episodes of one harness (``command`` or ``function``; exactly one) with at most
    ``concurrency`` at a time (0 = all at once); task files of commands go to ``workdir``."""

    def __init__(
        self,
        *,
        command: str | None = None,
        function: Callable[..., Any] | None = None,
        timeout_s: float = 300.0,
        concurrency: int = 0,
        workdir: str | Path = ".",
    ):
        if (command is None) == (function is None):
            raise ValueError("Harness needs exactly one of command or function")
        self.command = shlex.split(command) if command is not None else None
        if self.command == []:
            raise ValueError("gateway.command is empty")
        self.function = function
        self.timeout_s = timeout_s
        self.concurrency = concurrency
        self.workdir = Path(workdir)
        if function is not None:
            params = inspect.signature(function).parameters
            takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
            self.kwargs = [a for a in _ARGS if takes_all or a in params]

    def run_all(self, runs: Sequence[EpisodeRun]) -> dict[str, HarnessResult]:
        if not runs:
            return {}
        workers = len(runs) if self.concurrency <= 0 else min(self.concurrency, len(runs))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="horizonrl-harness") as pool:
            return {r.episode_id: res for r, res in zip(runs, pool.map(self.run, runs), strict=True)}

    def run(self, run: EpisodeRun) -> HarnessResult:
        t0 = time.monotonic()
        try:
            res = self._run_command(run) if self.command is not None else self._run_function(run)
        except Exception as e:  # a harness bug must not stop training; the episode is dropped
            res = HarnessResult(run.episode_id, error=f"{type(e).__name__}: {e}")
        res.seconds = time.monotonic() - t0
        return res

    def _run_function(self, run: EpisodeRun) -> HarnessResult:
        values = {
            "task": asdict(run.task),
            "base_url": run.base_url,
            "episode_id": run.episode_id,
            "reward_url": run.reward_url,
            "api_key": API_KEY,
        }
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = self.function(**{k: values[k] for k in self.kwargs})
            except BaseException as e:
                box["error"] = f"{type(e).__name__}: {e}"

        thread = threading.Thread(target=target, name=f"harness-{run.episode_id}", daemon=True)
        thread.start()
        thread.join(self.timeout_s)
        if thread.is_alive():
            return HarnessResult(
                run.episode_id, timed_out=True, error=f"timed out after {self.timeout_s:g} s"
            )
        return HarnessResult(run.episode_id, reward=_number(box.get("value")), error=box.get("error"))

    def _run_command(self, run: EpisodeRun) -> HarnessResult:
        self.workdir.mkdir(parents=True, exist_ok=True)
        task_file = self.workdir / f"{run.episode_id}.task.json"
        task_file.write_text(json.dumps(asdict(run.task), ensure_ascii=False))
        fill = {
            "base_url": run.base_url,
            "episode_id": run.episode_id,
            "reward_url": run.reward_url,
            "task_file": str(task_file),
        }
        argv = [arg.format(**fill) if "{" in arg else arg for arg in self.command]
        env = {
            **os.environ,
            "HORIZONRL_BASE_URL": run.base_url,
            "OPENAI_BASE_URL": run.base_url,
            "OPENAI_API_KEY": API_KEY,
            "HORIZONRL_EPISODE_ID": run.episode_id,
            "HORIZONRL_REWARD_URL": run.reward_url,
            "HORIZONRL_TASK_FILE": str(task_file),
        }
        proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        try:
            out, err = proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return HarnessResult(
                run.episode_id, timed_out=True, error=f"timed out after {self.timeout_s:g} s"
            )
        finally:
            task_file.unlink(missing_ok=True)
        lines = [line.strip() for line in out.splitlines() if line.strip()]
        reward = None
        if lines:
            with contextlib.suppress(ValueError):
                reward = _number(float(lines[-1]))
        error = None
        if proc.returncode != 0:
            tail = err.strip().splitlines()[-1] if err.strip() else ""
            error = f"exit code {proc.returncode}" + (f": {tail}" if tail else "")
        return HarnessResult(run.episode_id, reward=reward, error=error)
