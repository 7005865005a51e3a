"""IGPO (docs/spec/baselines.md) and RTPO sibling credit (docs/spec/rtpo.md): values derived by hand."""

from __future__ import annotations

import math
import subprocess
import sys
import warnings

import numpy as np
import pytest

from horizonrl.credit import get_estimator
from horizonrl.credit.igpo import igpo_advantages, igpo_turn_rewards, information_gain
from horizonrl.credit.rtpo import (
    clamped_trajectory_weight,
    log_importance_weight,
    off_policy_q_values,
    sibling_advantage,
    zero_advantage_rate,
)
from horizonrl.trajectory import Group, Rollout, Segment, Turn, build_rows

# ----------------------------------------------------------------- IGPO


def test_information_gain_modes():
    np.testing.assert_allclose(information_gain([-2.0, -1.5], [-1.5, -2.5]), [0.5, -1.0])
    np.testing.assert_allclose(
        information_gain([-2.0], [-1.5], mode="prob"), [math.exp(-1.5) - math.exp(-2.0)], rtol=1e-12
    )
    with pytest.raises(ValueError, match="mode"):
        information_gain([0.0], [0.0], mode="kl")
    with pytest.raises(ValueError, match="scores"):
        information_gain([0.0, 1.0], [0.0])


def test_turn_rewards_final_turn_gets_outcome():
    np.testing.assert_allclose(igpo_turn_rewards([-2.0, -1.5], [-1.5, -1.0], 1.0), [0.5, 0.5, 1.0])
    np.testing.assert_allclose(igpo_turn_rewards([], [], 0.0), [0.0])  # one-turn rollout


# Hand-worked 2-rollout group:
#   A: 3 turns, R = 1, IG = [0.5, 0.5]  -> rewards [0.5, 0.5, 1]
#   B: 2 turns, R = 0, IG = [-0.5]      -> rewards [-0.5, 0]
#   pooled mean 0.3, deviations [0.2, 0.2, 0.7 | -0.8, -0.3], population var 1.3/5 = 0.26
DEN = math.sqrt(0.26 + 1e-8)
ZA = np.array([0.2, 0.2, 0.7]) / DEN
ZB = np.array([-0.8, -0.3]) / DEN
A_EXPECTED = np.array([ZA.sum(), ZA[1:].sum(), ZA[2]])  # gamma = 1: reverse cumulative sums
B_EXPECTED = np.array([ZB.sum(), ZB[1]])


def test_igpo_advantages_by_hand():
    a, b = igpo_advantages([[0.5, 0.5, 1.0], [-0.5, 0.0]])
    np.testing.assert_allclose(a, A_EXPECTED, rtol=1e-12)
    np.testing.assert_allclose(b, B_EXPECTED, rtol=1e-12)
    assert a[0] == pytest.approx(1.1 / 0.5099019)  # 0.2+0.2+0.7 over sqrt(0.26)
    assert a[0] == pytest.approx(-b[0])  # z-scores sum to zero over the group


def test_igpo_discount():
    a, b = igpo_advantages([[0.5, 0.5, 1.0], [-0.5, 0.0]], gamma=0.5)
    np.testing.assert_allclose(
        a, [ZA[0] + 0.5 * ZA[1] + 0.25 * ZA[2], ZA[1] + 0.5 * ZA[2], ZA[2]], rtol=1e-12
    )
    np.testing.assert_allclose(b, [ZB[0] + 0.5 * ZB[1], ZB[1]], rtol=1e-12)


def test_igpo_degenerate_groups():
    # one rollout, one turn: (R - R)/sqrt(0 + 1e-8) = 0
    np.testing.assert_array_equal(igpo_advantages([[1.0]])[0], [0.0])
    out = igpo_advantages([[], [2.0, 2.0]])
    assert out[0].shape == (0,)
    np.testing.assert_array_equal(out[1], [0.0, 0.0])
    assert igpo_advantages([]) == []
    with pytest.raises(ValueError, match="finite"):
        igpo_advantages([[float("nan")]])


