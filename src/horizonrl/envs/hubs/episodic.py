"""The turn protocol shared by the adapters of external episodic environments (``gym``, ``openenv``).

An external environment is a black box with ``start(seed) -> (obs, info)`` and
``act(action) -> (obs, reward, done, info)``. :class:`EpisodicAdapter` turns it into a horizonrl
:class:`~horizonrl.envs.core.base.Env`, once for every adapter:

- **action**: the assistant message without ``<think>`` blocks, or with knob ``action_pattern`` the
  first group of its first match (no match: a user-role reminder, the step is marked invalid and the
  environment is not stepped);
- **observation**: a string as is; a dict's ``obs_field``; anything else JSON-encoded; cut at
  ``max_obs_chars``. It is the next *user* message;
- **reward**: the step's reward is the turn's reward, so the rollout's outcome is the episode's
  return; a reward that is not a finite number counts as 0 and is recorded;
- **success**: ``info["success"]`` when the environment reports it, else a return of at least
  ``success_reward``;
- **peer key** (CCPO/GiGPO anchor states, knob ``obs_key``): the observation text (``observation``),
  an info field (``info.<field>``) or none;
- **failure**: an exception in ``act`` ends the episode with an ``Error: ...`` observation, reward 0
  and ``info["env_error"]`` (so ``Turn.info["env_error"]`` and ``rollout/env_error_rate``); an
  exception in ``start`` makes an episode whose first step ends it that way, except a
  :class:`~horizonrl.errors.ConfigError` (the setup is wrong for every episode), which stops the run;
- **tasks** are reset seeds (:func:`seed_tasks`): train and test seeds are disjoint by hash.
"""

from __future__ import annotations

import json
import logging
import random
import re
from abc import abstractmethod
from typing import Any, ClassVar

from horizonrl.envs.core.base import Env, StepResult, Task
from horizonrl.envs.core.common import check_optional_str, fill_knobs, finite_number, split_of
from horizonrl.errors import ConfigError
from horizonrl.textparse import strip_think

__all__ = ["EPISODIC_KNOBS", "EpisodicAdapter", "seed_tasks"]

log = logging.getLogger(__name__)

_SEED_RANGE = 2**31 - 1

#: the knobs every adapter takes (defaults); each adds its own
EPISODIC_KNOBS: dict[str, Any] = {
    "action_pattern": None,
    "obs_field": None,
    "obs_key": "observation",
    "success_reward": 1.0,
    "system_prompt": None,
    "max_obs_chars": 8000,
}


def seed_tasks(env: str, n: int, *, seed: int, split: str, label: str) -> list[Task]:
    """``n`` reset seeds of ``split`` drawn from a stream fixed by ``seed`` (disjoint splits by hash).

    Task ids are ``{env}-{split}-{reset seed}``; ``meta["seed"]`` is the reset seed.
    """
    rng = random.Random(f"{env}-tasks-{seed}")
    tasks: list[Task] = []
    seen: set[int] = set()
    while len(tasks) < n:
        s = rng.randrange(_SEED_RANGE)
        if s in seen or split_of(f"{env}-seed-{s}") != split:
            continue
        seen.add(s)
        meta = {"env": env, "split": split, "seed": s}
        tasks.append(Task(f"{env}-{split}-{s}", f"{label} (reset seed {s})", "", (), meta))
    return tasks


