"""Checkpoint atomicity and retention, pass@k, and SFT rows/loss."""

from __future__ import annotations

import pytest
import torch

from horizonrl.models import ChatRenderer, load_model_and_tokenizer
from horizonrl.train.records import checkpoint as ckpt
from horizonrl.train.rollout.collect import pass_at_k
from horizonrl.train.warmstart.bootstrap import generate_demos
from horizonrl.train.warmstart.sft import demo_rows, sft_train


def test_pass_at_k_by_hand():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_checkpoints_are_atomic_and_pruned(tiny_model_dir, tmp_path):
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        ckpt.save_checkpoint(root, step, model=model, tokenizer=tok, state={"x": step}, keep=2)
    assert ckpt.list_checkpoints(root) == [2, 3]
    assert ckpt.latest_checkpoint(root) == root / "step_3"
    assert ckpt.load_trainer_state(root / "step_3")["x"] == 3
    # A crash mid-save leaves only a hidden temp dir: the pointer still names the last complete one.
    (root / ".step_4.tmp").mkdir()
    assert ckpt.latest_checkpoint(root) == root / "step_3"
    # A pointer to an incomplete directory falls back to the newest complete checkpoint.
    (root / "step_5").mkdir()
    (root / "latest").write_text("step_5\n")
    assert ckpt.latest_checkpoint(root) == root / "step_3"
    # Weights load back exactly.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    ckpt.load_weights_into(model, root / "step_3")
    fresh, _ = load_model_and_tokenizer(tiny_model_dir)
    for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b)


def test_sft_rows_train_only_assistant_tokens_and_loss_falls(tiny_model_dir):
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    demos = generate_demos("arithmetic", 16, seed=0, noise=0.0, max_turns=4, knobs={"n_ops": 1})
    rows = demo_rows(ChatRenderer(tok), demos)
    for row, d in zip(rows, demos, strict=True):
        trained = tok.decode([t for t, m in zip(row.input_ids, row.trainable, strict=True) if m])
        expected = "".join(m["content"] + tok.eos_token for m in d["messages"] if m["role"] == "assistant")
        assert trained == expected
    losses = sft_train(model, rows, epochs=15, batch_size=8, lr=3e-3, seed=0, device=torch.device("cpu"))
    assert len(losses) == 30
    assert sum(losses[-4:]) / 4 < 0.6 * sum(losses[:4]) / 4
