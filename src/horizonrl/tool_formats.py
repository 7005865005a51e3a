"""Tool-call syntaxes of model families: how a call is written, and how a model's text is read.

Inside horizonrl every tool call travels in one *canonical* form, the Hermes block the environments
parse (:mod:`horizonrl.envs.core.tools`)::

    <tool_call>{"name": "search", "arguments": {"query": "Ana"}}</tool_call>

A model family may have been trained on another syntax. Its :class:`ToolFormat` knows

- :meth:`~ToolFormat.format_call`: a call written exactly as the family's chat template renders a
  structured assistant ``tool_calls`` entry (used for SFT data, the gateway's tool-call messages and
  expert demonstrations, so that the ids of a rendered conversation equal what the model would emit);
- :meth:`~ToolFormat.to_canonical`: the model's text with every call it made in the family's syntax
  rewritten as a canonical block (text that holds canonical blocks already is kept as it is, so a model
  that follows an environment's own instructions is understood too). It never raises: a malformed call
  is passed on as a canonical block whose body the environment reports as an error observation.

Formats (``@register_tool_format``):

- ``hermes`` — horizonrl's tiny model and SmolLM2 (tool block injected by the renderer):
  ``<tool_call>{json}</tool_call>``;
- ``qwen`` — Qwen2.5 / Qwen3 / QwQ (Hermes with newlines, as their templates render it):
  ``<tool_call>\\n{json}\\n</tool_call>``;
- ``llama3_json`` — Llama 3.1 / 3.2 / 3.3 custom tools: the whole message is one JSON object
  ``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>``;
- ``pythonic`` — Llama 3.2 (light-weight) / Llama 4 pythonic calls: ``[search(query="Ana"), f(x=1)]``;
- ``mistral`` — Mistral instruct (v3 tokenizers): ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id":
  ...}]``, read only: Mistral's templates write a 9-character id into every call, which structured calls
  here do not carry, so writing one is refused by name.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from horizonrl.registry import Registry
from horizonrl.textparse import MAX_TEXT_CHARS

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"


def _args_json(arguments: Any) -> str:
    """Arguments as a chat template's ``tojson`` writes them; a string is taken to be JSON already."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def _escape_tags(body: str) -> str:
    """``<tool_call>``/``</tool_call>`` inside a JSON body written with ``\\u003c`` (the same JSON string)."""
    if "tool_call>" in body:
        body = body.replace(TOOL_OPEN, "\\u003c" + TOOL_OPEN[1:]).replace(
            TOOL_CLOSE, "\\u003c" + TOOL_CLOSE[1:]
        )
    return body


def canonical_call(name: str, arguments: Any) -> str:
    """The canonical block of one call (what the environments parse)."""
    body = (
        '{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": ' + _args_json(arguments) + "}"
    )
    return f"{TOOL_OPEN}{_escape_tags(body)}{TOOL_CLOSE}"


@dataclass(frozen=True)
class CallFrame:
    """How a format frames one call with JSON arguments, for decoding constrained to it: ``open``, then
    ``{"name": NAME, "<args_key>": ``, the arguments, ``close``; several calls joined by ``sep`` (None:
    one call per message)."""

    open: str
    args_key: str
    close: str
    sep: str | None

    def head(self, name: str) -> str:
        """Everything of a call to ``name`` before its arguments."""
        return self.open + '{"name": ' + json.dumps(name, ensure_ascii=False) + f', "{self.args_key}": '


