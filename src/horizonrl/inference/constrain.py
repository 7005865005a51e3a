"""Grammar-constrained decoding: grammars for forced tool calls and JSON output, and token masks.

The grammars are `llguidance <https://github.com/guidance-ai/llguidance>`_ Lark grammars (text, so a
:class:`~horizonrl.inference.base.SamplingParams` carries one as ``grammar``) with embedded
``%json {...}`` JSON-schema sub-grammars. They spell out exactly what the chat template renders:

- a tool call is written in the model family's syntax (its :class:`~horizonrl.tool_formats.CallFrame`;
  the default, Hermes, is ``<tool_call>{"name": "NAME", "arguments": ARGS}</tool_call>``; Qwen's puts
  newlines inside the tags; Llama 3's is the bare ``{"name": "NAME", "parameters": ARGS}``, one per
  message), where ``ARGS`` is ``json.dumps`` of the arguments (``", "`` between items, ``": "`` after
  keys, no other whitespace) and must match the tool's ``parameters`` schema; several calls are
  separated by the frame's separator (``"\\n"``);
- the assistant message then ends with the template's end-of-turn token (``<|im_end|>``).

Tokens the tokenizer never splits (its added tokens, e.g. ``<tool_call>``, ``</tool_call>``,
``<|im_end|>``) are matched as those tokens (``<[id]>``), as the template's text tokenizes, never
spelled out in pieces.

:class:`GrammarBuilder` builds :class:`Constraint` s (an assistant-message prefill placed in the prompt,
and the grammar of what follows it) without llguidance; :func:`check_grammar` validates one (needs
llguidance); :class:`GrammarVocab` / :class:`RowMatchers` give engines per-row token masks. Nothing here
imports torch.

llguidance is in the ``serve`` extra; without it :func:`require_llguidance` raises
:class:`ConstraintUnavailable` naming ``pip install 'horizonrl[serve]'``.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from horizonrl.tool_formats import CallFrame, HermesFormat

__all__ = [
    "JSON_STYLE",
    "Constraint",
    "ConstraintError",
    "ConstraintUnavailable",
    "GrammarBuilder",
    "GrammarVocab",
    "RowMatchers",
    "check_grammar",
    "require_llguidance",
]

INSTALL_HINT = "pip install 'horizonrl[serve]'"

#: llguidance JSON options matching ``json.dumps`` defaults (and the chat template's ``tojson``).
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

#: The schema of a tool declared without ``parameters`` (OpenAI: "an empty parameter list").
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}

_MAX_ERROR_CHARS = 400


class ConstraintUnavailable(ImportError):
    """llguidance is not installed."""


class ConstraintError(ValueError):
    """A constraint that cannot be built: ``param`` names the request field, ``message`` says why."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param, self.message = param, message


def require_llguidance():
    """The ``llguidance`` module (with its ``hf``, ``numpy`` helpers), else :class:`ConstraintUnavailable`."""
    try:
        import llguidance
        import llguidance.hf
        import llguidance.numpy
    except ImportError as e:
        raise ConstraintUnavailable(
            f"constrained decoding needs the llguidance package ({e}): {INSTALL_HINT}"
        ) from e
    return llguidance


def _short(message: str) -> str:
    """The first line of an llguidance error without its ``at L(C): `` position (the grammar is ours)."""
    lines = []
    for line in message.splitlines():
        if re.match(r"\s*\d+ \|", line):  # the grammar excerpt llguidance appends
            break
        lines.append(line)
    text = " ".join(re.sub(r"^\s*at \d+\(\d+\):\s*", "", "\n".join(lines) or message).split())
    return text if len(text) <= _MAX_ERROR_CHARS else text[: _MAX_ERROR_CHARS - 3] + "..."


def check_grammar(grammar: str, param: str, what: str = "grammar") -> None:
    """Raise :class:`ConstraintError` (naming ``param``) if llguidance rejects ``grammar``."""
    lg = require_llguidance()
    try:
        error = lg.LLMatcher.validate_grammar(grammar)
    except Exception as e:  # API-level failures (e.g. a schema that is not JSON)
        error = f"{type(e).__name__}: {e}"
    if error:
        raise ConstraintError(param, f"invalid {what}: {_short(error)}")


