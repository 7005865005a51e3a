"""Episode-level asynchronous driver: no rollout waits for another's generation or environment step.

:func:`drive_async` runs agent programs (:mod:`horizonrl.agents.program`) with
three kinds of threads:

- the *coordinator* (the caller's thread) owns all bookkeeping: it starts
  resumptions, collects requests, and decides when the engine gets the next batch;
- ``threads`` *program threads* resume programs, so environment steps (tool calls,
  sandboxes, remote environments, an LLM judge) of different rollouts overlap with
  each other and with generation. One rollout (a root and its subagents) runs in
  at most one thread at a time, in the order its resumptions were asked for;
- one *engine thread* makes the engine calls: whenever the engine is free it takes
  every request that is waiting (one ``generate`` per distinct
  :class:`~horizonrl.inference.base.SamplingParams`, as the synchronous driver does)
  and hands each result to its program the moment the call returns.

When to start a call: at once if no program is being resumed (no request can
arrive before the engine answers); the first call waits for every rollout's first
request; any later one waits until the oldest waiting request has waited
``LINGER`` times the previous call's duration, so that requests finishing their
environment step together share a batch, but a slow environment step never holds
the engine for longer than that.

Every request is sampled with its *path seed* (:meth:`~horizonrl.agents.program.Task.next_seed`), so a
rollout's samples do not depend on which batch, or in which order, its requests reach the engine: for
the same engine seed this driver produces the rollouts the synchronous driver produces with
``path_seeds=True`` (to float rounding of different batch shapes, which moves a token only when its
uniform lies within ~1e-7 of a CDF boundary).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from horizonrl.agents.program import Program, Task, generate_for, resume, settle, start_roots, tag_temperature
from horizonrl.inference.base import Engine

#: Longest wait for more requests before a call, as a fraction of the previous call's duration.
LINGER = 0.1


def supports_async(engine: Engine) -> bool:
    """Whether ``engine`` can serve the asynchronous driver: it takes request seeds and does not
    answer requests itself (``answers_requests``: the expert engine)."""
    return bool(engine.supports_seeds) and not engine.answers_requests


@dataclass
class DriveStats:
    """Where the time of one :func:`drive_async` went (seconds)."""

    wall: float = 0.0
    engine_busy: float = 0.0
    calls: int = 0
    requests: int = 0

    @property
    def engine_idle_fraction(self) -> float:
        """Share of the wall time the engine had no call to run."""
        return 1.0 - self.engine_busy / self.wall if self.wall > 0 else 0.0


def drive_async(
    engine: Engine, programs: Sequence[Program], *, threads: int = 8, stats: DriveStats | None = None
) -> list[Any]:
    """Run ``programs`` to completion (module docstring); return their values in order.

    ``threads``: program threads (at least 1). ``stats`` (optional) is filled with the engine's busy time.
    A program's exception, or the engine's, is raised here once the threads have stopped.
    """
    return _Scheduler(engine, max(1, int(threads)), stats or DriveStats()).run(programs)


def _lineage(task: Task) -> tuple:
    """A program's requests share cached prefixes (:mod:`horizonrl.inference.prefix_store`): each is made
    after the previous one ended, so what it reuses does not depend on timing."""
    return (task.root, task.path)


class _Scheduler:
    def __init__(self, engine: Engine, threads: int, stats: DriveStats) -> None:
        self.engine = engine
        self.stats = stats
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.programs_pool = ThreadPoolExecutor(threads, thread_name_prefix="horizonrl-program")
        self.engine_pool = ThreadPoolExecutor(1, thread_name_prefix="horizonrl-engine")
        self.backlog: dict[int, deque[tuple[Task, Any]]] = {}  # per rollout, resumptions not started
        self.busy: set[int] = set()  # rollouts with a resumption running
        self.waiting: list[tuple[float, Task]] = []  # requests not yet given to the engine
        self.engine_busy = False
        self.last_call: float | None = None  # duration of the previous engine call
        self.stream = engine.open_stream()
        self.wake = threading.Condition()
        self.stopping = False

    # ------------------------------------------------------------------ resumptions

    def on_ready(self, task: Task, value: Any) -> None:
        """Resume ``task`` with ``value`` in a program thread, after its rollout's earlier resumptions."""
        self.backlog.setdefault(task.root, deque()).append((task, value))
        self._start(task.root)

    def _start(self, root: int) -> None:
        backlog = self.backlog.get(root)
        if root in self.busy or not backlog:
            return
        self.busy.add(root)
        self.programs_pool.submit(self._resume, *backlog.popleft())

    def _resume(self, task: Task, value: Any) -> None:
        self.events.put(("resumed", task, resume(task, value)))

    def on_request(self, task: Task) -> None:
        if self.stream is None:
            self.waiting.append((time.perf_counter(), task))
            return
        r = task.request
        self.stream.add(task, list(r.prompt_ids), r.params, task.next_seed(), lineage=_lineage(task))
        self.stats.requests += 1
        with self.wake:
            self.wake.notify()

    # ------------------------------------------------------------------ continuous batching

    def _stream_loop(self) -> None:
        """The engine thread with a stream: one decode step at a time while anything runs or waits."""
        stream = self.stream
        try:
            while not self.stopping:
                with self.wake:
                    while not self.stopping and not stream.pending:
                        self.wake.wait()
                    if self.stopping:
                        return
                start = time.perf_counter()
                done = stream.step()
                self.stats.engine_busy += time.perf_counter() - start  # this thread's alone until joined
                self.stats.calls += 1
                for task, gen in done:
                    tag_temperature([gen], task.request.params)
                if done:
                    self.events.put(("streamed", done, 0.0))
        except BaseException as e:  # raised by the coordinator
            self.events.put(("failed", None, e))

    # ------------------------------------------------------------------ engine calls

    def _call(self, tasks: list[Task]) -> None:
        start = time.perf_counter()
        try:
            done = generate_for(self.engine, tasks, path_seeds=True)
        except BaseException as e:  # raised by the coordinator
            self.events.put(("failed", None, e))
            return
        self.events.put(("generated", done, time.perf_counter() - start))

    def _maybe_call(self) -> float | None:
        """Start an engine call if it is time (module docstring); else how long to wait before asking."""
        if self.engine_busy or not self.waiting:
            return None
        if self.busy:
            if self.last_call is None:  # the first call waits for every rollout's first request
                return None
            left = self.waiting[0][0] + LINGER * self.last_call - time.perf_counter()
            if left > 0:
                return left
        tasks = [t for _, t in self.waiting]
        self.waiting = []
        self.engine_busy = True
        self.stats.calls += 1
        self.stats.requests += len(tasks)
        self.engine_pool.submit(self._call, tasks)
        return None

    # ------------------------------------------------------------------ coordinator

    def run(self, programs: Sequence[Program]) -> list[Any]:
        start = time.perf_counter()
        roots = start_roots(self.engine, programs, path_seeds=True)
        if self.stream is not None:
            self.engine_pool.submit(self._stream_loop)
        try:
            for t in roots:
                self.on_ready(t, None)
            while not all(t.done for t in roots):
                timeout = self._maybe_call()
                if not (self.busy or self.engine_busy or self.waiting or self.stream is not None):
                    raise RuntimeError("drive_async: programs are waiting but nothing can wake them")
                try:
                    kind, item, value = self.events.get(timeout=timeout)
                except queue.Empty:
                    continue
                self._handle(kind, item, value)
        finally:
            with self.wake:
                self.stopping = True
                self.wake.notify()
            self.programs_pool.shutdown(wait=True, cancel_futures=True)
            self.engine_pool.shutdown(wait=True, cancel_futures=True)
            if self.stream is not None:
                self.stream.close()  # requests of a failed run must not leak into the next
            self.stats.wall += time.perf_counter() - start
        return [t.result for t in roots]

    def _handle(self, kind: str, item: Any, value: Any) -> None:
        if kind == "failed":
            raise value
        if kind == "streamed":
            for task, gen in item:
                self.on_ready(task, gen)
            return
        if kind == "generated":
            self.engine_busy = False
            self.last_call = value
            self.stats.engine_busy += value
            for task, gen in item:
                self.on_ready(task, gen)
            return
        task: Task = item  # "resumed"
        self.busy.discard(task.root)
        settle(task, value, self.on_ready, self.on_request)
        if task.done and self.stream is not None:
            self.stream.forget(_lineage(task))  # the program ended
        self._start(task.root)
