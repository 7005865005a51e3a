"""The ``inference`` section: which rollout engine samples, and its parameters."""

from __future__ import annotations

from dataclasses import dataclass

from horizonrl.config.fields import _Section, opt


@dataclass(frozen=True)
class InferenceConfig(_Section):
    """The rollout engine (docs/design.md "Engines"; :mod:`horizonrl.inference.registry`)."""

    _prefix = "inference."
    engine: str = opt("hf", "rollout engine: 'hf' (embedded, shares the training model) or 'vllm'")
    params: dict = opt({}, "keyword parameters of the engine (e.g. vLLM's gpu_memory_utilization)")
