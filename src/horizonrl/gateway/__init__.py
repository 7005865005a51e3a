"""The recording gateway: any OpenAI-API agent harness, recorded token-exactly as horizonrl rollouts.

See docs/gateway.md. :class:`Gateway` (the FastAPI app), :class:`Recorder` (calls -> sessions ->
rollouts), :func:`~horizonrl.gateway.harness.run_harness` (launch one episode of a user harness).
"""

from horizonrl.gateway.app import Gateway, ServerThread
from horizonrl.gateway.recorder import EpisodeError, Recorder

__all__ = ["EpisodeError", "Gateway", "Recorder", "ServerThread"]
