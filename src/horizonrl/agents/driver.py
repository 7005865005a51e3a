"""Running agent programs against an engine: the round-synchronous driver and the dispatch.

Agent programs (:mod:`horizonrl.agents.program`) yield :class:`Generate` and
:class:`Spawn` requests. :func:`drive` runs many of them together with one of two
drivers, chosen by :class:`DriverOptions` (the trainer builds them from
``rollout.driver`` and passes them on :attr:`AgentSpec.driver
<horizonrl.agents.registry.AgentSpec.driver>`; default ``sync``):

- ``sync`` (round-synchronous, this module): every round gathers the pending
  ``Generate`` requests of all programs, makes one engine call per distinct
  :class:`~horizonrl.inference.base.SamplingParams` (compaction sessions run at
  their own temperature, shortened generations with their own budget), and resumes
  each program with its result. A batch of ``tasks x G`` rollouts therefore costs
  about ``max_turns`` batched engine calls whatever the context managers do, and
  children of a fork generate in the same batches as every other episode; but each
  round waits for its longest generation and its slowest environment step.
- ``async`` (episode-level, :mod:`horizonrl.agents.scheduler`): each program's
  request goes to the engine as soon as it is yielded and the program resumes
  alone when its generation returns; environment steps of different rollouts run
  concurrently in threads. Needs an engine with ``supports_seeds``.

Between engine calls the synchronous driver runs the programs' environment steps.
When those wait on another process (environments in Ray actors,
:mod:`horizonrl.envs.core.remote`) :attr:`DriverOptions.threads` may be above 1: the ready
programs are then resumed in that many threads, one rollout (a root program and
its subagents) per thread at a time, and their requests are collected in the same
order as one thread would, so the batches, and with them the samples, are the same.

Seeds: by default the synchronous driver lets the engine draw each call's seeds
(``path_seeds=False``, the behaviour every recorded result was measured with); the
asynchronous driver always uses *path seeds* (:meth:`Task.next_seed`: one seed per
rollout from the engine RNG, then one per request from its place in the rollout),
and so does the synchronous one with ``path_seeds=True``. With path seeds both
drivers sample every request from the same seed, so they produce the same rollouts.

Writing a program::

    def program(...):
        gen = yield Generate(prompt_ids, params)
        results = yield Spawn([child_a(), child_b()])
        return value
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from horizonrl.agents.program import Generate, Program, Spawn, Task, generate_for, resume, settle, start_roots
from horizonrl.agents.scheduler import drive_async, supports_async
from horizonrl.inference.base import Engine, Generation
from horizonrl.vocab import DriverMode

DRIVER_MODES = tuple(m.value for m in DriverMode)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DriverOptions:
    """How :func:`drive` runs a batch of programs (``rollout.driver`` and its thread counts; built by
    :func:`horizonrl.train.rollout.workers.driver_options`, carried on
    :attr:`AgentSpec.driver <horizonrl.agents.registry.AgentSpec.driver>`)."""

    #: ``sync`` (round by round) or ``async`` (episode by episode; module docstring).
    mode: DriverMode = DriverMode.SYNC
    #: Threads that resume programs (environment steps): under ``async`` the program threads of
    #: :func:`~horizonrl.agents.scheduler.drive_async`; under ``sync`` above 1 the rounds resume one
    #: rollout per thread, collecting requests in one thread's order (module docstring).
    threads: int = 1


def drive(
    engine: Engine,
    programs: Sequence[Program],
    options: DriverOptions | None = None,
    *,
    mode: str | None = None,
    path_seeds: bool | None = None,
) -> list[Any]:
    """Run ``programs`` to completion; return their values in order (module docstring).

    ``options``: the driver and its threads (default :class:`DriverOptions`: ``sync``, one thread);
    ``mode`` (``sync`` or ``async``), when given, overrides ``options.mode``. ``async`` on an engine that
    cannot take request seeds, or that answers requests itself (``answers_requests``), runs ``sync``.
    ``path_seeds``: sample every request from its path seed (always so under ``async``).
    """
    options = options or DriverOptions()
    mode = mode or options.mode
    if mode not in DRIVER_MODES:
        raise ValueError(f"driver mode must be one of {DRIVER_MODES}, got {mode!r}")
    threads = int(options.threads or 1)
    if mode == DriverMode.ASYNC:
        if supports_async(engine):
            return drive_async(engine, programs, threads=threads)
        _warn_sync(engine)
    if path_seeds and not supports_async(engine):
        raise ValueError(f"path seeds need an engine with supports_seeds; {type(engine).__name__} has none")
    return _drive_rounds(engine, programs, path_seeds=bool(path_seeds), threads=threads)


def _warn_sync(engine: Engine) -> None:
    name = type(engine).__name__
    if name not in _WARNED:
        _WARNED.add(name)
        log.warning("driver 'async' needs an engine with request seeds; %s runs the sync driver", name)


_WARNED: set[str] = set()


def _drive_rounds(
    engine: Engine, programs: Sequence[Program], *, path_seeds: bool, threads: int
) -> list[Any]:
    """The round-synchronous driver (module docstring)."""
    roots = start_roots(engine, programs, path_seeds=path_seeds)
    ready: deque[tuple[Task, Any]] = deque((t, None) for t in roots)
    pending: list[Task] = []

    def on_ready(task: Task, value: Any) -> None:
        ready.append((task, value))

    pool = ThreadPoolExecutor(threads) if threads > 1 and len(roots) > 1 else None
    try:
        while ready or pending:
            if pool is not None:
                _advance_threaded(pool, ready, on_ready, pending.append)
            while ready:
                task, value = ready.popleft()
                settle(task, resume(task, value), on_ready, pending.append)
            if not pending:
                break
            batch, pending = pending, []
            ready.extend(generate_for(engine, batch, path_seeds=path_seeds))
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    return [t.result for t in roots]


def _advance_threaded(pool: ThreadPoolExecutor, ready: deque, on_ready, on_request) -> None:
    """Resume every ready task, rollouts in parallel threads; bookkeeping in order (module docstring)."""
    while ready:
        batch = list(ready)
        ready.clear()
        by_root: dict[int, list[int]] = {}
        for j, (task, _) in enumerate(batch):
            by_root.setdefault(task.root, []).append(j)

        def run(js: list[int], batch=batch) -> list[tuple[int, tuple[str, Any]]]:
            return [(j, resume(*batch[j])) for j in js]

        outcomes: list[tuple[str, Any] | None] = [None] * len(batch)
        for results in pool.map(run, by_root.values()):
            for j, out in results:
                outcomes[j] = out
        for (task, _), out in zip(batch, outcomes, strict=True):
            settle(task, out, on_ready, on_request)


def run_program(engine: Engine, program: Program, options: DriverOptions | None = None) -> Any:
    """Drive a single program (convenience for tests and scripts)."""
    return drive(engine, [program], options)[0]


__all__ = [
    "DRIVER_MODES",
    "DriverOptions",
    "Generate",
    "Generation",
    "Program",
    "Spawn",
    "drive",
    "run_program",
]
