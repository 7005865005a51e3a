"""ECHO graph credit: outcome credit propagated backwards over the memory DAG (the authors' released
``graph`` credit; docs/released_recipes.md). Not in the paper, whose credit is the binary mask of
:mod:`horizonrl.credit.echo` (Eq. 13); ``credit: graph`` of the ``echo`` estimator selects this.

The DAG (:func:`memory_graph`, read from the rollout the ECHO agent recorded): one node per memory
record ``i`` (source-turn index). The parents of record ``i``, produced in working segment ``s``, are
what was in its context: the records rebuilt into ``s`` (``I_src(s)`` = that segment's ``selected``
∪ ``kept_latest``) over a *segment* edge, and the earlier records produced in ``s`` over a *turn*
edge. The outcome is a node whose parents are, likewise, the last segment's ``I_src`` and its own
records.

Coefficients (:func:`graph_coefficients`), with ``c(outcome) = 1``::

    c(v) = min(clip, AGG_{(w, kind) : v is a parent of w} gamma_kind * c(w))     AGG = sum | max

so a record reaches a coefficient only through paths to the outcome (an unrelated later child of the
same parent adds nothing); ``gamma_turn`` discounts turn edges, ``gamma_segment`` segment edges
(the authors' single-``gamma`` version is ``gamma_turn = gamma_segment``); ``clip`` (None: none) caps
every node's coefficient, and parents read the capped value.

Token weights (:func:`graph_weights`): 1 on tokens of the last segment and of selection spans; else
``c(d_q)`` for an action token of record ``d_q`` and ``c(f_q)`` for a finding token of record
``f_q``; 0 elsewhere. The ``echo`` estimator multiplies them by ``max(A, 0)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from horizonrl.trajectory import Rollout

__all__ = [
    "AGGREGATIONS",
    "GraphCycleError",
    "MemoryGraph",
    "graph_coefficients",
    "graph_weights",
    "memory_graph",
    "read_selected",
]

AGGREGATIONS = ("sum", "max")
EDGE_KINDS = ("turn", "segment")
Edge = tuple[int, str]  # (record, edge kind)


class GraphCycleError(ValueError):
    """The memory graph has a cycle (the estimator then falls back to the token mask)."""


@dataclass(frozen=True)
class MemoryGraph:
    """``parents[i]``: ``(parent record, edge kind)`` of record ``i``; ``outcome``: the outcome's."""

    parents: dict[int, tuple[Edge, ...]]
    outcome: tuple[Edge, ...]


def read_selected(info: dict, where: str) -> frozenset[int] | None:
    """``info["selected"] ∪ info["kept_latest"]`` as source-turn ids; None without ``selected``."""
    if info.get("selected") is None:
        return None
    out: set[int] = set()
    for key in ("selected", "kept_latest"):
        for i in info.get(key) or ():
            if isinstance(i, bool) or int(i) != i:
                raise ValueError(f"{where}[{key!r}] must hold integer source-turn ids, got {i!r}")
            out.add(int(i))
    return frozenset(out)


def memory_graph(rollout: Rollout) -> MemoryGraph:
    """The memory DAG of one ECHO rollout (module docstring); selection segments produce no records."""
    parents: dict[int, tuple[Edge, ...]] = {}
    outcome: tuple[Edge, ...] = ()
    for s, seg in enumerate(rollout.segments):
        if seg.kind == "selection":
            continue
        rebuilt = (read_selected(seg.info, f"segments[{s}].info") or frozenset()) if s > 0 else frozenset()
        context: list[Edge] = [(j, "segment") for j in sorted(rebuilt)]
        for turn in seg.turns:
            own = sorted(
                {int(sp.source_turn) for sp in turn.spans if sp.label == "action" and _is_id(sp.source_turn)}
            )
            for i in own:
                if i not in parents:
                    parents[i] = tuple(context)
                    context.append((i, "turn"))
        outcome = tuple(context)
    return MemoryGraph(parents, outcome)


def _is_id(x: object) -> bool:
    return x is not None and int(x) >= 0  # type: ignore[call-overload]


def graph_coefficients(
    graph: MemoryGraph,
    *,
    gamma_turn: float = 1.0,
    gamma_segment: float = 0.9,
    aggregation: str = "sum",
    clip: float | None = 5.0,
) -> tuple[dict[int, float], dict[str, float]]:
    """``c(v)`` for every node (module docstring) and ``{"active", "clipped", "clip_ratio"}``.

    Raises :class:`GraphCycleError` when the graph has a cycle.
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"graph aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    gammas = {"turn": float(gamma_turn), "segment": float(gamma_segment)}
    nodes = (
        set(graph.parents)
        | {p for edges in graph.parents.values() for p, _ in edges}
        | {p for p, _ in graph.outcome}
    )
    children: dict[int, list[tuple[int | None, str]]] = {v: [] for v in nodes}  # None: the outcome
    for w, edges in graph.parents.items():
        for p, kind in edges:
            children[p].append((w, kind))
    for p, kind in graph.outcome:
        children[p].append((None, kind))
    for v in children:
        for _, kind in children[v]:
            if kind not in gammas:
                raise ValueError(f"edge kind must be one of {EDGE_KINDS}, got {kind!r}")
    waiting = {v: sum(w is not None for w, _ in ch) for v, ch in children.items()}
    ready = [v for v, n in waiting.items() if n == 0]
    coef: dict[int, float] = {}
    raw: dict[int, float] = {}
    while ready:
        v = ready.pop()
        terms = [gammas[k] * (1.0 if w is None else coef[w]) for w, k in children[v]]
        value = (sum(terms) if aggregation == "sum" else max(terms)) if terms else 0.0
        raw[v] = value
        coef[v] = value if clip is None else min(value, float(clip))
        for p, _ in graph.parents.get(v, ()):
            waiting[p] -= 1
            if waiting[p] == 0:
                ready.append(p)
    if len(coef) != len(nodes):
        raise GraphCycleError(f"memory graph has a cycle through records {sorted(nodes - set(coef))}")
    active = [v for v in coef if coef[v] > 0]
    clipped = [v for v in active if clip is not None and raw[v] > float(clip)]
    metrics = {
        "active": float(len(active)),
        "clipped": float(len(clipped)),
        "clip_ratio": len(clipped) / len(active) if active else 0.0,
    }
    return coef, metrics


def graph_weights(
    final: Sequence[bool] | np.ndarray,
    action_turn: Iterable[int] | np.ndarray,
    finding_turn: Iterable[int] | np.ndarray,
    selection: Sequence[bool] | np.ndarray,
    coef: dict[int, float],
) -> np.ndarray:
    """Per-token weights (module docstring): 1 on final and selection tokens, else the coefficient
    of the token's action record or finding record, 0 without one."""
    g = np.asarray(final, dtype=bool)
    b = np.asarray(selection, dtype=bool)
    d = np.asarray(action_turn, dtype=np.int64)
    f = np.asarray(finding_turn, dtype=np.int64)
    of_action = np.array([coef.get(int(i), 0.0) if i >= 0 else 0.0 for i in d], dtype=np.float64)
    of_finding = np.array([coef.get(int(i), 0.0) if i >= 0 else 0.0 for i in f], dtype=np.float64)
    w = np.where(d >= 0, of_action, of_finding)
    return np.where(g | b, 1.0, w)
