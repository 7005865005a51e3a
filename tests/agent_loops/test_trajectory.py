"""The trajectory data model (horizonrl.trajectory): a lossless JSONL round trip, bad lines named, and
exact rows from the row builder."""

from __future__ import annotations

import numpy as np
import pytest

from horizonrl.trajectory import (
    Branch,
    Rollout,
    Segment,
    Span,
    Turn,
    build_rows,
    dumps_rollout,
    loads_rollout,
    read_jsonl,
    write_jsonl,
)


def _turn(prompt, resp, lp=None, **kw):
    return Turn(prompt_ids=prompt, response_ids=resp, logprobs=lp or [-0.5] * len(resp), **kw)


def _rollout():
    # Segment 0: turn 1's prompt extends turn 0's (merge); turn 2's does not (split).
    t0 = _turn(
        [1, 2, 3],
        [10, 11],
        [-0.1, -0.2],
        observation="obs a",
        obs_key="k0",
        spans=[Span("action", 0, 2, source_turn=0)],
    )
    t1 = _turn([1, 2, 3, 10, 11, 7, 8], [12], [-0.3], reward=0.25)
    t2 = _turn([1, 2, 9], [13, 14], [-0.4, -0.5])
    sub = Segment(kind="subagent", turns=[_turn([5, 6], [15], [-1.0 / 3.0])], parent=0, fork_index=0)
    return Rollout(
        uid="r0",
        task_id="t",
        group_id="g",
        segments=[Segment(turns=[t0, t1, t2]), sub],
        reward=1.0,
        success=True,
        final_answer="Oslo",
        env={"name": "lookup", "seed": 3},
        branch=Branch(trunk_id="r9", turn=1),
        termination="done",
    )


def test_jsonl_round_trip_is_lossless(tmp_path):
    r = _rollout()
    r.segments[0].turns[0].logprobs[0] = -0.1234567890123456789  # full float precision
    r.segments[0].turns[0].info["nested"] = {"a": [1, 2.5, None]}
    assert loads_rollout(dumps_rollout(r)) == r
    path = tmp_path / "r.jsonl"
    write_jsonl(path, [r, r])
    back = list(read_jsonl(path))
    assert back == [r, r]
    assert back[0].segments[0].turns[0].spans[0] == Span("action", 0, 2, source_turn=0)
    assert isinstance(back[0].branch, Branch)


