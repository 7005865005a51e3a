"""Sharded training under ``torchrun``: DDP or FSDP2 for the update, generation split across ranks.

Launch any trainer with ``torchrun --nproc-per-node N -m horizonrl.cli train ...``
(docs/scale.md). Every rank runs the same trainer: the same task draws, agent
programs, credit and rows (all seeded alike), so nothing but the two expensive
parts has to be shared:

- **generation** (:class:`ShardedEngine`): each ``generate`` call draws one seed per
  prompt from the (identical) engine RNGs, every rank samples its share of the
  prompts with those seeds and the results are all-gathered, so every rank
  continues every program with the same tokens that one process would have
  sampled (request seeding, :mod:`horizonrl.inference.seeding`);
- **the update** (``ppo_update(..., world=)``): the rows of each mini-batch are
  dealt to the ranks (sorted by length, round-robin, so token counts balance);
  the aggregation coefficients (``losses.token_coefficients``) are computed on the
  *whole* mini-batch — every rank holds its rows — so the per-token, per-row and
  per-rollout normalizers (and Dr.GRPO's padded ``T``) are the global ones, and
  each rank's loss is a partial sum of the single-process loss. Gradients are
  summed across ranks (the loss is multiplied by the world size, undoing the
  averaging of DDP / FSDP), and every rank runs the same number of micro-batches
  (idle ranks a zero-weighted one), so the collectives line up.

``distributed.update``: ``ddp`` (``DistributedDataParallel``; weights replicated)
or ``fsdp`` (FSDP2 ``fully_shard`` on every decoder layer and the root:
parameters, gradients and AdamW state sharded; the rollout engine then holds a
full copy, refreshed after every update by gathering the weights).
``distributed.process_group``: gloo on CPU, NCCL on CUDA by default.

Checkpoints (:func:`save_checkpoint`): model and optimizer through
``torch.distributed.checkpoint`` (``step_N/dcp``, resharded on load, so a run
can resume on a different number of ranks), the trainer state and the
HF-loadable weights (gathered to rank 0) as in a single-process checkpoint.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from horizonrl.inference.base import Engine, Generation, SamplingParams
from horizonrl.inference.seeding import SeededEngine
from horizonrl.train.records import checkpoint as ckpt

DCP_DIR = "dcp"
#: ``trainer_state.pt["optimizer"]`` of a checkpoint whose model and optimizer are in ``DCP_DIR``.
DCP_MARK = "torch.distributed.checkpoint"


@dataclass
class World:
    """This process's place in the torchrun group and the sharding strategy."""

    rank: int
    size: int
    local_rank: int
    device: torch.device
    strategy: str
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------ collectives

    def barrier(self) -> None:
        dist.barrier()

    def all_gather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def _reduce(self, values: Sequence[float], op) -> list[float]:
        dev = self.device if self.backend == "nccl" else torch.device("cpu")
        t = torch.tensor(list(values), dtype=torch.float64, device=dev)
        dist.all_reduce(t, op=op)
        return t.tolist()

    def sum(self, values: Sequence[float]) -> list[float]:
        return self._reduce(values, dist.ReduceOp.SUM)

    def max(self, values: Sequence[float]) -> list[float]:
        return self._reduce(values, dist.ReduceOp.MAX)

    # ------------------------------------------------------------------ sharding

    def my_positions(self, n: int) -> list[int]:
        """Positions ``rank, rank + size, ...`` of ``n`` items (items sorted by length: balanced tokens)."""
        return list(range(self.rank, n, self.size))

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """What the update runs through: ``DDP(model)``, or ``model`` itself sharded in place (FSDP2)."""
        if self.strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            return DistributedDataParallel(model, device_ids=ids)
        from torch.distributed.fsdp import fully_shard

        layer_types = set(getattr(model, "_no_split_modules", None) or [])
        for module in model.modules():
            if type(module).__name__ in layer_types:
                fully_shard(module)
        fully_shard(model)
        return model

    @contextlib.contextmanager
    def grad_sync(self, train_model: torch.nn.Module, enabled: bool):
        """Forward + backward inside: gradients are reduced across ranks only if ``enabled``."""
        if self.strategy == "ddp":
            with contextlib.nullcontext() if enabled else train_model.no_sync():
                yield
        else:
            train_model.set_requires_gradient_sync(enabled)
            try:
                yield
            finally:
                train_model.set_requires_gradient_sync(True)

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The unsharded weights on every rank (CPU); a collective under FSDP."""
        if self.strategy == "ddp":
            return {k: v.detach().cpu() for k, v in model.state_dict().items()}
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        # cpu_offload=True would keep the gathered tensors on rank 0 only.
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        return {k: v.detach().cpu() for k, v in full.items()}

    def close(self) -> None:
        """Leave the group together: a barrier first, so that no rank tears down its gloo/nccl pairs
        while a peer is still inside its last collective, then destroy every group and collect the
        backend objects while the interpreter is alive (a gloo group freed during interpreter
        finalization can abort the process with ``terminate called without an active exception``)."""
        if dist.is_initialized():
            import gc

            dist.barrier()
            dist.destroy_process_group()
            gc.collect()


def init_world(settings, device: torch.device) -> World | None:
    """Join the torchrun group (``WORLD_SIZE > 1``) or return None (one process: nothing changes)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return None
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    device = torch.device(device)
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    backend = settings.process_group
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise ValueError("distributed.process_group='nccl' needs model.device on cuda; use 'gloo' on cpu")
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    return World(rank, size, local_rank, device, settings.update, backend)


