"""Atomic checkpoints that restore a run exactly.

A checkpoint is a directory ``checkpoints/step_N`` holding HF-loadable weights
(``model.safetensors`` + config + tokenizer; with LoRA the adapters only, in peft's
format, ``horizonrl export`` merges them) and ``trainer_state.pt`` with the
optimizer, scheduler, every RNG the run draws from, the step and any extra
trainer state. It is written to a temporary sibling and renamed into place, and
``checkpoints/latest`` (a one-line file, itself replaced atomically) names the
newest complete one, so a crash mid-save never leaves a half checkpoint behind
the pointer.

Failures are survived:

- a save that fails (a full disk: ``OSError(ENOSPC)``) removes its temporary
  directory and raises :class:`~horizonrl.errors.CheckpointError`; temporaries
  a killed run left behind are removed by :func:`clean_stale` when a run starts;
- a model whose parameters are not finite is never written (NonFiniteError);
- :func:`load_latest` reads the newest checkpoint whole (weights and trainer
  state) before anything is restored; one that does not load (a truncated
  ``model.safetensors``, a truncated or empty ``trainer_state.pt``) is passed
  over for the previous one with a :class:`~horizonrl.errors.HorizonWarning`
  saying so, and none usable is a CheckpointError listing why each failed.
"""

from __future__ import annotations

import os
import pickle
import random
import re
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from horizonrl.errors import CheckpointError, HorizonWarning, NonFiniteError

LATEST = "latest"
STATE_FILE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^step_(\d+)$")
_STALE = re.compile(r"^\.step_\d+\.tmp$")
#: Keys every trainer state holds (a state without them is from something else).
_STATE_KEYS = ("step", "optimizer", "scheduler", "global_rng")


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


