"""Environments written outside horizonrl: :class:`CustomEnv` and the ``@tool`` decorator.

A user environment subclasses :class:`CustomEnv`, declares its tools as typed methods, and
registers itself::

    from horizonrl.envs import CustomEnv, register_env, tool

    @register_env("warehouse")
    class Warehouse(CustomEnv):
        def setup(self, task):                       # a new episode: fill self.state
            self.state["stock"] = dict(task.meta["fields"]["stock"])

        @tool
        def count(self, item: str) -> str:
            \"\"\"Count one item in stock.

            Args:
                item: the item's name, e.g. "apples"
            \"\"\"
            return str(self.state["stock"].get(item, 0))

The tool's JSON schema comes from the signature: the parameter names, their type hints
(``str``, ``int``, ``float``, ``bool``, ``list[...]``, ``dict``, ``Literal[...]`` for an enum,
``X | None``; ``Any`` for no check), which parameters have defaults (not required), and the
docstring: its first paragraph is the tool's description, its ``Args:`` section (Google style;
``:param name:`` works too) the parameters' descriptions. A hint outside that set, or a missing
one, is a ``TypeError`` when the class is defined. The schema is a
:class:`horizonrl.envs.core.tools.Tool`, so calls are parsed and validated by
:func:`horizonrl.envs.core.tools.parse_tool_calls` like every built-in tool (a malformed call becomes
an error observation); integer-valued floats are passed to ``int`` parameters as ints. A tool
returns text (anything else is JSON-encoded); raising :class:`ToolError` returns its message as an
error observation (the step is marked invalid), and so does any other exception (logged).

The turn protocol is :class:`horizonrl.envs.core.common.ToolEnv`'s: tool calls run, ``<answer>``
ends the episode and is graded by :meth:`CustomEnv.score` (default: the configured ``env.reward``,
else normalized exact match against the task's answer and aliases). Tasks come from ``env.tasks``
(a file; the row's other columns are in ``task.meta["fields"]``) or from a ``make_tasks``
classmethod the subclass defines. Episode state lives in ``self.state``, so the default
snapshot/restore (deep copies) are exact; ``expert_action`` is optional (only SFT demonstrations
need it). The ``qa`` environment registered here is the tool-less case: every reply is the answer.
"""

from __future__ import annotations

import inspect
import json
import logging
import random
import re
import types
import typing
from collections.abc import Callable
from typing import Any, ClassVar

from horizonrl.envs.core.base import Task
from horizonrl.envs.core.common import ToolEnv
from horizonrl.envs.core.registry import register_env
from horizonrl.envs.core.tools import Tool, ToolCall

__all__ = ["CustomEnv", "QAEnv", "ToolError", "tool", "tool_schema"]

log = logging.getLogger(__name__)

_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array"}
_TOOL_ATTR = "__horizonrl_tool__"


class ToolError(Exception):
    """Raise from a tool method to answer the call with ``Error: <message>`` (step marked invalid)."""


def _hint_schema(hint: Any, where: str) -> dict[str, Any]:
    """JSON schema of one type hint (see the module docstring for the supported hints)."""
    if hint is Any:
        return {}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _hint_schema(rest[0], where)
        raise TypeError(f"{where}: union {hint!r} is not supported; use one type or X | None")
    if origin is typing.Literal:
        kinds = {type(a) for a in args}
        if len(kinds) != 1 or next(iter(kinds)) not in _SCALARS:
            raise TypeError(f"{where}: Literal values must all be str, int, float or bool, got {args!r}")
        return {"type": _SCALARS[next(iter(kinds))], "enum": list(args)}
    if origin in (list, tuple, typing.Sequence) or hint in (list, tuple):
        schema: dict[str, Any] = {"type": "array"}
        if args and origin is not tuple:
            schema["items"] = _hint_schema(args[0], where)
        return schema
    if origin is dict or hint is dict:
        return {"type": "object"}
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    raise TypeError(
        f"{where}: unsupported type hint {hint!r}; use str, int, float, bool, list[...], dict, Literal[...], "
        "X | None or Any"
    )


