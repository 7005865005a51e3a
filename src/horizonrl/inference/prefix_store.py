"""Prefix reuse for the HF engine's continuous batcher: each rollout's latest KV cache.

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
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["PrefixEntry", "PrefixStore", "common_prefix"]


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two int arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    eq = a[:n] == b[:n]
    return n if bool(eq.all()) else int(np.argmin(eq))


@dataclass
class PrefixEntry:
    """The KV cache of ``ids``: per layer ``(keys, values)``, each ``[heads, len(ids), head_dim]``."""

    ids: np.ndarray
    kv: list[tuple[torch.Tensor, torch.Tensor]]

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