def check_finite(model: torch.nn.Module, state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """NonFiniteError naming the first parameter that holds a NaN or infinity (of ``state_dict`` if given:
    the gathered weights of a sharded model, whose own parameters only hold a shard)."""
    params = list(state_dict.items()) if state_dict is not None else list(model.named_parameters())
    if not params:
        return
    ok = torch.stack([torch.isfinite(p.detach()).all() for _, p in params])
    if not bool(ok.all()):
        name = params[int((~ok).nonzero()[0])][0]
        raise NonFiniteError(f"parameter {name} holds NaN or infinite values")


def clean_stale(root: str | Path) -> list[Path]:
    """Remove the ``.step_N.tmp`` directories (and a ``latest.tmp``) a crashed save left; returns them."""
    root = Path(root)
    if not root.is_dir():
        return []
    gone = [p for p in root.iterdir() if _STALE.match(p.name) or p.name == LATEST + ".tmp"]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    return gone


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

    A model with non-finite parameters is refused (NonFiniteError) before anything is written;
    a failed write (e.g. a full disk) leaves no temporary directory and raises CheckpointError.
    """
    from horizonrl.models.lora import is_lora, save_adapter

    check_finite(model, state_dict)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = root / f".step_{step}.tmp"
    try:
        if not staged:
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir()
        if is_lora(model):  # the adapters only: the base never changes
            save_adapter(model, tmp, state_dict=state_dict)
        elif state_dict is None:
            model.save_pretrained(tmp, safe_serialization=True)
        else:
            model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        torch.save({"step": step, **state}, tmp / STATE_FILE)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _atomic_write_text(root / LATEST, final.name + "\n")
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        (root / (LATEST + ".tmp")).unlink(missing_ok=True)
        raise CheckpointError(f"could not write checkpoint {final}: {e.strerror or e}") from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    steps = sorted(list_checkpoints(root))
    for old in steps[:-keep]:
        shutil.rmtree(root / f"step_{old}", ignore_errors=True)
    return final


def list_checkpoints(root: str | Path) -> list[int]:
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name)))


def _candidates(root: Path) -> list[Path]:
    """Checkpoint directories, newest first: the ``latest`` pointer's target, then by step."""
    steps = [root / f"step_{s}" for s in reversed(list_checkpoints(root))]
    pointer = root / LATEST
    if pointer.is_file():
        try:
            named = root / pointer.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            named = None
        if named in steps:
            steps.remove(named)
            steps.insert(0, named)
    return steps


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint directory (one holding a trainer state), or None."""
    for path in _candidates(Path(root)):
        if (path / STATE_FILE).exists():
            return path
    return None


def load_trainer_state(path: str | Path) -> dict[str, Any]:
    return torch.load(Path(path) / STATE_FILE, map_location="cpu", weights_only=False)


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint's ``*.safetensors`` files."""
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors weights in {path}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


@dataclass
class Checkpoint:
    """A checkpoint read whole: its directory, weights and trainer state."""

    path: Path
    weights: dict[str, torch.Tensor]
    state: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.state["step"])


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Read ``path`` whole; CheckpointError saying which file is unusable and why."""
    from safetensors import SafetensorError

    path = Path(path)
    try:
        weights = read_weights(path)
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path.name}: the weights do not load ({_reason(e)})") from None
    try:
        state = load_trainer_state(path)
    except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError, AttributeError) as e:
        raise CheckpointError(f"{path.name}: {STATE_FILE} does not load ({_reason(e)})") from None
    missing = [k for k in _STATE_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise CheckpointError(f"{path.name}: {STATE_FILE} lacks {missing}")
    return Checkpoint(path, weights, state)


def _reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if isinstance(e, EOFError) or "Ran out of input" in text:
        return "the file is empty"
    if "central directory" in text or "incomplete metadata" in text or "header" in text:
        return f"the file is truncated or damaged: {text[:120]}"
    return text[:160]


def load_latest(root: str | Path) -> Checkpoint:
    """The newest checkpoint under ``root`` that loads whole, falling back past unusable ones.

    Each one passed over is reported by a :class:`HorizonWarning` naming it, the reason and the
    checkpoint used instead; when none loads, CheckpointError lists every reason (FileNotFoundError
    when there is no checkpoint at all).
    """
    root = Path(root)
    failures: list[str] = []
    for path in _candidates(root):
        try:
            ck = read_checkpoint(path)
        except CheckpointError as e:
            failures.append(str(e))
            continue
        if failures:
            warnings.warn(
                f"checkpoint {'; '.join(failures)}: falling back to {path} (step {ck.step})",
                HorizonWarning,
                stacklevel=2,
            )
        return ck
    if not failures:
        raise FileNotFoundError(f"--resume: no checkpoint under {root}")
    raise CheckpointError(f"--resume: no usable checkpoint under {root}: " + "; ".join(failures))


def load_weights_into(model: torch.nn.Module, source: str | Path | dict[str, torch.Tensor]) -> None:
    """Load a checkpoint's weights (a directory, or tensors read by :func:`read_weights`) into
    ``model`` exactly, in place; CheckpointError when names or shapes do not match the model.

    A model with LoRA adapters (``model.lora_r > 0``) is checkpointed as its adapters only (peft's
    ``adapter_model.safetensors``; the base weights never change) and restores them.
    """
    state = read_weights(source) if isinstance(source, str | Path) else source
    from horizonrl.models.loading import state_mismatch
    from horizonrl.models.lora import is_lora, load_adapter_weights

    if is_lora(model):
        where = f"checkpoint {source}" if isinstance(source, str | Path) else "the checkpoint"
        return load_adapter_weights(model, state, where=where)
    # Tied embeddings are saved once; anything else missing is an error.
    detail = state_mismatch(model.state_dict(), state, optional=("lm_head.weight",))
    if detail:
        where = source if isinstance(source, str | Path) else "the checkpoint"
        raise CheckpointError(f"checkpoint {where} does not match the model ({detail})")
    model.load_state_dict(state, strict=False)