def test_read_jsonl_names_the_bad_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(dumps_rollout(_rollout()) + "\n" + '{"uid": 1}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        list(read_jsonl(path))


def test_rows_merge_extending_prompts_and_split_otherwise():
    r = _rollout()
    rows = build_rows([r])
    assert len(rows) == 3  # {t0, t1}, {t2}, {subagent turn}
    a, b, c = rows
    assert a.input_ids == [1, 2, 3, 10, 11, 7, 8, 12]
    assert a.trainable == [False, False, False, True, True, False, False, True]
    assert a.old_logprobs == [0, 0, 0, -0.1, -0.2, 0, 0, -0.3]
    assert a.turn_ids == [-1, -1, -1, 0, 0, -1, -1, 1]
    assert (a.segment_index, a.turns) == (0, [0, 1])
    assert b.input_ids == [1, 2, 9, 13, 14] and b.turn_ids == [-1, -1, -1, 2, 2]
    assert c.input_ids == [5, 6, 15] and c.segment_index == 1 and c.turn_ids == [-1, -1, 3]
    # Every trainable token is preceded by exactly its turn's prompt (+ earlier response/env tokens).
    for row in rows:
        for j, tr in enumerate(row.trainable):
            if tr:
                turn_idx = row.turn_ids[j]
                turn = r.turns[turn_idx]
                start = j - turn.response_ids.index(row.input_ids[j])
                assert row.input_ids[:start] == turn.prompt_ids


def test_rows_without_merge_and_advantages_alignment():
    r = _rollout()
    adv = [[np.array([1.0, 2.0]), np.array([3.0]), np.array([4.0, 5.0])], [np.array([6.0])]]
    rows = build_rows([r], [adv], merge=False)
    assert len(rows) == 4
    got = [x for row in rows for x, t in zip(row.advantages, row.trainable, strict=True) if t]
    assert got == [1, 2, 3, 4, 5, 6]
    with pytest.raises(ValueError, match="shape"):
        build_rows([r], [[[np.zeros(1), np.zeros(1), np.zeros(2)], [np.zeros(1)]]])


def test_turn_and_span_validation():
    with pytest.raises(ValueError, match="logprobs"):
        Turn(prompt_ids=[1], response_ids=[2, 3], logprobs=[0.0])
    with pytest.raises(ValueError, match="exceeds"):
        _turn([1], [2], spans=[Span("answer", 0, 2)])
    with pytest.raises(ValueError, match="label"):
        Span("bogus", 0, 1)
    with pytest.raises(ValueError, match="kind"):
        Segment(kind="weird")


def test_appended_tokens_counts_a_selection_session_by_what_it_adds_to_its_parent():
    from horizonrl.trajectory import Rollout, Segment, Turn, appended_tokens, saved_tokens

    def turn(prompt, response):
        return Turn(prompt_ids=prompt, response_ids=response, logprobs=[-0.1] * len(response))

    work = Segment(turns=[turn([1, 2, 3], [4, 5]), turn([1, 2, 3, 4, 5, 6], [7, 8])])  # one row: 8 tokens
    select = Segment(kind="selection", turns=[turn(list(range(1, 11)), [11, 12])], parent=0)  # 12 tokens
    rebuilt = Segment(turns=[turn([1, 20, 21], [22])], parent=0)  # 4 tokens
    r = Rollout(uid="u", task_id="t", group_id="g", segments=[work, select, rebuilt])
    assert saved_tokens(r) == 8 + 12 + 4
    # the selection prompt shares its first 8 tokens with the parent's last context [1..8]
    assert appended_tokens(r) == 8 + (12 - 8) + 4
    assert appended_tokens(Rollout(uid="v", task_id="t", group_id="g", segments=[work])) == 8
    # a rolling summary is counted the same way (SUPO's volume compares with ECHO's)
    summary = Segment(kind="summary", turns=[turn([1, 2, 3, 4, 5, 6, 7, 8, 30], [31])], parent=0)
    s = Rollout(uid="w", task_id="t", group_id="g", segments=[work, summary, rebuilt])
    assert saved_tokens(s) == 8 + 10 + 4 and appended_tokens(s) == 8 + 2 + 4


def test_vocabularies_keep_the_plain_strings_files_hold():
    import dataclasses

    from horizonrl.trajectory import SEGMENT_KINDS, SPAN_LABELS, rollout_to_dict
    from horizonrl.vocab import SegmentKind, SpanLabel, Termination

    assert SEGMENT_KINDS == ("normal", "compaction", "subagent", "selection", "summary")
    assert SPAN_LABELS == ("action", "finding", "selection", "summary", "answer", "think")
    assert all(type(k) is str for k in SEGMENT_KINDS + SPAN_LABELS)
    assert list(SegmentKind) == list(SEGMENT_KINDS) and list(SpanLabel) == list(SPAN_LABELS)
    assert [t.value for t in Termination] == [
        "done",
        "max_turns",
        "context",
        "truncated",
        "overlong",
        "error",
    ]
    r = Rollout(uid="u", task_id="t", group_id="g", segments=[Segment(kind=SegmentKind.SUMMARY)])
    assert type(r.termination) is str and r.termination == Termination.DONE
    plain = dumps_rollout(dataclasses.replace(r, termination="overlong"))
    r.termination = Termination.OVERLONG  # an agent may write the member: the record is the same
    assert dumps_rollout(r) == plain
    d = rollout_to_dict(r)
    assert type(d["termination"]) is str and type(d["segments"][0]["kind"]) is str


def test_every_data_model_field_has_a_docstring():
    import ast
    import dataclasses
    import inspect
    import itertools
    import textwrap

    from horizonrl.envs.core.base import StepResult
    from horizonrl.trajectory import Group, Row

    for cls in (Span, Turn, Segment, Branch, Rollout, Group, Row, StepResult):
        body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
        documented = {
            node.target.id
            for node, nxt in itertools.pairwise(body)
            if isinstance(node, ast.AnnAssign)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
        }
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in documented]
        assert missing == [], f"{cls.__name__}: fields without a docstring: {missing}"
