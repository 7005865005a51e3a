"""Conditioning maps psi (RTPO): exact contexts, flat-history reconstruction, boundary restore."""

from __future__ import annotations

import random

import pytest
from transformers import AutoTokenizer

from horizonrl.agents import LoopLimits, make_context, run_episodes, start_episode
from horizonrl.agents.driver import drive
from horizonrl.agents.psi import (
    PROGRESS_HEADER,
    SUMMARY_SYSTEM,
    BoundaryRecorder,
    extract_summary,
    flat_prompts,
    resume_episode,
    strip_think,
)
from horizonrl.agents.react import episode_program
from horizonrl.envs.builtin.arithmetic import CALCULATOR, ArithmeticEnv
from horizonrl.inference.base import Engine, Generation, SamplingParams
from horizonrl.models import ChatRenderer
from horizonrl.trajectory import build_rows

pytestmark = pytest.mark.usefixtures("one_thread")

LIMITS = LoopLimits(max_turns=4, context_budget=4096)
PARAMS = SamplingParams(max_new_tokens=200)
KNOBS = {"n_ops": 2, "max_operand": 9}


class ScriptEngine(Engine):
    """Answers agent turns with scripted texts in order, summary requests with ``note <i>``."""

    def __init__(self, tok, eos_id: int, actions: list[str], notes: int = 0):
        self.tok, self.eos, self.actions, self.notes = tok, eos_id, list(actions), notes

    def generate(self, prompts, params):
        out = []
        for p in prompts:
            if SUMMARY_SYSTEM in self.tok.decode(p):
                self.notes += 1
                text = f"note {self.notes}"
            else:
                text = self.actions.pop(0)
            ids = [*self.tok.encode(text, add_special_tokens=False), self.eos]
            out.append(Generation(ids, [0.0] * len(ids), text, "stop"))
        return out

    def score(self, contexts, continuations):
        raise NotImplementedError


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))


@pytest.fixture(scope="module")
def task():
    return ArithmeticEnv(**KNOBS).tasks(1, seed=3)[0]


def expert_actions(task, think: bool = False) -> list[str]:
    """The noiseless expert's messages for ``task`` (two calculator calls, then the answer)."""
    env = ArithmeticEnv(**KNOBS)
    env.reset(task)
    out = []
    while True:
        a = env.expert_action(random.Random(0))
        out.append(f"<think>secret {len(out)}</think>{a}" if think else a)
        if env.step(a).done:
            return out


def run(renderer, task, context: str, actions: list[str], **params):
    ep = start_episode(ArithmeticEnv(**KNOBS), task, renderer, uid="r", group_id="g")
    engine = ScriptEngine(renderer.tokenizer, renderer.eos_id, actions)
    return run_episodes(engine, renderer, [ep], PARAMS, LIMITS, context=context, context_params=params)[0]


def test_identity_is_append_token_for_token_and_is_its_own_flat_history(renderer, task):
    actions = expert_actions(task)
    a = run(renderer, task, "append", actions)
    b = run(renderer, task, "identity", actions)
    assert a.success and b.success and len(b.turns) == 3
    assert [t.prompt_ids for t in a.turns] == [t.prompt_ids for t in b.turns]
    assert flat_prompts(b.turns, renderer) == [t.prompt_ids for t in a.turns]


def test_window_keeps_the_task_and_the_last_n_turns(renderer, task):
    actions = expert_actions(task)
    full = run(renderer, task, "append", actions)
    w1 = run(renderer, task, "window", actions, n=1)
    w0 = run(renderer, task, "window", actions, n=0)
    base = full.turns[0].prompt_ids
    t1 = full.turns[1]
    # Turn 2 under window(1): the task prompt + turn 1's response and observation (turn 0 dropped).
    block1 = full.turns[2].prompt_ids[len(t1.prompt_ids) :]
    assert block1[: len(t1.response_ids)] == t1.response_ids
    assert w1.turns[2].prompt_ids == base + block1
    assert all(t.prompt_ids == base for t in w0.turns)
    assert [t.prompt_ids for t in run(renderer, task, "window", actions, n=9).turns] == [
        t.prompt_ids for t in full.turns
    ]
    with pytest.raises(ValueError, match=r"window\.n"):
        make_context("window", LIMITS, {"n": -1})


