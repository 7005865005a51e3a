"""Agent loops: drive an engine and environments, produce :class:`~horizonrl.trajectory.Rollout` s.

- :mod:`.driver` — runs agent programs (generators) with batched generation;
- :mod:`.react` — the ReAct episode program and :func:`run_episodes`;
- :mod:`.context` — context managers (``append`` and the registry); the others
  register themselves in their own modules, imported here.
"""

from horizonrl.agents.context import (
    ContextManager,
    Episode,
    list_contexts,
    make_context,
    register_context,
)
from horizonrl.agents.driver import Generate, Spawn, drive, run_program
from horizonrl.agents.react import LoopLimits, episode_program, run_episodes, start_episode

__all__ = [
    "ContextManager",
    "Episode",
    "Generate",
    "LoopLimits",
    "Spawn",
    "drive",
    "episode_program",
    "list_contexts",
    "make_context",
    "register_context",
    "run_episodes",
    "run_program",
    "start_episode",
]
