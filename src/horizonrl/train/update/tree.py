"""Shared-prefix (tree) training: rows that share a token prefix are forwarded once, as a tree.

The G rollouts of a group share their prompt, RTPO's siblings share the trunk up to their boundary
(and each turn's exact context extends the previous turn's), every session its system prompt. The
plain update forwards and back-propagates every row's whole sequence; with
``algo.tree_training: auto`` the update instead lays the rows of a micro-batch out as a *forest*.

**Layout** (one tree): sort its rows lexicographically, so a row shares the most with the row before
it; row ``i``'s tokens ``j < lcp(r_{i-1}, r_i)`` are the nodes of row ``i-1`` and the rest are new
nodes appended in order. The rows holding a node are then contiguous (the nodes are in preorder), and

    position_id(node) = its depth j          (the position it has in every row that holds it)
    node a attends node b  <=>  b <= a < end(b)

where ``end(b)`` is one past the last node of ``b``'s subtree: ``b`` is an ancestor of ``a`` (or
``a`` itself). A node's ancestors are exactly the tokens before it in any row holding it, so its
hidden state, and every target log-prob read off it, equals the row's own forward to float
rounding; the LM head picks each row's targets from the nodes of that row (a shared node feeds
several rows' targets, and their gradients add up in its backward). A forest is ``F`` trees padded
to the largest, ``[F, N]`` tokens with an ``[F, 1, N, N]`` mask (boolean for sdpa, additive for
eager attention); padding attends only itself.

**Which rows share a tree** (:func:`plan_trees`). The mask is dense: a tree of ``N`` tokens costs
``N * per_token + N**2 * per_pair`` FLOPs (:class:`TreeCost`, from the model's shape), so a group
whose completions are long next to its prompt is cheaper as separate rows than as one wide tree.
In lexicographic order a row joins the current tree when that adds less cost than forwarding the
row alone and the tree stays within the micro-batch budget; otherwise it starts a new tree. A
forest whose trees are single rows is the plain padded batch, and the update runs the plain path.

**Which models.** sdpa and eager attention take a custom 4D mask (transformers returns a 4D
``attention_mask`` as is); flash-attention, flex attention and sliding-window layers do not, and
such models train without trees (a warning once). Like the other rewritten forwards the tree path
is compared once per model with the plain forward (``lean.verify_once``) on two rows that share a
prefix and then diverge.

This is exact sharing of computation, not an approximation: per-token log-probs, losses and
gradients equal the unshared update to float rounding (tests/test_tree_training.py). AReaL packs
trees of a group's samples the same way; here any rows that share tokens form one (session DAGs
included), because sharing is found from the token ids alone.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import torch

from horizonrl.train.update.lean import unwrap

#: Attention implementations that accept a custom 4D mask (boolean for sdpa, additive for eager).
TREE_ATTENTION = ("sdpa", "eager")


@dataclass(frozen=True)
class TreeCost:
    """FLOPs of one forward per token (``per_token``: the decoder's linear layers, L * 2 * (H * (2H +
    2 kv) + 3 H I)) and per attended (query, key) pair (``per_pair``: L * 4H, QK^T and AV).

    The LM head is left out: it runs once per row target whether rows share a tree or not.
    """

    per_token: float
    per_pair: float

    def tree(self, n: int) -> float:
        """Cost of forwarding a tree of ``n`` tokens under a dense ``n x n`` mask."""
        return n * self.per_token + n * n * self.per_pair

    @classmethod
    def of(cls, model: torch.nn.Module) -> TreeCost:
        inner = unwrap(model)
        cfg = inner.config.get_text_config() if hasattr(inner.config, "get_text_config") else inner.config
        H, L = int(cfg.hidden_size), int(cfg.num_hidden_layers)
        heads = int(getattr(cfg, "num_attention_heads", 1) or 1)
        kv = int(getattr(cfg, "num_key_value_heads", None) or heads) * (H // heads)
        width = int(getattr(cfg, "intermediate_size", None) or 4 * H)
        return cls(per_token=2.0 * L * (H * (2 * H + 2 * kv) + 3 * H * width), per_pair=4.0 * L * H)


def tree_support(model: torch.nn.Module) -> str | None:
    """None when ``model`` can forward a tree, else why not (its attention or its sliding windows)."""
    inner = unwrap(model)
    cfg = getattr(inner, "config", None)
    if cfg is None:
        return f"{type(inner).__name__} has no config"
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    impl = getattr(text, "_attn_implementation", None) or getattr(cfg, "_attn_implementation", None)
    if impl not in TREE_ATTENTION:
        return (
            f"its attention implementation {impl!r} takes no custom 4D mask (needs one of {TREE_ATTENTION})"
        )
    kinds = set(getattr(text, "layer_types", None) or ())
    if kinds - {"full_attention"} or getattr(text, "use_sliding_window", False):
        return f"it has sliding-window or other non-full attention layers ({sorted(kinds) or 'sliding'})"
    return None


_WARNED: set[str] = set()


def tree_cost(model: torch.nn.Module) -> TreeCost | None:
    """The model's :class:`TreeCost`, or None (with one warning per reason) when it cannot take trees."""
    why = tree_support(model)
    if why is None:
        return TreeCost.of(model)
    if why not in _WARNED:
        _WARNED.add(why)
        warnings.warn(
            f"algo.tree_training=auto: {type(unwrap(model)).__name__} trains without shared-prefix "
            f"trees: {why}",
            stacklevel=2,
        )
    return None


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    ta, tb = torch.as_tensor(a[:n]), torch.as_tensor(b[:n])
    diff = torch.nonzero(ta != tb)
    return int(diff[0, 0]) if diff.numel() else n


