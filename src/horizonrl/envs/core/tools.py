"""Tool declarations and the parser of tool calls and answers in model text.

Tool calls use the Hermes/Qwen format, one JSON object per tag::

    <tool_call>{"name": "search", "arguments": {"query": "Ana"}}</tool_call>

and a final answer is ``<answer>...</answer>``. Parsing never raises: a malformed
call becomes a :class:`ToolCallError` whose ``message`` is a short observation
that says what is wrong and shows the correct format. An unterminated tag at the
very end of the text is accepted when its JSON is complete (generation stopped at
a ``</tool_call>`` stop string); any other unterminated tag is an error.

Both parsers look at the first :data:`horizonrl.textparse.MAX_TEXT_CHARS` characters
only and run in linear time (:mod:`horizonrl.textparse`); call bodies are decoded by
:func:`horizonrl.textparse.load_json`, so JSON nested deeper than ``MAX_JSON_DEPTH``
or an integer over ``MAX_JSON_INT_DIGITS`` digits is a ``too_large`` error
observation, not a ``RecursionError``/``ValueError``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from horizonrl.textparse import JSONError, cap_text, first_block, iter_blocks, load_json
from horizonrl.tool_formats import TOOL_CLOSE, TOOL_OPEN, canonical_call

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

_TYPE_NAMES = {bool: "boolean", int: "integer", float: "number", str: "string", dict: "object", list: "array"}
_EXAMPLE_VALUES = {"string": "...", "integer": 1, "number": 1, "boolean": True, "object": {}, "array": []}


@dataclass(frozen=True)
class Tool:
    """A tool the model can call. ``parameters`` is a JSON schema of type ``object``.

    Only a simple subset of JSON schema is validated: property ``type`` (object,
    string, integer, number, boolean, array), ``required`` and ``enum``. Unknown
    arguments are ignored.
    """

    name: str
    description: str
    parameters: dict[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}, hash=False
    )

    def to_schema(self) -> dict[str, Any]:
        """The OpenAI/HF function-tool format, as passed in ``tools=`` to a chat template."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def example_call(self) -> str:
        """A correctly formatted call with placeholder arguments (used in error messages)."""
        props = self.parameters.get("properties", {})
        names = self.parameters.get("required") or list(props)
        args = {}
        for arg in names:
            spec = props.get(arg, {})
            args[arg] = spec["enum"][0] if spec.get("enum") else _EXAMPLE_VALUES.get(spec.get("type"), "...")
        return format_tool_call(self.name, args)

    def validate(self, arguments: dict[str, Any]) -> str | None:
        """None if ``arguments`` fit the schema, else a short description of the problem."""
        props = self.parameters.get("properties", {})
        for arg in self.parameters.get("required", []):
            if arg not in arguments:
                return f'{self.name} is missing required argument "{arg}"'
        for arg, value in arguments.items():
            spec = props.get(arg)
            if spec is None:
                continue
            want = spec.get("type")
            if want is not None and not _type_ok(value, want):
                return f'argument "{arg}" of {self.name} must be {_article(want)}, got {_type_name(value)}'
            if "enum" in spec and value not in spec["enum"]:
                return f'argument "{arg}" of {self.name} must be one of {json.dumps(spec["enum"])}'
        return None


@dataclass(frozen=True)
class ToolCall:
    """A well-formed call of a known tool with valid arguments."""

    name: str
    arguments: dict[str, Any] = field(hash=False)


