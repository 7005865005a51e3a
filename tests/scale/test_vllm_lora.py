"""LoRA with ``inference.engine: vllm`` (``make test-vllm``): vLLM serves the frozen base plus the
adapters through its LoRA support, and a sync sends the adapters only."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")
pytest.importorskip("peft")
pytestmark = pytest.mark.vllm

from helpers.shaped_env import small_run_overrides  # noqa: E402
from horizonrl.config import load_config  # noqa: E402
from horizonrl.inference import HFEngine, SamplingParams  # noqa: E402
from horizonrl.models import lora as lora_utils  # noqa: E402
from horizonrl.train.trainers.group import GroupTrainer  # noqa: E402


def _max_diff(gens, ref) -> float:
    return max(
        float(abs(torch.tensor(g.logprobs) - torch.from_numpy(r)).max())
        for g, r in zip(gens, ref, strict=True)
    )


def test_lora_policy_on_vllm_syncs_adapters_and_keeps_the_ratio_at_one(vllm_tiny_dir, tmp_path):
    cfg = load_config(
        None,
        small_run_overrides(
            vllm_tiny_dir,
            f"train.out_dir={tmp_path}",
            "inference.engine=vllm",
            "rollout.temperature=0.8",
            "model.lora_r=8",
            "model.lora_alpha=16",
            "optim.lr=2e-2",
            "train.steps=2",
        ),
    )
    trainer = GroupTrainer(cfg)
    try:
        records = trainer.fit()
        ratios = [r["train/ratio_geomean"] for r in records if "train/ratio_geomean" in r]
        assert len(ratios) == 2 and all(abs(r - 1) < 1e-3 for r in ratios), ratios
        assert all(r["train/ratio_max_abs_log"] < 1e-4 for r in records if "train/ratio_max_abs_log" in r)
        engine = trainer.engine
        assert engine.syncs == 2  # one adapter reload after every update
        adapter_bytes = sum(v.numel() * 4 for v in lora_utils.adapter_tensors(trainer.model).values())
        assert engine.last_sync_bytes == adapter_bytes  # the adapters only, not the state dict
        assert adapter_bytes < sum(p.numel() * 4 for p in trainer.model.parameters()) / 4
        # vLLM samples from base + adapters: greedy log-probs equal the HF adapted model's, not the base's.
        prompts = [[5, 17, 33, 80, 12, 7], [9, 9, 41, 100]]
        gens = engine.generate(prompts, SamplingParams(greedy=True, max_new_tokens=8))
        hf = HFEngine(trainer.model, trainer.tokenizer)
        assert _max_diff(gens, hf.score(prompts, [g.ids for g in gens])) < 1e-5
        with lora_utils.adapters_disabled(trainer.model):
            base = hf.score(prompts, [g.ids for g in gens])
        assert _max_diff(gens, base) > 1e-3
    finally:
        trainer.close()
