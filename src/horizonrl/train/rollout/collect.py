"""Collect groups of rollouts: ``G`` episodes per task through the batched agent loop.

Held-out evaluation (:func:`evaluate`) can show its progress on stderr
(:mod:`horizonrl.train.rollout.progress`): pass ``progress=True``, or run it inside
``eval_progress(True)`` (the run loop does, with ``train.progress``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from math import comb

import numpy as np

from horizonrl.agents import LoopLimits, drive
from horizonrl.agents.registry import AgentSpec, make_program
from horizonrl.credit import flatten_rollouts
from horizonrl.envs.core.base import Env, Task
from horizonrl.inference.base import Engine, SamplingParams
from horizonrl.models.chat import CHECK_FIRST_EPISODES
from horizonrl.train.rollout.progress import EvalProgress, eval_progress_on, watched
from horizonrl.trajectory import SEGMENT_KINDS, Group, Rollout, saved_tokens
from horizonrl.trajectory.rows import side_session_overlap
from horizonrl.vocab import Termination


def collect_groups(
    engine: Engine,
    renderer,
    make_env: Callable[[], Env],
    tasks: Sequence[Task],
    group_size: int,
    params: SamplingParams,
    limits: LoopLimits,
    *,
    tag: str = "",
    agent: str = "react",
    spec: AgentSpec | None = None,
    progress: EvalProgress | None = None,
) -> list[Group]:
    """Run ``group_size`` rollouts of every task; rollout uids are ``{tag}{task_index}-{k}``.

    ``agent`` names the agent kind (:mod:`horizonrl.agents.registry`); ``spec``
    carries its context manager and parameters (default: ``append``, no params).
    ``progress`` is told of every generation and finished episode (:func:`watched`).
    """
    spec = spec or AgentSpec(renderer=renderer, params=params, limits=limits, make_env=make_env)
    # rollout.check_tokens unset: the first episodes of a fresh run's first step ("s0-") are checked,
    # chosen by index so that the same episodes are checked whatever the timing, and never on --resume
    first = tag == "s0-" and spec.renderer.checks_by_default
    checked = replace(spec, renderer=spec.renderer.checking()) if first else None
    envs, programs, groups = [], [], []
    try:
        for i, task in enumerate(tasks):
            gid = f"{tag}{i}"
            groups.append(Group(group_id=gid, task_id=task.id))
            for k in range(group_size):
                env = make_env()
                envs.append(env)
                use = checked if checked is not None and len(programs) < CHECK_FIRST_EPISODES else spec
                program = make_program(agent, env, task, use, uid=f"{gid}-{k}", group_id=gid)
                programs.append(program if progress is None else watched(program, progress, i))
        rollouts = drive(engine, programs, spec.driver)
    finally:
        for env in envs:
            env.close()
    for j, r in enumerate(rollouts):
        groups[j // group_size].rollouts.append(r)
    return groups


def rollout_metrics(rollouts: Sequence[Rollout], prefix: str = "") -> dict[str, float]:
    """Per-step rollout statistics (docs/design.md metric keys).

    Besides the fixed keys, every number an agent loop or context manager puts in
    ``rollout.env["metrics"]`` is averaged (over the rollouts that report it) as
    ``rollout/<key>``.
    """
    n = max(len(rollouts), 1)
    turns = [t for r in rollouts for t in r.turns]
    nt = max(len(turns), 1)
    term = [r.termination for r in rollouts]
    kinds = {
        f"{prefix}rollout/sessions_{kind}_mean": sum(s.kind == kind for r in rollouts for s in r.segments) / n
        for kind in SEGMENT_KINDS
    }
    extra: dict[str, list[float]] = {}
    for r in rollouts:
        for k, v in (r.env.get("metrics") or {}).items():
            extra.setdefault(f"{prefix}rollout/{k}", []).append(float(v))
    kinds.update({k: float(np.mean(v)) for k, v in extra.items()})
    cached = [t for t in turns if "cached_tokens" in t.info]
    if cached:  # prompt tokens served from the engine's prefix cache instead of prefilled; a throughput
        # key: vLLM's cache holds whatever the process ran before, so the rate is not resume-exact
        key = f"throughput/{prefix.replace('/', '_')}prefix_cache_hit_rate"
        kinds[key] = sum(t.info["cached_tokens"] for t in cached) / max(
            sum(len(t.prompt_ids) for t in cached), 1
        )
    saved = [saved_tokens(r) for r in rollouts]  # build_rows once per rollout
    return kinds | {
        f"{prefix}reward/mean": float(np.mean([r.reward for r in rollouts])) if rollouts else 0.0,
        f"{prefix}success/rate": sum(r.success for r in rollouts) / n,
        f"{prefix}rollout/turns_mean": sum(r.num_turns for r in rollouts) / n,
        f"{prefix}rollout/sessions_mean": sum(len(r.segments) for r in rollouts) / n,
        f"{prefix}rollout/response_tokens_mean": sum(r.num_response_tokens for r in rollouts) / n,
        f"{prefix}rollout/tool_calls_mean": sum(t.tool_calls for t in turns) / n,
        f"{prefix}rollout/invalid_turn_rate": sum(t.invalid for t in turns) / nt,
        # An environment that raised or returned a non-number reward (StepResult.info["env_error"]).
        f"{prefix}rollout/env_error_rate": sum("env_error" in t.info for t in turns) / nt,
        f"{prefix}rollout/truncated_turn_rate": sum(t.truncated for t in turns) / nt,
        f"{prefix}rollout/context_overflow_rate": term.count(Termination.CONTEXT) / n,
        f"{prefix}rollout/max_turns_rate": term.count(Termination.MAX_TURNS) / n,
        f"{prefix}rollout/forks_mean": sum(r.env.get("forks", 0) for r in rollouts) / n,
        # Trajectory volume (ECHO Fig. 2): saved segment tokens; the tokens processed beside it.
        f"{prefix}rollout/trajectory_tokens_mean": sum(saved) / n,
        # the same with selection / summary / compaction sessions counted by what they add to their
        # parent's context (ECHO's released accounting appends the selector to the ending segment)
        f"{prefix}rollout/trajectory_tokens_appended_mean": (
            sum(saved) - sum(map(side_session_overlap, rollouts))
        )
        / n,
        f"{prefix}rollout/processed_tokens_mean": sum(len(t.prompt_ids) + len(t.response_ids) for t in turns)
        / n,
    }


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples with ``c`` correct (Chen et al. 2021): ``1 - C(n-c,k)/C(n,k)``."""
    if k > n:
        raise ValueError(f"pass@k needs k <= n samples, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def evaluate(
    engine: Engine,
    renderer,
    make_env: Callable[[], Env],
    tasks: Sequence[Task],
    *,
    samples: int,
    params: SamplingParams,
    limits: LoopLimits,
    agent: str = "react",
    spec: AgentSpec | None = None,
    per_task: list[int] | None = None,
    groups_out: list[Group] | None = None,
    progress: bool | None = None,
) -> dict[str, float]:
    """Held-out evaluation: ``samples`` rollouts per task, pass@1 and pass@samples.

    With ``per_task`` (a list) the number of successes of each task is appended to it,
    in task order (paired comparisons and task bootstraps need them); with ``groups_out``
    the task groups themselves (checks of a policy's own behaviour, e.g. its session counts).
    ``progress``: show an :class:`EvalProgress` bar on stderr (None: as the enclosing
    :func:`eval_progress` says; off outside one); the result is the same either way.
    """
    show = eval_progress_on() if progress is None else progress
    bar = EvalProgress(len(tasks), samples) if show else None
    try:
        groups = collect_groups(
            engine,
            renderer,
            make_env,
            tasks,
            samples,
            params,
            limits,
            tag="eval",
            agent=agent,
            spec=spec,
            progress=bar,
        )
    finally:
        if bar is not None:
            bar.close()
    correct = [sum(r.success for r in g.rollouts) for g in groups]
    if per_task is not None:
        per_task.extend(correct)
    if groups_out is not None:
        groups_out.extend(groups)
    out = {
        "eval/pass@1": float(np.mean([pass_at_k(samples, c, 1) for c in correct])),
        f"eval/pass@{samples}": float(np.mean([pass_at_k(samples, c, samples) for c in correct])),
    }
    out.update(rollout_metrics(flatten_rollouts(groups), prefix="eval/"))
    return out