def _turn(n: int) -> Turn:
    return Turn(prompt_ids=[1, 2], response_ids=list(range(3, 3 + n)), logprobs=[-0.1] * n)


def _igpo_group() -> Group:
    # rollout A spreads its 3 turns over two segments; scores follow rollout.turns order
    a = Rollout(
        "A", "t", "g", [Segment("normal", [_turn(2), _turn(3)]), Segment("compaction", [_turn(1)])], 1.0
    )
    b = Rollout("B", "t", "g", [Segment("normal", [_turn(4), _turn(2)])], 0.0)
    return Group("g", "t", [a, b])


def test_igpo_estimator_token_layout():
    spec = get_estimator("igpo")
    assert spec.loss_agg_mode == "token-mean"
    assert set(spec.params) == {"scores", "mode", "gamma"}
    group = _igpo_group()
    scores = [[(-2.0, -1.5), (-1.5, -1.0)], [(-2.0, -2.5), None]]  # A: T-1 entries; B: T, final ignored
    adv = spec([group], scores=scores)
    np.testing.assert_allclose(adv[0][0][0], [A_EXPECTED[0]] * 2, rtol=1e-12)
    np.testing.assert_allclose(adv[0][0][1], [A_EXPECTED[1]] * 3, rtol=1e-12)
    np.testing.assert_allclose(adv[0][1][0], [A_EXPECTED[2]], rtol=1e-12)
    np.testing.assert_allclose(adv[1][0][0], [B_EXPECTED[0]] * 4, rtol=1e-12)
    np.testing.assert_allclose(adv[1][0][1], [B_EXPECTED[1]] * 2, rtol=1e-12)
    rows = build_rows(group.rollouts, adv)
    assert sum(r.num_trainable for r in rows) == 12


def test_igpo_estimator_prob_mode_and_groups_independent():
    g1, g2 = _igpo_group(), _igpo_group()
    g2.rollouts[1].reward = 1.0
    scores = [[(-2.0, -1.5), (-1.5, -1.0)], [(-2.0, -2.5)]]
    both = get_estimator("igpo")([g1, g2], scores=scores * 2, mode="prob")
    ig = [math.exp(-1.5) - math.exp(-2.0), math.exp(-1.0) - math.exp(-1.5), math.exp(-2.5) - math.exp(-2.0)]
    exp1 = igpo_advantages([[ig[0], ig[1], 1.0], [ig[2], 0.0]])
    exp2 = igpo_advantages([[ig[0], ig[1], 1.0], [ig[2], 1.0]])
    assert both[0][1][0][0] == pytest.approx(exp1[0][2])
    assert both[1][0][1][0] == pytest.approx(exp1[1][1])
    assert both[3][0][1][0] == pytest.approx(exp2[1][1])


def test_igpo_estimator_input_checks():
    est = get_estimator("igpo")
    with pytest.raises(ValueError, match="entries"):
        est([_igpo_group()], scores=[[(-1.0, -1.0)], [(-1.0, -1.0)]])
    with pytest.raises(ValueError, match="pair"):
        est([_igpo_group()], scores=[[(-1.0, -1.0), None], [(-1.0, -1.0)]])
    with pytest.raises(ValueError, match="rollouts"):
        est([_igpo_group()], scores=[[]])
    with pytest.raises(ValueError, match="mode"):
        est([_igpo_group()], scores=[[(0, 0)] * 2, [(0, 0)]], mode="exp")
    with pytest.raises(TypeError):
        est([_igpo_group()])  # scores are required


# ----------------------------------------------------------------- RTPO


def test_sibling_advantage_by_hand():
    np.testing.assert_allclose(sibling_advantage([1, 0, 0]), [2 / 3, -1 / 3, -1 / 3])
    np.testing.assert_allclose(sibling_advantage([1.0, 0.0]), [0.5, -0.5])  # no std division
    np.testing.assert_allclose(sibling_advantage([3.0, 1.0, 2.0, 6.0]), [0.0, -2.0, -1.0, 3.0])