def test_strip_think_removes_earlier_think_blocks_only(renderer, task):
    r = run(renderer, task, "strip_think", expert_actions(task, think=True))
    last = renderer.tokenizer.decode(r.turns[2].prompt_ids)
    assert "secret" not in last and last.count("calculator") >= 2
    kept = run(renderer, task, "strip_think", expert_actions(task, think=True), keep_last=1)
    text = renderer.tokenizer.decode(kept.turns[2].prompt_ids)
    assert "secret 1" in text and "secret 0" not in text
    # Without think blocks the map is the identity.
    plain = expert_actions(task)
    assert [t.prompt_ids for t in run(renderer, task, "strip_think", plain).turns] == [
        t.prompt_ids for t in run(renderer, task, "append", plain).turns
    ]
    assert strip_think("<think>a</think> b <think>open") == "b"


def test_turn_summary_hides_the_history_and_the_recorded_context_is_what_is_trained(renderer, task):
    actions = expert_actions(task)
    r = run(renderer, task, "turn_summary", actions)
    full = run(renderer, task, "append", actions)
    assert r.success
    text = renderer.tokenizer.decode(r.turns[2].prompt_ids)
    want = [extract_summary(actions[i], full.turns[i].observation, [CALCULATOR]) for i in range(2)]
    assert f"{PROGRESS_HEADER}\n1. {want[0]}\n2. {want[1]}" in text
    assert "<tool_call>" not in text.split(PROGRESS_HEADER)[1]  # raw calls never re-enter the context
    # Each turn is its own training row, conditioned on exactly the recorded context.
    rows = build_rows([r])
    assert len(rows) == 3
    for row, turn in zip(rows, r.turns, strict=True):
        assert row.input_ids == turn.prompt_ids + turn.response_ids
        assert sum(row.trainable) == len(turn.response_ids)
    # The flat history rebuilt from the summary rollout is the append-only context.
    assert flat_prompts(r.turns, renderer) == [t.prompt_ids for t in full.turns]


def test_extract_summary_format():
    call = '{"name": "calculator", "arguments": {"expression": "2 + 3"}}'
    text = f"<think>hmm</think>ok <tool_call>{call}</tool_call>"
    assert extract_summary(text, "5\n", [CALCULATOR]) == "calculator(2 + 3) -> 5"
    assert extract_summary("no call", "x" * 50, [CALCULATOR], obs_chars=4) == "no valid tool call -> xxxx"
    with pytest.raises(ValueError, match="summarizer"):
        make_context("turn_summary", LIMITS, {"summarizer": "llm"})


def test_policy_summaries_are_summary_sessions_and_feed_the_next_context(renderer, task):
    r = run(renderer, task, "turn_summary", expert_actions(task), summarizer="policy")
    assert r.success and [s.kind for s in r.segments] == ["normal", "summary", "summary"]
    assert [(s.parent, s.fork_index) for s in r.segments[1:]] == [(0, 0), (0, 1)]
    assert all(len(s.turns) == 1 for s in r.segments[1:])
    text = renderer.tokenizer.decode(r.segments[0].turns[2].prompt_ids)
    assert "1. note 1\n2. note 2" in text


@pytest.mark.parametrize(
    "context,params", [("append", {}), ("window", {"n": 1}), ("turn_summary", {"summarizer": "policy"})]
)
def test_a_sibling_resumed_from_a_boundary_replays_the_trunk(renderer, task, context, params):
    actions = expert_actions(task)
    boundaries = []
    env = ArithmeticEnv(**KNOBS)
    ep = start_episode(env, task, renderer, uid="trunk", group_id="g")
    manager = BoundaryRecorder(make_context(context, LIMITS, params), boundaries)
    engine = ScriptEngine(renderer.tokenizer, renderer.eos_id, actions)
    trunk = drive(engine, [episode_program(ep, manager, PARAMS)])[0]
    agent = trunk.segments[0].turns
    assert [b.turn for b in boundaries] == [0, 1, 2]
    assert [b.context for b in boundaries] == [t.prompt_ids for t in agent]
    for b in boundaries:
        sib_ep = resume_episode(b, ArithmeticEnv(**KNOBS), task, renderer, uid=f"s{b.turn}")
        sib_manager = BoundaryRecorder(make_context(context, LIMITS, params), None, resume=True)
        engine = ScriptEngine(renderer.tokenizer, renderer.eos_id, actions[b.turn :], notes=b.turn)
        sib = drive(engine, [episode_program(sib_ep, sib_manager, PARAMS)])[0]
        assert sib.branch.trunk_id == "trunk" and sib.branch.turn == b.turn
        assert [t.prompt_ids for t in sib.segments[0].turns] == [t.prompt_ids for t in agent[b.turn :]]
        assert [t.observation for t in sib.segments[0].turns] == [t.observation for t in agent[b.turn :]]
        assert sib.success and sib.reward == trunk.reward
