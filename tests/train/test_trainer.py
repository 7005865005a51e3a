"""End-to-end group trainer on the tiny model: a short run, resume equivalence, ratio consistency."""

from __future__ import annotations

import json

import pytest
import torch

from helpers.shaped_env import arith_run_config
from horizonrl.train.records import checkpoint as ckpt
from horizonrl.train.records.metrics import read_metrics
from horizonrl.train.trainers.group import NONDETERMINISTIC_KEYS, GroupTrainer
from horizonrl.trajectory import read_jsonl


def _deterministic(records):
    return [{k: v for k, v in r.items() if not k.startswith(NONDETERMINISTIC_KEYS)} for r in records]


def test_two_step_run_writes_the_run_directory(tiny_model_dir, tmp_path):
    cfg = arith_run_config(tiny_model_dir, tmp_path / "run", "train.steps=2", "train.save_every=1")
    records = GroupTrainer(cfg).fit()
    run = tmp_path / "run"
    assert (run / "config.yaml").exists()
    metrics = read_metrics(run)
    assert [m["step"] for m in metrics] == [0, 1, 2]
    for key in (
        "reward/mean",
        "success/rate",
        "rollout/turns_mean",
        "rollout/sessions_mean",
        "train/ratio_geomean",
        "time/step_s",
        "throughput/tokens_per_s",
    ):
        assert key in metrics[1], key
    assert "eval/pass@1" in metrics[0] and "eval/pass@2" in metrics[2]
    assert records[-1]["step"] == 2
    rollouts = list(read_jsonl(run / "rollouts" / "step_1.jsonl"))
    assert len(rollouts) == 8 and all(r.segments and r.turns for r in rollouts)
    assert ckpt.list_checkpoints(run / "checkpoints") == [1, 2]  # keep_checkpoints=2
    # The checkpoint is a loadable HF model directory.
    from horizonrl.models import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(run / "checkpoints" / "step_2")
    assert sum(p.numel() for p in model.parameters()) > 0


def test_rollout_train_ratio_is_one_before_the_update(tiny_model_dir, tmp_path):
    # Temperature != 1 exercises the temperature-scaled log-probs on both sides.
    cfg = arith_run_config(
        tiny_model_dir,
        tmp_path / "r",
        "train.steps=2",
        "rollout.temperature=0.8",
        "algo.mini_batches=2",
        "algo.micro_batch_tokens=600",
    )
    trainer = GroupTrainer(cfg)
    for _ in range(2):
        m = trainer.train_step()
        assert abs(m["train/ratio_geomean"] - 1.0) < 1e-3
        assert m["train/ratio_max_abs_log"] < 1e-3


def test_resume_gives_identical_weights_and_metrics(tiny_model_dir, tmp_path):
    common = ("train.save_every=2", "train.eval_every=2", "algo.kl_coef=0.01", "algo.ppo_epochs=2")
    full = GroupTrainer(arith_run_config(tiny_model_dir, tmp_path / "a", "train.steps=4", *common))
    full.fit()

    first = GroupTrainer(arith_run_config(tiny_model_dir, tmp_path / "b", "train.steps=2", *common))
    first.fit()
    del first
    resumed = GroupTrainer(
        arith_run_config(tiny_model_dir, tmp_path / "b", "train.steps=4", *common), resume=True
    )
    assert resumed.step == 2
    resumed.fit()

    for (name, p), q in zip(full.model.named_parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p, q), name
    a = _deterministic(read_metrics(tmp_path / "a"))
    b = _deterministic(read_metrics(tmp_path / "b"))
    assert [r["step"] for r in b] == [0, 1, 2, 3, 4]
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_resume_without_checkpoint_is_a_clear_error(tiny_model_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        GroupTrainer(arith_run_config(tiny_model_dir, tmp_path / "c", "train.steps=1"), resume=True)


def test_tensorboard_logging(tiny_model_dir, tmp_path):
    pytest.importorskip("tensorboard")
    cfg = arith_run_config(tiny_model_dir, tmp_path / "tb", "train.steps=1", "train.tensorboard=true")
    GroupTrainer(cfg).fit()
    assert list((tmp_path / "tb" / "tensorboard").glob("events.out.tfevents.*"))


@pytest.mark.parametrize(
    "estimator", ["grpo", "drgrpo", "rloo", "broadcast", "gigpo", "hgpo", "echo", "supo"]
)
def test_rollout_only_estimators_train_in_the_group_trainer(tiny_model_dir, tmp_path, estimator):
    cfg = arith_run_config(
        tiny_model_dir, tmp_path / estimator, "train.steps=1", f"algo.estimator={estimator}"
    )
    trainer = GroupTrainer(cfg)
    m = trainer.train_step()
    assert abs(m["train/ratio_geomean"] - 1.0) < 1e-3
    assert trainer.loss_agg_mode == trainer.estimator.loss_agg_mode