@dataclass(frozen=True)
class Constraint:
    """What a request forces: ``prefill`` starts the assistant message (it goes into the prompt) and
    ``grammar`` (llguidance Lark) constrains every sampled token after it, end of turn included."""

    prefill: str
    grammar: str
    forced_call: bool = False


#: Horizonrl's canonical Hermes frame (the tiny model's and SmolLM2's syntax).
DEFAULT_FRAME: CallFrame = HermesFormat.frame  # type: ignore[assignment]


def _lark_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


class GrammarBuilder:
    """Grammars in the chat template's exact syntax (module docstring).

    ``eos_id`` is the end-of-turn token; ``atomic`` maps the text of every token the tokenizer never
    splits (its added tokens) to its id. Every schema is checked on its own with llguidance (so an
    invalid one is a :class:`ConstraintError` naming its field) unless ``check=False``.
    """

    def __init__(self, eos_id: int, atomic: Mapping[str, int] | None = None, *, check: bool = True):
        self.eos_id = int(eos_id)
        self.atomic = {str(k): int(v) for k, v in (atomic or {}).items() if k}
        self.check = check
        keys = sorted(self.atomic, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(re.escape(k) for k in keys) + ")") if keys else None

    @classmethod
    def from_tokenizer(cls, tokenizer, eos_id: int, *, check: bool = True) -> GrammarBuilder:
        """The builder for a Hugging Face tokenizer: its added tokens are atomic."""
        decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
        atomic = {tok.content: int(i) for i, tok in decoder.items() if getattr(tok, "content", "")}
        return cls(eos_id, atomic, check=check)

    # -- pieces ------------------------------------------------------------------------------------------

    def literal(self, text: str) -> str:
        """A Lark expression matching exactly ``text`` as the tokenizer encodes it (atomic tokens as ids)."""
        if not text:
            return '""'
        parts = self._split.split(text) if self._split is not None else [text]
        out = []
        for k, part in enumerate(parts):
            if not part:
                continue
            out.append(f"<[{self.atomic[part]}]>" if k % 2 else _lark_string(part))
        return " ".join(out)

    @property
    def eos(self) -> str:
        return f"<[{self.eos_id}]>"

    def json_schema(self, schema: Any, param: str) -> str:
        """``%json {...}``: ``schema`` with the template's JSON spacing (checked on its own)."""
        if schema is True:
            schema = {}
        if not isinstance(schema, Mapping):
            raise ConstraintError(param, f"a JSON schema must be an object, got {type(schema).__name__}")
        style = schema.get("x-guidance")
        style = {**JSON_STYLE, **(style if isinstance(style, Mapping) else {})}
        body = json.dumps({**schema, "x-guidance": style}, ensure_ascii=False)
        if self.check:
            check_grammar(f"start: %json {body}", param, "JSON schema")
        return f"%json {body}"

    # -- constraints -------------------------------------------------------------------------------------

    def _call_rules(
        self, tools: Sequence[Mapping[str, Any]], names: Sequence[str], frame: CallFrame
    ) -> list[str]:
        """One rule per named tool: the frame's call to it after the opening (``{"name": "NAME",
        "arguments": ARGS}</tool_call>`` in the Hermes frame)."""
        index = {_tool_name(t): (i, t) for i, t in enumerate(tools)}
        rules = []
        for k, name in enumerate(names):
            i, tool = index[name]
            params = (tool.get("function") or {}).get("parameters")
            args = self.json_schema(
                NO_PARAMETERS if params is None else params, f"tools.{i}.function.parameters"
            )
            head = self.literal(frame.head(name)[len(frame.open) :])
            rules.append(f"call_{k}: {head} args_{k} {self.literal(frame.close)}\nargs_{k}: {args}")
        return rules

    def _calls(self, frame: CallFrame, parallel: bool) -> str:
        """``body`` after the frame's first opening, then more calls if ``parallel`` and the frame allows."""
        if not parallel or frame.sep is None:
            return "body"
        return f"body ({self.literal(frame.sep + frame.open)} body)*"

    def tool_calls(
        self,
        tools: Sequence[Mapping[str, Any]],
        choice: str | Mapping[str, Any],
        *,
        parallel: bool = True,
        frame: CallFrame = DEFAULT_FRAME,
    ) -> Constraint:
        """A forced call in ``frame``'s syntax: ``choice`` is ``"required"`` (one call to any of ``tools``,
        or several separated by the frame's separator when ``parallel`` and the frame allows several) or
        ``{"type": "function", "function": {"name": NAME}}`` (exactly one call to NAME). The prefill is
        the frame's opening (``<tool_call>`` in Hermes; plus ``{"name": "NAME", "arguments":`` for a
        named tool, without the space that the tokenizer joins to the arguments); the grammar is the
        rest of the call(s), then end of turn."""
        names = [_tool_name(t) for t in tools]
        if not names:
            raise ConstraintError("tool_choice", "a forced tool call needs tools")
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise ConstraintError("tools", f"two tools are named {dup!r}")
        if choice == "required":
            rules = self._call_rules(tools, names, frame)
            body = " | ".join(f"call_{k}" for k in range(len(names)))
            start = f"start: {self._calls(frame, parallel)} {self.eos}"
            grammar = "\n".join([start, f"body: {body}", *rules])
            return Constraint(frame.open, grammar + "\n", forced_call=True)
        if not isinstance(choice, Mapping):
            raise ConstraintError("tool_choice", f"cannot force a call with tool_choice={choice!r}")
        name = str((choice.get("function") or {}).get("name", ""))
        if name not in names:
            raise ConstraintError("tool_choice.function.name", f"{name!r} is not one of the tools {names}")
        i = names.index(name)
        params = (tools[i].get("function") or {}).get("parameters")
        args = self.json_schema(NO_PARAMETERS if params is None else params, f"tools.{i}.function.parameters")
        # The prefill stops before the space after the key: the tokenizer joins that space with the
        # brace of the arguments (" {"), so the grammar samples it as the template's text tokenizes.
        head = frame.head(name)
        prefill = head.rstrip(" ")
        space = f"{self.literal(head[len(prefill) :])} " if len(prefill) < len(head) else ""
        grammar = f"start: {space}args {self.literal(frame.close)} {self.eos}\nargs: {args}\n"
        return Constraint(prefill, grammar, forced_call=True)

    def json_output(
        self,
        schema: Any = None,
        *,
        param: str = "response_format.json_schema.schema",
        tools: Sequence[Mapping[str, Any]] | None = None,
        frame: CallFrame | None = DEFAULT_FRAME,
    ) -> Constraint:
        """Content that is one JSON value matching ``schema`` (None: any JSON object), then end of turn.

        With ``tools`` (``tool_choice: auto``) and a ``frame`` the message may instead be tool calls in
        the frame's syntax, so the model can still call a tool (``frame=None``: the family's calls are
        not JSON, the content must be).
        """
        schema = {"type": "object"} if schema is None else schema
        names = [_tool_name(t) for t in tools or ()]
        callable_ = bool(names) and frame is not None and len(set(names)) == len(names)
        if callable_ and not frame.open:
            # A bare JSON call (Llama 3) is itself a JSON object: one JSON grammar takes the content or a
            # call (two lexemes that both start with '{' would be ambiguous to the lexer).
            calls = [_call_schema(t, n, frame.args_key) for t, n in zip(tools or (), names, strict=True)]
            body = self.json_schema({"anyOf": [schema, *calls]}, param)
            return Constraint("", f"start: content {self.eos}\ncontent: {body}\n")
        body = self.json_schema(schema, param)
        alternatives = "content"
        rules = [f"content: {body}"]
        if callable_:
            rules += self._call_rules(tools, names, frame)
            calls = " | ".join(f"call_{k}" for k in range(len(names)))
            rules.append(f"calls: {self.literal(frame.open)} {self._calls(frame, True)}")
            rules.append(f"body: {calls}")
            alternatives = "content | calls"
        grammar = "\n".join([f"start: ({alternatives}) {self.eos}", *rules])
        return Constraint("", grammar + "\n")


