"""The batched ReAct loop: recording, limits, malformed actions, rows from real rollouts."""

from __future__ import annotations

import random

import pytest

from horizonrl.agents import LoopLimits, run_episodes
from horizonrl.agents.react import start_episode
from horizonrl.envs import get_env
from horizonrl.inference.base import Engine, Generation, SamplingParams
from horizonrl.models import ChatRenderer, load_model_and_tokenizer
from horizonrl.train.rollout.collect import rollout_metrics
from horizonrl.trajectory import build_rows


class ScriptedEngine(Engine):
    """An engine whose policy is a Python function of the decoded context (e.g. the env's expert).

    It tokenizes the policy's text and appends the end-of-turn token, like a model would.
    """

    def __init__(self, tokenizer, policy):
        self.tok = tokenizer
        self.policy = policy
        self.calls = 0

    def generate(self, prompts, params):
        self.calls += 1
        out = []
        for p in prompts:
            ids = [*self.tok.encode(self.policy(p), add_special_tokens=False), self.tok.eos_token_id]
            finish = "stop"
            if len(ids) > params.max_new_tokens:
                ids, finish = ids[: params.max_new_tokens], "length"
            out.append(
                Generation(ids, [-0.5] * len(ids), self.tok.decode(ids, skip_special_tokens=True), finish)
            )
        return out

    def score(self, contexts, continuations):  # pragma: no cover - unused here
        raise NotImplementedError


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_model_and_tokenizer(tiny_model_dir)[1]


def _episodes(tok, env_name, n, **knobs):
    cls = get_env(env_name)
    tasks = cls.make_tasks(n, seed=3, split="train", **knobs)
    renderer = ChatRenderer(tok)
    eps = [start_episode(cls(**knobs), t, renderer, uid=f"u{i}", group_id="g") for i, t in enumerate(tasks)]
    return eps, renderer


@pytest.mark.parametrize("env_name", ["arithmetic", "lookup", "rooms"])
def test_expert_through_the_loop_records_exact_contexts(tok, env_name):
    eps, renderer = _episodes(tok, env_name, 4)
    rng = random.Random(0)

    def policy(ctx):
        ep = next(e for e in eps if e.context == list(ctx))
        return ep.env.expert_action(rng, noise=0.0)

    engine = ScriptedEngine(tok, policy)
    rollouts = run_episodes(engine, renderer, eps, SamplingParams(max_new_tokens=64), LoopLimits(12, 4096))
    assert all(r.success and r.reward == 1.0 and r.termination == "done" for r in rollouts)
    # One batched engine call per turn, not per episode.
    assert engine.calls == max(r.num_turns for r in rollouts)
    rows = build_rows(rollouts)
    assert len(rows) == len(rollouts)  # append-only: every segment is one row
    for row, r in zip(rows, rollouts, strict=True):
        last = r.turns[-1]
        assert row.input_ids == last.prompt_ids + last.response_ids
        # Trainable positions are exactly the response tokens, in order.
        trained = [t for t, m in zip(row.input_ids, row.trainable, strict=True) if m]
        assert trained == [x for t in r.turns for x in t.response_ids]
        for t in r.turns[:-1]:
            # The env reply was recorded and rendered into the following prompt.
            assert t.observation and t.observation in tok.decode(r.turns[-1].prompt_ids)


def test_malformed_tool_call_becomes_an_error_observation(tok):
    eps, renderer = _episodes(tok, "arithmetic", 1, n_ops=1)
    script = iter(
        ['<tool_call>{"name": "calculator", "arguments": {"expr": 3}}</tool_call>', "no idea", "<answer>0"]
    )
    engine = ScriptedEngine(tok, lambda ctx: next(script))
    (r,) = run_episodes(engine, renderer, eps, SamplingParams(max_new_tokens=64), LoopLimits(3, 4096))
    t0, t1, _ = r.turns
    assert t0.invalid and "expression" in t0.observation and t0.tool_calls == 0
    assert t1.invalid and "<answer>" in t1.observation
    assert r.termination == "done" and not r.success
    m = rollout_metrics([r])
    assert m["rollout/invalid_turn_rate"] == pytest.approx(2 / 3)


def test_max_turns_and_context_overflow_end_rollouts_and_are_counted(tok):
    think = '<tool_call>{"name": "calculator", "arguments": {"expression": "1 + 1"}}</tool_call>'
    eps, renderer = _episodes(tok, "arithmetic", 2)
    (a, b) = run_episodes(
        ScriptedEngine(tok, lambda c: think),
        renderer,
        eps,
        SamplingParams(max_new_tokens=64),
        LoopLimits(max_turns=3, context_budget=100_000),
    )
    assert a.termination == b.termination == "max_turns" and a.num_turns == 3

    eps, renderer = _episodes(tok, "arithmetic", 1)
    start = len(eps[0].context)
    budget = start + 3 * 64  # room for about three turns of this policy
    (r,) = run_episodes(
        ScriptedEngine(tok, lambda c: think),
        renderer,
        eps,
        SamplingParams(max_new_tokens=64),
        LoopLimits(50, budget, overflow="fail"),
    )
    assert r.termination == "context" and 1 <= r.num_turns < 50
    assert all(len(t.prompt_ids) + 64 <= budget for t in r.turns)
    assert rollout_metrics([r])["rollout/context_overflow_rate"] == 1.0
    fail_turns = r.num_turns

    eps, renderer = _episodes(tok, "arithmetic", 1)
    (r,) = run_episodes(
        ScriptedEngine(tok, lambda c: think),
        renderer,
        eps,
        SamplingParams(max_new_tokens=64),
        LoopLimits(50, budget, overflow="truncate"),
    )
    # truncate: turns keep coming with a shortened generation budget until nothing fits.
    assert r.termination == "context" and r.num_turns > fail_turns
    assert any(len(t.prompt_ids) + 64 > budget for t in r.turns)
    assert all(len(t.prompt_ids) + len(t.response_ids) <= budget for t in r.turns)


def test_loop_limits_validation():
    with pytest.raises(ValueError, match="overflow"):
        LoopLimits(overflow="explode")


def test_numeric_env_metrics_reach_the_turn():
    """``apply_result`` keeps the finite numbers of ``env_metrics`` (hub rubrics) and nothing else."""
    from horizonrl.agents.react import apply_result
    from horizonrl.envs.core.base import StepResult
    from horizonrl.trajectory import Turn

    turn = Turn(prompt_ids=[1], response_ids=[2], logprobs=[0.0])
    metrics = {"correct": 1, "numeric": 0.2, "note": "text", "bad": float("nan"), "flag": True}
    apply_result(turn, StepResult("x", reward=1.2, done=True, info={"env_metrics": metrics, "other": 1}))
    assert turn.info == {"env_metrics": {"correct": 1.0, "numeric": 0.2, "flag": 1.0}} and turn.reward == 1.2
