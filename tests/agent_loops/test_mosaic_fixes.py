"""Mosaic's sessions and information-gain inputs: a session's h+ is its final context and chains into the
compaction, an empty trailing session is no session, the probe scores exactly the answer tokens the policy
writes, recomputed log-probs use the turn's temperature, and forked children get their own h+ when asked."""

from __future__ import annotations

import torch

from helpers.mosaic_loops import forker, run_lookup
from horizonrl.agents.compaction import FORCED_ANSWER_MESSAGE
from horizonrl.agents.context import finish
from horizonrl.agents.react import start_episode
from horizonrl.envs import get_env
from horizonrl.envs.core.tools import format_answer, format_tool_call
from horizonrl.inference import HFEngine, SamplingParams
from horizonrl.models import ChatRenderer, load_model_and_tokenizer
from horizonrl.train.methods.info_gain import PROBE, probe_split, session_contexts
from horizonrl.train.update.batching import collate, token_logprobs
from horizonrl.trajectory import Rollout, Segment, Turn, build_rows


def _summarizer(ctx, task):
    if "<session_history>" in ctx:
        return "<summary>Evidence found.</summary>"
    if FORCED_ANSWER_MESSAGE in ctx:
        return format_answer(task.answer)
    return format_tool_call("search", {"query": task.meta["chain"][0]})


def test_normal_session_h_plus_is_its_final_context_and_chains_into_the_compaction(tiny_model_dir):
    _, tok = load_model_and_tokenizer(tiny_model_dir)
    r, *_ = run_lookup(tok, _summarizer, cparams={"max_compactions": 2})
    kinds = [s.kind for s in r.segments]
    assert kinds[:3] == ["normal", "compaction", "normal"]
    normal, comp = r.segments[0], r.segments[1]
    # h+ of the normal session is exactly the compaction's h- (the gains chain) ...
    assert normal.info["h_plus"] == comp.info["h_minus"]
    assert session_contexts(normal) == (normal.turns[0].prompt_ids, comp.info["h_minus"])
    # ... and includes the session's last tool response, which prompt + response does not.
    last = normal.turns[-1]
    assert len(normal.info["h_plus"]) > len(last.prompt_ids) + len(last.response_ids)
    assert "<tool_response>" in tok.decode(
        normal.info["h_plus"][len(last.prompt_ids) + len(last.response_ids) :]
    )


def test_an_empty_trailing_session_is_not_a_session(tiny_model_dir):
    _, tok = load_model_and_tokenizer(tiny_model_dir)

    def never_answer(ctx, task):
        if "<session_history>" in ctx:
            return "<summary>Evidence found.</summary>"
        return format_tool_call("search", {"query": task.meta["chain"][0]})

    # The review's case: max_turns=5 gave [normal(4 turns), compaction, normal(0 turns)], N = 3.
    for turns in (2, 3, 4, 5, 6):
        r, *_ = run_lookup(tok, never_answer, cparams={"max_compactions": 3}, turns=turns)
        assert all(s.turns for s in r.segments if s.kind == "normal"), (
            turns,
            [len(s.turns) for s in r.segments],
        )
    # And whatever opens a session right before the episode ends, finish() does not leave it behind.
    env = get_env("lookup")(hops=2)
    ep = start_episode(env, env.make_tasks(1, seed=0, hops=2)[0], ChatRenderer(tok), uid="u", group_id="g")
    ep.segment.turns.append(Turn([1], [2], [0.0]))
    ep.new_segment("compaction", parent=0).turns.append(Turn([3], [4], [0.0]))
    ep.segment = ep.new_segment("normal", parent=1)
    finish(ep, "max_turns")
    assert [s.kind for s in ep.rollout.segments] == ["normal", "compaction"]


def test_probe_scores_exactly_the_answer_tokens_the_policy_writes(tiny_model_dir):
    _, tok = load_model_and_tokenizer(tiny_model_dir)
    for answer in ("Rile", "Vosa", "Kibe Tamo", "42"):
        probe, ans = probe_split(tok, answer)
        assert tok.decode(probe + ans) == PROBE + answer
        # What the policy writes for the answer: the tokens between <answer> and </answer>.
        written = tok.encode(format_answer(answer), add_special_tokens=False)
        opening = tok.encode("<answer>", add_special_tokens=False)
        closing = tok.encode("</answer>", add_special_tokens=False)
        assert written[: len(opening)] == opening and written[-len(closing) :] == closing
        assert ans == written[len(opening) : -len(closing)]
        assert probe[-len(opening) :] == opening  # no stray space token before the answer


def test_turn_temperature_is_used_when_log_probs_are_recomputed(tiny_model_dir):
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    engine = HFEngine(model, tok, seed=3)
    prompt = tok.encode(
        "<|im_start|>user\nsummarize<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    turns = []
    for temp in (0.1, 1.0):
        (gen,) = engine.generate([prompt], SamplingParams(temperature=temp, max_new_tokens=12))
        turns.append(Turn(prompt, gen.ids, gen.logprobs, temperature=temp))
    # Two sessions sampled at 0.1 (a compaction summary) and at 1.0; the run's default temperature is 1.0.
    rollout = Rollout("r", "t", "g", [Segment("compaction", [turns[0]]), Segment("normal", [turns[1]])])
    rows = build_rows([rollout], temperature=1.0)
    batch = collate(rows, pad_id=tok.pad_token_id or 0)
    with torch.no_grad():
        lp = token_logprobs(model, batch)
    for b, turn in enumerate(turns):
        got = lp[b][batch.mask[b].bool()]
        assert torch.allclose(got, torch.tensor(turn.logprobs), atol=1e-4), (
            turn.temperature,
            got,
            turn.logprobs,
        )
    assert rows[0].temperatures[-1] == 0.1 and rows[1].temperatures[-1] == 1.0
    # One temperature for every row (what the trainer did before) makes the 0.1-sampled tokens disagree.
    flat = Turn(prompt, turns[0].response_ids, turns[0].logprobs)  # temperature not recorded -> 1.0
    wrong = collate(build_rows([Rollout("r", "t", "g", [Segment(turns=[flat])])]), pad_id=0)
    with torch.no_grad():
        lp1 = token_logprobs(model, wrong)[0][wrong.mask[0].bool()]
    assert (lp1 - torch.tensor(turns[0].logprobs)).abs().max() > 1e-2


def test_fork_children_get_their_own_h_plus_when_asked(tiny_model_dir):
    _, tok = load_model_and_tokenizer(tiny_model_dir)
    shared, *_ = run_lookup(
        tok, forker(2), agent="fork", context="append", aparams={"prompts": "short"}, budget=1400
    )
    own, *_ = run_lookup(
        tok,
        forker(2),
        agent="fork",
        context="append",
        aparams={"prompts": "short", "child_h_plus": "own"},
        budget=1400,
    )
    kids = [[s for s in r.segments if s.kind == "subagent"] for r in (shared, own)]
    assert len(kids[0]) == len(kids[1]) == 2
    # B.1 literally: siblings of one call share (h-, h+); with "own" each h+ holds only its own result.
    assert kids[0][0].info["h_plus"] == kids[0][1].info["h_plus"]
    assert kids[1][0].info["h_plus"] != kids[1][1].info["h_plus"]
    assert all(k.info["h_minus"] == kids[1][0].info["h_minus"] for k in kids[1])
    for k in kids[1]:  # a prefix of the shared one up to the results, then fewer result tokens
        assert len(k.info["h_plus"]) < len(kids[0][0].info["h_plus"])
