"""Mosaic credit math (docs/spec/mosaic.md): values derived by hand from the spec."""

from __future__ import annotations

import math

import numpy as np
import pytest

from horizonrl.credit import get_estimator
from horizonrl.credit.group import group_advantage
from horizonrl.credit.mosaic import (
    answer_score,
    centered_rank,
    information_gain_metrics,
    marginal_information_gain,
    normalize_session_gains,
    session_aware_advantage,
    shape_session_advantages,
    terminal_session_index,
)
from horizonrl.trajectory import Group, Rollout, Segment, Turn, build_rows

SQ3 = math.sqrt(1 / 3)  # sample std of [1, 1, 0, 0] and of [1, 0, 0]

# ----------------------------------------------------------------- centered rank


def test_centered_rank_average_ranks():
    np.testing.assert_allclose(centered_rank([1, 2, 3]), [-1, 0, 1])
    # ties share the average rank: ranks 1.5, 1.5, 3 -> (2r - 4)/2
    np.testing.assert_allclose(centered_rank([2, 2, 5]), [-0.5, -0.5, 1.0])
    # ranks 1, 2, 3.5, 3.5 -> (2r - 5)/3
    np.testing.assert_allclose(centered_rank([1, 2, 3, 3]), [-1, -1 / 3, 2 / 3, 2 / 3])
    np.testing.assert_array_equal(centered_rank([4, 4, 4]), [0, 0, 0])
    np.testing.assert_array_equal(centered_rank([7]), [0])
    assert centered_rank([]).shape == (0,)


# ----------------------------------------------------------------- session-aware advantage


def test_mixed_group_by_hand():
    # R = [1,1,1,0,0]: mean 0.6, sample var (3*0.16 + 2*0.36)/4 = 0.3
    # successes N = [1,2,3] -> u = [-1,0,1]; failures N = [2,4] -> u = [-1,1]
    a = session_aware_advantage([1, 1, 1, 0, 0], [1, 2, 3, 2, 4])
    s = math.sqrt(0.3) + 1e-6
    expected = [0.4 / s * 1.2, 0.4 / s * 1.0, 0.4 / s * 0.8, -0.6 / s * 1.2, -0.6 / s * 0.8]
    np.testing.assert_allclose(a, expected, rtol=1e-12)


def test_lone_success_has_u_zero():
    # n_1 = 1: the success is unmodulated; failures N = [1, 2] -> u = [-1, 1]
    a = session_aware_advantage([1, 0, 0], [5, 1, 2], rho=0.5)
    s = SQ3 + 1e-6
    np.testing.assert_allclose(a, [(2 / 3) / s, (-1 / 3) / s * 1.5, (-1 / 3) / s * 0.5], rtol=1e-12)


def test_equal_counts_reduce_to_grpo_and_rho_zero_is_grpo():
    r, grpo = [1, 0, 1, 0], group_advantage([1, 0, 1, 0])
    np.testing.assert_allclose(session_aware_advantage(r, [3, 3, 3, 3]), grpo)
    np.testing.assert_allclose(session_aware_advantage(r, [1, 2, 5, 9], rho=0.0), grpo)


def test_all_succeed_fallback():
    np.testing.assert_allclose(session_aware_advantage([1, 1, 1], [1, 2, 4]), [0.2, 0.0, -0.2])
    np.testing.assert_allclose(session_aware_advantage([1, 1, 1], [1, 2, 4], beta1=0.5), [0.5, 0.0, -0.5])
    np.testing.assert_array_equal(session_aware_advantage([1, 1], [2, 2]), [0.0, 0.0])


def test_all_fail_fallback_never_positive():
    # u = [-1, -1/3, 2/3, 2/3] -> beta0 * min(u, 0)
    r, n = [0, 0, 0, 0], [1, 2, 3, 3]
    np.testing.assert_allclose(session_aware_advantage(r, n), [-0.1, -1 / 30, 0, 0])
    np.testing.assert_allclose(session_aware_advantage(r, n, beta0=0.3), [-0.3, -0.1, 0, 0])


@pytest.mark.parametrize("rewards", [[0.0], [1.0]])
def test_single_rollout_group_is_zero(rewards):
    np.testing.assert_array_equal(session_aware_advantage(rewards, [4]), [0.0])


def test_session_aware_input_checks():
    with pytest.raises(ValueError, match="session counts"):
        session_aware_advantage([1, 0], [1, 2, 3])
    with pytest.raises(ValueError, match="rho"):
        session_aware_advantage([1, 0], [1, 2], rho=1.0)
    with pytest.raises(ValueError, match="beta"):
        session_aware_advantage([1, 0], [1, 2], beta0=-0.1)
    with pytest.raises(ValueError, match="finite"):
        session_aware_advantage([1, float("nan")], [1, 2])


