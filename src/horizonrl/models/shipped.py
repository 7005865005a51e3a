"""The tiny base models horizonrl ships as package data (``model.tiny_pretrain: shipped``).

The embedded tiny model is a function of its build settings (:data:`BUILD_FIELDS` of the ``model``
section) and of the machine's float rounding: its copy pretraining (2,000-12,000 AdamW steps) ends at
different weights on different CPUs, so a quickstart or a reproduction built its own base model and
its numbers depended on the machine. The package ships builds of ``scripts/build_tiny_base.py``
(tokenizer, ~1M float32 parameters as safetensors, ``pretrain.json``, and ``build.json`` recording the
settings, torch version and thread count): ``tiny_base/`` with the default settings, and
``tiny_base_<setting>/`` siblings with other settings that a declared regime needs (a reproduction whose
scenarios copy from long contexts needs a base whose deep recall converged, which the default build's
did not). A run whose settings equal one build's copies it instead of building, so every machine starts
from the same weights. Any other setting (or ``model.tiny_pretrain: rebuild``) builds the model as before.

A shipped build is never rebuilt in place: cached warm starts and results pages key on the settings,
not the weights (``reproduce.runner.warmstart_key``), so a different build gets different settings.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

#: The default build (package data).
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


def build_dir_name(settings: dict[str, Any], default: dict[str, Any]) -> str:
    """Where a build with ``settings`` ships: ``tiny_base`` for the defaults, else ``tiny_base_`` and each
    differing field without its ``tiny_`` prefix, then its value (``seed=1`` -> ``tiny_base_seed1``)."""
    diff = [f"{k.removeprefix('tiny_')}{settings[k]}" for k in BUILD_FIELDS if settings[k] != default[k]]
    return "_".join(["tiny_base", *diff]).replace(".", "p").replace("-", "m")


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


def shipped_builds() -> dict[Path, dict[str, Any]]:
    """Every shipped build's directory and the settings it was built with (the default build first)."""
    found = {}
    for path in sorted(SHIPPED_DIR.parent.glob("tiny_base*"), key=lambda p: (p != SHIPPED_DIR, p.name)):
        if (path / "build.json").is_file() and (path / "model.safetensors").is_file():
            found[path] = json.loads((path / "build.json").read_text())["settings"]
    return found


def shipped_settings() -> dict[str, Any] | None:
    """The settings the default shipped build was made with (None when the package has none)."""
    return shipped_builds().get(SHIPPED_DIR)


def shipped_dir(cfg: Any) -> Path | None:
    """The shipped build that ``cfg`` (a ``model`` section) builds, or None."""
    if getattr(cfg, "tiny_pretrain", "shipped") == "rebuild":
        return None
    wanted = build_settings(cfg)
    return next((path for path, settings in shipped_builds().items() if settings == wanted), None)


def shipped_mismatch(cfg: Any) -> str | None:
    """Why no shipped build is the model ``cfg`` builds (``field=value (shipped: value)`` against the
    default build), or None."""
    if getattr(cfg, "tiny_pretrain", "shipped") == "rebuild":
        return "model.tiny_pretrain=rebuild"
    if shipped_dir(cfg) is not None:
        return None
    shipped = shipped_settings()
    if shipped is None:
        return "this installation has no shipped tiny base model"
    wanted = build_settings(cfg)
    return ", ".join(
        f"model.{k}={wanted[k]!r} (shipped: {shipped.get(k)!r})"
        for k in BUILD_FIELDS
        if wanted[k] != shipped.get(k)
    )


def copy_shipped(target: str | Path, build: Path = SHIPPED_DIR) -> Path:
    """Copy a shipped build (a directory of :func:`shipped_builds`; default: the default build) to
    ``target`` (a run's ``base_model/``); returns it."""
    target = Path(target)
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(build, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target
