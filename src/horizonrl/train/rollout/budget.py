"""Generation budgets matched on generated tokens, never overshot.

Comparisons between methods are fair only at matched work. The unit here is the
*generated token* (every token any engine call sampled: trunks, siblings,
compaction sessions, subagents, rollouts that are later discarded). A
:class:`TokenBudget` enforces a limit in two ways:

- **before a phase** (one group-trainer step, one RTPO phase 1 or stage) the
  trainer asks :meth:`TokenBudget.affordable` with the phase's rollout count; the
  cost is predicted as that count times the largest per-rollout cost of earlier
  phases of the same kind (the first phase of a kind is always allowed). A phase
  predicted to overrun the limit does not start and the run ends.
- **during a phase** :class:`BudgetedEngine` clips every generation call so that
  even its worst case (``n_prompts x max_new_tokens``) fits what is left; once
  nothing is left it returns empty generations. A phase that hit the cap is
  *incomplete*: the trainer discards it untrained (``budget/incomplete_phases``)
  and ends the run. So ``spent <= limit`` holds by construction.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from horizonrl.inference.base import Engine, EngineWrapper, Generation, MappedStream, SamplingParams


@dataclass
class TokenBudget:
    """Generated-token budget of one run (``limit = 0``: unlimited, only counting)."""

    limit: int = 0
    spent: int = 0
    rollouts: int = 0
    trainable_tokens: int = 0
    clipped: bool = False
    per_rollout: dict[str, float] = field(default_factory=dict)

    @property
    def left(self) -> int | None:
        return None if not self.limit else max(0, self.limit - self.spent)

    def affordable(self, kind: str, rollouts: int) -> bool:
        """Whether a phase of ``kind`` with ``rollouts`` rollouts is predicted to fit what is left."""
        if not self.limit:
            return True
        if self.spent >= self.limit:
            return False
        est = self.per_rollout.get(kind)
        return est is None or self.spent + est * rollouts <= self.limit

    def record_phase(self, kind: str, rollouts: int, tokens: int) -> None:
        """Remember a finished phase's cost per rollout (the prediction for later phases of ``kind``)."""
        if rollouts > 0:
            self.per_rollout[kind] = max(self.per_rollout.get(kind, 0.0), tokens / rollouts)

    def state(self) -> dict:
        return dataclasses.asdict(self)

    def load(self, state: Mapping) -> None:
        for k, v in state.items():
            setattr(self, k, dict(v) if isinstance(v, dict) else v)

    def metrics(self) -> dict[str, float]:
        out = {
            "budget/gen_tokens": float(self.spent),
            "budget/rollouts": float(self.rollouts),
            "budget/trainable_tokens": float(self.trainable_tokens),
        }
        if self.limit:
            out["budget/gen_tokens_left"] = float(self.left or 0)
        return out


class BudgetedEngine(EngineWrapper):
    """An engine wrapper that counts generated tokens and never lets them pass ``budget.limit``.

    ``generate`` clips ``max_new_tokens`` to ``left // len(prompts)`` when the worst
    case would not fit (setting ``budget.clipped``), and returns empty generations
    (``finish_reason='length'``) when nothing is left. ``score`` and ``sync`` are
    passed through (scoring is not generation).
    """

    def __init__(self, engine: Engine, budget: TokenBudget) -> None:
        super().__init__(engine)  # rng_state, set_seed, model, ... are the wrapped engine's
        self.budget = budget
        self._reserved = 0  # worst case of the requests running in a stream

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, **kw) -> list[Generation]:
        b = self.budget
        left = b.left
        if left is not None and len(prompts) * params.max_new_tokens > left:
            b.clipped = True
            per = left // max(1, len(prompts))
            if per < 1:
                return [Generation(ids=[], logprobs=[], text="", finish_reason="length") for _ in prompts]
            params = dataclasses.replace(params, max_new_tokens=per)
        gens = self.inner.generate(prompts, params, **kw)
        b.spent += sum(len(g.ids) for g in gens)
        return gens

    def open_stream(self):
        """The wrapped engine's continuous batcher under the same guarantee: a request joins with
        ``max_new_tokens`` clipped to what is left after every running request's worst case
        (``_reserved``), or ends empty at once when nothing is. Requests are clipped in the order they
        join (the synchronous driver splits what is left evenly over a call), so once the budget runs
        short the two drivers differ. Reserving and spending both happen in the stream's ``step``."""
        inner = self.inner.open_stream()
        if inner is None:
            return None
        return MappedStream(inner, before=self._reserve, after=self._spend, drop=self._release)

    def _reserve(self, params: SamplingParams) -> SamplingParams | Generation:
        b = self.budget
        left = b.left
        if left is not None and params.max_new_tokens > left - self._reserved:
            b.clipped = True
            if left - self._reserved < 1:
                return Generation(ids=[], logprobs=[], text="", finish_reason="length")
            params = dataclasses.replace(params, max_new_tokens=left - self._reserved)
        self._reserved += params.max_new_tokens
        return params

    def _release(self, params: SamplingParams) -> None:
        self._reserved -= params.max_new_tokens  # a request the closed stream never finished

    def _spend(self, gen: Generation, params: SamplingParams) -> Generation:
        self.budget.spent += len(gen.ids)
        self._reserved -= params.max_new_tokens
        return gen
