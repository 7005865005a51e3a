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
  (GEM uses the first; TextArena and skyrl-gym need a small ``entry`` wrapper, docs/hubs.md).

One assistant message is one action: the message without ``<think>`` blocks, or with
``action_pattern`` the first group of its first match (no match: a user-role reminder, the step is
marked invalid and the environment is not stepped). The observation (a string; a dict's
``obs_field``; anything else JSON-encoded) is the next user message; the step's reward is the turn's
reward, so the rollout's outcome is the episode's return. Success is ``info["success"]`` when the
environment reports it, else a return of at least ``success_reward``.

Tasks are reset seeds: ``make_tasks(n, seed=s, split=...)`` draws seeds from a stream fixed by ``s``
and keeps those whose hash falls in the split (:func:`horizonrl.envs.core.common.split_of`: train and
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
import logging
from typing import Any, ClassVar

from horizonrl.envs.core.common import check_bool, check_one_of, check_optional_str
from horizonrl.envs.core.registry import register_env
from horizonrl.envs.hubs.episodic import EPISODIC_KNOBS, EpisodicAdapter
from horizonrl.userimport import load_object

__all__ = ["GymTextEnv", "step_outcome"]

log = logging.getLogger(__name__)


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
class GymTextEnv(EpisodicAdapter):
    """A gymnasium-style text environment behind horizonrl's :class:`Env` (see the module docstring)."""

    KNOBS: ClassVar[dict[str, Any]] = {
        "entry": None,
        "id": None,
        "kwargs": {},
        "snapshot": True,
        **EPISODIC_KNOBS,
    }
    system_prompt: ClassVar[str] = "You are playing a text game. Reply to each observation with one action."

    @classmethod
    def _check_own_knobs(cls, k: dict[str, Any]) -> None:
        check_one_of(cls.name, k, "entry", "id", "module:callable, or a gymnasium id")
        check_optional_str(cls.name, k, "entry", "id")
        if not isinstance(k["kwargs"], dict) or not all(isinstance(x, str) for x in k["kwargs"]):
            raise ValueError(
                f"{cls.name}: knob 'kwargs' must map argument names to values, got {k['kwargs']!r}"
            )
        check_bool(cls.name, "snapshot", k["snapshot"])
        if not callable(_factory(k)):
            raise ValueError(f"{cls.name}: knob 'entry'={k['entry']!r} is not callable")

    @classmethod
    def _label(cls, knobs: dict[str, Any]) -> str:
        return knobs["entry"] or knobs["id"]

    def __init__(self, **knobs: Any) -> None:
        super().__init__(**knobs)
        self._game: Any = None

    def _start(self, seed: int | None) -> tuple[Any, dict[str, Any]]:
        if self._game is None:
            game = _factory(self.knobs)(**self.knobs["kwargs"])
            for method in ("reset", "step"):
                if not callable(getattr(game, method, None)):
                    raise ValueError(
                        f"{self._label(self.knobs)} built an object without a {method}() method "
                        f"({type(game).__name__})"
                    )
            self._game = game
        self.state["game"] = self._game
        reset = self._game.reset
        out = reset(seed=seed) if seed is not None and _takes_seed(reset) else reset()
        # gymnasium's reset returns (obs, info); an old-style one returns the observation
        return out if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict) else (out, {})

    def _act(self, action: str) -> tuple[Any, Any, bool, dict[str, Any]]:
        return step_outcome(self.state["game"].step(action))

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
