"""Inference engines: sample continuations and score them by teacher forcing (DESIGN.md, "Engines")."""

from horizonrl.inference.base import Engine, Generation, SamplingParams
from horizonrl.inference.hf import HFEngine

__all__ = ["Engine", "Generation", "HFEngine", "SamplingParams"]