def test_sibling_advantage_edge_cases():
    np.testing.assert_array_equal(sibling_advantage([1.0]), [0.0])  # G = 2: one sibling, always 0
    np.testing.assert_array_equal(sibling_advantage([0.1, 0.1, 0.1]), [0.0, 0.0, 0.0])  # exact zeros
    assert sibling_advantage([]).shape == (0,)
    with pytest.raises(ValueError, match="finite"):
        sibling_advantage([1.0, float("inf")])
    with pytest.raises(ValueError, match="1-D"):
        sibling_advantage([[1.0, 0.0]])


def test_zero_advantage_rate():
    assert zero_advantage_rate([[1, 1], [0, 1], [0, 0, 0], [1]]) == 0.75
    assert zero_advantage_rate([]) == 0.0


def test_clamped_weight_log_space():
    # log w = (-1.0 + 1.2) + (-0.5 + 0.5) = 0.2
    assert log_importance_weight([-1.0, -0.5], [-1.2, -0.5]) == pytest.approx(0.2)
    assert clamped_trajectory_weight([-1.0, -0.5], [-1.2, -0.5]) == 1.0  # default [0, 1] truncation
    assert clamped_trajectory_weight([-1.0, -0.5], [-1.2, -0.5], rho_max=2.0) == pytest.approx(math.exp(0.2))
    assert clamped_trajectory_weight([-3.0], [-1.0]) == pytest.approx(math.exp(-2.0))
    assert clamped_trajectory_weight([-3.0], [-1.0], rho_min=0.5, rho_max=2.0) == pytest.approx(0.5)
    # one array per downstream turn (ragged) is concatenated
    assert log_importance_weight([[-1.0, -2.0], [-3.0]], [[-1.0, -2.0], [-2.0]]) == pytest.approx(-1.0)
    assert clamped_trajectory_weight([], []) == 1.0  # no downstream tokens: weight 1


def test_clamped_weight_long_horizon_no_overflow():
    n = 100_000
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert clamped_trajectory_weight(np.zeros(n), -np.ones(n), rho_min=0.2, rho_max=5.0) == pytest.approx(
            5.0
        )
        assert clamped_trajectory_weight(-np.ones(n), np.zeros(n), rho_min=0.2, rho_max=5.0) == pytest.approx(
            0.2
        )
        assert clamped_trajectory_weight(-np.ones(n), np.zeros(n)) == 0.0


def test_clamped_weight_checks():
    with pytest.raises(ValueError, match="rho_min"):
        clamped_trajectory_weight([0.0], [0.0], rho_min=2.0, rho_max=1.0)
    with pytest.raises(ValueError, match="rho_max"):
        clamped_trajectory_weight([0.0], [0.0], rho_min=0.0, rho_max=0.0)
    with pytest.raises(ValueError, match="tokens"):
        log_importance_weight([0.0, 0.0], [0.0])


def test_off_policy_q_values_feed_sibling_advantage():
    q = off_policy_q_values([0.0, 0.0, 0.0], [1.0, 0.0, 1.0], [0.5, 1.0, 1.0])
    np.testing.assert_allclose(q, [0.5, 0.0, 1.0])
    np.testing.assert_allclose(sibling_advantage(q), [0.0, -0.5, 0.5])
    q = off_policy_q_values([0.1, 0.0], [1.0, 1.0], [1.0, 0.5], gamma=0.9, steps=[2, 1])
    np.testing.assert_allclose(q, [0.1 + 0.81, 0.45])
    with pytest.raises(ValueError, match="shapes"):
        off_policy_q_values([0.0], [1.0, 1.0], [1.0, 1.0])


def test_new_credit_modules_do_not_import_torch():
    code = (
        "import sys, horizonrl.credit.mosaic, horizonrl.credit.igpo, horizonrl.credit.rtpo; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
