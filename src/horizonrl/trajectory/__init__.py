"""Trajectory data model: turns, segments, rollouts, groups, rows, JSONL."""

from horizonrl.trajectory.io import dumps_rollout, loads_rollout, read_jsonl, write_jsonl
from horizonrl.trajectory.rows import Row, TokenAdvantages, appended_tokens, build_rows, saved_tokens
from horizonrl.trajectory.types import (
    ANNOTATION_KEYS,
    SEGMENT_KINDS,
    SPAN_LABELS,
    Branch,
    Group,
    Rollout,
    Segment,
    Span,
    Turn,
    UnknownFieldWarning,
    rollout_from_dict,
    rollout_to_dict,
)

__all__ = [
    "ANNOTATION_KEYS",
    "SEGMENT_KINDS",
    "SPAN_LABELS",
    "Branch",
    "Group",
    "Rollout",
    "Row",
    "Segment",
    "Span",
    "TokenAdvantages",
    "Turn",
    "UnknownFieldWarning",
    "appended_tokens",
    "build_rows",
    "dumps_rollout",
    "loads_rollout",
    "read_jsonl",
    "rollout_from_dict",
    "rollout_to_dict",
    "saved_tokens",
    "write_jsonl",
]
