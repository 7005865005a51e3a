"""CCPO: contextual credit from observation-matched peers (docs/spec/ccpo.md; paper Sec. 3 and App. C).

For each unique step ``(i, t)`` of task ``x`` with observation ``o_{i,t}``:

- Peers (Eq. 2): ``E = {(j, s): x_j = x, j != i, o_{j,s} = o_{i,t}}``; ``P = E`` when
  non-empty, else every same-task step with ``j != i`` (task fallback). ``P``
  empty (a task with one trajectory) => unsupported, zero contextual credit.
- Bandwidth (App. C.2): ``tau_B = kernel_scale * m~_B``, ``m_B`` the median
  Euclidean distance of ``phi`` over distinct unordered pairs of the bucket
  ``B`` (all steps with the query's (task, observation), own trajectory
  included; the whole task for fallback), ``m~_B = m_B if m_B > 1e-9 else 1``.
- Readout (Eqs. 3-4): ``w = exp(-||phi_q - phi_p|| / tau_B)``; per peer trajectory
  ``M_j = sum w``, ``mu_j = sum w r / max(M_j, 1e-12)``; then
  ``B[r] = sum_j M_j mu_j / max(sum_j M_j, 1e-12)``.
- Targets: ``Y_{i,t} = gamma^(T_i-1-t) R_i - eta 1[invalid]`` and
  ``Z_{i,s} = gamma^(T_i-s) R_i``.
- Credibility shrinkage (released-code option, off by default: ``kappa = 0`` is the paper text):
  for a query with exact-observation peers in ``J`` distinct other trajectories,
  ``b = (J B[r] + kappa b_task[r]) / (J + kappa)`` with ``b_task[r]`` the unweighted mean of
  ``r`` over every step of the task's *other* trajectories; fallback readouts are not shrunk.
  It applies to both readouts (``B[Y]`` and ``V = B[Z]``). Source: an earlier arm of the
  authors' repository (``tracyhann/agent-context-grpo``, ``ccpo/core_ccpo.py``, kappa = 2);
  docs/released_recipes.md.
- Historical credit (Eq. 5): ``C^H = Y - B[Y]``.
- Future credit (Eqs. 6-7): ``V_{i,s} = B_{i,s}[Z]`` (``s < T_i``), ``V_{i,T_i} = R_i``;
  ``t+ = min(t + horizon, T_i)``, ``dV = V_{i,t+} - V_{i,t}`` where both endpoints
  are defined; ``C^F = z_x[dV]`` over the eligible unique steps of the task
  (sample std + 1e-6; fewer than 2 eligible steps => 0).
- Final (Eqs. 8, 11): over the task's supported restored rows ``S^_x`` (duplicates
  counted), ``sigma = s(C^H + C^F) + 1e-6``, ``A^d = (C^d - mean^d) / sigma`` and
  ``A^CC = A^H + A^F`` (a single supported row gets 0); ``final_standardize=False``
  keeps ``A^d = C^d``. Episode channel (App. C.3): ``e = R - eta 1[invalid]``
  standardized over all restored task rows (``episode_adv_norm="zscore"``; ``"center"``: only
  ``e - mean_x e``, in reward units, the authors' WebShop protocol), added with ``episode_weight``.

Diagnostics (not used by the advantages): :func:`peer_diagnostics` reports how many other
trajectories back each step's exact-peer readout and how far the readout moves from ``b_task``.

Identical step rows (same task, trajectory and step) are merged before features,
readouts and the future-credit standardization and restored at the end (App. C).
All work runs on the unique steps in a canonical order, so the output does not
depend on the order of the input rows. Everything is float64 NumPy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from horizonrl.credit import side_info
from horizonrl.credit.ccpo_features import (
    StepBatch,
    broadcast_steps,
    context_features,
    factorize,
    merge_duplicates,
    observation_mode,
    step_batch_from_groups,
    trajectory_codes,
    unique_steps,
)
from horizonrl.credit.registry import register_estimator
from horizonrl.trajectory import Group, TokenAdvantages
from horizonrl.vocab import ObsKey

KERNELS = ("exp", "cosine", "uniform")
EPISODE_NORMS = ("zscore", "center")
WEIGHT_FLOOR = 1e-12
MEDIAN_FLOOR = 1e-9
STD_EPS = 1e-6


@dataclass(frozen=True, eq=False)
class ContextualCredit:
    """Per-row CCPO output, aligned with the input rows.

    ``advantage = historical + future + episode_weight * episode``; ``historical``
    and ``future`` are the contributions ``A^H``, ``A^F`` (Eq. 11; the raw
    weighted credits when ``final_standardize=False``); ``supported``: the step
    had peers; ``fallback``: its peers came from the task fallback; ``episode``:
    the episode-channel advantage ``A^EP`` (before ``episode_weight``); ``peers``: the size of
    the step's peer set ``P`` (``None`` when not computed).
    """

    advantage: np.ndarray
    historical: np.ndarray
    future: np.ndarray
    supported: np.ndarray
    fallback: np.ndarray
    episode: np.ndarray
    peers: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class PeerReadout:
    """Output of :func:`peer_readout`: ``values`` [N, K] (0 where unsupported), per-row flags, bandwidths,
    peer-set sizes ``|P|``, ``trajectories`` ``J`` (distinct other trajectories at the row's exact
    observation; 0 for fallback and unsupported rows) and ``task_baseline`` [N, K] ``b_task`` (the
    unweighted mean of each target over the task's other trajectories' steps; 0 where there are none)."""

    values: np.ndarray
    supported: np.ndarray
    fallback: np.ndarray
    bandwidth: np.ndarray
    peers: np.ndarray | None = None
    trajectories: np.ndarray | None = None
    task_baseline: np.ndarray | None = None


@dataclass(frozen=True)
class CCPOParams:
    """The parameters of CCPO (``algo.estimator_params`` of ``algo.estimator=ccpo``; module docstring).

    Defaults are the paper's (``gamma=0.95``, ``K_F = horizon = 2``, ``tau_B = 0.15 m~_B``,
    ``eta = 0.1``). Ablation switches (App. B, Table S3): ``kernel="uniform"|"cosine"``,
    ``summary_weight=0`` (w/o context summary), ``exclude_self=False``, ``history_weight=0`` (future
    only), ``future_weight=0`` (history only); ``episode_weight=1`` is the ``A_CC + A_EP`` variant.
    Released-code options (docs/released_recipes.md): ``kappa`` and ``episode_adv_norm="center"``.
    Values are checked when the credit is computed (:func:`contextual_credit`).
    """

    gamma: float = 0.95
    """Discount ``gamma`` in (0, 1] of the targets ``Y = gamma^(T-1-t) R - eta 1[invalid]`` and
    ``Z = gamma^(T-t) R``."""
    horizon: int = 2
    """Future-credit horizon ``K_F`` (Eq. 6): ``t+ = min(t + horizon, T)``; a non-negative integer."""
    kernel_scale: float = 0.15
    """Bandwidth factor (App. C.2): ``tau_B = kernel_scale * m~_B``; positive."""
    eta: float = 0.1
    """Invalid-action penalty ``eta`` in the target ``Y`` and in the episode channel
    ``e = R - eta 1[invalid]``."""
    final_standardize: bool = True
    """Standardize the credits per task with one shared scale (Eq. 11); False keeps ``A^d = C^d``."""
    episode_weight: float = 0.0
    """Weight of the episode channel ``A^EP`` added to ``A^CC`` (1: the ``A_CC + A_EP`` variant)."""
    kernel: str = "exp"
    """Peer weights: ``exp`` (the paper, ``w = exp(-d / tau_B)``), ``uniform`` (``w = 1``) or ``cosine``
    (``w = max(cos, 0)``, our reconstruction of the paper's ablation); :data:`KERNELS`."""
    summary_weight: float = 1.0
    """Weight of the context summary in the features ``phi`` (0: the "w/o context summary" ablation);
    read by :func:`contextual_credit` (:func:`contextual_credit_from_features` takes ``phi`` as given)."""
    exclude_self: bool = True
    """Exact peers come from other trajectories only (False: the "w/o self-trajectory peer exclusion"
    ablation)."""
    history_weight: float = 1.0
    """Weight of the historical credit ``C^H`` (0: future only)."""
    future_weight: float = 1.0
    """Weight of the future credit ``C^F`` (0: history only)."""
    kappa: float = 0.0
    """Credibility shrinkage of exact-peer readouts toward the task baseline,
    ``(J B + kappa b_task) / (J + kappa)`` (released code; 0 is the paper text); >= 0."""
    episode_adv_norm: str = "zscore"
    """Episode channel over a task's rows: ``zscore`` (standardized) or ``center`` (``e - mean e``, in
    reward units, the authors' WebShop protocol); :data:`EPISODE_NORMS`."""
    obs_key: str = ObsKey.TEXT.value
    """What peers are matched on (read by the ``ccpo`` estimator when it builds the steps): ``text``
    (the paper: the observation text the policy saw), ``state`` (the environment's ``obs_key``, a
    "perfect anchor" ablation) or ``turn``
    (:func:`~horizonrl.credit.ccpo_features.prompt_observations`)."""


def _params(params: CCPOParams | None, overrides: dict[str, Any]) -> CCPOParams:
    """``params`` (default :class:`CCPOParams`) with ``overrides`` (keyword names of its fields)."""
    base = CCPOParams() if params is None else params
    return replace(base, **overrides) if overrides else base


# ----------------------------------------------------------------- readout


def pairwise_distances(phi: np.ndarray) -> np.ndarray:
    """Euclidean distance matrix of the rows of ``phi`` (Gram form, near pairs recomputed exactly)."""
    sq = np.einsum("ij,ij->i", phi, phi)
    d2 = sq[:, None] + sq[None, :] - 2.0 * (phi @ phi.T)
    d2 = np.maximum(0.5 * (d2 + d2.T), 0.0)
    np.fill_diagonal(d2, 0.0)
    # Near pairs lose all precision in the Gram form: recompute them from differences (in chunks).
    a, b = np.nonzero(np.triu(d2 <= 1e-4, 1))
    for lo in range(0, len(a), 4096):
        i, j = a[lo : lo + 4096], b[lo : lo + 4096]
        d2[i, j] = d2[j, i] = np.sum((phi[i] - phi[j]) ** 2, axis=1)
    return np.sqrt(d2)


def _safe_median(d: np.ndarray, members: np.ndarray) -> float:
    """``m~_B``: median over distinct unordered pairs of ``members``; 1 when <= 1e-9 or no pair exists."""
    if len(members) < 2:
        return 1.0
    iu = np.triu_indices(len(members), 1)
    m = float(np.median(d[np.ix_(members, members)][iu]))
    return m if m > MEDIAN_FLOOR else 1.0


def peer_readout(
    features: np.ndarray,
    task_codes: np.ndarray,
    traj_codes: np.ndarray,
    obs_codes: np.ndarray,
    targets: np.ndarray,
    *,
    kernel_scale: float = 0.15,
    kernel: str = "exp",
    exclude_self: bool = True,
    kappa: float = 0.0,
) -> PeerReadout:
    """Contextual readouts ``B[r]`` of the columns of ``targets`` for every row (paper Eqs. 2-4, App. C.2).

    Rows are unique steps; ``traj_codes`` must identify trajectories globally.
    ``kernel``: ``"exp"`` (paper), ``"uniform"`` (``w = 1``) or ``"cosine"``
    (``w = max(cos(phi_q, phi_p), 0)``, our reconstruction of the paper's
    "cosine-based weighting" ablation). ``exclude_self=False`` is the "w/o
    self-trajectory peer exclusion" ablation: exact peers include the query's own
    trajectory and the query itself. ``kappa > 0`` shrinks each exact-peer readout toward the
    task baseline, ``(J B + kappa b_task) / (J + kappa)`` (module docstring). ``bandwidth`` is
    ``tau_B`` (NaN where unsupported). One pass per task; no loop over peers.
    """
    if not kappa >= 0.0:
        raise ValueError(f"kappa must be >= 0, got {kappa}")
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    targets = np.asarray(targets, dtype=np.float64)
    targets = targets[:, None] if targets.ndim == 1 else targets
    n = len(task_codes)
    values = np.zeros((n, targets.shape[1]))
    supported = np.zeros(n, dtype=bool)
    fallback = np.zeros(n, dtype=bool)
    bandwidth = np.full(n, np.nan)
    n_peers = np.zeros(n, dtype=np.int64)
    n_trajs = np.zeros(n, dtype=np.int64)
    task_base = np.zeros((n, targets.shape[1]))
    order = np.argsort(task_codes, kind="stable")
    bounds = np.flatnonzero(np.diff(task_codes[order])) + 1
    for idx in np.split(order, bounds) if n else []:
        phi, obs = features[idx], obs_codes[idx]
        traj = np.unique(traj_codes[idx], return_inverse=True)[1].reshape(-1)
        d = pairwise_distances(phi)
        same_obs = obs[:, None] == obs[None, :]
        other = traj[:, None] != traj[None, :]
        exact = same_obs & other if exclude_self else same_obs
        has_exact = exact.any(axis=1)
        peers = np.where(has_exact[:, None], exact, other)
        sup = peers.any(axis=1)
        # Bandwidths, computed on the full bucket before trajectory exclusion.
        tau = np.empty(len(idx))
        by_obs = np.argsort(obs, kind="stable")
        for members in np.split(by_obs, np.flatnonzero(np.diff(obs[by_obs])) + 1):
            tau[members] = _safe_median(d, members)
        if np.any(~has_exact & sup):
            tau[~has_exact] = _safe_median(d, np.arange(len(idx)))
        tau *= kernel_scale
        if kernel == "exp":
            w = np.exp(-d / tau[:, None])
        elif kernel == "cosine":
            w = np.maximum(phi @ phi.T, 0.0)
        else:
            w = np.ones_like(d)
        w *= peers
        onehot = np.eye(traj.max() + 1)[traj]  # [n_x, trajectories]
        mass = w @ onehot  # M_j per query
        denom = np.maximum(mass, WEIGHT_FLOOR)
        total = np.maximum(mass.sum(axis=1), WEIGHT_FLOOR)
        # J: distinct other trajectories at the query's exact observation; fallback rows keep lam = 1.
        n_traj = ((same_obs & other).astype(np.float64) @ onehot > 0).sum(axis=1)
        lam = np.where(has_exact, n_traj / np.maximum(n_traj + kappa, WEIGHT_FLOOR), 1.0)
        n_other = np.maximum(other.sum(axis=1), 1)
        for k in range(targets.shape[1]):
            traj_mean = (w @ (onehot * targets[idx, k][:, None])) / denom  # mu_j
            readout = (mass * traj_mean).sum(axis=1) / total
            base = (other @ targets[idx, k]) / n_other  # b_task: other trajectories' steps
            if kappa > 0:
                readout = lam * readout + (1.0 - lam) * base
            values[idx, k] = np.where(sup, readout, 0.0)
            task_base[idx, k] = np.where(other.any(axis=1), base, 0.0)
        supported[idx] = sup
        fallback[idx] = sup & ~has_exact
        bandwidth[idx] = np.where(sup, tau, np.nan)
        n_peers[idx] = peers.sum(axis=1)
        n_trajs[idx] = n_traj
    return PeerReadout(
        values=values,
        supported=supported,
        fallback=fallback,
        bandwidth=bandwidth,
        peers=n_peers,
        trajectories=n_trajs,
        task_baseline=task_base,
    )


# ----------------------------------------------------------------- standardization helpers


def _grouped_z(values: np.ndarray, groups: np.ndarray, mask: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``(v - mean) / (sample std + 1e-6)`` within each group over ``mask`` rows counted ``weights`` times.

    Rows outside ``mask``, groups with total weight < 2 and groups whose values
    are all equal get 0.
    """
    centered = _grouped_center(values, groups, mask, weights)
    if not np.any(mask):
        return centered
    g, c = groups[mask], weights[mask].astype(np.float64)
    n_groups = int(groups.max()) + 1
    cnt = np.bincount(g, weights=c, minlength=n_groups)
    ss = np.bincount(g, weights=c * centered[mask] ** 2, minlength=n_groups)
    ok = (cnt >= 2) & ~_constant(values, groups, mask)
    std = np.sqrt(ss / np.maximum(cnt - 1.0, 1.0))
    out = np.zeros(len(values))
    out[mask] = np.where(ok[g], centered[mask] / (std[g] + STD_EPS), 0.0)
    return out


def _grouped_center(
    values: np.ndarray, groups: np.ndarray, mask: np.ndarray, weights: np.ndarray
) -> np.ndarray:
    """``v - mean`` within each group over ``mask`` rows counted ``weights`` times (no scale).

    Rows outside ``mask`` and groups with total weight < 2 get 0, as in :func:`_grouped_z`.
    """
    out = np.zeros(len(values))
    if not np.any(mask):
        return out
    g, v, c = groups[mask], values[mask], weights[mask].astype(np.float64)
    n_groups = int(groups.max()) + 1
    cnt = np.bincount(g, weights=c, minlength=n_groups)
    mean = np.bincount(g, weights=c * v, minlength=n_groups) / np.maximum(cnt, 1.0)
    out[mask] = np.where(cnt[g] >= 2, v - mean[g], 0.0)
    return out


# ----------------------------------------------------------------- main entry points


def contextual_credit(
    steps: StepBatch, hidden: np.ndarray, params: CCPOParams | None = None, **overrides: Any
) -> ContextualCredit:
    """CCPO step advantages for the rows of ``steps`` from frozen-model states ``hidden`` [N, D].

    ``params`` (default :class:`CCPOParams`, the paper's settings) with ``overrides`` by field name,
    e.g. ``contextual_credit(steps, hidden, kappa=2.0)``; ``obs_key`` is not read here (``steps``
    already carry their observations). See the module docstring for every formula.
    """
    p = _params(params, overrides)
    if len(steps) == 0:
        return _empty()
    first, inverse, counts = unique_steps(steps)
    unique = steps.take(first)
    phi = context_features(
        unique, merge_duplicates(hidden, first, inverse, counts), summary_weight=p.summary_weight
    )
    return _credit(unique, phi, inverse, counts, p)


def contextual_credit_from_features(
    steps: StepBatch, features: np.ndarray, params: CCPOParams | None = None, **overrides: Any
) -> ContextualCredit:
    """:func:`contextual_credit` with precomputed context features ``phi`` [N, F] instead of hidden states
    (``summary_weight`` and ``obs_key`` are not read)."""
    p = _params(params, overrides)
    if len(steps) == 0:
        return _empty()
    first, inverse, counts = unique_steps(steps)
    phi = merge_duplicates(features, first, inverse, counts)
    return _credit(steps.take(first), phi, inverse, counts, p)


def _empty() -> ContextualCredit:
    z = np.zeros(0)
    return ContextualCredit(z, z.copy(), z.copy(), np.zeros(0, bool), np.zeros(0, bool), z.copy())


def _credit(
    u: StepBatch, phi: np.ndarray, inverse: np.ndarray, counts: np.ndarray, p: CCPOParams
) -> ContextualCredit:
    if p.episode_adv_norm not in EPISODE_NORMS:
        raise ValueError(f"episode_adv_norm must be one of {EPISODE_NORMS}, got {p.episode_adv_norm!r}")
    if not 0.0 < p.gamma <= 1.0:
        raise ValueError(f"gamma must be in (0, 1], got {p.gamma}")
    if p.kernel_scale <= 0:
        raise ValueError(f"kernel_scale must be positive, got {p.kernel_scale}")
    if int(p.horizon) != p.horizon or p.horizon < 0:
        raise ValueError(f"horizon must be a non-negative integer, got {p.horizon}")
    task, traj = trajectory_codes(u)
    t, big_t, r = u.steps, u.lengths, u.rewards
    penalty = p.eta * u.invalid
    y, z = _targets(u, p.gamma, p.eta)
    ro = peer_readout(phi, task, traj, factorize(u.observations), np.stack([y, z], axis=1),
                      kernel_scale=p.kernel_scale, kernel=p.kernel, exclude_self=p.exclude_self,
                      kappa=p.kappa)  # fmt: skip
    sup = ro.supported
    c_hist = np.where(sup, y - ro.values[:, 0], 0.0)
    # Future credit: V at both endpoints; the terminal endpoint is R_i.
    value = np.where(sup, ro.values[:, 1], np.nan)
    t_plus = np.minimum(t + int(p.horizon), big_t)
    v_plus = np.where(t_plus == big_t, r, np.nan)
    span = int(big_t.max(initial=0)) + 1
    keys = traj * span + t  # one per unique row
    by_key = np.argsort(keys)
    want = traj * span + t_plus
    pos = by_key[np.clip(np.searchsorted(keys[by_key], want), 0, len(keys) - 1)]
    found = (t_plus < big_t) & (keys[pos] == want)
    v_plus = np.where(found, value[pos], v_plus)
    dv = v_plus - value
    eligible = np.isfinite(dv)
    c_fut = _grouped_z(np.where(eligible, dv, 0.0), task, eligible, np.ones(len(u)))
    c_hist, c_fut = p.history_weight * c_hist, p.future_weight * c_fut
    # Final per-task transformation over the restored supported rows (duplicates counted).
    if p.final_standardize:
        a_hist, a_fut = _shared_scale(c_hist, c_fut, task, sup, counts)
    else:
        a_hist, a_fut = c_hist, c_fut
    everyone = np.ones(len(u), bool)
    if p.episode_adv_norm == "zscore":
        episode = _grouped_z(r - penalty, task, everyone, counts)
    else:
        episode = _grouped_center(r - penalty, task, everyone, counts)
    adv = a_hist + a_fut + p.episode_weight * episode
    return ContextualCredit(
        advantage=adv[inverse],
        historical=a_hist[inverse],
        future=a_fut[inverse],
        supported=sup[inverse],
        fallback=ro.fallback[inverse],
        episode=episode[inverse],
        peers=ro.peers[inverse],
    )


def _targets(u: StepBatch, gamma: float, eta: float) -> tuple[np.ndarray, np.ndarray]:
    """``(Y, Z)``: ``Y = gamma^(T-1-t) R - eta 1[invalid]``, ``Z = gamma^(T-t) R`` (module docstring)."""
    t, big_t, r = u.steps, u.lengths, u.rewards
    return gamma ** (big_t - 1 - t) * r - eta * u.invalid, gamma ** (big_t - t) * r


def peer_diagnostics(
    steps: StepBatch,
    hidden: np.ndarray,
    params: CCPOParams | None = None,
    *,
    kappa: float = 2.0,
    **overrides: Any,
) -> dict[str, float]:
    """How thin the historical readout's support is and how far it moves from the task baseline.

    Over the unique steps with exact-observation peers (``J >= 1`` distinct other trajectories,
    :class:`PeerReadout`): ``gap = B[Y] - b_task[Y]``, the paper's readout (no shrinkage) minus the
    unweighted mean of ``Y`` over the task's other trajectories. Shrinkage with ``kappa`` would keep
    ``J / (J + kappa)`` of it. Returns ``peer_trajs_mean`` (mean ``J``), ``thin_peer_rate`` (share of
    all unique steps with ``J`` in {1, 2}), ``baseline_gap_rms`` and ``baseline_gap_rms_thin`` (root
    mean square of ``gap`` over those steps and over the thin ones; 0 when there are none) and
    ``baseline_gap_rms_kappa`` (of the shrunk gap). Diagnostics of issue 27's seed-instability question;
    the advantages do not use them. ``params`` / ``overrides``: the run's :class:`CCPOParams` (its
    ``gamma``, ``eta``, ``kernel_scale``, ``kernel``, ``summary_weight`` and ``exclude_self`` are read;
    its ``kappa`` is not: ``kappa`` here is the probe's).
    """
    p = _params(params, overrides)
    if not kappa >= 0.0:
        raise ValueError(f"kappa must be >= 0, got {kappa}")
    if len(steps) == 0:
        return {}
    first, inverse, counts = unique_steps(steps)
    u = steps.take(first)
    phi = context_features(
        u, merge_duplicates(hidden, first, inverse, counts), summary_weight=p.summary_weight
    )
    task, traj = trajectory_codes(u)
    y, _ = _targets(u, p.gamma, p.eta)
    ro = peer_readout(phi, task, traj, factorize(u.observations), y, kernel_scale=p.kernel_scale,
                      kernel=p.kernel, exclude_self=p.exclude_self)  # fmt: skip
    j = ro.trajectories
    gap = ro.values[:, 0] - ro.task_baseline[:, 0]
    exact, thin = j >= 1, (j >= 1) & (j <= 2)

    def rms(x: np.ndarray) -> float:
        return float(np.sqrt(np.mean(x**2))) if len(x) else 0.0

    return {
        "peer_trajs_mean": float(j[exact].mean()) if exact.any() else 0.0,
        "thin_peer_rate": float(thin.mean()),
        "baseline_gap_rms": rms(gap[exact]),
        "baseline_gap_rms_thin": rms(gap[thin]),
        "baseline_gap_rms_kappa": rms(gap[exact] * j[exact] / (j[exact] + kappa)),
    }


def _constant(values: np.ndarray, groups: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per group: are ``values`` over the ``mask`` rows all equal (True for empty groups)?"""
    n_groups = int(groups.max(initial=-1)) + 1
    lo = np.full(n_groups, np.inf)
    hi = np.full(n_groups, -np.inf)
    np.minimum.at(lo, groups[mask], values[mask])
    np.maximum.at(hi, groups[mask], values[mask])
    return ~(hi > lo)


def _shared_scale(
    c_hist: np.ndarray, c_fut: np.ndarray, task: np.ndarray, sup: np.ndarray, counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 11: ``A^d = (C^d - mean^d) / (s(C^H + C^F) + 1e-6)`` per task over supported rows x counts."""
    n_tasks = int(task.max(initial=-1)) + 1
    c = np.where(sup, counts, 0).astype(np.float64)
    cnt = np.bincount(task, weights=c, minlength=n_tasks)
    mu_h = np.bincount(task, weights=c * c_hist, minlength=n_tasks) / np.maximum(cnt, 1.0)
    mu_f = np.bincount(task, weights=c * c_fut, minlength=n_tasks) / np.maximum(cnt, 1.0)
    total = c_hist + c_fut
    ss = np.bincount(task, weights=c * (total - (mu_h + mu_f)[task]) ** 2, minlength=n_tasks)
    sigma = np.sqrt(ss / np.maximum(cnt - 1.0, 1.0)) + STD_EPS
    ok = sup & (cnt[task] >= 2) & ~(_constant(c_hist, task, sup) & _constant(c_fut, task, sup))[task]
    a_hist = np.where(ok, (c_hist - mu_h[task]) / sigma[task], 0.0)
    a_fut = np.where(ok, (c_fut - mu_f[task]) / sigma[task], 0.0)
    return a_hist, a_fut


# ----------------------------------------------------------------- registered estimator


@register_estimator("ccpo", loss_agg_mode="token-mean", needs=("hidden",), params=CCPOParams)
def ccpo(groups: Sequence[Group], *, hidden: np.ndarray | None = None, **params: Any) -> TokenAdvantages:
    """CCPO: contextual step credit from observation-matched peers, on every response token of the step.

    ``hidden`` [N, D]: frozen-model final-layer states of the last prompt token,
    one row per turn in the order of :func:`step_batch_from_groups` (computed by
    the trainer; credit never runs a model). ``params``: the fields of :class:`CCPOParams`
    (``obs_key``, what peers are matched on, and those of :func:`contextual_credit`).
    """
    p = CCPOParams(**params)
    if hidden is None:
        raise ValueError("the ccpo estimator needs hidden=[N, D] frozen-model states, one row per turn")
    steps = step_batch_from_groups(groups, observation=observation_mode(p.obs_key))
    out = contextual_credit(steps, hidden, p)
    side_info.record_turn_columns(
        groups,
        supported=out.supported,
        fallback=out.fallback,
        peers=out.peers,
        historical=out.historical,
        future=out.future,
    )
    return broadcast_steps(groups, out.advantage)
