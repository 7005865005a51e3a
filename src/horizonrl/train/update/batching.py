"""Rows to padded tensors, token-budgeted micro-batches, per-token log-probs (plain, or ``lean``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from horizonrl.train.update.lean import ForwardOptions, autocast, lean_logprobs, verify_once
from horizonrl.train.update.prefix import PrefixCost, PrefixPlan, plan_prefix, prefix_support, shared_logprobs
from horizonrl.trajectory import Row


@dataclass
class RowBatch:
    """Right-padded tensors for a list of rows; ``[B, T]`` except ``rollout_ids`` ``[B]``.

    Targets are shifted: position ``j`` holds the token at ``j + 1`` and the
    log-prob the model assigns to it given ``input_ids[: j + 1]``. ``old_logprobs``
    is PPO's ``pi_old`` (the rollout's, or the training model's recomputation) and
    ``rollout_logprobs`` what the rollout engine recorded (the mismatch correction
    weighs by their ratio).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    turn_ids: torch.Tensor
    rollout_ids: torch.Tensor
    temperatures: torch.Tensor
    rollout_logprobs: torch.Tensor

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def slice(self, idx: torch.Tensor | slice) -> RowBatch:
        return RowBatch(**{k: getattr(self, k)[idx] for k in self.__dataclass_fields__})

    def to(self, device: torch.device | str) -> RowBatch:
        return RowBatch(**{k: getattr(self, k).to(device) for k in self.__dataclass_fields__})


def collate(
    rows: Sequence[Row],
    *,
    pad_id: int = 0,
    pad_to: int | None = None,
    old_logprobs: Sequence[torch.Tensor] | None = None,
) -> RowBatch:
    """Pad ``rows`` to a common length (``pad_to`` or the longest row).

    ``old_logprobs`` (one ``[len(row) - 1]`` tensor per row, e.g. from ``update.score_rows``)
    replaces the rows' own log-probs as ``pi_old``; ``rollout_logprobs`` are always the rows'.
    """
    T = max(len(r) for r in rows) if pad_to is None else pad_to
    B = len(rows)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    att = torch.zeros((B, T), dtype=torch.long)
    tgt = torch.zeros((B, T - 1), dtype=torch.long)
    mask = torch.zeros((B, T - 1), dtype=torch.float32)
    old = torch.zeros((B, T - 1), dtype=torch.float32)
    adv = torch.zeros((B, T - 1), dtype=torch.float32)
    turn = torch.full((B, T - 1), -1, dtype=torch.long)
    temp = torch.ones((B, T - 1), dtype=torch.float32)
    rid = torch.tensor([r.rollout_index for r in rows], dtype=torch.long)
    for b, r in enumerate(rows):
        n = len(r)
        ids[b, :n] = torch.tensor(r.input_ids)
        att[b, :n] = 1
        tgt[b, : n - 1] = ids[b, 1:n]
        mask[b, : n - 1] = torch.tensor(r.trainable[1:], dtype=torch.float32)
        old[b, : n - 1] = torch.tensor(r.old_logprobs[1:], dtype=torch.float32)
        adv[b, : n - 1] = torch.tensor(r.advantages[1:], dtype=torch.float32)
        turn[b, : n - 1] = torch.tensor(r.turn_ids[1:], dtype=torch.long)
        temp[b, : n - 1] = torch.tensor(r.temperatures[1:], dtype=torch.float32)
    roll = old.clone()
    if old_logprobs is not None:
        for b, (r, lp) in enumerate(zip(rows, old_logprobs, strict=True)):
            old[b, : len(r) - 1] = lp.to(torch.float32) * mask[b, : len(r) - 1]
    return RowBatch(ids, att, tgt, mask, old, adv, turn, rid, temp, roll)


def micro_batches(lengths: Sequence[int], token_budget: int, *, packed: bool = False) -> list[list[int]]:
    """Split row indices (in the given order) into chunks of at most ``token_budget`` padded tokens
    (``packed``: tokens, the rows' summed lengths, as one packed sequence holds them).

    A single row longer than the budget gets a chunk of its own.
    """
    chunks: list[list[int]] = []
    cur: list[int] = []
    longest = total = 0
    for i, n in enumerate(lengths):
        if cur and (total + n if packed else max(longest, n) * (len(cur) + 1)) > token_budget:
            chunks.append(cur)
            cur, longest, total = [], 0, 0
        cur.append(i)
        longest = max(longest, n)
        total += n
    if cur:
        chunks.append(cur)
    return chunks