def test_properties_c1_c2_c3_on_random_groups():
    rng = np.random.default_rng(0)
    for _ in range(300):
        g = int(rng.integers(2, 9))
        r = rng.integers(0, 2, g).astype(float)
        n = rng.integers(1, 6, g).astype(float)
        a = session_aware_advantage(r, n, rho=float(rng.choice([0.2, 0.9])))
        for i in range(g):
            for j in range(g):
                if r[i] == r[j] == 1 and n[i] < n[j]:  # C1 (strict)
                    assert a[i] > a[j]
                if r[i] == r[j] == 0 and n[i] < n[j]:  # C2 (strict when mixed, weak when all fail)
                    assert a[i] < a[j] if r.max() == 1 else a[i] <= a[j]
                if r[i] == 1 and r[j] == 0:  # C3
                    assert a[i] > a[j]
        if r.max() == 0:
            assert np.all(a <= 0)


# ----------------------------------------------------------------- normalization + shaping


HAND_GAINS = [[0.0, 0.5, None], [0.4, -0.3, 0.2, 0.1, None], [None]]
HAND_TYPES = [["normal", "compaction", "normal"], ["normal", "compaction"] * 2 + ["normal"], ["normal"]]


def test_type_conditioned_normalization_by_hand():
    gains, types = HAND_GAINS, HAND_TYPES
    # normal pool [0.0, 0.4, 0.2]: mean 0.2, std 0.2; compaction pool [0.5, -0.3, 0.1]: mean 0.1, std 0.4
    out = normalize_session_gains(gains, types, eps=0.0)
    assert out[0][2] is None and out[1][4] is None and out[2] == [None]
    np.testing.assert_allclose(out[0][:2], [-1.0, 1.0])
    np.testing.assert_allclose(out[1][:4], [1.0, -1.0, 0.0, 0.0], atol=1e-12)


def test_shape_by_hand_with_direction_gate():
    out = shape_session_advantages([0.05, -0.05, 0.2], HAND_GAINS, HAND_TYPES, all_failed=False, eps=0.0)
    # r = [-1, 1 | 1, -1, 0, 0 | -]; A = gate(base + 0.1 r); terminal sessions keep the base
    np.testing.assert_allclose(out[0], [0.0, 0.15, 0.05], atol=1e-12)  # 0.05 - 0.1 -> clipped to 0
    np.testing.assert_allclose(out[1], [0.0, -0.15, -0.05, -0.05, -0.05], atol=1e-12)  # -0.05 + 0.1 -> 0
    np.testing.assert_allclose(out[2], [0.2])
    assert all(o.dtype == np.float64 for o in out)


# compaction gains sit systematically below normal ones (paper Fig. 5)
LOW_COMPACTION = ([[0.4, -0.2, None], [0.6, 0.0, None]], [["normal", "compaction", "normal"]] * 2)


def test_type_vs_global_normalization():
    gains, types = LOW_COMPACTION
    k = 0.1 / math.sqrt(0.02)  # each type: two values 0.2 apart -> r = +-0.7071
    typed = shape_session_advantages([0.0, 0.0], gains, types, all_failed=False, lambda_r=1.0, eps=0.0)
    np.testing.assert_allclose(typed[0], [-k, -k, 0.0])
    np.testing.assert_allclose(typed[1], [k, k, 0.0])
    # global pool [0.4, -0.2, 0.6, 0.0]: mean 0.2, sample std sqrt(0.4/3); both compactions negative
    g = math.sqrt(0.4 / 3)
    flat = [["x"] * 3] * 2
    glob = shape_session_advantages([0.0, 0.0], gains, flat, all_failed=False, lambda_r=1.0, eps=0.0)
    np.testing.assert_allclose(glob[0], [0.2 / g, -0.4 / g, 0.0])
    np.testing.assert_allclose(glob[1], [0.4 / g, -0.2 / g, 0.0])


def test_all_failure_gate_blocks_positive_shaping():
    gains, types = LOW_COMPACTION
    k = 0.1 / math.sqrt(0.02)
    out = shape_session_advantages([0.0, -0.1], gains, types, all_failed=True, eps=0.0)
    np.testing.assert_allclose(out[0], [-0.1 * k, -0.1 * k, 0.0])  # negative r kept
    np.testing.assert_allclose(out[1], [-0.1, -0.1, -0.1])  # positive r -> 0: only the base
    assert all(np.all(o <= 0) for o in out)


