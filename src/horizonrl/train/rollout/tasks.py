"""Which training tasks a step draws: :class:`TaskSampler` (``rollout.tasks_per_step`` training tasks).

Each draw is ``rng.sample(tasks, min(per_step, len(tasks)))``: distinct tasks,
uniformly without replacement, from the run's task RNG (seeded with
``train.seed``; its state is checkpointed, so a resumed run draws what an
uninterrupted one does).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from horizonrl.envs.core.base import Task


@dataclass(eq=False)
class TaskSampler:
    """Draws the tasks of one step (module docstring)."""

    tasks: Sequence[Task]
    """The pool drawn from (the run's training tasks)."""
    per_step: int
    """Tasks per draw (``rollout.tasks_per_step``; fewer when the pool is smaller)."""
    rng: random.Random
    """The RNG of the draws (the run's ``task_rng``)."""

    def sample(self) -> list[Task]:
        """The next step's tasks."""
        return self.rng.sample(self.tasks, min(self.per_step, len(self.tasks)))

    def state(self) -> Any:
        """The RNG state (what :meth:`load` restores)."""
        return self.rng.getstate()

    def load(self, state: Any) -> None:
        self.rng.setstate(state)
