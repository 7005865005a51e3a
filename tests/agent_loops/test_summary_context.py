"""SUPO rolling summary (docs/spec/baselines.md "SUPO") and the helpers shared with the ECHO turn memory."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from horizonrl.agents.context import make_context, observation_ids
from horizonrl.agents.driver import run_program
from horizonrl.agents.expert import ExpertEngine
from horizonrl.agents.react import LoopLimits, episode_program, start_episode
from horizonrl.agents.summary import (
    SUMMARY_CONTINUATION,
    SUMMARY_INSTRUCTION,
    MessageContext,
    expert_finding,
    parse_summary,
    strip_thinking,
    token_boundary,
)
from horizonrl.config import from_dict
from horizonrl.credit import get_estimator
from horizonrl.envs import get_env
from horizonrl.envs.core.base import StepResult
from horizonrl.inference.base import SamplingParams
from horizonrl.models import ChatRenderer, train_tokenizer
from horizonrl.train.recipes import expert_program_rows
from horizonrl.train.warmstart.bootstrap import tokenizer_corpus
from horizonrl.trajectory import Group, Turn, build_rows

KNOBS = {"hops": 4, "n_entities": 4, "obs_facts": 6}
BUDGET, NEW = 672, 72


@pytest.fixture(scope="module")
def renderer():
    return ChatRenderer(train_tokenizer(tokenizer_corpus(seed=0), vocab_size=768, seed=0))


# ------------------------------------------------------------------------------------ helpers


def test_parse_summary():
    assert parse_summary("x <summary> A is in B.\n C </summary> y") == "A is in B. C"
    assert parse_summary("<think><summary>no</summary></think><summary>yes</summary>") == "yes"
    assert parse_summary("<summary>cut by the limit") is None
    assert parse_summary("no tags at all") is None
    assert parse_summary("<summary>  </summary>") is None
    assert parse_summary("</summary><summary>") is None


def test_strip_thinking_keeps_offsets():
    text = "a<think>bc</think>d<think>e"
    assert strip_thinking(text) == "a" + " " * 17 + "d" + " " * 8
    assert len(strip_thinking(text)) == len(text)


class _Pieces:
    """A tokenizer stub whose token ``i`` decodes to ``pieces[i]``."""

    def __init__(self, pieces):
        self.pieces = pieces

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.pieces[i] for i in ids)


def test_token_boundary_cover_and_start():
    tok = _Pieces(["ab", "cde", "f"])  # prefix lengths 0, 2, 5, 6
    ids = [0, 1, 2]
    assert [token_boundary(tok, ids, p, cover=True) for p in range(7)] == [0, 1, 1, 2, 2, 2, 3]
    assert [token_boundary(tok, ids, p, cover=False) for p in range(7)] == [0, 0, 1, 1, 1, 2, 3]
    assert token_boundary(tok, ids, 99, cover=True) == 3


def test_expert_finding():
    call = '<tool_call>{"name": "search", "arguments": {"query": "Kimu"}}</tool_call>'
    obs = "Sise works at Kimu. Kimu is in Masi. Poke works at Kimu. Kimu is in Masi."
    assert expert_finding(call, obs) == "Kimu is in Masi."
    assert expert_finding(call, "Sise works at Kimu. Felo is in Bezi.") == "Sise works at Kimu."
    assert expert_finding("no call", "First. Second.") == "First."
    assert expert_finding(call, "") == ""


def test_message_context_extends_like_the_append_loop(renderer):
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    ctx = MessageContext(renderer, None, msgs)
    prompt = ctx.ids()
    assert prompt == renderer.initial_ids(msgs)
    extra = {"role": "user", "content": "E"}
    assert ctx.ids([extra]) == renderer.initial_ids([*msgs, extra])
    response = renderer.response_ids({"role": "assistant", "content": "hi"})
    reply = StepResult(observation="obs", role="tool")
    nxt = ctx.after(prompt, response[:-1], [{"role": "tool", "content": "obs"}])  # cut: eos appended
    turn = Turn(prompt_ids=prompt, response_ids=response[:-1], logprobs=[0.0] * (len(response) - 1))

    class _Ep:
        pass

    ep = _Ep()
    ep.renderer = renderer
    assert nxt.ids() == prompt + response[:-1] + observation_ids(ep, turn, reply)
    assert nxt.ids([extra]) == nxt.head + renderer.continuation_ids(
        [{"role": "tool", "content": "obs"}, extra]
    )


# --------------------------------------------------------------------------------------- loop


class Scripted(ExpertEngine):
    """The scripted expert; ``summary_text`` replaces its summaries. Logs every prompt it is given."""

    def __init__(self, renderer, summary_text=None):
        super().__init__(renderer.tokenizer, eos_id=renderer.eos_id, seed=0, noise=0.0)
        self.episode = None
        self.summary_text = summary_text
        self.log: list[tuple[list[int], list[int]]] = []

    def generate_requests(self, requests):
        out = []
        for req in requests:
            if self.summary_text is not None and self.episode.state.get("phase") == "summary":
                req = replace(req, expert=lambda rng, noise: self.summary_text)
            gen = super().generate_requests([req])[0]
            self.log.append((list(req.prompt_ids), list(gen.ids)))
            out.append(gen)
        return out


def _run(renderer, params=None, summary_text=None, budget=BUDGET, task_index=0):
    cls = get_env("lookup")
    task = cls.make_tasks(task_index + 1, seed=0, split="train", **KNOBS)[task_index]
    ep = start_episode(cls(**KNOBS), task, renderer, uid=f"u{task_index}", group_id="g")
    manager = make_context("summary", LoopLimits(10, budget), {"summary_budget": 1024, **(params or {})})
    engine = Scripted(renderer, summary_text)
    engine.episode = ep
    rollout = run_program(engine, episode_program(ep, manager, SamplingParams(max_new_tokens=NEW)))
    return rollout, ep, engine


def test_rolling_summary_segments_and_exact_prompts(renderer):
    rollout, ep, engine = _run(renderer)
    chain = ep.env.state["chain"]
    assert rollout.success and rollout.termination == "done"
    assert [s.kind for s in rollout.segments] == ["normal", "summary", "normal"]
    assert [(t.prompt_ids, t.response_ids) for t in rollout.turns] == engine.log  # nothing unrecorded
    seg0, summ, seg1 = rollout.segments
    # The summary prompt is the working context (every turn of it, incl. the one that filled it) + x_sum.
    last = seg0.turns[-1]
    text = renderer.tokenizer.decode(summ.turns[0].prompt_ids)
    assert text.endswith(f"{SUMMARY_INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n")
    assert summ.turns[0].prompt_ids[: len(last.prompt_ids) + len(last.response_ids)] == last.prompt_ids + (
        last.response_ids
    )
    assert summ.parent == 0 and seg1.parent == 0 and [s.label for s in summ.turns[0].spans] == ["summary"]
    # The expert's summary: one finding per search of segment 0 (chain[k] links to chain[k+1]).
    n = len(seg0.turns)
    assert seg1.info["summary"] == " ".join(
        next(f"{a} {r} {b}." for a, r, b in ep.env.state["facts"] if a == chain[k]) for k in range(n)
    )
    # The next segment starts from the task messages + the summary + the continuation message.
    cont = {"role": "user", "content": f"<summary>{seg1.info['summary']}</summary>\n\n{SUMMARY_CONTINUATION}"}
    assert seg1.turns[0].prompt_ids == renderer.initial_ids([*ep.messages, cont], tools=ep.tools)
    assert [s.label for s in seg1.turns[-1].spans] == ["answer"]
    assert all([s.label for s in t.spans] == ["action"] for t in seg0.turns)
    assert rollout.env["metrics"] == {
        "tool_turns": 4.0,
        "splits": 1.0,
        "split": 1.0,
        "segments": 2.0,
        "response_length": sum(t.num_response_tokens for t in seg0.turns + seg1.turns) / 5,
        "overlong": 0.0,
    }
    rows = build_rows([rollout])
    assert len(rows) == 3 and sum(r.num_trainable for r in rows) == rollout.num_response_tokens


def test_overlong_rollouts_get_zero_supo_credit(renderer):
    over, _, _ = _run(renderer, params={"max_summaries": 0})
    assert over.termination == "overlong" and [s.kind for s in over.segments] == ["normal"]
    assert "max_summaries=0" in over.segments[0].info["overlong"] and over.env["metrics"]["overlong"] == 1.0
    win, _, _ = _run(renderer)
    lose, _, _ = _run(renderer, summary_text="<summary>nothing</summary>", task_index=0)
    lose.reward, lose.success = 0.0, False  # same protocol, failed outcome
    adv = get_estimator("supo")([Group("g", "t", [over, win, lose])])
    a = 0.5 / (math.sqrt(0.5) + 1e-6)  # GRPO over the valid rewards [1, 0] (sample std sqrt(0.5))
    assert all(not np.any(x) for seg in adv[0] for x in seg)
    assert all(np.allclose(x, a) for seg in adv[1] for x in seg)
    assert all(np.allclose(x, -a) for seg in adv[2] for x in seg)


def test_unparsable_summary_ends_overlong(renderer):
    rollout, _, _ = _run(renderer, summary_text="I found some facts.")
    assert rollout.termination == "overlong"
    assert [s.kind for s in rollout.segments] == ["normal", "summary"]
    summ = rollout.segments[1]
    assert summ.info["unparsable"] and summ.info["overlong"] == "unparsable summary"
    assert summ.turns[0].response_text == "I found some facts."


def test_summary_limit_cuts_the_block_and_is_unparsable(renderer):
    rollout, _, _ = _run(renderer, params={"summary_tokens": 6})
    summ = rollout.segments[1].turns[0]
    assert summ.truncated and summ.num_response_tokens == 6
    assert rollout.termination == "overlong" and rollout.segments[1].info["unparsable"]


def test_summary_prompt_over_its_budget_and_rebuilt_context_over_budget(renderer):
    rollout, _, _ = _run(renderer, params={"summary_budget": BUDGET})
    assert (
        rollout.termination == "overlong" and "exceeds summary_budget" in rollout.segments[0].info["overlong"]
    )
    long = "<summary>" + "Sise works at Kimu. " * 60 + "</summary>"
    params = {"summary_tokens": 600, "summary_budget": 2048}  # a scripted engine has no context limit
    rollout, _, _ = _run(renderer, params=params, summary_text=long)
    assert rollout.termination == "overlong" and "rebuilt context" in rollout.segments[1].info["overlong"]


def test_make_context_validates_parameters():
    limits = LoopLimits(6, 512)
    with pytest.raises(ValueError, match="max_summaries must be an integer >= 0, got -1"):
        make_context("summary", limits, {"max_summaries": -1})
    with pytest.raises(ValueError, match="summary_tokens must be an integer >= 1, got 0"):
        make_context("summary", limits, {"summary_tokens": 0})
    with pytest.raises(ValueError, match="summary_budget must be an integer >= 2, got 1"):
        make_context("summary", limits, {"summary_budget": 1})
    assert make_context("summary", limits, {}).summary_budget == 1024


def test_expert_program_rows_record_the_summary_protocol(renderer):
    cfg = from_dict(
        {
            "env": {"name": "lookup", "knobs": KNOBS},
            "rollout": {
                "context": "summary",
                "context_budget": BUDGET,
                "max_new_tokens": NEW,
                "max_turns": 10,
                "context_params": {"summary_budget": 1024},
            },
            "sft": {"demos": 1, "noise": 0.0},
        }
    )
    rows = expert_program_rows(cfg, renderer, renderer.tokenizer)
    rollout, _, _ = _run(renderer)
    assert [r.input_ids for r in rows] == [r.input_ids for r in build_rows([rollout])]
