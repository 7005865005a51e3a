"""Regime-check helpers: spread and mixed-group rates by hand, and the warm start's own groups."""

from __future__ import annotations

import pytest

from helpers.shaped_env import arith_run_config
from horizonrl.reproduce.checks import (
    mixed_group_rate,
    multi_turn_warm_checks,
    policy_groups,
    session_spread_rate,
    tool_calls_per_episode,
)
from horizonrl.trajectory import Group, Rollout, Segment, Turn


def _group(*rollouts: tuple[int, bool]) -> Group:
    """A group of rollouts given as (session count, success)."""
    g = Group(group_id="g", task_id="t")
    for i, (n, ok) in enumerate(rollouts):
        g.rollouts.append(Rollout(f"r{i}", "t", "g", [Segment() for _ in range(n)], float(ok), ok))
    return g


def test_session_spread_counts_outcome_subgroups_by_hand():
    # Group 1: successes {1, 2} sessions (spread), failures {3, 3} (none) -> 2 subgroups, 1 spread.
    # Group 2: successes {2} (a single rollout: not a subgroup), failures {1, 3, 1} (spread).
    # Group 3: every rollout 3 sessions, all failures: one subgroup, no spread.
    groups = [
        _group((1, True), (2, True), (3, False), (3, False)),
        _group((2, True), (1, False), (3, False), (1, False)),
        _group((3, False), (3, False)),
    ]
    assert session_spread_rate(groups) == pytest.approx(2 / 4)
    assert mixed_group_rate(groups) == pytest.approx(2 / 3)
    # The round-3 forking warm start: two subagents (3 sessions) in every rollout -> no spread at all.
    assert session_spread_rate([_group((3, True), (3, False), (3, True), (3, False))]) == 0.0


def test_tool_calls_per_episode_by_hand():
    def rollout(uid, *calls):  # one turn per entry, with that many tool calls
        turns = [Turn(prompt_ids=[1], response_ids=[2], logprobs=[0.0], tool_calls=c) for c in calls]
        return Rollout(uid, "t", "g", [Segment(turns=turns)])

    # episodes of 1 + 1 + 0 = 2, 1 + 1 + 1 + 0 = 3 and 4 calls (two segments): mean 3
    g = Group("g", "t", [rollout("a", 1, 1, 0), rollout("b", 1, 1, 1, 0)])
    g.rollouts.append(
        Rollout("c", "t", "g", [Segment(turns=rollout("x", 2).turns), Segment(turns=rollout("y", 2).turns)])
    )
    assert tool_calls_per_episode([g]) == pytest.approx(3.0)
    assert tool_calls_per_episode([]) == 0.0


def test_multi_turn_warm_checks_gate_on_tool_calls(tiny_model_dir, tmp_path):
    cfg = arith_run_config(tiny_model_dir, tmp_path, "rollout.temperature=1.0")
    rows = multi_turn_warm_checks(cfg, tiny_model_dir, n_tasks=2, min_calls=0.0)
    groups = policy_groups(cfg, tiny_model_dir, n_tasks=2)  # the same seeded draws
    calls, success = rows[0], rows[1]
    assert calls["name"] == "warm start: tool calls per episode" and calls["gate"] and calls["ok"]
    assert calls["value"] == pytest.approx(round(tool_calls_per_episode(groups), 3))
    assert success["value"] == pytest.approx(round(sum(r.success for g in groups for r in g.rollouts) / 8, 3))
    # a gate above what the policy does fails the row (and so refuses RL like the pass@1 gate)
    assert not multi_turn_warm_checks(cfg, tiny_model_dir, n_tasks=2, min_calls=99.0)[0]["ok"]


def test_policy_groups_are_the_models_own_groups_on_training_tasks(tiny_model_dir, tmp_path):
    from horizonrl.train.recipes import evaluate_model
    from horizonrl.train.rollout.env_setup import env_setup

    cfg = arith_run_config(tiny_model_dir, tmp_path, "rollout.temperature=1.0")
    groups = policy_groups(cfg, tiny_model_dir, n_tasks=3, group_size=2)
    train = env_setup(cfg.env).tasks(3, seed=cfg.env.seed, split="train")
    assert [g.task_id for g in groups] == [t.id for t in train]
    assert [len(g.rollouts) for g in groups] == [2, 2, 2]
    # The same call's pass@1 is the groups' success rate (what the gate reads and what the checks read).
    got: list = []
    m = evaluate_model(
        cfg, tiny_model_dir, split="train", n_tasks=3, samples=2, temperature=1.0, groups_out=got
    )
    rate = sum(r.success for g in got for r in g.rollouts) / 6
    assert m["eval/pass@1"] == pytest.approx(rate)
    assert [[r.final_answer for r in g.rollouts] for g in got] == [
        [r.final_answer for r in g.rollouts] for g in groups
    ]  # seeded by train.eval_seed: the same draws twice
