"""Fair batching of concurrent generation requests over one (non-thread-safe) engine.

Requests become :class:`Job` s (one row per requested completion) in a queue served by one background
thread. Each round takes the job at the head of the queue and merges into the same engine call every
other waiting job with the same sampling parameters (up to ``max_rows`` rows), then moves them to the
back of the queue if they are not finished. Calls are cut into *slices* of ``slice_tokens`` decode
steps: unfinished rows go back to the queue with their prompt extended by what they generated so far
(the next call re-reads it). With an engine that supports ``interrupt=`` (``HFEngine``) a call runs
to the end of its budget with its KV cache and is only cut when it must be: after a slice, if another
job is waiting, or as soon as one of its merged jobs is complete; other engines are cut after every
slice. So

- a request that arrives while another is generating waits at most one slice before its rows run,
  and jobs with different sampling parameters take turns (round-robin);
- compatible requests share engine calls (continuous batching at the granularity of slices), and a
  lone request pays nothing for it;
- a job with a ``seed`` runs in fixed slices of its own, with its own random stream (saved and
  restored around each slice), so the same seeded request gives the same completions whatever else
  the server is doing.

Across slices the scheduler keeps the engine's stopping rules: a row stops at the budget
``params.max_new_tokens`` (``finish_reason="length"``), at an end-of-sequence token or at a stop
string, also one that straddles two slices (found by decoding the row's ids; the row is cut after
the token that completes it, as the engine does). Log-probs are the engine's, concatenated.

A job whose ``params.grammar`` is set (constrained decoding) continues a cut row with the engine's
``generated=`` (the row's matcher replays what it generated before); an engine that cannot resume a
grammar (``supports_grammar_resume = False``, e.g. vLLM) runs such a job's rows to the end of their
budget in one call instead of slicing them.

:attr:`Scheduler.engine_lock` is held around every engine call; hold it to keep the engine to
yourself (e.g. a trainer updating the weights the engine samples from).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from horizonrl.inference.base import Engine, SamplingParams

__all__ = ["Job", "RowState", "Scheduler"]

log = logging.getLogger(__name__)


@dataclass
class RowState:
    """One requested completion: the prompt, what has been generated so far and how it ended."""

    prompt: list[int]
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str | None = None  # None while generating; "stop" / "length" / "cancelled"
    meta: dict[str, Any] = field(default_factory=dict)
    text: str = ""  # the decode of ids (skip special tokens) once finished
    slices: int = 0

    def copy(self) -> RowState:
        return replace(
            self,
            ids=list(self.ids),
            logprobs=list(self.logprobs),
            top_logprobs=list(self.top_logprobs),
            meta=dict(self.meta),
        )


class Job:
    """A batch of rows generated together; the scheduler thread updates it, readers take snapshots."""

    def __init__(self, prompts: Sequence[Sequence[int]], params: SamplingParams, seed: int | None):
        self.rows = [RowState(list(p)) for p in prompts]
        self.params = params
        self.seed = seed
        self.rng_state: Any = None
        self.error: BaseException | None = None
        self.done = False
        self.cancelled = False
        self.submitted = time.monotonic()
        self.first_slice_at: float | None = None
        self.finished_at: float | None = None
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._listeners: list[Callable[[], None]] = []

    @property
    def key(self) -> SamplingParams:
        """Jobs with equal keys may share an engine call."""
        return replace(self.params, max_new_tokens=1)

    def live(self) -> list[RowState]:
        return [r for r in self.rows if r.finish_reason is None]

    def add_listener(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` (from the scheduler thread) after every update; at once if already done."""
        with self._lock:
            self._listeners.append(fn)
            done = self.done
        if done:
            fn()

    def snapshot(self) -> tuple[list[RowState], bool, BaseException | None]:
        with self._lock:
            return [r.copy() for r in self.rows], self.done, self.error

    def cancel(self) -> None:
        """Stop generating (the client went away); rows end with ``finish_reason="cancelled"``."""
        self.cancelled = True

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    def _notify(self) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for fn in listeners:
            try:
                fn()
            except Exception:  # a listener must not stop the scheduler
                log.exception("job listener failed")

    def _finish(self, error: BaseException | None = None) -> None:
        with self._lock:
            if error is not None:
                self.error = error
            for r in self.rows:
                if r.finish_reason is None:
                    r.finish_reason = "cancelled"
            self.done = True
            self.finished_at = time.monotonic()
        self._event.set()


