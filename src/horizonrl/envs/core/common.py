"""Shared machinery of the tool environments.

:class:`ToolEnv` implements the turn protocol once: a message with an
``<answer>`` ends the episode, graded by :meth:`ToolEnv.grade` (the configured
``env.reward`` if one is set, else the environment's own ``check_answer``: reward
1.0 if correct, else 0.0; any tool calls in that message are not run); with
``text_answers`` a message with neither tag is itself the final answer (single-turn
QA); otherwise its ``<tool_call>`` blocks (at most
``max_calls_per_turn``) are parsed and run in order, each answered by its own
role-``tool`` message (:class:`~horizonrl.envs.core.base.EnvMessage` named after the tool,
so the chat template renders one result per call; malformed ones become error text and
set ``invalid=True``; calls past the limit get one more tool message saying so); a
message with neither gets a short user-role reminder (``invalid=True``).
``StepResult.tool_calls`` counts the calls that ran; ``info["tool_errors"]`` the
malformed or failed ones. An optional per-task ``max_steps`` ends the
episode (reward 0) after that many assistant messages, with a user message "Out of steps."
after the step's own messages.

:func:`generate_tasks` turns a per-index candidate generator into a deterministic
task list. Train and test are disjoint by construction: both splits walk the same
candidate stream and keep a candidate only if the hash of its content falls in
their bucket (:func:`split_of`: 20% test), so identical content always lands in
the same split. Answers are compared with the package's one normalizer,
:func:`horizonrl.rewards.normalize_text`.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import random
from abc import abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

from horizonrl.envs.core.base import Env, EnvMessage, StepResult, Task, is_file_task
from horizonrl.envs.core.tools import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    ToolCall,
    ToolCallError,
    error_format_hint,
    parse_answer,
    parse_tool_calls,
)
from horizonrl.rewards import exact_match

SPLITS = ("train", "test")
TEST_FRACTION = 0.2


def check_int(env: str, knob: str, value: Any, lo: int, hi: int | None = None) -> None:
    """Raise a ValueError naming ``knob`` unless ``value`` is an int in ``[lo, hi]``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        bounds = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{env}: knob {knob!r} must be an integer {bounds}, got {value!r}")


