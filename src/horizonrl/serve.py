"""``horizonrl serve``: an OpenAI-compatible chat-completions server for any model horizonrl loads.

:func:`create_app` wraps an :class:`~horizonrl.inference.base.Engine` and a chat template
(:class:`~horizonrl.models.chat.ChatRenderer`) in a FastAPI app with

- ``GET /v1/models``, ``GET /v1/models/{id}`` — the one served model;
- ``POST /v1/chat/completions`` — the OpenAI dialect of :mod:`horizonrl.api` (messages with tool
  calls, ``tools`` and ``tool_choice`` auto/none/required/named, ``response_format``
  text/json_object/json_schema (forced calls and JSON output by grammar-constrained decoding,
  :mod:`horizonrl.inference.constrain`), ``temperature``, ``top_p``, ``max_tokens``, ``stop``, ``n``,
  ``seed``, ``logprobs``/``top_logprobs``, ``stream``);
- ``GET /health`` — liveness, request counters and the queue length.

Invalid requests get HTTP 400 with an OpenAI-style error whose message starts with the field and
whose ``param`` names it (``messages.0.role: ...``); an unknown ``model`` gets 404. Requests are
queued on a :class:`~horizonrl.api.scheduler.Scheduler` that generates in slices and takes turns
between requests, so a small request never waits for a large one to finish.

:func:`serve` loads ``tiny`` (the embedded tiny model, built and cached on first use), ``smollm2``,
any local Hugging Face model directory, a training checkpoint (``checkpoints/step_N``) or a run's
``checkpoints`` directory / run directory (its latest checkpoint), and runs uvicorn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

try:
    from fastapi import FastAPI, Request
except ImportError as e:  # pragma: no cover - fastapi is in the "serve" extra
    raise ImportError("horizonrl serve needs fastapi and uvicorn: pip install 'horizonrl[serve]'") from e

from horizonrl.api.chat import ChatService, extract_tool_calls
from horizonrl.api.routes import add_model_routes, context_size, prepare_engine
from horizonrl.api.scheduler import Scheduler
from horizonrl.api.schema import ChatRequest, install_error_handlers
from horizonrl.inference.base import Engine
from horizonrl.models.chat import ChatRenderer

__all__ = [
    "ChatRequest",
    "create_app",
    "extract_tool_calls",
    "load_app",
    "load_engine",
    "resolve_model_path",
    "serve",
    "serve_gateway",
]

DEFAULT_CACHE = Path.home() / ".cache" / "horizonrl"


# -- the app ---------------------------------------------------------------------------------------------


def create_app(
    engine: Engine,
    renderer: ChatRenderer | Any,
    model_name: str,
    *,
    max_context: int | None = None,
    default_max_tokens: int = 512,
    max_request_tokens: int = 8192,
    slice_tokens: int = 32,
) -> FastAPI:
    """A FastAPI app serving ``engine`` under ``model_name`` (see the module docstring).

    ``renderer`` is a :class:`ChatRenderer` or a tokenizer with a chat template. ``max_context`` is
    the model's context length (default: ``engine.model.config.max_position_embeddings``); a request
    without ``max_tokens`` generates at most ``default_max_tokens`` tokens; ``n * max_tokens`` of one
    request may not exceed ``max_request_tokens``; ``slice_tokens`` is the scheduler's slice (the
    longest a new request waits behind running ones, in decode steps).
    """
    if not isinstance(renderer, ChatRenderer):
        renderer = ChatRenderer(renderer)
    if not isinstance(model_name, str) or not model_name:
        raise ValueError(f"model_name must be a non-empty string, got {model_name!r}")
    prepare_engine(engine, renderer)
    scheduler = Scheduler(engine, renderer.tokenizer, slice_tokens=slice_tokens)
    service = ChatService(
        scheduler,
        renderer,
        model_name,
        context=max_context or context_size(engine),
        default_max_tokens=default_max_tokens,
        max_request_tokens=max_request_tokens,
        constrain=True,
    )
    app = FastAPI(title="horizonrl serve", version="1")
    app.state.stats = service.stats
    app.state.model_name = model_name
    app.state.scheduler = scheduler
    app.state.service = service
    app.router.add_event_handler("shutdown", scheduler.close)
    install_error_handlers(app)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_name, **service.stats, "queued": scheduler.pending()}

    add_model_routes(app, model_name)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest, request: Request):
        prep = service.prepare(req)
        return await service.respond(request, prep, service.render(prep))

    return app


# -- loading and running ---------------------------------------------------------------------------------


def resolve_model_path(model_path: str | Path) -> str:
    """``tiny``/``smollm2`` as is; a run directory or ``checkpoints`` directory -> its latest
    checkpoint; anything else unchanged (loading reports what is missing)."""
    from horizonrl.train.records.checkpoint import latest_checkpoint

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


def load_engine(
    model_path: str | Path,
    *,
    model_name: str | None = None,
    device: str = "auto",
    dtype: str = "float32",
    seed: int = 0,
    max_batch_size: int = 16,
    cache_dir: str | Path | None = None,
):
    """``(engine, tokenizer, model_name)``: ``model_path`` (see :func:`resolve_model_path`) in an
    :class:`HFEngine`. ``tiny`` is built with the default model config into ``cache_dir`` (default
    ``~/.cache/horizonrl/tiny``) the first time and loaded from there afterwards."""
    from horizonrl.config import ModelConfig
    from horizonrl.inference.hf import HFEngine
    from horizonrl.train.warmstart.bootstrap import load_policy

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
    return engine, tokenizer, model_name


def load_app(
    model_path: str | Path,
    *,
    default_max_tokens: int = 512,
    max_request_tokens: int = 8192,
    slice_tokens: int = 32,
    **engine_kwargs: Any,
) -> FastAPI:
    """Load ``model_path`` with :func:`load_engine` (``model_name``, ``device``, ``dtype``, ``seed``,
    ``max_batch_size``, ``cache_dir``) and build the app (:func:`create_app`)."""
    engine, tokenizer, model_name = load_engine(model_path, **engine_kwargs)
    return create_app(
        engine,
        tokenizer,
        model_name,
        default_max_tokens=default_max_tokens,
        max_request_tokens=max_request_tokens,
        slice_tokens=slice_tokens,
    )


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


def serve_gateway(
    model_path: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    out_dir: str | Path = "runs/gateway",
    log_level: str = "info",
    default_max_tokens: int = 512,
    max_request_tokens: int = 8192,
    slice_tokens: int = 32,
    **engine_kwargs: Any,
) -> None:
    """``horizonrl gateway MODEL``: the recording gateway (:class:`horizonrl.gateway.Gateway`) over a
    loaded model, without training. Episodes open on their first call; when a reward is posted the
    episode's rollout is appended to ``out_dir/rollouts.jsonl`` and the episode is closed."""
    import uvicorn

    from horizonrl.gateway import Gateway
    from horizonrl.trajectory import write_jsonl

    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an integer in [0, 65535], got {port!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    engine, tokenizer, model_name = load_engine(model_path, **engine_kwargs)

    def on_reward(episode_id: str) -> None:
        write_jsonl(out / "rollouts.jsonl", [gateway.recorder.rollout(episode_id)], append=True)
        gateway.recorder.close(episode_id)

    gateway = Gateway(
        engine,
        tokenizer,
        model_name,
        default_max_tokens=default_max_tokens,
        max_request_tokens=max_request_tokens,
        slice_tokens=slice_tokens,
        on_reward=on_reward,
    )
    uvicorn.run(gateway.app, host=host, port=port, log_level=log_level)
