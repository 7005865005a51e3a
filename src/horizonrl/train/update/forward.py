"""The update's one forward path: rows -> micro-batches -> per-token log-probs.

Every pass of the update over training rows goes this way: the no-grad scoring of
:func:`~horizonrl.train.update.ppo.score_rows` (PPO's recomputed ``pi_old``, the rollout/train
consistency metrics) and each mini-batch of :func:`~horizonrl.train.update.ppo.ppo_update`.

1. **Once per pass** (:class:`RowForward`): with ``algo.tree_training: auto``, the model's FLOP
   cost (:func:`~horizonrl.train.update.tree.tree_cost`; None when it cannot take tree masks) and
   the check of its tree forward against the plain one on the longest row
   (:func:`~horizonrl.train.update.batching.verify_trees`, the KL reference model's too), up front,
   so that every rank runs the same check forwards.
2. **Micro-batches** (:meth:`RowForward.micro_batches`, :func:`~horizonrl.train.update.chunks.update_chunks`):
   the rows sorted by length and split by ``micro_batch_tokens`` padded (``algo.pack_rows``: real)
   tokens, or shared-prefix forests when those cost fewer FLOPs; on several ranks this rank's
   share, with idle turns (weighted 0) so that every rank runs as many forwards and backwards.
3. **Log-probs** (:meth:`MicroBatch.logprobs`, :func:`~horizonrl.train.update.batching.token_logprobs`):
   ``log pi(y_t | y_<t) / T_t`` read off the plain full-logits forward, the lean one (chunked LM
   head, packed rows, bf16 autocast: ``lean.py``) or the forest's (``tree.py``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from horizonrl.train.update.batching import RowBatch, collate, token_logprobs, verify_trees
from horizonrl.train.update.chunks import update_chunks
from horizonrl.train.update.lean import ForwardOptions
from horizonrl.train.update.tree import tree_cost
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
    #: How many consecutive rows form each shared-prefix tree; None: plain rows.
    trees: list[int] | None
    #: An idle rank's turn: run for the collectives only (its loss is weighted 0, its log-probs unused).
    idle: bool
    #: The last micro-batch of the pass (where gradients are reduced across ranks).
    last: bool

    def logprobs(self, model: torch.nn.Module, options: ForwardOptions) -> torch.Tensor:
        """``[B, T-1]`` log-probs of the targets under ``model`` (:func:`token_logprobs`)."""
        return token_logprobs(model, self.batch, options, self.trees)


class RowForward:
    """Micro-batches of rows and their log-probs under one model, one set of options (module docstring).

    ``ref_model``: a second model that runs the same micro-batches (the KL reference), checked on
    the tree path too.
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
        self.cost = tree_cost(model) if options.tree else None
        if self.cost is not None:
            verify_trees(model, rows, options)
            if ref_model is not None:
                verify_trees(ref_model, rows, options)

    def micro_batches(self, rows: Sequence[Row], mini_batch: RowBatch | None = None) -> Iterator[MicroBatch]:
        """This rank's micro-batches of ``rows``, planned when the first is taken.

        ``mini_batch`` (``rows`` collated, as the loss loop holds them with their coefficients): each
        micro-batch is a slice of it; without it each collates its own rows.
        """
        seqs = [r.input_ids for r in rows]
        chunks = update_chunks(seqs, self.budget, self.world, packed=self.options.pack, cost=self.cost)
        for k, chunk in enumerate(chunks):
            positions, trees = chunk or ([0], None)
            if mini_batch is None:
                index = None
                batch = collate([rows[i] for i in positions], pad_id=self.pad_id).to(self.device)
            else:
                index = torch.tensor(positions, device=self.device)
                batch = mini_batch.slice(index)
            yield MicroBatch(positions, index, batch, trees, chunk is None, k == len(chunks) - 1)