def _first_stop(decode: Callable[[list[int]], str], ids: list[int], start: int, stops: Sequence[str]):
    """``(k, stop)``: the shortest prefix ``ids[:k]`` (``k > start``) whose text contains a stop string."""
    if not any(s in decode(ids) for s in stops):
        return None
    for k in range(start + 1, len(ids) + 1):
        text = decode(ids[:k])
        for s in stops:
            if s in text:
                return k, s
    return None


class Scheduler:
    """The fair batcher of the module docstring over ``engine``.

    ``tokenizer`` decodes rows that took several slices (``Generation.text`` of one slice otherwise)
    and finds stop strings that straddle slices. ``max_rows`` caps the rows merged into one engine
    call (default: the engine's ``max_batch_size``, else 16); the head job always runs whole.
    """

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any = None,
        *,
        slice_tokens: int = 32,
        max_rows: int | None = None,
    ):
        if slice_tokens < 1:
            raise ValueError(f"slice_tokens must be >= 1, got {slice_tokens}")
        self.engine = engine
        self.tokenizer = tokenizer if tokenizer is not None else getattr(engine, "tokenizer", None)
        self.slice_tokens = slice_tokens
        self.max_rows = max_rows or int(getattr(engine, "max_batch_size", 16))
        if self.max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {self.max_rows}")
        self.engine_lock = threading.RLock()
        self.stats = {"engine_calls": 0, "rows_generated": 0, "tokens_generated": 0}
        self._queue: deque[Job] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self._paused = False
        self._thread: threading.Thread | None = None

    @property
    def can_seed(self) -> bool:
        return all(hasattr(self.engine, a) for a in ("set_seed", "rng_state", "set_rng_state"))

    def submit(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, *, seed: int | None = None
    ) -> Job:
        """Queue one job of ``len(prompts)`` rows; returns at once."""
        if not prompts:
            raise ValueError("Scheduler.submit: no prompts")
        if seed is not None and not self.can_seed:
            raise ValueError("Scheduler.submit: this engine cannot be seeded")
        job = Job(prompts, params, seed)
        with self._cv:
            if self._closed:
                raise RuntimeError("the server is shutting down")
            if self._paused:
                raise RuntimeError("the engine is paused (the policy is being updated); retry later")
            self._queue.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="horizonrl-scheduler", daemon=True)
                self._thread.start()
            self._cv.notify()
        return job

    def pending(self) -> int:
        with self._cv:
            return len(self._queue)

    def pause(self) -> None:
        """Refuse new jobs, cancel the queued ones and wait for the engine call in flight to end; after
        this the engine is idle until :meth:`resume` (a trainer updates its weights meanwhile)."""
        with self._cv:
            self._paused = True
            jobs = list(self._queue)
            self._queue.clear()
        for job in jobs:
            job.cancel()
            job._finish()
            job._notify()
        with self.engine_lock:
            pass

    def resume(self) -> None:
        with self._cv:
            self._paused = False

    def close(self) -> None:
        """Stop the thread after the current slice; queued jobs end as cancelled."""
        with self._cv:
            self._closed = True
            jobs = list(self._queue)
            self._queue.clear()
            self._cv.notify_all()
        for job in jobs:
            job._finish()
            job._notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=60)

    # -- the thread --------------------------------------------------------------------------------------

    def _next_batch(self) -> tuple[list[Job] | None, list[Job]]:
        """``(batch, ended)``: the jobs of the next engine call (None once closed) and the jobs found
        cancelled at the head of the queue."""
        ended: list[Job] = []
        with self._cv:
            while True:
                while self._queue and (self._queue[0].cancelled or not self._queue[0].live()):
                    ended.append(self._queue.popleft())
                if self._closed:
                    return None, ended
                if self._queue or ended:
                    break
                self._cv.wait()
            if not self._queue:
                return [], ended
            head = self._queue.popleft()
            batch = [head]
            if head.seed is None:
                rows = len(head.live())
                for job in list(self._queue):
                    n = len(job.live())
                    compatible = job.seed is None and not job.cancelled and job.key == head.key
                    if compatible and rows + n <= self.max_rows:
                        batch.append(job)
                        rows += n
                for job in batch[1:]:
                    self._queue.remove(job)
            return batch, ended

    def _loop(self) -> None:
        while True:
            batch, ended = self._next_batch()
            for job in ended:
                job._finish()
                job._notify()
            if batch is None:
                return
            if not batch:
                continue
            try:
                self._run_slice(batch)
            except Exception as e:  # the engine failed: fail these jobs, keep serving the others
                log.exception("generation failed")
                for job in batch:
                    job._finish(e)
                    job._notify()
                continue
            requeue = []
            for job in batch:
                if job.cancelled or not job.live():
                    job._finish()
                else:
                    requeue.append(job)
                job._notify()
            with self._cv:
                if self._closed or self._paused:
                    for job in requeue:
                        job.cancel()
                        job._finish()
                        job._notify()
                else:
                    self._queue.extend(requeue)

    def _decode(self, ids: list[int], *, skip_special: bool) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special)

    def _interruptible(self, batch: list[Job], rows: int) -> bool:
        """Whether this call may run to the end of its budget and be cut when someone waits."""
        fits = rows <= int(getattr(self.engine, "max_batch_size", rows))
        return batch[0].seed is None and fits and bool(self.engine.supports_interrupt)

    def _resumes_grammar(self) -> bool:
        return bool(self.engine.supports_grammar_resume)

    def _interrupt(self, batch: list[Job], rows: list[tuple[Job, RowState]]):
        """``interrupt(steps, live)`` for the engine: stop once another job waits (after a slice), or
        as soon as one job of the batch is complete (all its rows ended or at their budget)."""
        owner = [id(job) for job, _ in rows]
        budget = {id(job): max(job.params.max_new_tokens - len(r.ids) for r in job.live()) for job in batch}

        def interrupt(steps: int, live: list[int]) -> bool:
            if steps >= self.slice_tokens and self._queue:
                return True
            if len(batch) == 1:
                return False
            alive = {owner[i] for i in live}
            return any(key not in alive or steps >= b for key, b in budget.items())

        return interrupt

    def _run_slice(self, batch: list[Job]) -> None:
        rows = [(job, row) for job in batch for row in job.live()]
        head = batch[0]
        budget = max(job.params.max_new_tokens - len(row.ids) for job, row in rows)
        interruptible = self._interruptible(batch, len(rows))
        grammar = head.params.grammar is not None
        whole = grammar and not self._resumes_grammar()  # a grammar that cannot resume is never sliced
        steps = budget if interruptible or whole else min(self.slice_tokens, budget)
        params = replace(head.params, max_new_tokens=max(1, steps))
        prompts = [row.prompt + row.ids for _, row in rows]
        extra = {"generated": [len(row.ids) for _, row in rows]} if grammar and not whole else {}
        now = time.monotonic()
        for job in batch:
            if job.first_slice_at is None:
                job.first_slice_at = now
        with self.engine_lock:
            if interruptible:
                gens = self.engine.generate(prompts, params, interrupt=self._interrupt(batch, rows), **extra)
            elif head.seed is not None:
                shared = self.engine.rng_state()
                if head.rng_state is None:
                    self.engine.set_seed(head.seed)
                else:
                    self.engine.set_rng_state(head.rng_state)
                try:
                    gens = self.engine.generate(prompts, params, **extra)
                finally:
                    head.rng_state = self.engine.rng_state()
                    self.engine.set_rng_state(shared)
            else:
                gens = self.engine.generate(prompts, params, **extra)
        self.stats["engine_calls"] += 1
        self.stats["rows_generated"] += len(rows)
        for (job, row), gen in zip(rows, gens, strict=True):
            with job._lock:
                self._update_row(job, row, gen, steps)
            self.stats["tokens_generated"] += len(gen.ids)

    def _update_row(self, job: Job, row: RowState, gen, asked: int) -> None:
        room = job.params.max_new_tokens - len(row.ids)
        take = min(len(gen.ids), room)
        start = len(row.ids)
        row.ids.extend(gen.ids[:take])
        row.logprobs.extend(gen.logprobs[:take])
        tops = gen.meta.get("top_logprobs")
        if tops:
            row.top_logprobs.extend(tops[:take])
        row.slices += 1
        single = row.slices == 1 and take == len(gen.ids)
        if gen.finish_reason == "stop" and take == len(gen.ids):
            row.finish_reason = "stop"
            if "stop" in gen.meta:
                row.meta["stop"] = gen.meta["stop"]
        elif len(row.ids) >= job.params.max_new_tokens:
            row.finish_reason = "length"
        elif not gen.meta.get("interrupted") and len(gen.ids) < min(asked, room):
            row.finish_reason = "length"  # an engine that ended a row early without saying why
        if row.finish_reason is None and job.params.stop and start > 0 and self.tokenizer is not None:
            hit = _first_stop(
                lambda ids: self._decode(ids, skip_special=False), row.ids, start, job.params.stop
            )
            if hit is not None:
                k, stop = hit
                del row.ids[k:], row.logprobs[k:]
                del row.top_logprobs[k:]
                row.finish_reason, row.meta["stop"] = "stop", stop
                single = False
        if row.finish_reason is None and job.cancelled:
            row.finish_reason = "cancelled"
        if row.finish_reason is not None:
            row.text = gen.text if single else self._decode(row.ids, skip_special=True)