def _tool_name(tool: Mapping[str, Any]) -> str:
    return str((tool.get("function") or tool).get("name", ""))


def _call_schema(tool: Mapping[str, Any], name: str, args_key: str) -> dict[str, Any]:
    """The JSON schema of a bare call ``{"name": NAME, ARGS_KEY: ARGS}`` (keys in that order)."""
    params = (tool.get("function") or {}).get("parameters")
    return {
        "type": "object",
        "properties": {"name": {"const": name}, args_key: NO_PARAMETERS if params is None else params},
        "required": ["name", args_key],
        "additionalProperties": False,
    }


# -- token masks -----------------------------------------------------------------------------------------


class GrammarVocab:
    """A tokenizer as llguidance sees it, plus a small cache of compiled grammars (one per engine).

    Building it from a fast Hugging Face tokenizer takes up to ~1 s for a 150k vocabulary.
    """

    def __init__(self, tokenizer, *, cache_size: int = 64):
        lg = require_llguidance()
        self.lg = lg
        try:
            self.ll_tokenizer = lg.hf.from_tokenizer(tokenizer)
        except ValueError as e:
            raise ValueError(f"constrained decoding needs a fast Hugging Face tokenizer: {e}") from e
        self.cache_size = cache_size
        self._compiled: OrderedDict[str, Any] = OrderedDict()

    def matcher(self, grammar: str):
        """A fresh matcher of ``grammar`` (compiled once, then copied); ValueError if it is invalid."""
        base = self._compiled.get(grammar)
        if base is None:
            base = self.lg.LLMatcher(self.ll_tokenizer, grammar, log_level=0)
            if base.is_error():
                raise ValueError(f"invalid grammar: {_short(base.get_error())}")
            self._compiled[grammar] = base
            while len(self._compiled) > self.cache_size:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(grammar)
        return base.deep_copy()


