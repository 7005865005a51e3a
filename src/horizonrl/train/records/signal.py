"""Saying when a run has nothing to learn from.

A group whose rollouts all got the same reward has zero group-relative advantage: its tokens add nothing
to a GRPO-style update. When at least ``threshold`` of a step's groups are like that
(``train/zero_adv_group_rate``) for ``patience`` steps in a row, the run trains on (almost) nothing:
a small pretrained model without few-shot examples scores 0 on every episode, an easy task is solved by
every rollout. :class:`SignalWatch` counts such steps (``train/no_signal_steps`` in every record: the
current streak) and, once the streak reaches ``patience``, warns once per streak with what to change.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from horizonrl.errors import HorizonWarning

__all__ = ["SignalWatch"]

RATE_KEY = "train/zero_adv_group_rate"
STREAK_KEY = "train/no_signal_steps"


@dataclass
class SignalWatch:
    """Counts consecutive steps whose zero-advantage group rate is at least ``threshold`` (module docstring).

    ``patience`` 0 turns the watch off (no metric, no warning).
    """

    patience: int = 3
    threshold: float = 0.95
    streak: int = 0
    warned: bool = False

    def observe(self, step: int, metrics: dict) -> str | None:
        """Update the streak from one step's ``metrics`` (adds ``train/no_signal_steps`` to them); returns
        the warning text when this step completes a streak of ``patience`` steps, else None."""
        rate = metrics.get(RATE_KEY)
        if not self.patience or rate is None:
            return None
        if rate >= self.threshold:
            self.streak += 1
        else:
            self.streak, self.warned = 0, False
        metrics[STREAK_KEY] = float(self.streak)
        if self.streak < self.patience or self.warned:
            return None
        self.warned = True
        text = (
            f"steps {step - self.streak + 1}-{step}: at least {self.threshold:.0%} of the groups had zero "
            f"advantage (every rollout of a task got the same reward, mean reward "
            f"{metrics.get('reward/mean', float('nan')):.3f}) for {self.streak} steps in a row, so the "
            "update learns (almost) nothing. Where no rollout succeeds: add rollout.few_shot examples, raise "
            "rollout.group_size, or make the tasks easier (env.knobs); where every rollout succeeds: make "
            "them harder (train.no_signal_steps=0 silences this)."
        )
        warnings.warn(text, HorizonWarning, stacklevel=2)
        return text

    def state(self) -> dict[str, int]:
        """The streak for a checkpoint (:meth:`load` restores it)."""
        return {"streak": self.streak, "warned": int(self.warned)}

    def load(self, state: dict) -> None:
        self.streak, self.warned = int(state.get("streak", 0)), bool(state.get("warned", 0))
