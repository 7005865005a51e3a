"""Registry of rollout engines (``inference.engine`` in configs; DESIGN.md, "Engines").

Trainers never construct an engine class directly: they call :func:`make_engine`
with the training model, and the registered factory decides whether the engine
shares that model (``hf``: the embedded engine runs the training model itself, so
``Engine.sync`` is a no-op) or keeps its own copy that ``sync`` updates in place
(``vllm``). A factory is ``fn(model, tokenizer, *, device, max_batch_size, seed,
shared, **params) -> Engine``; ``shared=False`` asks for an engine that only sees
the weights passed to ``sync`` (RTPO with ``rtpo.sync_every > 1``).
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable
from typing import Any

from horizonrl.inference.base import Engine

EngineFactory = Callable[..., Engine]
_REGISTRY: dict[str, EngineFactory] = {}
# Engines whose module is imported on first use (heavy optional dependencies).
_LAZY = {"vllm": "horizonrl.inference.vllm_engine"}


def register_engine(name: str):
    def deco(fn: EngineFactory) -> EngineFactory:
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"engine {name!r} is already registered")
        _REGISTRY[name] = fn
        return fn

    return deco


def list_engines() -> list[str]:
    return sorted(set(_REGISTRY) | set(_LAZY))


def make_engine(
    name: str,
    model,
    tokenizer,
    *,
    device,
    max_batch_size: int,
    seed: int,
    shared: bool = True,
    params: dict[str, Any] | None = None,
) -> Engine:
    """The engine ``name`` over ``model`` (see the module docstring)."""
    if name not in _REGISTRY and name in _LAZY:
        try:
            importlib.import_module(_LAZY[name])
        except ImportError as e:
            raise ValueError(
                f"inference.engine={name!r} needs its optional dependencies ({e}); "
                f"install them with: pip install 'horizonrl[{name}]'"
            ) from e
    if name not in _REGISTRY:
        raise ValueError(f"inference.engine={name!r}: unknown engine; known: {list_engines()}")
    return _REGISTRY[name](
        model,
        tokenizer,
        device=device,
        max_batch_size=max_batch_size,
        seed=seed,
        shared=shared,
        **(params or {}),
    )


@register_engine("hf")
def _hf(model, tokenizer, *, device, max_batch_size, seed, shared=True, **params) -> Engine:
    from horizonrl.inference.hf import HFEngine

    if not shared:  # a frozen copy that only ``sync`` updates
        model = copy.deepcopy(model).eval().requires_grad_(False)
    return HFEngine(model, tokenizer, device=device, max_batch_size=max_batch_size, seed=seed, **params)


#: Engine parameters the trainer sets itself (not the user's to give in ``inference.params``).
TRAINER_SET = ("self", "model", "tokenizer", "device", "max_batch_size", "seed", "shared")


def engine_parameters(name: str) -> Callable | None:
    """The callable whose keyword parameters ``inference.params`` of engine ``name`` are checked
    against (minus :data:`TRAINER_SET`); None when they pass to a third-party engine unchecked."""
    if name == "hf":
        from horizonrl.inference.hf import HFEngine

        return HFEngine.__init__
    return None
