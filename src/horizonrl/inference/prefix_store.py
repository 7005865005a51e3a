"""Prefix reuse for the HF engine: each rollout's latest KV cache, kept for its next prompt.

Multi-turn agents re-send their whole context every turn: turn ``t + 1``'s prompt
is turn ``t``'s prompt, its generation and an observation. A :class:`PrefixStore`
keeps, per *lineage* (one agent program: a rollout's root, or one of its subagents,
each with its compaction or selection sessions), the KV cache of the last generation
that ended (prompt and generated tokens, all but the last
token, which was never forwarded). A later request of the same lineage reuses the
longest common prefix of its prompt with that cache (at most all but its last
token, whose logits are needed), so only the rest is prefilled.

Why per lineage and not a global cache: whether a request finds another rollout's
cache would depend on timing (which generations ended first), and a reused
key/value differs from a recomputed one by float rounding, so a run would no longer
be reproducible for a fixed seed. A program makes its next request only after its
previous generation ended, so what it reuses is fixed by the program itself (two
subagents of one rollout run side by side, so they are two lineages).
Identical prompts admitted together are prefilled once (:mod:`.hf_stream`); that
shares computation without changing any value. A stream (one asynchronous-driver
run, one policy version) owns its store, so a cache never outlives its weights.

The round-by-round driver calls :meth:`HFEngine.generate` once per turn with every running episode's
prompt, so there the lineage is implicit: a :class:`TurnStore` keeps the caches of the rows of the last
call (``inference.params.turn_reuse``), and a prompt of the next call reuses the kept cache it extends
the furthest. What it finds depends only on the two calls' token ids, which the config and seeds fix, so
seeded runs stay reproducible; the store is dropped when the weights change.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from horizonrl.inference.batching import left_pad

__all__ = ["PrefixEntry", "PrefixStore", "TurnStore", "cached_prefill", "common_prefix", "row_entry"]


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two int arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    eq = a[:n] == b[:n]
    return n if bool(eq.all()) else int(np.argmin(eq))


@dataclass
class PrefixEntry:
    """The KV cache of ``ids``: per layer ``(keys, values)``, each ``[heads, len(ids) - start, head_dim]``
    (the first ``start`` ids are the engine's shared prefix, whose keys and values it keeps once)."""

    ids: np.ndarray
    kv: list[tuple[torch.Tensor, torch.Tensor]]
    start: int = 0

    @property
    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.kv)


