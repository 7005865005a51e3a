"""ECHO traceable credit (docs/spec/echo.md "Credit"; paper Eq. 13-14): masks and advantages by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

import horizonrl.credit.echo as echo_mod
from helpers.echo_rollouts import echo_rollout, make_turn, single_segment
from horizonrl.credit.echo import (
    echo_token_mask,
    provenance_mask,
    rollout_provenance,
    selected_source_turns,
)
from horizonrl.credit.group import valid_group_advantage
from horizonrl.credit.registry import get_estimator
from horizonrl.trajectory import Group, Rollout, Segment, rollout_from_dict, rollout_to_dict

A_POS = 0.5 / (math.sqrt(1 / 3) + 1e-6)  # GRPO of R = [1, 0, 0, 1] (sample std sqrt(1/3))


EXPECTED_MASK = [
    [[1, 1, 1], [1, 1, 0, 0, 0], [0, 0, 1, 1, 1, 0], [1, 1, 1, 1]],
    [[1, 1, 1]],
    [[1, 1, 1, 1]],
]


def _as_lists(nested):
    return [[np.asarray(t).astype(float).tolist() for t in seg] for seg in nested]


# ----------------------------------------------------------------------------- mask


def test_provenance_mask_formula():
    final = [1, 0, 0, 0, 0, 0, 0]
    action = [-1, 3, 4, -1, -1, -1, -1]
    finding = [-1, -1, -1, 3, 5, -1, -1]
    selection = [0, 0, 0, 0, 0, 1, 0]
    mask = provenance_mask(final, action, finding, selection, {3, -1})
    assert mask.dtype == bool
    assert mask.tolist() == [True, True, False, True, False, True, False]  # -1 in selected never matches
    assert provenance_mask([], [], [], [], set()).shape == (0,)
    with pytest.raises(ValueError, match="one length"):
        provenance_mask([1], [1, 2], [1], [0], {1})


def test_rollout_provenance_arrays():
    prov = rollout_provenance(echo_rollout())
    assert prov.reconstructed and prov.selected == frozenset({0, 2, 3})
    assert prov.lengths == ((3, 5, 6, 4), (3,), (4,))
    assert prov.final.tolist() == [False] * 21 + [True] * 4
    assert prov.action_turn[:18].tolist() == [0, 0, 0, -1, -1, 1, 1, 1, -1, -1, 2, 2, 2, -1, -1, -1, 3, 3]
    assert prov.finding_turn[:18].tolist() == [
        -1,
        -1,
        -1,
        0,
        0,
        -1,
        -1,
        -1,
        1,
        1,
        -1,
        -1,
        -1,
        -1,
        2,
        2,
        -1,
        -1,
    ]
    assert prov.selection.tolist() == [False] * 18 + [True] * 3 + [False] * 4
    assert prov.finding_turn[21:23].tolist() == [3, 3]


def test_echo_token_mask_by_hand():
    """Final segment, selected (0) / kept-latest (2, 3) / unselected (1) actions and findings, selection."""
    assert _as_lists(echo_token_mask(echo_rollout())) == EXPECTED_MASK
    dense = echo_token_mask(echo_rollout(), dense=True)
    assert all(m.all() for seg in dense for m in seg)


def test_kept_latest_turns_are_credited_only_when_recorded():
    r = echo_rollout()
    r.segments[-1].info = {"selected": [0]}  # agent forgot the automatically kept turns
    mask = echo_token_mask(r)
    assert mask[0][2].tolist() == [False] * 6 and mask[0][3].tolist() == [False] * 4
    r.segments[-1].info = {"selected": [0, 2, 3]}  # merged set recorded in one list
    assert _as_lists(echo_token_mask(r)) == EXPECTED_MASK


def test_selection_span_inside_normal_segment_and_final_trace_only():
    """Two reconstructions: only the *last* selected set counts (final-trace approximation, paper §4.3)."""
    seg0 = Segment(turns=[make_turn(2, ("action", 0, 2, 0)), make_turn(3, ("selection", 0, 2, None))])
    seg1 = Segment(
        turns=[make_turn(2, ("action", 0, 2, 1)), make_turn(3, ("selection", 1, 3, None))],
        info={"selected": [0]},
    )
    seg2 = Segment(turns=[make_turn(2)], info={"selected": [1]})
    r = Rollout(uid="x", task_id="t", group_id="g", segments=[seg0, seg1, seg2])
    assert _as_lists(echo_token_mask(r)) == [[[0, 0], [1, 1, 0]], [[1, 1], [0, 1, 1]], [[1, 1]]]


def test_selected_set_sources_and_errors():
    r = echo_rollout(info=False)
    with pytest.raises(ValueError, match="no selected source turns"):
        selected_source_turns(r)
    r.env["echo"] = {"selected": [1], "kept_latest": [3]}
    assert selected_source_turns(r) == frozenset({1, 3})
    r.segments[-1].info["selected"] = [0]  # the last segment takes precedence over env
    assert selected_source_turns(r) == frozenset({0})
    r.segments[-1].info["selected"] = ["a"]
    with pytest.raises(ValueError):
        selected_source_turns(r)
    assert selected_source_turns(single_segment("s", 1.0)) == frozenset()


def test_conflicting_overlapping_spans_raise():
    t = make_turn(4, ("action", 0, 3, 0), ("action", 2, 4, 1))
    r = Rollout(uid="x", task_id="t", group_id="g", segments=[Segment(turns=[t])])
    with pytest.raises(ValueError, match="overlapping action"):
        rollout_provenance(r)


def test_mask_survives_json_roundtrip():
    r = rollout_from_dict(rollout_to_dict(echo_rollout()))
    assert _as_lists(echo_token_mask(r)) == EXPECTED_MASK


def test_single_segment_rollout_is_dense():
    mask = echo_token_mask(single_segment("s", 1.0))
    assert _as_lists(mask) == [[[1, 1, 1], [1, 1, 1, 1]]]


# ------------------------------------------------------------------------ advantages


def test_valid_group_advantage():
    np.testing.assert_allclose(
        valid_group_advantage([1, 0, 1, 1], [True, True, False, True]),
        np.array([1 / 3, -2 / 3, 0, 1 / 3]) / (math.sqrt(1 / 3) + 1e-6),
    )
    assert valid_group_advantage([1, 0], [False, False]).tolist() == [0.0, 0.0]
    assert valid_group_advantage([1, 0], [True, False]).tolist() == [0.0, 0.0]


def _group(rewards, terminations=None) -> Group:
    terminations = terminations or ["done"] * len(rewards)
    rs = [
        echo_rollout(f"r{i}", r, term) for i, (r, term) in enumerate(zip(rewards, terminations, strict=True))
    ]
    return Group("g", "t", rs)


def test_positive_rule_masks_above_baseline_only():
    adv = get_estimator("echo")([_group([1, 0, 0, 1])])
    for i, a in enumerate([A_POS, 0.0, 0.0, A_POS]):
        expected = [[[a * m for m in turn] for turn in seg] for seg in EXPECTED_MASK]
        assert _as_lists(adv[i]) == expected
    assert all(np.all(t == 0) and not np.any(np.signbit(t)) for i in (1, 2) for s in adv[i] for t in s)


@pytest.mark.parametrize("rewards", [[1, 1, 1], [0, 0, 0], [1], [0.5, 0.5]])
def test_positive_rule_degenerate_groups_give_zero(rewards):
    adv = echo_mod.echo([_group(rewards)])
    assert all(np.all(t == 0) for r in adv for s in r for t in s)


def test_positive_rule_tied_rollout_gives_zero():
    adv = echo_mod.echo([_group([1, 0.5, 0])])
    assert np.all(adv[0][2][0] > 0)
    assert all(np.all(t == 0) for i in (1, 2) for s in adv[i] for t in s)


def test_signed_rule():
    adv = echo_mod.echo([_group([1, 0, 0, 1])], sign_rule="signed")
    mask = echo_token_mask(echo_rollout())
    for i, a in enumerate([A_POS, -A_POS, -A_POS, A_POS]):
        for seg_a, seg_m in zip(adv[i], mask, strict=True):
            for t_a, t_m in zip(seg_a, seg_m, strict=True):
                np.testing.assert_allclose(t_a, np.where(t_m, a, 0.0))
    with pytest.raises(ValueError, match="sign_rule"):
        echo_mod.echo([_group([1, 0])], sign_rule="negative")


def test_never_reconstructed_rollout_gets_dense_credit():
    g = Group("g", "t", [single_segment("a", 1.0), echo_rollout("b", 0.0)])
    adv = echo_mod.echo([g])
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert [t.tolist() for t in adv[0][0]] == [[pytest.approx(a)] * 3, [pytest.approx(a)] * 4]


def test_dense_ablation():
    adv = echo_mod.echo([_group([1, 0, 0, 1])], dense=True, sign_rule="signed")
    np.testing.assert_allclose(np.concatenate([t for s in adv[1] for t in s]), -A_POS)
    np.testing.assert_allclose(np.concatenate([t for s in adv[0] for t in s]), A_POS)


def test_invalid_rollouts_excluded_and_zero():
    g = _group([1, 0, 1, 1], ["done", "done", "overlong", "error"])
    g.rollouts[2].segments[-1].info = {}  # an overlong rollout may lack a final selected set
    # Default (paper §5.1): overlong = unsuccessful, in the baseline with reward 0; "error" excluded.
    adv = echo_mod.echo([g], sign_rule="signed")
    sd = math.sqrt(1 / 3)  # sample std of [1, 0, 0]
    assert adv[0][2][0].tolist() == [pytest.approx((2 / 3) / (sd + 1e-6))] * 4
    assert adv[1][2][0].tolist() == [pytest.approx((-1 / 3) / (sd + 1e-6))] * 4
    assert all(np.all(t == 0) for i in (2, 3) for s in adv[i] for t in s)  # no update on their own tokens
    # The other reading: overlong left out of the baseline too -> GRPO over the valid rewards [1, 0].
    adv = echo_mod.echo([g], sign_rule="signed", overlong="exclude")
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert adv[0][2][0].tolist() == [pytest.approx(a)] * 4
    assert adv[1][2][0].tolist() == [pytest.approx(-a)] * 4
    assert all(np.all(t == 0) for i in (2, 3) for s in adv[i] for t in s)
    adv = echo_mod.echo([_group([1, 0, 1], ["done", "done", "error"])], invalid_terminations=())
    a3 = (1 / 3) / (math.sqrt(1 / 3) + 1e-6)  # "error" now valid: GRPO over [1, 0, 1]
    assert adv[2][2][0].tolist() == [pytest.approx(a3)] * 4


def test_one_success_among_overlong_rollouts_is_credited():
    # The review's case: 1 success + 7 overlong gave no update at all; the paper's reading gives A+ = 2.47.
    g = _group([1] + [0] * 7, ["done"] + ["overlong"] * 7)
    for r in g.rollouts[1:]:
        r.segments[-1].info = {}
    a = (7 / 8) / (math.sqrt(1 / 8) + 1e-6)
    assert a == pytest.approx(2.4749, abs=1e-4)
    top = echo_mod.echo([g])[0]
    assert max(float(t.max()) for seg in top for t in seg) == pytest.approx(a)
    # the released rule: one valid rollout left, so the overlong ones stay in the baseline as failures
    excl = echo_mod.echo([g], overlong="exclude")[0]
    assert max(float(t.max()) for seg in excl for t in seg) == pytest.approx(a)


def test_authors_group_baseline_population_std_without_overlong():
    """The released recipe: overlong rollouts leave the statistics, population std (ddof = 0)."""
    g = _group([1, 0, 1, 0], ["done", "done", "overlong", "done"])
    g.rollouts[2].segments[-1].info = {}
    adv = echo_mod.echo([g], sign_rule="signed", overlong="exclude", std_ddof=0)
    sd = math.sqrt(2) / 3  # population std of the valid rewards [1, 0, 0]: sqrt(((2/3)^2 + 2 (1/3)^2) / 3)
    assert adv[0][2][0].tolist() == [pytest.approx((2 / 3) / (sd + 1e-6))] * 4
    assert adv[1][2][0].tolist() == [pytest.approx((-1 / 3) / (sd + 1e-6))] * 4
    assert all(np.all(t == 0) for s in adv[2] for t in s)
    # One valid rollout left (Echo repository, core_algos.compute_supo_advantage, pass 2): the whole
    # group is the baseline with the overlong rewards as 0: R = [1, 0, 0], population std sqrt(2)/3.
    lone = _group([1, 1, 0], ["done", "overlong", "overlong"])
    for r in lone.rollouts[1:]:
        r.segments[-1].info = {}
    adv = echo_mod.echo([lone], overlong="exclude", std_ddof=0, sign_rule="signed")
    assert adv[0][2][0].tolist() == [pytest.approx((2 / 3) / (sd + 1e-6))] * 4
    assert all(np.all(t == 0) for r in adv[1:] for s in r for t in s)  # overlong rollouts themselves: 0
    # no valid rollout at all: nobody is updated
    none = _group([0, 0], ["overlong", "overlong"])
    for r in none.rollouts:
        r.segments[-1].info = {}
    assert all(np.all(t == 0) for r in echo_mod.echo([none], overlong="exclude") for s in r for t in s)
    with pytest.raises(ValueError, match="std_ddof"):
        echo_mod.echo([g], std_ddof=2)


def test_registry_wiring():
    spec = get_estimator("echo")
    assert spec.loss_agg_mode == "token-mean"
    assert {
        "sign_rule",
        "dense",
        "invalid_terminations",
        "overlong",
        "normalize_std",
        "eps",
        "std_ddof",
        "credit",
        "gamma_turn",
        "gamma_segment",
        "graph_aggregation",
        "graph_clip",
        "graph_version",
        "neg_penalty",
    } == set(spec.params)
    groups = [_group([1, 0]), Group("h", "t2", [single_segment("s", 1.0)])]
    out = spec(groups, sign_rule="signed")
    assert len(out) == 3
    with pytest.raises(TypeError, match="unknown parameter"):
        spec(groups, beta=1.0)
