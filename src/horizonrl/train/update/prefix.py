"""Prefix-shared training: rows that share a token prefix forward (and back-propagate) it once.

Every episode of a step starts with the same system prompt, tool block and few-shot examples; the G
rollouts of a group share their prompt; RTPO's siblings share the trunk up to their boundary (and
each turn's exact context extends the previous turn's); a subagent shares its parent's context. The
plain update forwards every row's whole sequence. With ``algo.tree_training: auto`` the rows of a
micro-batch are laid out as a **radix trie** of their token ids and each shared segment is forwarded
once, through the model's own KV cache:

    node n (tokens [s_n, e_n) shared by the rows below it), past = its ancestors' keys and values:
        h_n, (K_n, V_n) = model(tokens_n, positions s_n .. e_n - 1, past_key_values = K/V of its parent)
    a row's own tail (tokens [s, len) below its deepest shared node p), batched with its siblings:
        h_tail = model(tail tokens, right-padded, past = K/V of p expanded to the batch)

A token at depth ``j`` attends exactly the tokens ``< j`` of its row (its ancestors' keys and values
and its own segment's causal part), at position id ``j``, so its hidden state, and the log-prob
``log pi(y_{j+1} | y_<=j) / T`` read off it through the LM head, equal the row's own forward to float
rounding. The gradient of a shared node is the sum over the rows that attend it: autograd adds the
expanded keys' and values' gradients (``expand``'s backward is a sum). No ``[N, N]`` mask exists:
attention costs what the rows' causal attention costs, minus the shared queries.

**Which segments are shared** (:func:`plan_prefix`, from the token ids and the model's shape alone,
so seeded runs stay reproducible): a trie node whose ``k`` rows share ``s`` tokens becomes its own
forward when the ``(k - 1) * s`` tokens it saves cost more than one more forward call
(:class:`PrefixCost`: FLOPs per token from the layer shapes, a call's fixed cost per decoder layer);
a node that does not pay is folded into the nodes or tails below it. **Whether a batch of rows is
trained this way at all** (``chunks.update_chunks``): when its plan costs less than the plain padded
micro-batches (:func:`~horizonrl.train.update.chunks.forward_cost`).

**Which models**: any whose forward takes ``past_key_values`` (a transformers ``DynamicCache``) and
``position_ids``; sliding-window layers (a shared prefix past the window) and attention kernels that
are not sdpa/eager train on the plain path, with one warning naming the reason. Like the other
rewritten forwards, the path is checked once per model against the plain forward
(``lean.verify_once``) on two rows that share a prefix and then diverge.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import torch

from horizonrl.errors import ConfigError
from horizonrl.train.update.lean import LogprobHead, output_head, unwrap

#: Attention implementations the shared path is checked with (CPU and GPU sdpa, eager).
SHARED_ATTENTION = ("sdpa", "eager")

#: The fixed cost of one forward call per decoder layer, in FLOPs: kernel launches and Python dispatch
#: of a layer (about 0.2 ms on this CPU) at the ~50 GFLOP/s two cores reach on a dense layer. A shared
#: segment must save more than the call it adds: for SmolLM2 (30 layers) about one token, for the
#: embedded tiny model about a hundred (benchmarks/prefix_training.py measures both).
CALL_FLOPS_PER_LAYER = 1e7


@dataclass(frozen=True)
class PrefixCost:
    """A model's forward cost: ``per_token`` FLOPs of its linear layers, ``per_pair`` FLOPs per attended
    (query, key) pair, ``per_call`` FLOPs of one forward call's fixed cost, and ``kv_share``, the memory
    of one token's keys and values as a share of one token's saved activations (what an expanded past
    position costs a micro-batch's budget).

    per_token = L * 2 * (H * (2H + 2 kv) + 3 H I)        per_pair = L * 4H
    per_call  = L * CALL_FLOPS_PER_LAYER                 kv_share = 2 kv / (10 H + 4 I)

    The LM head is left out: it runs once per row target whichever way the rows are forwarded.
    """

    per_token: float
    per_pair: float
    per_call: float = 0.0
    kv_share: float = 0.0

    def forward(self, rows: int, width: int, past: int = 0) -> float:
        """FLOPs of one forward of ``rows`` sequences of ``width`` tokens (padding included) over ``past``
        cached tokens: the linear layers, dense attention over ``past + width`` keys, the call."""
        return rows * width * (self.per_token + (past + width) * self.per_pair) + self.per_call

    @classmethod
    def of(cls, model: torch.nn.Module) -> PrefixCost:
        inner = unwrap(model)
        cfg = inner.config.get_text_config() if hasattr(inner.config, "get_text_config") else inner.config
        H, L = int(cfg.hidden_size), int(cfg.num_hidden_layers)
        heads = int(getattr(cfg, "num_attention_heads", 1) or 1)
        kv = int(getattr(cfg, "num_key_value_heads", None) or heads) * int(
            getattr(cfg, "head_dim", None) or H // heads
        )
        width = int(getattr(cfg, "intermediate_size", None) or 4 * H)
        return cls(
            per_token=2.0 * L * (H * (2 * H + 2 * kv) + 3 * H * width),
            per_pair=4.0 * L * H,
            per_call=L * CALL_FLOPS_PER_LAYER,
            kv_share=2.0 * kv / (10 * H + 4 * width),
        )


def prefix_support(model: torch.nn.Module) -> str | None:
    """None when ``model`` can forward rows through shared keys and values, else why not."""
    inner = unwrap(model)
    cfg = getattr(inner, "config", None)
    if cfg is None:
        return f"{type(inner).__name__} has no config"
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    impl = getattr(text, "_attn_implementation", None) or getattr(cfg, "_attn_implementation", None)
    if impl not in SHARED_ATTENTION:
        return f"its attention implementation {impl!r} is not one of {SHARED_ATTENTION}"
    kinds = set(getattr(text, "layer_types", None) or ())
    if kinds - {"full_attention"} or (
        getattr(text, "use_sliding_window", False) and getattr(text, "sliding_window", None)
    ):
        return f"it has sliding-window or other non-full attention layers ({sorted(kinds) or 'sliding'})"
    return None


_WARNED: set[str] = set()


def prefix_cost(model: torch.nn.Module) -> PrefixCost | None:
    """The model's :class:`PrefixCost`, or None (with one warning per reason) when it cannot share."""
    why = prefix_support(model)
    if why is None:
        return PrefixCost.of(model)
    if why not in _WARNED:
        _WARNED.add(why)
        warnings.warn(
            f"algo.tree_training=auto: {type(unwrap(model)).__name__} trains every row on its own "
            f"(no shared prefixes): {why}",
            stacklevel=2,
        )
    return None


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


def lexicographic(seqs: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
    """Positions of ``seqs`` in lexicographic order, and each one's common prefix with the one before
    it in that order (0 for the first): rows that share a prefix are neighbours."""
    order = sorted(range(len(seqs)), key=lambda i: list(seqs[i]))
    lcp = [common_prefix(seqs[a], seqs[b]) for a, b in pairwise(order)]
    return order, [0, *lcp] if order else []


@dataclass(frozen=True)
class Node:
    """A shared segment: tokens ``[start, end)`` of every row in ``rows``, forwarded once over the keys
    and values of ``parent`` (an index into :attr:`PrefixPlan.nodes`, -1: no past)."""

    parent: int
    start: int
    end: int
    rows: tuple[int, ...]


@dataclass(frozen=True)
class PrefixPlan:
    """How one micro-batch's rows are forwarded: ``nodes`` (parents before children) and, per row, the
    deepest node it passes through (``tail_parent``, -1: none); its tokens from that node's end on
    (``tail_start``) are its own tail, forwarded in one batch with the other tails below that node."""

    nodes: tuple[Node, ...]
    tail_parent: tuple[int, ...]
    tail_start: tuple[int, ...]

    @property
    def shares(self) -> bool:
        return bool(self.nodes)

    def tail_groups(self) -> dict[int, list[int]]:
        """Rows with a tail to forward, by the node they continue (-1: from position 0)."""
        out: dict[int, list[int]] = {}
        for row, p in enumerate(self.tail_parent):
            out.setdefault(p, []).append(row)
        return out

    def tokens(self, lengths: Sequence[int]) -> int:
        """Tokens the plan forwards, the tails' right padding included."""
        n = sum(node.end - node.start for node in self.nodes)
        for rows in self.tail_groups().values():
            width = max(lengths[r] - self.tail_start[r] for r in rows)
            n += len(rows) * width
        return n

    def cost(self, lengths: Sequence[int], cost: PrefixCost) -> float:
        """FLOPs of the plan's forwards by ``cost`` (:meth:`PrefixCost.forward`); tails of zero width
        (rows wholly inside a shared node) cost nothing."""
        total = sum(cost.forward(1, n.end - n.start, n.start) for n in self.nodes)
        for p, rows in self.tail_groups().items():
            past = self.nodes[p].end if p >= 0 else 0
            width = max(lengths[r] - self.tail_start[r] for r in rows)
            if width > 0:
                total += cost.forward(len(rows), width, past)
        return total


def plan_prefix(seqs: Sequence[Sequence[int]], cost: PrefixCost) -> PrefixPlan:
    """The shared segments of ``seqs`` (one micro-batch's rows) worth a forward of their own.

    The radix trie of the rows, built from their lexicographic order: a run of neighbouring rows whose
    adjacent common prefixes are all at least ``m`` shares tokens ``[base, m)`` (``base``: the end of
    its nearest shared ancestor). That run becomes a :class:`Node` when the tokens it saves pay for
    the call: ``(k - 1) * (m - base) * per_token > per_call``; either way the run is split where the
    common prefix equals ``m`` and each part is planned below it (an unshared node's tokens move down
    into its children's nodes or tails).
    """
    n = len(seqs)
    order, lcp = lexicographic(seqs)
    nodes: list[Node] = []
    tail_parent = [-1] * n
    tail_start = [0] * n

    def plan(lo: int, hi: int, parent: int, base: int) -> None:
        # Rows order[lo:hi] share a prefix at least `base` long; `parent` is the node ending at `base`.
        if hi - lo == 1:
            row = order[lo]
            tail_parent[row], tail_start[row] = parent, base
            return
        m = min(lcp[lo + 1 : hi])
        if m > base and (hi - lo - 1) * (m - base) * cost.per_token > cost.per_call:
            nodes.append(Node(parent, base, m, tuple(sorted(order[lo:hi]))))
            parent, base = len(nodes) - 1, m
        cut = lo
        for i in range(lo + 1, hi + 1):
            if i == hi or lcp[i] == m:
                plan(cut, i, parent, base)
                cut = i

    if n:
        plan(0, n, -1, 0)
    return PrefixPlan(tuple(nodes), tuple(tail_parent), tuple(tail_start))


# ------------------------------------------------------------------------------------------- forward


def _cache_keyword(model: torch.nn.Module) -> str:
    """The forward's name for the KV cache: ``cache`` (transformers >= 5.x) or ``past_key_values``."""
    inner = unwrap(model)
    inner = getattr(inner, "_module", inner)  # models.lora.FrozenBase: the module it calls
    params = inspect.signature(inner.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _new_cache(model: torch.nn.Module, past, rows: int):
    """A transformers ``DynamicCache`` holding ``past`` (per layer ``(keys, values)``, batch 1) expanded
    to ``rows`` rows (``expand``: its backward sums the rows' gradients into the shared keys)."""
    from transformers import DynamicCache

    try:
        cache = DynamicCache(config=unwrap(model).config)
    except TypeError:  # older transformers
        cache = DynamicCache()
    for layer, (k, v) in enumerate(past or ()):
        cache.update(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1), layer)
    return cache


def _segment(model: torch.nn.Module, ids: torch.Tensor, start: int, past, key: str):
    """Hidden states ``[rows, s, H]`` of tokens ``ids`` ``[rows, s]`` at positions ``start ..`` over the
    keys and values ``past`` (of the ``start`` tokens before them; None when ``start`` is 0), and the
    keys and values of ``past`` plus these tokens (of row 0). The LM head is the identity meanwhile."""
    rows, s = ids.shape
    cache = _new_cache(model, past, rows)
    pos = torch.arange(start, start + s, device=ids.device).expand(rows, s)
    hidden = model(input_ids=ids, position_ids=pos, use_cache=True, **{key: cache}).logits
    if cache.get_seq_length() != start + s:
        raise ConfigError(
            f"algo.tree_training=auto: {type(unwrap(model)).__name__} left {cache.get_seq_length()} "
            f"positions in the KV cache it was given, not {start + s}: its forward does not take "
            f"`{key}`, so rows cannot share a prefix; set algo.tree_training=off"
        )
    return hidden, [(layer.keys[:1], layer.values[:1]) for layer in cache.layers]


def shared_hidden(
    model: torch.nn.Module, ids: torch.Tensor, lengths: Sequence[int], plan: PrefixPlan
) -> tuple[torch.Tensor, torch.Tensor]:
    """The final hidden states (after the model's last norm) of every position of the rows ``ids``
    (``[B, >= max(lengths)]``, right-padded), forwarded by ``plan`` (module docstring):
    ``(hidden [M, H], where [B, T])``, row ``b``'s position ``j`` at ``hidden[where[b, j]]``.

    The model's forward runs with an identity LM head, so its "logits" are those hidden states.
    """
    B, T = len(lengths), max(lengths)
    where = torch.zeros(B, T, dtype=torch.long)
    parts: list[torch.Tensor] = []
    offset = 0
    key = _cache_keyword(model)
    inner = unwrap(model)
    head = inner.get_output_embeddings()
    kv: dict[int, list] = {}
    inner.set_output_embeddings(torch.nn.Identity())
    try:
        for k, node in enumerate(plan.nodes):
            r = node.rows[0]
            h, kv[k] = _segment(
                model, ids[r : r + 1, node.start : node.end], node.start, kv.get(node.parent), key
            )
            span = torch.arange(offset, offset + node.end - node.start)
            for r in node.rows:
                where[r, node.start : node.end] = span
            parts.append(h.reshape(-1, h.shape[-1]))
            offset += node.end - node.start
        for parent, rows in plan.tail_groups().items():
            start = plan.nodes[parent].end if parent >= 0 else 0
            width = max(lengths[r] - start for r in rows)
            if width <= 0:  # rows wholly inside shared nodes
                continue
            h, _ = _segment(model, ids[rows, start : start + width], start, kv.get(parent), key)
            for i, r in enumerate(rows):
                where[r, start : lengths[r]] = torch.arange(lengths[r] - start) + offset + i * width
            parts.append(h.reshape(-1, h.shape[-1]))
            offset += len(rows) * width
    finally:
        inner.set_output_embeddings(head)
    return torch.cat(parts), where.to(ids.device)


def shared_logprobs(
    model: torch.nn.Module, batch, opts, plan: PrefixPlan, *, read: torch.Tensor | None = None
) -> torch.Tensor:
    """``token_logprobs`` of a right-padded ``RowBatch`` forwarded by ``plan`` (module docstring):
    ``[B, T-1]``, 0 where there is no target (or outside ``read`` when it is given), the rest equal to
    the plain path to float rounding.

    :func:`shared_hidden` gives every position's final hidden state; the real LM head then reads each
    row's targets through :class:`~horizonrl.train.update.lean.LogprobHead` (``opts.chunk_tokens``
    positions at a time), from whichever segment holds the position.
    """
    lengths = batch.attention_mask.sum(1).tolist()
    hidden, where = shared_hidden(model, batch.input_ids, lengths, plan)
    reader = LogprobHead.of_batch(output_head(model, opts), batch, where, opts.chunk_tokens, read)
    return reader.scatter(reader(hidden), batch.targets.shape[1])