class NullLogger:
    """The metrics logger of ranks other than 0: returns each record, writes nothing."""

    def log(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        return {"step": step, **dict(sorted(metrics.items()))}

    def log_rollouts(self, step: int, rollouts) -> None:
        pass

    def close(self) -> None:
        pass


def unshard(state_dict: dict[str, Any]) -> dict[str, Any]:
    """Full tensors for any DTensor values (a collective: every rank must call it)."""
    from torch.distributed.tensor import DTensor

    return {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in state_dict.items()}


class ShardedEngine(SeededEngine):
    """Generation and scoring split across the ranks (module docstring).

    Request seeds are drawn for the whole batch before it is split, as in :class:`SeededEngine`, so a
    prompt gets the same seed whatever rank generates it. ``follow`` (the training model, under FSDP)
    makes ``sync()`` gather its current weights into the engine's full copy; otherwise ``sync()`` is the
    inner engine's.

    Every rank calls ``generate`` with the same batch at the same point, so the batches must not depend
    on timing: ``supports_seeds`` is False and the asynchronous driver is not offered.
    """

    supports_seeds = False

    def open_stream(self):
        return None

    def __init__(self, engine: Engine, world: World, *, seed: int = 0, follow: torch.nn.Module | None = None):
        super().__init__(engine, seed)
        self.world = world
        self.follow = follow

    def _shard(self, lengths: list[int]) -> list[int]:
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        return [order[p] for p in self.world.my_positions(len(order))]

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        seeds = self.seeds.draw(len(prompts))
        mine = self._shard([len(p) for p in prompts])
        gens = (
            self.inner.generate([prompts[i] for i in mine], params, seeds=[seeds[i] for i in mine])
            if mine
            else []
        )
        out: list[Generation | None] = [None] * len(prompts)
        for part in self.world.all_gather_object(list(zip(mine, gens, strict=True))):
            for i, g in part:
                out[i] = g
        return out  # type: ignore[return-value]

    def score(self, contexts, continuations) -> list[np.ndarray]:
        mine = self._shard([len(c) + len(k) for c, k in zip(contexts, continuations, strict=True)])
        scores = (
            self.inner.score([contexts[i] for i in mine], [continuations[i] for i in mine]) if mine else []
        )
        out: list[np.ndarray | None] = [None] * len(contexts)
        for part in self.world.all_gather_object(list(zip(mine, scores, strict=True))):
            for i, s in part:
                out[i] = s
        return out  # type: ignore[return-value]

    def sync(self, state_dict=None) -> None:
        if state_dict is None and self.follow is not None:
            state_dict = self.world.full_state_dict(self.follow)
        elif state_dict is not None:
            state_dict = unshard(state_dict)
        self.inner.sync(state_dict)


def full_model_copy(model: torch.nn.Module, world: World) -> torch.nn.Module:
    """An unsharded, frozen copy of ``model`` (built from its config and gathered weights; with the
    same LoRA adapters when it has them)."""
    from transformers import AutoModelForCausalLM

    from horizonrl.models.lora import adapt_like, is_lora

    full = world.full_state_dict(model)
    dtype = next(iter(full.values())).dtype
    copy = AutoModelForCausalLM.from_config(model.config, dtype=dtype)
    if is_lora(model):
        adapt_like(model, copy)
    copy.load_state_dict(full)
    return copy.to(world.device).eval().requires_grad_(False)


# ---------------------------------------------------------------------- checkpoints


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
