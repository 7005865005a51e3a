"""Small real text games for the ``gym`` adapter's tests: the example's gymnasium game and plain objects.

Importing this module registers ``HorizonLetters-v0`` with gymnasium (``env.imports: [helpers.gym_games]``).
"""

from __future__ import annotations

from pathlib import Path

from horizonrl.userimport import import_user_module

_letters = import_user_module(str(Path(__file__).resolve().parents[2] / "examples" / "hubs" / "letters.py"))
LetterGame, LETTERS = _letters.LetterGame, _letters.LETTERS


class Counter:
    """An old-style plain object: ``reset() -> obs``, ``step(a) -> (obs, reward, done, info)``.

    The state is a count; ``"+"`` adds one, anything else leaves it; done at ``goal`` (reward 1).
    ``fail_at`` makes the n-th step raise, ``bad_reward`` makes every reward that value.
    """

    def __init__(self, goal: int = 2, fail_at: int | None = None, bad_reward=None) -> None:
        self.goal, self.fail_at, self.bad_reward = goal, fail_at, bad_reward
        self.count, self.steps = 0, 0

    def reset(self):
        self.count, self.steps = 0, 0
        return f"count 0 of {self.goal}"

    def step(self, action: str):
        self.steps += 1
        if self.fail_at is not None and self.steps >= self.fail_at:
            raise RuntimeError("the game crashed")
        self.count += action.strip() == "+"
        done = self.count >= self.goal
        reward = self.bad_reward if self.bad_reward is not None else float(done)
        return f"count {self.count} of {self.goal}", reward, done, {}


def make_counter(**kwargs) -> Counter:
    return Counter(**kwargs)


class Unforkable(Counter):
    """A counter holding something ``deepcopy`` refuses (an open generator)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.handle = (i for i in range(3))
