"""Training with the fast sampling settings (bf16 copy, shared prefix) and the no-signal warning."""

from __future__ import annotations

import warnings

import pytest
import torch

from helpers.shaped_env import arith_run_overrides
from horizonrl.config import load_config
from horizonrl.errors import HorizonWarning
from horizonrl.train.records.signal import STREAK_KEY, SignalWatch
from horizonrl.train.trainers.group import GroupTrainer
from horizonrl.train.trainers.loop import Trainer


def test_bf16_sampling_trains_with_recomputed_pi_old_and_logs_the_mismatch(tiny_model_dir, tmp_path):
    cfg = load_config(
        None,
        arith_run_overrides(
            tiny_model_dir,
            tmp_path / "run",
            "train.steps=2",
            "inference.params={dtype: bfloat16, shared_prefix: true, shared_prefix_min: 8}",
            "algo.old_logprobs=recompute",
            "algo.tis_cap=2.0",
        ),
    )
    trainer = GroupTrainer(cfg)
    engine = trainer.engine
    while not hasattr(engine, "follow"):
        engine = engine.inner
    assert engine.follow is trainer.model and engine.shared_prefix
    before = [p.detach().clone() for p in engine.model.parameters()]
    for _ in range(2):
        with torch.no_grad():  # move the master weights (the tiny warm start may give no advantage)
            for p in trainer.model.parameters():
                p.add_(torch.randn_like(p) * 0.01)
        m = trainer.train_step()
        # bf16 sampling vs the fp32 training model: a real mismatch, measured and corrected.
        assert 0 < m["train/ratio_max_abs_log"] < 1
        assert 0 < m["train/kl_rollout_train"] < 0.05
        assert "train/tis_weight_mean" in m
    after = list(engine.model.parameters())
    assert any(
        not a.equal(b) for a, b in zip(after, before, strict=True)
    )  # the bf16 copy followed the update
    for a, master in zip(after, trainer.model.parameters(), strict=True):
        assert a.equal(master.detach().to(a.dtype))


def test_signal_watch_by_hand():
    w = SignalWatch(patience=3, threshold=0.95)
    rates = [1.0, 0.96, 0.5, 1.0, 1.0, 1.0, 1.0, 0.9, 1.0]
    said, streaks = [], []
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        for step, r in enumerate(rates, start=1):
            m = {"train/zero_adv_group_rate": r, "reward/mean": 0.0}
            said.append(w.observe(step, m) is not None)
            streaks.append(m[STREAK_KEY])
    assert streaks == [1, 2, 0, 1, 2, 3, 4, 0, 1]
    assert said == [False, False, False, False, False, True, False, False, False]  # once per streak
    assert SignalWatch(patience=0).observe(1, {"train/zero_adv_group_rate": 1.0}) is None


class _Flat(Trainer):
    """A trainer whose every step has no signal (all groups' rewards equal)."""

    def __init__(self, cfg):
        self.cfg, self.step, self.evals_done = cfg, 0, []
        self.logger = type(
            "L", (), {"log": lambda s, step, m: {"step": step, **m}, "close": lambda s: None}
        )()

    def has_more(self):
        return self.step < self.cfg.train.steps

    def advance(self):
        self.step += 1
        return {"train/zero_adv_group_rate": 1.0, "reward/mean": 0.0}

    def evaluate(self):
        return {}

    def save(self):
        pass


def test_a_run_without_signal_says_so(tmp_path):
    cfg = load_config(
        None,
        [
            "train.steps=4",
            "train.eval_at_start=false",
            "train.eval_every=0",
            "train.progress=false",
            f"train.out_dir={tmp_path}",
        ],
    )
    t = _Flat(cfg)
    with pytest.warns(
        HorizonWarning, match=r"steps 1-3: at least 95% of the groups had zero advantage.*few_shot"
    ):
        records = t.fit()
    assert [r[STREAK_KEY] for r in records] == [1, 2, 3, 4]
    assert t.postfix(records[-1])["signal"] == "none for 4 steps"
    assert "signal" not in t.postfix(records[0])


def test_sync_driver_with_env_threads_samples_what_one_thread_does(tiny_model_dir, tmp_path):
    def rollouts(threads):
        cfg = load_config(
            None,
            arith_run_overrides(
                tiny_model_dir,
                tmp_path / f"t{threads}",
                "train.steps=1",
                f"rollout.sync_env_threads={threads}",
            ),
        )
        trainer = GroupTrainer(cfg)
        assert trainer.spec.driver.threads == threads
        groups = trainer.collect(trainer.task_rng.sample(trainer.train_tasks, 2))
        return [
            (r.reward, [(t.prompt_ids, t.response_ids, t.logprobs, t.observation) for t in r.turns])
            for g in groups
            for r in g.rollouts
        ]

    one, four = rollouts(1), rollouts(4)
    assert one == four and len(one) == 8
