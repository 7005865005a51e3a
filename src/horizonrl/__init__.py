"""horizonrl: reinforcement learning for LLM agents over long, structured trajectories."""

__version__ = "0.4.0"
