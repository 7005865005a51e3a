"""This process's place in a ``torchrun`` group: collectives, the DDP / FSDP2 wrap, gradient sync.

Launch any trainer with ``torchrun --nproc-per-node N -m horizonrl.cli train ...``
(docs/scale.md). Every rank runs the same trainer: the same task draws, agent
programs, credit and rows (all seeded alike), so nothing but the two expensive
parts has to be shared:

- **generation** (:class:`horizonrl.inference.sharded.ShardedEngine`): each ``generate``
  call draws one seed per prompt from the (identical) engine RNGs, every rank samples its
  share of the prompts with those seeds and the results are all-gathered, so every rank
  continues every program with the same tokens that one process would have sampled
  (request seeding, :mod:`horizonrl.inference.seeding`);
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

Checkpoints of a sharded run: :mod:`horizonrl.train.records.sharded_checkpoint`. Imports nothing
from horizonrl (like :mod:`horizonrl.cluster`, the Ray connection).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


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
