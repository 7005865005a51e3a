"""Progress of a held-out evaluation on stderr: tasks done / total, episodes, generated tokens/s.

The display only watches the agent programs (:func:`watched`): it yields exactly what they yield and
sends back exactly what the driver sends, so the rollouts, their order and every number are the same
with it or without it. :func:`eval_progress` turns it on for the evaluations inside a block (the run
loop does, with ``train.progress``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from horizonrl.agents.driver import Program, Spawn
from horizonrl.inference.base import Generation

#: Whether ``evaluate`` shows progress when not told (set by :func:`eval_progress`).
_EVAL_PROGRESS: ContextVar[bool] = ContextVar("horizonrl_eval_progress", default=False)


@contextmanager
def eval_progress(on: bool) -> Iterator[None]:
    """Inside the block, :func:`evaluate` shows progress (``on``) or not, unless its call says.

    The run loop wraps a trainer's ``evaluate()`` in it with ``train.progress``, so every trainer
    that evaluates through :func:`evaluate` shows the bar without passing a flag down.
    """
    token = _EVAL_PROGRESS.set(bool(on))
    try:
        yield
    finally:
        _EVAL_PROGRESS.reset(token)


class EvalProgress:
    """Evaluation progress on stderr (tqdm): tasks done / total, episodes done, generated tokens/s.

    Fed by the watched agent programs (:func:`watched`): every generation's tokens when the program
    receives them, every episode when it ends (a task is done when all its samples are). It is
    redrawn at most every ``interval`` seconds between finished tasks; it draws no random numbers
    and changes nothing the rollouts depend on. Safe to feed from the driver's program threads.
    """

    def __init__(self, tasks: int, samples: int, *, desc: str = "eval", interval: float = 0.5):
        from tqdm import tqdm

        self.samples = samples
        self.episodes_total = tasks * samples
        self.episodes = 0
        self.tokens = 0
        self.interval = interval
        self._left = [samples] * tasks
        self._lock = threading.Lock()
        self._start = self._drawn = time.perf_counter()
        # leave=None: the line stays when it is the only bar (a standalone evaluation, the one before
        # training) and is cleared when it is nested under the training bar.
        self.bar = tqdm(
            total=tasks, desc=desc, unit="task", dynamic_ncols=True, leave=None, postfix=self._stats()
        )

    def _stats(self) -> str:
        rate = self.tokens / max(time.perf_counter() - self._start, 1e-9)
        shown = f"{rate:.1f}" if rate < 100 else f"{rate:.0f}"
        return f"{self.episodes}/{self.episodes_total} episodes, {shown} tok/s"

    def _postfix(self) -> None:
        self.bar.set_postfix_str(self._stats(), refresh=False)

    def _maybe_draw(self) -> None:
        now = time.perf_counter()
        if now - self._drawn >= self.interval:
            self._drawn = now
            self.bar.refresh()

    def generated(self, n_tokens: int) -> None:
        """A program received a generation of ``n_tokens`` tokens."""
        with self._lock:
            self.tokens += n_tokens
            self._postfix()
            self._maybe_draw()

    def episode_done(self, task: int) -> None:
        """An episode of task number ``task`` ended."""
        with self._lock:
            self.episodes += 1
            self._left[task] -= 1
            self._postfix()
            if self._left[task] == 0:
                self._drawn = time.perf_counter()
                self.bar.update(1)
            else:
                self._maybe_draw()

    def close(self) -> None:
        with self._lock:
            self._postfix()
            self.bar.close()


def watched(program: Program, progress: EvalProgress, task: int | None = None) -> Program:
    """``program`` as the driver sees it, reporting to ``progress`` as it runs.

    It yields exactly the requests ``program`` yields (a :class:`Spawn`'s children watched too) and
    sends back exactly what the driver sends, so batches, samples and results are unchanged.
    ``task``: the task the episode belongs to, reported when the program ends (None for a child).
    """
    try:
        request = next(program)
    except StopIteration as stop:
        result = stop.value
    else:
        while True:
            if isinstance(request, Spawn):
                request = Spawn([watched(child, progress) for child in request.programs])
            value: Any = yield request
            if isinstance(value, Generation):
                progress.generated(len(value.ids))
            try:
                request = program.send(value)
            except StopIteration as stop:
                result = stop.value
                break
    if task is not None:
        progress.episode_done(task)
    return result


def eval_progress_on() -> bool:
    """Whether the enclosing :func:`eval_progress` block asks for progress (False outside one)."""
    return _EVAL_PROGRESS.get()
