"""The reverse-turn trainers (RTPO, SeeUPO) on the tiny model."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from helpers.shaped_env import rtpo_run_config
from horizonrl.config import ConfigError
from horizonrl.train.methods.rtpo import RTPOTrainer, agent_turns, downstream_turns
from horizonrl.train.methods.seeupo import SeeUPOTrainer
from horizonrl.train.records.metrics import read_metrics
from horizonrl.train.trainers.group import NONDETERMINISTIC_KEYS
from horizonrl.train.update.ppo import consistency_metrics
from horizonrl.trajectory import read_jsonl

pytestmark = pytest.mark.usefixtures("one_thread")


def _rigged(trainer):
    """Trunks get reward 1; sibling 0 of every boundary gets 1, the others 0 (so A = [+1/2, -1/2])."""
    original = trainer.run_programs

    def run(made, kind="stage"):
        out = original(made, kind)
        for r in out:
            r.reward = 1.0 if r.branch is None or r.uid.endswith("-0") else 0.0
        return out

    trainer.run_programs = run
    return trainer


def test_two_siblings_are_refused_as_degenerate(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"train\.trainer_params\.siblings=2 is degenerate"):
        RTPOTrainer(rtpo_run_config(tiny_model_dir, tmp_path, "train.trainer_params.siblings=2"))


def test_trunk_never_enters_the_baseline_and_only_turn_k_tokens_get_gradient(tiny_model_dir, tmp_path):
    # The hooks read padded rows: the plain path (tests/update/test_prefix_training.py checks sharing
    # against it).
    t = _rigged(
        RTPOTrainer(
            rtpo_run_config(
                tiny_model_dir, tmp_path, "algo.micro_batch_tokens=100000", "algo.tree_training=off"
            )
        )
    )
    t.sync_engine()
    t.sweep = t.begin_sweep([0, 1])
    k = t.sweep.stages[0]
    batch = t.stage_batch(k)
    trunks = set(t.sweep.data["trunks"])
    n_groups = sum(b.turn == k for b in t.sweep.data["boundaries"])
    assert len(batch["rollouts"]) == len(batch["rows"]) == 2 * n_groups
    for (b, sibs), q in zip(batch["groups"], batch["reward_sets"], strict=True):
        assert b.trunk in trunks and all(s.uid not in trunks and s.branch.trunk_id == b.trunk for s in sibs)
        assert list(q) == [1.0, 0.0]  # V_k = 1/2 over the siblings; with the trunk (R = 1) it would be 2/3
    for row, sib in zip(batch["rows"], batch["rollouts"], strict=True):
        turn = agent_turns(sib)[0]
        adv = [a for a, m in zip(row.advantages, row.trainable, strict=True) if m]
        assert adv == [0.5 if sib.uid.endswith("-0") else -0.5] * len(turn.response_ids)
        # The row is c_k + the turn-k response: no downstream turn, no trunk token.
        assert row.input_ids == turn.prompt_ids + turn.response_ids
        assert row.trainable == [False] * len(turn.prompt_ids) + [True] * len(turn.response_ids)

    # Gradient reaches the log-prob of a position iff it predicts a turn-k response token.
    model = t.model
    seen, grads = [], []

    def pre(_module, _args, kwargs):
        if torch.is_grad_enabled():
            seen.append(kwargs["input_ids"].clone())

    def post(_module, _inp, out):
        if out.requires_grad:
            out.register_hook(lambda g: grads.append(g.detach().clone()))

    hooks = [
        model.register_forward_pre_hook(pre, with_kwargs=True),
        model.get_output_embeddings().register_forward_hook(post),
    ]
    try:
        t.update(batch["rows"])
    finally:
        for h in hooks:
            h.remove()
    assert len(seen) == len(grads) == 1
    ids, grad = seen[0], grads[0]
    for b in range(ids.shape[0]):
        tokens = ids[b].tolist()
        row = next(r for r in batch["rows"] if tokens[: len(r)] == r.input_ids)
        has_grad = (grad[b].abs().sum(-1) > 0).tolist()
        # Logits at position p predict token p + 1; the last position predicts nothing.
        predicts_response = [bool(x) for x in row.trainable[1:]] + [False] * (len(tokens) - len(row) + 1)
        assert has_grad == predicts_response


def test_on_policy_weight_is_exactly_one_and_the_measured_weight_agrees(tiny_model_dir, tmp_path):
    t = RTPOTrainer(rtpo_run_config(tiny_model_dir, tmp_path, "train.trainer_params.weight_high=100.0"))
    t.sync_engine()
    t.sweep = t.begin_sweep([0, 1])
    k = min(t.sweep.stages)
    batch = t.stage_batch(k)
    assert batch["fresh"] and batch["weights"] == [1.0] * len(batch["rollouts"])
    down = [downstream_turns(s, k, k) for s in batch["rollouts"]]
    assert any(down)
    measured = t.trajectory_weights(down)
    assert all(abs(math.log(w)) < 1e-3 for w in measured), measured


def test_off_policy_weights_are_the_clamped_downstream_ratio(tiny_model_dir, tmp_path):
    lo, hi = 0.999, 1.0
    cfg = rtpo_run_config(
        tiny_model_dir,
        tmp_path,
        "train.trainer_params.off_policy=true",
        f"train.trainer_params.weight_low={lo}",
        f"train.trainer_params.weight_high={hi}",
        "optim.lr=0.05",
        "train.save_rollouts=false",
    )
    t = _rigged(RTPOTrainer(cfg))
    t.sync_engine()
    t.sweep = t.begin_sweep([0, 1])
    assert len(t.sweep.stages) >= 2
    budget = (t.budget.spent, t.budget.rollouts)
    t.update(t.stage_batch(t.sweep.stages.pop(0))["rows"])  # changes theta away from theta_0
    k = t.sweep.stages[0]
    batch = t.stage_batch(k)
    assert (
        t.budget.spent,
        t.budget.rollouts,
    ) == budget  # reused continuations: nothing generated after phase 1
    assert not batch["fresh"]
    raw = []
    for sib in batch["rollouts"]:
        turns = downstream_turns(sib, k, k)
        new = t.engine.score([x.prompt_ids for x in turns], [x.response_ids for x in turns])  # shared model
        raw.append(
            math.exp(sum(float(np.sum(n) - np.sum(x.logprobs)) for n, x in zip(new, turns, strict=True)))
        )
    want = [min(max(w, lo), hi) for w in raw]
    assert np.allclose(batch["weights"], want, rtol=0, atol=2e-4)
    assert all(lo <= w <= hi for w in batch["weights"])
    assert any(w < lo or w > hi for w in raw)  # the clamp was active
    # Q = r_k + w F with F = R - r_k (the rigged return enters through F).
    q = np.concatenate(batch["reward_sets"])
    r_k = np.array([agent_turns(s)[0].reward for s in batch["rollouts"]])
    rewards = np.array([s.reward for s in batch["rollouts"]])
    assert np.allclose(q, r_k + np.array(batch["weights"]) * (rewards - r_k))


def test_flat_mode_shows_the_mismatch_that_exact_contexts_remove(tiny_model_dir, tmp_path):
    ratios = {}
    for flat in (False, True):
        cfg = rtpo_run_config(
            tiny_model_dir,
            tmp_path / str(flat),
            "rollout.context=turn_summary",
            f"train.trainer_params.flat={flat}",
        )
        t = RTPOTrainer(cfg)
        t.sync_engine()
        t.sweep = t.begin_sweep([0, 1])
        batch = t.stage_batch(min(t.sweep.stages[:2]))
        ratios[flat] = consistency_metrics(batch["rows"], t.scored(batch["rows"]))["train/ratio_max_abs_log"]
    assert ratios[False] < 1e-3 < ratios[True]


def test_k3_run_completes_and_resumes_from_a_checkpoint_between_stages(tiny_model_dir, tmp_path):
    common = ("algo.kl_coef=0.01", "train.save_every=1", "rollout.context=turn_summary")
    full = RTPOTrainer(rtpo_run_config(tiny_model_dir, tmp_path / "a", *common))
    full.fit()
    a = read_metrics(tmp_path / "a")
    trunks = list(read_jsonl(tmp_path / "a" / "rollouts" / "trunks_0.jsonl"))
    K = max(len(agent_turns(r)) for r in trunks)
    assert 2 <= K <= 3
    assert [r["rtpo/turn"] for r in a[1:]] == list(range(K - 1, -1, -1))
    assert a[-1]["budget/rollouts"] == len(trunks) + 2 * sum(len(agent_turns(r)) for r in trunks)
    for key in ("train/ratio_geomean", "train/kl_rollout_train", "rtpo/zero_adv_rate", "time/stage_s"):
        assert key in a[1], key
    assert "trunk/tool_calls_mean" in a[1] and "eval/pass@1" in a[0] and "eval/pass@1" in a[-1]

    first = RTPOTrainer(rtpo_run_config(tiny_model_dir, tmp_path / "b", *common))
    first.logger.log(0, first.evaluate())
    m = first.advance()  # phase 1 + the stage of turn K-1
    first.signal_watch().observe(first.step, m)  # as fit() does: the streak is checkpointed state
    first.logger.log(1, m)
    first.save()
    assert first.sweep is not None and first.sweep.stages  # saved between stages
    del first
    resumed = RTPOTrainer(rtpo_run_config(tiny_model_dir, tmp_path / "b", *common), resume=True)
    assert resumed.step == 1 and resumed.sweep.stages == list(range(K - 2, -1, -1))
    resumed.fit()
    for (name, p), q in zip(full.model.named_parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p, q), name
    b = read_metrics(tmp_path / "b")

    def det(records):
        return [{k: v for k, v in r.items() if not k.startswith(NONDETERMINISTIC_KEYS)} for r in records]

    assert json.dumps(det(a), sort_keys=True) == json.dumps(det(b), sort_keys=True)


def test_budget_cap_stops_before_a_stage_would_exceed_it(tiny_model_dir, tmp_path):
    t = RTPOTrainer(
        rtpo_run_config(tiny_model_dir, tmp_path, "train.trainer_params.max_rollouts=5", "train.steps=3")
    )
    records = t.fit()
    assert t.budget.rollouts <= 5 and records[-1]["budget/rollouts"] == t.budget.rollouts
    assert t.iteration == 0 and t.sweep is not None  # the sweep stopped inside the first iteration


def test_seeupo_trains_each_turn_under_the_flat_history_in_reverse(tiny_model_dir, tmp_path):
    cfg = rtpo_run_config(
        tiny_model_dir,
        tmp_path,
        "train.trainer=seeupo",
        "rollout.group_size=3",
        "rollout.context=turn_summary",
    )
    t = SeeUPOTrainer(cfg)
    records = t.fit()
    chains = list(read_jsonl(tmp_path / "rollouts" / "chains_0.jsonl"))
    K = max(len(agent_turns(c)) for c in chains)
    assert [r["rtpo/turn"] for r in records[1:]] == list(range(K - 1, -1, -1))
    assert records[-1]["budget/rollouts"] == 2 * 3
    t.sweep = t.begin_sweep([0])
    batch = t.stage_batch(1)
    chains, flats = t.sweep.data["groups"][0], t.sweep.data["flats"][0]
    assert batch["rows"] and batch["weights"] == [1.0] * len(batch["rows"])
    for row, chain in zip(batch["rows"], batch["rollouts"], strict=True):
        i = next(j for j, c in enumerate(chains) if c is chain)
        turn = agent_turns(chain)[1]
        assert flats[i][1] != turn.prompt_ids  # the summary context c_1 is not the flat history S_1
        assert row.input_ids == flats[i][1] + turn.response_ids
