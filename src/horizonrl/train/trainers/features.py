"""Model-computed inputs of credit estimators (``EstimatorSpec.needs``).

Credit estimators are pure NumPy (DESIGN.md); the few that need a model's view
of the rollouts declare it, e.g. ``@register_estimator("ccpo", needs=("hidden",))``,
and the trainer computes each need with the provider registered here::

    @register_feature("hidden")
    def hidden(trainer, groups, params) -> np.ndarray | None: ...

A provider gets the trainer (``engine``, ``renderer``, ``tokenizer``, ``model``,
``ref_model``, ``device``, ``tasks_by_id``, ``cfg``), the step's groups and the
estimator's configured parameters, and returns the keyword value, or ``None``
when the configured ablation does not use it (then nothing is passed).
Providers: ``gains`` and ``scores`` (:mod:`.info_gain`: Mosaic, IGPO),
``hidden`` (:mod:`.hidden`: CCPO).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from horizonrl.trajectory import Group

FeatureFn = Callable[[Any, Sequence[Group], dict[str, Any]], Any]
_REGISTRY: dict[str, FeatureFn] = {}


def register_feature(name: str) -> Callable[[FeatureFn], FeatureFn]:
    def deco(fn: FeatureFn) -> FeatureFn:
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"feature provider {name!r} is already registered")
        _REGISTRY[name] = fn
        return fn

    return deco


def _load() -> None:
    import importlib

    importlib.import_module("horizonrl.train.methods")


def list_features() -> list[str]:
    _load()
    return sorted(_REGISTRY)


def compute_features(
    trainer: Any, needs: Sequence[str], groups: Sequence[Group], params: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, float]]:
    """Values for every need not already in ``params``, and ``time/feature_<name>_s`` timings."""
    _load()
    values: dict[str, Any] = {}
    timings: dict[str, float] = {}
    for need in needs:
        if need in params:
            continue
        if need not in _REGISTRY:
            raise ValueError(f"no provider for estimator input {need!r}; known: {list_features()}")
        t0 = time.perf_counter()
        value = _REGISTRY[need](trainer, groups, params)
        timings[f"time/feature_{need}_s"] = time.perf_counter() - t0
        if value is not None:
            values[need] = value
    return values, timings
