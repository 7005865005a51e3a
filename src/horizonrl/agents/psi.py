"""RTPO conditioning maps ``psi`` as context managers (paper §3.1, App. E.2/E.4; docs/spec/rtpo.md).

A ``K``-turn episode has boundary states ``S_k`` (the raw history before turn
``k``); the model is conditioned on ``c_k = psi(S_k)``. Each manager below
keeps the raw history of the episode (one record per committed turn in
``ep.state["psi_turns"]``: the response ids and text, the observation and its
role, the rendered observation ids) and rebuilds ``ep.context = c_k`` from it
after every turn. The agent loop records ``c_k`` verbatim as ``Turn.prompt_ids``,
so whatever ``psi`` produced is the exact context the turn is trained on.

Registered maps (``rollout.context`` / ``rollout.context_params``):

- ``identity`` — ``c_k = S_k``: the append-only context, token-for-token the same
  as the ``append`` manager (it additionally records each observation's role,
  which :func:`flat_prompts` needs with the separate messages the loop keeps in
  ``Turn.info["obs_messages"]``).
- ``window`` (``n``) — the system + task prompt followed by the last ``n`` turns
  (``n = 0``: the task alone); with ``n >= k`` it equals ``identity``.
- ``strip_think`` (``keep_last``) — the chat history with every ``<think>...</think>``
  block of earlier assistant turns removed (Qwen3's template, paper App. E.4); the
  last ``keep_last`` turns keep theirs. Turns without a think block keep their
  sampled ids, so without thinking it equals ``identity``.
- ``turn_summary`` (``summarizer``, ``obs_chars``, ``summary_max_tokens``) — every
  round's output is summarized, and the next round sees only the task and the
  list of summaries (never the raw history)::

      c_k = render(system, user(task + "\\n\\nProgress so far:\\n1. s_0\\n...k. s_{k-1}"))

  ``summarizer: extract`` (default) is a *deterministic extractive* summary
  ``s_i = "<tool>(<args>) -> <first obs_chars characters of the observation>"``
  (:func:`extract_summary`). ``summarizer: policy`` has the policy write ``s_i``:
  one extra generation per non-final turn, prompted with the step and its result
  (:data:`SUMMARY_SYSTEM`), recorded as a ``summary`` segment (``parent`` = the
  agent's segment, ``fork_index`` = the summarized turn); the extractive summary
  is its scripted expert, so an expert warm start teaches the format.

:func:`flat_prompts` rebuilds the concatenated full history ``S_k`` of every
turn from the recorded turns: what flattened training conditions on (RTPO's
``flat`` ablation and the SeeUPO baseline).

Boundary states (RTPO Alg. 1 line 4): :class:`BoundaryRecorder` wraps any of
these managers and, before every agent turn ``k``, records a :class:`Boundary`
(``c_k``, ``snap_k``, the manager's state); :func:`resume_episode` starts a
sibling from it, so it continues exactly where the trunk stood.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from horizonrl import textparse
from horizonrl.agents.context import (
    ContextManager,
    Episode,
    SubProgram,
    observation_ids,
    register_context,
)
from horizonrl.agents.driver import Generate
from horizonrl.agents.renderer import Renderer
from horizonrl.envs.core.base import Env, StepResult, Task
from horizonrl.envs.core.tools import ToolCall, parse_tool_calls
from horizonrl.inference.base import Generation, SamplingParams
from horizonrl.trajectory import Branch, Rollout, Segment, Turn

SUMMARY_SYSTEM = (
    "Summarize one step of an agent in one line: the action it took and the result it got. "
    "Keep every number and name."
)
PROGRESS_HEADER = "Progress so far:"


def strip_think(text: str) -> str:
    """``text`` without ``<think>...</think>`` blocks (an unterminated one runs to the end), stripped."""
    return textparse.strip_think(textparse.cap_text(text)).strip()


def extract_summary(text: str, observation: str | None, tools: Sequence[Any], *, obs_chars: int = 200) -> str:
    """Deterministic one-line summary of a turn: its valid tool calls and the start of the result.

    ``"calculator(17 + 5) -> 22"``; a turn without a valid call gives
    ``"no valid tool call -> <result>"``. Whitespace in the observation is
    collapsed and it is cut to ``obs_chars`` characters.
    """
    calls = [c for c in parse_tool_calls(strip_think(text), tools) if isinstance(c, ToolCall)]
    acts = [f"{c.name}({', '.join(str(v) for v in c.arguments.values())})" for c in calls]
    result = " ".join((observation or "").split())[:obs_chars]
    return f"{'; '.join(acts) or 'no valid tool call'} -> {result}"


def _check_int(name: str, value: Any, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"{name}={value!r}: must be an integer >= {lo}")
    return value


@register_context("identity")
class PsiContext(ContextManager):
    """Base of the conditioning maps; by itself the identity map ``c_k = S_k``.

    Subclasses override :meth:`build` (``c_k`` from the task prompt and the
    turn records) and optionally :meth:`summarize` (a sub-program run on each
    committed turn before the context is rebuilt).
    """

    def start(self, ep: Episode) -> None:
        super().start(ep)
        ep.state["psi_base"] = list(ep.context)
        ep.state["psi_turns"] = []

    def before_turn(self, ep: Episode, params: SamplingParams) -> SubProgram:
        ep.state["psi_params"] = params
        return (yield from super().before_turn(ep, params))

    def commit(
        self, ep: Episode, turn: Turn, gen: Generation, result: StepResult, snapshot: Any
    ) -> SubProgram:
        ep.segment.turns.append(turn)
        turn.info["obs_role"] = result.role
        record = {
            "ids": list(turn.response_ids),
            "text": turn.response_text,
            "role": result.role,
            "obs": result.observation,
            "cont": observation_ids(ep, turn, result),
        }
        yield from self.summarize(ep, record)
        ep.state["psi_turns"].append(record)
        ep.context = self.build(ep, ep.state["psi_base"], ep.state["psi_turns"])

    def summarize(self, ep: Episode, record: dict[str, Any]) -> SubProgram:
        """Add derived fields to ``record`` (may generate); the identity map adds nothing."""
        yield from ()

    def build(self, ep: Episode, base: list[int], turns: list[dict[str, Any]]) -> list[int]:
        """``c_k``: ``base`` (system + task prompt ids) followed by every turn's response + observation."""
        return base + [t for rec in turns for t in rec["ids"] + rec["cont"]]


