"""GiGPO and HGPO step-level advantages (docs/spec/baselines.md "GiGPO"; HGPO reconstruction) by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from horizonrl.credit import get_estimator
from horizonrl.credit.gigpo import (
    discounted_returns,
    gigpo_advantage,
    group_relative,
    hgpo_advantage,
)
from horizonrl.trajectory import Group, Rollout, Segment, Turn


def _turn(n, obs_key, reward=0.0, invalid=False):
    return Turn([7, 8], list(range(n)), [-0.2] * n, obs_key=obs_key, reward=reward, invalid=invalid)


def _group():
    # Post-action keys; the prompt-side observations are [initial, "B"] and [initial, "C"].
    r0 = Rollout("r0", "t", "g", [Segment(turns=[_turn(2, "B"), _turn(3, "end")])], reward=1.0)
    r1 = Rollout("r1", "t", "g", [Segment(turns=[_turn(1, "C"), _turn(2, "end")])], reward=0.0)
    return Group("g", "t", [r0, r1])


def test_gigpo_hand_worked_mean_norm():
    # Returns (terminal reward only): r0 = [0.95, 1], r1 = [0, 0]. Episode term R - mean R = +-0.5.
    # Anchor group "initial" = {0.95, 0}: step term +-0.475; "B" and "C" are singletons: 0.
    adv = gigpo_advantage(["x"] * 4, [0, 0, 1, 1], ["P", "B", "P", "C"], [0.95, 1, 0, 0], [1, 1, 0, 0])
    np.testing.assert_allclose(adv, [0.975, 0.5, -0.975, -0.5])
    out = get_estimator("gigpo")([_group()], obs_key="state")
    assert [a.tolist() for seg in out[0] for a in seg] == [[0.975] * 2, [0.5] * 3]
    assert [a.tolist() for seg in out[1] for a in seg] == [[-0.975], [-0.5] * 2]


def test_gigpo_hand_worked_mean_std_norm_and_omega():
    ep = 0.5 / (math.sqrt(0.5) + 1e-6)  # std([1, 0]) = 1/sqrt2
    st = 0.475 / (0.95 / math.sqrt(2) + 1e-6)  # std([0.95, 0]) = 0.95/sqrt2
    adv = gigpo_advantage(
        ["x"] * 4, [0, 0, 1, 1], ["P", "B", "P", "C"], [0.95, 1, 0, 0], [1, 1, 0, 0],
        mode="mean_std_norm", omega=2.0,
    )  # fmt: skip
    np.testing.assert_allclose(adv, [ep + 2 * st, ep, -ep - 2 * st, -ep])
    out = get_estimator("gigpo")([_group()], mode="mean_std_norm", omega=2.0, obs_key="state")
    np.testing.assert_allclose(out[0][0][0], ep + 2 * st)


def test_gigpo_groups_are_per_task_and_singletons_are_zero():
    # Same observation text in two tasks never forms an anchor group; one-rollout task: all zero.
    adv = gigpo_advantage(["x", "x", "y"], [0, 1, 0], ["s", "s", "s"], [1.0, 0.0, 5.0], [1.0, 0.0, 5.0])
    np.testing.assert_allclose(adv, [1.0, -1.0, 0.0])
    assert np.all(group_relative([3.0, 3.0, 1.0], [0, 0, 1], mode="mean_std_norm") == 0.0)
    with pytest.raises(ValueError, match="mode"):
        group_relative([1.0], [0], mode="bogus")


def test_discounted_returns_and_step_rewards():
    ret = discounted_returns([0, 0, 0, 1], [0, 1, 2, 0], [1.0, 0.0, 2.0, 3.0], gamma=0.5)
    np.testing.assert_allclose(ret, [1 + 0.25 * 2, 0.5 * 2, 2, 3])
    # Turn rewards are used as is; the part of R not carried by turns lands on the last turn; eta penalizes.
    r0 = Rollout(
        "a", "t", "g", [Segment(turns=[_turn(1, "B", reward=1.0), _turn(1, "D", invalid=True)])], 3.0
    )
    r1 = Rollout("b", "t", "g", [Segment(turns=[_turn(1, "C"), _turn(1, "D")])], reward=0.0)
    out = get_estimator("gigpo")([Group("g", "t", [r0, r1])], gamma=0.5, eta=0.1, obs_key="state")
    # r0 step rewards [1, 2 - 0.1] -> returns [1 + 0.95, 1.9]; r1 -> [0, 0]. Episode +-1.5.
    # Anchor "initial": {1.95, 0} -> +-0.975; "B", "C" singletons.
    np.testing.assert_allclose([out[0][0][0][0], out[0][0][1][0]], [1.5 + 0.975, 1.5])
    np.testing.assert_allclose([out[1][0][0][0], out[1][0][1][0]], [-1.5 - 0.975, -1.5])


HGPO_ROWS = dict(
    task_ids=["x"] * 9,
    trajectory_ids=["a"] * 3 + ["b"] * 3 + ["c"] * 3,
    steps=[0, 1, 2] * 3,
    observations=["s", "u", "v", "s", "u", "v", "s", "w", "v"],
    returns=[1.0, 2.0, 3.0, 0.0, 0.0, 1.0, 5.0, 5.0, 5.0],
)


def test_hgpo_hand_worked_levels_and_weights():
    # Level 0: s {1,0,5} mean 2; u {2,0}; w {5} (singleton); v {3,1,5} mean 3.
    # Level 1: (s,u) {2,0}; (s,w) {5}; (u,v) {3,1}; (w,v) {5}.  Level 2: (s,u,v) {3,1}; (s,w,v) {5}.
    # Weights (k + 2)^1 = 2, 3, 4 over the levels with a group of 2 or more.
    adv = hgpo_advantage(**HGPO_ROWS, mode="mean_norm", drop_zero_items=False)
    expected = [-1, (2 * 1 + 3 * 1) / 5, (2 * 0 + 3 * 1 + 4 * 1) / 9]
    expected += [-2, (2 * -1 + 3 * -1) / 5, (2 * -2 + 3 * -1 + 4 * -1) / 9]
    expected += [3, 0, 2]  # c1 has no group of 2 at any level
    np.testing.assert_allclose(adv, expected)
    flat = hgpo_advantage(
        **HGPO_ROWS, mode="mean_norm", alpha=0.0, drop_zero_items=False
    )  # plain mean over levels
    np.testing.assert_allclose(flat[[2, 5]], [(0 + 1 + 1) / 3, (-2 - 1 - 1) / 3])


def test_hgpo_history_zero_is_the_anchor_step_term_and_base_group():
    obs = HGPO_ROWS["observations"]
    codes = np.unique(obs, return_inverse=True)[1]
    for mode in ("mean_norm", "mean_std_norm"):
        np.testing.assert_allclose(
            hgpo_advantage(**HGPO_ROWS, history=0, mode=mode, ddof=1, drop_zero_items=False),
            group_relative(HGPO_ROWS["returns"], codes, mode=mode),
        )
    outcomes = np.repeat([1.0, 0.0, 1.0], 3)  # episode term (mean_norm): 1/3, -2/3, 1/3
    base = hgpo_advantage(
        **HGPO_ROWS, mode="mean_norm", outcomes=outcomes, base_group=True, drop_zero_items=False
    )
    assert base[7] == pytest.approx(1 / 3)  # only the episode item (weight 1)
    assert base[0] == pytest.approx((1 / 3 + 2 * -1) / 3)
    with pytest.raises(ValueError, match="outcomes"):
        hgpo_advantage(**HGPO_ROWS, base_group=True)


def test_hgpo_row_order_and_estimator():
    perm = np.random.default_rng(0).permutation(9)
    rows = {k: np.asarray(v, dtype=object if k != "returns" else float)[perm] for k, v in HGPO_ROWS.items()}
    rows["steps"] = rows["steps"].astype(int)
    np.testing.assert_allclose(hgpo_advantage(**rows), hgpo_advantage(**HGPO_ROWS)[perm])
    out = get_estimator("hgpo")([_group()], mode="mean_norm", obs_key="state")
    # Level 0 = GiGPO's anchor term (+-0.475 at t = 0); level 1 needs 2 matching steps: none. No episode term.
    assert [a.tolist() for seg in out[0] for a in seg] == [[0.475] * 2, [0.0] * 3]
    assert get_estimator("hgpo").params is not None and "history" in get_estimator("hgpo").params
