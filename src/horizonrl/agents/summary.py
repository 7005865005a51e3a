"""SUPO rolling summary (docs/spec/baselines.md "SUPO"; Lu et al. 2025, the baseline of ECHO §5) and the
message-level helpers it shares with the ECHO turn memory (:mod:`horizonrl.agents.memory`).

Rollout (``rollout.context: summary``). The working context grows append-only. When, after a turn
and its tool reply, the context ``C`` would leave less than one generation of room,
``|C| + max_new_tokens > B`` (``B`` = ``rollout.context_budget``), the policy gets the summary
instruction ``x_sum`` appended to ``C`` and writes ``<summary>...</summary>`` (at most
``summary_tokens`` tokens: the summary limit). The next segment starts from the original task
messages ``x``, the summary and a continuation message::

    c_{j+1} = x ⊕ [user: <summary>s_j</summary> ⊕ x_cont],      |c_{j+1}| + max_new_tokens <= B

At most ``max_summaries`` (``S``, default 5) summaries per rollout. Needing one more, a summary that
cannot be parsed (no ``<summary>``/``</summary>`` pair with non-empty text, e.g. cut by the limit),
a summary prompt longer than ``summary_budget`` or a rebuilt context over ``B`` ends the rollout as
``termination="overlong"``, which the ``supo`` estimator excludes from the group baseline and gives
advantage 0 (:mod:`horizonrl.credit.supo`). The summary generation is its own segment of kind
``"summary"`` (one turn, one ``summary`` span over all its tokens; ``parent`` = the summarized
segment); its prompt extends the summarized context token-for-token.

Shared helpers (also used by :mod:`.memory`): :class:`MessageContext` (a working context kept as
exact token ids + the messages not yet rendered), :class:`TerminalTap` and :func:`finish_terminal`
(the answer turn reaches ``commit`` so that it gets spans and the metrics are final), thinking
stripping, char→token span mapping, and the scripted expert's findings (:func:`expert_finding`).

Warm start: every generation request carries its scripted expert (``Generate.expert``: the env's
expert action for turns, :func:`expert_summary` for summaries), so driving the loop with
:class:`horizonrl.agents.expert.ExpertEngine` (``train.recipes.expert_program_rows``) records SFT
demonstrations in exactly this protocol.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from horizonrl.agents.context import (
    ContextManager,
    Episode,
    SubProgram,
    finish,
    generation_turn,
    register_context,
)
from horizonrl.agents.driver import Generate
from horizonrl.agents.react import LoopLimits
from horizonrl.agents.renderer import Renderer
from horizonrl.envs.core.base import StepResult
from horizonrl.envs.core.tools import ToolCall, parse_tool_calls
from horizonrl.inference.base import Generation, SamplingParams
from horizonrl.textparse import cap_text, first_block, strip_think
from horizonrl.trajectory import Span, Turn
from horizonrl.vocab import Termination

SUMMARY_OPEN, SUMMARY_CLOSE = "<summary>", "</summary>"
SUMMARY_INSTRUCTION = (
    f"Context full. Summarize the facts you found and what remains to do as {SUMMARY_OPEN}...{SUMMARY_CLOSE}."
)
SUMMARY_CONTINUATION = "Context reset; above is the summary of your progress. Continue the task."


# ----------------------------------------------------------------------------------------- text


def strip_thinking(text: str) -> str:
    """``text`` (cut to ``textparse.MAX_TEXT_CHARS``) with every ``<think>...</think>`` block (an
    unterminated one: to the end) blanked to spaces of the same length, so character offsets into the
    result are offsets into ``text``."""
    return strip_think(cap_text(text), blank=True)


def collapse(text: str, cap: int) -> str:
    """Whitespace collapsed to single spaces, stripped, cut to at most ``cap`` characters."""
    return re.sub(r"\s+", " ", text).strip()[:cap].strip()


def parse_summary(text: str) -> str | None:
    """The collapsed text of the first ``<summary>...</summary>`` block outside thinking, or ``None``
    when there is no complete block or it is empty (SUPO: an unparsable summary)."""
    visible = strip_thinking(text)
    block = first_block(visible, SUMMARY_OPEN, SUMMARY_CLOSE)
    if block is None or not block.closed:
        return None
    return collapse(visible[block.body_start : block.body_end], 100_000) or None


def token_boundary(tokenizer: Any, ids: Sequence[int], pos: int, *, cover: bool) -> int:
    """Token index ``k`` at character ``pos`` of ``decode(ids)`` (special tokens skipped).

    ``cover=True``: the smallest ``k`` whose prefix ``ids[:k]`` decodes to at least ``pos`` characters
    (a span ending at ``pos`` includes the token that straddles it); ``cover=False``: the largest ``k``
    whose prefix decodes to at most ``pos`` characters (a span starting at ``pos`` includes it too).
    Binary search over prefix decodes (their lengths are non-decreasing).
    """

    def length(k: int) -> int:
        return len(tokenizer.decode(list(ids[:k]), skip_special_tokens=True))

    lo, hi = 0, len(ids)
    if cover:
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if length(mid) < pos else (lo, mid)
        return lo
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if length(mid) <= pos else (lo, mid - 1)
    return lo


def tool_call_args(text: str) -> list[str]:
    """The string arguments of the well-formed tool calls in ``text``, in order."""
    return [
        v
        for c in parse_tool_calls(text)
        if isinstance(c, ToolCall)
        for v in c.arguments.values()
        if isinstance(v, str) and v.strip()
    ]


def obs_messages(result: StepResult) -> list[dict[str, str]]:
    """The environment's reply as chat messages (one per tool call answered, ``StepResult.messages``)."""
    return result.chat_messages()


