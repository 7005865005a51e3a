"""Step-wise agent (``rollout.agent: stepwise``): one rebuilt prompt per step (docs/spec/ccpo.md).

The verl-agent style CCPO trains in (paper Sec. 3.1; template: App. D, Table S4): instead of one growing
chat, the prompt ``p_{i,t}`` of step ``t`` is rebuilt from scratch out of

- the task ``x`` (the first ``task_lines`` lines of the environment's first message),
- the last ``K_H = history`` observation-action pairs ``(o_{i,u}, a_{i,u})``,
  ``u = max(0, t - K_H) .. t - 1`` (paper default ``K_H = 2``, Table S2),
- the current observation ``o_{i,t}`` (the rest of the first message at ``t = 0``,
  afterwards the environment's reply to ``a_{i,t-1}``),
- the admissible actions of the current state (``env.admissible_commands()`` when
  the environment has it and ``admissible`` is on),

rendered as ``[system, user]`` with the environment's system prompt (and tool
schemas when ``tools`` is on). Every step is therefore its own training row: the
turns share one segment, but no prompt extends its predecessor's prompt plus
response token-for-token, so :func:`horizonrl.trajectory.build_rows` starts a
new row at every turn, each under exactly the context it was sampled from.

Per turn: ``obs_key``/``reward``/``observation`` as in the ReAct loop
(:func:`horizonrl.agents.react.apply_result`); ``invalid`` when the environment
flags the action (not admissible, malformed call, no call) or when the step ran
more than one action (one action per step); ``info`` holds ``step``, ``history``
(pairs shown) and ``invalid_reason``. The episode ends when the environment says
done, after ``spec.limits.max_turns`` steps (``max_turns``), or when a prompt
leaves no room to generate in ``context_budget`` (``context``; ``overflow:
truncate`` first shortens the generation). ``rollout.env["metrics"]["revisit_rate"]``
is the share of steps whose state was already visited earlier in the trajectory
(:func:`revisit_rate`), logged by the trainer as ``rollout/revisit_rate``;
``revisit_rate_text`` counts repeated observation *text* instead (what the policy
can see; identical text may hide different progress).

Warm start: every ``Generate`` request carries the environment's expert
(``env.expert_action``), so ``horizonrl sft`` with ``rollout.agent: stepwise``
records expert rollouts of this very program (:mod:`horizonrl.agents.expert`);
:func:`stepwise_demos` writes the same steps as chat records (``{messages,
tools}``, one per step, :mod:`horizonrl.train.warmstart.sft`) for ``sft.data`` files.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from horizonrl.agents.context import generation_turn
from horizonrl.agents.driver import Generate, Program
from horizonrl.agents.react import apply_result
from horizonrl.agents.registry import AgentSpec, register_agent
from horizonrl.envs import get_env
from horizonrl.envs.core.base import Env, StepResult, Task
from horizonrl.envs.core.tools import ToolCall, parse_tool_calls
from horizonrl.inference.base import SamplingParams
from horizonrl.trajectory import Rollout, Segment
from horizonrl.vocab import Termination

DEFAULT_HISTORY = 2  # K_H, paper Table S2 ("Prompt history (steps): 2")
MAX_ACTION_CHARS = 200  # a history action that is not a single one-argument call is cut to this
NO_OBSERVATION = "(none)"


@dataclass(frozen=True)
class StepFormat:
    """How step prompts are built (the ``stepwise`` agent's parameters, ``rollout.agent_params``)."""

    #: ``K_H``: the latest observation-action pairs shown in each step's prompt (>= 0).
    history: int = DEFAULT_HISTORY
    #: Render the environment's tool schemas in the prompt.
    tools: bool = True
    #: List ``env.admissible_commands()`` in the prompt.
    admissible: bool = True
    #: Leading lines of the first message that state the task (the rest is ``o_{i,0}``; >= 1).
    task_lines: int = 1

    def __post_init__(self) -> None:
        for name in ("history", "task_lines"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "history" else 1):
                bound = ">= 0" if name == "history" else ">= 1"
                raise ValueError(f"stepwise agent: {name} must be an integer {bound}, got {v!r}")
        for name in ("tools", "admissible"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"stepwise agent: {name} must be true or false, got {getattr(self, name)!r}")


def split_task(first: str, task_lines: int = 1) -> tuple[str, str]:
    """``(task, o_0)``: the first ``task_lines`` lines of the first message, and the rest (or ``(none)``)."""
    lines = first.strip().split("\n")
    task = "\n".join(lines[:task_lines]).strip()
    rest = "\n".join(lines[task_lines:]).strip()
    return task, rest or NO_OBSERVATION


def action_summary(text: str, tools: Sequence[Any] | None = None) -> str:
    """The action of a response as shown in later prompts' history.

    A response with exactly one well-formed tool call of one argument shows that
    argument's value (``act {"command": "go to hall"}`` -> ``go to hall``, the
    paper's projected action); anything else shows its stripped text (at most
    ``MAX_ACTION_CHARS`` characters).
    """
    calls = parse_tool_calls(text, tools)
    if len(calls) == 1 and isinstance(calls[0], ToolCall) and len(calls[0].arguments) == 1:
        return str(next(iter(calls[0].arguments.values())))
    return text.strip()[:MAX_ACTION_CHARS]


def _one_line(s: str) -> str:
    return s.replace("\n", " ").strip()


@dataclass
class StepState:
    """What the next step's prompt shows; advanced after every environment step.

    ``past`` holds every ``(o_u, a_u)`` pair so far (the prompt shows the last ``K_H``);
    ``initial_key`` is the environment's state key after reset (``None`` if it has none).
    """

    task: str
    observation: str
    fmt: StepFormat
    past: list[tuple[str, str]] = field(default_factory=list)
    initial_key: str | None = None

    @property
    def step(self) -> int:
        return len(self.past)

    def shown_history(self) -> list[tuple[str, str]]:
        k = self.fmt.history
        return self.past[-k:] if k else []

    def user_text(self, admissible: Sequence[str] | None) -> str:
        """The user message of step ``t`` (compact form of the paper's Table S4 template)::

        {task}
        History ({t} steps taken, last {k} shown):
        [Observation {u+1}: {o_u} | Action {u+1}: {a_u}]      (u = t-k .. t-1)
        Step {t+1}. Current observation: {o_t}
        Admissible actions: {a}; {b}; ...
        """
        t = self.step
        lines = [self.task]
        shown = self.shown_history()
        if t:
            lines.append(f"History ({t} steps taken, last {len(shown)} shown):")
            for u, (obs, act) in enumerate(shown, start=t - len(shown)):
                lines.append(f"[Observation {u + 1}: {_one_line(obs)} | Action {u + 1}: {_one_line(act)}]")
        lines.append(f"Step {t + 1}. Current observation: {self.observation}")
        if admissible is not None:
            lines.append(f"Admissible actions: {'; '.join(admissible)}.")
        return "\n".join(lines)

    def messages(self, env: Env) -> list[dict[str, str]]:
        """``[system, user]`` of the current step."""
        adm = None
        if self.fmt.admissible and callable(getattr(env, "admissible_commands", None)):
            adm = list(env.admissible_commands())
        return [
            {"role": "system", "content": env.system_prompt},
            {"role": "user", "content": self.user_text(adm)},
        ]

    def advance(self, action: str, result: StepResult) -> None:
        """Record ``(o_t, a_t)`` and move to ``o_{t+1}`` = the environment's reply."""
        self.past.append((self.observation, action))
        self.observation = result.observation.strip() or NO_OBSERVATION


def start_state(env: Env, task: Task, fmt: StepFormat) -> StepState:
    """Reset ``env`` on ``task``; the state of step 0 (its key is ``env.state_key()``)."""
    text, obs = split_task(env.reset(task), fmt.task_lines)
    return StepState(task=text, observation=obs, fmt=fmt, initial_key=env.state_key())


def tool_schemas(env: Env, fmt: StepFormat) -> list[dict] | None:
    """The tool schemas rendered into step prompts (None when ``tools`` is off or there are none)."""
    return ([t.to_schema() for t in env.tools] or None) if fmt.tools else None


def invalid_reason(result: StepResult) -> str | None:
    """Why a step's action is invalid: ``env`` (flagged by the environment), ``multiple_actions``, or None."""
    if result.invalid:
        return "env"
    if result.tool_calls > 1:
        return "multiple_actions"
    return None


def revisit_rate(keys: Sequence[str | None]) -> float:
    """Share of steps whose state was seen at an earlier step: ``mean_t 1[k_t in {k_0, ..., k_{t-1}}]``.

    ``keys[t]`` is the state step ``t`` was decided on; ``None`` (unknown) never
    counts as a revisit. 0 for an empty trajectory.
    """
    seen: set[str] = set()
    hits = 0
    for k in keys:
        if k is not None:
            hits += k in seen
            seen.add(k)
    return hits / len(keys) if keys else 0.0


def rollout_states(rollout: Rollout) -> list[str | None]:
    """State key of every decision: ``env["initial_obs_key"]``, then every turn's ``obs_key`` but the last."""
    turns = rollout.turns
    return [rollout.env.get("initial_obs_key"), *(t.obs_key for t in turns[:-1])][: len(turns)]


def rollout_texts(rollout: Rollout) -> list[str | None]:
    """Observation text of every decision: ``env["initial_obs_text"]``, then each reply but the last."""
    turns = rollout.turns
    texts = [rollout.env.get("initial_obs_text"), *((t.observation or "").strip() for t in turns[:-1])]
    return texts[: len(turns)]


def _fit(prompt: Sequence[int], params: SamplingParams, limits) -> SamplingParams | None:
    """The step's sampling params within ``context_budget`` (shortened under ``truncate``), or None."""
    room = limits.context_budget - len(prompt)
    if room >= params.max_new_tokens:
        return params
    if limits.overflow == "fail" or room < 1:
        return None
    return replace(params, max_new_tokens=room)


def _program(env: Env, task: Task, spec: AgentSpec, uid: str, group_id: str, fmt: StepFormat) -> Program:
    state = start_state(env, task, fmt)
    schemas = tool_schemas(env, fmt)
    rollout = Rollout(uid=uid, task_id=task.id, group_id=group_id, segments=[Segment(kind="normal")])
    rollout.env = {
        "name": env.name,
        "agent": "stepwise",
        "initial_obs_key": state.initial_key,
        "initial_obs_text": state.observation,
    }
    seg = rollout.segments[0]
    termination = Termination.MAX_TURNS
    for _ in range(spec.limits.max_turns):
        shown = len(state.shown_history())
        prompt = list(spec.renderer.initial_ids(state.messages(env), schemas))
        params = _fit(prompt, spec.params, spec.limits)
        if params is None:
            termination = Termination.CONTEXT
            break
        gen = yield Generate(prompt, params, expert=lambda rng, noise: env.expert_action(rng, noise))
        turn = generation_turn(prompt, gen)
        result = env.step(gen.text)
        apply_result(turn, result)
        reason = invalid_reason(result)
        turn.invalid = reason is not None
        turn.info.update(step=state.step, history=shown, invalid_reason=reason)
        seg.turns.append(turn)
        if result.done:
            rollout.success = bool(result.success)
            rollout.final_answer = result.final_answer
            termination = Termination.DONE
            break
        state.advance(action_summary(gen.text, env.tools), result)
    seg.info["terminal"] = True
    rollout.termination = termination
    rollout.reward = float(sum(t.reward for t in seg.turns))
    rollout.env["metrics"] = {
        "revisit_rate": revisit_rate(rollout_states(rollout)),
        "revisit_rate_text": revisit_rate(rollout_texts(rollout)),
    }
    return rollout


@register_agent("stepwise", params=StepFormat)
def stepwise(
    env: Env,
    task: Task,
    spec: AgentSpec,
    *,
    uid: str,
    group_id: str,
    params: StepFormat | None = None,
) -> Program:
    """One rebuilt prompt per step with the last ``history`` observation-action pairs (module docstring;
    ``agent_params``: :class:`StepFormat`)."""
    return _program(env, task, spec, uid, group_id, params if params is not None else StepFormat())


# ----------------------------------------------------------------- warm-start demonstrations


def stepwise_demo(
    env: Env, task: Task, rng: random.Random, *, noise: float, max_turns: int, fmt: StepFormat
) -> list[dict[str, Any]]:
    """One noisy-expert episode as SFT records, one per step: ``{messages: [system, user, assistant]}``.

    The ``[system, user]`` messages and tools are exactly the agent's prompt of
    that step (same :class:`StepState`), so ``ChatRenderer.sft_example`` tokenizes
    them into the ids the agent will see. ``success`` is the episode's outcome.
    """
    state = start_state(env, task, fmt)
    schemas = tool_schemas(env, fmt)
    records: list[dict[str, Any]] = []
    success = False
    for _ in range(max_turns):
        action = env.expert_action(rng, noise=noise)
        messages = [*state.messages(env), {"role": "assistant", "content": action}]
        records.append({"task_id": task.id, "step": state.step, "messages": messages, "tools": schemas or []})
        result = env.step(action)
        if result.done:
            success = bool(result.success)
            break
        state.advance(action_summary(action, env.tools), result)
    for r in records:
        r["success"] = success
    return records


def stepwise_demos(
    env_name: str,
    n: int,
    *,
    seed: int,
    noise: float,
    max_turns: int,
    knobs: dict[str, Any] | None = None,
    task_seed: int = 0,
    history: int = DEFAULT_HISTORY,
    tools: bool = True,
    admissible: bool = True,
    task_lines: int = 1,
) -> list[dict[str, Any]]:
    """SFT records of ``n`` noisy-expert episodes on training tasks of ``env_name`` (one record per step).

    Same task stream as :func:`horizonrl.train.warmstart.bootstrap.generate_demos`; the
    format parameters are the ``stepwise`` agent's (pass ``rollout.agent_params``).
    """
    fmt = StepFormat(history=history, tools=tools, admissible=admissible, task_lines=task_lines)
    knobs = knobs or {}
    cls = get_env(env_name)
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for task in cls.make_tasks(n, seed=task_seed, split="train", **knobs):
        env = cls(**knobs)
        try:
            out.extend(stepwise_demo(env, task, rng, noise=noise, max_turns=max_turns, fmt=fmt))
        finally:
            env.close()
    return out


__all__ = [
    "DEFAULT_HISTORY",
    "StepFormat",
    "StepState",
    "action_summary",
    "invalid_reason",
    "revisit_rate",
    "rollout_states",
    "rollout_texts",
    "split_task",
    "start_state",
    "stepwise",
    "stepwise_demo",
    "stepwise_demos",
]
