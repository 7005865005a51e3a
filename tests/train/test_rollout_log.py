"""What a run saves about credit: advantages, rows and estimator side information in rollouts/step_N.jsonl."""

from __future__ import annotations

import json
import warnings
from importlib import resources

import numpy as np
import pytest

from horizonrl import credit
from horizonrl.config import load_config
from horizonrl.credit.mosaic import normalize_session_gains, session_aware_advantage
from horizonrl.train.records.rollout_log import (
    credit_records,
    decode_advantages,
    encode_advantages,
    token_advantages,
    write_rollout_log,
)
from horizonrl.train.trainers.group import GroupTrainer
from horizonrl.trajectory import (
    Group,
    Rollout,
    Segment,
    Span,
    Turn,
    UnknownFieldWarning,
    build_rows,
    read_jsonl,
    rollout_to_dict,
)


def _turn(n, spans=(), prompt=(1, 2)):
    return Turn(
        prompt_ids=list(prompt), response_ids=list(range(10, 10 + n)), logprobs=[-0.5] * n, spans=list(spans)
    )


def test_advantage_run_length_code_by_hand():
    assert encode_advantages(None) is None
    assert encode_advantages([]) == 0.0
    assert encode_advantages([0.25, 0.25, 0.25]) == 0.25
    assert encode_advantages([1.0, 1.0, 0.0, 0.0, 0.0, 1.0]) == [[1.0, 2], [0.0, 3], [1.0, 1]]
    x = np.array([0.1, 0.1 + 1e-17, 1 / 3, 1 / 3, -2.5e-9])
    assert np.array_equal(decode_advantages(encode_advantages(x), x.size), x)  # bit-exact through JSON too
    assert np.array_equal(decode_advantages(json.loads(json.dumps(encode_advantages(x))), x.size), x)
    assert decode_advantages(None, 4) is None
    with pytest.raises(ValueError, match="cover 3 tokens, the turn has 4"):
        decode_advantages([[1.0, 3]], 4)


def test_side_info_is_silent_outside_a_collect_block():
    ros = [Rollout(u, "t", "g", [Segment(turns=[_turn(2)])], reward=r) for u, r in (("a", 1.0), ("b", 0.0))]
    g = Group("g", "t", ros)
    est = credit.get_estimator("mosaic")
    plain = est([g], shaping=False)
    with credit.collect_side_info() as side:
        again = est([g], shaping=False)
    flat = [t for r in plain for s in r for t in s]
    assert all(
        np.array_equal(a, b) for a, b in zip(flat, [t for r in again for s in r for t in s], strict=True)
    )
    assert side.rollouts[0]["rollout"] == {
        "N": 1,
        "A_traj": pytest.approx(1 / (np.std([1, 0], ddof=1) + 1e-6) / 2),
    }
    with credit.collect_side_info(enabled=False) as off:
        est([g], shaping=False)
    assert off.rollouts == {}


def test_echo_side_info_is_the_provenance_mask_by_hand():
    # Two sessions; the final context selected source turn 0 only. Turn 0: action spans of record 0
    # (tokens 0-1) and record 1 (tokens 2-3); the last session's tokens are all credited.
    t0 = _turn(4, [Span("action", 0, 2, 0), Span("action", 2, 4, 1)])
    last = Segment(kind="normal", turns=[_turn(3)], info={"selected": [0]})
    win = Rollout("w", "t", "g", [Segment(turns=[t0]), last], reward=1.0)
    lose = Rollout("l", "t", "g", [Segment(turns=[_turn(2)])], reward=0.0)
    with credit.collect_side_info() as side:
        adv = credit.get_estimator("echo")([Group("g", "t", [win, lose])])
    info = side.rollouts[0]
    assert info["rollout"]["selected"] == [0]
    assert info["turns"][0][0]["mask"] == "1100" and info["turns"][1][0]["mask"] == "111"
    a = info["rollout"]["A"]
    assert a > 0 and np.array_equal(adv[0][0][0], [a, a, 0, 0])
    assert side.rollouts[1]["rollout"]["A"] == 0.0  # max(A, 0) for the loser


