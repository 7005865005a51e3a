"""Training with ``inference.engine: vllm`` on the tiny model in float32 (``make test-vllm``).

The rollout/train ratio must stay within 1e-3 of 1 on every estimator's rows although a
second engine (vLLM's, with its own weights, synced in place after every update) sampled
them; a resumed run must continue exactly.
"""

from __future__ import annotations

import json
from importlib import resources

import pytest
import torch

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from helpers.shaped_env import arith_run_overrides  # noqa: E402
from horizonrl.config import load_config  # noqa: E402
from horizonrl.inference import SamplingParams  # noqa: E402
from horizonrl.train.records.metrics import read_metrics  # noqa: E402
from horizonrl.train.trainers.group import NONDETERMINISTIC_KEYS, GroupTrainer  # noqa: E402

RATIO_TOL = 1e-3


def _grpo(model_dir, out_dir, *extra):
    return load_config(
        None,
        arith_run_overrides(model_dir, out_dir, "inference.engine=vllm", "rollout.temperature=0.8", *extra),
    )


def _ratios(records):
    return [r["train/ratio_geomean"] for r in records if "train/ratio_geomean" in r]


def _engine_matches_model(trainer):
    """The engine samples from the training model's current weights (greedy log-probs vs HF)."""
    from horizonrl.inference import HFEngine

    prompts = [[5, 17, 33, 80, 12, 7], [9, 9, 41, 100]]
    params = SamplingParams(greedy=True, max_new_tokens=8)
    ours = trainer.engine.generate(prompts, params)
    ref = HFEngine(trainer.model, trainer.tokenizer).score(prompts, [g.ids for g in ours])
    return max(
        float(abs(torch.tensor(g.logprobs) - torch.from_numpy(r)).max())
        for g, r in zip(ours, ref, strict=True)
    )


def test_grpo_ratio_stays_one_and_resume_is_exact(vllm_tiny_dir, tmp_path):
    common = ("train.save_every=1", "train.eval_every=1")  # the short run evaluates at its end too
    full = GroupTrainer(_grpo(vllm_tiny_dir, tmp_path / "a", "train.steps=3", *common))
    try:
        records = full.fit()
        ratios = _ratios(records)
        assert len(ratios) == 3 and all(abs(r - 1) < RATIO_TOL for r in ratios), ratios
        assert all(r["train/ratio_max_abs_log"] < 1e-4 for r in records if "train/ratio_max_abs_log" in r)
        assert full.engine.syncs == 3  # one in-place sync after every update
        assert _engine_matches_model(full) < 1e-5
    finally:
        full.close()
    first = GroupTrainer(_grpo(vllm_tiny_dir, tmp_path / "b", "train.steps=1", *common))
    try:
        first.fit()
    finally:
        first.close()
    resumed = GroupTrainer(_grpo(vllm_tiny_dir, tmp_path / "b", "train.steps=3", *common), resume=True)
    try:
        assert resumed.step == 1
        resumed.fit()
        for (name, p), q in zip(full.model.named_parameters(), resumed.model.parameters(), strict=True):
            assert torch.equal(p, q), name
    finally:
        resumed.close()

    def keep(rs):
        return [{k: v for k, v in r.items() if not k.startswith(NONDETERMINISTIC_KEYS)} for r in rs]

    a, b = keep(read_metrics(tmp_path / "a")), keep(read_metrics(tmp_path / "b"))
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_compaction_mosaic_with_recompute_and_tis(vllm_tiny_dir, tmp_path):
    """Multi-session rows (compaction summaries), engine scoring (Mosaic's information gain), TIS."""
    path = resources.files("horizonrl") / "configs" / "mosaic_compaction_lookup.yaml"
    cfg = load_config(
        str(path),
        [
            f"train.init={vllm_tiny_dir}",
            f"train.out_dir={tmp_path}",
            "inference.engine=vllm",
            "rollout.group_size=2",
            "rollout.tasks_per_step=2",
            "train.steps=2",
            "train.eval_samples=1",
            "env.test_tasks=2",
            "env.train_tasks=20",
            "train.progress=false",
            "algo.old_logprobs=recompute",
            "algo.tis_cap=2.0",
        ],
    )
    trainer = GroupTrainer(cfg)
    try:
        records = trainer.fit()
    finally:
        trainer.close()
    steps = [r for r in records if "train/ratio_geomean" in r]
    assert len(steps) == 2
    for m in steps:
        assert abs(m["train/ratio_geomean"] - 1) < RATIO_TOL, m["train/ratio_geomean"]
        assert m["train/tis_clipped_frac"] == 0.0
        assert abs(m["train/tis_weight_mean"] - 1) < RATIO_TOL
        assert m["rollout/sessions_mean"] >= 1 and m["ig/scored_contexts"] >= 0


def test_rtpo_with_a_stale_engine_checkpoints_its_weights(vllm_tiny_dir, tmp_path):
    """sync_every=2: one engine that keeps its weights between syncs (shared=False), whose
    weights a checkpoint between stages holds; freshly synced stages keep the ratio at 1."""
    from horizonrl.train.methods.rtpo import RTPOTrainer
    from horizonrl.train.records import checkpoint as ckpt

    cfg = _grpo(
        vllm_tiny_dir,
        tmp_path / "rtpo",
        "train.trainer=rtpo",
        "train.steps=1",
        "train.save_every=1",
        "train.trainer_params.siblings=3",
        "train.trainer_params.sync_every=2",
        "env.knobs={n_ops: 2, max_operand: 9}",
    )
    trainer = RTPOTrainer(cfg)
    try:
        assert trainer.engine._source is None  # a stale copy: only sync(state_dict) changes it
        records = trainer.fit()
        fresh = [r for r in records if r.get("rtpo/engine_fresh") and "train/ratio_geomean" in r]
        assert fresh and all(abs(r["train/ratio_geomean"] - 1) < RATIO_TOL for r in fresh)
        state = ckpt.load_trainer_state(ckpt.latest_checkpoint(trainer.ckpt_dir))
        weights = state["reverse"]["engine_weights"]
        for k, v in trainer.engine.state_dict().items():
            assert torch.equal(weights[k], v), k
    finally:
        trainer.close()
