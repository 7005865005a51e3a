"""Lossless JSONL serialization of rollouts (one rollout per line).

Floats are written with ``repr`` precision by :mod:`json`, so log-probs and
rewards survive the round trip bit-for-bit. Reading goes through
:func:`horizonrl.jsonl.read_jsonl` (a torn last line is skipped with a warning)
and checks every field's type first, so a bad record is a
:class:`~horizonrl.errors.DataError` naming the file, line and field (e.g.
``segments[0].turns[2].response_ids``), never a crash further on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from horizonrl.errors import DataError
from horizonrl.jsonl import Record, check_type
from horizonrl.jsonl import read_jsonl as read_records
from horizonrl.trajectory.types import Rollout, rollout_from_dict, rollout_to_dict

_NUM = (int, float)
_IDS, _FLOATS = "ids", "floats"
# field -> (accepted types or list kind, required, None allowed)
_SPAN = {"label": (str, True, False), "start": (int, True, False), "end": (int, True, False),
         "source_turn": (int, False, True)}  # fmt: skip
_TURN = {
    "prompt_ids": (_IDS, True, False),
    "response_ids": (_IDS, True, False),
    "logprobs": (_FLOATS, True, False),
    "response_text": (str, False, False),
    "observation": (str, False, True),
    "reward": (_NUM, False, False),
    "obs_key": (str, False, True),
    "spans": (list, False, False),
    "truncated": (bool, False, False),
    "tool_calls": (int, False, False),
    "invalid": (bool, False, False),
    "info": (dict, False, False),
    "temperature": (_NUM, False, True),
}
_SEGMENT = {"kind": (str, False, False), "turns": (list, False, False), "parent": (int, False, True),
            "fork_index": (int, False, True), "info": (dict, False, False)}  # fmt: skip
_ROLLOUT = {
    "uid": (str, True, False),
    "task_id": (str, True, False),
    "group_id": (str, True, False),
    "segments": (list, False, False),
    "reward": (_NUM, False, False),
    "success": (bool, False, False),
    "final_answer": (str, False, True),
    "env": (dict, False, False),
    "branch": (dict, False, True),
    "termination": (str, False, False),
}
_BRANCH = {"trunk_id": (str, True, False), "turn": (int, True, False)}


def dumps_rollout(r: Rollout) -> str:
    return json.dumps(rollout_to_dict(r), ensure_ascii=False, allow_nan=True)


def loads_rollout(line: str, where: str = "rollout") -> Rollout:
    return rollout_from_dict(json.loads(line), where)


def write_jsonl(path: str | Path, rollouts: Iterable[Rollout], *, append: bool = False) -> None:
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        for r in rollouts:
            f.write(dumps_rollout(r) + "\n")


def _check_fields(obj: Any, schema: dict, where: str) -> str | None:
    """``"field: why"`` for the first field of ``obj`` that does not fit ``schema`` (None if all do)."""
    if not isinstance(obj, dict):
        return f"{where or 'record'}: must be an object, got {type(obj).__name__}"
    prefix = f"{where}." if where else ""
    # Unknown fields are not errors: rollout_from_dict ignores them with an UnknownFieldWarning.
    for key, (kind, required, none_ok) in schema.items():
        if key not in obj:
            if required:
                return f"{prefix}{key}: is missing"
            continue
        v = obj[key]
        if v is None and none_ok:
            continue
        if kind in (_IDS, _FLOATS):
            if not isinstance(v, list):
                return f"{prefix}{key}: must be a list, got {type(v).__name__}"
            for i, x in enumerate(v):
                bad = type(x) is not int if kind == _IDS else type(x) not in _NUM
                if bad:
                    want = "an integer token id" if kind == _IDS else "a number"
                    return f"{prefix}{key}[{i}]: must be {want}, got {x!r}"
            continue
        why = check_type(v, kind, allow_nan=True)
        if why is not None:
            return f"{prefix}{key}: {why}"
    return None


def check_rollout_dict(d: Any) -> str | None:
    """``"field: why"`` for the first field of a rollout record that is missing or mistyped."""
    why = _check_fields(d, _ROLLOUT, "")
    if why is None and d.get("branch") is not None:
        why = _check_fields(d["branch"], _BRANCH, "branch")
    for si, seg in enumerate(d.get("segments", []) if why is None else []):
        why = _check_fields(seg, _SEGMENT, f"segments[{si}]")
        for ti, turn in enumerate(seg.get("turns", []) if why is None else []):
            why = _check_fields(turn, _TURN, f"segments[{si}].turns[{ti}]")
            for pi, span in enumerate(turn.get("spans", []) if why is None else []):
                why = why or _check_fields(span, _SPAN, f"segments[{si}].turns[{ti}].spans[{pi}]")
            if why:
                break
        if why:
            break
    return why


def rollout_from_record(rec: Record) -> Rollout:
    """The rollout of one JSONL record; DataError naming the file, line and field otherwise.

    Unknown fields are ignored with an :class:`~horizonrl.trajectory.types.UnknownFieldWarning`
    naming the file and line.
    """
    why = check_rollout_dict(rec.value)
    if why is not None:
        raise DataError(f"{rec.where()}: not a rollout record: {why}")
    try:
        return rollout_from_dict(rec.value, rec.where())
    except (ValueError, TypeError) as e:  # the dataclasses' own checks (span ranges, lengths, kinds)
        raise DataError(f"{rec.where()}: not a rollout record: {e}") from None


def read_jsonl(path: str | Path) -> Iterator[Rollout]:
    """The rollouts of a JSONL file (module docstring for what is checked)."""
    for rec in read_records(path, allow_nan=True, what="rollouts"):
        yield rollout_from_record(rec)