def test_ccpo_side_info_counts_peers_by_hand():
    # One task, two trajectories of two steps; prompt observations: both start at the task prompt (an exact
    # match), then different states. Step (0, 0) has exact peer (1, 0) only; step (0, 1) has no exact peer, so
    # its peers are every step of trajectory 1 (task fallback): 2.
    def ro(uid, obs, reward):
        turns = [_turn(2), _turn(2)]
        turns[0].obs_key, turns[1].obs_key = obs
        return Rollout(uid, "t", "g", [Segment(turns=turns)], reward=reward)

    g = Group("g", "t", [ro("a", ("x", "end"), 1.0), ro("b", ("y", "end"), 0.0)])
    hidden = np.array([[0.0, 1.0], [1.0, 0.0], [0.0, 0.9], [0.9, 0.1]])
    with credit.collect_side_info() as side:
        adv = credit.get_estimator("ccpo")([g], hidden=hidden, obs_key="state")
    t_a = side.rollouts[0]["turns"][0]
    assert [t["peers"] for t in t_a] == [1, 2]
    assert [t["supported"] for t in t_a] == [True, True] and [t["fallback"] for t in t_a] == [False, True]
    for t, a in zip(t_a, adv[0][0], strict=True):  # advantage = historical + future (episode_weight 0)
        assert np.allclose(a, t["historical"] + t["future"])


def _shaped(base, r_norm, all_failed, lambda_r=0.1):
    """``A_{i,s}`` of docs/spec/mosaic.md: base if ineligible, else the gated ``base + lambda r_s``."""
    if r_norm is None:
        return base
    a = base + lambda_r * (min(r_norm, 0.0) if all_failed else r_norm)
    return max(a, 0.0) if base > 0 else min(a, 0.0) if base < 0 else a


def test_mosaic_side_info_with_gains_by_hand():
    # Group of 3; rollout i has sessions [normal, compaction, normal(terminal)]; raw gains of the compaction
    # sessions 0.2, 0.4, 0.9 (the first normal sessions are not scored).
    ros = [
        Rollout(
            f"r{i}",
            "t",
            "g",
            [
                Segment(turns=[_turn(2)]),
                Segment("compaction", [_turn(1)], parent=0),
                Segment(turns=[_turn(2)], parent=1),
            ],
            reward=float(i == 2),
        )
        for i in range(3)
    ]
    gains = [[None, g, None] for g in (0.2, 0.4, 0.9)]
    with credit.collect_side_info() as side:
        adv = credit.get_estimator("mosaic")([Group("g", "t", ros)], gains=gains)
    mean, sd = 0.5, np.std([0.2, 0.4, 0.9], ddof=1)
    base = session_aware_advantage([0, 0, 1], [3, 3, 3])
    for i, g in enumerate((0.2, 0.4, 0.9)):
        info = side.rollouts[i]
        assert info["rollout"] == {"N": 3, "A_traj": pytest.approx(base[i])}
        assert [s["eligible"] for s in info["sessions"]] == [False, True, False]
        assert info["sessions"][1]["ig_raw"] == g
        assert info["sessions"][1]["ig_norm"] == pytest.approx((g - mean) / (sd + 1e-6))
        assert np.allclose(adv[i][1][0], _shaped(base[i], (g - mean) / (sd + 1e-6), False))
        assert np.allclose(adv[i][0][0], base[i])


TINY_ARITHMETIC = [
    "env.name=arithmetic",
    "env.knobs={n_ops: 2, max_operand: 9}",
    "env.train_tasks=20",
    "env.test_tasks=1",
    "rollout.tasks_per_step=1",
    "rollout.max_new_tokens=8",
    "rollout.max_turns=2",
    "train.steps=1",
    "train.eval_samples=1",
    "train.progress=false",
]
SMALL = [
    "rollout.group_size=2",
    "rollout.tasks_per_step=2",
    "train.steps=1",
    "train.eval_samples=1",
    "env.test_tasks=2",
    "env.train_tasks=20",
    "train.progress=false",
]


