"""Generation and scoring split across the ranks of a ``torchrun`` group (:mod:`horizonrl.world`).

Every rank runs the same trainer, so every rank calls ``generate`` with the same batch. Each call
draws one seed per prompt from the (identical) engine RNGs, every rank samples its share of the
prompts (sorted by length, dealt round-robin) with those seeds, and the results are all-gathered,
so every rank continues every program with the same tokens that one process would have sampled
(request seeding, :mod:`horizonrl.inference.seeding`). Under FSDP the training weights are
sharded, so the engine samples from a full copy (:func:`full_model_copy`), refreshed after every
update by gathering the weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from horizonrl.inference.base import Engine, Generation, SamplingParams
from horizonrl.inference.seeding import SeededEngine
from horizonrl.world import World


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