def check_bool(env: str, knob: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{env}: knob {knob!r} must be true or false, got {value!r}")


def check_optional_str(env: str, knobs: dict[str, Any], *names: str) -> None:
    """Each of ``names`` is a non-empty string or None (ValueError naming the knob otherwise)."""
    for name in names:
        v = knobs[name]
        if v is not None and not (isinstance(v, str) and v):
            raise ValueError(f"{env}: knob {name!r} must be a non-empty string or null, got {v!r}")


def check_one_of(env: str, knobs: dict[str, Any], a: str, b: str, what: str) -> None:
    """Exactly one of knobs ``a`` and ``b`` is set; ``what`` says what each is."""
    if (knobs[a] is None) == (knobs[b] is None):
        raise ValueError(
            f"{env}: give exactly one of knob {a!r} and knob {b!r} ({what}), got {a}={knobs[a]!r}, "
            f"{b}={knobs[b]!r}"
        )


def check_seconds(env: str, knob: str, value: Any) -> None:
    """``value`` is a number of seconds in (0, 3600]."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 3600:
        raise ValueError(f"{env}: knob {knob!r} must be a number of seconds in (0, 3600], got {value!r}")


def check_env_vars(env: str, knob: str, value: Any) -> None:
    """``value`` is None or maps environment-variable names to strings."""
    if value is not None and not (
        isinstance(value, dict) and all(isinstance(a, str) and isinstance(b, str) for a, b in value.items())
    ):
        raise ValueError(f"{env}: knob {knob!r} must map variable names to strings, got {value!r}")


def check_noise(noise: Any) -> float:
    """``noise`` as a float in [0, 1] (ValueError naming ``noise`` otherwise)."""
    if isinstance(noise, bool) or not isinstance(noise, int | float) or not 0.0 <= noise <= 1.0:
        raise ValueError(f"expert noise must be a number in [0, 1], got {noise!r}")
    return float(noise)


def finite_number(value: Any) -> float | None:
    """``value`` as a finite float (bools and NumPy scalars included), else None."""
    if isinstance(value, numbers.Real):
        f = float(value)
        return f if math.isfinite(f) else None
    return None


def fill_knobs(
    env: str, defaults: dict[str, Any], knobs: dict[str, Any], check: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """``defaults`` updated with ``knobs``, then ``check``-ed; ValueError naming an unknown knob."""
    for k in knobs:
        if k not in defaults:
            known = ", ".join(defaults) or "none"
            raise ValueError(f"{env}: unknown knob {k!r}; known knobs: {known}")
    full = {**defaults, **knobs}
    check(full)
    return full


def split_of(key: str) -> str:
    """``test`` for the 20% of keys whose SHA-256 falls in the test bucket, else ``train``."""
    bucket = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 16**8
    return "test" if bucket < TEST_FRACTION else "train"


Candidate = dict[str, Any]  # prompt, answer, meta, optional aliases and key (split identity)


def generate_tasks(
    env: str, n: int, *, seed: int, split: str, generate: Callable[[random.Random], Candidate | None]
) -> list[Task]:
    """``n`` unique tasks of ``split`` from the candidate stream of ``seed`` (see module docstring)."""
    if split not in SPLITS:
        raise ValueError(f"{env}: split must be one of {SPLITS}, got {split!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"{env}: n must be a non-negative integer, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"{env}: seed must be an integer, got {seed!r}")
    tasks: list[Task] = []
    seen: set[str] = set()
    attempts = 200 * n + 2000
    for i in range(attempts):
        if len(tasks) >= n:
            break
        cand = generate(random.Random(f"{env}:{seed}:{i}"))
        if cand is None:
            continue
        key = json.dumps(cand.get("key", [cand["prompt"], cand["meta"]]), sort_keys=True)
        if split_of(key) != split or key in seen:
            continue
        seen.add(key)
        full = json.dumps([cand["prompt"], cand["meta"]], sort_keys=True)
        digest = hashlib.sha256(full.encode()).hexdigest()[:12]
        meta = {"env": env, "split": split, **cand["meta"]}
        aliases = tuple(str(a) for a in cand.get("aliases", ()))
        tasks.append(Task(f"{env}-{digest}", cand["prompt"], str(cand["answer"]), aliases, meta))
    if len(tasks) < n:
        raise ValueError(
            f"{env}: could only generate {len(tasks)} unique {split} tasks of the {n} asked for "
            f"in {attempts} attempts; widen the knobs"
        )
    return tasks


class ToolEnv(Env):
    """An :class:`Env` driven by tool calls and a final ``<answer>`` (see module docstring).

    Subclasses declare ``KNOBS`` (name -> default), ``_check_knobs``, ``_generate``
    (one task candidate from an rng), ``_init_state`` (episode state from a task),
    ``_call_tool`` and ``state_key``; everything mutable lives in ``self.state``.
    ``check_answer`` is the environment's own verdict on a final answer; :meth:`grade`
    turns it (or the configured ``env.reward``) into ``(reward, success)``.
    """

    KNOBS: ClassVar[dict[str, Any]] = {}
    max_calls_per_turn: ClassVar[int] = 4
    #: a message with neither a tool call nor an <answer> is itself the final answer
    text_answers: ClassVar[bool] = False
    system_prompt: ClassVar[str] = (
        f"Solve the task with the tools. Call a tool with <tool_call>JSON</tool_call>. "
        f"Give the final answer as {ANSWER_OPEN}...{ANSWER_CLOSE}."
    )

    def __init__(self, **knobs: Any) -> None:
        super().__init__(**self.validate_knobs(knobs))

    @classmethod
    def validate_knobs(cls, knobs: dict[str, Any]) -> dict[str, Any]:
        """``knobs`` with defaults filled in; ValueError naming any unknown or bad knob."""
        return fill_knobs(cls.name, cls.KNOBS, knobs, cls._check_knobs)

    @classmethod
    def _check_knobs(cls, knobs: dict[str, Any]) -> None:
        """Raise ValueError naming the knob for any bad value."""

    @classmethod
    def make_tasks(cls, n: int, *, seed: int, split: str = "train", **knobs: Any) -> list[Task]:
        full = cls.validate_knobs(knobs)
        return generate_tasks(cls.name, n, seed=seed, split=split, generate=lambda r: cls._generate(r, full))

    @classmethod
    @abstractmethod
    def _generate(cls, rng: random.Random, knobs: dict[str, Any]) -> Candidate | None:
        """One task candidate (dict with prompt, answer, meta, optional aliases/key), None to reject."""

    @abstractmethod
    def _init_state(self, task: Task) -> dict[str, Any]:
        """Env-specific episode state for ``task`` (merged into ``self.state``)."""

    @abstractmethod
    def _call_tool(self, call: ToolCall) -> tuple[str, bool]:
        """Run a validated call; return (observation text, invalid). May set state done/success."""

    def reset(self, task: Task) -> str:
        if task.meta.get("env") != self.name:
            raise ValueError(f"task {task.id!r} is for env {task.meta.get('env')!r}, not {self.name!r}")
        if is_file_task(task) and not self.qa_style:
            raise ValueError(f"{self.name}: this environment does not run tasks from files (env.tasks)")
        self.state = {
            "task_id": task.id,
            "question": task.prompt,
            "answer": task.answer,
            "aliases": list(task.aliases),
            "turn": 0,
            "done": False,
            "success": False,
            "reward": 0.0,
            "graded": False,
            "file_task": is_file_task(task),
            "max_steps": task.meta.get("max_steps", self.knobs.get("max_steps")),
        }
        self.state.update(self._init_state(task))
        return task.prompt

    def reminder(self) -> str:
        """The user-role reply to a message with neither a tool call nor an answer."""
        return (
            f"No tool call or answer found. {error_format_hint(self.tools)} or {ANSWER_OPEN}...{ANSWER_CLOSE}"
        )

    def golds(self) -> list[str]:
        """The gold answer and its aliases of the current episode."""
        return [self.state["answer"], *self.state["aliases"]]

    def check_answer(self, answer: str) -> bool:
        """Whether the final answer is correct (normalized exact match against answer and aliases)."""
        return exact_match(answer, self.golds()) == 1.0

    def grade(self, answer: str) -> tuple[float, bool]:
        """``(reward, success)`` of a final answer: the configured reward (success: reward >= 1),
        else the environment's own :meth:`check_answer` (1.0 / 0.0)."""
        if self.answer_reward is not None:
            reward = self.answer_reward(answer, self.golds(), self.state["question"])
            return reward, reward >= 1.0
        ok = bool(self.check_answer(answer))
        return float(ok), ok

    def finish(self, answer: str) -> bool:
        """End the episode with ``answer`` graded (:meth:`grade`); returns success."""
        st = self.state
        st["done"] = st["graded"] = True
        st["reward"], st["success"] = self.grade(answer)
        return st["success"]

    def step(self, action: str) -> StepResult:
        st = self.state
        if not st:
            raise RuntimeError(f"{self.name}: call reset(task) before step()")
        if st["done"]:
            return self._result([EnvMessage("user", "The episode is over.")], invalid=True, reward=0.0)
        st["turn"] += 1
        final_answer, tool_calls, errors, invalid = None, 0, 0, False
        answer = parse_answer(action)
        calls = parse_tool_calls(action, self.tools) if answer is None else []
        if answer is None and not calls and self.text_answers:
            answer = action.strip()
        if answer is not None:
            final_answer = answer
            msgs = [EnvMessage("user", "Correct." if self.finish(answer) else "Incorrect.")]
        elif not calls:
            msgs, invalid = [EnvMessage("user", self.reminder())], True
        else:
            msgs = []  # one tool message per call, as the model's chat template answers parallel calls
            for call in calls[: self.max_calls_per_turn]:
                if isinstance(call, ToolCallError):
                    msgs.append(EnvMessage("tool", call.message, name=call.name or None))
                    errors += 1
                else:
                    text, bad = self._call_tool(call)
                    msgs.append(EnvMessage("tool", text, name=call.name))
                    tool_calls += 1
                    errors += bad
                if st["done"]:
                    break
            if len(calls) > self.max_calls_per_turn and not st["done"]:
                note = f"Only the first {self.max_calls_per_turn} tool calls were run."
                msgs.append(EnvMessage("tool", note))
            invalid = errors > 0
        if not st["done"] and st["max_steps"] is not None and st["turn"] >= st["max_steps"]:
            st["done"] = True
            msgs.append(EnvMessage("user", "Out of steps."))
        # A graded answer earns its reward; an episode won by acting (rooms, household) earns 1.0.
        reward = (st["reward"] if st["graded"] else float(st["success"])) if st["done"] else 0.0
        return self._result(
            msgs,
            invalid=invalid,
            reward=reward,
            final_answer=final_answer,
            tool_calls=tool_calls,
            info={"tool_errors": errors, "turn": st["turn"]},
        )

    def _result(self, messages: list[EnvMessage], *, invalid: bool, reward: float, **kw: Any) -> StepResult:
        st = self.state
        return StepResult(
            messages=messages,
            reward=reward,
            done=st["done"],
            success=st["success"],
            obs_key=self.state_key(),
            invalid=invalid,
            **kw,
        )
