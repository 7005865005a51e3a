"""Model-computed inputs of credit estimators (``EstimatorSpec.needs``): the trainer-to-method seam.

Credit estimators are pure NumPy (docs/design.md); the few that need a model's view
of the rollouts declare it, e.g. ``@register_estimator("ccpo", needs=("hidden",))``,
and the trainer computes each need with the provider registered here::

    @register_feature("hidden")
    def hidden(ctx: FeatureContext, groups, params) -> Feature: ...

A provider gets a :class:`FeatureContext` (exactly what it may use: the engine,
renderer, tokenizer, models, config, tasks, and a state dict of its own that
lives as long as the run), the step's groups and the estimator's configured
parameters. It returns a :class:`Feature`: the keyword value for the estimator
(``None`` when the configured ablation does not use it, then nothing is passed)
and its own metrics, which the trainer logs beside ``time/feature_<name>_s``.
The providers live with their methods and register from the plug-in list
:mod:`horizonrl.train.methods`: ``gains`` and ``scores`` (Mosaic, IGPO),
``hidden`` (CCPO).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from horizonrl.registry import Registry
from horizonrl.trajectory import Group

if TYPE_CHECKING:  # names for the annotations only: this module imports no torch
    import torch
    from transformers import PreTrainedTokenizerBase

    from horizonrl.config import RunConfig
    from horizonrl.envs.core.base import Task
    from horizonrl.inference import Engine
    from horizonrl.models.chat import ChatRenderer


@dataclass
class FeatureContext:
    """What a feature provider may use; built by the trainer for each step."""

    cfg: RunConfig
    """The run's :class:`~horizonrl.config.RunConfig`."""
    engine: Engine
    """The rollout engine (``generate``/``score``), not charged to the token budget."""
    renderer: ChatRenderer
    """The :class:`~horizonrl.models.ChatRenderer` the rollouts were rendered with."""
    tokenizer: PreTrainedTokenizerBase
    """The policy's tokenizer."""
    model: torch.nn.Module
    """The policy being trained (its current weights; do not update it)."""
    ref_model: torch.nn.Module | None
    """The frozen KL reference (``algo.kl_coef > 0``), else ``None``."""
    tasks_by_id: Mapping[str, Task]
    """Every train and test task by id (gold answers)."""
    step: int = 0
    """Updates done so far in this run (0 before the first)."""
    run_dir: Path | None = None
    """The run directory (reloading starting weights on resume)."""
    state: dict[str, Any] = field(default_factory=dict)
    """The provider's own storage, kept across the steps of one run (caches, frozen copies)."""


@dataclass(frozen=True)
class Feature:
    """A provider's answer: the estimator's keyword value (``None``: not passed) and its metrics."""

    value: Any
    metrics: Mapping[str, float] = field(default_factory=dict)


FeatureFn = Callable[[FeatureContext, Sequence[Group], dict[str, Any]], Feature]

FEATURES: Registry[FeatureFn] = Registry(
    "estimator input (feature provider)",
    register_with="@register_feature(NAME) (horizonrl.train.trainers.features)",
    plugins=("horizonrl.train.methods",),
)


def register_feature(name: str) -> Callable[[FeatureFn], FeatureFn]:
    """Register ``fn(ctx, groups, params) -> Feature`` as the provider of estimator input ``name``."""
    return FEATURES.register(name)


def list_features() -> list[str]:
    return FEATURES.names()


def compute_features(
    ctx: FeatureContext | Callable[[str], FeatureContext],
    needs: Sequence[str],
    groups: Sequence[Group],
    params: dict[str, Any],
) -> tuple[dict[str, Any], dict[str, float]]:
    """``(values, metrics)``: a value for every need not already in ``params``, each provider's
    metrics and its wall time as ``time/feature_<name>_s``.

    ``ctx`` is the context, or a function of the provider's name returning it (so each provider
    gets its own ``state``).
    """
    values: dict[str, Any] = {}
    metrics: dict[str, float] = {}
    for need in needs:
        if need in params:
            continue
        provider = FEATURES.get(need)
        t0 = time.perf_counter()
        out = provider(ctx(need) if callable(ctx) else ctx, groups, params)
        metrics[f"time/feature_{need}_s"] = time.perf_counter() - t0
        if not isinstance(out, Feature):
            raise TypeError(f"feature provider {need!r} returned {type(out).__name__}, not a Feature")
        metrics.update(out.metrics)
        if out.value is not None:
            values[need] = out.value
    return values, metrics
