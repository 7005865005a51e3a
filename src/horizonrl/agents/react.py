"""The append-only ReAct loop, batched across episodes.

Each episode keeps one growing token context: the rendered system + user
messages, then for every turn the sampled response, the end-of-turn token if
generation was cut, and the rendered environment reply that opens the next
assistant turn. Consecutive turns therefore extend each other token-for-token
and merge into one training row (``horizonrl.trajectory.rows``).

All active episodes generate together in one engine call per turn, so a batch
of ``tasks x G`` rollouts costs ``max_turns`` batched generations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from horizonrl.envs.base import Env, Task
from horizonrl.inference.base import Engine, SamplingParams
from horizonrl.trajectory import Rollout, Segment, Turn


@dataclass(frozen=True)
class LoopLimits:
    """Limits of one rollout (see ``RolloutConfig`` for the help of each field)."""

    max_turns: int = 6
    context_budget: int = 1024
    overflow: str = "truncate"  # truncate | fail

    def __post_init__(self) -> None:
        if self.overflow not in ("truncate", "fail"):
            raise ValueError(f"LoopLimits.overflow={self.overflow!r}: must be 'truncate' or 'fail'")


@dataclass
class Episode:
    """One rollout in progress: its environment, context and recorded turns."""

    env: Env
    task: Task
    rollout: Rollout
    context: list[int] = field(default_factory=list)
    done: bool = False

    @property
    def segment(self) -> Segment:
        return self.rollout.segments[-1]


def system_message(env: Env) -> dict[str, str]:
    return {"role": "system", "content": env.system_prompt}


def start_episode(env: Env, task: Task, renderer, *, uid: str, group_id: str) -> Episode:
    first = env.reset(task)
    messages = [system_message(env), {"role": "user", "content": first}]
    tools = [t.to_schema() for t in env.tools] or None
    context = list(renderer.initial_ids(messages, tools=tools))
    rollout = Rollout(uid=uid, task_id=task.id, group_id=group_id, segments=[Segment(kind="normal")])
    rollout.env = {"name": env.name}
    return Episode(env=env, task=task, rollout=rollout, context=context)


def _finish(ep: Episode, termination: str) -> None:
    ep.done = True
    ep.rollout.termination = termination
    ep.rollout.reward = float(sum(t.reward for t in ep.rollout.turns))


def run_episodes(
    engine: Engine,
    renderer,
    episodes: Sequence[Episode],
    params: SamplingParams,
    limits: LoopLimits,
) -> list[Rollout]:
    """Run ``episodes`` to completion with batched generation; return their rollouts."""
    while True:
        active = [ep for ep in episodes if not ep.done]
        if not active:
            break
        batch: list[Episode] = []
        budgets: list[int] = []
        for ep in active:
            if ep.rollout.num_turns >= limits.max_turns:
                _finish(ep, "max_turns")
                continue
            room = limits.context_budget - len(ep.context)
            if room < params.max_new_tokens and (limits.overflow == "fail" or room < 1):
                _finish(ep, "context")
                continue
            batch.append(ep)
            budgets.append(min(room, params.max_new_tokens))
        if not batch:
            continue
        # Generations with a reduced budget (overflow == truncate) run in their own call.
        for budget in sorted(set(budgets), reverse=True):
            sub = [ep for ep, b in zip(batch, budgets, strict=True) if b == budget]
            p = params if budget == params.max_new_tokens else _with_budget(params, budget)
            gens = engine.generate([ep.context for ep in sub], p)
            for ep, gen in zip(sub, gens, strict=True):
                _apply(ep, gen, renderer, truncated_by_budget=budget < params.max_new_tokens)
    return [ep.rollout for ep in episodes]


def _with_budget(params: SamplingParams, budget: int) -> SamplingParams:
    return replace(params, max_new_tokens=budget)


def _apply(ep: Episode, gen, renderer, *, truncated_by_budget: bool) -> None:
    turn = Turn(
        prompt_ids=list(ep.context),
        response_ids=list(gen.ids),
        logprobs=list(gen.logprobs),
        response_text=gen.text,
        truncated=gen.finish_reason == "length",
    )
    ep.segment.turns.append(turn)
    result = ep.env.step(gen.text)
    turn.reward = float(result.reward)
    turn.obs_key = result.obs_key
    turn.invalid = result.invalid
    turn.tool_calls = result.tool_calls
    if result.done:
        turn.observation = result.observation or None
        ep.rollout.success = bool(result.success)
        ep.rollout.final_answer = result.final_answer
        _finish(ep, "done")
        return
    if turn.truncated and truncated_by_budget:
        _finish(ep, "context")
        return
    turn.observation = result.observation
    ep.context = (
        ep.context
        + list(gen.ids)
        + list(renderer.end_of_turn_ids(gen.ids))
        + list(renderer.continuation_ids([{"role": result.role, "content": result.observation}]))
    )
