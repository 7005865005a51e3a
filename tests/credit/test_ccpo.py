"""CCPO contextual credit (docs/spec/ccpo.md): hand-worked values, spec properties, loop reference."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

from horizonrl.credit import get_estimator
from horizonrl.credit.ccpo import (
    contextual_credit,
    contextual_credit_from_features,
    peer_diagnostics,
    peer_readout,
)
from horizonrl.credit.ccpo_features import (
    StepBatch,
    context_features,
    factorize,
    prompt_observations,
    step_batch_from_groups,
    thermometer,
    top_principal_directions,
    trajectory_summary,
)
from horizonrl.trajectory import Group, Rollout, Segment, Turn

_spec = importlib.util.spec_from_file_location(
    "ccpo_credit_bench", Path(__file__).resolve().parents[2] / "benchmarks" / "ccpo_credit.py"
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

FIELDS = ("advantage", "historical", "future", "supported", "fallback", "episode")


def batch(rows) -> StepBatch:
    """rows: (task, traj, step, length, obs, R, invalid)."""
    cols = list(zip(*rows, strict=True))
    names = ("task_ids", "trajectory_ids", "steps", "lengths", "observations", "rewards", "invalid")
    return StepBatch(**dict(zip(names, cols, strict=True)))


def readout(sb: StepBatch, phi, targets, **kw):
    task = factorize(sb.task_ids)
    traj = factorize(list(zip(task.tolist(), sb.trajectory_ids.tolist(), strict=True)))
    return peer_readout(np.asarray(phi, float), task, traj, factorize(sb.observations), targets, **kw)


# ----------------------------------------------------------------- feature map


def test_thermometer_codes():
    counts = thermometer(np.array([0, 5, 29, 30, 31, -1]), 30).sum(axis=1)
    assert counts.tolist() == [0, 2, 11, 12, 12, 0]  # floor(12 * clip(v/30, 0, 1))
    assert thermometer(np.array([1.0, 2.0]), np.array([3.0, 3.0])).sum(axis=1).tolist() == [
        4,
        8,
    ]  # no 1/3 loss
    code = thermometer(np.array([10.0]), 30)[0]
    assert code.tolist() == [1.0] * 4 + [0.0] * 8  # the first coordinates are the ones


def test_trajectory_summary_by_hand_and_row_order():
    rows = [("x", "i", t, 4, o, 0.0, False) for t, o in enumerate("abac")]
    rows.append(("x", "j", 0, 1, "a", 0.0, False))
    c = trajectory_summary(batch(rows))
    assert c.shape == (5, 37)
    blocks = c[:, :12].sum(1), c[:, 12:24].sum(1), c[:, 24:36].sum(1), c[:, 36]
    assert blocks[0].tolist() == [0, 0, 0, 1, 0]  # floor(12 t / 30)
    assert blocks[1].tolist() == [0, 0, 0, 1, 0]  # n = 1,2,2,3 -> floor(12 n / 25)
    assert blocks[2].tolist() == [12, 12, 8, 9, 12]  # floor(12 n / (t + 1))
    assert blocks[3].tolist() == [0, 0, 1, 0, 0]  # revisit of "a" at t = 2 only
    perm = [4, 2, 0, 3, 1]
    np.testing.assert_array_equal(trajectory_summary(batch([rows[k] for k in perm])), c[perm])


def _rows(n):
    return [("x", k, 0, 1, "o", 0.0, False) for k in range(n)]


def test_feature_small_batch_rules():
    rng = np.random.default_rng(0)
    d = 6
    # One unique step: the raw state (no centering).
    h1 = rng.standard_normal((1, d))
    phi = context_features(batch(_rows(1)), h1)
    np.testing.assert_allclose(phi[0, :d] * math.sqrt(2), h1[0] / np.linalg.norm(h1[0]))
    # Two or three: centered, no principal-direction removal.
    for n in (2, 3):
        h = rng.standard_normal((n, d))
        phi = context_features(batch(_rows(n)), h)
        hc = h - h.mean(0)
        np.testing.assert_allclose(phi[:, :d] * math.sqrt(2), hc / np.linalg.norm(hc, axis=1, keepdims=True))
    # Four or more: the 3 leading principal directions are removed.
    h = rng.standard_normal((7, d)) * np.array([9, 5, 3, 1, 0.5, 0.2])
    phi = context_features(batch(_rows(7)), h)
    hc = h - h.mean(0)
    v = np.linalg.svd(hc)[2][:3].T
    proj = hc - hc @ v @ v.T
    np.testing.assert_allclose(phi[:, :d] @ v, 0.0, atol=1e-12)
    np.testing.assert_allclose(phi[:, :d] * math.sqrt(2), proj / np.linalg.norm(proj, axis=1, keepdims=True))
    # Equal block weights; summary weight 0 drops the summary block.
    np.testing.assert_allclose(np.linalg.norm(phi[:, d:], axis=1), 1 / math.sqrt(2))
    phi0 = context_features(batch(_rows(7)), h, summary_weight=0.0)
    assert np.all(phi0[:, d:] == 0) and np.allclose(np.linalg.norm(phi0, axis=1), 1.0)


@pytest.mark.parametrize("anisotropic", [True, False])
def test_top_principal_directions_iterative_path_matches_svd(anisotropic):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((400, 300))  # min(n, d) > 256: subspace iteration (flat spectrum: exact fallback)
    if anisotropic:
        x += (rng.standard_normal((400, 4)) * [30, 20, 10, 4]) @ rng.standard_normal((4, 300))
    x -= x.mean(0)
    v = top_principal_directions(x, 3)
    ref = np.linalg.svd(x, full_matrices=False)[2][:3].T
    np.testing.assert_allclose(v @ v.T, ref @ ref.T, atol=1e-9)


# ----------------------------------------------------------------- hand-worked batch

E1, E2, E3 = np.eye(3)
C0 = (E1 + E2) / math.sqrt(2)
HAND = [  # (task, traj, t, T, obs, R, invalid), feature
    (("A", "a", 0, 2, "s0", 10.0, False), E1),
    (("A", "a", 1, 2, "s1", 10.0, False), E3),
    (("A", "b", 0, 2, "s0", 0.0, False), E1),
    (("A", "b", 1, 2, "s2", 0.0, True), E3),
    (("A", "c", 0, 1, "s0", 10.0, False), C0),
    (("B", "d", 0, 1, "s0", 10.0, False), E1),
]


def test_hand_worked_peers_bandwidth_and_credits():
    sb = batch([r for r, _ in HAND])
    phi = np.array([f for _, f in HAND])
    g = 0.95
    e = math.exp(-1 / 0.15)  # every non-zero distance equals its bucket's median
    y = np.array([g * 10, 10, 0, -0.1, 10, 10])  # gamma^(T-1-t) R - 0.1 [invalid]
    z = np.array([g * g * 10, g * 10, 0, 0, g * 10, g * 10])  # gamma^(T-t) R
    ro = readout(sb, phi, np.stack([y, z], 1))
    assert ro.supported.tolist() == [True] * 5 + [False]  # task B has one trajectory
    assert ro.fallback.tolist() == [False, True, False, True, False, False]  # s1, s2: only own trajectory
    delta = math.sqrt(2 - math.sqrt(2))  # |e1 - c0|: median of the s0 bucket {0, delta, delta}
    np.testing.assert_allclose(ro.bandwidth[[0, 2, 4]], 0.15 * delta)
    np.testing.assert_allclose(ro.bandwidth[[1, 3]], 0.15 * math.sqrt(2))  # task bucket: 0,0,d,d + six sqrt2
    b_y = [
        10 * e / (1 + e),  # a0: peers b0 (w 1), c0 (w e)
        (-0.1 + 10 * e) / (1 + 2 * e),  # a1 fallback: b0 (e), b1 (1), c0 (e); traj b mass 1+e
        (9.5 + 10 * e) / (1 + e),  # b0: a0 (1), c0 (e)
        (9.5 * e + 10 + 10 * e) / (1 + 2 * e),  # b1 fallback: a0 (e), a1 (1), c0 (e)
        4.75,  # c0: a0 (e), b0 (e)
    ]
    b_z = [9.5 * e / (1 + e), 9.5 * e / (1 + 2 * e), (9.025 + 9.5 * e) / (1 + e)]
    b_z += [(9.025 * e + 9.5 + 9.5 * e) / (1 + 2 * e), 9.025 / 2]
    np.testing.assert_allclose(ro.values[:5, 0], b_y, rtol=1e-12)
    np.testing.assert_allclose(ro.values[:5, 1], b_z, rtol=1e-12)
    # Credits: historical Y - B[Y]; future dV to t+ = min(t + 2, T) (all terminal here: V = R).
    c_h = y[:5] - b_y
    dv = np.array([10, 10, 0, 0, 10]) - np.array(b_z)
    c_f = (dv - dv.mean()) / (dv.std(ddof=1) + 1e-6)
    s = c_h + c_f
    sigma = s.std(ddof=1) + 1e-6
    out = contextual_credit_from_features(sb, phi)
    np.testing.assert_allclose(out.historical[:5], (c_h - c_h.mean()) / sigma, rtol=1e-10)
    np.testing.assert_allclose(out.future[:5], (c_f - c_f.mean()) / sigma, rtol=1e-10)
    np.testing.assert_allclose(out.advantage, out.historical + out.future)
    assert out.advantage[5] == out.historical[5] == out.future[5] == 0.0
    ep = np.array([10, 10, 0, -0.1, 10])  # episode channel: R - 0.1 [invalid] over all task rows
    np.testing.assert_allclose(out.episode[:5], (ep - ep.mean()) / (ep.std(ddof=1) + 1e-6), rtol=1e-12)
    assert out.episode[5] == 0.0  # one row in task B
    raw = contextual_credit_from_features(sb, phi, final_standardize=False)
    np.testing.assert_allclose(raw.historical[:5], c_h, rtol=1e-10)
    np.testing.assert_allclose(raw.future[:5], c_f, rtol=1e-10)


def test_repeated_visits_aggregate_per_trajectory_by_kernel_mass():
    # Query q (traj "q"); traj "p" visits "s" twice, traj "r" once. Uniform weights and an exp kernel.
    rows = [("x", "q", 0, 1, "s", 0.0, False), ("x", "p", 0, 2, "s", 0.0, False)]
    rows += [("x", "p", 1, 2, "s", 0.0, False), ("x", "r", 0, 1, "s", 0.0, False)]
    sb = batch(rows)
    phi = np.array([E1, E1, E2, C0])
    r = np.array([0.0, 1.0, 2.0, 4.0])
    uni = readout(sb, phi, r, kernel="uniform")
    assert uni.values[0, 0] == pytest.approx((1 + 2 + 4) / 3)  # mass-weighted trajectory means = peer mean
    # One bucket; pair distances 0 (q,p0), sqrt2 (q,p1), d (q,r), sqrt2 (p0,p1), d (p0,r), d (p1,r): median d.
    d = math.sqrt(2 - math.sqrt(2))
    w_p0, w_p1, w_r = 1.0, math.exp(-math.sqrt(2) / (0.15 * d)), math.exp(-1 / 0.15)
    mass_p, mean_p = w_p0 + w_p1, (w_p0 * 1 + w_p1 * 2) / (w_p0 + w_p1)
    expected = (mass_p * mean_p + w_r * 4) / (mass_p + w_r)
    assert readout(sb, phi, r).values[0, 0] == pytest.approx(expected, rel=1e-12)
    # All-zero weights (cosine of opposite contexts) keep support and read out zero.
    cos = readout(batch(rows[:2]), np.array([E1, -E1]), r[:2], kernel="cosine")
    assert cos.supported.tolist() == [True, True] and np.all(cos.values == 0.0)


def test_own_trajectory_is_excluded_from_peers():
    rows = [("x", "a", 0, 3, "s", 10.0, False), ("x", "a", 1, 3, "u", 10.0, False)]
    rows += [("x", "a", 2, 3, "s", 10.0, False), ("x", "b", 0, 1, "s", 0.0, False)]
    sb = batch(rows)
    phi = np.array([E1, E2, E1, E3])
    y = np.array([0.95**2 * 10, 9.5, 10, 0])
    ro = readout(sb, phi, y)
    assert ro.values[2, 0] == 0.0 and ro.values[0, 0] == 0.0  # only (b, 0) is a peer of the revisits
    assert not ro.fallback[2]
    selfish = readout(sb, phi, y, exclude_self=False)  # (a,0), (a,2) and (b,0), self included
    assert selfish.values[2, 0] > 0 and not selfish.fallback.any()


def test_step_whose_only_match_is_itself_uses_task_fallback():
    rows = [("x", "a", 0, 2, "s", 10.0, False), ("x", "a", 1, 2, "only-a", 10.0, False)]
    rows += [("x", "b", 0, 2, "s", 0.0, False), ("x", "b", 1, 2, "t", 0.0, False)]
    ro = readout(batch(rows), np.array([E1, E2, E1, E2]), np.array([9.5, 10, 0, 0]), kernel="uniform")
    assert ro.fallback.tolist() == [False, True, False, True]
    assert ro.values[1, 0] == 0.0  # mean over b's steps, never a's own steps


def test_single_trajectory_task_is_unsupported_with_zero_credit():
    rows = [("x", "a", t, 3, f"s{t}", 10.0, t == 1) for t in range(3)]
    rows += [("y", k, 0, 1, "s", float(k), False) for k in range(3)]
    rng = np.random.default_rng(1)
    out = contextual_credit(batch(rows), rng.standard_normal((6, 5)))
    assert out.supported.tolist() == [False] * 3 + [True] * 3
    for name in ("advantage", "historical", "future"):
        assert np.all(getattr(out, name)[:3] == 0.0)
    assert out.episode[1] < 0 < out.episode[0]  # the episode channel still sees the invalid action


def test_equal_distances_give_plain_mean_of_peer_trajectory_means():
    rows = [("x", j, 0, 1, "s", float(j), False) for j in range(5)]
    sb = batch(rows)
    phi = np.tile(E1, (5, 1))  # all distances 0 -> m_B = 0 -> m~ = 1, every weight 1
    r = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    ro = readout(sb, phi, r)
    for q in range(5):
        assert ro.values[q, 0] == pytest.approx(np.delete(r, q).mean(), rel=1e-14)


# ----------------------------------------------------------------- invariances and reference


def _random(seed, dim=5):
    return bench.make_batch(3, 4, 7, dim, seed=seed, variable_length=True)


def test_permutation_of_rows_changes_nothing():
    sb, h = _random(0, dim=6)
    perm = np.random.default_rng(0).permutation(len(sb))
    for kw in ({}, {"episode_weight": 1.0, "kernel": "cosine"}):
        a = contextual_credit(sb, h, **kw)
        b = contextual_credit(sb.take(perm), h[perm], **kw)
        for name in FIELDS:
            np.testing.assert_array_equal(getattr(b, name), getattr(a, name)[perm], err_msg=name)


def test_duplicated_rows_are_not_extra_peers():
    sb, h = _random(1)
    dup = np.r_[np.arange(len(sb)), [0, 0, 5, 11]]
    for kw in ({"final_standardize": False}, {}):
        base = contextual_credit(sb, h, **kw)
        out = contextual_credit(sb.take(dup), h[dup], **kw)
        np.testing.assert_array_equal(out.supported, base.supported[dup])
        for name in FIELDS:
            np.testing.assert_array_equal(getattr(out, name)[len(sb) :], getattr(out, name)[[0, 0, 5, 11]])
            if kw and name != "episode":  # the episode channel counts restored rows; the rest is unchanged
                np.testing.assert_array_equal(getattr(out, name)[: len(sb)], getattr(base, name))
    bad = h[dup].copy()
    bad[-1] += 1.0
    with pytest.raises(ValueError, match="hidden"):
        contextual_credit(sb.take(dup), bad)
    rows = [("x", "a", 0, 1, "s", 1.0, False), ("x", "a", 0, 1, "s", 0.0, False)]
    with pytest.raises(ValueError, match="rewards"):
        contextual_credit(batch(rows), np.zeros((2, 3)))


ABLATIONS = [
    {},
    {"kernel": "uniform"},
    {"kernel": "cosine", "episode_weight": 1.0},
    {"exclude_self": False},
    {"summary_weight": 0.0, "horizon": 1},
    {"history_weight": 0.0},
    {"future_weight": 0.0, "final_standardize": False},
    {"horizon": 3, "kernel_scale": 0.4, "eta": 0.5, "gamma": 0.9},
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kw", ABLATIONS)
def test_vectorized_matches_per_step_loop_reference(seed, kw):
    sb, h = bench.make_batch(3, 4, 8, [6, 60, 9][seed], seed=seed, variable_length=True)
    dup = np.r_[np.arange(len(sb)), [1, 2, 2]]
    sb, h = sb.take(dup), h[dup]
    fast = contextual_credit(sb, h, **kw)
    ref = bench.reference_contextual_credit(sb, h, **kw)
    for name in FIELDS:
        np.testing.assert_allclose(
            getattr(fast, name), getattr(ref, name), rtol=1e-9, atol=1e-9, err_msg=name
        )


# ----------------------------------------------------------------- estimator


def _turn(n, obs_key, invalid=False, prompt=(1, 2)):
    return Turn(list(prompt), list(range(n)), [-0.1] * n, obs_key=obs_key, invalid=invalid)


def _groups():
    def ro(uid, reward, keys, gid):
        turns = [_turn(2 + k, key, invalid=k == 1) for k, key in enumerate(keys)]
        segs = [Segment(turns=turns[:2]), Segment(kind="compaction", turns=turns[2:])]
        return Rollout(uid=uid, task_id=gid, group_id=gid, segments=segs, reward=reward)

    g1 = Group("g1", "t1", [ro("a", 1.0, ["A", "B", "C"], "g1"), ro("b", 0.0, ["A", "C", "C"], "g1")])
    g2 = Group("g2", "t2", [ro("c", 1.0, ["A", "B", "D"], "g2"), ro("d", 1.0, ["B", "B", "B"], "g2")])
    return [g1, g2]


def test_step_batch_from_groups_uses_prompt_side_observations():
    groups = _groups()
    sb = step_batch_from_groups(groups)
    assert sb.task_ids.tolist() == [0] * 6 + [1] * 6
    assert sb.trajectory_ids.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert sb.steps.tolist() == [0, 1, 2] * 4 and sb.lengths.tolist() == [3] * 12
    assert sb.invalid.tolist() == [False, True, False] * 4
    first = sb.observations[0]
    assert first.startswith("prompt:") and all(sb.observations[k] == first for k in (0, 3, 6, 9))
    assert sb.observations[[1, 2, 4, 5]].tolist() == ["A", "B", "A", "C"]  # the previous turn's obs_key
    assert prompt_observations(groups[0].rollouts[0], mode="turn") == ["A", "B", "C"]


def test_ccpo_estimator_broadcasts_step_advantages():
    groups = _groups()
    est = get_estimator("ccpo")
    h = np.random.default_rng(3).standard_normal((12, 8))
    out = est(groups, hidden=h, episode_weight=1.0, obs_key="state")
    adv = contextual_credit(step_batch_from_groups(groups), h, episode_weight=1.0).advantage
    flat = [arr for r in out for seg in r for arr in seg]
    assert [len(a) for a in flat] == [2, 3, 4] * 4
    for k, arr in enumerate(flat):
        assert np.all(arr == adv[k])
    with pytest.raises(ValueError, match="hidden"):
        est(groups)
    with pytest.raises(ValueError, match="hidden"):
        est(groups, hidden=h[:5])


# ----------------------------------------------------------------- released-recipe options


def test_kappa_shrinks_exact_readouts_toward_the_other_trajectories_task_mean():
    """b = (J B + kappa b_task) / (J + kappa); J counts trajectories, not visits; fallback not shrunk."""
    rows = [
        ("x", "i", 0, 2, "a", 0.0, False),
        ("x", "i", 1, 2, "b", 0.0, False),
        ("x", "j", 0, 3, "a", 0.0, False),
        ("x", "j", 1, 3, "c", 0.0, False),
        ("x", "j", 2, 3, "a", 0.0, False),  # a revisit: j still counts once in J
        ("x", "k", 0, 1, "a", 0.0, False),
    ]
    target = np.array([1.0, 2.0, 3.0, 5.0, 4.0, 9.0])
    phi = np.random.default_rng(0).normal(size=(6, 3))
    sb = batch(rows)
    plain = readout(sb, phi, target, kernel="uniform").values[:, 0]
    shrunk = readout(sb, phi, target, kernel="uniform", kappa=2.0).values[:, 0]
    # Query (i, a): peers j0, j2 (trajectory j: mass 2, mean 3.5) and k0 (mass 1, 9): B = 16/3, J = 2;
    # b_task(i) = mean(3, 5, 4, 9) = 5.25.
    assert plain[0] == pytest.approx(16 / 3)
    assert shrunk[0] == pytest.approx((2 * 16 / 3 + 2 * 5.25) / 4)
    # Query (i, b): no exact peer -> task fallback over j0, j1, j2, k0: (3 * 4 + 9) / 4, not shrunk.
    assert plain[1] == shrunk[1] == pytest.approx((3 * 4 + 9) / 4)
    # Query (k, a): peers i0 (mass 1, 1) and j0, j2 (mass 2, mean 3.5): B = 8/3, J = 2;
    # b_task(k) = mean(1, 2, 3, 5, 4) = 3.
    assert plain[5] == pytest.approx(8 / 3)
    assert shrunk[5] == pytest.approx((2 * 8 / 3 + 2 * 3.0) / 4)
    # Query (j, c): fallback again (nobody else saw c).
    assert shrunk[3] == plain[3]
    with pytest.raises(ValueError, match="kappa"):
        readout(sb, phi, target, kappa=-1.0)


def test_peer_diagnostics_by_hand():
    """J per step, the thin share and the gap B[Y] - b_task[Y] of the paper readout (uniform kernel)."""
    rows = [
        ("x", "i", 0, 2, "a", 1.0, False),
        ("x", "i", 1, 2, "b", 1.0, False),
        ("x", "j", 0, 3, "a", 0.0, False),
        ("x", "j", 1, 3, "c", 0.0, False),
        ("x", "j", 2, 3, "a", 0.0, False),
        ("x", "k", 0, 1, "a", 1.0, False),
        *[("y", name, 0, 1, "a", float(name == "p"), False) for name in "pqrs"],
    ]
    hidden = np.random.default_rng(2).normal(size=(len(rows), 4))
    d = peer_diagnostics(batch(rows), hidden, gamma=1.0, eta=0.0, kernel="uniform", kappa=2.0)
    # Task x, gamma = 1: Y = R. i0 (a): peers j (mass 2, mean 0) and k (1): B = 1/3; b_task = mean(0,0,0,1)
    # = 1/4 -> gap 1/12. j0, j2: peers i0, k0: B = 1 = b_task(j) = mean(1, 1, 1) -> 0. k0: B = 1/3,
    # b_task = mean(1, 1, 0, 0, 0) = 2/5 -> -1/15. i1, j1: no exact peer (J = 0). All four have J = 2.
    # Task y: one-step trajectories, J = 3, B = b_task -> gap 0.
    sq = (1 / 12) ** 2 + (1 / 15) ** 2
    assert d["peer_trajs_mean"] == pytest.approx((4 * 2 + 4 * 3) / 8)
    assert d["thin_peer_rate"] == pytest.approx(4 / 10)
    assert d["baseline_gap_rms"] == pytest.approx(math.sqrt(sq / 8))
    assert d["baseline_gap_rms_thin"] == pytest.approx(math.sqrt(sq / 4))
    assert d["baseline_gap_rms_kappa"] == pytest.approx(0.5 * math.sqrt(sq / 8))  # J / (J + 2) = 1/2
    assert peer_diagnostics(batch(rows[1:2]), hidden[1:2]) == {  # one step, no peer
        "peer_trajs_mean": 0.0,
        "thin_peer_rate": 0.0,
        "baseline_gap_rms": 0.0,
        "baseline_gap_rms_thin": 0.0,
        "baseline_gap_rms_kappa": 0.0,
    }
    with pytest.raises(ValueError, match="kappa"):
        peer_diagnostics(batch(rows), hidden, kappa=-1.0)


def test_kappa_reaches_the_historical_credit():
    """gamma = 1, no invalid actions: Y = R; C^H = Y - b[Y] with the shrunk baseline (by hand)."""
    rows = [
        ("x", "i", 0, 1, "a", 1.0, False),
        ("x", "j", 0, 1, "a", 0.0, False),
        ("x", "k", 0, 2, "a", 1.0, False),
        ("x", "k", 1, 2, "b", 1.0, False),
    ]
    phi = np.random.default_rng(1).normal(size=(4, 3))
    kw = dict(gamma=1.0, kernel="uniform", final_standardize=False, future_weight=0.0)
    out = contextual_credit_from_features(batch(rows), phi, kappa=2.0, **kw)
    # i: B = (0 + 1) / 2, b_task = mean(0, 1, 1) = 2/3 -> b = 7/12. j: B = 1, b_task = 1.
    # k0: B = 0.5, b_task = mean(1, 0) = 0.5. k1: fallback B = 0.5, unshrunk.
    np.testing.assert_allclose(out.historical, [1 - 7 / 12, -1.0, 0.5, 0.5])
    paper = contextual_credit_from_features(batch(rows), phi, **kw)
    np.testing.assert_allclose(paper.historical, [0.5, -1.0, 0.5, 0.5])


def test_episode_channel_center_keeps_reward_units():
    """e = R - eta 1[invalid]; center: e - mean over the task's rows; zscore divides by (s + 1e-6)."""
    rows = [
        ("x", "i", 0, 2, "a", 1.0, False),
        ("x", "i", 1, 2, "b", 1.0, True),
        ("x", "j", 0, 1, "a", 0.0, False),
        ("y", "k", 0, 1, "a", 1.0, False),  # a one-row task: no episode credit
    ]
    phi = np.random.default_rng(2).normal(size=(4, 3))
    e = np.array([1.0, 0.9, 0.0])
    center = contextual_credit_from_features(batch(rows), phi, episode_adv_norm="center", episode_weight=1.0)
    np.testing.assert_allclose(center.episode, [*(e - e.mean()), 0.0])
    z = contextual_credit_from_features(batch(rows), phi)
    np.testing.assert_allclose(z.episode, [*((e - e.mean()) / (e.std(ddof=1) + 1e-6)), 0.0])
    np.testing.assert_allclose(center.advantage, center.historical + center.future + center.episode)
    with pytest.raises(ValueError, match="episode_adv_norm"):
        contextual_credit_from_features(batch(rows), phi, episode_adv_norm="scale")


def test_ccpo_estimator_takes_the_released_recipe_options():
    groups = _groups()
    h = np.random.default_rng(3).standard_normal((12, 8))
    opts = dict(kappa=2.0, episode_adv_norm="center", episode_weight=1.0)
    out = get_estimator("ccpo")(groups, hidden=h, obs_key="state", **opts)
    adv = contextual_credit(step_batch_from_groups(groups), h, **opts).advantage
    assert not np.allclose(
        adv, contextual_credit(step_batch_from_groups(groups), h, episode_weight=1.0).advantage
    )
    flat = [arr for r in out for seg in r for arr in seg]
    for k, arr in enumerate(flat):
        assert np.all(arr == adv[k])
