"""How the update splits rows into forward/backward micro-batches: by padded or packed tokens, or in
lexicographic order with their shared prefixes forwarded once (``train/update/prefix.py``), and, on
several ranks, which are this rank's."""

from __future__ import annotations

from collections.abc import Sequence

from horizonrl.train.update.batching import micro_batches
from horizonrl.train.update.prefix import PrefixCost, PrefixPlan, lexicographic, plan_prefix

#: One micro-batch: positions of its rows, and the plan that forwards their shared prefixes once (None:
#: every row on its own).
Chunk = tuple[list[int], PrefixPlan | None]


def update_chunks(
    seqs: Sequence[Sequence[int]],
    budget: int,
    world=None,
    *,
    packed: bool = False,
    cost: PrefixCost | None = None,
) -> list[Chunk | None]:
    """Micro-batches of the rows ``seqs`` (token ids) for this rank; ``None``: an idle rank's turn.

    Without ``cost``: rows sorted by length and split by ``budget`` padded (``packed``: real) tokens.
    With ``cost`` (``algo.tree_training: auto``, one process): the shared-prefix micro-batches of
    :func:`prefix_chunks` when their forwards cost fewer FLOPs than the plain ones
    (:func:`forward_cost`, a forward call's fixed cost included), otherwise the plain micro-batches.
    """
    plain = _plain_chunks(seqs, budget, world, packed)
    if cost is None or world is not None:
        return plain
    shared = prefix_chunks(seqs, cost, budget)
    if forward_cost(seqs, shared, cost) < forward_cost(seqs, plain, cost, packed=packed):
        return shared
    return plain


def prefix_chunks(seqs: Sequence[Sequence[int]], cost: PrefixCost, budget: int) -> list[Chunk]:
    """Micro-batches of rows in lexicographic order, each with its :func:`plan_prefix`.

    A micro-batch's size is the tokens its trie holds (each row adds what it does not share with the row
    before it) plus, for each row, the keys and values it attends in a shared prefix expanded to its
    batch (``cost.kv_share`` of a token each); a row that would take it past ``budget`` starts the
    next one (a row longer than the budget gets one of its own).
    """
    order, lcp = lexicographic(seqs)
    groups: list[list[int]] = []
    size = 0.0
    for i, shared in zip(order, lcp, strict=True):
        add = len(seqs[i]) - shared + cost.kv_share * shared
        if groups and size + add <= budget:
            groups[-1].append(i)
            size += add
        else:
            groups.append([i])
            size = len(seqs[i])
    return [(g, plan_prefix([seqs[i] for i in g], cost)) for g in groups]


def _plain_chunks(seqs: Sequence[Sequence[int]], budget: int, world, packed: bool) -> list[Chunk | None]:
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    chunks = rank_chunks([len(seqs[i]) for i in order], budget, world, packed=packed)
    return [None if c is None else ([order[p] for p in c], None) for c in chunks]


def _plain_shape(lengths: Sequence[int], packed: bool) -> tuple[int, int]:
    """``(sequences, width)`` of a plain micro-batch: rows x longest row, or one packed sequence."""
    return (1, sum(lengths)) if packed else (len(lengths), max(lengths))


def forwarded_tokens(
    seqs: Sequence[Sequence[int]], chunks: Sequence[Chunk | None], *, packed: bool = False
) -> int:
    """Tokens the forwards of ``chunks`` process, padding included: rows x longest row (``packed``: the
    rows' lengths), or a plan's shared segments and padded tails (``PrefixPlan.tokens``)."""
    total = 0
    for chunk in chunks:
        if chunk is None:
            continue
        pos, plan = chunk
        lengths = [len(seqs[i]) for i in pos]
        if plan is not None and plan.shares:
            total += plan.tokens(lengths)
        else:
            rows, width = _plain_shape(lengths, packed)
            total += rows * width
    return total


def forward_cost(
    seqs: Sequence[Sequence[int]], chunks: Sequence[Chunk | None], cost: PrefixCost, *, packed: bool = False
) -> float:
    """FLOPs of the forwards of ``chunks`` by ``cost``: a plain micro-batch is one
    ``cost.forward(rows, longest row)`` (packed: one sequence of its tokens; the masked attention spans
    the whole pack on CPU), a shared one its plan's forwards (``PrefixPlan.cost``)."""
    total = 0.0
    for chunk in chunks:
        if chunk is None:
            continue
        pos, plan = chunk
        lengths = [len(seqs[i]) for i in pos]
        if plan is not None and plan.shares:
            total += plan.cost(lengths, cost)
        else:
            total += cost.forward(*_plain_shape(lengths, packed))
    return total


def rank_chunks(
    lengths: Sequence[int], budget: int, world, *, packed: bool = False
) -> list[list[int] | None]:
    """Micro-batches (positions into ``lengths``, sorted by length) of this rank (``packed``: the
    budget counts real tokens, :func:`~horizonrl.train.update.batching.micro_batches`).

    Without ``world``: all of them. With one: the rank's positions (round-robin), split by
    ``budget`` and padded with ``None`` (a zero-weighted micro-batch) to the largest count of
    any rank, so every rank runs the same forwards and backwards (FSDP / DDP collectives).
    """
    if world is None:
        return list(micro_batches(lengths, budget, packed=packed))
    mine = world.my_positions(len(lengths))
    chunks: list[list[int] | None] = [
        [mine[c] for c in chunk] for chunk in micro_batches([lengths[p] for p in mine], budget, packed=packed)
    ]
    n = int(world.max([len(chunks)])[0])
    return chunks + [None] * (n - len(chunks))
