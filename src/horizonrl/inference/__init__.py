"""Inference engines: sample continuations and score them by teacher forcing (docs/design.md, "Engines")."""

from horizonrl.inference.base import Engine, Generation, SamplingParams
from horizonrl.inference.hf import HFEngine
from horizonrl.inference.registry import list_engines, make_engine, register_engine

__all__ = [
    "Engine",
    "Generation",
    "HFEngine",
    "SamplingParams",
    "list_engines",
    "make_engine",
    "register_engine",
]