class ToolFormat:
    """One family's tool-call syntax (see the module docstring)."""

    name: ClassVar[str] = "format"
    #: One-line description of the syntax (shown in ``horizonrl`` help and errors).
    syntax: ClassVar[str] = ""
    #: The frame of a call for constrained decoding (None: the syntax is not JSON and cannot be forced).
    frame: ClassVar[CallFrame | None] = None
    #: What a call may start with when it is the whole message (after leading whitespace); empty for a
    #: syntax whose calls sit in tags inside the text.
    call_starts: ClassVar[tuple[str, ...]] = ()

    def format_call(self, name: str, arguments: Any) -> str:
        raise NotImplementedError

    def join(self, content: str, calls: list[str]) -> str:
        """An assistant message's text: its content, then its calls (as the family's template joins them)."""
        text = content
        for call in calls:
            text += ("\n" if text else "") + call
        return text

    def to_canonical(self, text: str) -> str:
        return text

    def streamable(self, text: str) -> str:
        """The part of an unfinished message that is content whatever the model writes next: up to the
        first canonical block, less a suffix that may begin one; nothing while the message may still turn
        out to be a whole-message call."""
        if self.call_starts:  # a whole-message syntax
            head = text.lstrip()
            if head.startswith(PYTHON_TAG):
                head = head[len(PYTHON_TAG) :].lstrip()
            if not head or any(head.startswith(c) for c in self.call_starts) or PYTHON_TAG.startswith(head):
                return ""
        cut = text.find(TOOL_OPEN)
        if cut >= 0:
            return text[:cut]
        for k in range(min(len(TOOL_OPEN) - 1, len(text)), 0, -1):
            if text.endswith(TOOL_OPEN[:k]):
                return text[:-k]
        return text


T = type[ToolFormat]
TOOL_FORMATS: Registry[type[ToolFormat]] = Registry(
    "tool format", register_with="@register_tool_format(NAME) (horizonrl.tool_formats)"
)


def register_tool_format(name: str) -> Callable[[T], T]:
    """Class decorator: register a :class:`ToolFormat` subclass under ``name`` (sets its ``name``)."""

    def deco(cls: T) -> T:
        cls.name = name
        TOOL_FORMATS.register(name, cls)
        return cls

    return deco


def get_tool_format(name: str) -> ToolFormat:
    """The registered format ``name`` (:class:`~horizonrl.registry.UnknownNameError` names the known ones)."""
    return TOOL_FORMATS.get(name, field="tool format")()


@register_tool_format("hermes")
class HermesFormat(ToolFormat):
    syntax = '<tool_call>{"name": ..., "arguments": {...}}</tool_call>'
    frame = CallFrame(TOOL_OPEN, "arguments", "}" + TOOL_CLOSE, "\n")

    def format_call(self, name: str, arguments: Any) -> str:
        return canonical_call(name, arguments)


@register_tool_format("qwen")
class QwenFormat(ToolFormat):
    syntax = '<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>'
    frame = CallFrame(TOOL_OPEN + "\n", "arguments", "}\n" + TOOL_CLOSE, "\n")

    def format_call(self, name: str, arguments: Any) -> str:
        # Exactly the template's rendering (no escaping of tags inside strings: Qwen's templates write them).
        return f'{TOOL_OPEN}\n{{"name": "{name}", "arguments": {_args_json(arguments)}}}\n{TOOL_CLOSE}'

    # The environments' parser reads the body as JSON, so the newlines around it need no rewriting.


@register_tool_format("llama3_json")
class Llama3JsonFormat(ToolFormat):
    syntax = '{"name": ..., "parameters": {...}} (the whole message; <|python_tag|> optional)'
    frame = CallFrame("", "parameters", "}", None)
    call_starts = ("{",)

    def format_call(self, name: str, arguments: Any) -> str:
        return '{"name": "' + name + '", "parameters": ' + _args_json(arguments) + "}"

    def join(self, content: str, calls: list[str]) -> str:
        # Llama 3.1's template renders a tool-call message as the call alone, and only one call.
        if len(calls) > 1:
            raise ValueError("the llama3_json tool format holds one tool call per assistant message")
        return calls[0] if calls else content

    def to_canonical(self, text: str) -> str:
        body = text[:MAX_TEXT_CHARS].strip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG) :].strip()
        if TOOL_OPEN in text or not body.startswith("{"):
            return text  # canonical blocks, or no call at all
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError):
            return f"{TOOL_OPEN}{body}{TOOL_CLOSE}"  # the environment reports the malformed JSON
        if not isinstance(obj, dict) or "name" not in obj:
            return text  # a JSON answer, not a call
        args = obj.get("parameters", obj.get("arguments", {}))
        if not isinstance(obj["name"], str):
            return f"{TOOL_OPEN}{body}{TOOL_CLOSE}"
        return canonical_call(obj["name"], args if not isinstance(args, str) else json.dumps(args))


