"""Continuous batching through vLLM's own engine loop (the asynchronous driver's stream for vLLM).

vLLM batches continuously inside ``LLMEngine``: ``add_request`` queues a request
and each ``step`` runs one scheduler iteration over everything running, returning
the outputs of the requests it advanced. :class:`VLLMStream` exposes that loop as
a :class:`~horizonrl.inference.base.GenerationStream`: requests are queued under a
lock by any thread and handed to vLLM inside :meth:`VLLMStream.step` (vLLM's engine
is driven from one thread), each with the seed it was given, and a request's
generation is built, exactly as :meth:`VLLMEngine.generate` builds it, the step it
finishes.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Hashable

from horizonrl.inference.base import Generation, QueuedStream, SamplingParams

__all__ = ["VLLMStream"]


class VLLMStream(QueuedStream):
    """A :class:`VLLMEngine`'s continuous batcher (module docstring). ``lineage`` is not needed: vLLM's
    prefix cache is shared by all requests."""

    def __init__(self, engine) -> None:
        super().__init__()
        self.engine = engine
        self._running: dict[str, tuple[Hashable, SamplingParams]] = {}
        self._ids = itertools.count()
        self._prefix = f"horizonrl-{uuid.uuid4().hex[:12]}-"  # ids no other stream (or generate) uses

    @property
    def pending(self) -> bool:
        return bool(self._queue) or bool(self._running)

    def step(self) -> list[tuple[Hashable, Generation]]:
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        e = self.engine
        core = e.llm.llm_engine
        for key, prompt, params, seed, _ in self._take():
            (sp,) = e.request_params([prompt], params, [seed])
            sp.output_kind = RequestOutputKind.FINAL_ONLY  # one output per request, when it ends
            rid = f"{self._prefix}{next(self._ids)}"
            core.add_request(rid, TokensPrompt(prompt_token_ids=prompt), sp, lora_request=e._lora_request)
            self._running[rid] = (key, params)
        done = []
        for out in core.step():
            if out.finished:
                key, params = self._running.pop(out.request_id)
                done.append((key, e.generations([out], params)[0]))
        return done

    def close(self) -> None:
        """Abort what vLLM still runs for this stream, so a failed run leaves nothing behind."""
        self._take()
        if self._running and self.engine._llm is not None:
            self.engine.llm.llm_engine.abort_request(list(self._running))
        self._running = {}
