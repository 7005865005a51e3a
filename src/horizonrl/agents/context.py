"""Context managers: the ``(M, Phi)`` view of an agent's working context.

A context manager owns how the history of an episode is kept (``M``: the
managed state) and how the next prompt is reconstructed from it (``Phi``: a
bounded reconstruction). The agent loop (:mod:`horizonrl.agents.react`) is the
same for all of them; it asks the manager

- :meth:`ContextManager.start` — build the first context of the episode;
- :meth:`ContextManager.before_turn` — make room for the next generation (may
  run extra generations: a compaction session, a selection turn) and return
  the sampling parameters of the turn, or ``None`` to end the rollout;
- :meth:`ContextManager.prompt` — the exact token ids the next turn sees;
- :meth:`ContextManager.commit` — record a finished turn and its observation
  (may discard it and reconstruct instead);
- :meth:`ContextManager.finalize` — record the turn that ended the episode.

``before_turn`` and ``commit`` are sub-programs (generators, see
:mod:`horizonrl.agents.driver`): they ``yield`` generation requests and are
called with ``yield from``. Whatever a manager puts in ``prompt`` is recorded
verbatim as ``Turn.prompt_ids``, so every token is trained under the exact
context it was sampled from.

Managers are registered by name (``rollout.context`` in configs)::

    @register_context("append")
    class AppendContext(ContextManager): ...

The built-in ``append`` manager keeps one append-only context per episode and,
when the next generation would overrun ``context_budget``, either shortens it to
fit (``overflow: truncate``) or ends the rollout (``overflow: fail``).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Generator
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any, ClassVar, TypeVar

from horizonrl.agents.renderer import Renderer
from horizonrl.envs.core.base import Env, StepResult, Task
from horizonrl.inference.base import Generation, SamplingParams
from horizonrl.registry import Registry
from horizonrl.trajectory import Rollout, Segment, Turn
from horizonrl.vocab import Overflow, Termination


@dataclass(frozen=True)
class LoopLimits:
    """Limits of one rollout (see ``RolloutConfig`` for the help of each field)."""

    max_turns: int = 6
    context_budget: int = 1024
    overflow: str = Overflow.TRUNCATE.value  # an Overflow: truncate | fail

    def __post_init__(self) -> None:
        if self.overflow not in tuple(Overflow):
            allowed = " or ".join(repr(m.value) for m in Overflow)
            raise ValueError(f"LoopLimits.overflow={self.overflow!r}: must be {allowed}")
        if self.max_turns < 1:
            raise ValueError(f"LoopLimits.max_turns={self.max_turns!r}: must be >= 1")


@dataclass
class Episode:
    """One rollout (or one subagent) in progress.

    ``segment`` is the session the next turn is recorded in; ``context`` the token
    ids of the current working context; ``agent_turns`` counts the agent's own
    turns (not compaction or selection generations) against ``max_turns``;
    ``final_attempt`` is set when the next generation is the last one allowed
    (forced answer); ``state`` is scratch space of the context manager.
    """

    env: Env
    task: Task
    rollout: Rollout
    renderer: Renderer
    segment: Segment
    messages: list[dict[str, str]] = field(default_factory=list)
    tools: list[dict] | None = None
    context: list[int] = field(default_factory=list)
    done: bool = False
    agent_turns: int = 0
    final_attempt: bool = False
    is_child: bool = False
    result: Any = None
    state: dict[str, Any] = field(default_factory=dict)

    def new_segment(self, kind: str, **kw: Any) -> Segment:
        """Append a new session to the rollout and return it (does not make it current)."""
        seg = Segment(kind=kind, **kw)
        self.rollout.segments.append(seg)
        return seg

    @property
    def segment_index(self) -> int:
        return next(i for i, s in enumerate(self.rollout.segments) if s is self.segment)


SubProgram = Generator[Any, Any, Any]


def finish(ep: Episode, termination: str) -> None:
    """End the episode: set its termination and sum the turn rewards into the outcome.

    A trailing normal session that never got a turn (the turn limit was reached right
    after a compaction or reconstruction opened it) is not a session: it is removed,
    so it is neither counted in a rollout's session count nor trained.
    """
    ep.done = True
    if ep.is_child:
        return
    segs = ep.rollout.segments
    if len(segs) > 1 and segs[-1] is ep.segment and segs[-1].kind == "normal" and not segs[-1].turns:
        segs.pop()
        ep.segment = segs[-1]
    ep.rollout.termination = termination
    ep.rollout.reward = float(sum(t.reward for t in ep.rollout.turns))


def generation_turn(prompt, gen: Generation, spans=None) -> Turn:
    """A :class:`Turn` recording one generation exactly: prompt ids, sampled ids, log-probs, text."""
    return Turn(
        prompt_ids=list(prompt),
        response_ids=list(gen.ids),
        logprobs=list(gen.logprobs),
        response_text=gen.text,
        truncated=gen.finish_reason == "length",
        spans=list(spans or []),
        temperature=gen.meta.get("temperature"),
        info={k: copy.copy(gen.meta[k]) for k in _TURN_META if k in gen.meta},
    )


#: Generation meta kept on the turn: SFT label ids; prompt tokens the engine took from its prefix cache
#: (vLLM's prefix caching, the HF stream's prefix reuse; ``throughput/prefix_cache_hit_rate``).
_TURN_META = ("label_ids", "cached_tokens")


def observation_ids(ep: Episode, turn: Turn, result: StepResult) -> list[int]:
    """Tokens appended after a turn: end-of-turn if generation was cut, then the rendered reply.

    The reply is rendered as its separate messages (``StepResult.messages``: one per tool call
    answered), exactly as the chat template renders several tool/user messages in a row."""
    return list(ep.renderer.end_of_turn_ids(turn.response_ids)) + list(
        ep.renderer.continuation_ids(result.chat_messages())
    )


class ContextManager:
    """Base class: the append-only behaviour; subclasses override the hooks they change."""

    name: ClassVar[str] = "context"
    #: Whether the loop should snapshot the environment before each step so that
    #: :meth:`commit` can roll a discarded turn back (``env.restore``).
    needs_rollback: ClassVar[bool] = False
    #: The manager's parameters (``rollout.context_params``) as a frozen dataclass: its fields are the
    #: accepted keys, with their defaults, types and one docstring each; :func:`make_context` builds it
    #: from the mapping and passes it as ``cls(limits, params)``. None: the manager takes no parameters,
    #: or (a manager registered by a user) takes them as keywords of ``__init__(limits, **params)``.
    params_cls: ClassVar[type | None] = None

    def __init__(self, limits: LoopLimits) -> None:
        self.limits = limits

    # -- hooks ---------------------------------------------------------------

    def start(self, ep: Episode) -> None:
        ep.context = list(ep.renderer.initial_ids(ep.messages, tools=ep.tools))
        if ep.renderer.check_tokens:
            ep.state["transcript"] = [dict(m) for m in ep.messages]
            metrics = ep.rollout.env.setdefault("metrics", {})
            metrics["token_mismatch"] = metrics["token_mismatch_text"] = 0.0

    def prompt(self, ep: Episode) -> list[int]:
        return ep.context

    def before_turn(self, ep: Episode, params: SamplingParams) -> SubProgram:
        """Return the parameters of the next generation, or ``None`` after :func:`finish`."""
        room = self.limits.context_budget - len(self.prompt(ep))
        if room >= params.max_new_tokens:
            return params
        if self.limits.overflow == Overflow.FAIL or room < 1:
            finish(ep, Termination.CONTEXT)
            return None
        return replace(params, max_new_tokens=room)
        yield  # pragma: no cover - makes this a generator

    def finalize(self, ep: Episode, turn: Turn, gen: Generation, result: StepResult) -> None:
        """Record the turn that ended the episode (``result.done``) and finish the rollout."""
        turn.observation = result.observation or None
        ep.segment.turns.append(turn)
        ep.segment.info["terminal"] = True
        ep.rollout.success = bool(result.success)
        ep.rollout.final_answer = result.final_answer
        finish(ep, Termination.DONE)

    def commit(
        self, ep: Episode, turn: Turn, gen: Generation, result: StepResult, snapshot: Any
    ) -> SubProgram:
        """Record ``turn`` (already built from ``gen`` and ``result``) and extend the context."""
        ep.segment.turns.append(turn)
        if turn.truncated and len(ep.context) + len(turn.response_ids) >= self.limits.context_budget:
            finish(ep, Termination.CONTEXT)
            return
        extend_context(ep, turn, gen, result)
        yield from ()


def extend_context(ep: Episode, turn: Turn, gen: Generation, result: StepResult) -> None:
    """``ep.context`` + the turn's response + :func:`observation_ids`, then the family's history rule
    (``rollout.thinking_history: drop`` on Qwen3 removes earlier think blocks as its template does, so
    the next prompt no longer extends this one and starts a new training row) and, with
    ``rollout.check_tokens``, the comparison with a fresh rendering of the conversation."""
    r = ep.renderer
    eot = len(r.end_of_turn_ids(turn.response_ids))
    regions = ep.state.setdefault("assistant_regions", [])
    regions.append(r.assistant_region(ep.context, len(turn.response_ids) + eot))
    ctx = ep.context + list(turn.response_ids) + observation_ids(ep, turn, result)
    if r.drops_history:
        ctx, regions[:] = r.apply_history(ctx, regions, user_turn=result.has_user_message)
    ep.context = ctx
    transcript = ep.state.get("transcript")
    if transcript is not None:
        transcript.append({"role": "assistant", "content": gen.meta.get("raw_text", gen.text)})
        transcript.extend(result.chat_messages())  # the separate messages, as the template sees them
        if "token_mismatch" not in ep.rollout.env:
            miss = r.first_mismatch(ctx, transcript, ep.tools)
            if miss is not None:
                ep.rollout.env["token_mismatch"] = {"turn": ep.agent_turns, **miss}
                ep.rollout.env["metrics"]["token_mismatch"] = 1.0
                # a text difference (a template gap), not a non-canonical tokenization of the same text
                ep.rollout.env["metrics"]["token_mismatch_text"] = 0.0 if miss["same_text"] else 1.0


C = TypeVar("C", bound=type[ContextManager])

CONTEXTS: Registry[type[ContextManager]] = Registry(
    "context manager", register_with="@register_context(NAME) (horizonrl.agents)"
)


def register_context(name: str) -> Callable[[C], C]:
    """Class decorator registering a :class:`ContextManager` subclass under ``name`` (sets its ``name``)."""

    def deco(cls: C) -> C:
        if not (isinstance(cls, type) and issubclass(cls, ContextManager)):
            raise TypeError(f"register_context({name!r}) expects a ContextManager subclass, got {cls!r}")
        CONTEXTS.register(name, cls)
        cls.name = name
        return cls

    return deco


#: Names of the registered context managers, sorted.
list_contexts = CONTEXTS.names

#: The manager class registered as ``name`` (:class:`~horizonrl.registry.UnknownNameError`, a ValueError,
#: naming the known ones).
get_context = CONTEXTS.get


def context_params_declaration(cls: type[ContextManager]) -> Callable:
    """What declares the ``rollout.context_params`` of manager class ``cls``: its :attr:`~ContextManager.
    params_cls`, or for a manager without one its ``__init__`` (parameters after ``self, limits``)."""
    return cls.params_cls if cls.params_cls is not None else cls.__init__


def accepted_params(declaration: Callable, skip: tuple[str, ...] = ()) -> list[str]:
    """The parameter names a params ``declaration`` accepts, in order: a params dataclass's fields, or a
    function's keyword-capable parameters less ``skip`` (the inputs that are not the user's to set)."""
    if isinstance(declaration, type) and is_dataclass(declaration):
        return [f.name for f in fields(declaration)]
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    params = inspect.signature(declaration).parameters.values()
    return [p.name for p in params if p.kind in kinds and p.name not in skip]


def make_context(name: str, limits: LoopLimits, params: dict[str, Any] | None = None) -> ContextManager:
    """Instantiate the manager ``name``; unknown names or parameters raise ValueError naming them."""
    cls = get_context(name)
    params = dict(params or {})
    accepted = accepted_params(context_params_declaration(cls), skip=("self", "limits"))
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(f"context manager {name!r} got unknown parameter(s) {unknown}; accepted: {accepted}")
    if cls.params_cls is not None:
        return cls(limits, cls.params_cls(**params))
    return cls(limits, **params)


@register_context("append")
class AppendContext(ContextManager):
    """Append-only context (the default ReAct behaviour; see the module docstring)."""