@dataclass(frozen=True)
class ToolCallError:
    """A malformed call. ``message`` is the observation shown to the model.

    ``kind`` is one of ``unterminated``, ``invalid_json``, ``too_large`` (JSON nested
    or an integer over the limits of :mod:`horizonrl.textparse`), ``not_object``,
    ``missing_name``, ``unknown_tool``, ``bad_arguments``, ``invalid_arguments``.
    """

    kind: str
    message: str
    raw: str = ""
    name: str | None = None


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The exact, parsable text of a call in the canonical syntax (what expert policies emit).

    A ``<tool_call>`` or ``</tool_call>`` inside a string is written with ``<`` as ``\\u003c`` (the
    same JSON string), so :func:`parse_tool_calls` gives back exactly ``name`` and ``arguments``.
    """
    return canonical_call(name, arguments)


def format_answer(answer: Any) -> str:
    return f"{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"


def parse_answer(text: str) -> str | None:
    """The stripped content of the first ``<answer>`` tag, or None when there is none.

    An unterminated ``<answer>`` runs to the end of the text.
    """
    text = cap_text(text)
    block = first_block(text, ANSWER_OPEN, ANSWER_CLOSE)
    return None if block is None else text[block.body_start : block.body_end].strip()


def parse_tool_calls(text: str, tools: Sequence[Tool] | None = None) -> list[ToolCall | ToolCallError]:
    """Every ``<tool_call>`` block of ``text`` in order, parsed and (when ``tools`` is given) validated.

    A block ends at its ``</tool_call>`` or, unterminated, where the next ``<tool_call>`` begins.
    """
    text = cap_text(text)
    ctx = _Context(tools)
    out: list[ToolCall | ToolCallError] = []
    for block in iter_blocks(text, TOOL_OPEN, TOOL_CLOSE):
        body = text[block.body_start : block.body_end]
        if block.closed:
            out.append(_parse_body(body, ctx))
            continue
        at_end = block.end == len(text)
        parsed = _parse_body(body, ctx) if at_end else None
        if parsed is None or (
            isinstance(parsed, ToolCallError) and parsed.kind in ("invalid_json", "not_object")
        ):
            parsed = ctx.error("unterminated", f"tool call is missing {TOOL_CLOSE}", body)
        out.append(parsed)
    return out


def error_format_hint(tools: Sequence[Tool] | None, name: str | None = None) -> str:
    """``Format: <example call>`` for tool ``name`` (or the first tool)."""
    if tools:
        tool = next((t for t in tools if t.name == name), tools[0])
        return f"Format: {tool.example_call()}"
    return f'Format: {TOOL_OPEN}{{"name": "<tool>", "arguments": {{...}}}}{TOOL_CLOSE}'


class _Context:
    """The tools of one :func:`parse_tool_calls` call, with each format hint built once (a message with
    thousands of broken calls costs one ``example_call`` per tool, not one per call)."""

    def __init__(self, tools: Sequence[Tool] | None):
        self.tools = list(tools) if tools is not None else None
        self.by_name = {t.name: t for t in self.tools} if self.tools is not None else None
        self._hints: dict[str | None, str] = {}

    def error(self, kind: str, what: str, raw: str, name: str | None = None) -> ToolCallError:
        key = name if self.by_name is not None and name in self.by_name else None
        hint = self._hints.get(key)
        if hint is None:
            hint = self._hints[key] = error_format_hint(self.tools, key)
        return ToolCallError(kind, f"Error: {what}. {hint}", raw, name)


def _shown(name: str, limit: int = 60) -> str:
    """A model-written name as quoted in an error observation: at most ``limit`` characters."""
    return name if len(name) <= limit else name[: limit - 3] + "..."


def _parse_body(body: str, ctx: _Context) -> ToolCall | ToolCallError:
    try:
        obj = load_json(body)
    except JSONError as e:
        what = "tool call is not valid JSON" if e.kind == "invalid_json" else "tool call JSON is too large"
        return ctx.error(e.kind, f"{what} ({e.msg})", body)
    if not isinstance(obj, dict):
        return ctx.error("not_object", 'tool call must be a JSON object with "name" and "arguments"', body)
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ctx.error("missing_name", 'tool call has no "name" string', body)
    by_name = ctx.by_name
    if by_name is not None and name not in by_name:
        known = ", ".join(sorted(by_name)) or "none"
        return ctx.error("unknown_tool", f'unknown tool "{_shown(name)}"; available: {known}', body)
    arguments = obj.get("arguments", {})
    if not isinstance(arguments, dict):
        return ctx.error("bad_arguments", '"arguments" must be a JSON object', body, name)
    if by_name is not None:
        problem = by_name[name].validate(arguments)
        if problem is not None:
            return ctx.error("invalid_arguments", problem, body, name)
    return ToolCall(name, arguments)


def _type_ok(value: Any, want: str) -> bool:
    if want == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if want == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    expected = {"string": str, "boolean": bool, "object": dict, "array": list}.get(want)
    return expected is None or isinstance(value, expected)


def _type_name(value: Any) -> str:
    return "null" if value is None else _TYPE_NAMES.get(type(value), type(value).__name__)


def _article(type_name: str) -> str:
    return f"an {type_name}" if type_name[0] in "aeiou" else f"a {type_name}"
