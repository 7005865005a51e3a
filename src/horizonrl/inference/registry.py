"""Registry of rollout engines (``inference.engine`` in configs; docs/design.md, "Engines").

Trainers never construct an engine class directly: they call :func:`make_engine`
with the training model, and the registered factory decides whether the engine
shares that model (``hf``: the embedded engine runs the training model itself, so
``Engine.sync`` is a no-op) or keeps its own copy that ``sync`` updates in place
(``vllm``). A factory is ``fn(model, tokenizer, *, device, max_batch_size, seed,
shared, **params) -> Engine``; ``shared=False`` asks for an engine that only sees
the weights passed to ``sync`` (RTPO with ``train.trainer_params.sync_every > 1``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from horizonrl.inference.base import Engine
from horizonrl.registry import Registry

EngineFactory = Callable[..., Engine]

ENGINES: Registry[EngineFactory] = Registry(
    "engine",
    register_with="@register_engine(NAME) (horizonrl.inference)",
    # Engines whose module is imported on first use (heavy optional dependencies).
    lazy={"vllm": "horizonrl.inference.vllm_engine"},
)


def register_engine(name: str) -> Callable[[EngineFactory], EngineFactory]:
    """Decorator registering an engine factory (see the module docstring for its signature)."""
    return ENGINES.register(name)


#: Names of the engines, sorted (``vllm`` included before its module is imported).
list_engines = ENGINES.names


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
    """The engine ``name`` over ``model`` (see the module docstring).

    An unknown name raises :class:`~horizonrl.registry.UnknownNameError` (a ``ValueError``) naming the
    known ones; an engine whose optional dependencies are missing, ``ValueError`` with the pip command.
    """
    try:
        factory = ENGINES.get(name, field="inference.engine")
    except ImportError as e:
        raise ValueError(
            f"inference.engine={name!r} needs its optional dependencies ({e}); "
            f"install them with: pip install 'horizonrl[{name}]'"
        ) from e
    return factory(
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
