"""Atomic checkpoints that restore a run exactly.

A checkpoint is a directory ``checkpoints/step_N`` holding HF-loadable weights
(``model.safetensors`` + config + tokenizer) and ``trainer_state.pt`` with the
optimizer, scheduler, every RNG the run draws from, the step and any extra
trainer state. It is written to a temporary sibling and renamed into place, and
``checkpoints/latest`` (a one-line file, itself replaced atomically) names the
newest complete one, so a crash mid-save never leaves a half checkpoint behind
the pointer.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

LATEST = "latest"
_STEP_DIR = re.compile(r"^step_(\d+)$")


def rng_state() -> dict[str, Any]:
    """The process-global RNG states (python, numpy, torch)."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_checkpoint(
    root: str | Path,
    step: int,
    *,
    model,
    tokenizer,
    state: dict[str, Any],
    keep: int = 2,
    state_dict: dict[str, torch.Tensor] | None = None,
    staged: bool = False,
) -> Path:
    """Write ``root/step_{step}`` atomically, point ``root/latest`` at it, prune old ones.

    ``state_dict``: the weights to export (default: the model's own; a sharded model passes its
    gathered full weights). ``staged``: the temporary directory already holds files written by
    other ranks (``torch.distributed.checkpoint`` shards) and is kept.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = root / f".step_{step}.tmp"
    if not staged:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    if state_dict is None:
        model.save_pretrained(tmp, safe_serialization=True)
    else:
        model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    torch.save({"step": step, **state}, tmp / "trainer_state.pt")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _atomic_write_text(root / LATEST, final.name + "\n")
    steps = sorted(list_checkpoints(root))
    for old in steps[:-keep]:
        shutil.rmtree(root / f"step_{old}", ignore_errors=True)
    return final


def list_checkpoints(root: str | Path) -> list[int]:
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name)))


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint directory, or None."""
    root = Path(root)
    pointer = root / LATEST
    if pointer.exists():
        path = root / pointer.read_text().strip()
        if (path / "trainer_state.pt").exists():
            return path
    steps = [s for s in list_checkpoints(root) if (root / f"step_{s}" / "trainer_state.pt").exists()]
    return root / f"step_{steps[-1]}" if steps else None


def load_trainer_state(path: str | Path) -> dict[str, Any]:
    return torch.load(Path(path) / "trainer_state.pt", map_location="cpu", weights_only=False)


def load_weights_into(model: torch.nn.Module, path: str | Path) -> None:
    """Load a checkpoint's safetensors weights into an existing model (exact, in place)."""
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors weights in {path}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied embeddings are saved once; anything else missing is an error.
    missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(
            f"checkpoint {path} does not match the model: missing={missing} unexpected={unexpected}"
        )
