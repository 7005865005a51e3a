"""Mosaic subagent forking (paper appendix C.2; docs/spec/mosaic.md "Rollout scenarios").

The main agent gets the base system prompt plus the delegation instruction and,
besides the environment's tools, the ``fork`` tool (schema verbatim from the
paper). A valid ``fork`` call with 1–3 ``{"task": ...}`` items launches that
many subagents *concurrently* (a :class:`~horizonrl.agents.driver.Spawn`: their
generations batch with every other episode's); the parent waits for all of
them and receives one ``<subagent_results>`` tool observation listing each
child's status, task and result (the ``<answer>`` content) or failure reason.

- A child is a fresh single-session ReAct episode on a copy of the parent's
  environment (``make_env()`` + ``restore(parent.snapshot())``), with the base
  system prompt, the subagent user prompt, and the environment's tools only (no
  recursive ``fork``). It succeeds only with a non-empty ``<answer>``; running
  out of turns or context (forced-answer message, one final attempt) fails it.
- At most ``max_forks`` (10) successful fork calls per rollout; a call over that
  budget, with more than ``max_subagents`` (3) or no subagents, or with a
  malformed item is not executed and gets an explanatory tool response.
- Each child is a ``subagent`` segment with ``parent=0`` (the main session) and
  ``fork_index`` = the index of the fork call that made it. For Mosaic's
  information gain each child records ``info["h_minus"]`` (the main context
  before the forking turn) and ``info["h_plus"]`` (the main context after the
  results are returned).

Sessions of the main agent and of children use the ``compaction`` manager with
``max_compactions: 0`` unless the config names another: a turn that would
overrun the session limit gets the forced-answer message (paper C.2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from horizonrl.agents.context import Episode, SubProgram, make_context
from horizonrl.agents.driver import Program, Spawn
from horizonrl.agents.react import episode_program, start_episode
from horizonrl.agents.registry import AgentSpec, register_agent
from horizonrl.envs.core.base import Env, StepResult, Task
from horizonrl.envs.core.tools import (
    Tool,
    ToolCall,
    ToolCallError,
    format_tool_call,
    parse_answer,
    parse_tool_calls,
)
from horizonrl.inference.base import Generation
from horizonrl.trajectory import Segment

DELEGATION_PROMPT = (
    "As the main research agent, plan the investigation before executing it. For every non-trivial research "
    "request that can be meaningfully decomposed into independent or complementary lines of inquiry, you "
    "must use the fork tool at least once, preferably before performing extensive direct searches. Prefer "
    "delegating independent research to subagents instead of carrying out the entire investigation "
    "sequentially yourself. Each fork call must create between 1 and 3 subagents. Never include more than 3 "
    "subagents in one fork call. Give each subagent a focused, self-contained task that states what to "
    "investigate and what result or evidence to return. Prefer complementary, non-overlapping assignments. "
    "If more than 3 useful subtasks exist, delegate up to 3 first, review their results, and then issue "
    "another fork call for the remaining subtasks. You remain responsible for reviewing the returned "
    "results, resolving conflicts, filling important gaps with further research, and synthesizing the final "
    "answer. Do not treat subagent results as automatically correct. Forking is not limited to the "
    "beginning of the investigation. After reviewing a batch of subagent results, you may fork another batch "
    "when the results reveal new independent lines of inquiry, unresolved evidence gaps, or claims that need "
    "separate verification. Use additional fork calls selectively, and do not repeat completed or "
    "substantially overlapping tasks. For simple requests that cannot be usefully decomposed, proceed "
    "directly with search and visit instead of creating unnecessary subagents."
)
SUBAGENT_PROMPT = (
    "You are a research subagent created by a main search agent. Complete only the assigned task below. "
    "You may use search and visit tools. Return the final result for the main agent inside "
    "<answer></answer> tags. Assigned task: {task} Final response format: <answer></answer>"
)
FORK_TOOL = Tool(
    "fork",
    "Create 1 to 3 independent research subagents for decomposable subtasks. Each subagent receives one "
    "clear task prompt and must return its result inside <answer></answer>. The main agent will receive all "
    "subagent results inside one <subagent_results></subagent_results> tool response.",
    {
        "type": "object",
        "properties": {
            "subagents": {
                "type": "array",
                "minItems": 1,
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {
                        "task": {
                            "type": "string",
                            "description": "The subtask and required result format for one subagent.",
                        }
                    },
                    "required": ["task"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["subagents"],
        "additionalProperties": False,
    },
)
# Short prompts for small context budgets (the embedded tiny model); `prompts: paper` is the default.
# The short delegation line shows the fork call by example and the tool block lists no fork schema: the
# paper schema is ~400 tokens of the tiny tokenizer, and with it the root prompt was ~700 tokens, deeper
# than the tiny model's copy pretraining reaches (rows of ~530 tokens); it filled a 1024-token budget
# after one fork call (warm-start pass@1 0.012). Short, the root prompt is ~300 tokens. The call format and
# its limits are the same (validate_subagents enforces 1 to max_subagents tasks).
SHORT_DELEGATION_PROMPT = (
    'You may delegate subtasks to 1 to 3 subagents with <tool_call>{"name": "fork", "arguments": '
    '{"subagents": [{"task": "..."}]}}</tool_call>; review their results, then give the final answer.'
)
SHORT_SUBAGENT_PROMPT = "Subagent task: {task} Return the result inside <answer></answer>."
BUDGET_MESSAGE = (
    "The fork budget of this rollout is spent ({max_forks} fork calls); the call was not executed. "
    "Continue with the other tools or give the final answer."
)


def format_results(results: list[tuple[str, str, str]]) -> str:
    """The aggregated observation: ``(status, task, result-or-reason)`` per child (paper C.2)."""
    lines = ["<subagent_results>"]
    for k, (status, task, text) in enumerate(results, 1):
        lines.append(f"Subagent #{k}: {status}")
        lines.append(f"Task: {task}")
        lines.append(f"{'Result' if status == 'success' else 'Failure'}: {text}")
    lines.append("</subagent_results>")
    return "\n".join(lines)


def validate_subagents(arguments: dict[str, Any], max_subagents: int) -> list[str] | str:
    """The subtask strings of a fork call, or the reason it is refused."""
    items = arguments.get("subagents")
    if not isinstance(items, list) or not items:
        return (
            "fork needs a non-empty 'subagents' list of {\"task\": ...} objects; the call was not executed."
        )
    if len(items) > max_subagents:
        return (
            f"fork creates between 1 and {max_subagents} subagents per call; got {len(items)}. "
            "The call was not executed: delegate at most "
            f"{max_subagents} first, review their results, then fork again."
        )
    tasks = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or set(item) != {"task"} or not str(item["task"]).strip():
            return (
                f"fork: subagents[{i}] must be an object with exactly one non-empty 'task' string; "
                "the call was not executed."
            )
        tasks.append(str(item["task"]).strip())
    return tasks


class ForkHandler:
    """Intercepts ``fork`` calls of the main agent (a ``tool_handler`` of the ReAct loop)."""

    def __init__(
        self,
        spec: AgentSpec,
        *,
        max_subagents: int,
        max_forks: int,
        child_context: str,
        ctx_params,
        subagent_prompt: str = SUBAGENT_PROMPT,
        child_h_plus: str = "shared",
    ):
        if spec.make_env is None:
            raise ValueError("the fork agent needs AgentSpec.make_env to build subagent environments")
        self.spec = spec
        self.max_subagents = max_subagents
        self.max_forks = max_forks
        self.child_context = child_context
        self.ctx_params = ctx_params
        self.subagent_prompt = subagent_prompt
        self.child_h_plus = child_h_plus

    def __call__(self, ep: Episode, gen: Generation) -> SubProgram:
        if parse_answer(gen.text) is not None:
            return None
        calls = parse_tool_calls(gen.text, [*ep.env.tools, FORK_TOOL])
        fork = next((c for c in calls if isinstance(c, ToolCall) and c.name == "fork"), None)
        if fork is None:
            bad = next((c for c in calls if isinstance(c, ToolCallError) and c.name == "fork"), None)
            if bad is None:
                return None
            return self._refuse(ep, bad.message)
        forks = ep.rollout.env.get("forks", 0)
        if forks >= self.max_forks:
            return self._refuse(ep, BUDGET_MESSAGE.format(max_forks=self.max_forks))
        tasks = validate_subagents(fork.arguments, self.max_subagents)
        if isinstance(tasks, str):
            return self._refuse(ep, tasks)
        h_minus = list(ep.context)
        snapshot = ep.env.snapshot()
        children, envs = [], []
        for task_text in tasks:
            env = self.spec.make_env()
            envs.append(env)
            env.restore(snapshot)
            children.append(self._child(ep, env, task_text, fork_index=forks))
        try:
            results = yield Spawn([c[0] for c in children])
        finally:
            for env in envs:
                env.close()
        ep.rollout.env["forks"] = forks + 1
        metrics = ep.rollout.env.setdefault("metrics", {})
        metrics["forks"] = float(forks + 1)
        metrics["subagents"] = metrics.get("subagents", 0.0) + len(tasks)
        entries = [(status, t, text) for (status, text), t in zip(results, tasks, strict=True)]
        obs = format_results(entries)
        result = StepResult(obs, role="tool", tool_calls=1, obs_key=ep.env.state_key())

        def after(text: str) -> list[int]:  # the main context once ``text`` returns as the tool response
            return (
                h_minus
                + list(gen.ids)
                + list(ep.renderer.end_of_turn_ids(gen.ids))
                + list(ep.renderer.continuation_ids([{"role": "tool", "content": text}]))
            )

        h_plus = after(obs)
        for k, (_, seg) in enumerate(children):
            # B.1 literally: every child of one call shares h+ (the main context after all results).
            # child_h_plus="own": main context + only this child's result, so siblings can differ.
            own = self.child_h_plus == "own" and len(children) > 1
            seg.info.update(h_minus=h_minus, h_plus=after(format_results([entries[k]])) if own else h_plus)
        return result

    def _refuse(self, ep: Episode, message: str) -> StepResult:
        metrics = ep.rollout.env.setdefault("metrics", {})
        metrics["refused_forks"] = metrics.get("refused_forks", 0.0) + 1
        return StepResult(message, role="tool", invalid=True, obs_key=ep.env.state_key())

    def _child(self, ep: Episode, env: Env, task_text: str, *, fork_index: int) -> tuple[Program, Segment]:
        seg = ep.new_segment("subagent", parent=0, fork_index=fork_index)
        seg.info["task"] = task_text
        messages = [
            {"role": "system", "content": env.system_prompt},
            {"role": "user", "content": self.subagent_prompt.format(task=task_text)},
        ]
        tools = [t.to_schema() for t in env.tools] or None
        child = Episode(
            env=env,
            task=ep.task,
            rollout=ep.rollout,
            renderer=ep.renderer,
            segment=seg,
            messages=messages,
            tools=tools,
            is_child=True,
        )
        sub_expert = getattr(env, "subagent_expert", None)
        if sub_expert is not None:
            child.state["expert"] = lambda rng, noise: sub_expert(task_text, rng, noise)
        manager = make_context(self.child_context, self.spec.limits, self.ctx_params)
        return episode_program(child, manager, self.spec.params), seg


@dataclass(frozen=True)
class ForkParams:
    """``rollout.agent_params`` of the ``fork`` agent (module docstring)."""

    #: Subagents one fork call may start (paper C.2: in [1, 3]).
    max_subagents: int = 3
    #: Fork calls allowed per rollout (>= 0).
    max_forks: int = 10
    #: ``paper`` (the delegation and subagent prompts and the fork tool schema verbatim) or ``short``
    #: (one-line versions, the fork call shown by example instead of its schema, for small context
    #: budgets such as the embedded tiny model).
    prompts: str = "paper"
    #: ``shared`` (paper B.1: every child of a call gets the main context after all its results as h+,
    #: so siblings get identical information gains) or ``own`` (the main context after only that
    #: child's result line: a junk child and a correct one differ).
    child_h_plus: str = "shared"


@register_agent("fork", params=ForkParams)
def fork_agent(
    env: Env,
    task: Task,
    spec: AgentSpec,
    *,
    uid: str,
    group_id: str,
    params: ForkParams | None = None,
) -> Program:
    """Main agent with the ``fork`` tool (module docstring; ``agent_params``: :class:`ForkParams`)."""
    p = params if params is not None else ForkParams()
    max_subagents, max_forks, prompts, child_h_plus = p.max_subagents, p.max_forks, p.prompts, p.child_h_plus
    if prompts not in ("paper", "short"):
        raise ValueError(f"fork: prompts={prompts!r} must be 'paper' or 'short'")
    if child_h_plus not in ("shared", "own"):
        raise ValueError(f"fork: child_h_plus={child_h_plus!r} must be 'shared' or 'own'")
    if not 1 <= max_subagents <= 3:
        raise ValueError(f"fork: max_subagents={max_subagents!r} must be in [1, 3] (paper C.2)")
    if max_forks < 0:
        raise ValueError(f"fork: max_forks={max_forks!r} must be >= 0")
    delegation = DELEGATION_PROMPT if prompts == "paper" else SHORT_DELEGATION_PROMPT
    system = f"{env.system_prompt}\n\n{delegation}"
    ep = start_episode(
        env,
        task,
        spec.renderer,
        uid=uid,
        group_id=group_id,
        system_prompt=system,
        extra_tools=[FORK_TOOL.to_schema()] if prompts == "paper" else [],
        preamble=spec.preamble,
    )
    ep.rollout.env["forks"] = 0
    ep.rollout.env["metrics"] = {"forks": 0.0, "subagents": 0.0}
    if spec.context == "append":
        context, ctx_params = "compaction", {"max_compactions": 0}
    else:
        context, ctx_params = spec.context, dict(spec.context_params)
    handler = ForkHandler(
        spec,
        max_subagents=max_subagents,
        max_forks=max_forks,
        child_context=context,
        ctx_params=ctx_params,
        subagent_prompt=SUBAGENT_PROMPT if prompts == "paper" else SHORT_SUBAGENT_PROMPT,
        child_h_plus=child_h_plus,
    )
    main_expert = getattr(env, "delegation_expert", None)
    if main_expert is not None:
        ep.state["expert"] = lambda rng, noise: main_expert(rng, noise, ep.rollout.env["forks"])
    manager = make_context(context, spec.limits, ctx_params)
    return episode_program(ep, manager, spec.params, tool_handler=handler)


def fork_call(tasks: list[str]) -> str:
    """The text of a fork call delegating ``tasks`` (what experts emit)."""
    return format_tool_call("fork", {"subagents": [{"task": t} for t in tasks]})


__all__ = [
    "DELEGATION_PROMPT",
    "FORK_TOOL",
    "SUBAGENT_PROMPT",
    "ForkHandler",
    "ForkParams",
    "fork_agent",
    "fork_call",
]
