"""The recording gateway: an OpenAI-compatible endpoint in front of the policy engine.

:class:`Gateway` serves the chat-completions dialect of :mod:`horizonrl.api` (the same request parsing,
responses, streaming, log-probs and ``tool_choice`` as ``horizonrl serve``) and records every call
with a :class:`~horizonrl.gateway.recorder.Recorder`:

- ``POST /episodes/{episode_id}/v1/chat/completions`` — a call of an episode (give an OpenAI client
  ``base_url=".../episodes/{episode_id}/v1"``), or ``POST /v1/chat/completions`` with the header
  ``X-Episode-Id``. Optional headers: ``X-Parent-Episode`` (this episode is a subagent of that one),
  ``X-Session-Kind`` (the kind of a new session, e.g. ``compaction`` on a summary call). ``n`` must
  be 1 (one recorded completion per call).
- ``POST /v1/episodes/{episode_id}/reward`` — ``{"reward": float, "success"?: bool, "final_answer"?:
  str, "info"?: {...}}``; ``POST /v1/episodes/{episode_id}/finish`` — the harness is done
  (``{"final_answer"?: str}``; a reward function may score it); ``GET /v1/episodes/{episode_id}``
  — its state and recorded rollout.
- ``GET /v1/models``, ``GET /episodes/{episode_id}/v1/models`` (and ``/{id}``), ``GET /health``.

While a trainer collects, :attr:`Gateway.sampling` holds the policy's sampling settings: every call
samples at that temperature/top-p whatever it asks for (so the recorded log-probs are those the
trainer recomputes), counted in ``stats["overridden_sampling"]`` when a request asked for something else.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from horizonrl.api.chat import ChatService
from horizonrl.api.routes import add_model_routes, context_size, prepare_engine
from horizonrl.api.scheduler import Scheduler
from horizonrl.api.schema import BadRequest, ChatRequest, error_body, install_error_handlers
from horizonrl.gateway.recorder import DECLARABLE_KINDS, EpisodeError, Recorder
from horizonrl.inference.base import Engine, SamplingParams
from horizonrl.models.chat import ChatRenderer
from horizonrl.trajectory import rollout_to_dict

__all__ = ["Gateway", "ServerThread"]

log = logging.getLogger(__name__)


class _RewardBody(BaseModel):
    reward: float = Field(allow_inf_nan=False, strict=True)
    success: bool | None = None
    final_answer: str | None = None
    info: dict[str, Any] | None = None


class _FinishBody(BaseModel):
    final_answer: str | None = None


class Gateway:
    """The gateway over ``engine`` (module docstring); :attr:`app` is the FastAPI app.

    ``auto_register``: unknown episode ids are opened by their first call (standalone use); a
    trainer registers its episodes and sets it False. ``context`` caps prompt + completion tokens
    (default: the model's context). ``on_reward(episode_id)`` / ``on_finish(episode_id)`` run after a
    reward / finish is posted.
    """

    def __init__(
        self,
        engine: Engine,
        renderer: ChatRenderer | Any,
        model_name: str = "policy",
        *,
        auto_register: bool = True,
        context: int | None = None,
        default_max_tokens: int = 512,
        max_request_tokens: int = 8192,
        slice_tokens: int = 32,
        on_reward: Callable[[str], None] | None = None,
        on_finish: Callable[[str], None] | None = None,
    ):
        if not isinstance(renderer, ChatRenderer):
            renderer = ChatRenderer(renderer)
        prepare_engine(engine, renderer)
        self.renderer = renderer
        self.model_name = model_name
        self.scheduler = Scheduler(engine, renderer.tokenizer, slice_tokens=slice_tokens)
        self.service = ChatService(
            self.scheduler,
            renderer,
            model_name,
            context=context or context_size(engine),
            default_max_tokens=default_max_tokens,
            max_request_tokens=max_request_tokens,
            max_n=1,
        )
        self.recorder = Recorder(renderer, auto_register=auto_register)
        self.sampling: SamplingParams | None = None
        self.on_reward, self.on_finish = on_reward, on_finish
        self.stats = {"overridden_sampling": 0, "unrecorded_calls": 0}
        self.app = self._build()

    # -- chat --------------------------------------------------------------------------------------------

    async def chat(self, episode_id: str, req: ChatRequest, request: Request):
        parent = request.headers.get("x-parent-episode")
        kind = request.headers.get("x-session-kind")
        if kind is not None and kind not in DECLARABLE_KINDS:
            raise BadRequest(
                400,
                f"X-Session-Kind: {kind!r} is not one of {list(DECLARABLE_KINDS)} "
                "(declare subagents with X-Parent-Episode)",
                "X-Session-Kind",
            )
        if (req.n or 1) != 1:
            raise BadRequest(
                400, f"n: the gateway records one completion per call; send n=1 (got {req.n})", "n"
            )
        self.recorder.ensure(episode_id, parent=parent)
        prep = self.service.prepare(req)
        policy = self.sampling
        if policy is not None:
            asked = (req.temperature, req.top_p)
            if (asked[0] is not None and asked[0] != policy.temperature) or (
                asked[1] is not None and asked[1] != policy.top_p
            ):
                self.stats["overridden_sampling"] += 1
            prep.params = replace(
                prep.params, temperature=policy.temperature, top_p=policy.top_p, greedy=False
            )
        prefill = self.service.prefill_ids(prep)
        prompt = self.recorder.prompt_ids(episode_id, prep.messages, prep.tools, prefill)
        if prompt is None:
            prompt = self.service.render(prep)

        def on_done(prep, prompt, completions) -> None:
            c = completions[0]
            try:
                self.recorder.record(
                    episode_id,
                    messages=prep.messages,
                    tools=prep.tools,
                    prompt_ids=prompt,
                    response_ids=c.row.ids,
                    logprobs=c.row.logprobs,
                    returned=c.message,
                    finish_reason=c.finish_reason,
                    prefill_tokens=len(prefill),
                    session_kind=kind,
                )
            except EpisodeError as e:  # closed while generating (e.g. the trainer's timeout)
                self.stats["unrecorded_calls"] += 1
                log.warning("call of episode %s not recorded: %s", episode_id, e.message)

        return await self.service.respond(request, prep, prompt, on_done=on_done)

    # -- the app -----------------------------------------------------------------------------------------

    def _build(self) -> FastAPI:
        app = FastAPI(title="horizonrl gateway", version="1")
        install_error_handlers(app)
        recorder = self.recorder

        @app.exception_handler(EpisodeError)
        async def _on_episode_error(request: Request, exc: EpisodeError):
            kind = {404: "not_found_error", 409: "conflict_error"}.get(exc.status, "invalid_request_error")
            return JSONResponse(status_code=exc.status, content=error_body(exc.message, exc.param, kind))

        @app.get("/health")
        def health() -> dict[str, Any]:
            return {
                "status": "ok",
                "model": self.model_name,
                **self.service.stats,
                **recorder.stats,
                **self.stats,
                "queued": self.scheduler.pending(),
            }

        add_model_routes(app, self.model_name)
        add_model_routes(app, self.model_name, prefix="/episodes/{episode_id}")

        @app.post("/episodes/{episode_id}/v1/chat/completions")
        async def chat_in_path(episode_id: str, req: ChatRequest, request: Request):
            return await self.chat(episode_id, req, request)

        @app.post("/v1/chat/completions")
        async def chat_with_header(req: ChatRequest, request: Request):
            episode_id = request.headers.get("x-episode-id")
            if not episode_id:
                raise BadRequest(
                    400,
                    "X-Episode-Id: the gateway records calls per episode: send the X-Episode-Id header or "
                    "POST /episodes/{episode_id}/v1/chat/completions",
                    "X-Episode-Id",
                )
            return await self.chat(episode_id, req, request)

        @app.post("/v1/episodes/{episode_id}/reward")
        def post_reward(episode_id: str, body: _RewardBody) -> dict[str, Any]:
            recorder.post_reward(
                episode_id, body.reward, success=body.success, final_answer=body.final_answer, info=body.info
            )
            if self.on_reward is not None:
                self.on_reward(episode_id)
            return recorder.describe(episode_id)

        @app.post("/v1/episodes/{episode_id}/finish")
        def finish(episode_id: str, body: _FinishBody | None = None) -> dict[str, Any]:
            self.finish(episode_id, final_answer=body.final_answer if body else None)
            return recorder.describe(episode_id)

        @app.get("/v1/episodes/{episode_id}")
        def episode(episode_id: str) -> dict[str, Any]:
            out = recorder.describe(episode_id)
            if out["root"] == episode_id:
                out["rollout"] = rollout_to_dict(recorder.rollout(episode_id))
            return out

        app.router.add_event_handler("shutdown", self.scheduler.close)
        return app

    def finish(self, episode_id: str, *, final_answer: str | None = None) -> None:
        """Mark an episode's harness as done (its final answer, if given, overrides the recorded one)."""
        self.recorder.finish(episode_id, final_answer)
        if self.on_finish is not None:
            self.on_finish(episode_id)


class ServerThread:
    """Run a FastAPI app with uvicorn in a daemon thread on ``host:port`` (0 = a free port)."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        import uvicorn

        self.host = host
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level))
        self.thread = threading.Thread(target=self.server.run, name="horizonrl-gateway", daemon=True)
        self.port: int | None = None

    def start(self, timeout_s: float = 30.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError(f"the gateway server on {self.host} did not start (see the log above)")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gateway server on {self.host} did not start in {timeout_s:.0f} s")
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
