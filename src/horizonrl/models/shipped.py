"""The tiny base model horizonrl ships as package data (``model.tiny_pretrain: shipped``).

The embedded tiny model is a function of its build settings (:data:`BUILD_FIELDS` of the ``model``
section) and of the machine's float rounding: its copy pretraining (2,000-6,000 AdamW steps) ends at
different weights on different CPUs, so a quickstart or a reproduction built its own base model and
its numbers depended on the machine. The package ships the one built by ``scripts/build_tiny_base.py``
with the default settings (tokenizer, ~1M float32 parameters as safetensors, ``pretrain.json``, and
``build.json`` recording the settings, torch version and thread count); a run whose settings equal
them copies it instead of building, so every machine starts from the same weights. Any other setting
(or ``model.tiny_pretrain: rebuild``) builds the model as before.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

#: Where the shipped copy lives (package data).
SHIPPED_DIR = Path(__file__).parent / "tiny_base"
#: The ``model.*`` fields the tiny base model is built from.
BUILD_FIELDS = (
    "tiny_hidden",
    "tiny_layers",
    "tiny_vocab",
    "tiny_pretrain_steps",
    "tiny_pretrain_lr",
    "tiny_pretrain_pack",
    "tiny_name_tokens",
    "seed",
)


def build_settings(cfg: Any) -> dict[str, Any]:
    """The build settings of a ``model`` config section."""
    return {f: getattr(cfg, f) for f in BUILD_FIELDS}


def write_build_record(model_dir: str | Path, cfg: Any, *, seconds: float) -> None:
    """``build.json`` beside a built model: its settings, the torch version and thread count, the time."""
    import torch

    record = {
        "settings": build_settings(cfg),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "seconds": round(seconds, 1),
    }
    (Path(model_dir) / "build.json").write_text(json.dumps(record, indent=2) + "\n")


def shipped_settings() -> dict[str, Any] | None:
    """The settings the shipped copy was built with (None when the package has none)."""
    path = SHIPPED_DIR / "build.json"
    if not path.is_file() or not (SHIPPED_DIR / "model.safetensors").is_file():
        return None
    return json.loads(path.read_text())["settings"]


def shipped_mismatch(cfg: Any) -> str | None:
    """Why the shipped copy is not the model ``cfg`` builds (``field=value (shipped: value)``), or None."""
    if getattr(cfg, "tiny_pretrain", "shipped") == "rebuild":
        return "model.tiny_pretrain=rebuild"
    shipped = shipped_settings()
    if shipped is None:
        return "this installation has no shipped tiny base model"
    wanted = build_settings(cfg)
    diff = [
        f"model.{k}={wanted[k]!r} (shipped: {shipped.get(k)!r})"
        for k in BUILD_FIELDS
        if wanted[k] != shipped.get(k)
    ]
    return ", ".join(diff) or None


def copy_shipped(target: str | Path) -> Path:
    """Copy the shipped tiny base model to ``target`` (a run's ``base_model/``); returns it."""
    target = Path(target)
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(SHIPPED_DIR, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target