# ----------------------------------------------------------------------------- working context


@dataclass
class MessageContext:
    """A working context: exact ids up to the last response (``head``), plus messages not yet rendered.

    ``ids()`` is ``head + renderer.continuation_ids(pending)`` (``renderer.initial_ids(base + pending)``
    before the first response), so every prompt extends the previous one token-for-token, exactly as
    :func:`horizonrl.agents.context.observation_ids` extends the append-only context.
    """

    renderer: Renderer
    tools: list | None
    base: list[dict[str, str]]
    head: list[int] | None = None
    pending: list[dict[str, str]] = field(default_factory=list)

    def ids(self, extra: Sequence[dict[str, str]] = ()) -> list[int]:
        """The prompt with ``extra`` messages appended (opening the next assistant turn)."""
        msgs = [*self.pending, *extra]
        if self.head is None:
            return list(self.renderer.initial_ids([*self.base, *msgs], tools=self.tools))
        return self.head + list(self.renderer.continuation_ids(msgs))

    def after(
        self, prompt: Sequence[int], response_ids: Sequence[int], messages: Sequence[dict]
    ) -> MessageContext:
        """The context after a response (sampled from ``prompt``) and the ``messages`` that answer it."""
        head = [*prompt, *response_ids, *self.renderer.end_of_turn_ids(response_ids)]
        return MessageContext(self.renderer, self.tools, self.base, head, [dict(m) for m in messages])


def end_overlong(ep: Episode, reason: str, segment: Any = None) -> None:
    """End the rollout as ``overlong`` (credit 0 under ``supo``/``echo``), recording why in
    ``info["overlong"]`` of ``segment`` (default: the current one)."""
    (segment or ep.segment).info["overlong"] = reason
    finish(ep, Termination.OVERLONG)


def agent_turns(ep: Episode) -> list[Turn]:
    return [t for s in ep.rollout.segments if s.kind == "normal" for t in s.turns]


