"""Shared fixtures: one small tiny-model directory per test session."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def _threads():
    # Two cores in CI; one torch thread per process avoids oversubscription with xdist-free runs.
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A very small model + tokenizer built the same way as the embedded default."""
    from horizonrl.config import ModelConfig
    from horizonrl.train.warmstart.bootstrap import build_tiny

    path = tmp_path_factory.mktemp("tiny") / "model"
    build_tiny(
        ModelConfig(tiny_hidden=32, tiny_layers=2, tiny_vocab=400, tiny_pretrain_steps=20, seed=0), path
    )
    return path