def test_singleton_type_and_zero_std_give_zero_signal():
    # one subagent session in the group (|S_k| = 1) and equal normal gains (std 0) -> r = 0
    gains = [[None, 0.7, 0.3], [None, 0.3]]
    types = [["normal", "subagent", "normal"], ["normal", "normal"]]
    assert normalize_session_gains(gains, types) == [[None, 0.0, 0.0], [None, 0.0]]
    out = shape_session_advantages([0.4, -0.4], gains, types, all_failed=False)
    np.testing.assert_allclose(out[0], [0.4, 0.4, 0.4])
    np.testing.assert_allclose(out[1], [-0.4, -0.4])


def test_no_eligible_sessions_returns_base():
    types = [["normal"], ["normal"] * 2]
    out = shape_session_advantages([0.3, -0.2], [[None], [None, None]], types, all_failed=False)
    np.testing.assert_allclose(out[0], [0.3])
    np.testing.assert_allclose(out[1], [-0.2, -0.2])


def test_shape_input_checks():
    with pytest.raises(ValueError, match="base"):
        shape_session_advantages([0.1], [[None], [None]], [["normal"], ["normal"]], all_failed=False)
    with pytest.raises(ValueError, match="session types"):
        shape_session_advantages([0.1], [[None, 0.1]], [["normal"]], all_failed=False)
    with pytest.raises(ValueError, match="finite"):
        shape_session_advantages([0.1], [[float("inf")]], [["normal"]], all_failed=False)
    with pytest.raises(TypeError):
        shape_session_advantages([0.1], [[None]], [["normal"]])  # all_failed is required


# ----------------------------------------------------------------- information gain helpers


def test_ig_helpers():
    assert answer_score([-1.0, -2.0, -3.0]) == -2.0
    with pytest.raises(ValueError):
        answer_score([])
    assert (marginal_information_gain(-2.0, -1.5), marginal_information_gain(None, -1.5)) == (0.5, None)
    m = information_gain_metrics([0.5, -0.1, None, 0.2])
    assert m["positive_ig_rate"] == pytest.approx(2 / 3)
    assert m["ig_per_session"] == pytest.approx(0.7 / 3)
    assert m["eligible"] == 3
    assert set(information_gain_metrics([None]).values()) == {0.0}


def _seg(kind: str, lens: list[int], **info) -> Segment:
    turns = [Turn(prompt_ids=[1], response_ids=list(range(n)), logprobs=[-0.1] * n) for n in lens]
    return Segment(kind=kind, turns=turns, info=dict(info))


def _ro(uid: str, reward: float, segs: list[Segment], gid: str = "g") -> Rollout:
    return Rollout(uid=uid, task_id="t", group_id=gid, segments=segs, reward=reward, success=reward > 0)


def test_terminal_session_index():
    chain = _ro("a", 1, [_seg("normal", [1]), _seg("compaction", [1]), _seg("normal", [1])])
    assert terminal_session_index(chain) == 2
    forks = _ro("b", 1, [_seg("normal", [1]), _seg("subagent", [1]), _seg("subagent", [1])])
    assert terminal_session_index(forks) == 0
    marked = _ro("c", 1, [_seg("normal", [1]), _seg("normal", [1], terminal=True), _seg("normal", [1])])
    assert terminal_session_index(marked) == 1


# ----------------------------------------------------------------- registered estimator


LAYOUT = {  # uid: (reward, [(kind, response lengths of its turns)])
    "a": (1.0, [("normal", [2, 3]), ("compaction", [1]), ("normal", [2])]),
    "b": (1.0, [("normal", [4])]),
    "c": (0.0, [("normal", [1]), ("compaction", [2]), ("normal", [1])]),
    "d": (0.0, [("normal", [2]), ("subagent", [1]), ("subagent", [3])]),
}


def _group() -> Group:
    return Group("g", "t", [_ro(u, r, [_seg(k, n) for k, n in segs]) for u, (r, segs) in LAYOUT.items()])


GAINS = [[0.3, 0.1, None], None, [0.1, -0.1, None], [None, 0.2, 0.4]]


def _per_segment(adv):
    """Collapse token advantages to one value per segment, checking they are constant."""
    vals = [[np.concatenate(a_s) for a_s in a_r] for a_r in adv]
    assert all(np.all(v == v[0]) for row in vals for v in row)
    return [[v[0] for v in row] for row in vals]


def _assert_rows_close(got, expected):
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-12)


def test_mosaic_registered():
    spec = get_estimator("mosaic")
    assert spec.loss_agg_mode == "rollout-mean-token-mean"
    assert {"gains", "rho", "beta0", "beta1", "lambda_r", "session_aware", "shaping", "normalization"} <= set(
        spec.params
    )


