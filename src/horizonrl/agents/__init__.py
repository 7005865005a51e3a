"""Agent loops: drive an engine and environments, produce :class:`~horizonrl.trajectory.Rollout` s."""

from horizonrl.agents.react import Episode, LoopLimits, run_episodes

__all__ = ["Episode", "LoopLimits", "run_episodes"]
