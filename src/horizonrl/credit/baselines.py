"""Baseline estimators: GRPO, Dr.GRPO, RLOO and multi-session broadcasting.

Each computes one advantage per rollout within its group from the outcome
rewards (docs/spec/baselines.md) and gives it to every response token of every turn
of every segment (:func:`~horizonrl.credit.broadcast.broadcast_to_tokens`).
They differ in the per-rollout formula and in the loss aggregation they are
defined with.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from horizonrl.credit.broadcast import broadcast_to_tokens
from horizonrl.credit.group import group_advantage, rloo_advantage
from horizonrl.credit.registry import register_estimator
from horizonrl.trajectory import Group, TokenAdvantages


def per_group(groups: Sequence[Group], fn: Callable[[list[float]], np.ndarray]) -> np.ndarray:
    """Apply ``fn`` to each group's outcome rewards; concatenate in rollout order."""
    parts = [np.asarray(fn(g.rewards), dtype=np.float64) for g in groups]
    return np.concatenate(parts) if parts else np.zeros(0)


@dataclass(frozen=True)
class GRPOParams:
    """The parameters of ``grpo`` and ``broadcast`` (``algo.estimator_params``)."""

    normalize_std: bool = True
    """Divide by the group's reward std (ddof=1): ``(R_i - mean R) / (std R + eps)``; False gives
    ``R_i - mean R``."""
    eps: float = 1e-6
    """Added to the std in the denominator."""


@register_estimator(
    "grpo",
    loss_agg_mode="rollout-mean-token-mean",
    agg_source="DeepSeekMath GRPO / RTPO Eq. 1: (1/G) sum_i (1/|o_i|) sum_t, o_i = all of rollout i's tokens",
    params=GRPOParams,
)
def grpo(groups: Sequence[Group], **params: Any) -> TokenAdvantages:
    """GRPO: A_i = (R_i - mean R) / (std R + eps) (ddof=1) on every response token (docs/spec/baselines.md).

    ``params``: :class:`GRPOParams`."""
    p = GRPOParams(**params)
    values = per_group(groups, lambda r: group_advantage(r, normalize_std=p.normalize_std, eps=p.eps))
    return broadcast_to_tokens(groups, values)


@register_estimator(
    "drgrpo",
    loss_agg_mode="seq-mean-token-sum-norm",
    agg_source="Dr.GRPO (Liu et al. 2025): token sums over a constant, the generation budget "
    "(algo.loss_norm_tokens)",
)
def drgrpo(groups: Sequence[Group]) -> TokenAdvantages:
    """Dr.GRPO: A_i = R_i - mean R on every response token, seq-mean-token-sum-norm loss
    (docs/spec/baselines.md)."""
    values = per_group(groups, lambda r: group_advantage(r, normalize_std=False))
    return broadcast_to_tokens(groups, values)


@register_estimator(
    "rloo",
    loss_agg_mode="seq-mean-token-sum",
    agg_source="RLOO (Ahmadian et al. 2024): sequence-level REINFORCE, mean over samples of A_i sum_t log pi "
    "(exact with algo.policy_loss=reinforce)",
)
def rloo(groups: Sequence[Group]) -> TokenAdvantages:
    """RLOO: A_i = R_i - mean_{j != i} R_j on every response token (docs/spec/baselines.md)."""
    return broadcast_to_tokens(groups, per_group(groups, rloo_advantage))


@register_estimator(
    "broadcast",
    loss_agg_mode="rollout-mean-token-mean",
    agg_source="Mosaic Sec. 2.2: per-rollout token weighting across sessions",
    params=GRPOParams,
)
def broadcast(groups: Sequence[Group], **params: Any) -> TokenAdvantages:
    """Broadcasting: the GRPO advantage on every session, rollout-mean-token-mean loss
    (docs/spec/baselines.md "Broadcasting").

    The Mosaic paper's multi-session baseline: the same per-token values and the
    same default aggregation as ``grpo`` (GRPO's per-trajectory mean is per rollout
    over all its sessions), so a rollout with many sessions does not outweigh a
    rollout with one; the name marks the multi-session comparison. ``params``: :class:`GRPOParams`.
    """
    p = GRPOParams(**params)
    values = per_group(groups, lambda r: group_advantage(r, normalize_std=p.normalize_std, eps=p.eps))
    return broadcast_to_tokens(groups, values)
