"""Shared fixtures: one small tiny-model directory per test session."""

from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def _threads():
    # Two cores in CI: `make test` runs two pytest-xdist workers of one torch thread each (the tiny
    # models' matrices are too small for a second thread to pay); a plain pytest run takes two.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    torch.set_num_threads(1 if workers > 1 else max(1, min(2, torch.get_num_threads())))


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
