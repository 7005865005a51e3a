"""Registry of agent kinds (``rollout.agent`` in configs).

An agent kind turns one (environment, task) pair into an agent *program*
(:mod:`horizonrl.agents.driver`) that returns a :class:`~horizonrl.trajectory.Rollout`.
All kinds share :class:`AgentSpec`, built once per run from the config::

    @register_agent("react")
    def react(env, task, spec, *, uid, group_id) -> Program: ...

Built in: ``react`` (the ReAct loop with the configured context manager) and,
registered by their modules, ``fork`` (Mosaic subagent forking) and ``stepwise``
(CCPO/verl-agent step-wise prompts).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from horizonrl.agents.context import make_context
from horizonrl.agents.driver import Program
from horizonrl.agents.react import LoopLimits, episode_program, start_episode
from horizonrl.envs.core.base import Env, Task
from horizonrl.inference.base import SamplingParams
from horizonrl.registry import Registry

AgentFn = Callable[..., Program]

AGENTS: Registry[AgentFn] = Registry("agent", register_with="@register_agent(NAME) (horizonrl.agents)")


#: The agent kinds that show :attr:`AgentSpec.preamble` (``rollout.few_shot``) before the task.
FEW_SHOT_AGENTS = ("react", "fork")


@dataclass(frozen=True)
class AgentSpec:
    """Everything an agent kind needs besides the episode itself."""

    renderer: Any
    params: SamplingParams
    limits: LoopLimits
    context: str = "append"
    context_params: dict[str, Any] = field(default_factory=dict)
    agent_params: dict[str, Any] = field(default_factory=dict)
    make_env: Callable[[], Env] | None = None
    #: Chat turns shown between the system message and the task (``rollout.few_shot``'s expert episodes).
    preamble: tuple[dict[str, Any], ...] = ()


def register_agent(name: str) -> Callable[[AgentFn], AgentFn]:
    """Decorator registering the agent kind ``fn(env, task, spec, *, uid, group_id, **agent_params)``."""
    return AGENTS.register(name)


#: Names of the registered agent kinds, sorted.
list_agents = AGENTS.names

#: The agent kind registered as ``name`` (:class:`~horizonrl.registry.UnknownNameError`, a ValueError, naming
#: the known ones).
get_agent = AGENTS.get


def check_agent_params(name: str, params: dict[str, Any]) -> None:
    """ValueError naming any ``agent_params`` key the agent kind does not accept."""
    fn = get_agent(name)
    sig = inspect.signature(fn)
    accepted = [p.name for p in sig.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    accepted = [p for p in accepted if p not in ("uid", "group_id")]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(f"agent {name!r} got unknown agent_params {unknown}; accepted: {accepted}")


def make_program(name: str, env: Env, task: Task, spec: AgentSpec, *, uid: str, group_id: str) -> Program:
    return get_agent(name)(env, task, spec, uid=uid, group_id=group_id, **spec.agent_params)


@register_agent("react")
def react(env: Env, task: Task, spec: AgentSpec, *, uid: str, group_id: str) -> Program:
    """The ReAct loop with the configured context manager."""
    ep = start_episode(env, task, spec.renderer, uid=uid, group_id=group_id, preamble=spec.preamble)
    manager = make_context(spec.context, spec.limits, spec.context_params)
    return episode_program(ep, manager, spec.params)