def token_logprobs(
    model: torch.nn.Module,
    batch: RowBatch,
    options: ForwardOptions | None = None,
    plan: PrefixPlan | None = None,
    *,
    read: torch.Tensor | None = None,
) -> torch.Tensor:
    """Log-prob of each target token under ``model``, ``[B, T-1]``.

    Logits are divided by each position's temperature (``batch.temperatures``: the
    temperature the token was sampled at), so the result is the log-prob of the
    distribution the rollout engine sampled from.

    ``options`` (:class:`~horizonrl.train.update.lean.ForwardOptions`): bf16 autocast, LM-head
    chunks and packed rows (``train/update/lean.py``); positions without a target are then 0.
    None or the defaults: one padded forward that materializes the ``[B, T, V]`` float32 logits.

    ``plan`` (:func:`~horizonrl.train.update.prefix.plan_prefix` of the batch's rows, from
    :func:`~horizonrl.train.update.chunks.update_chunks`): the rows' shared prefixes are forwarded once
    (``train/update/prefix.py``) when the plan shares one and the model can.

    ``read`` (bool, the shape of ``batch.targets``; :func:`loss_positions`): on the chunked, packed and
    shared paths the LM head runs only at these positions and the rest are 0 (the decoder still runs
    over every token). The head's ``2 H V`` FLOPs a position are a fifth of SmolLM2's forward, and an
    agent's rows are mostly prompt and tool tokens that no loss reads.
    """
    options = options or ForwardOptions()
    with autocast(options.precision, batch.input_ids.device):
        if plan is not None and plan.shares and prefix_support(model) is None:
            verify_once(model, batch, options, _full_logprobs, shared=_shared_check)
            return shared_logprobs(model, batch, options, plan, read=read)
        if not options.rewritten:
            return _full_logprobs(model, batch)
        verify_once(model, batch, options, _full_logprobs)
        return lean_logprobs(model, batch, options, read=read)


def loss_positions(batch: RowBatch) -> torch.Tensor:
    """Target positions whose log-prob the update reads: trainable ones (``mask``) and every token of a
    generated turn (``turn_ids >= 0``, which turn-level ratios average over)."""
    return (batch.mask > 0) | (batch.turn_ids >= 0)


#: A cost under which every common prefix is worth a forward of its own (the checks' plans).
SHARE_ALL = PrefixCost(per_token=1.0, per_pair=0.0)


def _shared_check(model: torch.nn.Module, batch: RowBatch, options: ForwardOptions) -> torch.Tensor:
    """:func:`shared_logprobs` of ``batch`` with every common prefix shared (``verify_once``'s check)."""
    lengths = batch.attention_mask.sum(1).tolist()
    seqs = [batch.input_ids[b, :n].tolist() for b, n in enumerate(lengths)]
    return shared_logprobs(model, batch, options, plan_prefix(seqs, SHARE_ALL))


def verify_shared(model: torch.nn.Module, rows: Sequence[Row], options: ForwardOptions) -> None:
    """Check the shared-prefix path of ``model`` against its plain forward (``lean.verify_once``) on the
    longest of ``rows``, up front, before any micro-batch."""
    if rows and prefix_support(model) is None:
        batch = collate([max(rows, key=len)]).to(next(model.parameters()).device)
        with autocast(options.precision, batch.input_ids.device):
            verify_once(model, batch, options, _full_logprobs, shared=_shared_check)


def _full_logprobs(model: torch.nn.Module, batch: RowBatch) -> torch.Tensor:
    """:func:`token_logprobs` through the model's own logits."""
    T = int(batch.attention_mask.sum(1).max())
    out = model(input_ids=batch.input_ids[:, :T], attention_mask=batch.attention_mask[:, :T], use_cache=False)
    logits = out.logits[:, :-1].float()
    temps = batch.temperatures[:, : T - 1]
    if bool((temps != 1.0).any()):
        logits = logits / temps.unsqueeze(-1)
    # gather - logsumexp: one [B, T, V] tensor (the logits) instead of two (logits + log-softmax).
    picked = torch.gather(logits, -1, batch.targets[:, : T - 1].unsqueeze(-1)).squeeze(-1)
    lp = picked - torch.logsumexp(logits, dim=-1)
    if lp.shape[1] < batch.targets.shape[1]:
        lp = F.pad(lp, (0, batch.targets.shape[1] - lp.shape[1]))
    return lp
