"""How the update splits rows into forward/backward micro-batches: by padded or packed tokens, or as
forests of shared-prefix trees (``train/update/tree.py``), and, on several ranks, which are this rank's."""

from __future__ import annotations

from collections.abc import Sequence

from horizonrl.train.update.batching import micro_batches
from horizonrl.train.update.tree import TreeCost, plan_trees, tree_tokens

#: One micro-batch: positions of its rows, and how many consecutive rows form each tree (None: no trees).
Chunk = tuple[list[int], list[int] | None]

#: Trees are used for a batch of rows only when its forests cost at most this fraction of the FLOPs the
#: plain micro-batches would (:func:`forward_cost`: padding and the dense tree mask's attention included):
#: below 5 % the layout costs more than it saves (benchmarks/tree_training.py: 3 % fewer tokens on
#: Mosaic forks ran 5 % slower).
TREE_MAX_FRACTION = 0.95


def update_chunks(
    seqs: Sequence[Sequence[int]],
    budget: int,
    world=None,
    *,
    packed: bool = False,
    cost: TreeCost | None = None,
) -> list[Chunk | None]:
    """Micro-batches of the rows ``seqs`` (token ids) for this rank; ``None``: an idle rank's turn.

    Without ``cost``: rows sorted by length and split by ``budget`` padded (``packed``: real) tokens.
    With ``cost`` (tree training): shared-prefix trees (:func:`tree_chunks`) when, over all ranks, they
    cost at most :data:`TREE_MAX_FRACTION` of the plain micro-batches' FLOPs (:func:`forward_cost`; the
    same decision on every rank); otherwise the plain micro-batches. Counting FLOPs, not tokens, matters
    for small models, whose attention over a wide tree's dense mask outweighs the tokens it saves.
    """
    if cost is not None:
        trees = plan_trees(seqs, cost, budget)
        forest = _deal(seqs, trees, budget, None)
        plain = _plain_chunks(seqs, budget, None, packed)
        if forward_cost(seqs, forest, cost) <= TREE_MAX_FRACTION * forward_cost(
            seqs, plain, cost, packed=packed
        ):
            return forest if world is None else _deal(seqs, trees, budget, world)
    return _plain_chunks(seqs, budget, world, packed)


def _plain_chunks(seqs: Sequence[Sequence[int]], budget: int, world, packed: bool) -> list[Chunk | None]:
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    chunks = rank_chunks([len(seqs[i]) for i in order], budget, world, packed=packed)
    return [None if c is None else ([order[p] for p in c], None) for c in chunks]


def _forwards(
    seqs: Sequence[Sequence[int]], chunks: Sequence[Chunk | None], packed: bool
) -> list[tuple[int, int]]:
    """``(sequences, width)`` of each chunk's forward: rows x longest row (``packed``: one sequence of the
    rows' tokens), or for a forest trees x largest tree."""
    out = []
    for chunk in chunks:
        if chunk is None:
            continue
        pos, trees = chunk
        if trees is None:
            lengths = [len(seqs[i]) for i in pos]
            out.append((1, sum(lengths)) if packed else (len(lengths), max(lengths)))
            continue
        sizes, start = [], 0
        for n in trees:
            sizes.append(tree_tokens(seqs, pos[start : start + n]))
            start += n
        out.append((len(sizes), max(sizes)))
    return out


def forwarded_tokens(
    seqs: Sequence[Sequence[int]], chunks: Sequence[Chunk | None], *, packed: bool = False
) -> int:
    """Tokens the forwards of ``chunks`` process, padding included: rows x longest row (``packed``: the
    rows' lengths), or for a forest trees x largest tree."""
    return sum(count * width for count, width in _forwards(seqs, chunks, packed))


def forward_cost(
    seqs: Sequence[Sequence[int]], chunks: Sequence[Chunk | None], cost: TreeCost, *, packed: bool = False
) -> float:
    """FLOPs of the forwards of ``chunks`` by ``cost``: a padded micro-batch is rows x ``cost.tree(longest
    row)`` (a causal row is costed like a tree of its tokens), a packed one ``cost.tree(its tokens)`` (the
    masked attention spans the whole pack on CPU), a forest trees x ``cost.tree(largest tree)``."""
    return sum(count * cost.tree(width) for count, width in _forwards(seqs, chunks, packed))


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


def tree_chunks(seqs: Sequence[Sequence[int]], cost: TreeCost, budget: int, world=None) -> list[Chunk | None]:
    """Micro-batches of a forest: ``(positions into seqs, rows per tree)`` for this rank.

    Trees (:func:`plan_trees`) are sorted by size and split so that ``trees x largest tree`` stays
    within ``budget`` (padded tokens, as the plain path counts them); with ``world`` whole trees are
    dealt to the ranks and ``None`` pads a rank's list (:func:`rank_chunks`).
    """
    return _deal(seqs, plan_trees(seqs, cost, budget), budget, world)


def _deal(seqs: Sequence[Sequence[int]], trees: list[list[int]], budget: int, world) -> list[Chunk | None]:
    """:func:`tree_chunks` of already planned ``trees``."""
    sizes = [tree_tokens(seqs, t) for t in trees]
    # By size, then by tokens: the forests do not depend on the order the rows came in.
    order = sorted(range(len(trees)), key=lambda t: (sizes[t], list(seqs[trees[t][0]])))
    out: list[Chunk | None] = []
    for chunk in rank_chunks([sizes[t] for t in order], budget, world):
        if chunk is None:
            out.append(None)
            continue
        picked = [trees[order[c]] for c in chunk]
        out.append(([i for t in picked for i in t], [len(t) for t in picked]))
    return out
