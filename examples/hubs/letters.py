"""A small gymnasium text game for the ``gym`` adapter (docs/hubs.md): say a word with given letters.

Importing this file registers ``HorizonLetters-v0`` with gymnasium, so a config can name it with
``env.knobs.id`` after ``env.imports: [examples/hubs/letters.py]``.
"""

from __future__ import annotations

import string
from typing import ClassVar

import gymnasium
from gymnasium import spaces

LETTERS = "aeiost"


class LetterGame(gymnasium.Env):
    """Say a word that uses the target letters; only the first ``max_len`` characters count.

    A step scores the fraction of distinct target letters in those characters; its reward is the
    gain over the best score so far, so an episode's return is its best score, in [0, 1]. Solved
    (terminated, ``info["success"]``) when a word has every letter; truncated after ``max_steps``
    actions. The target comes from ``reset(seed=...)``.
    """

    metadata: ClassVar[dict] = {"render_modes": []}

    def __init__(self, letters: int = 2, max_steps: int = 2, max_len: int = 8) -> None:
        self.letters, self.max_steps, self.max_len = letters, max_steps, max_len
        self.observation_space = spaces.Text(512, charset=string.printable)
        self.action_space = spaces.Text(512, charset=string.printable)
        self.target, self.t, self.best = "", 0, 0.0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        picks = self.np_random.choice(list(LETTERS), size=self.letters, replace=False)
        self.target, self.t, self.best = "".join(sorted(picks)), 0, 0.0
        return f"Say one word with the letters {self.target}.", {"target": self.target}

    def step(self, action: str):
        self.t += 1
        hits = sorted(set(self.target) & set(action.strip().lower()[: self.max_len]))
        obs = f"You used {''.join(hits) or 'none'} of {self.target}. Try again."
        score = len(hits) / len(self.target)
        reward, self.best = max(score - self.best, 0.0), max(score, self.best)
        solved = score == 1.0
        info = {"success": solved, "target": self.target}
        return ("Solved." if solved else obs), reward, solved, self.t >= self.max_steps, info


gymnasium.register("HorizonLetters-v0", entry_point=LetterGame)
