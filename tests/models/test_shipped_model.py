"""The tiny base models shipped as package data: what each was built with, that the default build is what
the default config builds (so every machine starts from the same weights), that every build is found by
its settings and copies, and that other settings build."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file

from horizonrl.config import ModelConfig, from_dict
from horizonrl.models.shipped import (
    SHIPPED_DIR,
    build_dir_name,
    build_settings,
    shipped_builds,
    shipped_dir,
    shipped_mismatch,
    shipped_settings,
)
from horizonrl.train.warmstart.bootstrap import load_policy, tokenizer_corpus
from horizonrl.train.warmstart.pretrain import copy_accuracy


def test_the_default_config_uses_the_shipped_model():
    shipped = shipped_settings()
    assert shipped is not None, "regenerate with `python scripts/build_tiny_base.py`"
    assert shipped == build_settings(ModelConfig())
    assert shipped_mismatch(ModelConfig()) is None
    # the packaged configs that use the tiny model at its default shape use it too
    assert shipped_mismatch(from_dict({"model": {"tiny_hidden": 128, "tiny_layers": 4}}).model) is None


#: Every shipped build (the default first), a test case each.
BUILDS = pytest.mark.parametrize("build", list(shipped_builds()), ids=lambda p: p.name)


def test_other_settings_name_what_differs():
    assert shipped_mismatch(ModelConfig(seed=7)) == "model.seed=7 (shipped: 0)"
    assert "model.tiny_hidden=64 (shipped: 128)" in shipped_mismatch(ModelConfig(tiny_hidden=64))
    assert shipped_mismatch(ModelConfig(tiny_pretrain="rebuild")) == "model.tiny_pretrain=rebuild"


def test_a_build_is_named_after_the_settings_that_differ_from_the_defaults():
    default = build_settings(ModelConfig())
    assert build_dir_name(default, default) == "tiny_base"
    assert build_dir_name(build_settings(ModelConfig(seed=1)), default) == "tiny_base_seed1"
    two = build_settings(ModelConfig(seed=1, tiny_pretrain_steps=12000, tiny_pretrain_lr=5e-4))
    assert build_dir_name(two, default) == "tiny_base_pretrain_steps12000_pretrain_lr0p0005_seed1"


@BUILDS
def test_every_shipped_build_is_found_by_its_settings(build):
    settings = shipped_builds()[build]
    assert build.name == build_dir_name(settings, build_settings(ModelConfig()))
    cfg = ModelConfig(**settings)
    assert shipped_dir(cfg) == build and shipped_mismatch(cfg) is None
    assert shipped_dir(dataclasses.replace(cfg, tiny_pretrain="rebuild")) is None


@BUILDS
def test_a_run_copies_the_shipped_weights(tmp_path, build):
    cfg = ModelConfig(device="cpu", **shipped_builds()[build])
    model, tok = load_policy(cfg, init=None, work_dir=tmp_path)
    weights = load_file(build / "model.safetensors")
    state = model.state_dict()
    for name, value in weights.items():
        torch.testing.assert_close(state[name], value, rtol=0, atol=0)
    report = json.loads((tmp_path / "base_model" / "pretrain.json").read_text())
    assert report["source"] == ("shipped" if build == SHIPPED_DIR else f"shipped ({build.name})")
    assert 0 < report["steps"] <= cfg.tiny_pretrain_steps
    assert len(tok) == cfg.tiny_vocab


@BUILDS
def test_the_shipped_model_copies_deep_in_a_context(tmp_path, build):
    """What copy pretraining is for: the copy accuracies 256 tokens into a context that the build
    recorded are what the shipped weights still give here (float rounding aside), span at least 0.9."""
    cfg = ModelConfig(device="cpu", **shipped_builds()[build])
    model, tok = load_policy(cfg, init=None, work_dir=tmp_path)
    acc = copy_accuracy(model, vocab_size=len(tok), depth=256)
    recorded = json.loads((build / "pretrain.json").read_text())["accuracy_256_deep"]
    assert acc["span"] >= 0.9
    assert acc["span"] == pytest.approx(recorded["span"], abs=0.05)
    assert acc["recall"] == pytest.approx(recorded["recall"], abs=0.05)


@BUILDS
def test_the_shipped_tokenizer_is_the_one_the_build_trains(build):
    """The tokenizer is trained from the environments' text: a change there that the shipped copy does not
    reflect would make `rebuild` and `shipped` speak different vocabularies."""
    from horizonrl.models import train_tokenizer

    cfg = ModelConfig(**shipped_builds()[build])
    assert not cfg.tiny_name_tokens  # (a build with name tokens would pass its words here)
    fresh = train_tokenizer(tokenizer_corpus(seed=cfg.seed), vocab_size=cfg.tiny_vocab, seed=cfg.seed)
    fresh_json = json.loads(fresh.backend_tokenizer.to_str())
    shipped = json.loads((build / "tokenizer.json").read_text())
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