def plan_trees(seqs: Sequence[Sequence[int]], cost: TreeCost, budget: int) -> list[list[int]]:
    """Positions of ``seqs`` grouped into trees, each in lexicographic order (the module docstring).

    A row joins the current tree when it shares a prefix with the tree's last row, the tree stays
    within ``budget`` tokens and ``cost.tree(size + new) - cost.tree(size) < cost.tree(len(row))``.
    """
    order = sorted(range(len(seqs)), key=lambda i: list(seqs[i]))
    trees: list[list[int]] = []
    size = 0
    for i in order:
        n = len(seqs[i])
        if trees:
            shared = common_prefix(seqs[trees[-1][-1]], seqs[i])
            grown = size + n - shared
            if shared and grown <= budget and cost.tree(grown) - cost.tree(size) < cost.tree(n):
                trees[-1].append(i)
                size = grown
                continue
        trees.append([i])
        size = n
    return trees


def tree_tokens(seqs: Sequence[Sequence[int]], tree: Sequence[int]) -> int:
    """Nodes of one tree (its rows in lexicographic order): the first row plus each row's new suffix."""
    shared = sum(common_prefix(seqs[a], seqs[b]) for a, b in pairwise(tree))
    return sum(len(seqs[i]) for i in tree) - shared


@dataclass
class Forest:
    """Model inputs of a forest and where each row's positions sit in it.

    ``input_ids`` / ``position_ids`` ``[F, N]``; ``ends`` ``[F, N]`` (one past each node's subtree, the
    mask's right edge); ``where`` ``[B, T]``: the flat index (into ``F * N``) of row ``b``'s token ``j``.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    ends: torch.Tensor
    where: torch.Tensor

    @property
    def tokens(self) -> int:
        """Nodes forwarded (padding excluded)."""
        return int((self.ends > 0).sum())

    def attention_mask(self, impl: str, dtype: torch.dtype) -> torch.Tensor:
        """``[F, 1, N, N]``: query ``a`` sees key ``b`` iff ``b <= a < ends[b]`` (padding sees itself).

        Boolean for sdpa (True = attend); for eager, 0 where it attends and ``finfo(dtype).min`` elsewhere.
        """
        N = self.input_ids.shape[1]
        idx = torch.arange(N, device=self.ends.device)
        a, b = idx.view(N, 1), idx.view(1, N)
        see = (b <= a) & (a < self.ends.unsqueeze(1))
        see = see | (a == b)
        see = see.unsqueeze(1)
        if impl == "sdpa":
            return see
        return torch.zeros(see.shape, dtype=dtype, device=see.device).masked_fill(
            ~see, torch.finfo(dtype).min
        )


def build_forest(input_ids: torch.Tensor, lengths: Sequence[int], trees: Sequence[int]) -> Forest:
    """Lay out rows ``input_ids [B, T]`` (right-padded, row ``b`` ``lengths[b]`` tokens long) as a forest.

    ``trees``: how many consecutive rows form each tree. A row shares only with the row before it, so
    the rows holding a node are contiguous and the mask is the ancestor relation for any row order;
    lexicographic order (as :func:`~horizonrl.train.update.chunks.tree_chunks` gives it) shares the most.
    """
    B, T = input_ids.shape
    if sum(trees) != B:
        raise ValueError(f"trees={list(trees)} cover {sum(trees)} rows, the batch has {B}")
    ids = input_ids.cpu()
    where = torch.zeros(B, T, dtype=torch.long)
    parts = []  # (tokens, positions, ends) per tree
    start = 0
    for count in trees:
        toks, pos, ends_of = [], [], []
        node = 0
        for k, b in enumerate(range(start, start + count)):
            n = int(lengths[b])
            shared = (
                common_prefix(ids[b - 1, : int(lengths[b - 1])].tolist(), ids[b, :n].tolist()) if k else 0
            )
            if k and shared:
                where[b, :shared] = where[b - 1, :shared]
            new = n - shared
            local = torch.arange(node, node + new)
            where[b, shared:n] = local
            toks.append(ids[b, shared:n])
            pos.append(torch.arange(shared, n))
            node += new
            ends_of.append((where[b, :n].clone(), node))
        ends = torch.zeros(node, dtype=torch.long)
        for path, end in ends_of:  # later rows end later: the last row through a node sets its end
            ends[path] = end
        parts.append((torch.cat(toks), torch.cat(pos), ends))
        start += count
    N = max(len(p[0]) for p in parts)
    F = len(parts)
    tok = torch.zeros(F, N, dtype=torch.long)
    posi = torch.zeros(F, N, dtype=torch.long)
    end = torch.zeros(F, N, dtype=torch.long)
    row = 0
    for f, ((t, p, e), count) in enumerate(zip(parts, trees, strict=True)):
        tok[f, : len(t)], posi[f, : len(t)], end[f, : len(t)] = t, p, e
        where[row : row + count] += f * N
        row += count
    dev = input_ids.device
    return Forest(tok.to(dev), posi.to(dev), end.to(dev), where.to(dev))
