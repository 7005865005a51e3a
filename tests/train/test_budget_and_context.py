"""Token budgets are never overshot; flattened-history training and recomputed pi_old."""

from __future__ import annotations

import dataclasses
import math

import pytest

from horizonrl.agents.psi import flat_prompts
from horizonrl.config import load_config
from horizonrl.inference import HFEngine, SamplingParams
from horizonrl.models import load_model_and_tokenizer
from horizonrl.train.rollout.budget import BudgetedEngine, TokenBudget
from horizonrl.train.trainers.group import GroupTrainer
from horizonrl.train.update.ppo import ppo_update
from horizonrl.trajectory import build_rows


def test_budgeted_engine_clips_to_what_is_left_and_never_overshoots(tiny_model_dir):
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    budget = TokenBudget(limit=50)
    engine = BudgetedEngine(HFEngine(model, tok, seed=0), budget)
    prompts = [tok.encode("hello", add_special_tokens=False)] * 4
    params = SamplingParams(max_new_tokens=8)
    spent = []
    for _ in range(6):  # 4 x 8 = 32 worst case per call: the second call is clipped, later ones empty
        gens = engine.generate(prompts, params)
        assert len(gens) == 4
        spent.append(budget.spent)
        assert budget.spent <= 50
    assert budget.clipped and spent[-1] <= 50 and spent[0] <= 32
    assert all(len(g.ids) == 0 for g in engine.generate(prompts, params)) or budget.left > 0


def test_phase_prediction_uses_the_largest_cost_per_rollout_seen():
    b = TokenBudget(limit=1000)
    assert b.affordable("step", 10)  # nothing seen yet: the first phase of a kind always starts
    b.spent = 600
    b.record_phase("step", 10, 300)  # 30 tokens per rollout
    assert b.affordable("step", 10) and not b.affordable("step", 14)  # 600 + 14 x 30 = 1020 > 1000
    b.record_phase("step", 10, 200)  # a cheaper phase does not lower the prediction
    assert b.per_rollout["step"] == 30
    assert TokenBudget().affordable("step", 10**9)  # no limit


def test_a_run_ends_within_the_token_budget(tiny_model_dir, tmp_path):
    cfg = load_config(
        None,
        [
            "env.name=arithmetic",
            "env.knobs={n_ops: 2, max_operand: 9}",
            "env.train_tasks=20",
            "env.test_tasks=2",
            "rollout.group_size=2",
            "rollout.tasks_per_step=2",
            "rollout.max_new_tokens=12",
            "rollout.max_turns=2",
            "train.steps=50",
            "train.max_gen_tokens=300",
            "train.eval_samples=1",
            "train.progress=false",
            "train.save_rollouts=false",
            f"train.init={tiny_model_dir}",
            f"train.out_dir={tmp_path}",
        ],
    )
    t = GroupTrainer(cfg)
    records = t.fit()
    assert t.budget.spent <= 300 and t.step < 50
    assert records[-1]["budget/gen_tokens"] == t.budget.spent
    assert "eval/pass@1" in records[-1]  # the run ended with its evaluation


TURN_SUMMARY = [
    "env.name=arithmetic",
    "env.knobs={n_ops: 2, max_operand: 9, ops: '+-'}",
    "env.train_tasks=20",
    "env.test_tasks=1",
    "rollout.group_size=4",
    "rollout.tasks_per_step=2",
    "rollout.max_new_tokens=24",
    "rollout.max_turns=3",
    "rollout.context=turn_summary",
    "rollout.context_params={summarizer: extract, obs_chars: 40}",
    "train.steps=1",
    "train.eval_at_start=false",
    "train.eval_samples=1",
    "train.progress=false",
    "train.save_rollouts=false",
]


def test_flat_history_rows_train_each_turn_under_its_full_history(tiny_model_dir, tmp_path):
    cfg = load_config(None, [*TURN_SUMMARY, f"train.init={tiny_model_dir}", f"train.out_dir={tmp_path}",
                             "algo.train_context=flat"])  # fmt: skip
    t = GroupTrainer(cfg)
    groups = t.collect(t.train_tasks[:2])
    rollouts = [r for g in groups for r in g.rollouts]
    multi = [r for r in rollouts if len(r.segments[0].turns) > 1]
    assert multi, "the tiny model should take more than one turn in some rollout"
    flat_rows = t.training_rows(rollouts, None)
    exact_rows = build_rows(rollouts)
    for r in multi:
        ri = rollouts.index(r)
        turns = r.segments[0].turns
        # Under psi = turn_summary the sampled contexts break (one row per turn) ...
        assert sum(row.rollout_index == ri for row in exact_rows) == len(turns)
        # ... while the flat history extends turn by turn: one row, S_k = the concatenated full history.
        (row,) = [row for row in flat_rows if row.rollout_index == ri]
        expect = flat_prompts(turns, t.renderer)
        assert row.input_ids[: len(expect[-1])] == expect[-1]
        assert expect[1] != turns[1].prompt_ids  # c_1 = psi(S_1) differs from S_1
        # pi_old is still the rollout's log-probs (recorded under c_k): the paper's flattened GRPO.
        trained = [lp for lp, m in zip(row.old_logprobs, row.trainable, strict=True) if m]
        assert trained == [lp for turn in turns for lp in turn.logprobs]


def test_recomputed_old_logprobs_recentre_ppo_and_keep_the_rollout_ratio_metric(tiny_model_dir, tmp_path):
    cfg = load_config(None, [*TURN_SUMMARY, f"train.init={tiny_model_dir}", f"train.out_dir={tmp_path}"])
    t = GroupTrainer(cfg)
    rows = build_rows([r for g in t.collect(t.train_tasks[:2]) for r in g.rollouts])
    for row in rows:  # pretend a second engine sampled them: rollout log-probs off by 0.5 nats
        row.old_logprobs = [
            lp - 0.5 if m else lp for lp, m in zip(row.old_logprobs, row.trainable, strict=True)
        ]
        row.advantages = [1.0 if m else 0.0 for m in row.trainable]
    settings = dataclasses.replace(t.update_settings, old_logprobs="recompute")
    m = ppo_update(t.model, t.optimizer, None, rows, settings, generator=t.shuffle_gen, device=t.device)
    assert m["train/ratio_geomean"] == pytest.approx(math.exp(0.5), rel=1e-3)  # measured against the rollout
    assert m["train/clipfrac"] == 0.0  # PPO's ratio is against the recomputed pi_old: 1, nothing clipped
    t2 = GroupTrainer(cfg)
    m2 = ppo_update(t2.model, t2.optimizer, None, rows, t2.update_settings, generator=t2.shuffle_gen,
                    device=t2.device)  # fmt: skip
    assert m2["train/clipfrac"] > 0.5  # against the shifted rollout log-probs the ratio is e^0.5: clipped
