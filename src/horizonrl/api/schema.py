"""The request side of the OpenAI chat-completions dialect spoken by ``serve`` and ``gateway``.

:class:`ChatRequest` is the accepted body of ``POST /v1/chat/completions``. Fields that would change
the output but are not implemented (a non-empty ``logit_bias``, non-zero
``presence_penalty``/``frequency_penalty``) are refused with a 400 naming the field rather than
silently ignored; purely informational fields (``user``, ``metadata``, ``store``, ...) are ignored.
``response_format`` is ``{"type": "text"}``, ``{"type": "json_object"}`` or ``{"type": "json_schema",
"json_schema": {"name": ..., "schema": {...}, "strict": ...}}`` (the last two constrain decoding).

Every validation error becomes HTTP 400 with an OpenAI-style error body whose ``param`` is the field
(``messages.0.role``) and whose ``message`` starts with it (:func:`install_error_handlers`).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, field_validator, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

__all__ = [
    "BadRequest",
    "ChatRequest",
    "chat_messages",
    "error_body",
    "install_error_handlers",
    "validation_message",
]

SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed accepts
MAX_TOP_LOGPROBS = 20


class _FunctionSpec(BaseModel):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class _ToolSpec(BaseModel):
    type: Literal["function"] = "function"
    function: _FunctionSpec


class _FunctionCall(BaseModel):
    name: str = Field(min_length=1)
    arguments: str | dict[str, Any] = "{}"


class _ToolCallIn(BaseModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: _FunctionCall


class _TextPart(BaseModel):
    type: Literal["text"]
    text: str


class _Message(BaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[_TextPart] | None = None
    name: str | None = None
    tool_calls: list[_ToolCallIn] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _content_present(self) -> _Message:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"content is required for a {self.role} message")
        return self

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class _StreamOptions(BaseModel):
    include_usage: bool | None = None


class ChatRequest(BaseModel):
    """The accepted fields of ``POST /v1/chat/completions`` (unknown informational fields are ignored).

    ``tool_choice``: ``"auto"``, ``"none"``, ``"required"`` or ``{"type": "function", "function":
    {"name": NAME}}``. ``ignore_eos`` is the vLLM extension (keep sampling after end of turn).
    """

    model: str | None = None
    messages: list[_Message] = Field(min_length=1)
    tools: list[_ToolSpec] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0, allow_inf_nan=False, strict=True)
    top_p: float | None = Field(None, gt=0.0, le=1.0, allow_inf_nan=False, strict=True)
    max_tokens: int | None = Field(None, ge=1, strict=True)
    max_completion_tokens: int | None = Field(None, ge=1, strict=True)
    stop: str | list[str] | None = None
    n: int | None = Field(None, ge=1, le=16, strict=True)
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX, strict=True)
    stream: bool | None = None
    stream_options: _StreamOptions | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS, strict=True)
    ignore_eos: bool | None = None
    response_format: Any = None
    logit_bias: dict[str, float] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, v: Any) -> Any:
        if v is None or v in ("auto", "none", "required"):
            return v
        if isinstance(v, dict) and v.get("type", "function") == "function":
            fn = v.get("function")
            if isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]:
                return {"type": "function", "function": {"name": fn["name"]}}
        raise ValueError(
            'must be \'auto\', \'none\', \'required\' or {"type": "function", "function": {"name": ...}}'
        )

    @field_validator("response_format")
    @classmethod
    def _response_format(cls, v: Any) -> Any:
        if v is None:
            return v
        kind = v.get("type") if isinstance(v, dict) else None
        if kind in ("text", "json_object"):
            return {"type": kind}
        if kind == "json_schema":
            spec = v.get("json_schema")
            if not isinstance(spec, dict):
                raise ValueError('json_schema must be an object {"name": ..., "schema": {...}}')
            schema = spec.get("schema")
            if schema is not None and not isinstance(schema, dict):
                raise ValueError(
                    f"json_schema.schema must be a JSON schema object, got {type(schema).__name__}"
                )
            name = spec.get("name")
            if name is not None and not isinstance(name, str):
                raise ValueError("json_schema.name must be a string")
            return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
        raise ValueError(
            'must be {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": '
            '{"name": ..., "schema": {...}}}'
        )

    def json_output(self) -> tuple[bool, dict[str, Any] | None]:
        """``(constrained, schema)``: whether ``response_format`` asks for JSON, and the schema (None:
        any JSON object)."""
        rf = self.response_format
        if not rf or rf["type"] == "text":
            return False, None
        if rf["type"] == "json_object":
            return True, None
        return True, rf["json_schema"]["schema"]

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: Any) -> Any:
        if v:
            raise ValueError("logit_bias is not supported; send {} or leave it out")
        return v

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _penalty(cls, v: float | None) -> float | None:
        if v:
            raise ValueError("penalties are not supported; send 0 or leave it out")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 16:
            raise ValueError(f"at most 16 stop strings, got {len(v)}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> ChatRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs=true")
        if self.tool_choice in ("required",) or isinstance(self.tool_choice, dict):
            if not self.tools:
                raise ValueError(f"tool_choice: {json.dumps(self.tool_choice)} needs tools")
            if isinstance(self.tool_choice, dict):
                name = self.tool_choice["function"]["name"]
                names = [t.function.name for t in self.tools]
                if name not in names:
                    raise ValueError(f"tool_choice.function.name: {name!r} is not one of the tools {names}")
        return self

    def stops(self) -> tuple[str, ...]:
        if isinstance(self.stop, str):
            return (self.stop,) if self.stop else ()
        return tuple(s for s in (self.stop or ()) if s)


def chat_messages(req: ChatRequest) -> list[dict[str, Any]]:
    """Request messages as the dicts :class:`~horizonrl.models.chat.ChatRenderer` renders.

    ``developer`` becomes ``system``; assistant ``tool_calls`` keep name and arguments (ids dropped).
    """
    out = []
    for m in req.messages:
        role = "system" if m.role == "developer" else m.role
        msg: dict[str, Any] = {"role": role, "content": m.text()}
        if m.role == "assistant" and m.tool_calls:
            msg["tool_calls"] = [
                {"function": {"name": c.function.name, "arguments": c.function.arguments}}
                for c in m.tool_calls
            ]
        out.append(msg)
    return out


# -- errors ----------------------------------------------------------------------------------------------


class BadRequest(Exception):
    """An HTTP 4xx answer: ``status``, a message that starts with the field, and the field (``param``)."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