def base_metrics(ep: Episode, splits: int) -> dict[str, float]:
    """Metrics both managers report (averaged per step as ``rollout/<key>``; docs/spec/echo.md "Metrics").

    ``tool_turns``: agent turns that ran a tool; ``splits``: reconstructions (summaries); ``split``: 1 if
    any (its mean is the split rate); ``segments``: working segments; ``response_length``: mean generated
    tokens per agent turn; ``overlong``: 1 for an overlong rollout.
    """
    turns = agent_turns(ep)
    return {
        "tool_turns": float(sum(t.tool_calls > 0 for t in turns)),
        "splits": float(splits),
        "split": float(splits > 0),
        "segments": float(sum(s.kind == "normal" for s in ep.rollout.segments)),
        "response_length": sum(t.num_response_tokens for t in turns) / max(len(turns), 1),
        "overlong": float(ep.rollout.termination == Termination.OVERLONG and ep.done),
    }


# ------------------------------------------------------------------------------------ SUPO

#: ``Episode.state`` key of a protocol manager's state (``.ctx``: its :class:`MessageContext`);
#: ``state["phase"]`` names the next generation (``turn``, ``selection`` or ``summary``).
STATE_KEY = "protocol"


@dataclass
class _SupoState:
    ctx: MessageContext
    task_messages: list[dict[str, str]]
    params: SamplingParams | None = None
    summaries: int = 0


class MessageManager(ContextManager):
    """Shared turn bookkeeping of the message-based managers (SUPO summary, ECHO memory):
    remember the turn's sampling parameters, mark the ``turn`` phase, refresh the metrics."""

    def _metrics(self, ep: Episode) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def before_turn(self, ep: Episode, params: SamplingParams) -> SubProgram:
        ep.state[STATE_KEY].params = params
        ep.state["phase"] = "turn"
        out = yield from super().before_turn(ep, params)
        self._metrics(ep)
        return out


@dataclass(frozen=True)
class SummaryParams:
    """``rollout.context_params`` of the ``summary`` context manager (SUPO; module docstring)."""

    #: ``S``: summaries allowed per rollout (>= 0); needing another ends the rollout as overlong.
    max_summaries: int = 5
    #: The summary limit: tokens of one summary generation (>= 1).
    summary_tokens: int = 128
    #: Longest summary prompt + summary, in tokens (None: ``2 B``, twice ``rollout.context_budget``;
    #: >= 2; keep it within the model's context length).
    summary_budget: int | None = None


