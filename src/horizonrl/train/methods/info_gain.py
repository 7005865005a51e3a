"""Information-gain inputs of Mosaic (``gains``) and IGPO (``scores``), scored with the rollout engine.

``score(h)`` is the mean log-probability of the ground-truth answer tokens
teacher-forced after the context ``h`` followed by the answer probe
``"Now there's enough information to answer. <answer>"`` (docs/spec/mosaic.md B.1,
adapted to our chat template: no ``</think>``; when ``h`` ends with the
end-of-turn token a new assistant header is opened first, so every probe is
scored inside an open assistant turn). The probe and the answer are encoded
*together* and the answer's tokens located by character offsets, so the scored
tokens are exactly the ones the policy writes after ``<answer>`` (encoding the
answer on its own, or after a trailing space, gives tokens the policy never
produces). Only answer tokens are scored; no gradient. All contexts of a step go
to the engine in one batched ``score()`` call, timed as ``time/ig_score_s``.

Mosaic (paper §3.2): for each non-terminal session ``s``,
``r^Δ_s = score(h^+_s) - score(h^-_s)`` with, per session kind,
normal: prompt / the context when the session ended (``info["h_plus"]``, its
last tool response included; without it, prompt + complete response);
compaction and subagent: the ``info["h_minus"]`` / ``info["h_plus"]`` token ids
recorded by the agent loops.
IGPO: for every non-final turn, ``(score(prompt), score(next prompt))`` where the
next prompt includes the turn's observation (the prompt + response when the
next turn starts a new session).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from horizonrl import credit
from horizonrl.credit.mosaic import (
    answer_score,
    information_gain_metrics,
    marginal_information_gain,
    terminal_session_index,
)
from horizonrl.train.trainers.features import Feature, FeatureContext, register_feature
from horizonrl.trajectory import Group, Rollout, Segment

PROBE = "Now there's enough information to answer. <answer>"


def probe_split(tokenizer, answer: str, probe: str = PROBE) -> tuple[list[int], list[int]]:
    """``(probe_ids, answer_ids)`` of ``probe + answer`` encoded jointly, split at the answer's first char.

    A token that straddles the boundary belongs to the answer (it carries answer text).
    """
    enc = tokenizer(probe + answer, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), list(enc["offset_mapping"])
    cut = next((i for i, (_, end) in enumerate(offsets) if end > len(probe)), len(ids))
    return ids[:cut], ids[cut:]


class _Scorer:
    """Collects (context, answer) pairs and scores them in one batched call."""

    def __init__(self, ctx: FeatureContext) -> None:
        self.ctx = ctx
        self.renderer = ctx.renderer
        self.header = list(self.renderer.continuation_ids([]))
        self.contexts: list[list[int]] = []
        self.answers: list[list[int]] = []
        self._split: dict[str, tuple[list[int], list[int]]] = {}
        self.metrics: dict[str, float] = {}

    def split(self, answer: str) -> tuple[list[int], list[int]]:
        if answer not in self._split:
            self._split[answer] = probe_split(self.ctx.tokenizer, answer)
        return self._split[answer]

    def add(self, h: Sequence[int], answer: str) -> int:
        probe, answer_ids = self.split(answer)
        ctx = list(h)
        if ctx and ctx[-1] == self.renderer.eos_id:
            ctx += self.header
        self.contexts.append(ctx + probe)
        self.answers.append(answer_ids)
        return len(self.contexts) - 1

    def run(self) -> list[float]:
        t0 = time.perf_counter()
        out = self.ctx.engine.score(self.contexts, self.answers) if self.contexts else []
        self.metrics["time/ig_score_s"] = time.perf_counter() - t0
        self.metrics["ig/scored_contexts"] = float(len(self.contexts))
        return [answer_score(lp) for lp in out]


def _gold_answer(scorer: _Scorer, rollout: Rollout) -> str:
    """The gold answer text of the rollout's task (scored by :meth:`_Scorer.add`)."""
    task = scorer.ctx.tasks_by_id.get(rollout.task_id)
    if task is None:
        raise ValueError(f"information gain needs the gold answer of task {rollout.task_id!r}")
    if not scorer.split(str(task.answer))[1]:
        raise ValueError(f"task {rollout.task_id!r} has an empty gold answer")
    return str(task.answer)


def session_contexts(seg: Segment) -> tuple[list[int], list[int]] | None:
    """``(h^-, h^+)`` of a session (module docstring), or None when it has none."""
    if seg.kind in ("compaction", "subagent"):
        if "h_minus" in seg.info and "h_plus" in seg.info:
            return list(seg.info["h_minus"]), list(seg.info["h_plus"])
        return None
    if not seg.turns:
        return None
    last = seg.turns[-1]
    h_plus = seg.info.get("h_plus") or list(last.prompt_ids) + list(last.response_ids)
    return list(seg.turns[0].prompt_ids), list(h_plus)


@register_feature("gains")
def mosaic_gains(ctx: FeatureContext, groups: Sequence[Group], params: dict[str, Any]) -> Feature:
    """Raw marginal IG per rollout and session for the ``mosaic`` estimator (None if shaping is off)."""
    if params.get("shaping", True) is False:
        return Feature(None)
    scorer = _Scorer(ctx)
    plan: list[list[tuple[int, int] | None]] = []
    for ro in credit.flatten_rollouts(groups):
        answer = _gold_answer(scorer, ro)
        term = terminal_session_index(ro) if ro.segments else -1
        row: list[tuple[int, int] | None] = []
        for s, seg in enumerate(ro.segments):
            hs = None if s == term else session_contexts(seg)
            row.append(None if hs is None else (scorer.add(hs[0], answer), scorer.add(hs[1], answer)))
        plan.append(row)
    scores = scorer.run()
    gains = [
        [None if p is None else marginal_information_gain(scores[p[0]], scores[p[1]]) for p in row]
        for row in plan
    ]
    flat = [g for row in gains for g in row]
    m = information_gain_metrics(flat)
    metrics = {
        **scorer.metrics,
        "ig/positive_rate": m["positive_ig_rate"],
        "ig/per_session": m["ig_per_session"],
        "ig/eligible_sessions": m["eligible"],
    }
    return Feature(gains, metrics)


@register_feature("scores")
def igpo_scores(ctx: FeatureContext, groups: Sequence[Group], params: dict[str, Any]) -> Feature:
    """Per-turn ``(score before, score after)`` pairs for the ``igpo`` estimator."""
    scorer = _Scorer(ctx)
    plan: list[list[tuple[int, int] | None]] = []
    for ro in credit.flatten_rollouts(groups):
        answer = _gold_answer(scorer, ro)
        row: list[tuple[int, int] | None] = []
        for seg in ro.segments:
            for t, turn in enumerate(seg.turns):
                after = (
                    seg.turns[t + 1].prompt_ids
                    if t + 1 < len(seg.turns)
                    else list(turn.prompt_ids) + list(turn.response_ids)
                )
                row.append((scorer.add(turn.prompt_ids, answer), scorer.add(after, answer)))
        plan.append(row)
    scores = scorer.run()
    out = [[(scores[a], scores[b]) for a, b in row] for row in plan]
    gains = np.array([b - a for row in out for a, b in row[:-1]] or [0.0])
    return Feature(out, {**scorer.metrics, "ig/turn_gain_mean": float(gains.mean())})
