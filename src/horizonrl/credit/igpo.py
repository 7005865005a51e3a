"""IGPO: turn-level information-gain rewards (docs/spec/baselines.md, "IGPO").

The Mosaic paper's turn-level comparison point (Mosaic §4, Table 1;
Wang et al. 2026). Every non-final turn ``t`` is rewarded by how much it raised
the policy's belief in the ground-truth answer::

    score(h)  = mean log-prob of the ground-truth answer tokens, teacher-forced after h
                + "Now there's enough information to answer. </think> <answer> " (no gradient)
    IG_t      = score(h after turn t) - score(h before turn t)            mode="logprob" (default)
    IG_t      = exp(score(after)) - exp(score(before))                    mode="prob" (original IGPO)
    r_t       = IG_t for non-final turns; r_T = R (the outcome reward) for the final turn
    r~_t      = (r_t - mean) / sqrt(var + 1e-8)      jointly over all turns of all rollouts of
                                                     the group, population variance
    A_t       = r~_t + gamma * A_{t+1},  A_{T+1} = 0,  gamma = 1

``A_t`` goes to every response token of turn ``t``. Scores come from the
trainer (``Engine.score``), passed to the ``igpo`` estimator as ``scores``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from horizonrl.credit.broadcast import broadcast_turn_values, flatten_rollouts
from horizonrl.credit.registry import register_estimator
from horizonrl.trajectory import Group, TokenAdvantages

IG_MODES = ("logprob", "prob")

ScorePair = tuple[float, float] | Sequence[float] | None


def information_gain(before: ArrayLike, after: ArrayLike, *, mode: str = "logprob") -> np.ndarray:
    """``IG_t`` from per-turn scores (mean answer log-probs).

    ``mode="logprob"``: ``after - before``; ``mode="prob"``: ``exp(after) - exp(before)``.
    """
    b = np.asarray(before, dtype=np.float64).reshape(-1)
    a = np.asarray(after, dtype=np.float64).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"got {b.size} 'before' scores but {a.size} 'after' scores")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("scores must be finite mean log-probs")
    if mode == "logprob":
        return a - b
    if mode == "prob":
        return np.exp(a) - np.exp(b)
    raise ValueError(f"unknown IG mode {mode!r}; known: {list(IG_MODES)}")


def igpo_turn_rewards(
    before: ArrayLike, after: ArrayLike, outcome: float, *, mode: str = "logprob"
) -> np.ndarray:
    """Turn rewards of one rollout: ``[IG_1, ..., IG_{T-1}, R]``.

    ``before``/``after`` hold the scores around the ``T - 1`` non-final turns
    (possibly none: a one-turn rollout gets ``[R]``).
    """
    if not np.isfinite(outcome):
        raise ValueError(f"outcome reward must be finite, got {outcome}")
    return np.append(information_gain(before, after, mode=mode), float(outcome))


def igpo_advantages(
    turn_rewards: Sequence[ArrayLike], *, gamma: float = 1.0, var_eps: float = 1e-8
) -> list[np.ndarray]:
    """Turn-level advantages of one group from each rollout's turn rewards.

    Joint z-score over every turn reward of the group (population variance,
    ``var_eps`` inside the square root), then the discounted reverse sum
    ``A_t = r~_t + gamma * A_{t+1}`` within each rollout. Returns one array per
    rollout (same lengths as the inputs; empty stays empty).
    """
    parts = [np.asarray(r, dtype=np.float64).reshape(-1) for r in turn_rewards]
    pooled = np.concatenate(parts) if parts else np.zeros(0)
    if not np.all(np.isfinite(pooled)):
        raise ValueError("turn rewards must be finite")
    if pooled.size == 0:
        return [p.copy() for p in parts]
    mean, denom = pooled.mean(), np.sqrt(pooled.var() + var_eps)
    out: list[np.ndarray] = []
    for p in parts:
        z = (p - mean) / denom
        adv = np.zeros_like(z)
        running = 0.0
        for t in range(z.size - 1, -1, -1):
            running = z[t] + gamma * running
            adv[t] = running
        out.append(adv)
    return out


def _split_scores(entries: Sequence[ScorePair], n_turns: int, i: int) -> tuple[list[float], list[float]]:
    if len(entries) == n_turns:
        entries = entries[:-1]  # the final turn's entry is ignored: it gets the outcome reward
    elif len(entries) != n_turns - 1:
        raise ValueError(
            f"scores[{i}] has {len(entries)} entries for {n_turns} turns; expected {n_turns - 1} "
            f"(non-final turns) or {n_turns} (final entry ignored)"
        )
    before, after = [], []
    for t, pair in enumerate(entries):
        if pair is None or len(pair) != 2:
            raise ValueError(f"scores[{i}][{t}] must be a (before, after) pair, got {pair!r}")
        before.append(float(pair[0]))
        after.append(float(pair[1]))
    return before, after


@dataclass(frozen=True)
class IGPOParams:
    """The parameters of ``igpo`` (``algo.estimator_params``; docs/spec/baselines.md)."""

    mode: str = "logprob"
    """Information gain of a turn from its scores: ``logprob`` (difference of mean answer-token
    log-probs) or ``prob`` (of their exponentials); :data:`IG_MODES`."""
    gamma: float = 1.0
    """Discount of the turn rewards into turn returns (:func:`igpo_advantages`)."""


@register_estimator("igpo", loss_agg_mode="token-mean", needs=("scores",), params=IGPOParams)
def igpo(
    groups: Sequence[Group],
    *,
    scores: Sequence[Sequence[ScorePair]],
    **params: Any,
) -> TokenAdvantages:
    """IGPO: turn-level information-gain advantages, each on its turn's tokens (docs/spec/baselines.md).

    ``scores``: aligned with ``[r for g in groups for r in g.rollouts]``;
    ``scores[i][t] = (score(h before turn t), score(h after turn t))`` for the
    turns of rollout ``i`` in ``rollout.turns`` order (segments, then turns),
    each score a mean answer-token log-prob. Give the ``T_i - 1`` non-final turns,
    or all ``T_i`` turns (the final entry, e.g. ``None``, is ignored: that turn
    gets the outcome ``rollout.reward``). A rollout with no turns takes no part
    in the group's normalization. ``params``: :class:`IGPOParams`.
    """
    p = IGPOParams(**params)
    if p.mode not in IG_MODES:
        raise ValueError(f"unknown IG mode {p.mode!r}; known: {list(IG_MODES)}")
    rollouts = flatten_rollouts(groups)
    if len(scores) != len(rollouts):
        raise ValueError(f"scores cover {len(scores)} rollouts, expected {len(rollouts)}")
    per_turn: list[np.ndarray] = []
    start = 0
    for g in groups:
        rewards = []
        for i in range(start, start + len(g.rollouts)):
            n_turns = rollouts[i].num_turns
            if n_turns == 0:
                rewards.append(np.zeros(0))
                continue
            before, after = _split_scores(scores[i], n_turns, i)
            rewards.append(igpo_turn_rewards(before, after, rollouts[i].reward, mode=p.mode))
        per_turn.extend(igpo_advantages(rewards, gamma=p.gamma))
        start += len(g.rollouts)
    return broadcast_turn_values(rollouts, np.concatenate(per_turn) if per_turn else np.zeros(0))
