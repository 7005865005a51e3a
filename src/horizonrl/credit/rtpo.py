"""RTPO credit math: sibling advantages and the off-policy continuation weight.

Spec: docs/spec/rtpo.md; paper: RTPO (§3.2, Algorithm 1 line 9, Eq. 83;
off-policy variant §4.4, F.3 Eq. 105, G.6 Eqs. 108-110).

The reverse-turn trainer forks ``G - 1`` siblings from one trunk boundary
``S_k``; they share the state, so the plain mean of their returns is an unbiased
baseline with no upstream-state bias and no std division::

    V_k = mean_j R_j,      A_{j,k} = R_j - V_k

The advantage goes to the sibling's turn-``k`` tokens only (the trainer builds
those rows); it is not a registered estimator because the group trainer's
"one advantage per rollout token" contract does not fit the reverse sweep.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from horizonrl.credit.group import finite_vector


def sibling_advantage(rewards: ArrayLike) -> np.ndarray:
    """RTPO turn-level advantage ``A_j = R_j - mean(R)`` over one sibling set (docs/spec/rtpo.md step 3).

    ``rewards`` are the returns ``R_j`` (or Q-value estimates, e.g. from
    :func:`off_policy_q_values`) of the ``G - 1`` siblings forked from one
    boundary (the trunk is not among them). Siblings with equal returns get
    exactly 0 (a "zero-advantage" group in the paper's metrics); ``G = 2`` (one
    sibling) is degenerate and always gives 0, so ``G = 3`` is the minimum. An
    empty set returns an empty array.
    """
    r = finite_vector(rewards, "rewards", per="sibling")
    if r.size == 0 or np.all(r == r[0]):
        return np.zeros_like(r)
    return r - r.mean()


def zero_advantage_rate(sibling_sets: Sequence[ArrayLike]) -> float:
    """Share of sibling sets whose returns are all equal (docs/spec/rtpo.md "Metrics"); 0.0 for no sets."""
    if not sibling_sets:
        return 0.0
    flat = [finite_vector(r, "rewards", per="sibling") for r in sibling_sets]
    return float(np.mean([r.size == 0 or bool(np.all(r == r[0])) for r in flat]))


def log_importance_weight(
    logp_new: ArrayLike | Sequence[ArrayLike], logp_old: ArrayLike | Sequence[ArrayLike]
) -> float:
    """``log prod_{h>k} prod_t pi_new/pi_old = sum (logp_new - logp_old)`` over all downstream tokens.

    Accepts flat arrays or one array per downstream turn (concatenated in order);
    the two sides must match token for token. No downstream token gives 0.
    """
    new = _concat(logp_new, "logp_new")
    old = _concat(logp_old, "logp_old")
    if new.shape != old.shape:
        raise ValueError(f"logp_new has {new.size} tokens but logp_old has {old.size}")
    return float(np.sum(new - old))


def _concat(x: ArrayLike | Sequence[ArrayLike], name: str) -> np.ndarray:
    try:
        v = np.asarray(x, dtype=np.float64).reshape(-1)
    except ValueError:  # ragged: one array per downstream turn
        v = np.concatenate([np.asarray(p, dtype=np.float64).reshape(-1) for p in x])  # type: ignore[union-attr]
    if not np.all(np.isfinite(v)):
        raise ValueError(f"{name} must be finite log-probs")
    return v


def clamped_trajectory_weight(
    logp_new: ArrayLike | Sequence[ArrayLike],
    logp_old: ArrayLike | Sequence[ArrayLike],
    *,
    rho_min: float = 0.0,
    rho_max: float = 1.0,
) -> float:
    """Off-policy weight ``w = clamp(prod_{h>k} prod_t pi_{theta>k}/pi_{theta_0}, rho_min, rho_max)``.

    Paper F.3 Eq. 105 / G.6 Eq. 110, computed in log space (docs/spec/rtpo.md): the
    summed log-ratio is clamped to ``[log rho_min, log rho_max]`` before one
    ``exp``, so long downstream continuations neither overflow nor underflow
    before clamping. ``logp_new`` are the downstream tokens' log-probs under the
    current ``theta_{>k}``, ``logp_old`` under the initial ``theta_0``.

    The paper gives no values for ``rho_min``/``rho_max``; the defaults ``[0, 1]``
    are truncated importance sampling (the weight never amplifies a stale
    return). Requires ``0 <= rho_min <= rho_max`` and ``rho_max > 0``.
    """
    if not (0.0 <= rho_min <= rho_max) or rho_max <= 0.0 or not math.isfinite(rho_max):
        raise ValueError(f"need 0 <= rho_min <= rho_max, rho_max > 0 finite; got {rho_min}, {rho_max}")
    log_w = log_importance_weight(logp_new, logp_old)
    lo = math.log(rho_min) if rho_min > 0 else -math.inf
    return math.exp(min(max(log_w, lo), math.log(rho_max)))


def off_policy_q_values(
    step_rewards: ArrayLike,
    continuation_returns: ArrayLike,
    weights: ArrayLike,
    *,
    gamma: float = 1.0,
    steps: ArrayLike | int = 1,
) -> np.ndarray:
    """``Q^off_j = r_{j,k} + gamma^{tau_j} * w_j * F_j`` for each sibling (paper Eq. 105 / 109).

    ``step_rewards`` ``r_{j,k}`` (0 with a terminal-only reward), ``continuation_returns``
    ``F_j`` (the reused ``theta_0`` downstream return), ``weights`` ``w_j`` from
    :func:`clamped_trajectory_weight`, ``steps`` ``tau_j`` (default 1; irrelevant at
    the default ``gamma = 1``). Feed the result to :func:`sibling_advantage`.
    """
    r = finite_vector(step_rewards, "step_rewards", per="sibling")
    f = finite_vector(continuation_returns, "continuation_returns", per="sibling")
    w = finite_vector(weights, "weights", per="sibling")
    tau = np.broadcast_to(np.asarray(steps, dtype=np.float64), r.shape)
    if not (r.shape == f.shape == w.shape):
        raise ValueError(f"shapes differ: step_rewards {r.shape}, returns {f.shape}, weights {w.shape}")
    return r + np.power(gamma, tau) * w * f
