"""The data model every part of horizonrl reads: turns, segments, rollouts, groups.

A *rollout* is one attempt at a task. It is split into *segments* (sessions):
each segment is one contiguous language-model context; a new one starts whenever
the context is rewritten instead of appended to (compaction, memory
reconstruction, a subagent). A segment is a list of *turns*; a turn is one policy
generation plus the environment's reply to it.

Every turn keeps the exact prompt token ids the model saw, so training can
recompute log-probabilities under the same context (DESIGN.md, "The data model").
This module depends on nothing else in the package.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any

SEGMENT_KINDS = ("normal", "compaction", "subagent", "selection", "summary")
SPAN_LABELS = ("action", "finding", "selection", "summary", "answer", "think")


@dataclass(frozen=True)
class Span:
    """A labelled half-open range ``[start, end)`` of a turn's generated ids.

    ``source_turn`` ties the span to the turn whose content it carries (ECHO's
    provenance): e.g. a ``finding`` span written in turn 5 about turn 4's tool result.
    """

    label: str
    start: int
    end: int
    source_turn: int | None = None

    def __post_init__(self) -> None:
        if self.label not in SPAN_LABELS:
            raise ValueError(f"Span.label={self.label!r} is not one of {SPAN_LABELS}")
        if not 0 <= self.start <= self.end:
            raise ValueError(f"Span range [{self.start}, {self.end}) is invalid")


@dataclass
class Turn:
    """One policy generation and the environment's reply.

    ``prompt_ids`` is the full context the model conditioned on; ``response_ids``
    the sampled tokens and ``logprobs`` their log-probabilities under the rollout
    engine; ``observation`` the environment's reply text (None after the last
    turn); ``obs_key`` the environment's canonical key of the state *after* this
    turn's action (``StepResult.obs_key``), so the state turn ``t`` was decided on
    is turn ``t-1``'s key, or the task's initial prompt for the first turn
    (``credit.ccpo_features.prompt_observations`` derives it). The environment
    tokens between two turns of a segment are not stored:
    they are the difference of consecutive prompts (see :mod:`.rows`).
    ``truncated`` marks a generation cut by the token limit. ``temperature`` is the
    sampling temperature the ``logprobs`` are of (None: the run's rollout temperature,
    e.g. files written before it was recorded); training recomputes log-probs at it.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    response_text: str = ""
    observation: str | None = None
    reward: float = 0.0
    obs_key: str | None = None
    spans: list[Span] = field(default_factory=list)
    truncated: bool = False
    tool_calls: int = 0
    invalid: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    temperature: float | None = None

    def __post_init__(self) -> None:
        if len(self.logprobs) != len(self.response_ids):
            raise ValueError(
                f"Turn has {len(self.response_ids)} response ids but {len(self.logprobs)} logprobs"
            )
        for s in self.spans:
            if s.end > len(self.response_ids):
                raise ValueError(f"span {s} exceeds the {len(self.response_ids)} response ids")

    @property
    def num_response_tokens(self) -> int:
        return len(self.response_ids)


@dataclass
class Segment:
    """A session: turns that share one growing context.

    ``parent`` is the index of the parent segment in the rollout (subagents,
    compaction sessions), ``fork_index`` which fork call (or compaction) made it.
    """

    kind: str = "normal"
    turns: list[Turn] = field(default_factory=list)
    parent: int | None = None
    fork_index: int | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in SEGMENT_KINDS:
            raise ValueError(f"Segment.kind={self.kind!r} is not one of {SEGMENT_KINDS}")

    @property
    def num_response_tokens(self) -> int:
        return sum(t.num_response_tokens for t in self.turns)


@dataclass
class Branch:
    """Where a tree rollout forked from: trunk rollout uid and turn boundary."""

    trunk_id: str
    turn: int


@dataclass
class Rollout:
    """One attempt at one task."""

    uid: str
    task_id: str
    group_id: str
    segments: list[Segment] = field(default_factory=list)
    reward: float = 0.0
    success: bool = False
    final_answer: str | None = None
    env: dict[str, Any] = field(default_factory=dict)
    branch: Branch | None = None
    termination: str = "done"  # done | max_turns | context | truncated | overlong | error

    @property
    def turns(self) -> list[Turn]:
        return [t for s in self.segments for t in s.turns]

    @property
    def num_turns(self) -> int:
        return sum(len(s.turns) for s in self.segments)

    @property
    def num_response_tokens(self) -> int:
        return sum(s.num_response_tokens for s in self.segments)


@dataclass
class Group:
    """All rollouts of one task in a batch."""

    group_id: str
    task_id: str
    rollouts: list[Rollout] = field(default_factory=list)

    @property
    def rewards(self) -> list[float]:
        return [r.reward for r in self.rollouts]


# --------------------------------------------------------------------------- JSON


def _to_dict(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: _to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list):
        return [_to_dict(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _to_dict(v) for k, v in obj.items()}
    return obj


#: Top-level keys of a rollout record that annotate it without being :class:`Rollout` fields:
#: ``credit`` (per-token advantages, rows and estimator side information, written by
#: ``horizonrl.train.records.rollout_log``). Loading skips them silently.
ANNOTATION_KEYS = frozenset({"credit"})


class UnknownFieldWarning(UserWarning):
    """A rollout record holds a field this version does not know; it was ignored."""


def _known(cls: type, d: dict[str, Any], where: str, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """``d`` restricted to the fields of ``cls``; other keys (except ``skip``) warn and are dropped."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(k for k in d if k not in names and k not in skip)
    if unknown:
        warnings.warn(f"{where}: unknown field(s) {unknown} ignored", UnknownFieldWarning, stacklevel=3)
    return {k: v for k, v in d.items() if k in names}


def turn_from_dict(d: dict[str, Any], where: str = "turn") -> Turn:
    d = _known(Turn, d, where)
    d["spans"] = [Span(**_known(Span, s, f"{where} span {k}")) for k, s in enumerate(d.get("spans", []))]
    return Turn(**d)


def segment_from_dict(d: dict[str, Any], where: str = "segment") -> Segment:
    d = _known(Segment, d, where)
    d["turns"] = [turn_from_dict(t, f"{where} turn {k}") for k, t in enumerate(d.get("turns", []))]
    return Segment(**d)


def rollout_from_dict(d: dict[str, Any], where: str = "rollout") -> Rollout:
    """The :class:`Rollout` of a record; unknown fields warn (:class:`UnknownFieldWarning`), are ignored."""
    d = _known(Rollout, d, where, ANNOTATION_KEYS)
    d["segments"] = [
        segment_from_dict(s, f"{where} segment {k}") for k, s in enumerate(d.get("segments", []))
    ]
    if d.get("branch") is not None:
        d["branch"] = Branch(**_known(Branch, d["branch"], f"{where} branch"))
    return Rollout(**d)


def rollout_to_dict(r: Rollout) -> dict[str, Any]:
    return _to_dict(r)