@dataclass(frozen=True)
class WindowParams:
    """``rollout.context_params`` of the ``window`` conditioning map."""

    #: Earlier turns kept (``n = 0``: the task only; >= 0).
    n: int = 2


@register_context("window")
class WindowContext(PsiContext):
    """Truncation to the last ``n`` turns: ``c_k = prompt + blocks[k-n:k]`` (``n = 0``: the task only)."""

    params_cls = WindowParams

    def __init__(self, limits, params: WindowParams | None = None) -> None:
        super().__init__(limits)
        n = (params if params is not None else WindowParams()).n
        self.n = _check_int("window.n", n, 0)

    def build(self, ep: Episode, base: list[int], turns: list[dict[str, Any]]) -> list[int]:
        kept = turns[len(turns) - self.n :] if self.n else []
        return super().build(ep, base, kept)


@dataclass(frozen=True)
class StripThinkParams:
    """``rollout.context_params`` of the ``strip_think`` conditioning map."""

    #: The last turns that keep their ``<think>`` blocks (and sampled ids; >= 0).
    keep_last: int = 0


@register_context("strip_think")
class StripThinkContext(PsiContext):
    """Chat history with the ``<think>`` blocks of earlier turns removed (Qwen3 template, App. E.4).

    A stripped turn is re-encoded from its text (plus the end-of-turn token when
    the sampled response had one); the last ``keep_last`` turns and turns with no
    think block keep their sampled ids.
    """

    params_cls = StripThinkParams

    def __init__(self, limits, params: StripThinkParams | None = None) -> None:
        super().__init__(limits)
        keep_last = (params if params is not None else StripThinkParams()).keep_last
        self.keep_last = _check_int("strip_think.keep_last", keep_last, 0)

    def build(self, ep: Episode, base: list[int], turns: list[dict[str, Any]]) -> list[int]:
        out = list(base)
        cut = len(turns) - self.keep_last
        eos = ep.renderer.eos_id
        for i, rec in enumerate(turns):
            ids = rec["ids"]
            if i < cut and "<think>" in rec["text"]:
                ended = bool(ids) and ids[-1] == eos
                ids = ep.renderer.tokenizer.encode(strip_think(rec["text"]), add_special_tokens=False)
                ids = [*ids, eos] if ended else list(ids)
            out += list(ids) + rec["cont"]
        return out


@dataclass(frozen=True)
class TurnSummaryParams:
    """``rollout.context_params`` of the ``turn_summary`` conditioning map."""

    #: ``extract`` (deterministic, :func:`extract_summary`) or ``policy`` (the policy writes each line).
    summarizer: str = "extract"
    #: Characters of the observation text kept by the extractive summary and shown to the policy (>= 1).
    obs_chars: int = 200
    #: Token limit of one policy-written summary line (>= 1).
    summary_max_tokens: int = 48


