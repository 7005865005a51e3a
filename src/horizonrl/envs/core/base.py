"""The environment protocol (docs/design.md, "Environments").

An environment is driven by an agent loop: ``reset(task)`` returns the first
user message, ``step(action_text)`` consumes one raw assistant message and
returns a :class:`StepResult`, whose reply is one string or a list of
:class:`EnvMessage` (one per tool call answered, then any user message), each
rendered as its own chat message. Tool calls inside the message are parsed by the
environment (``horizonrl.envs.core.tools``); a malformed call becomes an error
observation, never an exception. ``snapshot()``/``restore()`` let RTPO fork
siblings from any turn boundary; the default deep-copies ``self.state``.

Difficulty knobs are keyword arguments of both the constructor and
``make_tasks``; ``env.tasks(n, seed=..., split=...)`` generates tasks with the
knobs the instance was built with. ``state_key()`` is the canonical text of the
current environment state (the same string a step reports as ``obs_key``), so an
agent can read the key of the initial state right after ``reset``.

A *QA-style* environment (``qa_style = True``) ends an episode with a final answer
graded against ``Task.answer``/``Task.aliases``. It also runs tasks loaded from a
file (``env.tasks``, :mod:`horizonrl.envs.core.taskfile`: ``Task.meta["source"] ==
"file"``, the file's other columns in ``Task.meta["fields"]``; ``task_fields``
names the columns it needs) and grades with a configured reward
(``env.reward``, :meth:`Env.set_reward`) instead of its own check.
"""

from __future__ import annotations

import copy
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
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


#: The roles an environment message may have: a tool's result, or anything else the environment says.
ENV_ROLES = ("tool", "user")


@dataclass(frozen=True)
class EnvMessage:
    """One message an environment adds to the conversation after an assistant turn.

    A step that answers several tool calls returns one message per call, so each is rendered as the
    model family's chat template renders a conversation with several tool messages in a row (Qwen: one
    ``<tool_response>`` block per call; Llama 3.1: one ``ipython`` turn per call) instead of one text
    that joins them. Constructing a message with a bad field is a ValueError naming the field and value.
    """

    role: str
    """``tool`` (the result of a tool call) or ``user`` (anything else: a reminder, a simulated user's
    reply, a grading verdict). Decides the chat role the message is rendered with."""

    content: str
    """The message's text, rendered verbatim (may be empty)."""

    tool_call_id: str | None = None
    """The id of the call this message answers, when the assistant's calls carry ids (OpenAI-style hubs
    such as ``verifiers``); passed to the chat template, which may render it. None for Hermes calls,
    which have no ids. Only tool messages have one."""

    name: str | None = None
    """The name of the tool whose result this is (None for a malformed call, or a user message); passed
    to the chat template and kept in the rollout record."""

    def __post_init__(self) -> None:
        if self.role not in ENV_ROLES:
            raise ValueError(f"EnvMessage.role must be one of {ENV_ROLES}, got {self.role!r}")
        if not isinstance(self.content, str):
            raise ValueError(
                f"EnvMessage.content must be a string, got {type(self.content).__name__} {self.content!r:.80}"
            )
        for key in ("tool_call_id", "name"):
            value = getattr(self, key)
            if value is not None and not (isinstance(value, str) and value):
                raise ValueError(f"EnvMessage.{key} must be a non-empty string or None, got {value!r}")
        if self.tool_call_id is not None and self.role != "tool":
            raise ValueError(
                f"EnvMessage.tool_call_id={self.tool_call_id!r} is set on a {self.role!r} message; only tool "
                "messages answer a call"
            )

    def to_chat(self) -> dict[str, str]:
        """The message as a chat-template message dict: ``role``, ``content`` and the set optional keys."""
        out = {"role": self.role, "content": self.content}
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out

    @classmethod
    def coerce(cls, value: Any, where: str = "message") -> EnvMessage:
        """``value`` as an :class:`EnvMessage`: one already, or a mapping with ``role`` and ``content`` (and
        optionally ``tool_call_id``, ``name``). ValueError naming ``where`` and the bad key otherwise."""
        if isinstance(value, EnvMessage):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(
                f"{where} must be an EnvMessage or a mapping with 'role' and 'content', got "
                f"{type(value).__name__} {value!r:.80}"
            )
        unknown = sorted(set(value) - {"role", "content", "tool_call_id", "name"})
        missing = [k for k in ("role", "content") if k not in value]
        if unknown or missing:
            raise ValueError(
                f"{where}: keys must be role, content and optionally tool_call_id, name; "
                f"missing {missing}, unknown {unknown}"
            )
        try:
            return cls(**value)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None


