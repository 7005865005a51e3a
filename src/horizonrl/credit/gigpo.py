"""Step-level group baselines: GiGPO and HGPO (docs/spec/baselines.md "GiGPO"; ccpo paper Sec. 2, 4.1).

**GiGPO** (Feng et al. 2025, verl-agent)::

    A_{i,t} = A^E_i + omega * A^S_{i,t}
    A^E_i   = (R_i - mean_group R) / F                   episode term over the task group's rollouts
    A^S_{i,t} = (R_{i,t} - mean_anchor R_{.,.}) / F        anchor group: same task, identical observation
    R_{i,t} = sum_{u >= t} gamma^(u-t) r_{i,u}           (terminal reward only: gamma^(T_i-1-t) R_i)

``F = 1`` (``mode="mean_norm"``, the published default) or ``F = std + eps``
(``mode="mean_std_norm"``, sample std). A group of one member (or all-equal
values) gives 0. Defaults ``omega = 1``, ``gamma = 0.95``.

Episode term, two readings (``episode=``):

- ``"trajectory"`` (docs/spec/baselines.md): one value per rollout, the mean over the
  group's rollouts, no penalty;
- ``"steps"`` (verl-agent, the framework the CCPO paper ran:
  ``episode_norm_reward(..., compute_mean_std_cross_steps=True)`` after
  ``apply_invalid_action_penalty``): every *step row* scores
  ``e_{i,t} = R_i - eta * 1[invalid_{i,t}]`` and is normalized by the mean (and
  std) over all step rows of the task group, so longer rollouts weigh more in the
  baseline and an invalid step is penalized in the episode term too.

``grpo_steps`` is verl-agent's GRPO for step-wise agents: the ``"steps"`` episode
term alone with ``F = std`` (GiGPO with ``omega = 0``).

**HGPO** (He et al. 2026, "Hierarchy-of-Groups Policy Optimization"). The ccpo
paper only describes it as aggregating advantages from hierarchical groups
matched at different history lengths; this is a documented *reconstruction*
following the HGPO paper's description and the released verl-agent recipe:

- level ``k = 0..history``: the group of step ``(i, t)`` holds the same-task steps
  whose last ``k + 1`` observations ``o_{t-k..t}`` equal those of ``(i, t)``
  (level 0 is GiGPO's anchor group; a step with ``t < k`` has no level-``k``
  group), so ``G_0 >= G_1 >= ... >= G_K``;
- in each level group of at least 2 steps, ``a_k = (R_{i,t} - mean) / F`` as above;
- ``A_{i,t} = sum_k w_k a_k / sum_k w_k`` over the levels with such a group,
  ``w_k = L_k^alpha``, ``L_k = k + 2`` (the matched window plus one, the recipe's
  convention), ``alpha = 1``: more consistent contexts weigh more. With
  ``base_group=True`` the episode advantage ``A^E_i`` joins as an item with
  ``L = 1``. No group of 2 or more at any level => 0.

Defaults follow the released recipe: the population std (``ddof=0``,
``r.std(unbiased=False)``) and items whose advantage is exactly 0 dropped before
weighting (``drop_zero_items=True``). ``ddof=1, drop_zero_items=False`` keeps them
(an all-equal consistent group is then evidence of a zero advantage).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from horizonrl.credit.ccpo_features import (
    broadcast_steps,
    factorize,
    observation_mode,
    step_batch_from_groups,
)
from horizonrl.credit.group import group_advantage
from horizonrl.credit.registry import register_estimator
from horizonrl.trajectory import Group, Rollout, TokenAdvantages
from horizonrl.vocab import ObsKey

MODES = ("mean_norm", "mean_std_norm")


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def group_relative(
    values: np.ndarray, codes: np.ndarray, *, mode: str = "mean_norm", eps: float = 1e-6, ddof: int = 1
) -> np.ndarray:
    """``(v - mean_g) / F`` within the groups ``codes``; groups of one or of equal values give 0.

    ``F = std + eps`` with ``ddof=1`` (sample) or ``0`` (population) for ``mean_std_norm``.
    """
    _check_mode(mode)
    v = np.asarray(values, dtype=np.float64)
    codes = np.asarray(codes, dtype=np.int64)
    if v.size == 0:
        return v.copy()
    n_groups = int(codes.max()) + 1
    cnt = np.bincount(codes, minlength=n_groups).astype(np.float64)
    mean = np.bincount(codes, weights=v, minlength=n_groups) / np.maximum(cnt, 1.0)
    lo = np.full(n_groups, np.inf)
    hi = np.full(n_groups, -np.inf)
    np.minimum.at(lo, codes, v)
    np.maximum.at(hi, codes, v)
    ok = (cnt >= 2) & (hi > lo)
    dev = v - mean[codes]
    if mode == "mean_std_norm":
        ss = np.bincount(codes, weights=dev**2, minlength=n_groups)
        dev = dev / (np.sqrt(ss / np.maximum(cnt - ddof, 1.0)) + eps)[codes]
    return np.where(ok[codes], dev, 0.0)


EPISODE_TERMS = ("trajectory", "steps")


def episode_advantage(
    task_ids: Sequence,
    trajectory_ids: Sequence,
    outcomes: np.ndarray,
    *,
    mode: str = "mean_norm",
    eps: float = 1e-6,
    episode: str = "trajectory",
    penalties: np.ndarray | None = None,
) -> np.ndarray:
    """GiGPO's episode term per row: GRPO (``mean_std_norm``) or Dr.GRPO (``mean_norm``) per task.

    ``episode="trajectory"``: over the task's rollouts (one value each); ``"steps"``: over
    the task's step rows, each scored ``outcome - penalty`` (module docstring).
    """
    _check_mode(mode)
    if episode not in EPISODE_TERMS:
        raise ValueError(f"episode must be one of {EPISODE_TERMS}, got {episode!r}")
    if episode == "steps":
        score = np.asarray(outcomes, dtype=np.float64)
        if penalties is not None:
            score = score - np.asarray(penalties, dtype=np.float64)
        return group_relative(score, factorize(task_ids), mode=mode, eps=eps)
    task = factorize(task_ids)
    traj = factorize(list(zip(task.tolist(), list(trajectory_ids), strict=True)))
    outcomes = np.asarray(outcomes, dtype=np.float64)
    _, first = np.unique(traj, return_index=True)
    per_traj = np.zeros(len(first))
    for x in np.unique(task[first]):
        members = first[task[first] == x]  # one row per trajectory of task x
        per_traj[traj[members]] = group_advantage(
            outcomes[members], normalize_std=mode == "mean_std_norm", eps=eps
        )
    return per_traj[traj]


def gigpo_advantage(
    task_ids: Sequence,
    trajectory_ids: Sequence,
    observations: Sequence[str],
    returns: np.ndarray,
    outcomes: np.ndarray,
    *,
    mode: str = "mean_norm",
    omega: float = 1.0,
    eps: float = 1e-6,
    episode: str = "trajectory",
    penalties: np.ndarray | None = None,
) -> np.ndarray:
    """GiGPO per step row: ``A^E + omega * A^S_{i,t}`` (see module docstring).

    ``returns``: the discounted step returns ``R_{i,t}`` (:func:`discounted_returns`);
    ``outcomes``: each row's trajectory outcome ``R_i``; ``penalties``: each row's
    ``eta * 1[invalid]`` (used by ``episode="steps"``).
    """
    task = factorize(task_ids)
    anchor = factorize(list(zip(task.tolist(), list(observations), strict=True)))
    step = group_relative(returns, anchor, mode=mode, eps=eps) if omega else 0.0
    ep = episode_advantage(
        task_ids, trajectory_ids, outcomes, mode=mode, eps=eps, episode=episode, penalties=penalties
    )
    return ep + omega * step


def discounted_returns(
    trajectory_ids: Sequence, steps: np.ndarray, step_rewards: np.ndarray, gamma: float = 0.95
) -> np.ndarray:
    """``R_{i,t} = sum_{u >= t} gamma^(u-t) r_{i,u}`` within each trajectory (ids globally unique)."""
    traj = factorize(list(trajectory_ids))
    steps = np.asarray(steps, dtype=np.int64)
    r = np.asarray(step_rewards, dtype=np.float64)
    out = np.zeros(len(r))
    order = np.lexsort((-steps, traj))  # by trajectory, latest step first
    running, prev_traj, prev_step = 0.0, -1, 0
    for k in order:
        if traj[k] != prev_traj:
            running = 0.0
        else:
            running *= gamma ** (prev_step - steps[k])
        running += r[k]
        out[k], prev_traj, prev_step = running, traj[k], steps[k]
    return out


def hgpo_advantage(
    task_ids: Sequence,
    trajectory_ids: Sequence,
    steps: np.ndarray,
    observations: Sequence[str],
    returns: np.ndarray,
    *,
    history: int = 2,
    mode: str = "mean_std_norm",
    alpha: float = 1.0,
    eps: float = 1e-6,
    outcomes: np.ndarray | None = None,
    base_group: bool = False,
    ddof: int = 0,
    drop_zero_items: bool = True,
) -> np.ndarray:
    """HGPO per step row (reconstruction; see module docstring). ``base_group`` needs ``outcomes``."""
    _check_mode(mode)
    if int(history) != history or history < 0:
        raise ValueError(f"history must be a non-negative integer, got {history}")
    n = len(steps)
    task = factorize(task_ids)
    traj = factorize(list(zip(task.tolist(), list(trajectory_ids), strict=True)))
    steps = np.asarray(steps, dtype=np.int64)
    obs = factorize(list(observations))
    span = int(steps.max(initial=0)) + 1
    keys = traj * span + steps
    by_key = np.argsort(keys)
    num = np.zeros(n)
    den = np.zeros(n)
    if base_group:
        if outcomes is None:
            raise ValueError("base_group=True needs outcomes")
        base = episode_advantage(task_ids, trajectory_ids, outcomes, mode=mode, eps=eps)
        keep = (base != 0) if drop_zero_items else np.ones(n, bool)
        num += np.where(keep, base, 0.0)
        den += keep
    window = [obs]  # window[k] = o_{t-k} per row, -1 where that step is absent
    for k in range(int(history) + 1):
        if k > 0:
            want = keys - k
            pos = by_key[np.clip(np.searchsorted(keys[by_key], want), 0, max(n - 1, 0))]
            hit = (steps >= k) & (keys[pos] == want) if n else np.zeros(0, bool)
            window.append(np.where(hit, obs[pos], -1))
        defined = np.all(np.stack(window, axis=1) >= 0, axis=1)
        if not np.any(defined):
            break
        rows = np.stack([task, *window], axis=1)[defined]
        codes = np.unique(rows, axis=0, return_inverse=True)[1].reshape(-1)
        size = np.bincount(codes)[codes]
        a = group_relative(
            np.asarray(returns, dtype=np.float64)[defined], codes, mode=mode, eps=eps, ddof=ddof
        )
        w = float(k + 2) ** alpha
        take = (size >= 2) & ((a != 0) if drop_zero_items else True)
        idx = np.flatnonzero(defined)[take]
        num[idx] += w * a[take]
        den[idx] += w
    return np.where(den > 0, num / np.maximum(den, 1e-300), 0.0)


# ----------------------------------------------------------------- estimators


def _step_rewards(rollout: Rollout, eta: float) -> list[float]:
    """Per-turn rewards ``r_{i,u}``: ``turn.reward - eta * invalid``; any part of ``rollout.reward`` not
    carried by the turns is added to the last turn (so terminal-only rollouts get ``gamma^(T-1-t) R``)."""
    turns = rollout.turns
    rewards = [float(t.reward) - eta * bool(t.invalid) for t in turns]
    if turns:
        rewards[-1] += float(rollout.reward) - sum(float(t.reward) for t in turns)
    return rewards


def _step_arrays(groups: Sequence[Group], gamma: float, eta: float, obs_key: str):
    steps = step_batch_from_groups(groups, observation=observation_mode(obs_key))
    rollouts = [r for g in groups for r in g.rollouts]
    rewards = np.array([x for r in rollouts for x in _step_rewards(r, eta)], dtype=np.float64)
    returns = discounted_returns(steps.trajectory_ids, steps.steps, rewards, gamma)
    return steps, returns


@dataclass(frozen=True)
class GiGPOParams:
    """The parameters of ``gigpo`` (``algo.estimator_params``; module docstring)."""

    mode: str = "mean_norm"
    """Normalizer ``F`` of both terms: ``mean_norm`` (``F = 1``, the published default) or
    ``mean_std_norm`` (``F = std + eps``, sample std); :data:`MODES`."""
    omega: float = 1.0
    """Weight of the anchor-state step term ``A^S`` (0: the episode term alone)."""
    gamma: float = 0.95
    """Discount of the step returns ``R_{i,t} = sum_{u >= t} gamma^(u-t) r_{i,u}``."""
    eps: float = 1e-6
    """Added to the std in ``F`` (``mode="mean_std_norm"``)."""
    eta: float = 0.0
    """Invalid-action penalty subtracted from that step's reward (and, with ``episode="steps"``, from
    its episode score ``e_{i,t} = R_i - eta 1[invalid_{i,t}]``)."""
    obs_key: str = ObsKey.TEXT.value
    """What anchor states are matched on: ``text`` (the observation text the turn was decided on, the
    paper's setting), ``state`` (the environment's ``Turn.obs_key``, perfect anchors) or ``turn``
    (:func:`~horizonrl.credit.ccpo_features.observation_mode`)."""
    episode: str = "trajectory"
    """Episode term: ``trajectory`` (one value per rollout, docs/spec/baselines.md) or ``steps`` (every step
    row, verl-agent's reading; module docstring)."""


@register_estimator("gigpo", loss_agg_mode="token-mean", params=GiGPOParams)
def gigpo(groups: Sequence[Group], **params: Any) -> TokenAdvantages:
    """GiGPO: episode advantage + omega x anchor-state step advantage on each step's tokens
    (docs/spec/baselines.md "GiGPO").

    Anchor states are the observations each turn was decided on, matched on their
    text (``obs_key="text"``, the paper's setting) or the environment's state key
    (``"state"``: perfect anchors); ``eta`` subtracts an invalid-action penalty from
    that step's reward (and, with ``episode="steps"``, from its episode score).
    ``params``: :class:`GiGPOParams`.
    """
    p = GiGPOParams(**params)
    steps, returns = _step_arrays(groups, p.gamma, p.eta, p.obs_key)
    adv = gigpo_advantage(
        steps.task_ids, steps.trajectory_ids, steps.observations, returns, steps.rewards,
        mode=p.mode, omega=p.omega, eps=p.eps, episode=p.episode,
        penalties=p.eta * np.asarray(steps.invalid, dtype=np.float64),
    )  # fmt: skip
    return broadcast_steps(groups, adv)


@dataclass(frozen=True)
class GRPOStepsParams:
    """The parameters of ``grpo_steps`` (``algo.estimator_params``)."""

    eta: float = 0.0
    """Invalid-action penalty: a step row scores ``e_{i,t} = R_i - eta 1[invalid_{i,t}]``."""
    eps: float = 1e-6
    """Added to the std of the task's step rows."""
    obs_key: str = ObsKey.TEXT.value
    """How the step rows' observations are read (as :attr:`GiGPOParams.obs_key`; the episode term does
    not match on them)."""


@register_estimator("grpo_steps", loss_agg_mode="token-mean", params=GRPOStepsParams)
def grpo_steps(groups: Sequence[Group], **params: Any) -> TokenAdvantages:
    """verl-agent's GRPO for step-wise agents: ``(e_{i,t} - mean) / (std + eps)`` over the task's step rows.

    ``e_{i,t} = R_i - eta * 1[invalid_{i,t}]`` (the episode term of :func:`gigpo` with
    ``episode="steps"``, ``mode="mean_std_norm"``, ``omega = 0``); every step's tokens get
    its row's value. The baseline the CCPO paper compares against. ``params``: :class:`GRPOStepsParams`.
    """
    p = GRPOStepsParams(**params)
    return gigpo(
        groups, mode="mean_std_norm", omega=0.0, eps=p.eps, eta=p.eta, obs_key=p.obs_key, episode="steps"
    )


@dataclass(frozen=True)
class HGPOParams:
    """The parameters of ``hgpo`` (``algo.estimator_params``; a reconstruction, module docstring)."""

    history: int = 2
    """Deepest history level ``K``: level ``k`` groups steps whose last ``k + 1`` observations match."""
    mode: str = "mean_std_norm"
    """Normalizer ``F`` within a level group: ``mean_std_norm`` (``std + eps``) or ``mean_norm`` (1)."""
    alpha: float = 1.0
    """Level weight exponent: ``w_k = L_k^alpha``, ``L_k = k + 2``."""
    gamma: float = 0.95
    """Discount of the step returns."""
    eps: float = 1e-6
    """Added to the std in ``F``."""
    eta: float = 0.0
    """Invalid-action penalty subtracted from that step's reward."""
    base_group: bool = False
    """Add the episode advantage ``A^E_i`` as an item with ``L = 1``."""
    obs_key: str = ObsKey.TEXT.value
    """What the levels match on (as :attr:`GiGPOParams.obs_key`)."""
    ddof: int = 0
    """Delta degrees of freedom of the std (0: the released recipe's population std)."""
    drop_zero_items: bool = True
    """Drop items whose advantage is exactly 0 before weighting (the released recipe)."""


@register_estimator("hgpo", loss_agg_mode="token-mean", params=HGPOParams)
def hgpo(groups: Sequence[Group], **params: Any) -> TokenAdvantages:
    """HGPO: step advantages from history-matched hierarchical groups, adaptively weighted (reconstructed).

    ``params``: :class:`HGPOParams`.
    """
    p = HGPOParams(**params)
    steps, returns = _step_arrays(groups, p.gamma, p.eta, p.obs_key)
    adv = hgpo_advantage(
        steps.task_ids, steps.trajectory_ids, steps.steps, steps.observations, returns,
        history=p.history, mode=p.mode, alpha=p.alpha, eps=p.eps, outcomes=steps.rewards,
        base_group=p.base_group, ddof=p.ddof, drop_zero_items=p.drop_zero_items,
    )  # fmt: skip
    return broadcast_steps(groups, adv)
