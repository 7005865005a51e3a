"""Side information of an estimator: what it computed on the way to the advantages.

The run viewer (``horizonrl view``) shows it beside each rollout, session and turn,
and ``rollouts/step_N.jsonl`` stores it (``train/records/rollout_log.py``). An estimator
reports it with :func:`record_side_info`; nothing is recorded (and the call costs
one context-variable lookup) unless the caller opened a :func:`collect_side_info`
block, so estimators that report nothing need no change and tests that call
estimators directly see no difference::

    with collect_side_info() as side:
        adv = estimator(groups, **params)
    side.rollouts[i]   # {"rollout": {...}, "sessions": [{...} per segment], "turns": [[{...}]]}

Rollout indices are positions in ``[r for g in groups for r in g.rollouts]``.
Values should be JSON-like (numbers, strings, bools, lists, dicts; NumPy scalars
and arrays are converted when written).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from horizonrl.credit.broadcast import flatten_rollouts
from horizonrl.trajectory import Group, Rollout


@dataclass
class SideInfo:
    """Collected side information of one estimator call.

    ``rollouts[i]`` has up to three parts: ``rollout`` (a dict for the rollout),
    ``sessions`` (one dict per segment) and ``turns`` (``[segment][turn] -> dict``).
    """

    rollouts: dict[int, dict[str, Any]] = field(default_factory=dict)


_ACTIVE: ContextVar[SideInfo | None] = ContextVar("horizonrl_side_info", default=None)


def collecting() -> bool:
    """Whether a :func:`collect_side_info` block is open (skip costly extras otherwise)."""
    return _ACTIVE.get() is not None


@contextmanager
def collect_side_info(enabled: bool = True) -> Iterator[SideInfo]:
    """Collect what estimators record inside the block; ``enabled=False`` collects nothing."""
    info = SideInfo()
    token = _ACTIVE.set(info if enabled else None)
    try:
        yield info
    finally:
        _ACTIVE.reset(token)


def _merge_list(old: list, new: Sequence) -> list:
    out = list(old) + [None] * max(0, len(new) - len(old))
    for k, v in enumerate(new):
        if isinstance(v, Mapping) and isinstance(out[k], dict):
            out[k] = {**out[k], **v}
        elif isinstance(v, Sequence) and not isinstance(v, str) and isinstance(out[k], list):
            out[k] = _merge_list(out[k], v)
        else:
            out[k] = dict(v) if isinstance(v, Mapping) else v
    return out


def record_side_info(
    rollout_index: int,
    *,
    rollout: Mapping[str, Any] | None = None,
    sessions: Sequence[Mapping[str, Any]] | None = None,
    turns: Sequence[Sequence[Mapping[str, Any]]] | None = None,
) -> None:
    """Record side information of rollout ``rollout_index`` (merged with what was recorded before).

    ``sessions``: one dict per segment; ``turns``: ``[segment][turn] -> dict``.
    A no-op outside :func:`collect_side_info`.
    """
    info = _ACTIVE.get()
    if info is None:
        return
    entry = info.rollouts.setdefault(int(rollout_index), {})
    if rollout:
        entry["rollout"] = {**entry.get("rollout", {}), **rollout}
    if sessions is not None:
        entry["sessions"] = _merge_list(entry.get("sessions", []), [dict(s) for s in sessions])
    if turns is not None:
        entry["turns"] = _merge_list(entry.get("turns", []), [[dict(t) for t in seg] for seg in turns])


def record_turn_columns(groups: Sequence[Group] | Sequence[Rollout], **columns: Any) -> None:
    """Record per-turn values given as flat columns, one entry per turn.

    Turns are ordered as rollouts (``[r for g in groups for r in g.rollouts]``) and,
    within a rollout, segment by segment (the rows of
    :func:`~horizonrl.credit.ccpo_features.step_batch_from_groups`). Each column
    becomes a key of the turn's dict.
    """
    if _ACTIVE.get() is None:
        return
    rollouts = flatten_rollouts(groups)
    n = sum(r.num_turns for r in rollouts)
    cols = {k: np.asarray(v).tolist() for k, v in columns.items() if v is not None}
    for k, v in cols.items():
        if len(v) != n:
            raise ValueError(f"side-info column {k!r} has {len(v)} values for {n} turns")
    pos = 0
    for i, r in enumerate(rollouts):
        turns = []
        for seg in r.segments:
            turns.append([{k: v[pos + t] for k, v in cols.items()} for t in range(len(seg.turns))])
            pos += len(seg.turns)
        record_side_info(i, turns=turns)


__all__ = [
    "SideInfo",
    "collect_side_info",
    "collecting",
    "record_side_info",
    "record_turn_columns",
]
