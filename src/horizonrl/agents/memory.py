"""ECHO selective turn memory (docs/spec/echo.md "Rollout"; paper §4.2, Algorithm 1, Eq. 8-12).

Rollout (``rollout.context: memory``):

- After each tool response the context gets the ``<sum_last_turn>`` hint (:data:`HINT`, a user
  message). The model's next message begins with one ``<sum_last_turn>...</sum_last_turn>`` block about
  the latest result, then its next action. The parsed finding ``m_i`` (:func:`locate_finding`: thinking
  stripped, cut before tool-call/answer markup, whitespace collapsed, ``finding_chars`` cap) completes the
  memory record ``e_i = (i, alpha_i, m_i)`` of the previous turn (Eq. 9); ``alpha_i``
  (:func:`render_action`) is a compact rendering of turn ``i``'s tool calls. Records are never merged:
  every one stays addressable by its source index ``i`` (rollout-global, 0-based, in order of the
  accepted tool-use turns).
- When a turn's reply would leave less than one generation of room, ``|C ⊕ a_t ⊕ o_t ⊕ hint| +
  max_new_tokens > B``, that turn *overflowed*: the environment is restored to its snapshot from before
  the step and the turn is dropped (not trained, not counted against ``max_turns``); the finding its
  message wrote completes the previous record, so every record is complete. The policy then selects from
  memory (Eq. 10): ``c_sel = C ⊕ [user: render_list(M) ⊕ x_sel]`` (:data:`SELECTION_INSTRUCTION`), one
  generation of at most ``selection_tokens`` tokens (``selection_budget`` bounds prompt + selection),
  recorded as its own segment of kind ``"selection"`` (one turn, one ``selection`` span; ``parent`` =
  the working segment).
- Repair ``rho_{B,S,K}`` (:func:`repair_selection`, pure): parse ``turn_N`` lines of the ``<selection>``
  block, drop malformed, out-of-range and duplicate indices, keep the first ``S`` (``max_selected``),
  merge the latest ``K`` (``keep_latest``) turns, and drop model-selected turns (last first) until
  ``|c| + max_new_tokens <= B``; still over budget ends the rollout as ``overlong``.
- Reconstruction (Eq. 11-12): the next segment starts from ``c = x ⊕ [user: render(M[I]) ⊕ x_cont]``:
  the task messages, then one ``turn_i: action="..." | finding="..."`` line per kept record (ascending)
  and the continuation message :data:`CONTINUATION`; the dropped turn is then sampled again from ``c``.
  Its ``info`` holds ``selected`` (model-selected after repair) and ``kept_latest`` (the latest ``K``):
  ``I_src`` of :mod:`horizonrl.credit.echo` when it is the last segment. At most
  ``max_reconstructions`` (5: six segments); needing another ends the rollout as overlong.

Spans (the provenance of :func:`horizonrl.credit.provenance_mask`): in a tool-use message, the finding
block is a ``finding`` span with ``source_turn`` = the record it completes, every other token an
``action`` span with ``source_turn`` = the message's own index; the final message's non-finding tokens
are an ``answer`` span; selection messages a ``selection`` span.

Ablations (``rollout.context_params``): ``retrieval="semantic"`` replaces the selection generation by the
top-``S`` records by cosine similarity of their embedded text to the current state (task + latest
turn); ``observations="full"`` renders kept records with their raw observations instead of findings.
(Dense credit and turn-level IS are ``algo.estimator_params.dense`` and ``algo.turn_level_is``.)

Warm start: turns carry :func:`expert_turn` (``ep.state["expert"]``) and selections
:func:`expert_selection` as their ``Generate.expert``, so ``train.recipes.expert_program_rows`` records
SFT demonstrations of this exact protocol with :class:`horizonrl.agents.expert.ExpertEngine`.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from horizonrl.agents.context import Episode, SubProgram, generation_turn, register_context
from horizonrl.agents.driver import Generate
from horizonrl.agents.react import LoopLimits
from horizonrl.agents.summary import (
    STATE_KEY,
    MessageContext,
    MessageManager,
    base_metrics,
    collapse,
    end_overlong,
    expert_finding,
    obs_messages,
    strip_thinking,
    token_boundary,
    tool_call_args,
)
from horizonrl.envs.core.base import StepResult
from horizonrl.envs.core.tools import ToolCall, parse_answer, parse_tool_calls
from horizonrl.inference.base import Generation, SamplingParams
from horizonrl.textparse import find_any, first_block
from horizonrl.trajectory import Span, Turn

SUM_OPEN, SUM_CLOSE = "<sum_last_turn>", "</sum_last_turn>"
SEL_OPEN, SEL_CLOSE = "<selection>", "</selection>"
TOOL_MARKUP = ("<tool_call>", "<answer>")
RETRIEVALS = ("learned", "semantic")
OBSERVATIONS = ("findings", "full")
# The paper's appendix D.2 prompts are missing from its extracted text; these follow §4.2 / Algorithm 1 /
# docs/spec/echo.md and are kept short, because every hint stays in the context (Algorithm 1 line 24).
HINT = f"Begin your reply with {SUM_OPEN}one fact from this result{SUM_CLOSE}, then your next action."
SELECTION_INSTRUCTION = (
    "Which turns should be kept (evidence, constraints, failed attempts, next steps)? Reply with one "
    f"{SEL_OPEN}...{SEL_CLOSE} block of turn_N: reason lines (may be empty); no tools, no answer."
)
SELECTION_HEADER = "Context full. Memory of your turns:"
MEMORY_HEADER = "Memory:"
CONTINUATION = "Context rebuilt from memory. Continue the task."
# At most 9 digits: a longer index is malformed (and never an int() over the interpreter's digit limit).
_LINE = re.compile(r"(?:[-*]\s*)?turn_(\d{1,9})\s*(?::.*)?")


# ------------------------------------------------------------------------------------ parsing


def locate_finding(text: str, cap: int = 300) -> tuple[int, int, str] | None:
    """``(start, end, finding)``: the character range of the finding in a message and its parsed text.

    Thinking is ignored; everything from the first tool-call or answer tag on is cut. With a
    ``<sum_last_turn>`` block before that cut the range is the block (to its closing tag, or to the cut
    when unterminated); without one, the text before the cut is the finding. The text is
    whitespace-collapsed and capped at ``cap`` characters. ``None`` when there is no block and no text.
    """
    visible = strip_thinking(text)
    cut = find_any(visible, TOOL_MARKUP)
    cut = len(visible) if cut < 0 else cut
    block = first_block(visible, SUM_OPEN, SUM_CLOSE, end=cut)
    if block is not None:
        return block.start, block.end, collapse(visible[block.body_start : block.body_end], cap)
    finding = collapse(visible[:cut], cap)
    if not finding:
        return None
    lead = len(visible[:cut]) - len(visible[:cut].lstrip())
    return lead, len(visible[:cut].rstrip()), finding


def render_action(text: str, finding: tuple[int, int, str] | None = None, cap: int = 120) -> str:
    """``alpha_i``: ``name(arg=value, ...)`` per tool call (``;``-joined), else ``answer: ...``, else the
    message text (finding and thinking removed), capped at ``cap`` characters."""
    visible = strip_thinking(text)
    if finding is not None:
        visible = visible[: finding[0]] + " " + visible[finding[1] :]
    parts = []
    for call in parse_tool_calls(visible):
        if isinstance(call, ToolCall):
            args = ", ".join(
                f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in call.arguments.items()
            )
            parts.append(f"{call.name}({args})")
        else:
            parts.append("invalid tool call")
    if parts:
        return collapse("; ".join(parts), cap)
    answer = parse_answer(visible)
    if answer is not None:
        return collapse(f"answer: {answer}", cap)
    return collapse(visible, cap) or "(empty)"


def parse_selection(text: str) -> list[int | str]:
    """Entries of the ``<selection>`` block, one per non-empty line: the index of a ``turn_N[: reason]``
    line, or the line itself (malformed). Without a block every non-empty line is malformed."""
    visible = strip_thinking(text)
    block = first_block(visible, SEL_OPEN, SEL_CLOSE)
    if block is None:
        return [line.strip() for line in visible.splitlines() if line.strip()]
    body = visible[block.body_start : block.body_end]
    out: list[int | str] = []
    for line in (raw.strip() for raw in body.splitlines()):
        if line:
            m = _LINE.fullmatch(line)
            out.append(int(m.group(1)) if m else line)
    return out


# ------------------------------------------------------------------------------------- repair


@dataclass(frozen=True)
class Repair:
    """Result of ``rho_{B,S,K}``: ``selected`` (model-selected, model order), ``kept_latest`` (the latest
    ``K``), what was dropped and why, ``cost`` of the kept set (when a cost was given) and ``fits``."""

    selected: tuple[int, ...]
    kept_latest: tuple[int, ...]
    malformed: tuple[str, ...] = ()
    out_of_range: tuple[int, ...] = ()
    duplicates: tuple[int, ...] = ()
    over_cap: tuple[int, ...] = ()
    over_budget: tuple[int, ...] = ()
    cost: int | None = None
    fits: bool = True

    @property
    def kept(self) -> tuple[int, ...]:
        """``I``: the turns rendered into the next context, ascending."""
        return tuple(sorted(set(self.selected) | set(self.kept_latest)))

    def counts(self) -> dict[str, int]:
        names = ("malformed", "out_of_range", "duplicates", "over_cap", "over_budget")
        return {k: len(getattr(self, k)) for k in names}


def repair_selection(
    entries: Sequence[int | str],
    available: Sequence[int],
    *,
    max_selected: int,
    keep_latest: int,
    cost: Callable[[tuple[int, ...]], int] | None = None,
    budget: int | None = None,
) -> Repair:
    """The repair operator ``rho_{B,S,K}`` (paper Eq. 10, docs/spec/echo.md), a pure function.

    In entry order: a non-integer entry is *malformed*; an index not in ``available`` is *out of range*;
    one seen before is a *duplicate*; past the first ``S = max_selected`` valid ones it is *over cap*.
    ``kept_latest`` = the ``K = keep_latest`` largest available indices. With ``cost`` (tokens of the
    context rebuilt from a kept set, ascending tuple) and ``budget`` ``B``: while ``cost(kept) > B``, the
    last model-selected index not among the latest ``K`` is dropped (*over budget*); if only those
    remain and it is still over, ``fits=False``.
    """
    for name, value in (("max_selected", max_selected), ("keep_latest", keep_latest)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"repair_selection: {name} must be an integer >= 0, got {value!r}")
    if (cost is None) != (budget is None):
        raise ValueError(f"repair_selection: give both cost and budget or neither (budget={budget!r})")
    pool = sorted({int(i) for i in available})
    valid = set(pool)
    selected: list[int] = []
    malformed: list[str] = []
    out_of_range: list[int] = []
    duplicates: list[int] = []
    over_cap: list[int] = []
    seen: set[int] = set()  # selected or over cap: membership in O(1), so repair is linear in the entries
    for e in entries:
        if isinstance(e, bool) or not isinstance(e, int | np.integer):
            malformed.append(str(e))
        elif int(e) not in valid:
            out_of_range.append(int(e))
        elif int(e) in seen:
            duplicates.append(int(e))
        elif len(selected) >= max_selected:
            over_cap.append(int(e))
            seen.add(int(e))
        else:
            selected.append(int(e))
            seen.add(int(e))
    latest = tuple(pool[max(0, len(pool) - keep_latest) :]) if keep_latest else ()
    over_budget: list[int] = []
    total, fits = None, True
    if cost is not None:
        while True:
            total = int(cost(tuple(sorted(set(selected) | set(latest)))))
            if total <= budget:
                break
            removable = [i for i in selected if i not in latest]
            if not removable:
                fits = False
                break
            selected.remove(removable[-1])
            over_budget.insert(0, removable[-1])
    return Repair(
        tuple(selected),
        latest,
        tuple(malformed),
        tuple(out_of_range),
        tuple(duplicates),
        tuple(over_cap),
        tuple(over_budget),
        total,
        fits,
    )


def semantic_topk(query: np.ndarray, vectors: np.ndarray, indices: Sequence[int], k: int) -> list[int]:
    """The ``k`` indices whose rows of ``vectors`` have the largest dot product with ``query`` (cosine for
    unit rows), best first; ties go to the earlier turn."""
    vectors = np.asarray(vectors, dtype=np.float64)
    if vectors.ndim != 2 or vectors.shape[0] != len(indices):
        raise ValueError(f"semantic_topk: vectors of shape {vectors.shape} for {len(indices)} indices")
    sims = vectors @ np.asarray(query, dtype=np.float64)
    order = sorted(range(len(indices)), key=lambda j: (-sims[j], indices[j]))
    return [int(indices[j]) for j in order[:k]]


# ------------------------------------------------------------------------------------- manager


@dataclass
class Record:
    """Memory record ``e_i = (i, alpha_i, m_i)``; ``finding`` is None while pending."""

    index: int
    action: str
    finding: str | None
    observation: str
    text: str
    invalid: bool = False


@dataclass
class _MemoryState:
    ctx: MessageContext
    task_messages: list[dict[str, str]]
    records: dict[int, Record] = field(default_factory=dict)
    pending: int | None = None
    params: SamplingParams | None = None
    reconstructions: int = 0
    rolled_back: int = 0
    dropped: int = 0


def _quote(text: str) -> str:
    return collapse(text, 100_000).replace('"', "'")


@dataclass(frozen=True)
class MemoryParams:
    """``rollout.context_params`` of the ``memory`` context manager (ECHO; module docstring)."""

    #: ``S``: turns the selection may keep (the first ``S`` valid indices; >= 0).
    max_selected: int = 8
    #: ``K``: the latest turns always kept, merged with the selected ones (>= 1).
    keep_latest: int = 3
    #: Reconstructions (new segments) allowed per rollout (5: six segments); needing another ends the
    #: rollout as overlong.
    max_reconstructions: int = 5
    #: Token limit of one selection generation (>= 1).
    selection_tokens: int = 64
    #: Longest selection prompt + selection, in tokens (None: twice ``rollout.context_budget``; >= 2).
    selection_budget: int | None = None
    #: Characters kept of a finding (the text that completes a turn record; >= 1).
    finding_chars: int = 300
    #: Characters kept of an action summary in a record (>= 1).
    action_chars: int = 120
    #: ``learned`` (the policy selects the turns) or ``semantic`` (an embedding ranking, an ablation).
    retrieval: str = "learned"
    #: ``findings`` (kept records show their findings) or ``full`` (their raw observations, an ablation).
    observations: str = "findings"
    #: Text embedder of ``retrieval="semantic"`` (None: the built-in one); not settable from YAML.
    embed_fn: Callable[[list[str]], np.ndarray] | None = None
    #: Keep the finding of a turn whose step overran the budget (true) or drop it.
    keep_overflow_finding: bool = True


@register_context("memory")
class MemoryContext(MessageManager):
    """ECHO turn memory (see the module docstring for the protocol and the parameters)."""

    needs_rollback = True
    params_cls = MemoryParams

    def __init__(self, limits: LoopLimits, params: MemoryParams | None = None) -> None:
        super().__init__(limits)
        p = params if params is not None else MemoryParams()
        max_selected, keep_latest, max_reconstructions = p.max_selected, p.keep_latest, p.max_reconstructions
        selection_tokens, selection_budget = p.selection_tokens, p.selection_budget
        finding_chars, action_chars = p.finding_chars, p.action_chars
        retrieval, observations, embed_fn = p.retrieval, p.observations, p.embed_fn
        keep_overflow_finding = p.keep_overflow_finding
        if not isinstance(keep_overflow_finding, bool):
            raise ValueError(
                f"memory context: keep_overflow_finding must be true or false, got {keep_overflow_finding!r}"
            )
        self.keep_overflow_finding = keep_overflow_finding
        ints = {
            "max_selected": (max_selected, 0),
            "keep_latest": (keep_latest, 1),
            "max_reconstructions": (max_reconstructions, 0),
            "selection_tokens": (selection_tokens, 1),
            "finding_chars": (finding_chars, 1),
            "action_chars": (action_chars, 1),
        }
        for name, (value, lo) in ints.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ValueError(f"memory context: {name} must be an integer >= {lo}, got {value!r}")
        if retrieval not in RETRIEVALS:
            raise ValueError(f"memory context: retrieval must be one of {RETRIEVALS}, got {retrieval!r}")
        if observations not in OBSERVATIONS:
            raise ValueError(
                f"memory context: observations must be one of {OBSERVATIONS}, got {observations!r}"
            )
        if selection_budget is not None and (not isinstance(selection_budget, int) or selection_budget < 2):
            raise ValueError(
                f"memory context: selection_budget must be an integer >= 2, got {selection_budget!r}"
            )
        self.max_selected, self.keep_latest = max_selected, keep_latest
        self.max_reconstructions, self.selection_tokens = max_reconstructions, selection_tokens
        self.selection_budget = selection_budget or 2 * limits.context_budget
        self.finding_chars, self.action_chars = finding_chars, action_chars
        self.retrieval, self.observations, self.embed_fn = retrieval, observations, embed_fn

    # -- hooks -------------------------------------------------------------------------------------

    def start(self, ep: Episode) -> None:
        ctx = MessageContext(ep.renderer, ep.tools, list(ep.messages))
        ep.state[STATE_KEY] = _MemoryState(ctx=ctx, task_messages=list(ep.messages))
        ep.state["expert"] = lambda rng, noise: expert_turn(ep, rng, noise)
        ep.context = ctx.ids()
        self._metrics(ep)

    def prompt(self, ep: Episode) -> list[int]:
        return ep.context

    def _take_finding(self, ep: Episode, turn: Turn, gen: Generation, *, action: bool):
        """Span the message and let its finding complete the previous record (Alg. 1 l. 7-12).

        Returns ``(index of the record this turn would open, the located finding or None)``."""
        st: _MemoryState = ep.state[STATE_KEY]
        found = locate_finding(gen.text, self.finding_chars) if st.pending is not None else None
        index = len(st.records)
        turn.spans = self._spans(ep, turn, gen.text, found, st.pending, action, index)
        if st.pending is not None:
            st.records[st.pending].finding = found[2] if found else ""
            st.pending = None
        return index, found

    def finalize(self, ep: Episode, turn: Turn, gen: Generation, result: StepResult) -> None:
        self._take_finding(ep, turn, gen, action=False)
        super().finalize(ep, turn, gen, result)
        self._metrics(ep)

    def commit(
        self, ep: Episode, turn: Turn, gen: Generation, result: StepResult, snapshot: Any
    ) -> SubProgram:
        st: _MemoryState = ep.state[STATE_KEY]
        index, found = self._take_finding(ep, turn, gen, action=True)
        hint = {"role": "user", "content": HINT}
        new = st.ctx.after(turn.prompt_ids, turn.response_ids, [*obs_messages(result), hint])
        ids = new.ids()
        if len(ids) + st.params.max_new_tokens > self.limits.context_budget:
            if snapshot is None:
                raise RuntimeError(
                    f"memory context: turn {index} overflowed but the loop passed no environment snapshot"
                )
            ep.env.restore(snapshot)  # roll the overflow turn's action back: it opens no record
            ep.agent_turns -= 1
            st.rolled_back += 1
            ep.segment.info["rolled_back"] = ep.segment.info.get("rolled_back", 0) + 1
            if self.keep_overflow_finding and found is not None:
                # Alg. 1 keeps the overflow turn trainable: its finding completes the previous record,
                # which the latest-K rule keeps in the final context. Its action was undone, so its
                # action tokens carry no source (never credited by the provenance mask).
                turn.spans = [
                    Span(s.label, s.start, s.end, None) if s.label == "action" else s for s in turn.spans
                ]
                turn.tool_calls, turn.observation = 0, None
                turn.info["rolled_back"] = True
                ep.segment.turns.append(turn)
            yield from self._reconstruct(ep, st)
            self._metrics(ep)
            return
        action = render_action(gen.text, found, self.action_chars)
        st.records[index] = Record(index, action, None, result.observation, gen.text, bool(result.invalid))
        st.pending = index
        turn.info["source_turn"] = index
        ep.segment.turns.append(turn)
        st.ctx, ep.context = new, ids
        self._metrics(ep)

    # -- spans -------------------------------------------------------------------------------------

    @staticmethod
    def _spans(
        ep: Episode, turn: Turn, text: str, found, pending: int | None, tool_use: bool, index: int
    ) -> list[Span]:
        """Finding span (source = the pending record) and action/answer spans over the other tokens."""
        n = turn.num_response_tokens
        label, source = ("action", index) if tool_use else ("answer", None)
        if n == 0:
            return []
        if found is None:
            return [Span(label, 0, n, source)]
        tok, ids = ep.renderer.tokenizer, turn.response_ids
        a = token_boundary(tok, ids, found[0], cover=False)
        b = max(a, token_boundary(tok, ids, found[1], cover=True))
        spans = [Span(label, 0, a, source)] if a > 0 else []
        if b > a:
            spans.append(Span("finding", a, b, pending))
        if b < n:
            spans.append(Span(label, b, n, source))
        return spans

    # -- reconstruction ----------------------------------------------------------------------------

    def record_line(self, rec: Record) -> str:
        """``turn_i: action="..." | finding="..."`` (``observation="..."`` with ``observations="full"``)."""
        if self.observations == "full":
            return (
                f'turn_{rec.index}: action="{_quote(rec.action)}" | observation="{_quote(rec.observation)}"'
            )
        return f'turn_{rec.index}: action="{_quote(rec.action)}" | finding="{_quote(rec.finding or "")}"'

    def rebuild(self, ep: Episode, st: _MemoryState, kept: Sequence[int]) -> MessageContext:
        """``x ⊕ [user: render(M[I]) ⊕ x_cont]`` (Eq. 11-12), ``kept`` = ``I``."""
        lines = [self.record_line(st.records[i]) for i in sorted(kept)]
        memory = [MEMORY_HEADER + "\n" + "\n".join(lines)] if lines else []
        user = {"role": "user", "content": "\n\n".join([*memory, CONTINUATION])}
        return MessageContext(ep.renderer, ep.tools, [*st.task_messages, user])

    def _reconstruct(self, ep: Episode, st: _MemoryState) -> SubProgram:
        if st.reconstructions >= self.max_reconstructions:
            end_overlong(ep, f"more than max_reconstructions={self.max_reconstructions} needed")
            return
        if not st.records:
            end_overlong(ep, "the first turn overflowed: no memory to rebuild from")
            return
        completed = sorted(st.records)
        parent = ep.segment_index
        where = ep.segment
        entries: list[int | str] = []
        if self.retrieval == "semantic":
            entries = self._semantic(ep, st, completed)
        else:
            listing = "\n".join(self.record_line(st.records[i]) for i in completed)
            ask = {
                "role": "user",
                "content": f"{SELECTION_HEADER}\n{listing}\n{SELECTION_INSTRUCTION}",
            }
            prompt = st.ctx.ids([ask])
            if len(prompt) + self.selection_tokens > self.selection_budget:
                end_overlong(ep, f"selection prompt of {len(prompt)} tokens exceeds {self.selection_budget}")
                return
            where = ep.new_segment("selection", parent=parent, fork_index=st.reconstructions)
            ep.state["phase"] = "selection"
            gen = yield Generate(
                prompt,
                replace(st.params, max_new_tokens=self.selection_tokens),
                expert=lambda rng, noise: expert_selection(ep),
            )
            n = len(gen.ids)
            where.turns.append(generation_turn(prompt, gen, [Span("selection", 0, n)] if n else []))
            entries = parse_selection(gen.text)
        st.reconstructions += 1
        reserve = st.params.max_new_tokens
        rep = repair_selection(
            entries,
            sorted(st.records),
            max_selected=self.max_selected,
            keep_latest=self.keep_latest,
            cost=lambda kept: len(self.rebuild(ep, st, kept).ids()) + reserve,
            budget=self.limits.context_budget,
        )
        st.dropped += sum(rep.counts().values())
        where.info["repair"] = rep.counts()
        where.info["records"] = len(completed)  # records in memory when it was rebuilt
        if not rep.fits:
            end_overlong(ep, f"rebuilt context of {rep.cost} tokens (with generation) is over budget", where)
            return
        ctx = self.rebuild(ep, st, rep.kept)
        info = {"selected": list(rep.selected), "kept_latest": list(rep.kept_latest)}
        seg = ep.new_segment("normal", parent=parent, fork_index=st.reconstructions - 1, info=info)
        ep.segment, st.ctx, ep.context = seg, ctx, ctx.ids()

    def _semantic(self, ep: Episode, st: _MemoryState, completed: list[int]) -> list[int]:
        """Top-``S`` completed records by similarity of their text to the task + latest turn."""
        if self.max_selected == 0:
            return []
        full = self.observations == "full"
        texts = [st.records[i].observation if full else st.records[i].finding or "" for i in completed]
        latest = st.records[completed[-1]]
        fn = self.embed_fn
        if fn is None:
            from horizonrl.envs.builtin.search.embed import embed as fn
        vecs = np.asarray(fn([f"{ep.task.prompt} {latest.action} {latest.observation}", *texts]))
        if vecs.ndim != 2 or vecs.shape[0] != len(texts) + 1:
            raise ValueError(
                f"memory context: embed_fn returned shape {vecs.shape} for {len(texts) + 1} texts"
            )
        return semantic_topk(vecs[0], vecs[1:], completed, self.max_selected)

    def _metrics(self, ep: Episode) -> None:
        st: _MemoryState = ep.state[STATE_KEY]
        m = base_metrics(ep, st.reconstructions)
        m.update({"rolled_back": float(st.rolled_back), "repair_dropped": float(st.dropped)})
        ep.rollout.env["metrics"] = m


# ------------------------------------------------------------------------------------- expert


def _relevant(ep: Episode, rec: Record) -> bool:
    """Expert selection: a valid turn that looked up an entity of the answer chain (lookup-style envs
    keep ``state["chain"]``), else any valid turn with a finding."""
    if rec.invalid:
        return False
    chain = (getattr(ep.env, "state", None) or {}).get("chain")
    if chain:
        names = {str(c).lower() for c in chain}
        return any(a.strip().lower() in names for a in tool_call_args(rec.text))
    return bool(rec.finding)


def expert_selection(ep: Episode) -> str:
    """The scripted expert's selection: one ``turn_i: evidence`` line per relevant record."""
    st: _MemoryState = ep.state[STATE_KEY]
    keep = [i for i in sorted(st.records) if _relevant(ep, st.records[i])]
    return SEL_OPEN + "\n" + "".join(f"turn_{i}: evidence\n" for i in keep) + SEL_CLOSE


def expert_turn(ep: Episode, rng: random.Random, noise: float) -> str:
    """The scripted expert's turn: the finding of the pending record (:func:`expert_finding`), then the
    environment's expert action (``ep.state["expert"]``, used by the loop's ``Generate.expert``)."""
    st: _MemoryState = ep.state[STATE_KEY]
    prefix = ""
    if st.pending is not None:
        rec = st.records[st.pending]
        prefix = f"{SUM_OPEN}{expert_finding(rec.text, rec.observation)}{SUM_CLOSE}"
    return prefix + ep.env.expert_action(rng, noise)
