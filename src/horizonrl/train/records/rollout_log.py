"""What a run saves about credit: ``rollouts/step_N.jsonl`` records annotated with a ``credit`` key.

Each line is a rollout (:func:`horizonrl.trajectory.rollout_to_dict`, log-probs
included) plus, when ``train.save_credit`` is on, ``"credit"``::

    {"v": 1, "estimator": "mosaic",
     "advantages": [[A, ...] per segment],   # per turn: null (not trained), a number (every token
                                             # has it) or [[value, run_length], ...] runs
     "rows": [[row, ...] per segment],       # per turn: index of the training row it was in, or null
     "rollout": {...},                       # estimator side information (credit.side_info)
     "sessions": [{...} per segment],
     "turns": [[{...} per turn] per segment]}

Advantages are written at full float precision (``repr``), so
:func:`decode_advantages` returns exactly what the estimator produced. Files
without ``credit`` (old runs, ``train.save_credit=false``) load as before:
:func:`horizonrl.trajectory.rollout_from_dict` skips the key.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from horizonrl.credit.side_info import SideInfo
from horizonrl.trajectory import Rollout, Row, TokenAdvantages, rollout_to_dict

CREDIT_VERSION = 1
Encoded = float | list[list[float]] | None


def jsonable(x: Any) -> Any:
    """NumPy values to Python ones; non-finite floats to ``None`` (JSON has no NaN)."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple | set | frozenset):
        return [jsonable(v) for v in (sorted(x) if isinstance(x, set | frozenset) else x)]
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist())
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def encode_advantages(values: Sequence[float] | np.ndarray | None) -> Encoded:
    """Run-length code of one turn's per-token advantages.

    ``None`` stays ``None`` (turn not trained); all tokens equal -> that number
    (an empty turn -> ``0.0``); otherwise ``[[value, count], ...]`` runs in token order.
    """
    if values is None:
        return None
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if v.size == 0:
        return 0.0
    if np.all(v == v[0]):
        return float(v[0])
    cut = np.flatnonzero(v[1:] != v[:-1]) + 1
    starts = np.concatenate([[0], cut])
    ends = np.concatenate([cut, [v.size]])
    return [[float(v[s]), int(e - s)] for s, e in zip(starts, ends, strict=True)]


def decode_advantages(enc: Encoded, n: int) -> np.ndarray | None:
    """Inverse of :func:`encode_advantages` for a turn of ``n`` response tokens."""
    if enc is None:
        return None
    if isinstance(enc, int | float):
        return np.full(n, float(enc))
    out = np.concatenate([np.full(int(c), float(v)) for v, c in enc]) if enc else np.zeros(0)
    if out.size != n:
        raise ValueError(f"advantage runs cover {out.size} tokens, the turn has {n}")
    return out


def row_index(rows: Sequence[Row], rollouts: Sequence[Rollout]) -> list[list[list[int | None]]]:
    """``[rollout][segment][turn] -> index`` of the row (of ``rows``) each turn was trained in."""
    out: list[list[list[int | None]]] = [[[None] * len(s.turns) for s in r.segments] for r in rollouts]
    for k, row in enumerate(rows):
        for t in row.turns:
            out[row.rollout_index][row.segment_index][t] = k
    return out


def _side(side: SideInfo | None, i: int) -> dict[str, Any]:
    entry = (side.rollouts.get(i) if side is not None else None) or {}
    return {k: jsonable(v) for k, v in entry.items() if v}


def credit_annotation(
    estimator: str,
    advantages: list[list[Encoded]],
    rows: list[list[int | None]],
    side: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One rollout's ``credit`` annotation (module docstring): ``estimator`` names what computed the
    advantages (``algo.estimator``, or the trainer for a method that computes its own); ``side`` is
    the method's side information per rollout, written under ``"rollout"`` when given."""
    out: dict[str, Any] = {
        "v": CREDIT_VERSION,
        "estimator": estimator,
        "advantages": advantages,
        "rows": rows,
    }
    if side is not None:
        out["rollout"] = side
    return out


def credit_records(
    rollouts: Sequence[Rollout],
    advantages: TokenAdvantages,
    rows: Sequence[Row],
    side: SideInfo | None = None,
    *,
    estimator: str,
) -> list[dict[str, Any]]:
    """The ``credit`` annotation of each rollout of a group-trainer step (module docstring)."""
    index = row_index(rows, rollouts)
    return [
        {
            **credit_annotation(
                estimator, [[encode_advantages(t) for t in seg] for seg in advantages[i]], index[i]
            ),
            **_side(side, i),
        }
        for i in range(len(rollouts))
    ]


def dumps_record(rollout: Rollout, credit: dict[str, Any] | None = None) -> str:
    d = rollout_to_dict(rollout)
    if credit is not None:
        d["credit"] = credit
    return json.dumps(d, ensure_ascii=False, allow_nan=True)


def write_rollout_log(
    path: str | Path, rollouts: Sequence[Rollout], credit: Sequence[dict[str, Any]] | None = None
) -> None:
    """Write ``rollouts`` (one per line) with their ``credit`` annotations, if given."""
    if credit is not None and len(credit) != len(rollouts):
        raise ValueError(f"{len(credit)} credit records for {len(rollouts)} rollouts")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for i, r in enumerate(rollouts):
            f.write(dumps_record(r, None if credit is None else credit[i]) + "\n")


def token_advantages(rollout: Rollout, credit: dict[str, Any]) -> list[list[np.ndarray | None]]:
    """``[segment][turn] -> per-token advantages`` (``None``: not trained) of an annotated record."""
    return [
        [
            decode_advantages(credit["advantages"][s][t], len(turn.response_ids))
            for t, turn in enumerate(seg.turns)
        ]
        for s, seg in enumerate(rollout.segments)
    ]


__all__ = [
    "CREDIT_VERSION",
    "credit_annotation",
    "credit_records",
    "decode_advantages",
    "dumps_record",
    "encode_advantages",
    "jsonable",
    "row_index",
    "token_advantages",
    "write_rollout_log",
]
