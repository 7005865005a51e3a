"""ECHO graph credit: outcome credit propagated backwards over the memory DAG (the authors' released
``graph`` credit, ``xiezijun714-lang/echo``; docs/released_recipes.md). Not in the paper, whose credit
is the binary mask of :mod:`horizonrl.credit.echo` (Eq. 13); ``credit: graph`` of ``echo`` selects it.

The DAG (:func:`memory_graph`, read from the rollout the ECHO agent recorded) has one node per memory
record ``i`` (source-turn index) and a synthetic outcome node. Two versions, as released:

- **version 2** (typed, the released default): inside a working segment a record's one parent is
  the segment's previous record (a *turn* edge); the first record of a rebuilt segment has a
  *selection* edge from each record the model selected (``info["selected"]``; the automatically kept
  latest records are prompt-only, not parents). The outcome's parent is the last segment's last
  record (turn edge), or, when the final segment produced none, its selected records (selection
  edges). Each selection segment's tokens are weighted by its downstream node: the first record of
  the segment rebuilt from it, or the outcome (weight 1).
- **version 1** (untyped): a record's parents are everything in its context (the segment's
  ``selected`` ∪ ``kept_latest`` and its earlier records), every edge discounted by
  ``gamma_segment``; selection tokens weigh 1.

Coefficients (:func:`graph_coefficients`), ``c(outcome) = 1``, for the records that reach it::

    c(v) = min(clip, AGG_{(w, kind) : v is a parent of w} gamma_kind * c(w))     AGG = sum | max

(``gamma_turn`` on turn edges, ``gamma_segment`` on selection edges; ``clip`` None: no cap; parents
read the capped value). Records with no path to the outcome have no coefficient.

Token weights (:func:`graph_weights`), in this order: 1 on every token of the last segment, else 0;
action tokens of record ``i`` outside the last segment: ``c(i)``; finding tokens of a record with a
coefficient: overwritten with it (in the last segment too: a finding is its record's compressed
observation); selection tokens: overwritten with their segment's selection weight. The ``echo``
estimator multiplies them by ``max(A, 0)``; a graph with a cycle falls back to the mask ``mu``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

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
GRAPH_VERSIONS = (1, 2)
EDGE_KINDS = ("turn", "selection")
Edge = tuple[int, str]  # (record, edge kind)


class GraphCycleError(ValueError):
    """The memory graph has a cycle (the estimator then falls back to the token mask)."""


@dataclass(frozen=True)
class MemoryGraph:
    """``parents[i]``: ``(parent record, edge kind)`` of record ``i``; ``outcome``: the outcome's;
    ``selections[s]``: the downstream record of selection segment ``s`` (None: the outcome)."""

    parents: dict[int, tuple[Edge, ...]]
    outcome: tuple[Edge, ...]
    selections: dict[int, int | None] = field(default_factory=dict)


def read_selected(
    info: dict, where: str, keys: tuple[str, ...] = ("selected", "kept_latest")
) -> frozenset[int] | None:
    """The union of ``info[key]`` over ``keys`` as source-turn ids; None without ``selected``."""
    if info.get("selected") is None:
        return None
    out: set[int] = set()
    for key in keys:
        for i in info.get(key) or ():
            if isinstance(i, bool) or int(i) != i:
                raise ValueError(f"{where}[{key!r}] must hold integer source-turn ids, got {i!r}")
            out.add(int(i))
    return frozenset(out)


def _records(turn) -> list[int]:
    return sorted(
        {int(sp.source_turn) for sp in turn.spans if sp.label == "action" and _is_id(sp.source_turn)}
    )


def memory_graph(rollout: Rollout, version: int = 2) -> MemoryGraph:
    """The memory DAG of one ECHO rollout (module docstring)."""
    if version not in GRAPH_VERSIONS:
        raise ValueError(f"graph version must be one of {GRAPH_VERSIONS}, got {version!r}")
    parents: dict[int, tuple[Edge, ...]] = {}
    selections: dict[int, int | None] = {}
    open_selections: list[int] = []
    outcome: tuple[Edge, ...] = ()
    for s, seg in enumerate(rollout.segments):
        if seg.kind == "selection":
            open_selections.append(s)
            continue
        # version 2: only the model's picks are parents; version 1: everything rebuilt into the context
        keys = ("selected",) if version == 2 else ("selected", "kept_latest")
        rebuilt = read_selected(seg.info, f"segments[{s}].info", keys) if s > 0 else None
        entry: tuple[Edge, ...] = tuple((j, "selection") for j in sorted(rebuilt or ()))
        context, last = list(entry), None
        for turn in seg.turns:
            for i in _records(turn):
                if i in parents:
                    continue
                if version == 2:
                    parents[i] = ((last, "turn"),) if last is not None else entry
                else:
                    parents[i] = tuple(context)
                    context.append((i, "selection"))
                for sel in open_selections:
                    selections[sel] = i
                open_selections = []
                last = i
        if version == 2:
            outcome = ((last, "turn"),) if last is not None else entry
        else:
            outcome = tuple(context)
    for sel in open_selections:
        selections[sel] = None
    return MemoryGraph(parents, outcome, selections)


def _is_id(x: object) -> bool:
    return x is not None and int(x) >= 0  # type: ignore[call-overload]


def graph_coefficients(
    graph: MemoryGraph,
    *,
    gamma_turn: float = 1.0,
    gamma_segment: float = 0.9,
    aggregation: str = "sum",
    clip: float | None = 1.0,
) -> tuple[dict[int, float], dict[str, float]]:
    """``c(v)`` of every record with a path to the outcome (module docstring) and
    ``{"active", "clipped", "clip_ratio"}`` (active: ``c > 0``; clipped: its sum or max exceeded ``clip``).

    Raises :class:`GraphCycleError` when the graph has a cycle.
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"graph aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    gammas = {"turn": float(gamma_turn), "selection": float(gamma_segment)}
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
    coef: dict[int, float] = {}  # the records that reach the outcome
    raw: dict[int, float] = {}
    done: set[int] = set()
    while ready:
        v = ready.pop()
        done.add(v)
        terms = [
            gammas[k] * (1.0 if w is None else coef[w]) for w, k in children[v] if w is None or w in coef
        ]
        if terms:
            value = sum(terms) if aggregation == "sum" else max(terms)
            raw[v] = value
            coef[v] = value if clip is None else min(value, float(clip))
        for p, _ in graph.parents.get(v, ()):
            waiting[p] -= 1
            if waiting[p] == 0:
                ready.append(p)
    if len(done) != len(nodes):
        raise GraphCycleError(f"memory graph has a cycle through records {sorted(nodes - done)}")
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
    selection_weight: float | Sequence[float] | np.ndarray = 1.0,
) -> np.ndarray:
    """Per-token weights (module docstring): 1 on the last segment, ``c(i)`` on action tokens of
    record ``i`` elsewhere, then findings of a record with a coefficient and selection tokens
    overwritten (``selection_weight``: one number or one per token)."""
    g = np.asarray(final, dtype=bool)
    b = np.asarray(selection, dtype=bool)
    d = np.asarray(action_turn, dtype=np.int64)
    f = np.asarray(finding_turn, dtype=np.int64)
    w = np.where(g, 1.0, 0.0)
    of_action = np.array([coef.get(int(i), 0.0) for i in d], dtype=np.float64)
    w = np.where(~g & (d >= 0), np.maximum(w, of_action), w)
    has = np.array([int(i) in coef for i in f], dtype=bool)
    of_finding = np.array([coef.get(int(i), 0.0) for i in f], dtype=np.float64)
    w = np.where(has, of_finding, w)
    return np.where(b, np.broadcast_to(np.asarray(selection_weight, dtype=np.float64), w.shape), w)
