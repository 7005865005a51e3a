"""``math_python``: reasoning-gym math problems with a sandboxed ``python`` tool.

Tasks are drawn from `reasoning-gym <https://github.com/open-thought/reasoning-gym>`_
procedural datasets (default: ``gsm_symbolic`` word problems and
``basic_arithmetic`` expressions). A task is identified by its dataset, the
dataset's seed/size/config and an index, all stored in ``Task.meta``, so the
exact reasoning-gym entry is regenerated for scoring and the expert; the episode
reward is the dataset's own ``score_answer`` (1.0 when correct; e.g. 0.01 for a
wrong number in ``gsm_symbolic``), ``success`` means a score of 1.0, and
``partial_credit=False`` turns the reward into 1.0/0.0. Train and test tasks are
disjoint by question text (:func:`horizonrl.envs.core.common.generate_tasks`).

The ``python`` tool runs its ``code`` with :func:`horizonrl.envs.sandbox.run_python`
(a fresh, limited process per call; see that module and
``docs/envs/math_python.md``); the observation is what the program printed, or
``Error: ...`` for exceptions, blocked operations and exceeded limits, which also
mark the step ``invalid``. Because every call is a fresh process and nothing
persists between calls, the environment's whole state is ``self.state`` and the
default snapshot (a deep copy of it) is exact.

Tasks may also come from a file (``env.tasks``: question and answer columns); they
are graded with :func:`horizonrl.rewards.math_equivalent` unless ``env.reward``
names another reward, and the expert prints the gold answer, then answers it.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import json
import logging
import operator
import random
from fractions import Fraction
from functools import lru_cache
from typing import Any, ClassVar

from horizonrl.envs.core.base import StepResult, Task, is_file_task
from horizonrl.envs.core.common import ToolEnv, check_bool, check_int, check_noise
from horizonrl.envs.core.registry import register_env
from horizonrl.envs.core.tools import Tool, ToolCall, format_answer, format_tool_call
from horizonrl.envs.sandbox import SandboxLimits, run_python, sandbox_backend
from horizonrl.rewards import math_reward

log = logging.getLogger(__name__)

PYTHON = Tool(
    "python",
    "Run a Python 3 program in a fresh sandboxed process (no network, no files kept between calls) "
    "and return what it prints. Use print() to see results.",
    {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "e.g. print(17 * 23)"}},
        "required": ["code"],
    },
)
_LIMIT_KNOBS = {f.name: f.default for f in dataclasses.fields(SandboxLimits)} | {"max_output_chars": 2000}


@lru_cache(maxsize=32)
def _dataset(name: str, seed: int, size: int, config_json: str) -> Any:
    import reasoning_gym  # imported lazily: it takes most of a second

    return reasoning_gym.create_dataset(name, seed=seed, size=size, **json.loads(config_json))


@lru_cache(maxsize=4096)
def _entry(name: str, seed: int, size: int, config_json: str, index: int) -> dict[str, Any]:
    return _dataset(name, seed, size, config_json)[index]


def _config_json(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True)


_ARITH = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _exact_value(expression: str) -> Fraction | None:
    """The exact value of an expression of integers, ``+ - * /``, unary minus and parentheses with
    Python's precedence (``/`` is true division); ``None`` for anything else or a division by 0."""

    def ev(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
            return _ARITH[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(ast.dump(node))

    try:
        return ev(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return None


def gold_contradicts_question(name: str, entry: dict[str, Any]) -> bool:
    """True when a ``basic_arithmetic`` entry's answer is not the value of the expression it shows.

    reasoning-gym 0.1.25's expressions without parentheses (``allow_parentheses: false``) are scored
    left to right, ignoring precedence (``Calculate 28 + 37 * 83.`` has the answer 5395, not 3099),
    and a ``/`` step may swap in another divisor, or fall back to ``*``, without changing the question
    (``Calculate 13 / 92.``: answer 806). In a sample of 2000 such entries with 2-3 terms of up to 3
    digits, 40 % had an answer that contradicts the question, so a model that computes the question
    correctly (with the ``python`` tool) is scored wrong. Other datasets are not checked (False).
    """
    if name != "basic_arithmetic":
        return False
    expression = entry.get("metadata", {}).get("expression")
    value = _exact_value(expression) if isinstance(expression, str) else None
    try:
        gold = Fraction(str(entry["answer"]).strip())
    except (ValueError, ZeroDivisionError):
        return True
    return value is None or value != gold


def _wrong(answer: str, rng: random.Random) -> str:
    """A plausible wrong answer: a number shifted by a non-zero offset, else ``not <answer>``."""
    offset = rng.choice([d for d in range(-9, 10) if d])
    for kind in (int, float):
        try:
            return str(kind(answer) + offset)
        except ValueError:
            continue
    return f"not {answer}"


@register_env("math_python")
class MathPythonEnv(ToolEnv):
    """Math word problems and arithmetic from reasoning-gym with a sandboxed python tool.

    Knobs: ``datasets`` (reasoning-gym dataset names, default gsm_symbolic and
    basic_arithmetic, drawn uniformly per task); ``dataset_size`` (the pool of
    indices per dataset, reasoning-gym's ``size``), ``dataset_seed`` and
    ``dataset_config`` (per-dataset keyword arguments of
    ``reasoning_gym.create_dataset``, e.g. ``{"basic_arithmetic": {"max_terms": 3}}``);
    ``max_steps`` per episode; ``partial_credit`` (reward = the dataset's score, or
    1/0); ``drop_contradicted`` (default on: skip ``basic_arithmetic`` entries whose answer is not
    the value of their question, :func:`gold_contradicts_question`); the tool's limits ``timeout_s``,
    ``cpu_s``, ``memory_mb``, ``max_output_chars``, ``max_file_mb``, ``max_disk_mb``, ``max_files``,
    ``max_procs``, ``max_code_chars`` (see :class:`~horizonrl.envs.sandbox.SandboxLimits`); ``sandbox``
    (``auto``, ``bwrap`` or ``rlimit``).
    """

    qa_style: ClassVar[bool] = True
    KNOBS: ClassVar[dict[str, Any]] = {
        "datasets": ["gsm_symbolic", "basic_arithmetic"],
        "dataset_size": 100_000,
        "dataset_seed": 0,
        "dataset_config": {},
        "max_steps": 6,
        "partial_credit": True,
        "drop_contradicted": True,
        "sandbox": "auto",
        **_LIMIT_KNOBS,
    }
    max_calls_per_turn: ClassVar[int] = 2
    external_state: ClassVar[bool] = True  # the python tool runs sandboxed processes
    system_prompt: ClassVar[str] = (
        f"Solve the problem. You can run Python with {PYTHON.example_call()}; each call is a fresh "
        "process, so print what you need. Give the final answer as <answer>...</answer>."
    )

    def __init__(self, **knobs: Any) -> None:
        super().__init__(**knobs)
        self.limits = SandboxLimits(**{k: self.knobs[k] for k in _LIMIT_KNOBS})
        self.sandbox = sandbox_backend(self.knobs["sandbox"])
        self._statuses: list[str] = []
        log.info("math_python: python tool sandbox backend %r", self.sandbox)

    @property
    def tools(self) -> list[Tool]:
        return [PYTHON]

    @classmethod
    def _check_knobs(cls, knobs: dict[str, Any]) -> None:
        from reasoning_gym.factory import DATASETS

        names = knobs["datasets"]
        if not isinstance(names, list | tuple) or not names or not all(isinstance(n, str) for n in names):
            raise ValueError(f"{cls.name}: knob 'datasets' must be a non-empty list of names, got {names!r}")
        for n in names:
            if n not in DATASETS:
                close = difflib.get_close_matches(n, list(DATASETS), n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise ValueError(
                    f"{cls.name}: knob 'datasets' names unknown reasoning-gym dataset {n!r}{hint}"
                )
        if len(set(names)) != len(names):
            raise ValueError(f"{cls.name}: knob 'datasets' lists a dataset twice: {names!r}")
        check_int(cls.name, "dataset_size", knobs["dataset_size"], 1, 10**7)
        check_int(cls.name, "dataset_seed", knobs["dataset_seed"], 0, 2**31)
        check_int(cls.name, "max_steps", knobs["max_steps"], 1, 100)
        check_bool(cls.name, "partial_credit", knobs["partial_credit"])
        check_bool(cls.name, "drop_contradicted", knobs["drop_contradicted"])
        config = knobs["dataset_config"]
        if not isinstance(config, dict) or not all(
            k in names and isinstance(v, dict) for k, v in config.items()
        ):
            raise ValueError(
                f"{cls.name}: knob 'dataset_config' must map names listed in 'datasets' to keyword dicts, "
                f"got {config!r}"
            )
        for n, kwargs in config.items():
            if {"seed", "size"} & set(kwargs):
                raise ValueError(f"{cls.name}: knob 'dataset_config' of {n!r} may not set seed or size")
            try:
                _dataset(n, knobs["dataset_seed"], knobs["dataset_size"], _config_json(kwargs))[0]
            except Exception as e:
                raise ValueError(f"{cls.name}: knob 'dataset_config' is invalid for {n!r}: {e}") from e
        if knobs["sandbox"] not in ("auto", "bwrap", "rlimit"):
            raise ValueError(
                f"{cls.name}: knob 'sandbox' must be auto, bwrap or rlimit, got {knobs['sandbox']!r}"
            )
        try:
            SandboxLimits(**{k: knobs[k] for k in _LIMIT_KNOBS})
        except ValueError as e:
            raise ValueError(f"{cls.name}: knob {str(e).removeprefix('sandbox limit ')}") from None

    @classmethod
    def _generate(cls, rng: random.Random, knobs: dict[str, Any]) -> dict[str, Any] | None:
        name = rng.choice(list(knobs["datasets"]))
        index = rng.randrange(knobs["dataset_size"])
        config = knobs["dataset_config"].get(name, {})
        seed, size = knobs["dataset_seed"], knobs["dataset_size"]
        entry = _entry(name, seed, size, _config_json(config), index)
        if knobs["drop_contradicted"] and gold_contradicts_question(name, entry):
            return None
        meta = {
            "dataset": name,
            "index": index,
            "dataset_seed": seed,
            "dataset_size": size,
            "dataset_config": config,
            "max_steps": knobs["max_steps"],
        }
        return {
            "prompt": entry["question"],
            "answer": entry["answer"],
            "meta": meta,
            "key": entry["question"],
        }

    def _init_state(self, task: Task) -> dict[str, Any]:
        m = task.meta
        if is_file_task(task):
            return {"source": None, "calls": 0, "outputs": [], "score": 0.0}
        source = [
            m["dataset"],
            m["dataset_seed"],
            m["dataset_size"],
            _config_json(m["dataset_config"]),
            m["index"],
        ]
        return {"source": source, "calls": 0, "outputs": [], "score": 0.0}

    def entry(self) -> dict[str, Any]:
        """The reasoning-gym entry (question, answer, metadata) of the current task."""
        return _entry(*self.state["source"])

    def _call_tool(self, call: ToolCall) -> tuple[str, bool]:
        res = run_python(call.arguments["code"], self.limits, backend=self.sandbox)
        self.state["calls"] += 1
        self._statuses.append(res.status)
        if res.ok:
            self.state["outputs"].append(res.stdout.strip()[:200])
        return res.observation(), not res.ok

    def check_answer(self, answer: str) -> bool:
        """Score ``answer`` with the dataset's ``score_answer`` (kept in state); correct means 1.0.

        A file task is scored with :func:`horizonrl.rewards.math_equivalent` against its answers.
        """
        if self.state["source"] is None:
            score = math_reward(answer, self.golds())
        else:
            name = self.state["source"][0]
            dataset = _dataset(*self.state["source"][:4])
            score = float(dataset.score_answer(answer, self.entry()))
            if not 0.0 <= score <= 1.0:
                raise RuntimeError(f"reasoning-gym dataset {name!r} returned a score outside [0, 1]: {score}")
        self.state["score"] = score
        return score >= 1.0

    def grade(self, answer: str) -> tuple[float, bool]:
        """The configured reward if any; else the dataset's score (``partial_credit``) or 1/0."""
        if self.answer_reward is not None:
            return super().grade(answer)
        ok = self.check_answer(answer)
        return (self.state["score"] if self.knobs["partial_credit"] else float(ok)), ok

    def step(self, action: str) -> StepResult:
        """:meth:`ToolEnv.step` with the sandbox statuses of the turn's calls in ``info``."""
        self._statuses = []
        res = super().step(action)
        res.info.update(sandbox=self.sandbox, sandbox_status=list(self._statuses))
        return res

    def state_key(self) -> str | None:
        if not self.state:
            return None
        return f"{self.state['task_id']}|outputs={'|'.join(sorted(set(self.state['outputs'])))}"

    def expert_action(self, rng: random.Random, noise: float = 0.0) -> str:
        """Run a program that computes the answer from the task's metadata, then answer what it printed.

        The program evaluates the expression for tasks that carry one (``basic_arithmetic``,
        with reasoning-gym's floor division), else prints the answer recorded in the
        entry. With probability ``noise`` per decision the program prints a wrong value
        (the right one shifted) or the final answer is wrong.
        """
        noise = check_noise(noise)
        st = self.state
        entry = self.entry() if st["source"] is not None else {"answer": st["answer"], "metadata": {}}
        if not st["outputs"] and st["calls"] < 2:
            expression = entry["metadata"].get("expression")
            if rng.random() < noise:
                code = f"print({_wrong(entry['answer'], rng)!r})"
            elif st["source"] and st["source"][0] == "basic_arithmetic" and isinstance(expression, str):
                code = f"print({expression.replace('/', '//')})"
            else:
                code = f"answer = {entry['answer']!r}\nprint(answer)"
            return format_tool_call("python", {"code": code})
        answer = st["outputs"][-1] if st["outputs"] else entry["answer"]
        return format_answer(_wrong(answer, rng) if rng.random() < noise else answer)
