"""Regime-check helpers: spread and mixed-group rates by hand, and the warm start's own groups."""

from __future__ import annotations

import pytest

from horizonrl.config import load_config
from horizonrl.reproduce.checks import mixed_group_rate, policy_groups, session_spread_rate
from horizonrl.trajectory import Group, Rollout, Segment
from shaped_env import arith_run_overrides


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


def test_policy_groups_are_the_models_own_groups_on_training_tasks(tiny_model_dir, tmp_path):
    from horizonrl.train.recipes import evaluate_model
    from horizonrl.train.rollout.env_setup import env_setup

    cfg = load_config(None, arith_run_overrides(tiny_model_dir, tmp_path, "rollout.temperature=1.0"))
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