@pytest.fixture(scope="module")
def mosaic_step(tiny_model_dir, tmp_path_factory):
    """One real Mosaic step under context compaction on the tiny model; its rollouts file and the trainer."""
    out = tmp_path_factory.mktemp("mosaic_log")
    path = resources.files("horizonrl") / "configs" / "mosaic_compaction_lookup.yaml"
    # The untrained tiny model never writes a parsable summary; keep_failed keeps those attempts as
    # sessions (an ablation), so the file has compaction sessions to check.
    keep = (
        "rollout.context_params={max_compactions: 3, reserve: 64, summary_max_tokens: 128, prompts: short, "
        "keep_failed: true}"
    )
    cfg = load_config(str(path), [*SMALL, keep, f"train.init={tiny_model_dir}", f"train.out_dir={out}"])
    trainer = GroupTrainer(cfg)
    trainer.train_step()
    return out / "rollouts" / "step_1.jsonl"


def test_mosaic_step_records_advantages_rows_and_side_info(mosaic_step):
    records = [json.loads(ln) for ln in mosaic_step.read_text().splitlines()]
    rollouts = list(read_jsonl(mosaic_step))  # the annotation does not disturb loading
    assert len(records) == len(rollouts) == 4
    # Rows, rebuilt independently from the loaded rollouts: [rollout][segment][turn] -> row index.
    rows = build_rows(rollouts)
    expect = [[[None] * len(s.turns) for s in r.segments] for r in rollouts]
    for k, row in enumerate(rows):
        for t in row.turns:
            expect[row.rollout_index][row.segment_index][t] = k
    assert [rec["credit"]["rows"] for rec in records] == expect
    for gi in range(0, 4, 2):  # groups of 2 in order
        recs, ros = records[gi : gi + 2], rollouts[gi : gi + 2]
        n = [len(r.segments) for r in ros]
        base = session_aware_advantage([r.reward for r in ros], n)  # the spec formula, from the file alone
        raw = [[s["ig_raw"] for s in rec["credit"]["sessions"]] for rec in recs]
        normed = normalize_session_gains(raw, [[s.kind for s in r.segments] for r in ros])
        for rec, r, b, r_norm in zip(recs, ros, base, normed, strict=True):
            c = rec["credit"]
            assert c["estimator"] == "mosaic" and c["rollout"]["N"] == len(r.segments)
            assert c["rollout"]["A_traj"] == pytest.approx(b)
            for s, (sess, seg) in enumerate(zip(c["sessions"], r.segments, strict=True)):
                assert sess["eligible"] == (sess["ig_raw"] is not None)
                assert sess["ig_norm"] == (None if r_norm[s] is None else pytest.approx(r_norm[s]))
                a_s = _shaped(b, r_norm[s], all(x.reward <= 0 for x in ros))
                for t, turn in enumerate(seg.turns):  # every token of session s carries A_{i,s}
                    vals = decode_advantages(c["advantages"][s][t], len(turn.response_ids))
                    assert np.allclose(vals, a_s)
    # Compaction sessions are recorded with their summary span.
    comp = [t for r in rollouts for s in r.segments if s.kind == "compaction" for t in s.turns]
    assert comp and all(t.spans == [Span("summary", 0, len(t.response_ids))] for t in comp if t.response_ids)


def test_save_credit_false_and_old_files_load(tiny_model_dir, tmp_path):
    overrides = [*TINY_ARITHMETIC, "rollout.group_size=2", "train.save_credit=false"]
    cfg = load_config(None, [f"model.path={tiny_model_dir}", *overrides, f"train.out_dir={tmp_path}"])
    GroupTrainer(cfg).train_step()
    lines = (tmp_path / "rollouts" / "step_1.jsonl").read_text().splitlines()
    assert lines and all("credit" not in json.loads(ln) for ln in lines)
    assert len(list(read_jsonl(tmp_path / "rollouts" / "step_1.jsonl"))) == 2


