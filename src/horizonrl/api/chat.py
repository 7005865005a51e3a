"""Chat completions in the OpenAI dialect: request preparation and (streamed) responses.

:class:`ChatService` is shared by ``horizonrl serve`` and ``horizonrl gateway``:

- :meth:`ChatService.prepare` checks a :class:`~horizonrl.api.schema.ChatRequest` and turns it into a
  :class:`Prepared` request (messages for the chat template, tools, sampling settings, the
  tool-call *prefill*);
- the caller builds the prompt ids (``serve``: :meth:`ChatService.render`; the gateway splices the
  ids of earlier calls) and :meth:`ChatService.finish_params` fits ``max_tokens`` to the context and
  to the per-request cap ``n * max_tokens <= max_request_tokens``;
- :meth:`ChatService.respond` queues the rows on the :class:`~horizonrl.api.scheduler.Scheduler` and
  answers with one JSON body or, with ``stream: true``, server-sent events in the OpenAI chunk format.

Tool calls are read and forced in the model family's own syntax (the renderer's
:class:`~horizonrl.tool_formats.ToolFormat`: Hermes ``<tool_call>`` blocks for horizonrl's tiny model
and SmolLM2, Qwen's with newlines, Llama 3's bare JSON object, pythonic ``[f(x=1)]`` lists).
``tool_choice``: ``auto`` (default with tools) parses every well-formed call of the output into
``tool_calls`` (a family whose calls are the whole message, such as Llama 3's, turns a message that is
a malformed call into plain content, as the model wrote it); ``none`` renders no tools and parses
nothing; ``required`` and a named function force a call by *constrained decoding*
(:mod:`horizonrl.inference.constrain`, llguidance): the assistant message is prefilled with the
family's opening (``<tool_call>`` in Hermes; ``required``) or the whole head of the call
(``<tool_call>{"name": "NAME", "arguments":`` in Hermes; named), and every sampled token after it
must follow the grammar of the rest of the call in the chat template's exact syntax, with
``arguments`` valid under the tool's JSON schema, then end of turn (``required`` may write several
calls, one per line, unless ``parallel_tool_calls`` is false or the family writes one call per
message). A family whose calls are not JSON (pythonic) cannot be forced: that is a 400. The prefill
is part of the prompt the engine sees (and of ``usage.prompt_tokens``), not of the sampled tokens; it
is part of the text that is parsed. ``response_format`` ``json_object`` /
``json_schema`` constrains the content to one JSON value (matching the schema); with tools and
``tool_choice: auto`` the message may be tool calls instead. A completion cut by ``max_tokens`` can
still be incomplete (``finish_reason: "length"``). Constrained rows report the log-probs of the masked
distribution they were sampled from. Constraints need ``ChatService(constrain=True)`` (``serve``) and
an engine with ``supports_grammar``; otherwise (the gateway, whose rollouts are trained on, or e.g. a
scripted test engine) a forced call gets the prefill alone, which only fixes how the answer starts, and
``response_format`` JSON is a 400.

``logprobs`` cover every sampled token in order (the end-of-turn token and the tokens of a stop string
included; prefilled tokens excluded): ``{"token", "logprob", "bytes", "top_logprobs"}`` as in OpenAI.

Streaming: content deltas never contain text that a later token could turn into a tool call or a stop
string (such text is held back until it is decided), so the concatenated deltas equal the non-streamed
``content``; tool calls are sent whole, one ``delta.tool_calls`` entry each, when the completion ends.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from horizonrl.api.scheduler import Job, RowState, Scheduler
from horizonrl.api.schema import BadRequest, ChatRequest, chat_messages, error_body
from horizonrl.envs.core.tools import TOOL_CLOSE, TOOL_OPEN, ToolCall, parse_tool_calls
from horizonrl.inference.base import SamplingParams
from horizonrl.inference.constrain import (
    Constraint,
    ConstraintError,
    ConstraintUnavailable,
    GrammarBuilder,
    check_grammar,
)
from horizonrl.models.chat import ChatRenderer
from horizonrl.tool_formats import ToolFormat

__all__ = ["ChatService", "Prepared", "extract_tool_calls"]

_BLOCK = re.compile(re.escape(TOOL_OPEN) + r"(.*?)(?:" + re.escape(TOOL_CLOSE) + r"|$)", re.DOTALL)


def extract_tool_calls(text: str, tool_format: ToolFormat | None = None) -> tuple[str, list[dict[str, Any]]]:
    """Well-formed calls of ``text`` as OpenAI tool calls, and the text without them (stripped).

    ``tool_format`` (default: canonical Hermes blocks only) is the family's syntax: its calls are read
    through :meth:`~horizonrl.tool_formats.ToolFormat.to_canonical`. Malformed calls stay in the text as
    the model wrote them (the client sees what the model wrote): a malformed canonical block in place, a
    family-syntax message with a malformed call whole, with no calls."""
    if tool_format is not None:
        canonical = tool_format.to_canonical(text)
        if canonical != text:
            rest, calls = extract_tool_calls(canonical)
            return (text.strip(), []) if TOOL_OPEN in rest else (rest, calls)
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


def _held_back(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one of ``markers``."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:k]):
                best = k
                break
    return best


@dataclass
class Prepared:
    """A checked request: what to render, how to sample, what to return."""

    req: ChatRequest
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None  # rendered and parsed tools (None: no tool handling)
    prefill_text: str  # forced start of the assistant message ("" unless tool_choice forces a call)
    n: int
    seed: int | None
    stream: bool
    include_usage: bool
    logprobs: bool
    top_logprobs: int
    requested_max: int | None
    params: SamplingParams  # max_new_tokens is set by finish_params

    @property
    def use_tools(self) -> bool:
        return self.tools is not None


@dataclass
class Completion:
    """One finished choice as the client sees it, plus the row it came from."""

    index: int
    message: dict[str, Any]
    finish_reason: str
    row: RowState
    logprobs: dict[str, Any] | None


class ChatService:
    """The OpenAI chat-completions logic over a scheduler (module docstring).

    ``constrain``: honour forced tool calls and ``response_format`` JSON by constrained decoding
    (``horizonrl serve``). Off by default, as in the gateway, whose recorded rollouts must keep the
    policy's own (unmasked) log-probs for training: there a forced call is the prefill alone and
    ``response_format`` JSON is a 400.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        renderer: ChatRenderer,
        model_name: str,
        *,
        context: int | None = None,
        default_max_tokens: int = 512,
        max_request_tokens: int = 8192,
        max_n: int = 16,
        constrain: bool = False,
    ):
        if default_max_tokens < 1:
            raise ValueError(f"default_max_tokens must be >= 1, got {default_max_tokens}")
        if max_request_tokens < 1:
            raise ValueError(f"max_request_tokens must be >= 1, got {max_request_tokens}")
        self.scheduler = scheduler
        self.renderer = renderer
        self.tokenizer = renderer.tokenizer
        self.model_name = model_name
        self.context = context
        self.default_max_tokens = default_max_tokens
        self.max_request_tokens = max_request_tokens
        self.max_n = max_n
        self.engine = scheduler.engine
        self.stats = {"chat_completions": 0, "prompt_tokens": 0, "completion_tokens": 0}
        self.constrain = constrain
        self._builder: GrammarBuilder | None = None

    def constraint(
        self, build: Callable[[GrammarBuilder], Constraint], param: str, *, prefill_only: bool = False
    ) -> Constraint:
        """``build(builder)`` checked: a 400 naming the field for an invalid schema, a missing llguidance
        or an engine that cannot constrain decoding. With ``prefill_only`` an engine that cannot constrain
        gets the constraint's prefill alone (grammar ``""``: not applied), built without llguidance."""
        engine_can = bool(self.engine.supports_grammar)
        if not (self.constrain and engine_can):
            if prefill_only:
                unchecked = GrammarBuilder.from_tokenizer(self.tokenizer, self.renderer.eos_id, check=False)
                try:
                    return replace(build(unchecked), grammar="")
                except ConstraintError as e:
                    raise BadRequest(400, f"{e.param}: {e.message}", e.param) from e
            why = f"this engine ({type(self.engine).__name__})" if self.constrain else "this server"
            raise BadRequest(400, f"{param}: {why} does not constrain decoding", param)
        try:
            if self._builder is None:
                self._builder = GrammarBuilder.from_tokenizer(self.tokenizer, self.renderer.eos_id)
            built = build(self._builder)
            check_grammar(built.grammar, param)
        except ConstraintUnavailable as e:
            raise BadRequest(400, f"{param}: {e}", param) from e
        except ConstraintError as e:
            raise BadRequest(400, f"{e.param}: {e.message}", e.param) from e
        return built

    # -- requests ----------------------------------------------------------------------------------------

    def prepare(self, req: ChatRequest) -> Prepared:
        if req.model is not None and req.model != self.model_name:
            raise BadRequest(
                404,
                f"model: {req.model!r} is not served here; this server serves {self.model_name!r}",
                "model",
            )
        n = req.n or 1
        if n > self.max_n:
            raise BadRequest(400, f"n: at most {self.max_n} completions per request here, got {n}", "n")
        if req.seed is not None and not self.scheduler.can_seed:
            raise BadRequest(400, "seed: this engine cannot be seeded", "seed")
        top = req.top_logprobs or 0
        if top and not self.engine.supports_top_logprobs:
            raise BadRequest(400, "top_logprobs: this engine does not report alternatives", "top_logprobs")
        if req.ignore_eos and not self.engine.supports_ignore_eos:
            raise BadRequest(400, "ignore_eos: this engine does not support it", "ignore_eos")
        use_tools = bool(req.tools) and req.tool_choice != "none"
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if use_tools else None
        constraint = None
        wants_json, schema = req.json_output()
        if use_tools and (req.tool_choice == "required" or isinstance(req.tool_choice, dict)):
            parallel = req.parallel_tool_calls is not False
            frame = self.renderer.tool_format.frame
            if frame is None:
                raise BadRequest(
                    400,
                    f"tool_choice: the {self.renderer.tool_format.name} tool-call syntax of this model's "
                    "family cannot be forced; use tool_choice 'auto'",
                    "tool_choice",
                )
            constraint = self.constraint(
                lambda b: b.tool_calls(tools, req.tool_choice, parallel=parallel, frame=frame),
                "tool_choice",
                prefill_only=True,
            )
        elif wants_json:
            frame = self.renderer.tool_format.frame
            constraint = self.constraint(
                lambda b: b.json_output(schema, tools=tools, frame=frame), "response_format"
            )
        prefill = constraint.prefill if constraint is not None else ""
        temperature = 1.0 if req.temperature is None else req.temperature
        greedy = temperature == 0
        params = SamplingParams(
            temperature=1.0 if greedy else temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            max_new_tokens=1,
            stop=req.stops(),
            greedy=greedy,
            top_logprobs=top,
            ignore_eos=bool(req.ignore_eos),
            grammar=constraint.grammar if constraint is not None and constraint.grammar else None,
        )
        return Prepared(
            req=req,
            messages=chat_messages(req),
            tools=tools,
            prefill_text=prefill,
            n=n,
            seed=req.seed,
            stream=bool(req.stream),
            include_usage=bool(req.stream_options and req.stream_options.include_usage),
            logprobs=bool(req.logprobs),
            top_logprobs=top,
            requested_max=req.max_tokens or req.max_completion_tokens,
            params=params,
        )

    def render(self, prep: Prepared) -> list[int]:
        """The prompt ids of a stateless request: the chat template's rendering + the prefill."""
        try:
            ids = self.renderer.initial_ids(prep.messages, prep.tools)
        except Exception as e:  # template errors (e.g. roles the template rejects)
            raise BadRequest(400, f"messages: the chat template cannot render them: {e}", "messages") from e
        return ids + self.prefill_ids(prep)

    def prefill_ids(self, prep: Prepared) -> list[int]:
        if not prep.prefill_text:
            return []
        return list(self.tokenizer.encode(prep.prefill_text, add_special_tokens=False))

    def finish_params(self, prep: Prepared, prompt_len: int) -> Prepared:
        """``prep`` with ``max_new_tokens`` fitted to the context and the per-request token cap."""
        requested = prep.requested_max
        room = None
        if self.context is not None:
            room = self.context - prompt_len
            if room < 1:
                raise BadRequest(
                    400,
                    f"messages: the prompt has {prompt_len} tokens; the context is {self.context}",
                    "messages",
                )
            if requested is not None and requested > room:
                raise BadRequest(
                    400,
                    f"max_tokens: {requested} + {prompt_len} prompt tokens exceed the context of "
                    f"{self.context}",
                    "max_tokens",
                )
        cap = self.max_request_tokens
        if requested is not None:
            if prep.n * requested > cap:
                raise BadRequest(
                    400,
                    f"max_tokens: n x max_tokens = {prep.n} x {requested} = {prep.n * requested} exceeds the "
                    f"per-request cap of {cap} tokens",
                    "max_tokens",
                )
            max_new = requested
        else:
            max_new = min(self.default_max_tokens, cap // prep.n, *(() if room is None else (room,)))
            if max_new < 1:
                raise BadRequest(
                    400, f"n: {prep.n} completions exceed the per-request cap of {cap} tokens", "n"
                )
        return replace(prep, params=replace(prep.params, max_new_tokens=max_new))

    # -- responses ---------------------------------------------------------------------------------------

    def _token_entry(self, tok_id: int, lp: float) -> dict[str, Any]:
        token = self.tokenizer.decode([tok_id], skip_special_tokens=False)
        lp = max(float(lp), -9999.0) if not math.isnan(lp) else -9999.0
        return {"token": token, "logprob": lp, "bytes": list(token.encode("utf-8"))}

    def logprobs_content(self, prep: Prepared, row: RowState, start: int = 0, end: int | None = None):
        end = len(row.ids) if end is None else end
        out = []
        for j in range(start, end):
            entry = self._token_entry(row.ids[j], row.logprobs[j])
            tops = row.top_logprobs[j] if j < len(row.top_logprobs) else []
            entry["top_logprobs"] = [self._token_entry(t, v) for t, v in tops[: prep.top_logprobs]]
            out.append(entry)
        return out

    def completion(self, prep: Prepared, index: int, row: RowState) -> Completion:
        """The client's view of a finished row: text cut at the stop string, tool calls parsed."""
        text = row.text
        stop = row.meta.get("stop")
        if isinstance(stop, str) and stop in text:
            text = text[: text.index(stop)]
        text = prep.prefill_text + text
        calls: list[dict[str, Any]] = []
        if prep.use_tools:
            text, calls = extract_tool_calls(text, self.renderer.tool_format)
        message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
        if calls:
            message["tool_calls"] = calls
        reason = "tool_calls" if calls else ("length" if row.finish_reason == "length" else "stop")
        lps = {"content": self.logprobs_content(prep, row), "refusal": None} if prep.logprobs else None
        return Completion(index, message, reason, row, lps)

    def _usage(self, prompt_len: int, rows: list[RowState]) -> dict[str, int]:
        completion = sum(len(r.ids) for r in rows)
        return {
            "prompt_tokens": prompt_len,
            "completion_tokens": completion,
            "total_tokens": prompt_len + completion,
        }

    def _count(self, prompt_len: int, rows: list[RowState]) -> None:
        self.stats["chat_completions"] += 1
        self.stats["prompt_tokens"] += prompt_len
        self.stats["completion_tokens"] += sum(len(r.ids) for r in rows)

    async def respond(
        self,
        request: Request,
        prep: Prepared,
        prompt: list[int],
        *,
        on_done: Callable[[Prepared, list[int], list[Completion]], None] | None = None,
    ):
        """Generate and answer (JSON or an event stream). ``on_done(prep, prompt, completions)`` runs once
        the completion is complete, before its last bytes are sent (not for cancelled requests)."""
        prep = self.finish_params(prep, len(prompt))
        try:
            job = self.scheduler.submit([prompt] * prep.n, prep.params, seed=prep.seed)
        except RuntimeError as e:
            raise BadRequest(503, f"server: {e}", None) from e
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        job.add_listener(lambda: loop.call_soon_threadsafe(wake.set))
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if prep.stream:
            events = self._stream(request, prep, prompt, job, wake, cid, created, on_done)
            return StreamingResponse(
                events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
            )
        try:
            while not job.done:
                try:
                    await asyncio.wait_for(wake.wait(), timeout=1.0)
                except TimeoutError:
                    if await request.is_disconnected():
                        job.cancel()
                        return JSONResponse(status_code=499, content=error_body("client: disconnected", None))
                wake.clear()
        except asyncio.CancelledError:
            job.cancel()
            raise
        rows, _, error = job.snapshot()
        if error is not None:
            return JSONResponse(
                status_code=500, content=error_body(f"generation failed: {error}", None, "server_error")
            )
        done = [self.completion(prep, i, r) for i, r in enumerate(rows)]
        self._count(len(prompt), rows)
        if on_done is not None:
            on_done(prep, prompt, done)
        return JSONResponse(
            {
                "id": cid,
                "object": "chat.completion",
                "created": created,
                "model": self.model_name,
                "choices": [
                    {
                        "index": c.index,
                        "message": c.message,
                        "finish_reason": c.finish_reason,
                        "logprobs": c.logprobs,
                    }
                    for c in done
                ],
                "usage": self._usage(len(prompt), rows),
            }
        )

    def _visible(self, prep: Prepared, row: RowState) -> str:
        """The content that is safe to stream for an unfinished row (module docstring)."""
        text = prep.prefill_text + self.tokenizer.decode(row.ids, skip_special_tokens=True)
        text = text.rstrip("\ufffd")  # an incomplete character
        if prep.use_tools:
            text = self.renderer.tool_format.streamable(text)
        markers = prep.params.stop
        text = text[: len(text) - _held_back(text, markers)] if markers else text
        if prep.use_tools:  # extract_tool_calls strips the content
            text = text.strip()
        return text

    async def _stream(
        self, request, prep, prompt, job: Job, wake, cid, created, on_done
    ) -> AsyncIterator[str]:
        def event(choices: list[dict[str, Any]], **extra: Any) -> str:
            body = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.model_name,
            }
            body["choices"] = choices
            if prep.include_usage:
                body["usage"] = None
            body.update(extra)
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

        sent_text = [""] * prep.n
        sent_tokens = [0] * prep.n
        finished = [False] * prep.n
        finals: dict[int, Completion] = {}
        try:
            yield event(
                [
                    {
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                    for i in range(prep.n)
                ]
            )
            while True:
                await wake.wait()
                wake.clear()
                rows, done, error = job.snapshot()
                if error is not None:
                    failure = error_body(f"generation failed: {error}", None, "server_error")
                    yield f"data: {json.dumps(failure)}\n\n"
                    yield "data: [DONE]\n\n"
                    return
                for i, row in enumerate(rows):
                    if i not in finals and (row.finish_reason is not None or done):
                        finals[i] = self.completion(prep, i, row)
                if done:
                    self._count(len(prompt), rows)
                    if on_done is not None:
                        on_done(prep, prompt, [finals[i] for i in range(prep.n)])
                for i, row in enumerate(rows):
                    if finished[i]:
                        continue
                    final = finals.get(i)
                    content = (final.message["content"] or "") if final else self._visible(prep, row)
                    delta: dict[str, Any] = {}
                    if content.startswith(sent_text[i]) and len(content) > len(sent_text[i]):
                        delta["content"] = content[len(sent_text[i]) :]
                        sent_text[i] = content
                    lps = None
                    if prep.logprobs and len(row.ids) > sent_tokens[i]:
                        lps = {"content": self.logprobs_content(prep, row, sent_tokens[i]), "refusal": None}
                    sent_tokens[i] = len(row.ids)
                    if delta or lps:
                        yield event([{"index": i, "delta": delta, "logprobs": lps, "finish_reason": None}])
                    if final is not None:
                        for k, call in enumerate(final.message.get("tool_calls") or []):
                            yield event(
                                [
                                    {
                                        "index": i,
                                        "delta": {"tool_calls": [{"index": k, **call}]},
                                        "logprobs": None,
                                        "finish_reason": None,
                                    }
                                ]
                            )
                        yield event(
                            [
                                {
                                    "index": i,
                                    "delta": {},
                                    "logprobs": None,
                                    "finish_reason": final.finish_reason,
                                }
                            ]
                        )
                        finished[i] = True
                if done:
                    if prep.include_usage:
                        yield event([], usage=self._usage(len(prompt), rows))
                    yield "data: [DONE]\n\n"
                    return
        finally:
            if not job.done:
                job.cancel()
