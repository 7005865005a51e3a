"""SUPO: rolling-summary baseline credit (docs/spec/baselines.md "SUPO"; Lu et al. 2025, compared in ECHO §5).

A SUPO rollout writes ``<summary>...</summary>`` whenever its working context reaches the budget and
continues in a new segment from the task + summary. More than ``S`` summaries, or an unparsable
summary, ends the rollout as *overlong*: ``Rollout.termination == "overlong"``.

Advantage, per group with non-overlong set ``V``::

    A_i = (R_i - mean_{j in V} R_j) / (std_{j in V} R + eps)     for i in V   (GRPO, sample std)
    A_i = 0                                                      for overlong i

from the final (outcome) reward ``R_i``; fewer than two non-overlong rollouts, or equal rewards
among them, give 0. Every generated token of every segment of rollout ``i`` (summary tokens
included: SUPO trains the summaries through the outcome) gets ``A_i``: dense credit, unlike ECHO's
traceable mask (ECHO paper §4.3, Figure 3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from horizonrl.credit.broadcast import broadcast_to_tokens
from horizonrl.credit.group import valid_group_advantage
from horizonrl.credit.registry import register_estimator
from horizonrl.trajectory import Group, TokenAdvantages
from horizonrl.vocab import Termination

#: ``Rollout.termination`` values SUPO treats as overlong (excluded from the baseline, credit 0).
SUPO_OVERLONG_TERMINATIONS = (Termination.OVERLONG.value,)


def supo_advantage(
    rewards: Sequence[float], overlong: Sequence[bool], *, normalize_std: bool = True, eps: float = 1e-6
) -> np.ndarray:
    """Per-rollout SUPO advantage of one group: GRPO over the non-overlong rollouts, 0 for overlong.

    ``normalize_std=False`` gives the Dr.GRPO form ``R_i - mean_V R`` (docs/spec/baselines.md).
    """
    over = np.asarray(overlong, dtype=bool)
    if over.ndim != 1:
        raise ValueError(f"overlong flags must be one-dimensional, got shape {over.shape}")
    return valid_group_advantage(rewards, ~over, normalize_std=normalize_std, eps=eps)


@dataclass(frozen=True)
class SUPOParams:
    """The parameters of ``supo`` (``algo.estimator_params``)."""

    overlong_terminations: Sequence[str] = SUPO_OVERLONG_TERMINATIONS
    """``Rollout.termination`` values that make a rollout overlong (out of the baseline, credit 0);
    one string counts as a one-element list."""
    normalize_std: bool = True
    """GRPO's division by the std of the non-overlong rewards (False: the Dr.GRPO form ``R_i - mean_V R``)."""
    eps: float = 1e-6
    """Added to the std in the denominator."""


@register_estimator("supo", loss_agg_mode="token-mean", params=SUPOParams)
def supo(groups: Sequence[Group], **params: Any) -> TokenAdvantages:
    """SUPO: GRPO over non-overlong rollouts, broadcast to every segment; overlong get 0
    (docs/spec/baselines.md "SUPO").

    A rollout is overlong when its ``termination`` is in ``overlong_terminations`` (default
    ``("overlong",)``). The value of :func:`supo_advantage` goes to every generated token of every
    segment, summary tokens included. ``params``: :class:`SUPOParams`.
    """
    p = SUPOParams(**params)
    overlong_terminations = p.overlong_terminations
    if isinstance(overlong_terminations, str):
        overlong_terminations = (overlong_terminations,)
    over = set(overlong_terminations)
    values = [
        supo_advantage(
            g.rewards, [r.termination in over for r in g.rollouts], normalize_std=p.normalize_std, eps=p.eps
        )
        for g in groups
    ]
    return broadcast_to_tokens(groups, np.concatenate(values) if values else np.zeros(0))
