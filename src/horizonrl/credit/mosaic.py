"""Mosaic: session-aware trajectory advantage + session-level advantage shaping.

Spec: docs/spec/mosaic.md; paper: Mosaic (§3.1 Eq. 14, §3.2, A.1, A.2, B.1, B.2).

Hierarchy of the credit signal for rollout ``i`` of a group:

1. trajectory level (§3.1): ``Â^sat_i`` from the outcome rewards ``R`` and the
   session counts ``N`` (:func:`session_aware_advantage`);
2. session level (§3.2): each eligible (non-terminal) session ``s`` gets
   ``A_{i,s} = gate(Â^sat_i + lambda_r * r_s)``, where ``r_s`` is its raw marginal
   information gain normalized within the group per session type
   (:func:`shape_session_advantages`). Every response token of the session gets
   ``A_{i,s}``; the loss uses ``rollout-mean-token-mean`` aggregation.

Information gains need the policy (teacher-forced ``Engine.score``), so the
trainer computes them and passes them to the ``mosaic`` estimator; the pure
helpers :func:`answer_score` and :func:`marginal_information_gain` turn the
engine's token log-probs into the raw gains ``r^Δ_s``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from horizonrl.credit import side_info
from horizonrl.credit.broadcast import broadcast_to_tokens, flatten_rollouts
from horizonrl.credit.group import finite_vector, group_advantage
from horizonrl.credit.registry import register_estimator
from horizonrl.trajectory import Group, Rollout, TokenAdvantages

Gains = Sequence[Sequence[float | None]]


def centered_rank(values: ArrayLike) -> np.ndarray:
    """Centered average rank ``u_j = (2 r_j - n - 1) / (n - 1)`` in ``[-1, 1]`` (docs/spec/mosaic.md, step 2).

    ``r_j`` is the 1-based *average* rank of ``values[j]`` (ties share the mean of
    their ranks), so ``u`` increases with the value, sums to 0, and is 0 for every
    element when all values are equal. ``n = 1`` gives ``u = 0``.
    """
    v = np.asarray(values, dtype=np.float64)
    n = v.size
    if n < 2:
        return np.zeros(n)
    less = (v[None, :] < v[:, None]).sum(axis=1)
    equal = (v[None, :] == v[:, None]).sum(axis=1)
    ranks = less + (equal + 1) / 2.0
    return (2.0 * ranks - n - 1.0) / (n - 1.0)


def session_aware_advantage(
    rewards: ArrayLike,
    session_counts: ArrayLike,
    *,
    rho: float = 0.2,
    beta0: float = 0.1,
    beta1: float = 0.2,
    eps: float = 1e-6,
) -> np.ndarray:
    """Session-aware trajectory advantage ``Â^sat`` of one group (paper §3.1, Eq. 14; A.1, A.2).

    ``Â_i`` is the GRPO advantage of ``R`` (sample std, ``eps``; docs/spec/baselines.md).
    ``u_i`` = :func:`centered_rank` of ``N_i`` within its outcome subgroup
    ``{j : R_j = R_i}``. Then::

        mixed outcomes:  Â^sat_i = Â_i * (1 - rho * u_i)
        all succeed:     Â^sat_i = -beta1 * u_i
        all fail:        Â^sat_i = beta0 * min(u_i, 0)

    A group whose rewards are all equal is "all succeed" when that reward is
    ``> 0`` and "all fail" otherwise (binary rewards: 1 / 0). Requires
    ``0 <= rho < 1`` (so the factor in ``[1-rho, 1+rho]`` never flips a sign: C3)
    and ``beta0, beta1 >= 0`` (C1, C2). A group of one rollout gets 0.
    """
    r = finite_vector(rewards, "rewards")
    n = finite_vector(session_counts, "session_counts")
    if r.shape != n.shape:
        raise ValueError(f"got {r.size} rewards but {n.size} session counts")
    if not 0.0 <= rho < 1.0:
        raise ValueError(f"rho must lie in [0, 1) so outcomes keep their order, got {rho}")
    if beta0 < 0 or beta1 < 0:
        raise ValueError(f"beta0 and beta1 must be >= 0, got {beta0}, {beta1}")
    u = np.zeros_like(r)
    for value in np.unique(r):
        members = r == value
        u[members] = centered_rank(n[members])
    if r.size and np.all(r == r[0]):
        if r[0] > 0:
            return -beta1 * u
        return beta0 * np.minimum(u, 0.0)
    return group_advantage(r, eps=eps) * (1.0 - rho * u)


def normalize_session_gains(gains: Gains, types: Sequence[Sequence[str]], *, eps: float = 1e-6) -> Gains:
    """Type-conditioned group normalization of raw gains (paper §3.2, Fig. 5; docs/spec/mosaic.md).

    For each session type ``k``, over the group's eligible sessions ``S_k`` (gain
    not ``None``): ``r_s = (r^Δ_s - mean(S_k)) / (std(S_k) + eps)``, sample std
    (ddof=1, docs/spec/README.md). ``r_s = 0`` when ``|S_k| < 2`` or ``std(S_k) <= eps``.
    Ineligible sessions stay ``None``. Global normalization = one shared type.
    """
    if len(gains) != len(types):
        raise ValueError(f"gains cover {len(gains)} rollouts but types cover {len(types)}")
    pools: dict[str, list[float]] = {}
    for i, (g_i, t_i) in enumerate(zip(gains, types, strict=True)):
        if len(g_i) != len(t_i):
            raise ValueError(f"rollout {i}: {len(g_i)} gains but {len(t_i)} session types")
        for s, (g, k) in enumerate(zip(g_i, t_i, strict=True)):
            if g is not None:
                if not math.isfinite(g):
                    raise ValueError(f"rollout {i} session {s}: gain {g} is not finite")
                pools.setdefault(k, []).append(float(g))
    stats: dict[str, tuple[float, float] | None] = {}
    for k, vals in pools.items():
        arr = np.asarray(vals)
        std = float(arr.std(ddof=1)) if arr.size >= 2 else 0.0
        stats[k] = (float(arr.mean()), std) if std > eps else None
    out: list[list[float | None]] = []
    for g_i, t_i in zip(gains, types, strict=True):
        row: list[float | None] = []
        for g, k in zip(g_i, t_i, strict=True):
            if g is None:
                row.append(None)
            elif stats[k] is None:
                row.append(0.0)
            else:
                mean, std = stats[k]  # type: ignore[misc]
                row.append((float(g) - mean) / (std + eps))
        out.append(row)
    return out


def shape_session_advantages(
    base: ArrayLike,
    gains: Gains,
    types: Sequence[Sequence[str]],
    *,
    all_failed: bool,
    lambda_r: float = 0.1,
    eps: float = 1e-6,
) -> list[np.ndarray]:
    """Per-session advantages ``A_{i,s}`` of one group (paper §3.2, B.2; docs/spec/mosaic.md).

    ``base[i]`` = ``Â^sat_i``; ``gains[i][s]`` = raw marginal IG ``r^Δ_s`` of session
    ``s`` of rollout ``i`` or ``None`` if not eligible (terminal session, or not
    scored); ``types[i][s]`` = the session kind. With ``r_s`` from
    :func:`normalize_session_gains` (per type)::

        all-failure gate:       r_s <- min(r_s, 0)            if all_failed
        eligible session:       A_{i,s} = gate(Â^sat_i + lambda_r * r_s)
        direction gate:         Â^sat_i > 0 => A_{i,s} >= 0;  Â^sat_i < 0 => A_{i,s} <= 0
        ineligible session:     A_{i,s} = Â^sat_i

    (``gate`` clips to 0 on the wrong side; ``Â^sat_i = 0`` leaves the sum free.)
    Returns one float64 array per rollout, one value per session.
    """
    b = finite_vector(base, "base")
    if len(gains) != b.size:
        raise ValueError(f"got {b.size} base advantages but gains for {len(gains)} rollouts")
    normed = normalize_session_gains(gains, types, eps=eps)
    out: list[np.ndarray] = []
    for b_i, r_i in zip(b, normed, strict=True):
        values = np.full(len(r_i), b_i)
        for s, r_s in enumerate(r_i):
            if r_s is None:
                continue
            if all_failed:
                r_s = min(r_s, 0.0)
            a = b_i + lambda_r * r_s
            if b_i > 0:
                a = max(a, 0.0)
            elif b_i < 0:
                a = min(a, 0.0)
            values[s] = a
        out.append(values)
    return out


# ------------------------------------------------------------------ information gain


def answer_score(answer_logprobs: ArrayLike) -> float:
    """``score(h)``: mean log-prob of the ground-truth answer tokens (paper B.1, Eq. 29).

    ``answer_logprobs`` are the teacher-forced log-probs (``Engine.score``) of the
    answer tokens only, after ``h`` + ``"Now there's enough information to answer.
    </think> <answer> "`` and before ``" </answer>"`` + end-of-turn. Length-normalized.
    """
    lp = np.asarray(answer_logprobs, dtype=np.float64).reshape(-1)
    if lp.size == 0:
        raise ValueError("answer_score needs at least one answer token log-prob")
    return float(lp.mean())


def marginal_information_gain(score_before: float | None, score_after: float | None) -> float | None:
    """Raw marginal IG ``r^Δ_s = score(h^+_s) - score(h^-_s)`` (paper §3.2, B.1).

    ``h^-``/``h^+`` per session kind: normal = prompt / prompt + full response;
    compaction = history before compaction / next session's prompt; subagent =
    main context before the forking turn / after the results return. ``None`` in
    either score (session not eligible, e.g. the terminal one) gives ``None``.
    """
    if score_before is None or score_after is None:
        return None
    return float(score_after) - float(score_before)


def information_gain_metrics(gains: Sequence[float | None]) -> dict[str, float]:
    """Paper metrics over raw gains (docs/spec/mosaic.md "Metrics"; paper D.3).

    ``positive_ig_rate`` = share of eligible sessions with ``r^Δ > 0``;
    ``ig_per_session`` = mean of ``max(r^Δ, 0)``; ``eligible`` = their count.
    Both rates are 0.0 when no session is eligible.
    """
    vals = np.asarray([g for g in gains if g is not None], dtype=np.float64)
    if vals.size == 0:
        return {"positive_ig_rate": 0.0, "ig_per_session": 0.0, "eligible": 0.0}
    return {
        "positive_ig_rate": float((vals > 0).mean()),
        "ig_per_session": float(np.maximum(vals, 0.0).mean()),
        "eligible": float(vals.size),
    }


def terminal_session_index(rollout: Rollout) -> int:
    """Index of the session that produces the final answer (never eligible for shaping).

    A segment with ``info["terminal"]`` true wins; otherwise the last segment
    whose kind is neither ``compaction`` nor ``subagent`` (compaction chain: the
    last normal session; subagent forking: the main session); otherwise the last.
    """
    if not rollout.segments:
        raise ValueError(f"rollout {rollout.uid!r} has no segments")
    for s, seg in enumerate(rollout.segments):
        if seg.info.get("terminal"):
            return s
    for s in range(len(rollout.segments) - 1, -1, -1):
        if rollout.segments[s].kind not in ("compaction", "subagent"):
            return s
    return len(rollout.segments) - 1


# ------------------------------------------------------------------ estimator


def _rollout_gains(rollouts: list[Rollout], gains: Sequence[Sequence[float | None] | None]) -> Gains:
    if len(gains) != len(rollouts):
        raise ValueError(f"gains cover {len(gains)} rollouts, expected {len(rollouts)}")
    out: list[list[float | None]] = []
    for i, (ro, g_i) in enumerate(zip(rollouts, gains, strict=True)):
        n_seg = len(ro.segments)
        row = [None] * n_seg if g_i is None else [None if g is None else float(g) for g in g_i]
        if len(row) != n_seg:
            raise ValueError(f"gains[{i}] has {len(row)} entries for {n_seg} segments")
        term = terminal_session_index(ro) if n_seg else None
        if term is not None and row[term] is not None:
            raise ValueError(
                f"gains[{i}][{term}] is set, but segment {term} is the terminal session (not eligible); "
                "pass None there, or mark the terminal segment with info['terminal']=True"
            )
        out.append(row)
    return out


def _record_side_info(start: int, group: Group, base: np.ndarray, gains: Gains | None, normed: Gains | None):
    """Viewer side information: ``N_i`` and the trajectory advantage (``Â^sat_i``, GRPO when not
    session-aware) per rollout; raw/normalized IG and eligibility per session."""
    for k, ro in enumerate(group.rollouts):
        sessions = []
        for s in range(len(ro.segments)):
            raw = None if gains is None else gains[k][s]
            norm = None if normed is None else normed[k][s]
            sessions.append({"ig_raw": raw, "ig_norm": norm, "eligible": raw is not None})
        side_info.record_side_info(
            start + k, rollout={"N": len(ro.segments), "A_traj": float(base[k])}, sessions=sessions
        )


@dataclass(frozen=True)
class MosaicParams:
    """The parameters of ``mosaic`` (``algo.estimator_params``; docs/spec/mosaic.md, module docstring)."""

    rho: float = 0.2
    """Mixed-outcome groups: ``A^sat_i = A_i (1 - rho u_i)``, ``u_i`` the centered rank of the session
    count (:func:`session_aware_advantage`); in ``[0, 1)``."""
    beta0: float = 0.1
    """All-failed groups: ``A^sat_i = beta0 min(u_i, 0)`` (:func:`session_aware_advantage`); >= 0."""
    beta1: float = 0.2
    """All-succeeded groups: ``A^sat_i = -beta1 u_i`` (:func:`session_aware_advantage`); >= 0."""
    lambda_r: float = 0.1
    """Weight ``lambda_r`` of the normalized information-gain shaping of each session
    (:func:`shape_session_advantages`)."""
    eps: float = 1e-6
    """Added to every std in a denominator."""
    session_aware: bool = True
    """Session-aware trajectory advantage; False: the GRPO base (shaping only, paper Fig. 3c/d)."""
    shaping: bool = True
    """Information-gain session shaping; False: trajectory level only (``gains`` ignored)."""
    normalization: str = "type"
    """Gains are normalized per session ``type`` (segment kind) or pooled (``global``, paper Fig. 5)."""


@register_estimator("mosaic", loss_agg_mode="rollout-mean-token-mean", needs=("gains",), params=MosaicParams)
def mosaic(
    groups: Sequence[Group],
    *,
    gains: Sequence[Sequence[float | None] | None] | None = None,
    **params: Any,
) -> TokenAdvantages:
    """Mosaic: session-aware trajectory advantage + IG session shaping (docs/spec/mosaic.md).

    ``gains``: aligned with ``[r for g in groups for r in g.rollouts]``; ``gains[i]``
    is ``None`` (no eligible session) or a list with one entry per segment of
    rollout ``i`` (same order as ``rollout.segments``): the raw marginal IG
    ``r^Δ_s`` (:func:`marginal_information_gain`) or ``None`` for an ineligible
    session. The terminal session (:func:`terminal_session_index`) must be ``None``.

    ``N_i = len(rollout.segments)``; a group is all-failed when every reward is
    ``<= 0``. Ablations (paper Fig. 3c/d, Fig. 5): ``shaping=False`` = trajectory
    level only (``gains`` ignored); ``session_aware=False`` = GRPO base (shaping
    only); ``normalization="global"`` pools all session types. Both off = broadcasting.
    ``params``: :class:`MosaicParams`.
    """
    p = MosaicParams(**params)
    if p.normalization not in ("type", "global"):
        raise ValueError(f"normalization must be 'type' or 'global', got {p.normalization!r}")
    rollouts = flatten_rollouts(groups)
    if p.shaping:
        if gains is None:
            raise ValueError(
                "mosaic shaping needs gains=[...] per rollout/segment; pass shaping=False "
                "for the trajectory-level-only ablation"
            )
        all_gains = _rollout_gains(rollouts, gains)
    values: list[np.ndarray] = []
    start = 0
    for g in groups:
        rs = g.rewards
        if p.session_aware:
            counts = [len(ro.segments) for ro in g.rollouts]
            base = session_aware_advantage(rs, counts, rho=p.rho, beta0=p.beta0, beta1=p.beta1, eps=p.eps)
        else:
            base = group_advantage(rs, eps=p.eps)
        if p.shaping:
            g_gains = all_gains[start : start + len(g.rollouts)]
            types = [
                [seg.kind if p.normalization == "type" else "all" for seg in ro.segments] for ro in g.rollouts
            ]
            all_failed = bool(len(rs) > 0 and all(r <= 0 for r in rs))
            values.extend(
                shape_session_advantages(
                    base, g_gains, types, all_failed=all_failed, lambda_r=p.lambda_r, eps=p.eps
                )
            )
            if side_info.collecting():
                _record_side_info(start, g, base, g_gains, normalize_session_gains(g_gains, types, eps=p.eps))
        else:
            values.extend(np.full(len(ro.segments), b) for ro, b in zip(g.rollouts, base, strict=True))
            _record_side_info(start, g, base, None, None)
        start += len(g.rollouts)
    return broadcast_to_tokens(rollouts, values)
