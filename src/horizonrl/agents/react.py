"""The ReAct agent loop as a program, batched across episodes by the driver.

One episode alternates policy generations and environment steps. How the
working context is kept and rebuilt is the job of a context manager
(:mod:`horizonrl.agents.context`): the default ``append`` manager keeps one
growing token context (the rendered system + user messages, then for every turn
the sampled response, the end-of-turn token if generation was cut, and the
rendered environment reply that opens the next assistant turn), so consecutive
turns extend each other token-for-token and merge into one training row
(:mod:`horizonrl.trajectory.rows`).

A turn's text is handled by, in order: an optional *tool handler* (subagent
forking intercepts ``fork`` calls, :mod:`horizonrl.agents.fork`); for a child
(subagent) episode, a non-empty ``<answer>`` ends it with that result; otherwise
the environment's ``step``. All active episodes generate together, one engine
call per turn (:func:`horizonrl.agents.driver.drive`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from horizonrl.agents.context import (
    ContextManager,
    Episode,
    LoopLimits,
    SubProgram,
    finish,
    generation_turn,
    make_context,
)
from horizonrl.agents.driver import DriverOptions, Generate, Program, drive
from horizonrl.agents.renderer import Renderer
from horizonrl.envs.core.base import Env, StepResult, Task
from horizonrl.envs.core.common import finite_number
from horizonrl.envs.core.tools import parse_answer
from horizonrl.inference.base import Engine, Generation, SamplingParams
from horizonrl.trajectory import Rollout, Segment, Turn
from horizonrl.vocab import Termination

ToolHandler = Callable[[Episode, Generation], SubProgram]


def system_message(env: Env) -> dict[str, str]:
    return {"role": "system", "content": env.system_prompt}


def start_episode(
    env: Env,
    task: Task,
    renderer: Renderer,
    *,
    uid: str,
    group_id: str,
    system_prompt: str | None = None,
    extra_tools: Sequence[dict] = (),
    preamble: Sequence[dict] = (),
) -> Episode:
    """Reset ``env`` on ``task``; the episode's context starts as the rendered system + user messages,
    with ``preamble`` (earlier chat turns, e.g. few-shot examples) between them. The task's message is
    always ``ep.messages[-1]``."""
    first = env.reset(task)
    system = {"role": "system", "content": system_prompt if system_prompt is not None else env.system_prompt}
    tools = [t.to_schema() for t in env.tools] + list(extra_tools)
    rollout = Rollout(uid=uid, task_id=task.id, group_id=group_id, segments=[Segment(kind="normal")])
    rollout.env = {"name": env.name}
    messages = [system, *preamble, {"role": "user", "content": first}]
    return Episode(
        env=env,
        task=task,
        rollout=rollout,
        renderer=renderer,
        segment=rollout.segments[0],
        messages=messages,
        tools=tools or None,
        context=list(renderer.initial_ids(messages, tools=tools or None)),
    )


def make_turn(ep: Episode, prompt: list[int], gen: Generation) -> Turn:
    return generation_turn(prompt, gen)


def apply_result(turn: Turn, result: StepResult) -> None:
    turn.reward = float(result.reward)
    turn.obs_key = result.obs_key
    turn.invalid = result.invalid
    turn.tool_calls = result.tool_calls
    turn.observation = result.observation if not result.done else (result.observation or None)
    messages = result.chat_messages()
    if messages != [{"role": result.role, "content": result.observation}]:
        # several messages (or a tool name / call id): the joined text alone does not say how it rendered
        turn.info["obs_messages"] = messages
    if result.info.get("env_error"):
        turn.info["env_error"] = str(result.info["env_error"])
    if result.info.get("env_metrics"):  # an environment's own per-episode scores (e.g. a verifiers rubric)
        metrics = {str(k): finite_number(v) for k, v in result.info["env_metrics"].items()}
        turn.info["env_metrics"] = {k: v for k, v in metrics.items() if v is not None}  # numbers only


def episode_program(
    ep: Episode,
    manager: ContextManager,
    params: SamplingParams,
    *,
    tool_handler: ToolHandler | None = None,
) -> Program:
    """Run one episode to the end; returns the rollout (or the child's result for subagents)."""
    manager.start(ep)
    while not ep.done:
        if ep.agent_turns >= manager.limits.max_turns and not ep.final_attempt:
            _end_without_answer(ep, Termination.MAX_TURNS)
            break
        turn_params = yield from manager.before_turn(ep, params)
        if turn_params is None or ep.done:
            break
        prompt = list(manager.prompt(ep))
        gen = yield Generate(prompt, turn_params, expert=ep.state.get("expert") or _env_expert(ep))
        ep.agent_turns += 1
        turn = make_turn(ep, prompt, gen)
        if ep.is_child:
            answer = parse_answer(gen.text)
            if answer is not None and answer.strip():
                ep.segment.turns.append(turn)
                ep.result = ("success", answer.strip())
                finish(ep, Termination.DONE)
                break
        snapshot = ep.env.snapshot() if manager.needs_rollback else None
        result = None
        if tool_handler is not None:
            result = yield from tool_handler(ep, gen)
        if result is None:
            result = ep.env.step(gen.text)
        apply_result(turn, result)
        if result.done and not ep.is_child:
            manager.finalize(ep, turn, gen, result)
            break
        if ep.final_attempt or (result.done and ep.is_child):
            ep.segment.turns.append(turn)
            _end_without_answer(ep, "context" if ep.final_attempt else "done")
            break
        yield from manager.commit(ep, turn, gen, result, snapshot)
    return ep.result if ep.is_child else ep.rollout


def _env_expert(ep: Episode):
    """The environment's scripted expert for this episode's next message."""
    return lambda rng, noise: ep.env.expert_action(rng, noise)


def _end_without_answer(ep: Episode, termination: str) -> None:
    if ep.is_child:
        reason = (
            "no <answer> before the turn limit"
            if termination == Termination.MAX_TURNS
            else "no <answer> given"
        )
        ep.result = ("failed", reason)
    else:
        ep.segment.info.setdefault("terminal", True)
    finish(ep, termination)


def run_episodes(
    engine: Engine,
    renderer: Renderer,
    episodes: Sequence[Episode],
    params: SamplingParams,
    limits: LoopLimits,
    *,
    context: str = "append",
    context_params: dict | None = None,
    tool_handler: ToolHandler | None = None,
    driver: DriverOptions | None = None,
) -> list[Rollout]:
    """Run ``episodes`` to completion with batched generation; return their rollouts.

    ``context`` names the context manager (one instance per episode, built from
    ``context_params``); ``tool_handler`` intercepts special tool calls (forking);
    ``driver``: how they run (default: round by round, one thread).
    """
    programs = []
    for ep in episodes:
        if ep.renderer is None:
            ep.renderer = renderer
        manager = make_context(context, limits, context_params)
        programs.append(episode_program(ep, manager, params, tool_handler=tool_handler))
    return drive(engine, programs, driver)