@dataclass
class StepResult:
    """What the environment returns for one assistant message.

    The environment's reply is either one text (``observation`` with ``role``: every environment before
    this field existed, and any custom one that returns one string) or a list of messages
    (``messages``): one per tool call answered, plus any user message after them. Either way both views
    are filled after construction: ``messages`` holds at least one message (a plain string becomes one
    message with ``role``), ``observation`` is the messages' contents joined by newlines (what logs,
    summaries and peer matching read) and ``role`` is ``tool`` when every message is a tool result,
    else ``user``. The agent renders ``messages``, never the joined text, so a step that answered two
    calls shows the model two tool results, as the chat template would.

    The generic fields (``observation``/``messages``, ``role``, ``reward``, ``done``, ``success``,
    ``info``) drive every agent loop. The others are extras that particular readers use, kept as
    plain fields so that every environment constructs a step the same way: ``obs_key`` (the anchor
    state of CCPO, GiGPO and HGPO), ``invalid`` (their invalid-action penalty, the step-wise agent's
    ``invalid_reason`` and a rollout metric), ``final_answer`` (the rollout's answer, for QA-style
    environments and records) and ``tool_calls`` (a rollout metric). The agent copies each onto the
    :class:`~horizonrl.trajectory.Turn` (or :class:`~horizonrl.trajectory.Rollout`) field of the same
    name.
    """

    observation: str = ""
    """The reply as one text. Given alone: the whole reply, one message with ``role``. With
    ``messages``: leave it empty (it becomes their contents joined by newlines)."""

    reward: float = 0.0
    """The reward of this step (most environments pay only on the step that ends the episode)."""

    done: bool = False
    """Whether the episode ended with this step (the reply is then recorded but not rendered)."""

    success: bool = False
    """Whether the ended episode solved its task (read when ``done``)."""

    role: str = "tool"
    """The chat role of a one-text reply (``tool`` for tool results, ``user`` for anything else such as
    format reminders); with ``messages`` it is derived: ``tool`` if all are tool results, else ``user``."""

    obs_key: str | None = None
    """The canonical key of the state after this step (``Turn.obs_key``; :meth:`Env.state_key`). Read by
    CCPO, GiGPO and HGPO as the anchor state with ``obs_key=state|turn``; None: no key."""

    invalid: bool = False
    """Whether the action could not be executed (malformed or failed call, no call and no answer);
    ``Turn.invalid``, read by CCPO and GiGPO (penalty ``eta``) and the ``invalid_turn_rate`` metric."""

    final_answer: str | None = None
    """The episode's final answer when this step gave one (``Rollout.final_answer``, kept in records)."""

    tool_calls: int = 0
    """How many tool calls of the action ran (``Turn.tool_calls``, the ``tool_calls_mean`` metric)."""

    info: dict[str, Any] = field(default_factory=dict)
    """Anything else. The agent keeps ``env_error`` (why the environment failed) and ``env_metrics`` (a
    dict of numbers: the environment's own scores of the episode) in ``Turn.info``."""

    messages: Sequence[EnvMessage] = ()
    """The reply as separate messages, in order (:class:`EnvMessage`; mappings with ``role`` and
    ``content`` are accepted and converted). Empty: one message made from ``observation`` and ``role``.
    After construction, a non-empty tuple."""

    def __post_init__(self) -> None:
        if not isinstance(self.observation, str):
            several = isinstance(self.observation, list | tuple)
            hint = " (several messages go in StepResult.messages)" if several else ""
            raise ValueError(
                f"StepResult.observation must be a string, got {type(self.observation).__name__} "
                f"{self.observation!r:.80}{hint}"
            )
        if isinstance(self.messages, str | bytes | Mapping) or not isinstance(self.messages, Sequence):
            raise ValueError(
                f"StepResult.messages must be a list of EnvMessage, got {type(self.messages).__name__} "
                f"{self.messages!r:.80}"
            )
        if not self.messages:
            if self.role not in ENV_ROLES:
                raise ValueError(f"StepResult.role must be one of {ENV_ROLES}, got {self.role!r}")
            self.messages = (EnvMessage(self.role, self.observation),)
            return
        msgs = tuple(EnvMessage.coerce(m, f"StepResult.messages[{i}]") for i, m in enumerate(self.messages))
        joined = "\n".join(m.content for m in msgs)
        if self.observation not in ("", joined):
            raise ValueError(
                f"StepResult: give the reply as observation={self.observation!r:.60} or as messages, "
                "not both "
                f"(observation is derived from messages: {joined!r:.60})"
            )
        self.messages, self.observation = msgs, joined
        self.role = "tool" if all(m.role == "tool" for m in msgs) else "user"

    def chat_messages(self) -> list[dict[str, str]]:
        """The reply as chat-template message dicts (:meth:`EnvMessage.to_chat`), in order."""
        return [m.to_chat() for m in self.messages]

    @property
    def has_user_message(self) -> bool:
        """Whether the reply holds a user message (a new query for templates that drop earlier thinking)."""
        return any(m.role == "user" for m in self.messages)


class Env(ABC):
    """Base class of every environment.

    Subclasses set ``name`` and ``tools`` (a list of :class:`horizonrl.envs.core.tools.Tool`),
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
    #: such environments run in environment-worker actors (:mod:`horizonrl.envs.core.remote`).
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