@register_context("turn_summary")
class TurnSummaryContext(PsiContext):
    """Per-turn summaries: the next round sees the task and one summary line per earlier round.

    ``summarizer``: ``extract`` (deterministic, :func:`extract_summary`) or
    ``policy`` (the policy writes each line; ``summary_max_tokens`` tokens at the
    turn's sampling temperature). ``obs_chars`` bounds the observation text kept
    by the extractive summary (and shown to the policy summarizer).
    """

    params_cls = TurnSummaryParams

    def __init__(self, limits, params: TurnSummaryParams | None = None) -> None:
        super().__init__(limits)
        p = params if params is not None else TurnSummaryParams()
        summarizer, obs_chars, summary_max_tokens = p.summarizer, p.obs_chars, p.summary_max_tokens
        if summarizer not in ("extract", "policy"):
            raise ValueError(f"turn_summary.summarizer={summarizer!r}: must be 'extract' or 'policy'")
        self.summarizer = summarizer
        self.obs_chars = _check_int("turn_summary.obs_chars", obs_chars, 1)
        self.summary_max_tokens = _check_int("turn_summary.summary_max_tokens", summary_max_tokens, 1)

    def summarize(self, ep: Episode, record: dict[str, Any]) -> SubProgram:
        line = extract_summary(record["text"], record["obs"], ep.env.tools, obs_chars=self.obs_chars)
        if self.summarizer == "policy":
            index = len(ep.state["psi_turns"])
            result = " ".join((record["obs"] or "").split())[: self.obs_chars]
            user = (
                f"Task: {ep.messages[-1]['content']}\nStep: {strip_think(record['text'])}\nResult: {result}"
            )
            prompt = list(
                ep.renderer.initial_ids(
                    [{"role": "system", "content": SUMMARY_SYSTEM}, {"role": "user", "content": user}]
                )
            )
            params = replace(ep.state["psi_params"], max_new_tokens=self.summary_max_tokens)
            gen = yield Generate(prompt, params, expert=lambda rng, noise, text=line: text)
            seg = ep.new_segment("summary", parent=ep.segment_index, fork_index=index)
            seg.turns.append(
                Turn(
                    prompt_ids=prompt,
                    response_ids=list(gen.ids),
                    logprobs=list(gen.logprobs),
                    response_text=gen.text,
                    truncated=gen.finish_reason == "length",
                )
            )
            line = " ".join(strip_think(gen.text).split()) or "(empty summary)"
        record["summary"] = line

    def build(self, ep: Episode, base: list[int], turns: list[dict[str, Any]]) -> list[int]:
        if not turns:
            return list(base)
        notes = "\n".join(f"{i + 1}. {rec['summary']}" for i, rec in enumerate(turns))
        user = {"role": "user", "content": f"{ep.messages[-1]['content']}\n\n{PROGRESS_HEADER}\n{notes}"}
        return list(ep.renderer.initial_ids([*ep.messages[:-1], user], tools=ep.tools))


def _extends(prefix: Sequence[int], full: Sequence[int]) -> bool:
    return len(full) >= len(prefix) and list(full[: len(prefix)]) == list(prefix)


def flat_prompts(
    turns: Sequence[Turn], renderer: Renderer, *, start: Sequence[int] | None = None
) -> list[list[int]]:
    """The concatenated full history ``S_k`` each of ``turns`` would have seen under ``identity``.

    ``turns`` are consecutive agent turns of one session; ``start`` is the flat
    context of the first (default: its own prompt, which every map leaves
    untouched at turn 0). ``S_{k+1} = S_k + response_k + end_of_turn(response_k)
    + render(observation_k with its recorded role)``. Sessions whose prompts already
    extend each other token-for-token (``append``/``identity``) are returned as recorded.
    """
    if not turns:
        return []
    first = list(turns[0].prompt_ids if start is None else start)
    prompts = [list(t.prompt_ids) for t in turns]
    if prompts[0] == first and all(
        _extends(a.prompt_ids + a.response_ids, b.prompt_ids) for a, b in itertools.pairwise(turns)
    ):
        return prompts
    out = [first]
    for prev in turns[:-1]:
        obs = prev.info.get("obs_messages") or [
            {"role": prev.info.get("obs_role", "tool"), "content": prev.observation or ""}
        ]
        out.append(
            out[-1]
            + list(prev.response_ids)
            + list(renderer.end_of_turn_ids(prev.response_ids))
            + list(renderer.continuation_ids(obs))
        )
    return out


