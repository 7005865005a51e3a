"""Lossless JSONL serialization of rollouts (one rollout per line).

Floats are written with ``repr`` precision by :mod:`json`, so log-probs and
rewards survive the round trip bit-for-bit.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from horizonrl.trajectory.types import Rollout, rollout_from_dict, rollout_to_dict


def dumps_rollout(r: Rollout) -> str:
    return json.dumps(rollout_to_dict(r), ensure_ascii=False, allow_nan=True)


def loads_rollout(line: str, where: str = "rollout") -> Rollout:
    return rollout_from_dict(json.loads(line), where)


def write_jsonl(path: str | Path, rollouts: Iterable[Rollout], *, append: bool = False) -> None:
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        for r in rollouts:
            f.write(dumps_rollout(r) + "\n")


def read_jsonl(path: str | Path) -> Iterator[Rollout]:
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield loads_rollout(line, f"{path}:{i}")
                except (ValueError, TypeError, KeyError) as e:
                    raise ValueError(f"{path}:{i}: not a rollout record: {e}") from e
