"""Agent loops: drive an engine and environments, produce :class:`~horizonrl.trajectory.Rollout` s.

- :mod:`.program` — agent programs (generators) and the requests they yield;
- :mod:`.driver` — runs them with batched generation, round by round, or
  (:mod:`.scheduler`) episode by episode;
- :mod:`.react` — the ReAct episode program and :func:`run_episodes`;
- :mod:`.renderer` — the :class:`Renderer` protocol: what agents ask of a chat renderer;
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
from horizonrl.agents.driver import DriverOptions, Generate, Spawn, drive, run_program
from horizonrl.agents.react import LoopLimits, episode_program, run_episodes, start_episode
from horizonrl.agents.registry import AgentSpec, list_agents, register_agent
from horizonrl.agents.renderer import Renderer

# Modules that register context managers and agent kinds.
from horizonrl.agents import compaction, fork, memory, psi, stepwise, summary  # noqa: F401  isort: skip

__all__ = [
    "AgentSpec",
    "ContextManager",
    "DriverOptions",
    "Episode",
    "Generate",
    "LoopLimits",
    "Renderer",
    "Spawn",
    "drive",
    "episode_program",
    "list_agents",
    "list_contexts",
    "make_context",
    "register_agent",
    "register_context",
    "run_episodes",
    "run_program",
    "start_episode",
]