class PrefixStore:
    """The latest finished cache of each lineage (module docstring)."""

    def __init__(self) -> None:
        self.entries: dict[Hashable, PrefixEntry] = {}

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())

    def put(self, lineage: Hashable, ids: Sequence[int], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Keep the cache of ``ids`` as ``lineage``'s (replacing the one it had)."""
        if lineage is not None and len(ids):
            self.entries[lineage] = PrefixEntry(np.asarray(ids, dtype=np.int64), kv)

    def match(self, lineage: Hashable, prompt: Sequence[int]) -> tuple[PrefixEntry | None, int]:
        """``(entry, m)``: ``lineage``'s cache and the length of its common prefix with ``prompt``, capped at
        ``len(prompt) - 1``; ``(None, 0)`` when there is none or it shares no token. The entry leaves the
        store (a lineage has one request at a time, whose own cache replaces it when it ends), so a
        running request's prefix is not held twice."""
        entry = self.entries.pop(lineage, None) if lineage is not None else None
        if entry is None:
            return None, 0
        m = min(common_prefix(entry.ids, np.asarray(prompt, dtype=np.int64)), len(prompt) - 1)
        return (entry, m) if m > 0 else (None, 0)

    def forget(self, lineage: Hashable) -> None:
        """Drop ``lineage``'s cache (its rollout ended)."""
        self.entries.pop(lineage, None)


class TurnStore:
    """The caches of the rows of one :meth:`HFEngine.generate` call, for the prompts of the next (module
    docstring). ``tag`` is what the caches are valid under, ``(shared prefix, weights' version)``: the
    engine's shared-prefix object they follow (or None) and :func:`.shared_prefix.weights_version`
    (:meth:`fits`)."""

    def __init__(self, tag: tuple[object, tuple[int, ...]], limit_bytes: float = float("inf")) -> None:
        self.tag = tag
        self.limit_bytes = limit_bytes
        self.entries: list[PrefixEntry] = []
        self.nbytes = 0

    def add(self, entry: PrefixEntry | None) -> None:
        """Keep ``entry``, unless that would hold more than ``limit_bytes`` (rows come in a fixed order, so
        which ones are kept is fixed too)."""
        if entry is not None and self.nbytes + entry.nbytes <= self.limit_bytes:
            self.entries.append(entry)
            self.nbytes += entry.nbytes

    def keep(self, cache, mask: torch.Tensor, row: int, ids: Sequence[int], start: int) -> None:
        """:meth:`add` row ``row``'s cache of ``ids`` (:func:`row_entry`), copied only if it fits."""
        per_position = sum(
            2 * layer.keys[row, :, :1].numel() * layer.keys.element_size() for layer in cache.layers
        )
        if self.nbytes + (len(ids) - start) * per_position <= self.limit_bytes:
            self.add(row_entry(cache, mask, row, ids, start))

    def fits(self, tag: tuple[object, tuple[int, ...]]) -> bool:
        """Whether the caches are valid under ``tag`` (the same shared-prefix object, the same version)."""
        return tag[0] is self.tag[0] and tag[1] == self.tag[1]

    def match(self, prompt: Sequence[int], floor: int) -> tuple[PrefixEntry | None, int]:
        """``(entry, m)``: the kept cache sharing the longest prefix with ``prompt`` (the first of equals),
        ``m`` capped at ``len(prompt) - 1``; ``(None, floor)`` when none shares more than ``floor`` tokens
        (the shared prefix, which every entry starts after)."""
        p = np.asarray(prompt, dtype=np.int64)
        best, m = None, floor
        for entry in self.entries:
            n = min(common_prefix(entry.ids, p), len(p) - 1)
            if n > m and n >= entry.start:
                best, m = entry, n
        return best, m


def cached_prefill(
    prompts: Sequence[Sequence[int]],
    found: Sequence[tuple[PrefixEntry | None, int]],
    skip: int,
    pad_id: int,
    device: torch.device,
    cache,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The prefill of ``prompts`` whose first ``m`` tokens are cached, ``found[r] = (entry, m)``:
    ``(ids, mask, pos)`` of what is left to prefill, with ``cache`` (a fresh ``DynamicCache``) holding
    each row's kept keys and values, ``m - skip`` of its ``entry`` (none without one; ``skip``, the
    engine's shared prefix, is held elsewhere). The batch is ``[kept | new tokens]``, each part
    left-padded, and position ids count every token before (so row ``r``'s first new token sits at
    ``m``)."""
    ids, mask, pos = left_pad([p[m:] for p, (_, m) in zip(prompts, found, strict=True)], pad_id, device)
    kept = [m - skip if entry is not None else 0 for entry, m in found]
    width = max(kept, default=0)
    if width:
        for layer in range(len(cache.layers)):
            cache.update(*_kept_kv(found, kept, layer, width), layer)
        cols = torch.arange(width, device=device)
        short = width - torch.tensor(kept, device=device)[:, None]
        mask = torch.cat([(cols >= short).to(mask.dtype), mask], dim=1)
    return ids, mask, pos + torch.tensor([m for _, m in found], device=device)[:, None]


def _kept_kv(
    found: Sequence[tuple[PrefixEntry | None, int]], kept: list[int], layer: int, width: int
) -> tuple[torch.Tensor, ...]:
    """Layer ``layer``'s kept keys and values, ``[rows, heads, width, head_dim]``: each row's first
    ``kept[r]`` cached positions, left-padded with zeros (all zeros for a row without a cache)."""
    ref = next(entry.kv[layer][0] for (entry, _), k in zip(found, kept, strict=True) if k)
    out = []
    for part in (0, 1):
        shape = (len(found), ref.shape[0], width, ref.shape[2])
        rows = torch.zeros(shape, dtype=ref.dtype, device=ref.device)
        for r, ((entry, _), k) in enumerate(zip(found, kept, strict=True)):
            if k:
                rows[r, :, width - k :] = entry.kv[layer][part][:, :k]
        out.append(rows)
    return tuple(out)


def row_entry(cache, mask: torch.Tensor, row: int, ids: Sequence[int], start: int = 0) -> PrefixEntry | None:
    """Row ``row``'s cache of ``ids`` (all of them but the first ``start``) as a :class:`PrefixEntry`:
    its first ``len(ids) - start`` unmasked positions (a row that ended and kept decoding in its batch
    has more after them); None when it holds fewer."""
    cols = mask[row].nonzero().squeeze(-1)
    n = len(ids) - start
    if n <= 0 or len(cols) < n:
        return None
    cols = cols[:n]
    kv = [(layer.keys[row][:, cols], layer.values[row][:, cols]) for layer in cache.layers]
    return PrefixEntry(np.asarray(ids, dtype=np.int64), kv, start)
