"""``horizonrl serve``: an OpenAI-compatible chat-completions server for any model horizonrl loads.

:func:`create_app` wraps an :class:`~horizonrl.inference.base.Engine` and a chat template
(:class:`~horizonrl.models.chat.ChatRenderer`) in a FastAPI app with

- ``GET /v1/models`` — the one served model;
- ``POST /v1/chat/completions`` — ``messages`` (system/developer/user/assistant with ``tool_calls``/
  tool), ``tools``, ``tool_choice`` (``auto``/``none``), ``temperature`` (0 = greedy), ``top_p``,
  ``max_tokens`` (or ``max_completion_tokens``), ``stop``, ``n``, ``seed``; the response follows the
  OpenAI schema. When ``tools`` are given, every well-formed ``<tool_call>{"name", "arguments"}
  </tool_call>`` block of the output becomes a ``choices[].message.tool_calls`` entry (arguments as a
  JSON string) and is removed from ``content``, and ``finish_reason`` is ``tool_calls``; otherwise it
  is ``stop`` (end of turn or a stop string, which is not included in ``content``) or ``length``;
- ``GET /health`` — liveness and request counters.

Invalid requests get HTTP 400 with an OpenAI-style error whose message names the field
(``messages.0.role: ...``); an unknown ``model`` gets 404. Generation is serialized with a lock
because engines are not thread-safe; FastAPI runs the handlers in its thread pool.

:func:`serve` loads ``tiny`` (the embedded tiny model, built and cached on first use), ``smollm2``,
any local Hugging Face model directory, a training checkpoint (``checkpoints/step_N``) or a run's
``checkpoints`` directory / run directory (its latest checkpoint), and runs uvicorn.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Literal

try:
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, Field, model_validator
except ImportError as e:  # pragma: no cover - fastapi is in the "serve" extra
    raise ImportError("horizonrl serve needs fastapi and uvicorn: pip install 'horizonrl[serve]'") from e

from horizonrl.envs.tools import TOOL_CLOSE, TOOL_OPEN, ToolCall, parse_tool_calls
from horizonrl.inference.base import Engine, SamplingParams
from horizonrl.models.chat import ChatRenderer

__all__ = ["ChatRequest", "create_app", "load_app", "resolve_model_path", "serve"]

DEFAULT_CACHE = Path.home() / ".cache" / "horizonrl"


# -- request schema --------------------------------------------------------------------------------------


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


class ChatRequest(BaseModel):
    """The accepted fields of ``POST /v1/chat/completions`` (unknown fields are ignored)."""

    model: str | None = None
    messages: list[_Message] = Field(min_length=1)
    tools: list[_ToolSpec] | None = None
    tool_choice: Literal["auto", "none"] | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=16)
    seed: int | None = None
    stream: bool = False


class _BadRequest(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def _error_body(message: str, param: str | None, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def _field(loc: tuple) -> str:
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) or "body"


def _validation_message(exc: RequestValidationError) -> tuple[str, str]:
    """(message, field) of the first validation error, e.g. ``messages.0.role: Input should be ...``."""
    err = exc.errors()[0]
    if err.get("type") == "json_invalid":
        return f"request body is not valid JSON: {err.get('ctx', {}).get('error', err['msg'])}", "body"
    name = _field(tuple(err.get("loc", ())))
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    got = err.get("input")
    suffix = f" (got {got!r})" if isinstance(got, str | int | float | bool) and len(repr(got)) < 80 else ""
    if err.get("type") == "missing":
        suffix = ""
    return f"{name}: {msg}{suffix}", name


# -- conversion helpers ----------------------------------------------------------------------------------


def _chat_messages(req: ChatRequest) -> list[dict[str, Any]]:
    """Request messages as the dicts :class:`ChatRenderer` renders."""
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


_BLOCK = re.compile(re.escape(TOOL_OPEN) + r"(.*?)(?:" + re.escape(TOOL_CLOSE) + r"|$)", re.DOTALL)


def extract_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Well-formed ``<tool_call>`` blocks of ``text`` as OpenAI tool calls, and the text without them.

    Malformed blocks stay in the text (the client sees what the model wrote).
    """
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    pos = 0
    for m in _BLOCK.finditer(text):
        parsed = parse_tool_calls(m.group(0))
        if len(parsed) == 1 and isinstance(parsed[0], ToolCall):
            kept.append(text[pos : m.start()])
            pos = m.end()
            calls.append(
                {
                    "id": f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {
                        "name": parsed[0].name,
                        "arguments": json.dumps(parsed[0].arguments, ensure_ascii=False),
                    },
                }
            )
    kept.append(text[pos:])
    return "".join(kept).strip(), calls


