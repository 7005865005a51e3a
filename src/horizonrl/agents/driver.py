"""Batched execution of agent programs.

An agent *program* is a Python generator that describes one rollout (or one
subagent) step by step and yields requests to the driver:

- :class:`Generate` — sample one continuation of ``prompt_ids``; the driver
  sends back a :class:`~horizonrl.inference.base.Generation`;
- :class:`Spawn` — run child programs concurrently (subagent forking); the
  driver sends back the list of their return values once all have finished.

:func:`drive` runs many programs together: every round it gathers the pending
``Generate`` requests of all programs, makes one engine call per distinct
:class:`~horizonrl.inference.base.SamplingParams` (compaction sessions run at
their own temperature, shortened generations with their own budget), and resumes
each program with its result. A batch of ``tasks x G`` rollouts therefore costs
about ``max_turns`` batched engine calls whatever the context managers do, and
children of a fork generate in the same batches as every other episode.

Between engine calls the programs run their environment steps. When those wait on
another process (environments in Ray actors, :mod:`horizonrl.envs.remote`) an engine
may set ``program_threads > 1``: the ready programs are then resumed in that many
threads, one rollout (a root program and its subagents) per thread at a time, and
their requests are collected in the same order as one thread would, so the batches,
and with them the samples, are the same.

Writing a program::

    def program(...):
        gen = yield Generate(prompt_ids, params)
        results = yield Spawn([child_a(), child_b()])
        return value
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from horizonrl.inference.base import Engine, Generation, SamplingParams


@dataclass(frozen=True)
class Generate:
    """Request one sampled continuation of ``prompt_ids``.

    ``expert`` optionally gives what a scripted expert would say here,
    ``expert(rng, noise) -> text``: engines with a ``generate_requests`` method
    (:class:`horizonrl.agents.expert.ExpertEngine`) answer with it, so running the
    agent program with the expert engine records demonstrations in exactly the
    format (prompts, sessions, protocol messages) the policy is trained on.
    """

    prompt_ids: Sequence[int]
    params: SamplingParams
    expert: Callable[[Any, float], str] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Spawn:
    """Run ``programs`` concurrently; resume with the list of their return values."""

    programs: Sequence[Generator]


Program = Generator[Generate | Spawn, Any, Any]


@dataclass
class _Task:
    program: Program
    parent: _Task | None = None
    root: int = 0
    request: Generate | Spawn | None = None
    waiting_on: int = 0
    child_results: list[Any] = field(default_factory=list)
    done: bool = False
    result: Any = None


def drive(engine: Engine, programs: Sequence[Program]) -> list[Any]:
    """Run ``programs`` to completion with batched generation; return their values in order."""
    roots = [_Task(p, root=i) for i, p in enumerate(programs)]
    ready: deque[tuple[_Task, Any]] = deque((t, None) for t in roots)
    pending: list[_Task] = []
    threads = int(getattr(engine, "program_threads", 1) or 1)
    pool = ThreadPoolExecutor(threads) if threads > 1 and len(roots) > 1 else None
    try:
        while ready or pending:
            if pool is not None:
                _advance_threaded(pool, ready, pending)
            while ready:
                task, value = ready.popleft()
                _advance(task, value, ready, pending)
            if not pending:
                break
            batch, pending = pending, []
            _generate_round(engine, batch, ready)
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    return [t.result for t in roots]


def _generate_round(engine: Engine, batch: list[_Task], ready: deque) -> None:
    """One engine call per distinct ``SamplingParams`` over the pending requests; queue the results."""
    by_params: dict[SamplingParams, list[_Task]] = {}
    for t in batch:
        by_params.setdefault(t.request.params, []).append(t)
    for params, tasks in by_params.items():
        if hasattr(engine, "generate_requests"):
            gens = engine.generate_requests([t.request for t in tasks])
        else:
            gens = engine.generate([list(t.request.prompt_ids) for t in tasks], params)
        if len(gens) != len(tasks):
            raise RuntimeError(f"engine returned {len(gens)} generations for {len(tasks)} prompts")
        for g in gens:  # the temperature the log-probs are of (Turn.temperature)
            g.meta.setdefault("temperature", params.temperature)
        ready.extend(zip(tasks, gens, strict=True))


def _resume(task: _Task, value: Any) -> tuple[str, Any]:
    """Run ``task`` until its next request: ``('request', r)``, ``('stop', value)`` or ``('error', e)``."""
    try:
        request = next(task.program) if task.request is None else task.program.send(value)
    except StopIteration as stop:
        return "stop", stop.value
    except BaseException as e:  # re-raised in program order by the caller
        return "error", e
    return "request", request


def _advance_threaded(pool: ThreadPoolExecutor, ready: deque, pending: list[_Task]) -> None:
    """Resume every ready task, rollouts in parallel threads; bookkeeping in order (module docstring)."""
    while ready:
        batch = list(ready)
        ready.clear()
        by_root: dict[int, list[int]] = {}
        for j, (task, _) in enumerate(batch):
            by_root.setdefault(task.root, []).append(j)

        def run(js: list[int], batch=batch) -> list[tuple[int, tuple[str, Any]]]:
            return [(j, _resume(*batch[j])) for j in js]

        outcomes: list[tuple[str, Any] | None] = [None] * len(batch)
        for results in pool.map(run, by_root.values()):
            for j, out in results:
                outcomes[j] = out
        for (task, _), out in zip(batch, outcomes, strict=True):
            _settle(task, out, ready, pending)


def _advance(task: _Task, value: Any, ready: deque, pending: list[_Task]) -> None:
    """Resume ``task`` with ``value`` until it yields a generation request or ends."""
    _settle(task, _resume(task, value), ready, pending)


def _settle(task: _Task, outcome: tuple[str, Any], ready: deque, pending: list[_Task]) -> None:
    """Book a resumed task's outcome: queue its request, spawn its children, or finish it."""
    kind, value = outcome
    if kind == "error":
        raise value
    if kind == "stop":
        task.done, task.result = True, value
        parent = task.parent
        if parent is not None:
            parent.waiting_on -= 1
            if parent.waiting_on == 0:
                ready.append((parent, [c.result for c in parent.child_results]))
        return
    task.request = request = value
    if isinstance(request, Generate):
        if not isinstance(request.params, SamplingParams):
            raise TypeError(f"Generate.params must be SamplingParams, got {type(request.params).__name__}")
        pending.append(task)
    elif isinstance(request, Spawn):
        children = [_Task(p, parent=task, root=task.root) for p in request.programs]
        task.child_results = children
        task.waiting_on = len(children)
        if not children:
            ready.append((task, []))
        ready.extend((c, None) for c in children)
    else:
        raise TypeError(f"an agent program yielded {request!r}; expected Generate or Spawn")


def run_program(engine: Engine, program: Program) -> Any:
    """Drive a single program (convenience for tests and scripts)."""
    return drive(engine, [program])[0]


__all__ = ["Generate", "Generation", "Program", "Spawn", "drive", "run_program"]