class RowMatchers:
    """One llguidance matcher per row of a batch, all of the same grammar.

    ``allowed(rows, width)`` is a boolean ``[len(rows), width]`` mask of the tokens each row may sample
    next (columns past the tokenizer's vocabulary are never allowed); ``consume(row, token)`` advances a
    row; ``stopped(row)`` says its grammar is complete (it accepts nothing more).
    """

    def __init__(self, vocab: GrammarVocab, grammar: str, rows: int):
        self.vocab = vocab
        self.matchers = [vocab.matcher(grammar) for _ in range(rows)]
        self.n_vocab = int(vocab.ll_tokenizer.vocab_size)

    def replay(self, row: int, ids: Sequence[int]) -> bool:
        """Consume tokens the row generated earlier (a row continued in a later engine call)."""
        return not ids or bool(self.matchers[row].consume_tokens([int(t) for t in ids]))

    def allowed(self, rows: Sequence[int], width: int) -> np.ndarray:
        lgn = self.vocab.lg.numpy
        bitmask = lgn.allocate_token_bitmask(len(rows), self.n_vocab)
        for j, row in enumerate(rows):
            lgn.fill_next_token_bitmask(self.matchers[row], bitmask, j)
        bits = np.unpackbits(bitmask.astype("<i4").view(np.uint8), axis=1, bitorder="little")
        out = np.zeros((len(rows), width), dtype=bool)
        k = min(width, self.n_vocab)
        out[:, :k] = bits[:, :k].astype(bool)
        return out

    def consume(self, row: int, token: int) -> bool:
        return bool(self.matchers[row].consume_token(int(token)))

    def stopped(self, row: int) -> bool:
        return bool(self.matchers[row].is_stopped())

    def error(self, row: int) -> str:
        return _short(self.matchers[row].get_error() or "")