_KINDS = {404: "not_found_error", 409: "conflict_error", 429: "rate_limit_error"}


def error_body(message: str, param: str | None, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


_TYPE_TAGS = {"str", "int", "float", "bool", "none", "dict", "list", "_TextPart", "_StreamOptions"}


def _field(loc: tuple) -> str:
    """``messages.0.content`` from a pydantic location (``body`` and union-member tags dropped)."""
    parts = [str(p) for p in loc if p != "body"]
    parts = [p for p in parts if p not in _TYPE_TAGS and "[" not in p and not p.startswith("function-")]
    return ".".join(parts) or "body"


def validation_message(exc: RequestValidationError) -> tuple[str, str]:
    """(message, field) of the first validation error, e.g. ``messages.0.role: Input should be ...``.

    A model-level error whose text starts with ``field:`` names that field.
    """
    err = exc.errors()[0]
    if err.get("type") == "json_invalid":
        return f"request body is not valid JSON: {err.get('ctx', {}).get('error', err['msg'])}", "body"
    name = _field(tuple(err.get("loc", ())))
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    head, sep, rest = msg.partition(": ")
    if sep and name == "body" and head.replace(".", "").replace("_", "").isalnum() and " " not in head:
        name, msg = head, rest
    got = err.get("input")
    suffix = f" (got {got!r})" if isinstance(got, str | int | float | bool) and len(repr(got)) < 80 else ""
    if err.get("type") == "missing" or name != _field(tuple(err.get("loc", ()))):
        suffix = ""
    return f"{name}: {msg}{suffix}", name


def install_error_handlers(app: FastAPI) -> None:
    """400 for validation errors, the :class:`BadRequest` status for those, both naming the field."""

    @app.exception_handler(RequestValidationError)
    async def _on_validation(request: Request, exc: RequestValidationError):
        message, name = validation_message(exc)
        return JSONResponse(status_code=400, content=error_body(message, name))

    @app.exception_handler(BadRequest)
    async def _on_bad_request(request: Request, exc: BadRequest):
        kind = _KINDS.get(exc.status, "invalid_request_error")
        return JSONResponse(status_code=exc.status, content=error_body(exc.message, exc.param, kind))

    @app.exception_handler(StarletteHTTPException)
    async def _on_http(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 400:  # the body could not be parsed (bad JSON, huge integers, deep nesting)
            message, param = f"body: the request body cannot be parsed as JSON ({exc.detail})", "body"
        elif exc.status_code in (404, 405):
            message, param = f"path: {request.method} {request.url.path}: {exc.detail}", "path"
        else:
            message, param = str(exc.detail), None
        kind = _KINDS.get(exc.status_code, "invalid_request_error")
        return JSONResponse(status_code=exc.status_code, content=error_body(message, param, kind))
