"""Routes and engine setup shared by ``horizonrl serve`` and ``horizonrl gateway``."""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI

from horizonrl.api.schema import BadRequest
from horizonrl.inference.base import Engine
from horizonrl.models.chat import ChatRenderer

__all__ = ["add_model_routes", "context_size", "prepare_engine"]


def context_size(engine: Engine) -> int | None:
    """The model's context length (``max_position_embeddings``), if the engine has a model config."""
    config = getattr(getattr(engine, "model", None), "config", None)
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def prepare_engine(engine: Engine, renderer: ChatRenderer) -> None:
    """Stop at the template's end-of-turn token too (e.g. ``<|eot_id|>``)."""
    if hasattr(engine, "eos_ids"):
        engine.eos_ids = frozenset(engine.eos_ids) | {renderer.eos_id}


def add_model_routes(app: FastAPI, model_name: str, prefix: str = "") -> None:
    """``GET {prefix}/v1/models`` and ``GET {prefix}/v1/models/{id}`` (another id: a 404 naming ``model``)."""
    created = int(time.time())
    card = {"id": model_name, "object": "model", "created": created, "owned_by": "horizonrl"}

    @app.get(prefix + "/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [card]}

    @app.get(prefix + "/v1/models/{model_id:path}")
    def model(model_id: str) -> dict[str, Any]:
        if model_id != model_name:
            raise BadRequest(
                404, f"model: {model_id!r} is not served here; this server serves {model_name!r}", "model"
            )
        return card
