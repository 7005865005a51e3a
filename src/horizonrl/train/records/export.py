"""A checkpoint as a plain Hugging Face model directory (``horizonrl export``).

:func:`resolve_checkpoint` finds the checkpoint a run directory means (its latest complete one);
:func:`export_merged` writes it as a model directory any loader reads, with LoRA adapters merged
into the base model they name (:func:`horizonrl.models.lora.load_adapter_dir`).
"""

from __future__ import annotations

from pathlib import Path

from horizonrl.models.loading import load_model_and_tokenizer, save_model_and_tokenizer
from horizonrl.models.lora import is_adapter_dir, load_adapter_dir
from horizonrl.train.records.checkpoint import latest_checkpoint


def resolve_checkpoint(source: str | Path) -> Path:
    """A checkpoint directory from ``source``: a run directory or its ``checkpoints`` directory
    (the latest complete checkpoint), or a checkpoint directory itself."""
    p = Path(source)
    if not p.is_dir():
        raise FileNotFoundError(f"{source}: no such directory")
    for root in (p / "checkpoints", p):
        if root.is_dir() and ((root / "latest").exists() or any(root.glob("step_*"))):
            latest = latest_checkpoint(root)
            if latest is None:
                raise FileNotFoundError(f"{root} holds no complete checkpoint")
            return latest
    return p


def export_merged(
    source: str | Path,
    out_dir: str | Path,
    *,
    base: str | Path | None = None,
    dtype: str = "float32",
) -> Path:
    """Write a plain Hugging Face model directory (weights, config, tokenizer) for ``source``: a
    LoRA checkpoint (or a run directory: its latest) with the adapters merged into the base model
    it names (or ``base``). A full-model checkpoint is copied as a plain model. Returns ``out_dir``."""
    ckpt = resolve_checkpoint(source)
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out}: exists and is not an empty directory")
    if is_adapter_dir(ckpt):
        model, tok = load_adapter_dir(ckpt, base=base, dtype=dtype)
    else:
        model, tok = load_model_and_tokenizer(ckpt, dtype=dtype)
    return save_model_and_tokenizer(model, tok, out)