_SECTION = re.compile(r"^(Args|Arguments|Parameters|Returns|Raises|Yields|Examples?|Notes?):\s*$")


def _doc_parts(doc: str | None) -> tuple[str, dict[str, str]]:
    """``(description, {param: description})`` from a Google-style (or ``:param x:``) docstring.

    The description is the first paragraph; a parameter's description is its ``name: text`` (or
    ``name (type): text``) entry in the ``Args:`` section plus any more-indented continuation lines.
    """
    lines = inspect.cleandoc(doc or "").splitlines()
    params: dict[str, str] = {}
    for line in lines:
        m = re.match(r"^:param\s+(?:\w+\s+)?(\w+):\s*(.*)$", line)
        if m:
            params[m.group(1)] = m.group(2).strip()
    head = []
    for line in lines:
        if _SECTION.match(line) or line.startswith(":param"):
            break
        head.append(line)
    first = "\n".join(head).strip().split("\n\n")[0]
    i = 0
    while i < len(lines):
        if not re.match(r"^(Args|Arguments|Parameters):\s*$", lines[i]):
            i += 1
            continue
        i += 1
        entry_indent, current = None, None
        while i < len(lines) and (not lines[i].strip() or lines[i][:1] in (" ", "\t")):
            line = lines[i]
            indent = len(line) - len(line.lstrip())
            m = re.match(r"^\s+(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
            if m and (entry_indent is None or indent <= entry_indent):
                entry_indent, current = indent, m.group(1)
                params[current] = m.group(2).strip()
            elif current is not None and line.strip():
                params[current] = f"{params[current]} {line.strip()}".strip()
            i += 1
    return " ".join(first.split()), params


def tool_schema(fn: Callable[..., Any], name: str | None = None, description: str | None = None) -> Tool:
    """The :class:`Tool` declared by method ``fn`` (its first parameter, ``self``, is skipped)."""
    qual = getattr(fn, "__qualname__", repr(fn))
    try:
        hints = typing.get_type_hints(fn)
    except Exception as e:
        raise TypeError(f"tool {qual}: cannot resolve its type hints: {e}") from None
    summary, docs = _doc_parts(fn.__doc__)
    props: dict[str, Any] = {}
    required: list[str] = []
    params = list(inspect.signature(fn).parameters.values())[1:]
    for p in params:
        where = f"tool {qual}, parameter {p.name!r}"
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise TypeError(f"{where}: tool parameters must be named (no *args, **kwargs or positional-only)")
        if p.name not in hints:
            raise TypeError(f"{where}: needs a type hint (it becomes the tool's JSON schema)")
        spec = _hint_schema(hints[p.name], where)
        if p.name in docs:
            spec["description"] = docs[p.name]
        if p.default is not inspect.Parameter.empty:
            if isinstance(p.default, str | int | float | bool):
                spec["default"] = p.default
        else:
            required.append(p.name)
        props[p.name] = spec
    schema: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        schema["required"] = required
    tool_name = name or fn.__name__
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}", tool_name):
        raise TypeError(f"tool {qual}: name {tool_name!r} must be 1-64 letters, digits, _ . -")
    return Tool(tool_name, description or summary or tool_name, schema)


def tool(
    fn: Callable[..., Any] | None = None, *, name: str | None = None, description: str | None = None
) -> Any:
    """Mark a :class:`CustomEnv` method as a tool (``@tool`` or ``@tool(name=..., description=...)``).

    The schema is built now (bad hints fail at class definition) and stored on the function.
    """

    def mark(f: Callable[..., Any]) -> Callable[..., Any]:
        setattr(f, _TOOL_ATTR, tool_schema(f, name, description))
        return f

    return mark(fn) if fn is not None else mark


def _coerce(value: Any, spec: dict[str, Any]) -> Any:
    if spec.get("type") == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    if spec.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