def test_mosaic_estimator_layout_and_values():
    group = _group()
    adv = get_estimator("mosaic")([group], gains=GAINS)
    for ro, a_r in zip(group.rollouts, adv, strict=True):  # token layout
        assert [[x.shape for x in a_s] for a_s in a_r] == [
            [(t.num_response_tokens,) for t in seg.turns] for seg in ro.segments
        ]
    got = _per_segment(adv)
    # R = [1,1,0,0], N = [3,1,3,3]: successes u = [1,-1], failures u = [0,0]
    a0 = 0.5 / (SQ3 + 1e-6)
    base = [a0 * 0.8, a0 * 1.2, -a0, -a0]
    expected = shape_session_advantages(
        base,
        [GAINS[0], [None], GAINS[2], GAINS[3]],
        [[s.kind for s in r.segments] for r in group.rollouts],
        all_failed=False,
    )
    _assert_rows_close(got, expected)
    np.testing.assert_allclose(got[1], [a0 * 1.2], rtol=1e-12)  # single-session rollout: base only
    # normal pool [0.3, 0.1] -> r = [+k, -k]; k = 0.1/(sqrt(0.02)+eps)
    k = 0.1 / (math.sqrt(0.02) + 1e-6)
    assert got[0][0] == pytest.approx(a0 * 0.8 + 0.1 * k)
    assert got[2][0] == pytest.approx(-a0 - 0.1 * k)
    assert got[2][2] == pytest.approx(-a0)  # terminal
    rows = build_rows(group.rollouts, adv)
    assert sum(r.num_trainable for r in rows) == sum(r.num_response_tokens for r in group.rollouts)


def test_mosaic_ablations():
    group = _group()
    est = get_estimator("mosaic")
    counts = [3, 1, 3, 3]
    traj = _per_segment(est([group], shaping=False))
    base = session_aware_advantage(group.rewards, counts)
    _assert_rows_close(traj, [[b] * len(ro.segments) for b, ro in zip(base, group.rollouts, strict=True)])
    # both components off = the broadcasting baseline
    plain = est([group], shaping=False, session_aware=False)
    bcast = get_estimator("broadcast")([group])
    assert _per_segment(plain) == _per_segment(bcast)
    # shaping only: GRPO base + shaping
    shaped = _per_segment(est([group], gains=GAINS, session_aware=False))
    types = [[s.kind for s in r.segments] for r in group.rollouts]
    gains = [GAINS[0], [None], GAINS[2], GAINS[3]]
    _assert_rows_close(
        shaped, shape_session_advantages(group_advantage(group.rewards), gains, types, all_failed=False)
    )
    # global normalization pools every kind into one type
    glob = _per_segment(est([group], gains=GAINS, normalization="global"))
    flat = [["all"] * len(t) for t in types]
    _assert_rows_close(glob, shape_session_advantages(base, gains, flat, all_failed=False))
    assert not np.allclose(glob[3], _per_segment(est([group], gains=GAINS))[3])


def test_mosaic_all_failed_group_has_no_positive_advantage():
    chain = [("normal", [1]), ("compaction", [1]), ("normal", [1])]
    x, y = (_ro(u, 0.0, [_seg(k, n) for k, n in chain]) for u in "xy")
    g = Group("f", "t", [x, y, _ro("z", 0.0, [_seg("normal", [2])])])
    gains = [[0.9, 0.5, None], [-0.9, -0.5, None], None]
    got = _per_segment(get_estimator("mosaic")([g], gains=gains))
    # N = [3,3,1] -> u = [0.5, 0.5, -1] -> base [0, 0, -0.1]; x's positive r is gated to 0
    k_n = 0.9 / (math.sqrt(1.62) + 1e-6)  # normal pool [0.9, -0.9]
    k_c = 0.5 / (math.sqrt(0.5) + 1e-6)  # compaction pool [0.5, -0.5]
    np.testing.assert_allclose(got[0], [0.0, 0.0, 0.0])
    np.testing.assert_allclose(got[1], [-0.1 * k_n, -0.1 * k_c, 0.0], rtol=1e-12)
    np.testing.assert_allclose(got[2], [-0.1])


def test_mosaic_groups_are_independent():
    g1, g2 = _group(), _group()
    both = get_estimator("mosaic")([g1, g2], gains=GAINS + GAINS)
    one = get_estimator("mosaic")([g1], gains=GAINS)
    assert _per_segment(both[4:]) == _per_segment(one)


def test_mosaic_estimator_input_checks():
    est = get_estimator("mosaic")
    with pytest.raises(ValueError, match="shaping=False"):
        est([_group()])
    with pytest.raises(ValueError, match="terminal"):
        est([_group()], gains=[[0.3, 0.1, 0.2], None, None, None])
    with pytest.raises(ValueError, match="entries"):
        est([_group()], gains=[[0.3], None, None, None])
    with pytest.raises(ValueError, match="rollouts"):
        est([_group()], gains=[None])
    with pytest.raises(ValueError, match="normalization"):
        est([_group()], shaping=False, normalization="per-type")
