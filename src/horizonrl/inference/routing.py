"""Which replica serves which prompt of a batched call (prefix affinity within a balance bound).

Prompts of an agent step share long prefixes: a rollout's next turn extends its
previous prompt and response, RTPO siblings all continue the boundary context
``c_k`` their trunk turn was sampled from, a group's rollouts start from one task
prompt. An engine with a prefix cache (vLLM) serves such a prompt fastest on the
replica that already holds the prefix, so :class:`PrefixRouter` (the idea of
SGLang's cache-aware router, on hashed blocks instead of a radix tree):

- cuts every prompt into blocks of ``block`` tokens and hashes the chain
  ``h_i = hash((h_{i-1}, *block_i))`` (full blocks only, like vLLM's block hashes);
- remembers, per replica, the hashes of everything it served (prompts and their
  generated continuations; an LRU of ``capacity`` hashes);
- sends each prompt, in order, to the replica holding its longest chain of leading
  blocks (ties: the least loaded, then the lowest index) among the replicas that
  still have room: ``ceil(n / replicas * (1 + max_imbalance))`` prompts of the call.

Routing decides speed only: with request seeding (:mod:`.seeding`) a prompt's
sample is the same on every replica.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence


def block_hashes(ids: Sequence[int], block: int) -> list[int]:
    """Chained hashes of the full ``block``-token blocks of ``ids`` (deterministic: ints only)."""
    out, h = [], 0
    for start in range(0, len(ids) - block + 1, block):
        h = hash((h, *ids[start : start + block]))
        out.append(h)
    return out


class PrefixRouter:
    """Assigns the prompts of each call to replicas (module docstring); ``round_robin`` ignores prefixes."""

    def __init__(
        self,
        replicas: int,
        *,
        block: int = 16,
        max_imbalance: float = 0.25,
        mode: str = "prefix",
        capacity: int = 1 << 20,
    ) -> None:
        if replicas < 1:
            raise ValueError(f"PrefixRouter: replicas={replicas} must be >= 1")
        if mode not in ("prefix", "round_robin"):
            raise ValueError(f"PrefixRouter: mode={mode!r} must be 'prefix' or 'round_robin'")
        self.replicas = replicas
        self.block = block
        self.max_imbalance = max_imbalance
        self.mode = mode
        self.capacity = capacity
        self.tables: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(replicas)]
        self.matched_blocks = 0  # statistics: leading blocks found on the chosen replica
        self.total_blocks = 0

    def cap(self, n: int) -> int:
        """Most prompts one replica takes of a call with ``n`` prompts."""
        return max(math.ceil(n / self.replicas), math.ceil(n / self.replicas * (1 + self.max_imbalance)))

    def _match(self, r: int, hashes: list[int]) -> int:
        table, k = self.tables[r], 0
        for h in hashes:
            if h not in table:
                break
            k += 1
        return k

    def record(self, r: int, ids: Sequence[int]) -> None:
        """Remember that replica ``r`` holds the prefix blocks of ``ids``."""
        if self.mode != "prefix":
            return
        table = self.tables[r]
        for h in block_hashes(ids, self.block):
            table[h] = None
            table.move_to_end(h)
        while len(table) > self.capacity:
            table.popitem(last=False)

    def assign(self, prompts: Sequence[Sequence[int]]) -> list[int]:
        """Replica index of every prompt (recording each prompt's blocks on its replica)."""
        n = len(prompts)
        if self.replicas == 1:
            for p in prompts:
                self.record(0, p)
            return [0] * n
        if self.mode == "round_robin":
            return [i % self.replicas for i in range(n)]
        cap = self.cap(n)
        load = [0] * self.replicas
        out = []
        for p in prompts:
            hashes = block_hashes(p, self.block)
            best = min(
                (r for r in range(self.replicas) if load[r] < cap),
                key=lambda r: (-self._match(r, hashes), load[r], r),
            )
            self.matched_blocks += self._match(best, hashes)
            self.total_blocks += len(hashes)
            load[best] += 1
            out.append(best)
            self.record(best, p)
        return out

    def hit_rate(self) -> float:
        """Fraction of prompt blocks found on the replica each prompt was sent to (so far)."""
        return self.matched_blocks / self.total_blocks if self.total_blocks else 0.0
