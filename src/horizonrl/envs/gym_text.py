"""``gym``: any gymnasium-style text environment (``reset()`` / ``step(action)``) as a horizonrl environment.

::

    env:
      name: gym
      knobs: {entry: my_games:make_wordle, kwargs: {word_length: 5}, action_pattern: '\\[(.*?)\\]'}
      imports: [my_games]          # only needed when the module registers something itself

The wrapped object is built by ``entry`` (``module:callable`` or ``path/file.py:callable``, called
with ``kwargs``) or by ``gymnasium.make(id, **kwargs)``. It needs ``reset`` and ``step``, in either
convention:

- gymnasium: ``reset(seed=..., options=...) -> (obs, info)``,
  ``step(action) -> (obs, reward, terminated, truncated, info)``;
- the older gym / plain-object one: ``reset() -> obs`` and ``step(action) -> (obs, reward, done, info)``
  (TextArena, GEM and skyrl-gym environments are thin variants of these two).

One assistant message is one action: the message without ``<think>`` blocks, or with
``action_pattern`` the first group of its first match (no match: a user-role reminder, the step is
marked invalid and the environment is not stepped). The observation (a string; a dict's
``obs_field``; anything else JSON-encoded) is the next user message; the step's reward is the turn's
reward, so the rollout's outcome is the episode's return. Success is ``info["success"]`` when the
environment reports it, else a return of at least ``success_reward``.

Tasks are reset seeds: ``make_tasks(n, seed=s, split=...)`` draws seeds from a stream fixed by ``s``
and keeps those whose hash falls in the split (:func:`horizonrl.envs.common.split_of`: train and
test are disjoint); a task's ``meta["seed"]`` is passed to ``reset(seed=...)`` when the
environment's ``reset`` takes one.

Credit needs: CCPO and GiGPO match steps by ``obs_key``: the observation text (``obs_key:
observation``, the default), an info field (``obs_key: info.<field>``) or none. RTPO forks siblings
from ``snapshot()``, a deep copy of the wrapped object (``snapshot: false`` declares that it cannot be
copied, and RTPO then refuses the environment at start); an object that fails to deep-copy raises a
clear error the first time RTPO asks.

Bad input loses nothing: an exception in ``step`` ends the episode with an ``Error: ...`` observation,
reward 0 and ``info["env_error"]`` (counted as ``rollout/env_error_rate``); a reward that is not a
finite number becomes 0 with the same record; a ``reset`` that raises makes an episode whose first
step ends it that way.
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
import math
import numbers
import random
import re
from typing import Any, ClassVar

from horizonrl.envs.base import Env, StepResult, Task
from horizonrl.envs.common import check_bool, fill_knobs, split_of
from horizonrl.envs.registry import register_env
from horizonrl.textparse import strip_think
from horizonrl.userimport import load_object

__all__ = ["GymTextEnv", "step_outcome"]

log = logging.getLogger(__name__)

_SEED_RANGE = 2**31 - 1


def _gymnasium_make(env_id: str):
    """``gymnasium.make`` bound to ``env_id`` (ValueError naming the id when it is not registered)."""
    try:
        import gymnasium
    except ImportError:
        raise ValueError(
            f"gym: knob 'id'={env_id!r} needs gymnasium (pip install 'horizonrl[hubs]'), or give the "
            "environment's constructor as 'entry: module:callable'"
        ) from None
    if env_id not in gymnasium.envs.registry:
        close = sorted(k for k in gymnasium.envs.registry if env_id.split("-")[0].lower() in k.lower())[:8]
        hint = f" (close: {', '.join(close)})" if close else ""
        raise ValueError(
            f"gym: knob 'id'={env_id!r} is not a registered gymnasium environment{hint}; register it in a "
            "module that env.imports names"
        )
    return lambda **kw: gymnasium.make(env_id, **kw)


def _factory(knobs: dict[str, Any]):
    if knobs["entry"] is not None:
        return load_object(knobs["entry"], "env.knobs.entry")
    return _gymnasium_make(knobs["id"])


def _number(value: Any) -> float | None:
    """``value`` as a finite float (bools and NumPy scalars included), else None."""
    if isinstance(value, numbers.Real):
        f = float(value)
        return f if math.isfinite(f) else None
    return None


def step_outcome(out: Any) -> tuple[Any, Any, bool, dict[str, Any]]:
    """``(obs, reward, done, info)`` from a gymnasium 5-tuple or an old-style 4-tuple.

    ``done`` is ``terminated or truncated``; ``info`` is ``{}`` when the environment gives none.
    ValueError for any other shape.
    """
    if isinstance(out, tuple) and len(out) == 5:
        obs, reward, terminated, truncated, info = out
        done = bool(terminated) or bool(truncated)
    elif isinstance(out, tuple) and len(out) == 4:
        obs, reward, done, info = out
        done = bool(done)
    else:
        shown = f"a {len(out)}-tuple" if isinstance(out, tuple) else type(out).__name__
        raise ValueError(
            f"step() returned {shown}; expected (obs, reward, terminated, truncated, info) or "
            "(obs, reward, done, info)"
        )
    return obs, reward, done, dict(info) if isinstance(info, dict) else {}


@register_env("gym")
class GymTextEnv(Env):
    """A gymnasium-style text environment behind horizonrl's :class:`Env` (see the module docstring)."""

    KNOBS: ClassVar[dict[str, Any]] = {
        "entry": None,
        "id": None,
        "kwargs": {},
        "action_pattern": None,
        "obs_field": None,
        "obs_key": "observation",
        "success_reward": 1.0,
        "snapshot": True,
        "system_prompt": None,
        "max_obs_chars": 8000,
    }
    system_prompt: ClassVar[str] = "You are playing a text game. Reply to each observation with one action."

    @classmethod
    def validate_knobs(cls, knobs: dict[str, Any]) -> dict[str, Any]:
        """``knobs`` with defaults filled in; ValueError naming any unknown or bad knob."""
        return fill_knobs(cls.name, cls.KNOBS, knobs, cls._check_knobs)

    @classmethod
    def _check_knobs(cls, k: dict[str, Any]) -> None:
        if (k["entry"] is None) == (k["id"] is None):
            raise ValueError(
                f"{cls.name}: give exactly one of knob 'entry' (module:callable) and knob 'id' (a gymnasium "
                f"id), got entry={k['entry']!r}, id={k['id']!r}"
            )
        for name in ("entry", "id", "action_pattern", "obs_field", "system_prompt"):
            if k[name] is not None and not (isinstance(k[name], str) and k[name]):
                raise ValueError(
                    f"{cls.name}: knob {name!r} must be a non-empty string or null, got {k[name]!r}"
                )
        if not isinstance(k["kwargs"], dict) or not all(isinstance(x, str) for x in k["kwargs"]):
            raise ValueError(
                f"{cls.name}: knob 'kwargs' must map argument names to values, got {k['kwargs']!r}"
            )
        if k["action_pattern"] is not None:
            try:
                re.compile(k["action_pattern"])
            except re.error as e:
                raise ValueError(
                    f"{cls.name}: knob 'action_pattern'={k['action_pattern']!r} is not a regular "
                    f"expression: {e}"
                ) from None
        key = k["obs_key"]
        if not (key in ("observation", "none") or (isinstance(key, str) and re.fullmatch(r"info\.\w+", key))):
            raise ValueError(
                f"{cls.name}: knob 'obs_key' must be 'observation', 'none' or 'info.<field>', got {key!r}"
            )
        if _number(k["success_reward"]) is None or isinstance(k["success_reward"], bool):
            raise ValueError(
                f"{cls.name}: knob 'success_reward' must be a number, got {k['success_reward']!r}"
            )
        check_bool(cls.name, "snapshot", k["snapshot"])
        v = k["max_obs_chars"]
        if isinstance(v, bool) or not isinstance(v, int) or v < 100:
            raise ValueError(f"{cls.name}: knob 'max_obs_chars' must be an integer >= 100, got {v!r}")
        if not callable(_factory(k)):
            raise ValueError(f"{cls.name}: knob 'entry'={k['entry']!r} is not callable")

    def __init__(self, **knobs: Any) -> None:
        super().__init__(**self.validate_knobs(knobs))
        self._game: Any = None
        if self.knobs["system_prompt"] is not None:
            self.system_prompt = self.knobs["system_prompt"]  # type: ignore[misc]

    @property
    def tools(self) -> list[Any]:
        return []

    @classmethod
    def make_tasks(cls, n: int, *, seed: int, split: str = "train", **knobs: Any) -> list[Task]:
        """``n`` reset seeds of ``split`` drawn from the stream of ``seed`` (disjoint splits)."""
        full = cls.validate_knobs(knobs)
        rng = random.Random(f"gym-tasks-{seed}")
        game = full["entry"] or full["id"]
        tasks: list[Task] = []
        seen: set[int] = set()
        while len(tasks) < n:
            s = rng.randrange(_SEED_RANGE)
            if s in seen or split_of(f"gym-seed-{s}") != split:
                continue
            seen.add(s)
            meta = {"env": cls.name, "split": split, "seed": s}
            tasks.append(Task(f"gym-{split}-{s}", f"{game} (reset seed {s})", "", (), meta))
        return tasks

    # -- the episode ----------------------------------------------------------------------------------

    def _make_game(self) -> Any:
        game = _factory(self.knobs)(**self.knobs["kwargs"])
        for method in ("reset", "step"):
            if not callable(getattr(game, method, None)):
                raise ValueError(
                    f"{self.name}: {self.knobs['entry'] or self.knobs['id']} built an object "
                    f"without a {method}() method ({type(game).__name__})"
                )
        return game

    def reset(self, task: Task) -> str:
        if task.meta.get("env") != self.name:
            raise ValueError(f"task {task.id!r} is for env {task.meta.get('env')!r}, not {self.name!r}")
        if self._game is None:
            self._game = self._make_game()
        game = self._game
        self.state = {"game": game, "return": 0.0, "key": None, "error": None}
        seed = task.meta.get("seed")
        try:
            out = game.reset(seed=seed) if seed is not None and _takes_seed(game.reset) else game.reset()
        except Exception as e:
            log.warning("%s: reset raised %s: %s", self.name, type(e).__name__, e, exc_info=True)
            self.state["error"] = f"reset() raised {type(e).__name__}: {e}"
            return f"Error: the environment failed to start: {self.state['error']}"
        obs, info = out if _is_reset_pair(out) else (out, {})
        text = self._text(obs)
        self.state["key"] = self._key(text, info)
        return text

    def step(self, action: str) -> StepResult:
        st = self.state
        if st.get("error"):
            return self._failed(st["error"])
        act = strip_think(action).strip()
        pattern = self.knobs["action_pattern"]
        if pattern is not None:
            m = re.search(pattern, act, flags=re.DOTALL)
            if m is None:
                return StepResult(
                    f"No action found: give your action in the form {pattern}.",
                    role="user",
                    invalid=True,
                    obs_key=st["key"],
                )
            act = (m.group(1) if m.groups() else m.group(0)).strip()
        try:
            obs, reward, done, info = step_outcome(st["game"].step(act))
        except Exception as e:
            log.warning("%s: step raised %s: %s", self.name, type(e).__name__, e, exc_info=True)
            return self._failed(f"step() raised {type(e).__name__}: {e}")
        extra: dict[str, Any] = {}
        value = _number(reward)
        if value is None:
            extra["env_error"] = f"reward {reward!r} is not a finite number; counted as 0"
            value = 0.0
        st["return"] += value
        text = self._text(obs)
        st["key"] = self._key(text, info)
        success = False
        if done:
            success = (
                bool(info["success"])
                if "success" in info
                else st["return"] >= float(self.knobs["success_reward"])
            )
        return StepResult(
            text, reward=value, done=done, success=success, role="user", obs_key=st["key"], info=extra
        )

    def _failed(self, message: str) -> StepResult:
        """End the episode on an environment failure: error observation, reward 0, recorded."""
        self.state["error"] = message
        return StepResult(
            f"Error: {message}",
            done=True,
            role="user",
            invalid=True,
            obs_key=self.state.get("key"),
            info={"env_error": message},
        )

    def _text(self, obs: Any) -> str:
        field = self.knobs["obs_field"]
        if field is not None and isinstance(obs, dict):
            obs = obs.get(field, "")
        if not isinstance(obs, str):
            try:
                obs = json.dumps(obs, ensure_ascii=False, default=str)
            except (TypeError, ValueError):
                obs = str(obs)
        cap = self.knobs["max_obs_chars"]
        return obs if len(obs) <= cap else obs[:cap] + f"\n[... {len(obs) - cap} more characters]"

    def _key(self, text: str, info: dict[str, Any]) -> str | None:
        how = self.knobs["obs_key"]
        if how == "observation":
            return text
        if how == "none":
            return None
        value = info.get(how.removeprefix("info."))
        return None if value is None else str(value)

    def state_key(self) -> str | None:
        return self.state.get("key")

    # -- forking --------------------------------------------------------------------------------------

    @property
    def can_fork(self) -> bool:
        return bool(self.knobs["snapshot"])

    def snapshot(self) -> Any:
        if not self.can_fork:
            raise ValueError(
                f"{self.name}: snapshot is off (knob 'snapshot: false'); this environment cannot fork"
            )
        try:
            return copy.deepcopy(self.state)
        except Exception as e:
            raise ValueError(
                f"{self.name}: the environment object ({type(self.state.get('game')).__name__}) cannot be "
                f"deep-copied ({type(e).__name__}: {e}); set knob 'snapshot: false' and use a method that "
                "does not fork (RTPO does)"
            ) from None

    def restore(self, state: Any) -> None:
        self.state = copy.deepcopy(state)
        self._game = self.state.get("game", self._game)

    def expert_action(self, rng: random.Random, noise: float = 0.0) -> str:
        raise NotImplementedError(
            f"environment {self.name!r} has no scripted expert, so demonstrations cannot be generated for "
            "it; give SFT data as a file (sft.data) or skip SFT"
        )

    def close(self) -> None:
        game, self._game = self._game, None
        closer = getattr(game, "close", None)
        if callable(closer):
            try:
                closer()
            except Exception as e:  # closing must never lose a run
                log.warning("%s: close() raised %s: %s", self.name, type(e).__name__, e)


def _takes_seed(fn: Any) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "seed" or p.kind is p.VAR_KEYWORD for p in params)


def _is_reset_pair(out: Any) -> bool:
    """gymnasium's ``reset`` returns ``(obs, info)``; an old-style one returns the observation."""
    return isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)
