"""Turning rollouts into training rows.

Consecutive turns of a segment whose prompts extend each other token-for-token
merge into one row: ``prompt_0 + response_0 + env_0 + response_1 + ...`` where
``env_t = prompt_{t+1}[len(prompt_t + response_t):]`` is loss-masked. Any break
(a template that strips ``<think>``, a summary, truncation of old turns) starts
a new row from that turn's own prompt. So every trainable token is scored under
exactly the context it was sampled from (docs/design.md, "Rows").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from horizonrl.trajectory.types import Rollout
from horizonrl.vocab import SegmentKind

#: What credit estimators return: ``advantages[rollout][segment][turn]`` is an array with one value per
#: response token of that turn (rollouts in the order of ``[r for g in groups for r in g.rollouts]``).
TokenAdvantages = Sequence[Sequence[Sequence[np.ndarray]]]


@dataclass
class Row:
    """One training sequence: consecutive turns of one segment whose prompts extend each other (module
    docstring). Every per-position list is aligned with ``input_ids``."""

    input_ids: list[int]
    """The sequence: the first turn's prompt, then each turn's response and the environment tokens
    between turns (``prompt_{t+1}[len(prompt_t + response_t):]``)."""
    trainable: list[bool]
    """Per position: True for a policy-generated token (in the loss), False for prompt and environment
    tokens."""
    old_logprobs: list[float]
    """Per position: the rollout engine's log-prob of a trainable token (``Turn.logprobs``); 0 elsewhere."""
    advantages: list[float]
    """Per position: the estimator's advantage of a trainable token; 0 elsewhere."""
    turn_ids: list[int]
    """Per position: the rollout-wide number of the turn that generated a trainable token (counted over
    all segments, in order); -1 elsewhere. Turn-level importance sampling groups by it."""
    rollout_index: int
    """Index of the rollout in the list :func:`build_rows` was given."""
    segment_index: int
    """Index of the segment in ``Rollout.segments``."""
    turns: list[int] = field(default_factory=list)
    """Indices (within the segment) of the turns merged into this row, in order."""
    temperatures: list[float] = field(default_factory=list)
    """Per position: the sampling temperature a trainable token's log-prob is recomputed at
    (``Turn.temperature``, else the run's); 1.0 elsewhere. Empty on construction: all 1.0."""

    def __post_init__(self) -> None:
        if not self.temperatures:
            self.temperatures = [1.0] * len(self.input_ids)

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_trainable(self) -> int:
        return sum(self.trainable)


def _extends(prefix: list[int], full: list[int]) -> bool:
    return len(full) >= len(prefix) and full[: len(prefix)] == prefix


def build_rows(
    rollouts: Sequence[Rollout],
    advantages: TokenAdvantages | None = None,
    *,
    merge: bool = True,
    temperature: float = 1.0,
) -> list[Row]:
    """Build training rows for ``rollouts``.

    ``advantages`` (same nesting as rollouts/segments/turns) gives each response
    token its credit; without it every advantage is 0 (SFT-style rows).
    ``merge=False`` gives one row per turn. ``temperature`` is used for turns that
    did not record theirs (``Turn.temperature is None``).
    """
    rows: list[Row] = []
    for ri, rollout in enumerate(rollouts):
        turn_counter = 0
        for si, seg in enumerate(rollout.segments):
            current: Row | None = None
            for ti, turn in enumerate(seg.turns):
                adv = (
                    np.asarray(advantages[ri][si][ti], dtype=np.float64)
                    if advantages is not None
                    else np.zeros(len(turn.response_ids))
                )
                if adv.shape != (len(turn.response_ids),):
                    raise ValueError(
                        f"advantages for rollout {ri} segment {si} turn {ti} have shape "
                        f"{adv.shape}, expected ({len(turn.response_ids)},)"
                    )
                if merge and current is not None and _extends(current.input_ids, turn.prompt_ids):
                    env = turn.prompt_ids[len(current.input_ids) :]
                    current.input_ids.extend(env)
                    current.trainable.extend([False] * len(env))
                    current.old_logprobs.extend([0.0] * len(env))
                    current.advantages.extend([0.0] * len(env))
                    current.turn_ids.extend([-1] * len(env))
                    current.temperatures.extend([1.0] * len(env))
                else:
                    n = len(turn.prompt_ids)
                    current = Row(
                        input_ids=list(turn.prompt_ids),
                        trainable=[False] * n,
                        old_logprobs=[0.0] * n,
                        advantages=[0.0] * n,
                        turn_ids=[-1] * n,
                        rollout_index=ri,
                        segment_index=si,
                        temperatures=[1.0] * n,
                    )
                    rows.append(current)
                m = len(turn.response_ids)
                current.input_ids.extend(turn.response_ids)
                current.trainable.extend([True] * m)
                current.old_logprobs.extend(float(x) for x in turn.logprobs)
                current.advantages.extend(adv.tolist())
                current.turn_ids.extend([turn_counter] * m)
                temp = turn.temperature if turn.temperature is not None else temperature
                current.temperatures.extend([float(temp)] * m)
                current.turns.append(ti)
                turn_counter += 1
    return rows


def saved_tokens(rollout: Rollout) -> int:
    """Trajectory volume as *saved segment tokens*: the total length of the rollout's rows.

    Each segment's context is counted once (a turn that extends the previous one adds only
    its new tokens), unlike the sum over turns of prompt + response, which counts every
    shared prefix again (the tokens *processed*).
    """
    return sum(len(r) for r in build_rows([rollout]))


#: sessions generated on top of their parent's context (a memory selection, a rolling summary, a
#: compaction summary): what :func:`appended_tokens` counts by their extension only
SIDE_SESSIONS = (SegmentKind.SELECTION.value, SegmentKind.SUMMARY.value, SegmentKind.COMPACTION.value)


def side_session_overlap(rollout: Rollout) -> int:
    """Tokens that side sessions (:data:`SIDE_SESSIONS`) share with their parent's last context (its
    last turn's prompt + response): the common prefix of each such segment's first prompt with it."""
    shared = 0
    for seg in rollout.segments:
        if seg.kind not in SIDE_SESSIONS or seg.parent is None or not seg.turns:
            continue
        parent = rollout.segments[seg.parent]
        if not parent.turns:
            continue
        last = parent.turns[-1]
        context = list(last.prompt_ids) + list(last.response_ids)
        for a, b in zip(seg.turns[0].prompt_ids, context, strict=False):
            if a != b:
                break
            shared += 1
    return shared


def appended_tokens(rollout: Rollout) -> int:
    """Trajectory volume with a side session counted by what it *adds* to its parent's context.

    :func:`saved_tokens` counts a ``selection`` / ``summary`` / ``compaction`` segment as its own
    row: the parent's whole context again, then the instruction and the generation. ECHO's released
    code appends the selector's prompt and output to the segment that just ended, so the shared
    context is saved once. This is :func:`saved_tokens` less :func:`side_session_overlap`, the same
    rule for every method so that their volumes compare.
    """
    return saved_tokens(rollout) - side_session_overlap(rollout)
