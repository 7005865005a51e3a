"""The environment protocol (DESIGN.md, "Environments").

An environment is driven by an agent loop: ``reset(task)`` returns the first
user message, ``step(action_text)`` consumes one raw assistant message and
returns a :class:`StepResult`. Tool calls inside the message are parsed by the
environment (``horizonrl.envs.tools``); a malformed call becomes an error
observation, never an exception. ``snapshot()``/``restore()`` let RTPO fork
siblings from any turn boundary; the default deep-copies ``self.state``.

Difficulty knobs are keyword arguments of both the constructor and
``make_tasks``; ``env.tasks(n, seed=..., split=...)`` generates tasks with the
knobs the instance was built with. ``state_key()`` is the canonical text of the
current environment state (the same string a step reports as ``obs_key``), so an
agent can read the key of the initial state right after ``reset``.

A *QA-style* environment (``qa_style = True``) ends an episode with a final answer
graded against ``Task.answer``/``Task.aliases``. It also runs tasks loaded from a
file (``env.tasks``, :mod:`horizonrl.envs.taskfile`: ``Task.meta["source"] ==
"file"``, the file's other columns in ``Task.meta["fields"]``; ``task_fields``
names the columns it needs) and grades with a configured reward
(``env.reward``, :meth:`Env.set_reward`) instead of its own check.
"""

from __future__ import annotations

import copy
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

#: ``reward(prediction, golds, question) -> float`` (:class:`horizonrl.rewards.AnswerReward`)
AnswerRewardFn = Callable[[str | None, Sequence[str], str], float]


@dataclass(frozen=True)
class Task:
    """One problem instance. ``prompt`` is the user message that states it."""

    id: str
    prompt: str
    answer: str
    aliases: tuple[str, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


def is_file_task(task: Task) -> bool:
    """Whether ``task`` was loaded from a task file (``env.tasks``) rather than generated."""
    return task.meta.get("source") == "file"


@dataclass
class StepResult:
    """What the environment returns for one assistant message.

    ``role`` is the chat role the observation is rendered with (``tool`` for tool
    results, ``user`` for anything else such as format reminders). ``obs_key`` is
    the text used for peer matching (CCPO/GiGPO anchor states); ``invalid`` flags an
    action the environment could not execute. Of ``info``, the agent keeps ``env_error`` (why the
    environment failed) and ``env_metrics`` (a dict of numbers: the environment's own scores of the
    episode) in ``Turn.info``.
    """

    observation: str
    reward: float = 0.0
    done: bool = False
    success: bool = False
    role: str = "tool"
    obs_key: str | None = None
    invalid: bool = False
    final_answer: str | None = None
    tool_calls: int = 0
    info: dict[str, Any] = field(default_factory=dict)


class Env(ABC):
    """Base class of every environment.

    Subclasses set ``name`` and ``tools`` (a list of :class:`horizonrl.envs.tools.Tool`),
    implement :meth:`reset`, :meth:`step`, :meth:`expert_action`, and a
    ``make_tasks`` classmethod; all mutable episode state lives in ``self.state``
    so that the default :meth:`snapshot`/:meth:`restore` are exact.
    """

    name: ClassVar[str] = "env"
    system_prompt: ClassVar[str] = "You are a helpful agent. Use the tools, then give the final answer."
    #: ends episodes with an answer graded against the task's; accepts env.tasks and env.reward
    qa_style: ClassVar[bool] = False
    #: task-file columns (beyond prompt/answer) a file task must have, read from ``meta["fields"]``
    task_fields: ClassVar[tuple[str, ...]] = ()
    #: the configured reward (:meth:`set_reward`); None grades with the environment's own check
    answer_reward: AnswerRewardFn | None = None
    #: State outside the Python object (processes, indexes, files): with ``distributed.backend=ray``
    #: such environments run in environment-worker actors (:mod:`horizonrl.envs.remote`).
    external_state: ClassVar[bool] = False

    def __init__(self, **knobs: Any) -> None:
        self.knobs = knobs
        self.state: dict[str, Any] = {}

    def set_reward(self, reward: AnswerRewardFn | None) -> None:
        """Grade final answers with ``reward(prediction, golds, question)`` (``env.reward``).

        Success then means a reward of at least 1.0. Only QA-style environments accept one.
        """
        if reward is not None and not self.qa_style:
            raise ValueError(
                f"env.reward: environment {self.name!r} does not end with a graded answer, so it takes no "
                "configured reward"
            )
        self.answer_reward = reward

    @property
    @abstractmethod
    def tools(self) -> list[Any]:
        """Tool declarations (JSON schema) rendered into the chat template."""

    @classmethod
    @abstractmethod
    def make_tasks(cls, n: int, *, seed: int, split: str = "train", **knobs: Any) -> list[Task]:
        """``n`` deterministic tasks for ``seed``; train and test splits are disjoint."""

    @abstractmethod
    def reset(self, task: Task) -> str:
        """Start an episode on ``task``; return the first user message."""

    @abstractmethod
    def step(self, action: str) -> StepResult:
        """Apply one raw assistant message."""

    @abstractmethod
    def expert_action(self, rng: random.Random, noise: float = 0.0) -> str:
        """The expert's next assistant message for the current state.

        With probability ``noise`` per decision the expert makes a plausible
        mistake (used to make imperfect demonstrations).
        """

    def tasks(self, n: int, *, seed: int, split: str = "train") -> list[Task]:
        """``make_tasks`` with the knobs this instance was constructed with."""
        return type(self).make_tasks(n, seed=seed, split=split, **self.knobs)

    def state_key(self) -> str | None:
        """Canonical text of the current environment state (peer matching); None if unsupported."""
        return None

    @property
    def can_fork(self) -> bool:
        return True

    def snapshot(self) -> Any:
        return copy.deepcopy(self.state)

    def restore(self, state: Any) -> None:
        self.state = copy.deepcopy(state)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release external resources (processes, temp dirs)."""
