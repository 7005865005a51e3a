"""Fixtures shared by every test folder, and ``tests/`` on ``sys.path`` for the shared ``helpers`` package.

- ``tiny_model_dir`` (session): one small tiny-model directory, built as the embedded default is;
- ``model_tok`` (module): the tiny model and its tokenizer, loaded once per test module;
- ``one_thread`` (module): one torch thread while a module runs (``pytestmark =
  pytest.mark.usefixtures("one_thread")``): tiny models gain nothing from intra-op threads, and a second
  thread spins on a shared, busy CPU;
- ``vllm_tiny_dir`` (module): a tiny model vLLM's CPU attention supports (head_dim 32).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:  # `from helpers.shaped_env import ...` in every folder, whatever the import mode
    sys.path.insert(0, _TESTS)


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


@pytest.fixture(scope="module")
def model_tok(tiny_model_dir):
    """``(model, tokenizer)`` of ``tiny_model_dir``, loaded once per module."""
    from horizonrl.models import load_model_and_tokenizer

    return load_model_and_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread while the module that uses it runs; the previous count afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def vllm_tiny_dir(tmp_path_factory):
    """A tiny model vLLM's CPU attention supports (head_dim 32: hidden 128, 4 heads)."""
    from horizonrl.config import ModelConfig
    from horizonrl.train.warmstart.bootstrap import build_tiny

    path = tmp_path_factory.mktemp("vtiny") / "model"
    build_tiny(ModelConfig(tiny_hidden=128, tiny_layers=2, tiny_vocab=400, tiny_pretrain_steps=20), path)
    return path
