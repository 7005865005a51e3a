"""`horizonrl serve` of the real tiny model answers the official ``openai`` client as the model computes:
log-probs, seeds, streaming, stop strings, tool choice, response formats and request limits.

One server per module (``python -m horizonrl.cli serve`` in a subprocess on a free 127.0.0.1 port,
slices of 8 tokens); every expectation is computed here independently of the server: greedy
log-probs by a plain full-forward loop over the model, prompt lengths by the chat template.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from helpers.ports import free_port

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import torch  # noqa: E402

MODEL = "tiny"
SLICE = 8
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def base(tiny_model_dir, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("serve-openai") / "server.log"
    cmd = [
        sys.executable,
        "-m",
        "horizonrl.cli",
        "serve",
        str(tiny_model_dir),
        "--port",
        str(port),
        "--device",
        "cpu",
        "--model-name",
        MODEL,
        "--slice-tokens",
        str(SLICE),
        "--max-request-tokens",
        "16384",
        "--log-level",
        "warning",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"}
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"horizonrl serve exited with {proc.returncode}:\n{log.read_text()}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"horizonrl serve did not come up in 90 s:\n{log.read_text()}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def client(base):
    with openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def local(tiny_model_dir):
    """The same model and tokenizer loaded here, for independent expectations."""
    from transformers import AutoModelForCausalLM

    from horizonrl.models import ChatRenderer, load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    return model, tok, ChatRenderer(tok)


def test_models_list_and_retrieve(client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    card = client.models.retrieve(MODEL)
    assert (card.id, card.object, card.owned_by) == (MODEL, "model", "horizonrl")
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("gpt-nope")
    assert info.value.body["param"] == "model" and "gpt-nope" in info.value.body["message"]


def test_seed_range_is_a_400_and_seeds_reproduce(client):
    for seed in (2**64, -(2**63) - 1, 10**30):
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=MODEL, messages=HI, seed=seed, max_tokens=4)
        assert info.value.status_code == 400 and info.value.body["param"] == "seed"
        assert info.value.body["message"].startswith("seed:")
    a, b = (
        client.chat.completions.create(model=MODEL, messages=HI, seed=2**64 - 1, max_tokens=20) for _ in "ab"
    )
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.completion_tokens == 20 or a.choices[0].finish_reason == "stop"


def _greedy_reference(local, messages, steps: int, k: int):
    """(token ids, log-probs, top-k ids, top-k log-probs) of greedy decoding, one full forward per step."""
    model, _, renderer = local
    ids = renderer.initial_ids(messages)
    out = []
    with torch.no_grad():
        for _ in range(steps):
            lp = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), -1)
            top = lp.topk(k)
            nxt = int(lp.argmax())
            out.append((nxt, float(lp[nxt]), top.indices.tolist(), top.values.tolist()))
            ids = [*ids, nxt]
            if nxt == renderer.eos_id:
                break
    return out


def test_logprobs_and_top_logprobs_match_a_plain_forward(client, local):
    _, tok, _ = local
    r = client.chat.completions.create(
        model=MODEL, messages=HI, temperature=0, max_tokens=12, logprobs=True, top_logprobs=3
    )
    entries = r.choices[0].logprobs.content
    ref = _greedy_reference(local, HI, 12, 3)
    assert len(entries) == len(ref) == r.usage.completion_tokens
    for e, (nxt, lp, top_ids, top_lps) in zip(entries, ref, strict=True):
        assert e.token == tok.decode([nxt]) and e.bytes == list(e.token.encode())
        assert e.logprob == pytest.approx(lp, abs=1e-4)
        assert [t.token for t in e.top_logprobs] == [tok.decode([i]) for i in top_ids]
        assert [t.logprob for t in e.top_logprobs] == pytest.approx(top_lps, abs=1e-4)
    plain = client.chat.completions.create(model=MODEL, messages=HI, temperature=0, max_tokens=12)
    assert plain.choices[0].logprobs is None
    assert plain.choices[0].message.content == r.choices[0].message.content


def _collect(stream):
    content, calls, reasons, lps, usage = [], {}, [], [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                content.append(c.delta.content)
            for tc in c.delta.tool_calls or []:
                calls.setdefault(tc.index, []).append(tc)
            if c.finish_reason:
                reasons.append(c.finish_reason)
            if c.logprobs and c.logprobs.content:
                lps.extend(c.logprobs.content)
    return "".join(content), calls, reasons, lps, usage


def test_stream_equals_the_non_streamed_completion(client):
    kw = dict(model=MODEL, messages=HI, seed=3, max_tokens=30, logprobs=True, top_logprobs=2)
    full = client.chat.completions.create(**kw)
    text, calls, reasons, lps, usage = _collect(
        client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    )
    assert text == full.choices[0].message.content and calls == {}
    assert reasons == [full.choices[0].finish_reason]
    assert [(e.token, e.logprob) for e in lps] == [
        (e.token, e.logprob) for e in full.choices[0].logprobs.content
    ]
    assert usage.completion_tokens == full.usage.completion_tokens == len(lps)
    # Raw server-sent events: OpenAI chunk objects, then [DONE].
    with httpx.stream(
        "POST",
        str(client.base_url) + "chat/completions",
        json={"messages": HI, "stream": True, "max_tokens": 5},
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    first = json.loads(lines[0].removeprefix("data: "))
    assert first["object"] == "chat.completion.chunk" and first["choices"][0]["delta"]["role"] == "assistant"


def test_stop_string_across_slices(client):
    """A seeded request runs in fixed slices of 8 tokens; a stop string made of the last token of one
    slice and the first of the next is found by the scheduler, not by a single engine call."""
    for seed in range(40):
        kw = dict(model=MODEL, messages=HI, seed=seed, max_tokens=40, logprobs=True)
        full = client.chat.completions.create(**kw)
        text = full.choices[0].message.content
        toks = [e.token for e in full.choices[0].logprobs.content]
        for b in range(SLICE, len(toks) - 1, SLICE):
            stop = toks[b - 1] + toks[b]
            head = "".join(toks[: b - 1])
            clean = stop.strip() and "\ufffd" not in stop and "<" not in stop
            if clean and text.startswith(head + stop) and text.find(stop) == len(head):
                cut = client.chat.completions.create(**kw, stop=[stop])
                assert cut.choices[0].message.content == head
                assert cut.choices[0].finish_reason == "stop"
                assert cut.usage.completion_tokens == b + 1  # cut after the token completing the stop
                streamed, _, reasons, _, _ = _collect(
                    client.chat.completions.create(**kw, stop=[stop], stream=True)
                )
                assert streamed == head and reasons == ["stop"]
                return
    pytest.fail("no seed gave a clean stop string across a slice boundary")


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "search the corpus",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "maxLength": 12}},
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "add two integers",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "minimum": -99, "maximum": 99},
                    "b": {"type": "integer", "minimum": -99, "maximum": 99},
                    "exact": {"type": "boolean"},
                },
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ANSWER = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "maxLength": 10},
        "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["answer", "confidence"],
    "additionalProperties": False,
}


def _validate(value, schema):
    """``value`` is valid under ``schema`` (jsonschema if installed, else the subset these tests use)."""
    try:
        import jsonschema
    except ImportError:
        jsonschema = None
    if jsonschema is not None:
        jsonschema.validate(value, schema)
        return
    assert isinstance(value, dict) and set(schema["required"]) <= set(value) <= set(schema["properties"])
    for key, v in value.items():
        spec = schema["properties"][key]
        kind = spec.get("type")
        if kind == "string":
            assert isinstance(v, str) and len(v) <= spec.get("maxLength", len(v))
        elif kind == "integer":
            assert isinstance(v, int) and not isinstance(v, bool) and spec["minimum"] <= v <= spec["maximum"]
        elif kind == "boolean":
            assert isinstance(v, bool)
        elif kind == "array":
            assert isinstance(v, list) and len(v) <= spec["maxItems"]
            assert all(x in spec["items"]["enum"] for x in v)


def _check_calls(choice, names):
    """A forced call's choice: tool calls only, each to one of ``names`` with schema-valid arguments."""
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None and choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        _validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    return [c.function.name for c in choice.message.tool_calls]


