"""Checkpoints of a sharded (``torchrun``) run, beside :mod:`horizonrl.train.records.checkpoint`.

Model and optimizer go through ``torch.distributed.checkpoint`` (``step_N/dcp``, resharded on
load, so a run can resume on a different number of ranks); the trainer state and the
HF-loadable weights (gathered to rank 0) are written as in a single-process checkpoint, whose
``trainer_state.pt["optimizer"]`` then reads :data:`DCP_MARK`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from horizonrl.train.records import checkpoint as ckpt
from horizonrl.world import World

DCP_DIR = "dcp"
#: ``trainer_state.pt["optimizer"]`` of a checkpoint whose model and optimizer are in ``DCP_DIR``.
DCP_MARK = "torch.distributed.checkpoint"


def save_checkpoint(
    world: World,
    root: str | Path,
    step: int,
    *,
    model,
    optimizer,
    tokenizer,
    state: dict[str, Any],
    keep: int,
) -> Path:
    """Model + optimizer through DCP (every rank), trainer state + HF weights (rank 0); atomic as
    :func:`horizonrl.train.records.checkpoint.save_checkpoint`."""
    import shutil

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    root = Path(root)
    tmp = root / f".step_{step}.tmp"
    if world.is_main:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    world.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp / DCP_DIR))
    full = world.full_state_dict(model)
    final = root / f"step_{step}"
    if world.is_main:
        if getattr(model.config, "tie_word_embeddings", False):
            full.pop("lm_head.weight", None)
        final = ckpt.save_checkpoint(
            root, step, model=model, tokenizer=tokenizer, state=state, keep=keep, state_dict=full, staged=True
        )
    world.barrier()
    return final


def load_checkpoint(path: str | Path, model, optimizer) -> None:
    """Load ``path/dcp`` into ``model`` and ``optimizer`` (sharded or not; any number of ranks)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(Path(path) / DCP_DIR))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def has_dcp(path: str | Path) -> bool:
    return (Path(path) / DCP_DIR / ".metadata").exists()