class EpisodicAdapter(Env):
    """An external episodic environment behind :class:`Env` (see the module docstring).

    Subclasses set ``KNOBS`` (:data:`EPISODIC_KNOBS` plus their own), check their own knobs in
    ``_check_own_knobs``, and implement :meth:`_start`, :meth:`_act` and :meth:`_label`.
    """

    KNOBS: ClassVar[dict[str, Any]] = EPISODIC_KNOBS
    system_prompt: ClassVar[str] = "Reply to each observation with one action."

    @classmethod
    def validate_knobs(cls, knobs: dict[str, Any]) -> dict[str, Any]:
        """``knobs`` with defaults filled in; ValueError naming any unknown or bad knob."""
        return fill_knobs(cls.name, cls.KNOBS, knobs, cls._check_knobs)

    @classmethod
    def _check_knobs(cls, k: dict[str, Any]) -> None:
        check_optional_str(cls.name, k, "action_pattern", "obs_field", "system_prompt")
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
        if finite_number(k["success_reward"]) is None or isinstance(k["success_reward"], bool):
            raise ValueError(
                f"{cls.name}: knob 'success_reward' must be a number, got {k['success_reward']!r}"
            )
        v = k["max_obs_chars"]
        if isinstance(v, bool) or not isinstance(v, int) or v < 100:
            raise ValueError(f"{cls.name}: knob 'max_obs_chars' must be an integer >= 100, got {v!r}")
        cls._check_own_knobs(k)

    @classmethod
    def _check_own_knobs(cls, knobs: dict[str, Any]) -> None:
        """Raise ValueError naming the knob for a bad value of a subclass's own knobs."""

    def __init__(self, **knobs: Any) -> None:
        super().__init__(**self.validate_knobs(knobs))
        if self.knobs["system_prompt"] is not None:
            self.system_prompt = self.knobs["system_prompt"]  # type: ignore[misc]

    @property
    def tools(self) -> list[Any]:
        return []

    @classmethod
    def make_tasks(cls, n: int, *, seed: int, split: str = "train", **knobs: Any) -> list[Task]:
        """``n`` reset seeds of ``split`` (:func:`seed_tasks`)."""
        full = cls.validate_knobs(knobs)
        return seed_tasks(cls.name, n, seed=seed, split=split, label=cls._label(full))

    # -- what a subclass provides ---------------------------------------------------------------------

    @classmethod
    @abstractmethod
    def _label(cls, knobs: dict[str, Any]) -> str:
        """A short name of the wrapped environment (task prompts, errors)."""

    @abstractmethod
    def _start(self, seed: int | None) -> tuple[Any, dict[str, Any]]:
        """Reset the wrapped environment: ``(observation, info)``. May raise."""

    @abstractmethod
    def _act(self, action: str) -> tuple[Any, Any, bool, dict[str, Any]]:
        """Step the wrapped environment: ``(observation, reward, done, info)``. May raise."""

    # -- the episode ----------------------------------------------------------------------------------

    def reset(self, task: Task) -> str:
        if task.meta.get("env") != self.name:
            raise ValueError(f"task {task.id!r} is for env {task.meta.get('env')!r}, not {self.name!r}")
        self.state = {**self.state, "return": 0.0, "key": None, "error": None}
        try:
            obs, info = self._start(task.meta.get("seed"))
        except ConfigError:  # the setup is wrong (e.g. a server without room for the episodes): stop
            raise
        except Exception as e:
            log.warning("%s: reset raised %s: %s", self.name, type(e).__name__, e, exc_info=True)
            self.state["error"] = f"reset() raised {type(e).__name__}: {e}"
            return f"Error: the environment failed to start: {self.state['error']}"
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
            obs, reward, done, info = self._act(act)
        except Exception as e:
            log.warning("%s: step raised %s: %s", self.name, type(e).__name__, e, exc_info=True)
            return self._failed(f"step() raised {type(e).__name__}: {e}")
        extra: dict[str, Any] = {}
        value = finite_number(reward)
        if value is None:
            extra["env_error"] = f"reward {reward!r} is not a finite number; counted as 0"
            value = 0.0
        st["return"] += value
        text = self._text(obs)
        st["key"] = self._key(text, info)
        success = False
        if done:
            reported = info.get("success")
            success = (
                bool(reported)
                if reported is not None
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

    def expert_action(self, rng: random.Random, noise: float = 0.0) -> str:
        raise NotImplementedError(
            f"environment {self.name!r} has no scripted expert, so demonstrations cannot be generated for "
            "it; give SFT data as a file (sft.data) or skip SFT"
        )