def test_tool_choice_required_gives_valid_calls(client, local):
    """The issue: ``required`` used to answer ``<tool_call>`` + noise. Now every sampled token follows the
    tool-call grammar, so the random tiny model writes schema-valid calls, over several seeds."""
    _, tok, renderer = local
    prompt = renderer.initial_ids(HI, TOOLS)
    seen = set()
    for seed in range(6):
        r = client.chat.completions.create(
            model=MODEL, messages=HI, tools=TOOLS, tool_choice="required", max_tokens=200, seed=seed
        )
        seen.update(_check_calls(r.choices[0], SCHEMAS))
        assert r.usage.prompt_tokens == len(prompt) + len(tok.encode("<tool_call>", add_special_tokens=False))
    assert seen == set(SCHEMAS)  # "required" lets the model pick any tool
    for seed in range(3):
        one = client.chat.completions.create(
            model=MODEL,
            messages=HI,
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=200,
            seed=seed,
            temperature=0.7,
        )
        assert len(_check_calls(one.choices[0], SCHEMAS)) == 1


def test_named_tool_choice_calls_that_tool(client, local):
    _, tok, renderer = local
    opening = '<tool_call>{"name": "add", "arguments":'
    prompt = renderer.initial_ids(HI, TOOLS)
    named = {"type": "function", "function": {"name": "add"}}
    for seed in range(4):
        r = client.chat.completions.create(
            model=MODEL, messages=HI, tools=TOOLS, tool_choice=named, max_tokens=200, seed=seed, n=2
        )
        for choice in r.choices:
            assert _check_calls(choice, SCHEMAS) == ["add"]
        assert r.usage.prompt_tokens == len(prompt) + len(tok.encode(opening, add_special_tokens=False))
    greedy = client.chat.completions.create(
        model=MODEL,
        messages=HI,
        tools=TOOLS,
        tool_choice=named,
        max_tokens=200,
        temperature=0,
        logprobs=True,
    )
    assert _check_calls(greedy.choices[0], SCHEMAS) == ["add"]
    entries = greedy.choices[0].logprobs.content
    assert entries[-1].token == "<|im_end|>" and all(e.logprob <= 0 for e in entries)
    # Streamed: the same call, sent whole when the completion ends.
    kw = dict(model=MODEL, messages=HI, tools=TOOLS, tool_choice=named, max_tokens=200, seed=11)
    full = client.chat.completions.create(**kw)
    text, calls, reasons, _, _ = _collect(client.chat.completions.create(**kw, stream=True))
    (call,) = full.choices[0].message.tool_calls
    assert text == "" and reasons == ["tool_calls"]
    assert [(c[0].function.name, c[0].function.arguments) for c in calls.values()] == [
        ("add", call.function.arguments)
    ]