def flat_view(rollout: Rollout, renderer: Renderer) -> Rollout:
    """A copy of ``rollout`` whose agent session's turns carry their flat history ``S_k`` as prompt.

    What flattened-history training (GRPO in the RTPO paper, Eq. 1-2) conditions on;
    the turns' sampled ids and rollout log-probs are unchanged, so the rows of the
    copy train each response under ``S_k`` with ``pi_old`` as recorded under ``c_k``.
    Other sessions (policy-written summaries) keep their own prompts.
    """
    if not rollout.segments:
        return rollout
    agent = rollout.segments[0]
    flats = flat_prompts(agent.turns, renderer)
    turns = [dataclasses.replace(t, prompt_ids=f) for t, f in zip(agent.turns, flats, strict=True)]
    return dataclasses.replace(
        rollout, segments=[dataclasses.replace(agent, turns=turns), *rollout.segments[1:]]
    )


# ---------------------------------------------------------------- boundary states S_k


@dataclass
class Boundary:
    """Turn boundary ``S_k`` of a trunk: everything a sibling needs to start from it."""

    trunk: str
    task_index: int
    turn: int
    context: list[int]
    env_state: Any
    messages: list[dict[str, Any]]
    tools: list[dict] | None
    state: dict[str, Any]
    final_attempt: bool = False
    flat: list[int] = field(default_factory=list)  # S_k (concatenated full history), filled after the trunk


class BoundaryRecorder(ContextManager):
    """Wraps a context manager: records a :class:`Boundary` before every agent turn.

    ``resume=True`` skips ``start`` (the episode already holds a restored context).
    """

    def __init__(
        self,
        inner: ContextManager,
        boundaries: list[Boundary] | None,
        *,
        task_index: int = 0,
        resume: bool = False,
    ) -> None:
        super().__init__(inner.limits)
        self.inner, self.boundaries, self.task_index, self.resume = inner, boundaries, task_index, resume
        self.needs_rollback = inner.needs_rollback

    def start(self, ep: Episode) -> None:
        if not self.resume:
            self.inner.start(ep)

    def prompt(self, ep: Episode) -> list[int]:
        return self.inner.prompt(ep)

    def before_turn(self, ep, params):
        params = yield from self.inner.before_turn(ep, params)
        if params is not None and not ep.done and self.boundaries is not None:
            self.boundaries.append(
                Boundary(
                    trunk=ep.rollout.uid,
                    task_index=self.task_index,
                    turn=ep.agent_turns,
                    context=list(self.inner.prompt(ep)),
                    env_state=ep.env.snapshot(),
                    messages=copy.deepcopy(ep.messages),
                    tools=copy.deepcopy(ep.tools),
                    state=copy.deepcopy(ep.state),
                    final_attempt=ep.final_attempt,
                )
            )
        return params

    def commit(self, ep, turn, gen, result, snapshot):
        yield from self.inner.commit(ep, turn, gen, result, snapshot)


def resume_episode(b: Boundary, env: Env, task: Task, renderer: Renderer, *, uid: str) -> Episode:
    """An episode that continues from boundary ``b``: ``env`` restored from ``snap_k``, context ``c_k``.

    The new rollout holds the turns from ``k`` on (``branch = (trunk, k)``); run it
    with a :class:`BoundaryRecorder` built with ``resume=True``.
    """
    env.restore(b.env_state)
    rollout = Rollout(uid=uid, task_id=task.id, group_id=b.trunk, segments=[Segment(kind="normal")])
    rollout.env = {"name": env.name}
    rollout.branch = Branch(trunk_id=b.trunk, turn=b.turn)
    return Episode(
        env=env,
        task=task,
        rollout=rollout,
        renderer=renderer,
        segment=rollout.segments[0],
        messages=copy.deepcopy(b.messages),
        tools=copy.deepcopy(b.tools),
        context=list(b.context),
        agent_turns=b.turn,
        final_attempt=b.final_attempt,
        state=copy.deepcopy(b.state),
    )


__all__ = [
    "PROGRESS_HEADER",
    "SUMMARY_SYSTEM",
    "Boundary",
    "BoundaryRecorder",
    "PsiContext",
    "StripThinkContext",
    "StripThinkParams",
    "TurnSummaryContext",
    "TurnSummaryParams",
    "WindowContext",
    "WindowParams",
    "extract_summary",
    "flat_prompts",
    "resume_episode",
    "strip_think",
]