class CustomEnv(ToolEnv):
    """Base class of user environments (see the module docstring).

    Override :meth:`setup` (episode state), declare ``@tool`` methods, optionally :meth:`score`,
    ``make_tasks``, ``system_prompt``, ``KNOBS`` (constructor keyword arguments with defaults, given
    as ``env.knobs``), ``state_key`` and ``expert_action``.
    """

    qa_style: ClassVar[bool] = True
    _tool_methods: ClassVar[dict[str, tuple[Tool, str]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        found: dict[str, tuple[Tool, str]] = {}
        for klass in reversed(cls.__mro__):
            for attr, value in vars(klass).items():
                decl = getattr(value, _TOOL_ATTR, None)
                if isinstance(decl, Tool):
                    other = next((a for t, a in found.values() if t.name == decl.name and a != attr), None)
                    if other is not None:
                        raise TypeError(
                            f"{cls.__qualname__}: tools {other} and {attr} are both named {decl.name!r}"
                        )
                    found[decl.name] = (decl, attr)
        cls._tool_methods = found

    @property
    def tools(self) -> list[Tool]:
        return [decl for decl, _ in self._tool_methods.values()]

    # -- hooks for subclasses ------------------------------------------------------------------------

    def setup(self, task: Task) -> None:
        """Start an episode on ``task``: put its mutable state in ``self.state`` (the task's answer,
        aliases, question and turn counter are there already)."""

    def score(self, answer: str) -> float:
        """Reward of a final answer (success: >= 1.0). Default: the configured ``env.reward``, else
        normalized exact match against the task's answer and aliases."""
        return super().grade(answer)[0]

    @classmethod
    def make_tasks(cls, n: int, *, seed: int, split: str = "train", **knobs: Any) -> list[Task]:
        raise ValueError(
            f"environment {cls.name!r} has no task generator: give the tasks as a file (env.tasks) or "
            "define a make_tasks classmethod"
        )

    def expert_action(self, rng: random.Random, noise: float = 0.0) -> str:
        raise NotImplementedError(
            f"environment {self.name!r} has no scripted expert (expert_action), so demonstrations cannot "
            "be generated for it; give SFT data as a file (sft.data) or skip SFT"
        )

    # -- ToolEnv plumbing ----------------------------------------------------------------------------

    @classmethod
    def _generate(cls, rng: random.Random, knobs: dict[str, Any]) -> None:  # pragma: no cover - unused
        return None

    def _init_state(self, task: Task) -> dict[str, Any]:
        return {}

    def reset(self, task: Task) -> str:
        prompt = super().reset(task)
        self.setup(task)
        return prompt

    def grade(self, answer: str) -> tuple[float, bool]:
        reward = self.score(answer)
        if isinstance(reward, bool):
            reward = float(reward)
        if not isinstance(reward, int | float) or reward != reward or reward in (float("inf"), float("-inf")):
            raise ValueError(f"{self.name}: score() returned {reward!r}; it must be a finite number")
        return float(reward), reward >= 1.0

    def _call_tool(self, call: ToolCall) -> tuple[str, bool]:
        decl, attr = self._tool_methods[call.name]
        props = decl.parameters.get("properties", {})
        kwargs = {k: _coerce(v, props[k]) for k, v in call.arguments.items() if k in props}
        try:
            out = getattr(self, attr)(**kwargs)
        except ToolError as e:
            return f"Error: {e}", True
        except Exception as e:
            log.warning("%s: tool %s raised %s: %s", self.name, call.name, type(e).__name__, e, exc_info=True)
            return f"Error: {call.name} failed: {type(e).__name__}: {e}", True
        if isinstance(out, str):
            return out, False
        if out is None:
            return "(no output)", False
        try:
            return json.dumps(out, ensure_ascii=False), False
        except (TypeError, ValueError):
            return str(out), False


@register_env("qa")
class QAEnv(CustomEnv):
    """Single-turn question answering from a task file: the reply (or its <answer>) is the answer."""

    text_answers: ClassVar[bool] = True
    system_prompt: ClassVar[str] = "Answer the question. Reply with the answer only."

    def expert_action(self, rng: random.Random, noise: float = 0.0) -> str:
        """The gold answer (with probability ``noise`` an empty guess)."""
        return "I do not know." if rng.random() < noise else self.state["answer"]
