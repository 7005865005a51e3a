"""Group-relative trajectory advantages (docs/spec/baselines.md, "Group-relative trajectory advantages").

All functions take the terminal outcome rewards ``R`` of one group (all rollouts
of one task) and return one advantage per rollout, as a float64 array.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike


def finite_vector(x: ArrayLike, name: str, *, per: str = "rollout") -> np.ndarray:
    """``x`` as a 1-D float64 array of finite values (ValueError naming ``name`` otherwise)."""
    v = np.asarray(x, dtype=np.float64)
    if v.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one value per {per}), got shape {v.shape}")
    if not np.all(np.isfinite(v)):
        raise ValueError(f"{name} must be finite, got {v.tolist()}")
    return v


def _as_rewards(rewards: ArrayLike | Sequence[float]) -> np.ndarray:
    return finite_vector(rewards, "rewards")


def _degenerate(r: np.ndarray) -> bool:
    """A group of (at most) one rollout, or one whose rewards are all equal."""
    return r.size < 2 or bool(np.all(r == r[0]))


def group_advantage(
    rewards: ArrayLike | Sequence[float], *, normalize_std: bool = True, eps: float = 1e-6, ddof: int = 1
) -> np.ndarray:
    """GRPO / Dr.GRPO advantage of each rollout of one group.

    GRPO (``normalize_std=True``)::

        A_i = (R_i - mean(R)) / (std(R) + eps)        std: sample std, ddof=1

    Dr.GRPO (``normalize_std=False``, Liu et al. 2025, "Understanding R1-Zero-Like
    Training")::

        A_i = R_i - mean(R)

    A group of one rollout, or a group whose rewards are all equal, gets ``A = 0``
    exactly (docs/spec/baselines.md). Non-finite rewards raise ``ValueError``. ``ddof=0`` uses the
    population std (ECHO's released code).
    """
    r = _as_rewards(rewards)
    if _degenerate(r):
        return np.zeros_like(r)
    centered = r - r.mean()
    if not normalize_std:
        return centered
    return centered / (r.std(ddof=ddof) + eps)


def rloo_advantage(rewards: ArrayLike | Sequence[float]) -> np.ndarray:
    """REINFORCE leave-one-out advantage (Ahmadian et al. 2024, "Back to Basics")::

        A_i = R_i - mean_{j != i} R_j = G / (G - 1) * (R_i - mean(R))

    A group of one rollout (no other sample to compare with), or a group whose
    rewards are all equal, gets ``A = 0`` exactly (docs/spec/baselines.md).
    """
    r = _as_rewards(rewards)
    if _degenerate(r):
        return np.zeros_like(r)
    g = r.size
    return g / (g - 1) * (r - r.mean())


def valid_group_advantage(
    rewards: Sequence[float],
    valid: Sequence[bool],
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
    ddof: int = 1,
) -> np.ndarray:
    """GRPO over the valid rollouts of one group; invalid rollouts get 0.

    ECHO (paper §4.3, after Eq. 14) excludes overlong/error rollouts this way; SUPO its
    overlong ones (docs/spec/baselines.md).

    ``A_i = (R_i - mean_V R) / (std_V R + eps)`` for ``i in V`` (sample std over the valid set
    ``V``, population std with ``ddof=0``; fewer than two valid rollouts, or equal valid rewards,
    give 0), ``A_i = 0`` otherwise.
    """
    r = np.asarray(rewards, dtype=np.float64)
    v = np.asarray(valid, dtype=bool)
    if r.shape != v.shape:
        raise ValueError(f"got {r.size} rewards and {v.size} validity flags")
    out = np.zeros_like(r)
    if v.any():
        out[v] = group_advantage(r[v], normalize_std=normalize_std, eps=eps, ddof=ddof)
    return out