def test_grpo_log_round_trip_and_unknown_fields(tmp_path):
    ros = [
        Rollout(f"r{i}", "t", "g", [Segment(turns=[_turn(3), _turn(2, prompt=(7,))])], reward=float(i == 0))
        for i in range(3)
    ]
    adv = credit.get_estimator("grpo")([Group("g", "t", ros)])
    rows = build_rows(ros, adv)
    path = tmp_path / "step_1.jsonl"
    write_rollout_log(path, ros, credit_records(ros, adv, rows, None, estimator="grpo"))
    back = list(read_jsonl(path))
    recs = [json.loads(ln) for ln in path.read_text().splitlines()]
    a0 = (1 - 1 / 3) / (np.std([1, 0, 0], ddof=1) + 1e-6)  # GRPO by hand
    for r, rec, want in zip(back, recs, [a0, -a0 / 2, -a0 / 2], strict=True):
        got = token_advantages(r, rec["credit"])
        assert all(np.allclose(t, want) for seg in got for t in seg)
        assert (
            rec["credit"]["advantages"][0] == [float(adv[back.index(r)][0][0][0])] * 2
        )  # one number per turn
        assert rec["credit"]["rows"] == [
            [2 * back.index(r), 2 * back.index(r) + 1]
        ]  # prompts (1,2) then (7,)
        assert rollout_to_dict(r) == {k: v for k, v in rec.items() if k != "credit"}
    rec = recs[0]
    rec["shiny_new_field"] = 1
    rec["segments"][0]["turns"][0]["extra"] = 2
    path.write_text(json.dumps(rec) + "\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (r,) = read_jsonl(path)
    msgs = [str(w.message) for w in caught if w.category is UnknownFieldWarning]
    assert r.uid == "r0" and any(f"{path}:1: unknown field(s) ['shiny_new_field']" in m for m in msgs)
    assert any("segment 0 turn 0: unknown field(s) ['extra']" in m for m in msgs)


def test_rtpo_stage_records_trunk_boundary_and_sibling(tiny_model_dir, tmp_path):
    from horizonrl.train.methods.rtpo import RTPOTrainer

    overrides = [
        *TINY_ARITHMETIC,
        "rollout.tasks_per_step=2",
        "rollout.max_new_tokens=12",
        "train.trainer=rtpo",
        "train.trainer_params.siblings=3",
    ]
    cfg = load_config(None, [f"model.path={tiny_model_dir}", *overrides, f"train.out_dir={tmp_path}"])
    RTPOTrainer(cfg).fit()
    files = sorted((tmp_path / "rollouts").glob("step_*.jsonl"))
    assert files and (tmp_path / "rollouts" / "trunks_0.jsonl").is_file()
    seen = 0
    for f in files:
        recs = [json.loads(ln) for ln in f.read_text().splitlines()]
        by_boundary: dict[tuple, list] = {}
        for rec in recs:
            side = rec["credit"]["rollout"]
            assert rec["credit"]["estimator"] == "rtpo" and side["iteration"] == 0
            assert side["trunk"] == rec["branch"]["trunk_id"] and side["k"] == rec["branch"]["turn"]
            by_boundary.setdefault((side["trunk"], side["k"]), []).append(rec)
        for recs_b in by_boundary.values():
            rewards = np.array([r["reward"] for r in recs_b])
            assert sorted(r["credit"]["rollout"]["sibling"] for r in recs_b) == list(range(len(recs_b)))
            for rec, want in zip(recs_b, rewards - rewards.mean(), strict=True):  # A_j = R_j - mean_j R_j
                adv = rec["credit"]["advantages"]
                assert adv[0][0] == pytest.approx(want) and rec["credit"]["rows"][0][0] is not None
                assert all(
                    a is None for s, seg in enumerate(adv) for t, a in enumerate(seg) if (s, t) != (0, 0)
                )
                assert rec["credit"]["rollout"]["w"] == 1.0 and rec["credit"]["rollout"]["Q"] == rec["reward"]
                seen += 1
    assert seen > 0