@register_tool_format("pythonic")
class PythonicFormat(ToolFormat):
    syntax = '[name(arg="value", n=1), other()] (the whole message)'
    call_starts = ("[",)

    def format_call(self, name: str, arguments: Any) -> str:
        args = json.loads(arguments) if isinstance(arguments, str) else arguments
        inner = ", ".join(f"{k}={_py_literal(v)}" for k, v in dict(args).items())
        return f"[{name}({inner})]"

    def join(self, content: str, calls: list[str]) -> str:
        if not calls:
            return content
        inner = ", ".join(c[1:-1] for c in calls)  # one list of calls
        return ("" if not content else content + "\n") + f"[{inner}]"

    def to_canonical(self, text: str) -> str:
        body = text[:MAX_TEXT_CHARS].strip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG) :].strip()
        if TOOL_OPEN in text or not (body.startswith("[") and body.endswith("]")):
            return text
        try:
            tree = ast.parse(body, mode="eval")
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return text
        node = tree.body
        if (
            not isinstance(node, ast.List)
            or not node.elts
            or not all(isinstance(e, ast.Call) for e in node.elts)
        ):
            return text  # a list answer, not calls
        blocks = []
        for call in node.elts:
            name = _dotted(call.func)
            try:
                if name is None or call.args:
                    raise ValueError("positional arguments")
                args = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords if kw.arg is not None}
                blocks.append(canonical_call(name, _jsonable(args)))
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                blocks.append(f"{TOOL_OPEN}{ast.get_source_segment(body, call) or ''}{TOOL_CLOSE}")
        return "".join(blocks)


MISTRAL_TAG = "[TOOL_CALLS]"


@register_tool_format("mistral")
class MistralFormat(ToolFormat):
    syntax = '[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}, ...] (read only)'
    call_starts = (MISTRAL_TAG,)

    def format_call(self, name: str, arguments: Any) -> str:
        raise ValueError(
            "tool format 'mistral' does not write structured tool calls: Mistral's chat templates give every "
            "call a 9-character id that horizonrl's structured calls do not carry, so the rendered ids "
            "would not be the template's (it reads a Mistral model's [TOOL_CALLS] output)"
        )

    def to_canonical(self, text: str) -> str:
        head = text[:MAX_TEXT_CHARS]
        at = head.find(MISTRAL_TAG)
        if at < 0 or TOOL_OPEN in head:
            return text  # no call, or canonical blocks already
        body = head[at + len(MISTRAL_TAG) :].strip()
        try:
            calls = json.loads(body)
        except (ValueError, RecursionError):
            return head[:at] + f"{TOOL_OPEN}{body}{TOOL_CLOSE}"  # the environment reports the malformed JSON
        if isinstance(calls, dict):
            calls = [calls]
        if not isinstance(calls, list) or not calls:
            return head[:at] + f"{TOOL_OPEN}{body}{TOOL_CLOSE}"
        blocks = []
        for call in calls:
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                blocks.append(f"{TOOL_OPEN}{json.dumps(call, ensure_ascii=False)}{TOOL_CLOSE}")
                continue
            args = call.get("arguments", {})
            blocks.append(
                canonical_call(call["name"], args if not isinstance(args, str) else json.dumps(args))
            )
        return head[:at] + "".join(blocks)


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _py_literal(value: Any) -> str:
    """A Python literal of a JSON value (``true`` → ``True``, ``null`` → ``None``)."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_py_literal(k)}: {_py_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_py_literal(v) for v in value) + "]"
    return repr(value)


def _jsonable(value: Any) -> Any:
    """A literal_eval result as JSON data (tuples/sets become lists; other types are refused)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"not JSON data: {type(value).__name__}")