def test_response_format_json_schema_and_json_object(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}}
    for seed in range(4):
        r = client.chat.completions.create(
            model=MODEL, messages=HI, response_format=fmt, max_tokens=200, seed=seed
        )
        choice = r.choices[0]
        assert choice.finish_reason == "stop" and choice.message.tool_calls is None
        _validate(json.loads(choice.message.content), ANSWER)
    # With tools and tool_choice auto the message is either schema-valid JSON or valid tool calls.
    for seed in range(3):
        r = client.chat.completions.create(
            model=MODEL, messages=HI, tools=TOOLS, response_format=fmt, max_tokens=200, seed=seed
        )
        choice = r.choices[0]
        if choice.message.tool_calls:
            _check_calls(choice, SCHEMAS)
        else:
            _validate(json.loads(choice.message.content), ANSWER)
    # json_object: any JSON object (the random model may run out of tokens inside a long key).
    for seed in range(3):
        r = client.chat.completions.create(
            model=MODEL, messages=HI, response_format={"type": "json_object"}, max_tokens=60, seed=seed
        )
        choice = r.choices[0]
        assert choice.message.content.startswith("{")
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content), dict)


def test_unconstrained_output_does_not_engage_the_grammar(client, local, monkeypatch):
    """``tool_choice: auto`` and plain requests sample exactly as before: a local scheduler over the same
    model, with llguidance made unimportable, gives the server's seeded tokens."""
    from horizonrl.api.routes import prepare_engine
    from horizonrl.api.scheduler import Scheduler
    from horizonrl.inference import HFEngine, SamplingParams

    model, tok, renderer = local
    monkeypatch.setitem(sys.modules, "llguidance", None)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the server (OMP_NUM_THREADS=1)
    engine = HFEngine(model, tok)
    prepare_engine(engine, renderer)
    sched = Scheduler(engine, tok, slice_tokens=SLICE)
    try:
        for kw in (dict(tools=TOOLS, tool_choice="auto"), dict(tools=TOOLS), {}):
            r = client.chat.completions.create(
                model=MODEL, messages=HI, seed=7, max_tokens=24, logprobs=True, **kw
            )
            job = sched.submit(
                [renderer.initial_ids(HI, kw.get("tools"))], SamplingParams(max_new_tokens=24), seed=7
            )
            assert job.wait(120) and job.error is None
            row = job.rows[0]
            entries = r.choices[0].logprobs.content
            assert [e.token for e in entries] == [tok.decode([t]) for t in row.ids]
            assert [e.logprob for e in entries] == pytest.approx(row.logprobs, abs=1e-4)
    finally:
        sched.close()
        torch.set_num_threads(threads)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        (
            dict(
                tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "strin"}}}],
                tool_choice="required",
            ),
            "tools.0.function.parameters",
        ),
        (
            dict(
                tools=[
                    TOOLS[0],
                    {
                        "type": "function",
                        "function": {"name": "g", "parameters": {"type": "object", "not": {}}},
                    },
                ],
                tool_choice={"type": "function", "function": {"name": "g"}},
            ),
            "tools.1.function.parameters",
        ),
        (
            dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
            "tool_choice.function.name",
        ),
        (dict(tool_choice="required"), "tool_choice"),
        (dict(tool_choice={"type": "function", "function": {"name": "add"}}), "tool_choice"),
        (
            dict(
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 2}},
                }
            ),
            "response_format.json_schema.schema",
        ),
        (
            dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}),
            "response_format",
        ),
        (dict(response_format={"type": "xml"}), "response_format"),
    ],
)
def test_bad_constraints_are_400_naming_the_field(client, extra, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=HI, max_tokens=8, **extra)
    body = info.value.body
    assert info.value.status_code == 400 and body["param"] == param, body
    assert body["message"].startswith(param + ":") and body["type"] == "invalid_request_error"


