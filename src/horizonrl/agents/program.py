"""Agent programs: the requests they yield and the bookkeeping both drivers share.

An agent *program* is a Python generator that describes one rollout (or one
subagent) step by step and yields requests to a driver:

- :class:`Generate` — sample one continuation of ``prompt_ids``; the driver
  sends back a :class:`~horizonrl.inference.base.Generation`;
- :class:`Spawn` — run child programs concurrently (subagent forking); the
  driver sends back the list of their return values once all have finished.

Two drivers run programs: the round-synchronous :func:`horizonrl.agents.driver.drive`
and the episode-level asynchronous :func:`horizonrl.agents.scheduler.drive_async`.
This module holds what they share: a :class:`Task` per running program, resuming
it (:func:`resume`) and booking what it did (:func:`settle`), and the *path seed*
of each request (:meth:`Task.next_seed`), which lets both drivers sample every
request from the same seed whatever the order requests reach the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

from horizonrl.inference.base import SamplingParams
from horizonrl.inference.seeding import path_seed


@dataclass(frozen=True)
class Generate:
    """Request one sampled continuation of ``prompt_ids``.

    ``expert`` optionally gives what a scripted expert would say here,
    ``expert(rng, noise) -> text``: engines that ``answers_requests``
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


@dataclass(eq=False)  # compared and hashed by identity (a stream request's key)
class Task:
    """One running program: its place in the rollout tree and what it waits for.

    ``path`` names the task inside its rollout: ``()`` for the root, ``parent.path + (call, j)`` for
    child ``j`` of the spawn its parent yielded as request number ``call``. With the rollout's
    ``seed`` it fixes the seed of every request the task makes (:meth:`next_seed`).
    """

    program: Program
    parent: Task | None = None
    root: int = 0
    seed: int = 0
    path: tuple[int, ...] = ()
    calls: int = 0
    request: Generate | Spawn | None = None
    waiting_on: int = 0
    children: list[Task] = field(default_factory=list)
    done: bool = False
    result: Any = None

    def next_seed(self) -> int:
        """The sampling seed of the request this task has just yielded (request ``calls - 1``)."""
        return path_seed(self.seed, (*self.path, self.calls - 1))


def resume(task: Task, value: Any) -> tuple[str, Any]:
    """Run ``task`` until its next request: ``('request', r)``, ``('stop', value)`` or ``('error', e)``."""
    try:
        request = next(task.program) if task.request is None else task.program.send(value)
    except StopIteration as stop:
        return "stop", stop.value
    except BaseException as e:  # re-raised by the driver
        return "error", e
    task.calls += 1
    return "request", request


def settle(
    task: Task,
    outcome: tuple[str, Any],
    on_ready: Callable[[Task, Any], None],
    on_request: Callable[[Task], None],
) -> None:
    """Book a resumed task's outcome: hand its ``Generate`` to ``on_request``, start its children
    (``on_ready(child, None)``), or finish it (``on_ready(parent, results)`` when it was the last
    child its parent waited for)."""
    kind, value = outcome
    if kind == "error":
        raise value
    if kind == "stop":
        task.done, task.result = True, value
        parent = task.parent
        if parent is not None:
            parent.waiting_on -= 1
            if parent.waiting_on == 0:
                on_ready(parent, [c.result for c in parent.children])
        return
    task.request = request = value
    if isinstance(request, Generate):
        if not isinstance(request.params, SamplingParams):
            raise TypeError(f"Generate.params must be SamplingParams, got {type(request.params).__name__}")
        on_request(task)
    elif isinstance(request, Spawn):
        call = task.calls - 1
        children = [
            Task(p, parent=task, root=task.root, seed=task.seed, path=(*task.path, call, j))
            for j, p in enumerate(request.programs)
        ]
        task.children = children
        task.waiting_on = len(children)
        if not children:
            on_ready(task, [])
        for c in children:
            on_ready(c, None)
    else:
        raise TypeError(f"an agent program yielded {request!r}; expected Generate or Spawn")


def tag_temperature(gens: Sequence, params: SamplingParams) -> None:
    """Record on each generation the temperature its log-probs are of (``Turn.temperature``)."""
    for g in gens:
        g.meta.setdefault("temperature", params.temperature)


def start_roots(engine, programs: Sequence[Program], *, path_seeds: bool) -> list[Task]:
    """The root tasks of ``programs``; with ``path_seeds`` each rollout's seed is drawn from the engine."""
    seeds = engine.draw_seeds(len(programs)) if path_seeds else [0] * len(programs)
    return [Task(p, root=i, seed=s) for i, (p, s) in enumerate(zip(programs, seeds, strict=True))]


def generate_for(engine, tasks: Sequence[Task], *, path_seeds: bool) -> list[tuple[Task, Any]]:
    """Serve the tasks' pending ``Generate`` requests with whole engine calls, one per distinct
    ``SamplingParams``: ``(task, generation)`` pairs. An engine that ``answers_requests`` (the expert)
    answers the requests itself; with ``path_seeds`` every request is sampled from its path seed."""
    by_params: dict[SamplingParams, list[Task]] = {}
    for t in tasks:
        by_params.setdefault(t.request.params, []).append(t)
    done: list[tuple[Task, Any]] = []
    for params, group in by_params.items():
        if engine.answers_requests:
            gens = engine.generate_requests([t.request for t in group])
        else:
            prompts = [list(t.request.prompt_ids) for t in group]
            kw = {"seeds": [t.next_seed() for t in group]} if path_seeds else {}
            gens = engine.generate(prompts, params, **kw)
        if len(gens) != len(group):
            raise RuntimeError(f"engine returned {len(gens)} generations for {len(group)} prompts")
        tag_temperature(gens, params)
        done.extend(zip(group, gens, strict=True))
    return done
