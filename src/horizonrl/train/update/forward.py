"""The update's one forward path: rows -> micro-batches -> per-token log-probs.

Every pass of the update over training rows goes this way: the no-grad scoring of
:func:`~horizonrl.train.update.ppo.score_rows` (PPO's recomputed ``pi_old``, the rollout/train
consistency metrics) and each mini-batch of :func:`~horizonrl.train.update.ppo.ppo_update`.

1. **Once per pass** (:class:`RowForward`): with ``algo.tree_training: auto`` in one process, the
   model's FLOP cost (:func:`~horizonrl.train.update.prefix.prefix_cost`; None when it cannot share
   a prefix) and the check of its shared-prefix forward against the plain one on the longest row
   (:func:`~horizonrl.train.update.batching.verify_shared`, the KL reference model's too).
2. **Micro-batches** (:meth:`RowForward.micro_batches`, :func:`~horizonrl.train.update.chunks.update_chunks`):
   the rows sorted by length and split by ``micro_batch_tokens`` padded (``algo.pack_rows``: real)
   tokens, or in lexicographic order with their shared prefixes forwarded once when that costs fewer
   FLOPs; on several ranks this rank's share, with idle turns (weighted 0) so that every rank runs as
   many forwards and backwards.
3. **Log-probs** (:meth:`MicroBatch.logprobs`, :func:`~horizonrl.train.update.batching.token_logprobs`):
   ``log pi(y_t | y_<t) / T_t`` read off the plain full-logits forward, the lean one (chunked LM
   head, packed rows, bf16 autocast: ``lean.py``) or the shared-prefix one (``prefix.py``).

Each pass counts the tokens it forwarded (padding included) against the rows' own tokens
(:attr:`RowForward.tokens`), which the update logs as ``train/forwarded_tokens`` and
``train/row_tokens``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from horizonrl.train.update.batching import (
    RowBatch,
    collate,
    loss_positions,
    token_logprobs,
    verify_shared,
)
from horizonrl.train.update.chunks import forwarded_tokens, update_chunks
from horizonrl.train.update.lean import ForwardOptions, unwrap
from horizonrl.train.update.prefix import PrefixPlan, prefix_cost
from horizonrl.trajectory import Row


@dataclass
class MicroBatch:
    """One forward (in the loss loop: forward and backward) of the update."""

    #: Positions of its rows in the rows it was cut from (``[0]`` for an idle turn).
    positions: list[int]
    #: ``positions`` as a tensor on the device when cut from a collated mini-batch (it indexes the
    #: mini-batch's loss coefficients), else None.
    index: torch.Tensor | None
    #: Its rows as right-padded tensors.
    batch: RowBatch
    #: How its rows' shared prefixes are forwarded once (``prefix.plan_prefix``); None: plain rows.
    plan: PrefixPlan | None
    #: An idle rank's turn: run for the collectives only (its loss is weighted 0, its log-probs unused).
    idle: bool
    #: The last micro-batch of the pass (where gradients are reduced across ranks).
    last: bool

    def logprobs(self, model: torch.nn.Module, options: ForwardOptions) -> torch.Tensor:
        """``[B, T-1]`` log-probs of the targets under ``model`` (:func:`token_logprobs`), at the
        positions a loss reads (:func:`loss_positions`; the rest may be 0)."""
        return token_logprobs(model, self.batch, options, self.plan, read=loss_positions(self.batch))


class RowForward:
    """Micro-batches of rows and their log-probs under one model, one set of options (module docstring).

    ``ref_model``: a second model that runs the same micro-batches (the KL reference), checked on
    the shared-prefix path too. Shared prefixes need one process (several forwards make one backward,
    which DDP's and FSDP's hooks do not expect) and no gradient checkpointing (which drops the KV cache
    the shared segments pass on): otherwise every row trains on its own, with one warning.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        rows: Sequence[Row],
        options: ForwardOptions,
        *,
        micro_batch_tokens: int,
        device,
        pad_id: int = 0,
        world=None,
        ref_model: torch.nn.Module | None = None,
    ) -> None:
        self.options, self.budget, self.world = options, micro_batch_tokens, world
        self.device, self.pad_id = device, pad_id
        #: ``(forwarded, rows')`` tokens of the micro-batches taken so far (module docstring).
        self.tokens = (0, 0)
        self.cost = None
        if options.tree:
            why = _unshareable(model, world)
            self.cost = prefix_cost(model) if why is None else _warn_once(why)
        if self.cost is not None:
            verify_shared(model, rows, options)
            if ref_model is not None:
                verify_shared(ref_model, rows, options)

    def micro_batches(self, rows: Sequence[Row], mini_batch: RowBatch | None = None) -> Iterator[MicroBatch]:
        """This rank's micro-batches of ``rows``, planned when the first is taken.

        ``mini_batch`` (``rows`` collated, as the loss loop holds them with their coefficients): each
        micro-batch is a slice of it; without it each collates its own rows.
        """
        seqs = [r.input_ids for r in rows]
        chunks = update_chunks(seqs, self.budget, self.world, packed=self.options.pack, cost=self.cost)
        forwarded, own = self.tokens
        real = [c for c in chunks if c is not None]
        self.tokens = (
            forwarded + forwarded_tokens(seqs, real, packed=self.options.pack),
            own + sum(len(seqs[i]) for pos, _ in real for i in pos),
        )
        for k, chunk in enumerate(chunks):
            positions, plan = chunk or ([0], None)
            if mini_batch is None:
                index = None
                batch = collate([rows[i] for i in positions], pad_id=self.pad_id).to(self.device)
            else:
                index = torch.tensor(positions, device=self.device)
                batch = mini_batch.slice(index)
            yield MicroBatch(positions, index, batch, plan, chunk is None, k == len(chunks) - 1)


def _unshareable(model: torch.nn.Module, world) -> str | None:
    """Why the run's rows cannot share prefixes in the update (None: they can)."""
    if world is not None:
        return "under torchrun (distributed.update: ddp | fsdp) a backward follows exactly one forward"
    inner = unwrap(model)
    name = (
        "is_activation_checkpointing"
        if hasattr(inner, "is_activation_checkpointing")
        else "is_gradient_checkpointing"
    )
    if getattr(inner, name, False):
        return "train.gradient_checkpointing drops the KV cache that shared prefixes pass on"
    return None


_WARNED: set[str] = set()


def _warn_once(why: str) -> None:
    if why not in _WARNED:
        _WARNED.add(why)
        warnings.warn(f"algo.tree_training=auto: every row trains on its own: {why}", stacklevel=3)
