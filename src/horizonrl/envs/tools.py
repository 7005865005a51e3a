"""Tool declarations and the parser of tool calls and answers in model text.

Tool calls use the Hermes/Qwen format, one JSON object per tag::

    <tool_call>{"name": "search", "arguments": {"query": "Ana"}}</tool_call>

and a final answer is ``<answer>...</answer>``. Parsing never raises: a malformed
call becomes a :class:`ToolCallError` whose ``message`` is a short observation
that says what is wrong and shows the correct format. An unterminated tag at the
very end of the text is accepted when its JSON is complete (generation stopped at
a ``</tool_call>`` stop string); any other unterminated tag is an error.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
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

    ``kind`` is one of ``unterminated``, ``invalid_json``, ``not_object``,
    ``missing_name``, ``unknown_tool``, ``bad_arguments``, ``invalid_arguments``.
    """

    kind: str
    message: str
    raw: str = ""
    name: str | None = None


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The exact, parsable text of a call (what expert policies emit)."""
    return f"{TOOL_OPEN}{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}{TOOL_CLOSE}"


def format_answer(answer: Any) -> str:
    return f"{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"


def parse_answer(text: str) -> str | None:
    """The stripped content of the first ``<answer>`` tag, or None when there is none.

    An unterminated ``<answer>`` runs to the end of the text.
    """
    start = text.find(ANSWER_OPEN)
    if start < 0:
        return None
    start += len(ANSWER_OPEN)
    end = text.find(ANSWER_CLOSE, start)
    return (text[start:] if end < 0 else text[start:end]).strip()


def parse_tool_calls(text: str, tools: Sequence[Tool] | None = None) -> list[ToolCall | ToolCallError]:
    """Every ``<tool_call>`` block of ``text`` in order, parsed and (when ``tools`` is given) validated."""
    by_name = {t.name: t for t in tools} if tools is not None else None
    out: list[ToolCall | ToolCallError] = []
    pos = 0
    while (i := text.find(TOOL_OPEN, pos)) >= 0:
        start = i + len(TOOL_OPEN)
        close = text.find(TOOL_CLOSE, start)
        nxt = text.find(TOOL_OPEN, start)
        if close >= 0 and (nxt < 0 or close < nxt):
            out.append(_parse_body(text[start:close], by_name))
            pos = close + len(TOOL_CLOSE)
            continue
        end = nxt if nxt >= 0 else len(text)
        body = text[start:end]
        parsed = _parse_body(body, by_name) if nxt < 0 else None
        if parsed is None or (
            isinstance(parsed, ToolCallError) and parsed.kind in ("invalid_json", "not_object")
        ):
            parsed = _error("unterminated", f"tool call is missing {TOOL_CLOSE}", body, by_name)
        out.append(parsed)
        pos = end
    return out


def error_format_hint(tools: Sequence[Tool] | None, name: str | None = None) -> str:
    """``Format: <example call>`` for tool ``name`` (or the first tool)."""
    if tools:
        tool = next((t for t in tools if t.name == name), tools[0])
        return f"Format: {tool.example_call()}"
    return f'Format: {TOOL_OPEN}{{"name": "<tool>", "arguments": {{...}}}}{TOOL_CLOSE}'


def _parse_body(body: str, by_name: dict[str, Tool] | None) -> ToolCall | ToolCallError:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return _error("invalid_json", f"tool call is not valid JSON ({e.msg} at char {e.pos})", body, by_name)
    if not isinstance(obj, dict):
        return _error(
            "not_object", 'tool call must be a JSON object with "name" and "arguments"', body, by_name
        )
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return _error("missing_name", 'tool call has no "name" string', body, by_name)
    if by_name is not None and name not in by_name:
        known = ", ".join(sorted(by_name)) or "none"
        return _error("unknown_tool", f'unknown tool "{name}"; available: {known}', body, by_name)
    arguments = obj.get("arguments", {})
    if not isinstance(arguments, dict):
        return _error("bad_arguments", '"arguments" must be a JSON object', body, by_name, name)
    if by_name is not None:
        problem = by_name[name].validate(arguments)
        if problem is not None:
            return _error("invalid_arguments", problem, body, by_name, name)
    return ToolCall(name, arguments)


def _error(
    kind: str, what: str, raw: str, by_name: dict[str, Tool] | None, name: str | None = None
) -> ToolCallError:
    hint = error_format_hint(list(by_name.values()) if by_name is not None else None, name)
    return ToolCallError(kind, f"Error: {what}. {hint}", raw, name)


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
