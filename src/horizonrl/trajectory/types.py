"""The data model every part of horizonrl reads: turns, segments, rollouts, groups.

A *rollout* is one attempt at a task. It is split into *segments* (sessions):
each segment is one contiguous language-model context; a new one starts whenever
the context is rewritten instead of appended to (compaction, memory
reconstruction, a subagent). A segment is a list of *turns*; a turn is one policy
generation plus the environment's reply to it.

Every turn keeps the exact prompt token ids the model saw, so training can
recompute log-probabilities under the same context (docs/design.md, "The data model").
This module depends only on :mod:`horizonrl.vocab` (standard library).

The types, bottom up (every field has a docstring under it):

- :class:`Span`: a labelled range of one turn's generated tokens (ECHO's provenance).
- :class:`Turn`: one policy generation and the environment's reply.
- :class:`Segment`: a session, turns that share one growing context.
- :class:`Branch`: where a tree rollout forked from its trunk.
- :class:`Rollout`: one attempt at a task, its segments and outcome.
- :class:`Group`: the rollouts of one task in a batch, the unit group baselines normalize over.
- :class:`UnknownFieldWarning`: a rollout record field this version does not know.

Their closed vocabularies are :class:`~horizonrl.vocab.SegmentKind`,
:class:`~horizonrl.vocab.SpanLabel` and :class:`~horizonrl.vocab.Termination`. Training rows
(:class:`~horizonrl.trajectory.rows.Row`) are built from rollouts in :mod:`.rows`; JSONL in :mod:`.io`.

A few fields serve particular methods and are marked so: ``Turn.obs_key`` (the anchor state of
CCPO, GiGPO and HGPO with ``obs_key=state|turn``), ``Turn.invalid`` (the invalid-action penalty
``eta`` of CCPO and GiGPO), ``Turn.spans`` and ``Span.source_turn`` (ECHO's credit mask); the
others are read by every trainer.
"""

from __future__ import annotations

import dataclasses
import enum
import warnings
from dataclasses import dataclass, field
from typing import Any

from horizonrl.vocab import SegmentKind, SpanLabel, Termination

#: The values of ``Segment.kind`` (:class:`~horizonrl.vocab.SegmentKind`), as plain strings.
SEGMENT_KINDS = tuple(k.value for k in SegmentKind)
#: The values of ``Span.label`` (:class:`~horizonrl.vocab.SpanLabel`), as plain strings.
SPAN_LABELS = tuple(label.value for label in SpanLabel)


@dataclass(frozen=True)
class Span:
    """A labelled half-open range ``[start, end)`` of a turn's generated ids.

    ``source_turn`` ties the span to the turn whose content it carries (ECHO's
    provenance): e.g. a ``finding`` span written in turn 5 about turn 4's tool result.
    """

    label: str
    """What the tokens are (:class:`~horizonrl.vocab.SpanLabel`: ``action``, ``finding``, ``selection``,
    ``summary``, ``answer``, ``think``); checked on construction."""
    start: int
    """First generated token of the span, an index into ``Turn.response_ids``."""
    end: int
    """One past the span's last token (``start <= end <= len(response_ids)``)."""
    source_turn: int | None = None
    """The rollout-global turn (memory record) whose content the span carries, e.g. the turn a
    ``finding`` summarizes (ECHO: a span is credited when its source turn is selected); None: none."""

    def __post_init__(self) -> None:
        if self.label not in SPAN_LABELS:
            raise ValueError(f"Span.label={self.label!r} is not one of {SPAN_LABELS}")
        if not 0 <= self.start <= self.end:
            raise ValueError(f"Span range [{self.start}, {self.end}) is invalid")