@register_context("summary")
class SummaryContext(MessageManager):
    """SUPO rolling summary (see the module docstring).

    Parameters (``rollout.context_params``): ``max_summaries`` (``S``), ``summary_tokens`` (the summary
    limit: tokens of one summary generation), ``summary_budget`` (longest summary prompt + summary,
    default ``2 B``; keep it within the model's context length).
    """

    params_cls = SummaryParams

    def __init__(self, limits: LoopLimits, params: SummaryParams | None = None) -> None:
        super().__init__(limits)
        p = params if params is not None else SummaryParams()
        max_summaries, summary_tokens, summary_budget = p.max_summaries, p.summary_tokens, p.summary_budget
        for name, value, lo in (("max_summaries", max_summaries, 0), ("summary_tokens", summary_tokens, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ValueError(f"summary context: {name} must be an integer >= {lo}, got {value!r}")
        if summary_budget is not None and (not isinstance(summary_budget, int) or summary_budget < 2):
            raise ValueError(
                f"summary context: summary_budget must be an integer >= 2, got {summary_budget!r}"
            )
        self.max_summaries = max_summaries
        self.summary_tokens = summary_tokens
        self.summary_budget = summary_budget or 2 * limits.context_budget

    def start(self, ep: Episode) -> None:
        st = _SupoState(
            ctx=MessageContext(ep.renderer, ep.tools, list(ep.messages)), task_messages=list(ep.messages)
        )
        ep.state[STATE_KEY] = st
        ep.context = st.ctx.ids()
        self._metrics(ep)

    def prompt(self, ep: Episode) -> list[int]:
        return ep.context

    def commit(
        self, ep: Episode, turn: Turn, gen: Generation, result: StepResult, snapshot: Any
    ) -> SubProgram:
        st: _SupoState = ep.state[STATE_KEY]
        n = turn.num_response_tokens
        turn.spans = [Span("action", 0, n)] if n else []
        ep.segment.turns.append(turn)
        new = st.ctx.after(turn.prompt_ids, turn.response_ids, obs_messages(result))
        ids = new.ids()
        st.ctx, ep.context = new, ids
        if len(ids) + st.params.max_new_tokens > self.limits.context_budget:
            yield from self._summarize(ep, st)
        self._metrics(ep)

    def finalize(self, ep: Episode, turn: Turn, gen: Generation, result: StepResult) -> None:
        n = turn.num_response_tokens
        turn.spans = [Span("answer", 0, n)] if n else []
        super().finalize(ep, turn, gen, result)
        self._metrics(ep)

    def _summarize(self, ep: Episode, st: _SupoState) -> SubProgram:
        if st.summaries >= self.max_summaries:
            end_overlong(ep, f"more than max_summaries={self.max_summaries} summaries needed")
            return
        instruction = {"role": "user", "content": SUMMARY_INSTRUCTION}
        prompt = st.ctx.ids([instruction])
        if len(prompt) + self.summary_tokens > self.summary_budget:
            end_overlong(
                ep, f"summary prompt of {len(prompt)} tokens exceeds summary_budget={self.summary_budget}"
            )
            return
        parent = ep.segment_index
        seg = ep.new_segment("summary", parent=parent, fork_index=st.summaries)
        ep.state["phase"] = "summary"
        gen = yield Generate(
            prompt,
            replace(st.params, max_new_tokens=self.summary_tokens),
            expert=lambda rng, noise: expert_summary(ep),
        )
        n = len(gen.ids)
        seg.turns.append(generation_turn(prompt, gen, [Span("summary", 0, n)] if n else []))
        st.summaries += 1
        text = parse_summary(gen.text)
        if text is None:
            seg.info["unparsable"] = True
            end_overlong(ep, "unparsable summary", seg)
            return
        cont = {"role": "user", "content": f"{SUMMARY_OPEN}{text}{SUMMARY_CLOSE}\n\n{SUMMARY_CONTINUATION}"}
        ctx = MessageContext(ep.renderer, ep.tools, [*st.task_messages, cont])
        ids = ctx.ids()
        if len(ids) + st.params.max_new_tokens > self.limits.context_budget:
            end_overlong(ep, f"rebuilt context of {len(ids)} tokens leaves no room in the budget", seg)
            return
        nxt = ep.new_segment("normal", parent=parent, fork_index=st.summaries, info={"summary": text})
        ep.segment, st.ctx, ep.context = nxt, ctx, ids

    def _metrics(self, ep: Episode) -> None:
        st: _SupoState = ep.state[STATE_KEY]
        ep.rollout.env["metrics"] = base_metrics(ep, st.summaries)


# ------------------------------------------------------------------------------------ expert


def expert_finding(action_text: str, observation: str, cap: int = 300) -> str:
    """The scripted expert's record of a tool result: the sentences of ``observation`` that start with
    a string argument of the call (else that mention one; else the first sentence), capped."""
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", observation.strip()) if s]
    args = [a.strip().lower() for a in tool_call_args(action_text)]
    for test in (str.startswith, str.__contains__):
        hits = [s for s in sentences if any(test(s.lower(), a) for a in args)]
        if hits:
            return collapse(" ".join(dict.fromkeys(hits)), cap)
    return collapse(sentences[0] if sentences else "", cap)


def expert_summary(ep: Episode) -> str:
    """The scripted expert's SUPO summary: the expert finding of every tool turn of the rollout so far
    (earlier segments included, so facts survive repeated summaries), in order, deduplicated."""
    found = [expert_finding(t.response_text, t.observation or "") for t in agent_turns(ep) if t.tool_calls]
    return f"{SUMMARY_OPEN}{' '.join(dict.fromkeys(f for f in found if f)) or 'nothing yet'}{SUMMARY_CLOSE}"
