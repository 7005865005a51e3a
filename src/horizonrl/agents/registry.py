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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from horizonrl.agents.context import accepted_params, make_context
from horizonrl.agents.driver import DriverOptions, Program
from horizonrl.agents.react import LoopLimits, episode_program, start_episode
from horizonrl.agents.renderer import Renderer
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

    #: Renders chat messages as prompt token ids (:class:`~horizonrl.agents.renderer.Renderer`).
    renderer: Renderer
    #: Sampling parameters of the policy's generations (``rollout.temperature``, ``top_p``, ...).
    params: SamplingParams
    #: Turn limit, context budget and overflow policy of one episode (``rollout.max_turns``, ...).
    limits: LoopLimits
    #: The context manager's registered name (``rollout.context``).
    context: str = "append"
    #: Keyword parameters of the context manager (``rollout.context_params``).
    context_params: dict[str, Any] = field(default_factory=dict)
    #: Keyword parameters of the agent kind (``rollout.agent_params``).
    agent_params: dict[str, Any] = field(default_factory=dict)
    #: Builds a fresh environment (the fork agent's subagents need one each).
    make_env: Callable[[], Env] | None = None
    #: Chat turns shown between the system message and the task (``rollout.few_shot``'s expert episodes).
    preamble: tuple[dict[str, Any], ...] = ()
    #: How the programs run (``rollout.driver`` and its threads; :func:`horizonrl.agents.driver.drive`).
    driver: DriverOptions = field(default_factory=DriverOptions)


#: The declared parameters of the agent kinds that have them (``register_agent(name, params=...)``).
AGENT_PARAMS: dict[str, type] = {}


def register_agent(name: str, *, params: type | None = None) -> Callable[[AgentFn], AgentFn]:
    """Decorator registering the agent kind ``name``.

    With ``params`` (a frozen dataclass whose fields are the accepted ``rollout.agent_params``, one
    docstring each) the kind is ``fn(env, task, spec, *, uid, group_id, params)``, called with the
    dataclass built from the mapping; without, ``fn(env, task, spec, *, uid, group_id, **agent_params)``.
    """
    register = AGENTS.register(name)

    def deco(fn: AgentFn) -> AgentFn:
        fn = register(fn)
        if params is not None:
            AGENT_PARAMS[name] = params
        return fn

    return deco


#: Names of the registered agent kinds, sorted.
list_agents = AGENTS.names

#: The agent kind registered as ``name`` (:class:`~horizonrl.registry.UnknownNameError`, a ValueError, naming
#: the known ones).
get_agent = AGENTS.get


def agent_params_declaration(name: str) -> Callable:
    """What declares the ``rollout.agent_params`` of agent kind ``name``: its params dataclass, or for a
    kind registered without one its function (keyword-only parameters after ``uid, group_id``)."""
    fn = get_agent(name)
    return AGENT_PARAMS.get(name, fn)


def check_agent_params(name: str, params: dict[str, Any]) -> None:
    """ValueError naming any ``agent_params`` key the agent kind does not accept."""
    accepted = accepted_params(
        agent_params_declaration(name), skip=("env", "task", "spec", "uid", "group_id")
    )
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(f"agent {name!r} got unknown agent_params {unknown}; accepted: {accepted}")


def make_program(name: str, env: Env, task: Task, spec: AgentSpec, *, uid: str, group_id: str) -> Program:
    fn = get_agent(name)
    if name in AGENT_PARAMS:
        return fn(env, task, spec, uid=uid, group_id=group_id, params=AGENT_PARAMS[name](**spec.agent_params))
    return fn(env, task, spec, uid=uid, group_id=group_id, **spec.agent_params)


@register_agent("react")
def react(env: Env, task: Task, spec: AgentSpec, *, uid: str, group_id: str) -> Program:
    """The ReAct loop with the configured context manager."""
    ep = start_episode(env, task, spec.renderer, uid=uid, group_id=group_id, preamble=spec.preamble)
    manager = make_context(spec.context, spec.limits, spec.context_params)
    return episode_program(ep, manager, spec.params)