@dataclass
class Turn:
    """One policy generation and the environment's reply.

    The environment tokens between two turns of a segment are not stored: they are the difference of
    consecutive prompts (see :mod:`.rows`). ``obs_key`` is the key of the state *after* this turn's
    action, so the state turn ``t`` was decided on is turn ``t-1``'s key, or the task's initial
    prompt for the first turn (``credit.ccpo_features.prompt_observations`` derives it).
    """

    prompt_ids: list[int]
    """The full context the model conditioned on, as token ids (chat template rendered)."""
    response_ids: list[int]
    """The sampled tokens (the trainable ones)."""
    logprobs: list[float]
    """Log-probability of each sampled token under the rollout engine at :attr:`temperature`; as many as
    ``response_ids``."""
    response_text: str = ""
    """The decoded response, as the agent parsed it."""
    observation: str | None = None
    """The environment's reply to this turn as one text (``StepResult.observation``); None after the
    last turn (and for turns the environment did not answer)."""
    reward: float = 0.0
    """The reward the environment paid for this turn's step (``StepResult.reward``); the rollout's
    outcome is :attr:`Rollout.reward`."""
    obs_key: str | None = None
    """The environment's canonical key of the state *after* this turn's action (``StepResult.obs_key``);
    the anchor state of CCPO, GiGPO and HGPO with ``obs_key=state|turn``
    (:func:`horizonrl.credit.ccpo_features.prompt_observations`). None: the environment gives none."""
    spans: list[Span] = field(default_factory=list)
    """Labelled ranges of ``response_ids`` (:class:`Span`); written by the ECHO and summary agents,
    read by ECHO's credit mask (:mod:`horizonrl.credit.echo`)."""
    truncated: bool = False
    """The generation was cut by the token limit (the engine stopped on length, not on its own end)."""
    tool_calls: int = 0
    """How many tool calls of this turn's action ran (``StepResult.tool_calls``); a rollout metric."""
    invalid: bool = False
    """The environment could not execute the action (``StepResult.invalid``: a malformed or failed call,
    no call and no answer); CCPO and GiGPO subtract ``eta`` for it, and a rollout metric counts it."""
    info: dict[str, Any] = field(default_factory=dict)
    """Anything else agents record (JSON values): e.g. ``env_error`` and ``env_metrics`` (from
    ``StepResult.info``), ``obs_messages`` / ``obs_role`` (the reply as chat messages),
    ``cached_tokens`` (prompt tokens the engine served from its prefix cache), ``policy_version``."""
    temperature: float | None = None
    """The sampling temperature the ``logprobs`` are of; training recomputes log-probs at it. None: the
    run's rollout temperature (files written before it was recorded)."""

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

    kind: str = SegmentKind.NORMAL.value
    """What the session is (:class:`~horizonrl.vocab.SegmentKind`: ``normal``, ``compaction``,
    ``subagent``, ``selection``, ``summary``); checked on construction."""
    turns: list[Turn] = field(default_factory=list)
    """The session's turns in order; within a segment each prompt usually extends the previous turn's
    context (:mod:`.rows` merges those into one training row)."""
    parent: int | None = None
    """Index in ``Rollout.segments`` of the segment this one was made from (a subagent's caller, the
    context a compaction or selection summarized); None for the first segment."""
    fork_index: int | None = None
    """Which fork call (or compaction) of the parent made this segment; None for the first segment."""
    info: dict[str, Any] = field(default_factory=dict)
    """Anything else agents record (JSON values): e.g. ECHO's ``selected`` and ``kept_latest`` memory
    indices of the context this segment was built from."""

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
    """``Rollout.uid`` of the trunk rollout this one branched from."""
    turn: int
    """The trunk's turn boundary ``k`` the branch resumes at: this rollout holds the turns from ``k`` on,
    the trunk's first ``k`` turns are shared and not stored here."""


@dataclass
class Rollout:
    """One attempt at one task."""

    uid: str
    """Unique id of the rollout within the run."""
    task_id: str
    """``Task.id`` of the task attempted."""
    group_id: str
    """The :class:`Group` this rollout belongs to (the rollouts of one task in one batch)."""
    segments: list[Segment] = field(default_factory=list)
    """The sessions in the order they were opened; one for an agent that never rewrites its context."""
    reward: float = 0.0
    """The outcome reward the estimators read (the sum of the turn rewards unless the agent sets it)."""
    success: bool = False
    """Whether the environment judged the task solved (success rates; not read by the estimators)."""
    final_answer: str | None = None
    """The episode's final answer (``StepResult.final_answer``, or the gateway's); None when none was
    given."""
    env: dict[str, Any] = field(default_factory=dict)
    """Rollout-level records of the agent and environment (JSON values): ``metrics`` (numbers averaged
    as ``rollout/<key>``), ``initial_obs_text`` / ``initial_obs_key`` (the reset state, for CCPO and
    GiGPO anchors), ``echo`` (ECHO's selection records), ``forks``."""
    branch: Branch | None = None
    """Where this rollout forked from a trunk (tree rollouts); None for a rollout from the task's start."""
    termination: str = Termination.DONE.value
    """Why the rollout ended (:class:`~horizonrl.vocab.Termination`: ``done``, ``max_turns``,
    ``context``, ``truncated``, ``overlong``, ``error``); a plain string, equal to the enum members."""

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
    """All rollouts of one task in a batch: the set group-relative baselines (GRPO and the rest)
    normalize over."""

    group_id: str
    """The id each of its rollouts carries as ``Rollout.group_id``."""
    task_id: str
    """The task all its rollouts attempted."""
    rollouts: list[Rollout] = field(default_factory=list)
    """The rollouts, in the order the estimators' outputs follow."""

    @property
    def rewards(self) -> list[float]:
        return [r.reward for r in self.rollouts]


# --------------------------------------------------------------------------- JSON


def _to_dict(obj: Any) -> Any:
    if isinstance(obj, enum.Enum):  # a vocabulary member (e.g. Termination.DONE) is written as its value
        return obj.value
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
