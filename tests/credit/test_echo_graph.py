"""ECHO graph credit and the negative-rollout penalty (released options; docs/released_recipes.md).

The first tests transcribe the authors' published fixtures (their graph, their gamma, their expected
per-token values, with A = +0.5 for the positive rollout: R = [1, 0], no std normalization); the
rest are worked by hand on horizonrl's own ECHO rollout."""

from __future__ import annotations

import math

import numpy as np
import pytest

from helpers.echo_rollouts import echo_rollout, make_turn, single_segment
from horizonrl.credit.echo_graph import (
    GraphCycleError,
    MemoryGraph,
    graph_coefficients,
    graph_weights,
    memory_graph,
)
from horizonrl.credit.registry import get_estimator
from horizonrl.trajectory import Group

A = 0.5  # the fixtures' positive advantage


def _graph(nodes: dict[int, list[int]], outcome: list[int]) -> MemoryGraph:
    """The authors' single-gamma graphs: every edge one kind (gamma_turn = gamma_segment)."""
    return MemoryGraph(
        {v: tuple((p, "turn") for p in ps) for v, ps in nodes.items()}, tuple((p, "turn") for p in outcome)
    )


def _tokens(coef, turn_ids, finding_ids=None, selection=None, final=False):
    n = len(turn_ids)
    return A * graph_weights([final] * n, turn_ids, finding_ids or [-1] * n, selection or [False] * n, coef)


def test_fixture_chain_and_a_recent_only_turn():
    g = _graph({0: [], 1: [0], 2: [1], 3: [], 4: [0]}, [2])
    coef, _ = graph_coefficients(g, gamma_turn=0.5, gamma_segment=0.5, aggregation="max", clip=1.0)
    assert np.allclose(_tokens(coef, [0, 1, 3, 3]), [0.0625, 0.125, 0.0, 0.0])  # 3: kept, never a parent
    assert np.allclose(_tokens(coef, [2, 2, 4, 4]), [0.25, 0.25, 0.0, 0.0])  # 4: unrelated child of 0
    assert np.allclose(_tokens(coef, [-1] * 4, final=True), [0.5] * 4)  # the final segment


def test_fixture_multiple_paths_sum_and_clip():
    g = _graph({0: [], 1: [0], 2: [0], 4: [1, 2]}, [4])
    coef, m = graph_coefficients(g, gamma_turn=1.0, gamma_segment=1.0, aggregation="sum", clip=1.0)
    assert np.allclose(_tokens(coef, [0, 1, 3, 3]), [0.5, 0.5, 0.0, 0.0])  # c(0) = 2 clipped to 1
    assert np.allclose(_tokens(coef, [2, 2, 4, 4]), [0.5] * 4)
    assert m["clip_ratio"] == 0.25
    coef, m = graph_coefficients(g, gamma_turn=1.0, gamma_segment=1.0, aggregation="sum", clip=None)
    assert _tokens(coef, [0])[0] == 1.0 and m["clip_ratio"] == 0.0


def test_fixture_selection_tokens_unit_weight_and_findings_inherit():
    g = _graph({0: [], 1: [0, 3], 2: [1], 3: []}, [2])
    coef, _ = graph_coefficients(g, gamma_turn=0.5, gamma_segment=0.5, aggregation="max", clip=None)
    row0 = _tokens(coef, [0, 1, 3, -1], finding_ids=[-1, -1, -1, 0])
    assert row0[3] == 0.0625
    row1 = _tokens(coef, [2, 2, 4, 4], selection=[False, False, True, True])
    assert np.allclose(row1, [0.25, 0.25, 0.5, 0.5])


def test_fixture_zero_gamma_blocks_history_and_cycles_are_refused():
    g = _graph({0: [], 1: [0], 2: [1]}, [2])
    coef, _ = graph_coefficients(g, gamma_turn=0.0, gamma_segment=0.0, aggregation="max", clip=1.0)
    assert coef == {0: 0.0, 1: 0.0, 2: 0.0}
    with pytest.raises(GraphCycleError, match="cycle"):
        graph_coefficients(_graph({0: [1], 1: [0]}, [1]))


def test_the_typed_memory_graph_of_an_echo_rollout_by_hand():
    """Version 2 (the released default): records 0-3 chain inside the first segment; the final segment
    is rebuilt from the model's pick {0} (2, 3 kept automatically: prompt-only) and adds no record, so
    the outcome hangs on 0 by a selection edge and the selection segment's downstream is the outcome."""
    g = memory_graph(echo_rollout())
    t, s = "turn", "selection"
    assert g.parents == {0: (), 1: ((0, t),), 2: ((1, t),), 3: ((2, t),)}
    assert g.outcome == ((0, s),) and g.selections == {1: None}
    coef, m = graph_coefficients(g, gamma_turn=1.0, gamma_segment=0.9, aggregation="sum", clip=1.0)
    assert coef == pytest.approx({0: 0.9})  # 1-3 have no path to the outcome
    assert m == {"active": 1.0, "clipped": 0.0, "clip_ratio": 0.0}


