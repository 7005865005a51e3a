"""A small OpenEnv environment server for the ``openenv`` adapter (docs/hubs.md): say a word with letters.

The same game as ``letters.py`` behind OpenEnv's ``create_app``; horizonrl starts it on 127.0.0.1
with ``env.knobs: {app: openenv_letters:app, cwd: examples/hubs}`` (or run it yourself with
``uvicorn openenv_letters:app --port 8000`` and give ``url: http://127.0.0.1:8000``).
"""

from __future__ import annotations

import os
import random
import uuid

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

LETTERS = "aeiost"


class WordAction(Action):
    message: str = Field(..., description="the word")


class WordObservation(Observation):
    text: str = Field(default="", description="what the game says")
    success: bool = Field(default=False, description="the word had every letter")


class LetterServerGame(Environment):
    """Only the first ``max_len`` characters count; reward = gain in the fraction of target letters
    used (so the return is the best fraction); done when solved or after ``max_steps`` words.
    ``fail_word`` makes a step with that word raise (for the error-path tests)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, letters: int = 2, max_steps: int = 2, max_len: int = 8, fail_word: str = "crash"):
        self.letters, self.max_steps, self.max_len, self.fail_word = letters, max_steps, max_len, fail_word
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)
        self.target, self.best = "", 0.0

    def reset(self, seed=None, episode_id=None, **kwargs) -> WordObservation:
        self.target = "".join(sorted(random.Random(seed).sample(LETTERS, self.letters)))
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        self.best = 0.0
        return WordObservation(text=f"Say a word with the letters {self.target}.", reward=0.0)

    def step(self, action: WordAction, timeout_s=None, **kwargs) -> WordObservation:
        if action.message.strip() == self.fail_word:
            raise RuntimeError("the game crashed")
        self._state.step_count += 1
        hits = sorted(set(self.target) & set(action.message.strip().lower()[: self.max_len]))
        score = len(hits) / len(self.target)
        reward, self.best = max(score - self.best, 0.0), max(score, self.best)
        solved = score == 1.0
        text = "Solved." if solved else f"You used {''.join(hits) or 'none'} of {self.target}. Try again."
        done = solved or self._state.step_count >= self.max_steps
        return WordObservation(text=text, reward=reward, done=done, success=solved)

    @property
    def state(self) -> State:
        return self._state


# sessions at once: every episode that runs concurrently holds one (LETTERS_MAX_SESSIONS to change it)
SESSIONS = int(os.environ.get("LETTERS_MAX_SESSIONS", "256"))
app = create_app(
    LetterServerGame, WordAction, WordObservation, env_name="letters", max_concurrent_envs=SESSIONS
)