def _context_size(engine: Engine) -> int | None:
    config = getattr(getattr(engine, "model", None), "config", None)
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else None


# -- the app ---------------------------------------------------------------------------------------------


def create_app(
    engine: Engine,
    renderer: ChatRenderer | Any,
    model_name: str,
    *,
    max_context: int | None = None,
    default_max_tokens: int = 512,
) -> FastAPI:
    """A FastAPI app serving ``engine`` under ``model_name`` (see the module docstring).

    ``renderer`` is a :class:`ChatRenderer` or a tokenizer with a chat template. ``max_context`` is
    the model's context length (default: ``engine.model.config.max_position_embeddings``); a request
    without ``max_tokens`` generates at most ``default_max_tokens`` tokens.
    """
    if not isinstance(renderer, ChatRenderer):
        renderer = ChatRenderer(renderer)
    if not isinstance(model_name, str) or not model_name:
        raise ValueError(f"model_name must be a non-empty string, got {model_name!r}")
    if default_max_tokens < 1:
        raise ValueError(f"default_max_tokens must be >= 1, got {default_max_tokens}")
    if hasattr(engine, "eos_ids"):  # stop at the template's end-of-turn token too (e.g. <|eot_id|>)
        engine.eos_ids = frozenset(engine.eos_ids) | {renderer.eos_id}
    context = max_context or _context_size(engine)
    created = int(time.time())
    lock = threading.Lock()
    app = FastAPI(title="horizonrl serve", version="1")
    app.state.stats = {"chat_completions": 0, "prompt_tokens": 0, "completion_tokens": 0}
    app.state.model_name = model_name

    @app.exception_handler(RequestValidationError)
    async def _on_validation(request: Request, exc: RequestValidationError):
        message, name = _validation_message(exc)
        return JSONResponse(status_code=400, content=_error_body(message, name))

    @app.exception_handler(_BadRequest)
    async def _on_bad_request(request: Request, exc: _BadRequest):
        kind = "not_found_error" if exc.status == 404 else "invalid_request_error"
        return JSONResponse(status_code=exc.status, content=_error_body(exc.message, exc.param, kind))

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_name, **app.state.stats}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        card = {"id": model_name, "object": "model", "created": created, "owned_by": "horizonrl"}
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions")
    def chat_completions(req: ChatRequest) -> dict[str, Any]:
        if req.model is not None and req.model != model_name:
            raise _BadRequest(
                404, f"model {req.model!r} is not served here; this server serves {model_name!r}"
            )
        if req.stream:
            raise _BadRequest(
                400, "stream: streaming responses are not supported; send stream=false", "stream"
            )
        use_tools = bool(req.tools) and req.tool_choice != "none"
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if use_tools else None
        try:
            prompt = renderer.initial_ids(_chat_messages(req), tools)
        except Exception as e:  # template errors (e.g. roles the template rejects)
            raise _BadRequest(400, f"messages: the chat template cannot render them: {e}", "messages") from e
        requested = req.max_tokens or req.max_completion_tokens
        room = default_max_tokens
        if context is not None:
            room = context - len(prompt)
            if room < 1:
                raise _BadRequest(
                    400,
                    f"messages: the prompt has {len(prompt)} tokens; the context is {context}",
                    "messages",
                )
            if requested is not None and requested > room:
                raise _BadRequest(
                    400,
                    f"max_tokens: {requested} + {len(prompt)} prompt tokens exceed the context of {context}",
                    "max_tokens",
                )
        max_new = requested or min(default_max_tokens, room)
        stops = (req.stop,) if isinstance(req.stop, str) else tuple(s for s in (req.stop or ()) if s)
        greedy = req.temperature == 0
        params = SamplingParams(
            temperature=1.0 if greedy else req.temperature,
            top_p=req.top_p,
            max_new_tokens=max_new,
            stop=stops,
            greedy=greedy,
        )
        with lock:
            if req.seed is not None:
                if not hasattr(engine, "set_seed"):
                    raise _BadRequest(400, "seed: this engine cannot be seeded", "seed")
                engine.set_seed(req.seed)
            gens = engine.generate([prompt] * req.n, params)
            stats = app.state.stats
            stats["chat_completions"] += 1
            stats["prompt_tokens"] += len(prompt)
            stats["completion_tokens"] += sum(len(g.ids) for g in gens)
        choices = []
        for i, gen in enumerate(gens):
            text = gen.text
            stop = gen.meta.get("stop")
            if isinstance(stop, str) and stop in text:
                text = text[: text.index(stop)]
            calls: list[dict[str, Any]] = []
            if use_tools:
                text, calls = extract_tool_calls(text)
            message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
            if calls:
                message["tool_calls"] = calls
            reason = "tool_calls" if calls else gen.finish_reason
            choices.append({"index": i, "message": message, "finish_reason": reason, "logprobs": None})
        completion = sum(len(g.ids) for g in gens)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": completion,
                "total_tokens": len(prompt) + completion,
            },
        }

    return app


