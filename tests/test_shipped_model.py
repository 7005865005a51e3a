"""The tiny base model shipped as package data: what it was built with, that it is what the default config
builds (so every machine starts from the same weights), that it copies, and that other settings build."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file

from horizonrl.config import ModelConfig, from_dict
from horizonrl.models.shipped import SHIPPED_DIR, build_settings, shipped_mismatch, shipped_settings
from horizonrl.train.warmstart.bootstrap import load_policy, tokenizer_corpus
from horizonrl.train.warmstart.pretrain import copy_accuracy


def test_the_default_config_uses_the_shipped_model():
    shipped = shipped_settings()
    assert shipped is not None, "regenerate with `python scripts/build_tiny_base.py`"
    assert shipped == build_settings(ModelConfig())
    assert shipped_mismatch(ModelConfig()) is None
    # the packaged configs that use the tiny model at its default shape use it too
    assert shipped_mismatch(from_dict({"model": {"tiny_hidden": 128, "tiny_layers": 4}}).model) is None


def test_other_settings_name_what_differs():
    assert shipped_mismatch(ModelConfig(seed=1)) == "model.seed=1 (shipped: 0)"
    assert "model.tiny_hidden=64 (shipped: 128)" in shipped_mismatch(ModelConfig(tiny_hidden=64))
    assert shipped_mismatch(ModelConfig(tiny_pretrain="rebuild")) == "model.tiny_pretrain=rebuild"


def test_a_run_copies_the_shipped_weights(tmp_path):
    model, tok = load_policy(ModelConfig(device="cpu"), init=None, work_dir=tmp_path)
    weights = load_file(SHIPPED_DIR / "model.safetensors")
    state = model.state_dict()
    for name, value in weights.items():
        torch.testing.assert_close(state[name], value, rtol=0, atol=0)
    report = json.loads((tmp_path / "base_model" / "pretrain.json").read_text())
    assert report["source"] == "shipped" and report["steps"] == ModelConfig().tiny_pretrain_steps
    assert len(tok) == ModelConfig().tiny_vocab


def test_the_shipped_model_copies_deep_in_a_context(tmp_path):
    """What copy pretraining is for: the span-copy accuracy 256 tokens into a context that the build
    recorded is what the shipped weights still give here (float rounding aside), and at least 0.9."""
    model, tok = load_policy(ModelConfig(device="cpu"), init=None, work_dir=tmp_path)
    acc = copy_accuracy(model, vocab_size=len(tok), depth=256)
    recorded = json.loads((SHIPPED_DIR / "pretrain.json").read_text())["accuracy_256_deep"]
    assert acc["span"] >= 0.9
    assert acc["span"] == pytest.approx(recorded["span"], abs=0.05)


def test_the_shipped_tokenizer_is_the_one_the_build_trains():
    """The tokenizer is trained from the environments' text: a change there that the shipped copy does not
    reflect would make `rebuild` and `shipped` speak different vocabularies."""
    from horizonrl.models import train_tokenizer

    cfg = ModelConfig()
    fresh = train_tokenizer(tokenizer_corpus(seed=cfg.seed), vocab_size=cfg.tiny_vocab, seed=cfg.seed)
    fresh_json = json.loads(fresh.backend_tokenizer.to_str())
    shipped = json.loads((SHIPPED_DIR / "tokenizer.json").read_text())
    for part in ("model", "added_tokens", "pre_tokenizer", "normalizer", "decoder"):
        assert fresh_json[part] == shipped[part], part


def test_other_settings_build_the_model_here(tmp_path):
    cfg = dataclasses.replace(
        ModelConfig(device="cpu"), tiny_hidden=32, tiny_layers=1, tiny_vocab=400, tiny_pretrain_steps=5
    )
    model, _ = load_policy(cfg, init=None, work_dir=tmp_path)
    assert model.config.hidden_size == 32
    report = json.loads((tmp_path / "base_model" / "pretrain.json").read_text())
    assert report["source"].startswith("built here (model.tiny_hidden=32 (shipped: 128)")