def test_the_untyped_memory_graph_of_an_echo_rollout_by_hand():
    """Version 1: parents = the whole context (rebuilt records and the segment's earlier ones)."""
    g = memory_graph(echo_rollout(), version=1)
    s = "selection"
    assert g.parents == {0: (), 1: ((0, s),), 2: ((0, s), (1, s)), 3: ((0, s), (1, s), (2, s))}
    assert g.outcome == ((0, s), (2, s), (3, s))
    coef, _ = graph_coefficients(g, gamma_turn=1.0, gamma_segment=0.9, aggregation="sum", clip=None)
    c3 = 0.9
    c2 = 0.9 + 0.9 * c3
    c1 = 0.9 * (c2 + c3)
    c0 = 0.9 + 0.9 * (c1 + c2 + c3)
    assert coef == pytest.approx({3: c3, 2: c2, 1: c1, 0: c0})


def _rebuilt_with_new_records():
    """Records 0-2 in the first segment, a selection of {0} (1, 2 kept), records 3 and 4 after it."""
    from horizonrl.trajectory import Rollout, Segment

    seg0 = Segment(
        turns=[
            make_turn(2, ("action", 0, 2, 0)),
            make_turn(4, ("finding", 0, 2, 0), ("action", 2, 4, 1)),
            make_turn(4, ("finding", 0, 2, 1), ("action", 2, 4, 2)),
        ]
    )
    seg1 = Segment(kind="selection", turns=[make_turn(2)], parent=0)
    seg2 = Segment(
        turns=[
            make_turn(4, ("finding", 0, 2, 2), ("action", 2, 4, 3)),
            make_turn(4, ("finding", 0, 2, 3), ("action", 2, 4, 4)),
            make_turn(4, ("finding", 0, 2, 4), ("answer", 2, 4, None)),
        ],
        parent=0,
        info={"selected": [0], "kept_latest": [1, 2]},
    )
    return Rollout(uid="w", task_id="t", group_id="g", segments=[seg0, seg1, seg2], reward=1.0)


def test_selection_weight_is_the_downstream_records_and_findings_inherit_in_the_final_segment():
    """gamma_turn 0.5: c4 = 0.5, c3 = 0.25, c0 = 0.9 * 0.25; the selection weighs c3; the final
    segment's actions stay 1 while its findings of 3 and 4 take their records' coefficients."""
    roll = _rebuilt_with_new_records()
    g = memory_graph(roll)
    assert g.parents[3] == ((0, "selection"),) and g.parents[4] == ((3, "turn"),)
    assert g.outcome == ((4, "turn"),) and g.selections == {1: 3}
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    out = get_estimator("echo")(
        [Group("g", "t", [roll, single_segment("l", 0.0)])], credit="graph", gamma_turn=0.5
    )
    c4, c3, c0 = 0.5, 0.25, 0.225
    want = [
        [[c0, c0], [c0, c0, 0, 0], [0, 0, 0, 0]],  # finding of 0 inherits; 1 and 2 lead nowhere
        [[c3, c3]],  # the selection segment
        # findings of 3 and 4 take their coefficients; the finding of 2 (no path, so no coefficient) and
        # the actions keep the final segment's 1
        [[1, 1, 1, 1], [c3, c3, 1, 1], [c4, c4, 1, 1]],
    ]
    for seg, want_seg in zip(out[0], want, strict=True):
        for got, w in zip(seg, want_seg, strict=True):
            assert np.allclose(got, a * np.array(w))


def test_echo_estimator_graph_credit_and_negative_penalty_by_hand():
    win, lose = echo_rollout("w", 1.0), single_segment("l", 0.0)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)  # GRPO of R = [1, 0], sample std
    est = get_estimator("echo")
    out = est([Group("g", "t", [win, lose])], credit="graph", neg_penalty=0.5)
    weights = [
        [[0.9] * 3, [0.9, 0.9, 0, 0, 0], [0.0] * 6, [0.0] * 4],  # only record 0 reaches the outcome
        [[1.0] * 3],  # the selection message: its downstream is the outcome
        [[1.0] * 4],  # the final segment (its finding is of record 3, which has no coefficient)
    ]
    for seg, want_seg in zip(out[0], weights, strict=True):
        for got, want in zip(seg, want_seg, strict=True):
            assert np.allclose(got, a * np.array(want))
    # the failed rollout: the dense penalty 0.5 * A on every token
    assert all(np.allclose(t, -0.5 * a) for seg in out[1] for t in seg)
    # without the penalty a failure gets nothing (the paper's positive rule)
    plain = est([Group("g", "t", [win, lose])], credit="graph")
    assert all(not np.any(t) for seg in plain[1] for t in seg)
    # token credit is unchanged by the new options' defaults
    token = est([Group("g", "t", [win, lose])])
    assert np.allclose(token[0][0][2], a * np.array([0, 0, 1, 1, 1, 0]))


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"credit": "traj"}, "credit must be one of"),
        ({"graph_aggregation": "mean"}, "graph_aggregation"),
        ({"gamma_turn": 1.5}, "gamma_turn"),
        ({"graph_clip": 0}, "graph_clip"),
        ({"graph_version": 3}, "graph_version"),
        ({"neg_penalty": 0.5, "sign_rule": "signed"}, "neg_penalty"),
    ],
)
def test_bad_graph_parameters_name_the_value(params, message):
    with pytest.raises(ValueError, match=message):
        get_estimator("echo")(
            [Group("g", "t", [single_segment("a", 1.0), single_segment("b", 0.0)])], **params
        )