# -- loading and running ---------------------------------------------------------------------------------


def resolve_model_path(model_path: str | Path) -> str:
    """``tiny``/``smollm2`` as is; a run directory or ``checkpoints`` directory -> its latest
    checkpoint; anything else unchanged (loading reports what is missing)."""
    from horizonrl.train.checkpoint import latest_checkpoint

    text = str(model_path)
    if text in ("tiny", "smollm2"):
        return text
    p = Path(text).expanduser()
    if (p / "config.json").is_file():
        return str(p)
    for root in (p, p / "checkpoints"):
        if root.is_dir() and ((root / "latest").exists() or any(root.glob("step_*"))):
            latest = latest_checkpoint(root)
            if latest is None:
                raise FileNotFoundError(f"{str(root)!r} holds no complete checkpoint")
            return str(latest)
    return str(p)


def load_app(
    model_path: str | Path,
    *,
    model_name: str | None = None,
    device: str = "auto",
    dtype: str = "float32",
    seed: int = 0,
    max_batch_size: int = 16,
    default_max_tokens: int = 512,
    cache_dir: str | Path | None = None,
) -> FastAPI:
    """Load ``model_path`` (see :func:`resolve_model_path`) into an :class:`HFEngine` and build the app.

    ``tiny`` is built with the default model config into ``cache_dir`` (default
    ``~/.cache/horizonrl/tiny``) the first time and loaded from there afterwards.
    """
    from horizonrl.config import ModelConfig
    from horizonrl.inference.hf import HFEngine
    from horizonrl.train.bootstrap import load_policy

    path = resolve_model_path(model_path)
    work_dir = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE / "tiny"
    model, tokenizer = load_policy(
        ModelConfig(path=path, device=device, dtype=dtype), init=None, work_dir=work_dir
    )
    model.eval()
    engine = HFEngine(model, tokenizer, max_batch_size=max_batch_size, seed=seed)
    if model_name is None:
        model_name = path if path in ("tiny", "smollm2") else Path(path).name
        if model_name.startswith("step_"):
            model_name = f"{Path(path).parent.parent.name}/{model_name}"
    return create_app(engine, tokenizer, model_name, default_max_tokens=default_max_tokens)


def serve(
    model_path: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    log_level: str = "info",
    **load_kwargs: Any,
) -> None:
    """Load a model (:func:`load_app` keyword arguments) and serve it with uvicorn until interrupted."""
    import uvicorn

    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an integer in [0, 65535], got {port!r}")
    app = load_app(model_path, **load_kwargs)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