def test_request_cap_names_the_field(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=HI, n=16, max_tokens=1025)
    body = info.value.body
    assert body["param"] == "max_tokens" and body["message"].startswith("max_tokens:")


def test_small_request_is_not_queued_behind_a_large_one(base, client):
    """Old behaviour: one lock per request, so the small request waited for all 16 x 900 tokens."""
    large_msgs = [{"role": "user", "content": "Tell me a story."}]
    times: dict[str, float] = {}

    def large():
        r = client.chat.completions.create(
            model=MODEL, messages=large_msgs, n=16, max_tokens=900, extra_body={"ignore_eos": True}
        )
        times["large_end"] = time.perf_counter()
        times["large_tokens"] = r.usage.completion_tokens

    t0 = time.perf_counter()
    thread = threading.Thread(target=large)
    thread.start()
    time.sleep(0.3)
    s0 = time.perf_counter()
    small = client.chat.completions.create(
        model=MODEL, messages=HI, max_tokens=4, extra_body={"ignore_eos": True}
    )
    times["small_end"] = time.perf_counter()
    thread.join(timeout=300)
    assert small.usage.completion_tokens == 4 and times["large_tokens"] == 16 * 900
    small_latency, large_duration = times["small_end"] - s0, times["large_end"] - t0
    assert times["small_end"] < times["large_end"], (small_latency, large_duration)
    assert small_latency < 0.5 * large_duration, (small_latency, large_duration)
    assert httpx.get(base + "/health").json()["queued"] == 0
