"""`horizonrl serve` (a real uvicorn server on localhost), the OpenAI-compatible client and the LLM judge."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers.ports import free_port

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from horizonrl.inference.base import Engine, Generation  # noqa: E402
from horizonrl.inference.openai_client import (  # noqa: E402
    ChatClient,
    ChatRequestError,
    EndpointUnreachable,
)
from horizonrl.judge import LLMJudge, format_ground_truth, parse_verdict  # noqa: E402

# The prompt of the Mosaic paper (appendix C.3), typed here independently of horizonrl.judge.
PAPER_PROMPT = (
    "You are an expert evaluator. Given a question, a ground truth answer, and a predicted answer, judge "
    "whether the predicted answer correctly and completely matches the ground truth answer for the question. "
    "Accept equivalent wording, aliases, abbreviations, and semantically identical answers. Reply with only "
    "a number: 1 if correct, 0 if incorrect."
)


def _get(url: str) -> dict:
    return httpx.get(url, timeout=5).json()


# -- a tiny model served by a real `serve()` in a subprocess ------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """A 1-layer, width-16 model with a 300-token tokenizer (ChatML + tools template): built in ~1 s."""
    from horizonrl.models import TinyModelConfig, build_tiny_model, save_model_and_tokenizer, train_tokenizer

    texts = [PAPER_PROMPT, "Question: What is the capital of France? Answer: Paris", '{"query": "Ana"}'] * 4
    tok = train_tokenizer(texts, vocab_size=300)
    cfg = TinyModelConfig(
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=32,
        max_position_embeddings=512,
        tie_embeddings=False,  # tied random embeddings just repeat the last token; this gives garbage
        seed=2,
    )
    path = tmp_path_factory.mktemp("serve") / "tiny-judge"
    save_model_and_tokenizer(build_tiny_model(tok, cfg), tok, path)
    return path


@pytest.fixture(scope="module")
def server(tiny_dir, tmp_path_factory):
    """``horizonrl.serve.serve(tiny_dir, host, port)`` in a subprocess; yields its ``/v1`` base URL."""
    port = free_port()
    log = tmp_path_factory.mktemp("serve-log") / "server.log"
    code = (
        "import torch; torch.set_num_threads(1)\n"
        "from horizonrl.serve import serve\n"
        f"serve({str(tiny_dir)!r}, '127.0.0.1', {port}, device='cpu', log_level='warning')\n"
    )
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"serve() exited with {proc.returncode}:\n{log.read_text()}")
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"serve() did not come up in 90 s:\n{log.read_text()}")
            time.sleep(0.1)
        yield base + "/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_models_and_schema(server):
    with ChatClient(server, model="tiny-judge", max_retries=0) as client:
        assert client.models() == ["tiny-judge"]
        out = client.complete([{"role": "user", "content": "hello"}], temperature=0, max_tokens=6)
    body = out.raw
    assert body["object"] == "chat.completion" and body["model"] == "tiny-judge"
    assert body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert usage["prompt_tokens"] > 0 and 1 <= usage["completion_tokens"] <= 6
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_sampling_n_seed_stop_and_tool_messages(server):
    with ChatClient(server, model="tiny-judge", max_retries=0) as client:
        msgs = [
            {"role": "system", "content": "You search."},
            {"role": "user", "content": "Find Ana"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "search", "arguments": '{"query": "Ana"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "Ana lives in Paris."},
        ]
        tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
        a = client.complete(msgs, tools=tools, temperature=1.0, n=2, seed=7, max_tokens=8)
        b = client.complete(msgs, tools=tools, temperature=1.0, n=2, seed=7, max_tokens=8)
        assert len(a.raw["choices"]) == 2
        assert [c["message"] for c in a.raw["choices"]] == [c["message"] for c in b.raw["choices"]]
        assert a.raw["choices"][0]["message"] != a.raw["choices"][1]["message"]  # two samples
        assert a.usage["completion_tokens"] == 16  # 2 x 8 tokens: nothing ends a random model early
        greedy = client.complete([{"role": "user", "content": "hi"}], temperature=0, max_tokens=12)
        text = greedy.content
        word = re.search(r"[A-Za-z]{2,}", text[1:])
        assert word, f"expected a word in the tiny model's greedy output {text!r}"
        stop = word.group(0)
        cut = client.complete([{"role": "user", "content": "hi"}], temperature=0, max_tokens=12, stop=[stop])
        assert cut.content == text[: text.index(stop)]  # stop string excluded, greedy prefix kept
        assert cut.finish_reason == "stop"


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "user"}]}, "messages.0"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": 3}, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "top_p": 0}, "top_p"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**6}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 0}, "n"),
        ({"messages": [{"role": "user", "content": "x"}], "seed": 2**64}, "seed"),
        ({"messages": [{"role": "user", "content": "x"}], "seed": -(2**63) - 1}, "seed"),
        ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
        (
            {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21},
            "top_logprobs",
        ),
        ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, "tool_choice"),
        ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"}, "tool_choice"),
        (
            {
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "search"}}],
                "tool_choice": {"type": "function", "function": {"name": "lookup"}},
            },
            "tool_choice.function.name",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}},
            "response_format",
        ),
        ({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": 100}}, "logit_bias"),
        ({"messages": [{"role": "user", "content": "x"}], "presence_penalty": 0.5}, "presence_penalty"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 16, "max_tokens": 513}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 17}, "n"),
        (
            {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
            "tools.0.function",
        ),
    ],
)
def test_validation_errors_are_400_naming_the_field(server, payload, field):
    r = httpx.post(server + "/chat/completions", json=payload, timeout=10)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field
    assert err["message"].startswith(field + ":")


_M = '"messages": [{"role": "user", "content": "x"}]'


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("{" + _M + ', "seed": ' + "9" * 5000 + "}", "body"),  # over Python's int-parsing limit
        ("[" * 20000 + "]" * 20000, "body"),  # deep nesting
        ("{" + _M + ', "temperature": NaN}', "temperature"),
        ("{" + _M + ', "top_p": Infinity}', "top_p"),
        ("{" + _M + ', "n": true}', "n"),
        ("{" + _M + ', "max_tokens": 1.5}', "max_tokens"),
        ("[1, 2]", "body"),
        ('{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', "messages.0.content"),
        ("{" + _M + ', "stop": 5}', "stop"),
    ],
)
def test_raw_bodies_are_400_naming_the_field(server, body, field):
    r = httpx.post(server + "/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and err["message"].startswith(field + ":")


def test_unknown_path_is_a_404_in_the_openai_format(server):
    r = httpx.post(server + "/completions", json={"prompt": "x"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "path"


def test_unknown_model_is_404_and_client_raises_request_error(server):
    with ChatClient(server, model="gpt-nope", max_retries=3, backoff_s=5.0) as client:
        start = time.perf_counter()
        with pytest.raises(ChatRequestError, match=r"HTTP 404 .*'gpt-nope' is not served here") as info:
            client.chat([{"role": "user", "content": "x"}])
    assert info.value.status == 404
    assert time.perf_counter() - start < 5  # 4xx is not retried


def test_judge_against_server_parses_garbage_and_caches(server, tmp_path):
    cache = tmp_path / "judge.jsonl"
    question, gold, pred = "What is the capital of France?", ["Paris", "City of Paris"], "Lyon"
    before = _get(server.removesuffix("/v1") + "/health")["chat_completions"]
    with ChatClient(server, model="tiny-judge", max_retries=0) as client:
        judge = LLMJudge(client, cache_path=cache)
        first = judge.judge(question, gold, pred)
        # What the random model answers to the same greedy request, asked directly.
        prompt = (
            f"{PAPER_PROMPT}\nQuestion:{question}\nGround Truth Answer:\n- Paris\n- City of Paris\n"
            "Predicted Answer:Lyon"
        )
        direct = client.chat([{"role": "user", "content": prompt}], temperature=0, max_tokens=10)
    assert first.raw == direct
    assert first.raw.strip(" \n.*'\"`") not in ("0", "1")  # a random model does not answer the format
    assert (first.correct, first.score, first.parsed, first.cached) == (False, 0.0, False, False)
    after_first = _get(server.removesuffix("/v1") + "/health")["chat_completions"]
    assert after_first == before + 2  # the judge request and the direct one

    with ChatClient(server, model="tiny-judge", max_retries=0) as client:
        again = LLMJudge(client, cache_path=cache).judge(question, gold, pred)  # a fresh judge: disk cache
    assert again.cached and again.raw == first.raw and again.score == 0.0
    assert _get(server.removesuffix("/v1") + "/health")["chat_completions"] == after_first
    (entry,) = [json.loads(line) for line in cache.read_text().splitlines()]
    assert entry["gold"] == gold and entry["prediction"] == "Lyon" and entry["model"] == "tiny-judge"


# -- a scripted engine behind the same app: tool calls and verdicts ----------------------------------------


class ScriptedEngine(Engine):
    """Answers every prompt with the next scripted text; records the prompts it saw."""

    def __init__(self, tokenizer, replies):
        self.tokenizer, self.replies, self.prompts = tokenizer, list(replies), []

    def generate(self, prompts, params):
        out = []
        for p in prompts:
            self.prompts.append(list(p))
            text = self.replies.pop(0)
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            out.append(Generation(ids, [0.0] * len(ids), text, "stop"))
        return out

    def score(self, contexts, continuations):
        raise NotImplementedError("not used by the server")


@pytest.fixture
def scripted(tiny_dir):
    """``create_app`` over a :class:`ScriptedEngine`, run by uvicorn in a thread on a free port."""
    import uvicorn

    from horizonrl.models import load_tokenizer
    from horizonrl.serve import create_app

    tok = load_tokenizer(tiny_dir)
    engine = ScriptedEngine(tok, [])
    app = create_app(engine, tok, "scripted")
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    port = srv.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}/v1", engine, tok, app
    srv.should_exit = True
    thread.join(timeout=10)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "search the corpus",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    }
]


def test_tool_calls_in_response(scripted):
    url, engine, tok, _ = scripted
    engine.replies += [
        'Let me look.\n<tool_call>{"name": "search", "arguments": {"query": "Ana"}}</tool_call>\n'
        '<tool_call>{"name": "search", "arguments": {"query": "Bo"}}</tool_call>',
        '<tool_call>{"name": "search", "arguments": {"query": "Ana"}}</tool_call>',
        "<tool_call>{not json}</tool_call>",
    ]
    with ChatClient(url, model="scripted", max_retries=0) as client:
        out = client.complete([{"role": "user", "content": "Who is Ana?"}], tools=TOOLS)
        assert out.finish_reason == "tool_calls"
        assert out.content == "Let me look."
        assert [c["function"]["name"] for c in out.tool_calls] == ["search", "search"]
        assert [json.loads(c["function"]["arguments"]) for c in out.tool_calls] == [
            {"query": "Ana"},
            {"query": "Bo"},
        ]
        assert all(c["type"] == "function" and c["id"].startswith("call_") for c in out.tool_calls)
        assert len({c["id"] for c in out.tool_calls}) == 2
        assert out.raw["choices"][0]["message"]["content"] == "Let me look."
        # The tools were rendered into the prompt the engine saw.
        assert '"name": "search"' in tok.decode(engine.prompts[-1])

        only_call = client.complete([{"role": "user", "content": "Who is Ana?"}], tools=TOOLS)
        assert only_call.raw["choices"][0]["message"]["content"] is None
        assert len(only_call.tool_calls) == 1
        # Send the call back with its result: the template renders both into the next prompt.
        history = [
            {"role": "user", "content": "Who is Ana?"},
            {"role": "assistant", "content": None, "tool_calls": only_call.tool_calls},
            {"role": "tool", "tool_call_id": only_call.tool_calls[0]["id"], "content": "Ana is a pilot."},
        ]

        bad = client.complete(history, tools=TOOLS)
        seen = tok.decode(engine.prompts[-1])
        assert (
            '<|im_start|>assistant\n<tool_call>{"name": "search", "arguments": {"query": "Ana"}}</tool_call>'
            "<|im_end|>\n<|im_start|>user\n<tool_response>\nAna is a pilot.\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n"
        ) in seen
        assert bad.finish_reason == "stop" and bad.tool_calls == []
        assert bad.content == "<tool_call>{not json}</tool_call>"  # malformed calls stay in the text


def test_no_tools_means_no_tool_call_parsing(scripted):
    url, engine, _, _ = scripted
    text = '<tool_call>{"name": "search", "arguments": {}}</tool_call>'
    engine.replies += [text, text]
    with ChatClient(url, model="scripted", max_retries=0) as client:
        out = client.complete([{"role": "user", "content": "x"}])
        assert (out.content, out.tool_calls, out.finish_reason) == (text, [], "stop")
        none = client.complete([{"role": "user", "content": "x"}], tools=TOOLS, tool_choice="none")
        assert none.tool_calls == [] and none.content == text


@pytest.mark.parametrize(
    ("reply", "correct", "parsed"),
    [
        ("1", True, True),
        (" 0\n", False, True),
        ("**1**", True, True),
        ("1\nThey match.", True, True),
        ("<think>hmm, 0?</think>1", True, True),
        ("yes", False, False),
        ("10", False, False),
        ("0.5", False, False),
        ("", False, False),
        ("The answer is 1", False, False),
    ],
)
def test_parse_verdict(reply, correct, parsed):
    assert parse_verdict(reply) == (correct, parsed)


def test_judge_verdicts_through_server(scripted, tmp_path):
    url, engine, tok, app = scripted
    engine.replies += ["1", "0"]
    with ChatClient(url, model="scripted", max_retries=0) as client:
        judge = LLMJudge(client, cache_path=tmp_path / "c.jsonl")
        yes = judge.judge("Capital of France?", "Paris", "paris, France")
        no = judge.judge("Capital of France?", "Paris", "Lyon")
        assert (yes.correct, yes.score, yes.parsed) == (True, 1.0, True)
        assert (no.correct, no.score, no.parsed) == (False, 0.0, True)
        assert judge.judge("Capital of France?", "Paris", "Lyon").cached
        assert judge.judge("Capital of France?", "Paris", None).score == 0.0
    assert app.state.stats["chat_completions"] == 2 and judge.requests == 2
    expected = (
        f"{PAPER_PROMPT}\nQuestion:Capital of France?\nGround Truth Answer:Paris\nPredicted Answer:Lyon"
    )
    assert expected in tok.decode(engine.prompts[-1])


# -- client retries, backoff, timeouts and unreachable endpoints ---------------------------------------------


def _ok(content="1"):
    body = {
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        ]
    }
    return httpx.Response(200, json=body)


def test_retries_with_exponential_backoff_on_flaky_transport():
    attempts, delays = [], []

    def handler(request):
        attempts.append(json.loads(request.content))
        if len(attempts) == 1:
            raise httpx.ConnectError("connection refused", request=request)
        if len(attempts) == 2:
            return httpx.Response(503, json={"error": {"message": "overloaded"}})
        if len(attempts) == 3:
            raise httpx.ReadTimeout("read timed out", request=request)
        if len(attempts) == 4:
            return httpx.Response(429, headers={"Retry-After": "5"}, json={"error": {"message": "slow down"}})
        return _ok("fine")

    client = ChatClient(
        "http://judge.invalid/v1",
        "m",
        max_retries=4,
        backoff_s=0.5,
        transport=httpx.MockTransport(handler),
        sleep=delays.append,
    )
    assert client.chat([{"role": "user", "content": "q"}], temperature=0) == "fine"
    assert len(attempts) == 5
    assert delays == [0.5, 1.0, 2.0, 5.0]  # 0.5 * 2**k; the 4th (4.0) raised to Retry-After
    assert attempts[0] == {"model": "m", "messages": [{"role": "user", "content": "q"}], "temperature": 0}


def test_retries_exhausted_name_url_and_last_cause():
    calls, delays = [], []

    def handler(request):
        calls.append(1)
        return httpx.Response(500, json={"error": {"message": "boom"}})

    client = ChatClient(
        "http://judge.invalid/v1",
        "m",
        max_retries=3,
        backoff_s=1.0,
        max_backoff_s=3.5,
        transport=httpx.MockTransport(handler),
        sleep=delays.append,
    )
    with pytest.raises(EndpointUnreachable) as info:
        client.chat([{"role": "user", "content": "q"}])
    assert len(calls) == 4 and delays == [1.0, 2.0, 3.5]  # 1, 2, 4 capped at max_backoff_s
    msg = str(info.value)
    assert (
        "http://judge.invalid/v1/chat/completions" in msg and "4 attempt" in msg and "HTTP 500: boom" in msg
    )


def test_client_errors_are_not_retried():
    calls = []

    def handler(request):
        calls.append(1)
        return httpx.Response(401, json={"error": {"message": "bad key"}})

    client = ChatClient(
        "http://x.invalid/v1", "m", api_key="k", max_retries=5, transport=httpx.MockTransport(handler)
    )
    with pytest.raises(ChatRequestError, match=r"HTTP 401 .*bad key"):
        client.chat([{"role": "user", "content": "q"}])
    assert len(calls) == 1


def test_unreachable_endpoint_fails_fast_with_clear_error(tmp_path):
    port = free_port()  # nothing listens there
    url = f"http://127.0.0.1:{port}/v1"
    judge = LLMJudge(
        ChatClient(url, "judge", timeout_s=1.0, max_retries=2, backoff_s=0.01), cache_path=tmp_path / "c"
    )
    start = time.perf_counter()
    with pytest.raises(EndpointUnreachable) as info:
        judge.judge("q", "a", "b")
    assert time.perf_counter() - start < 3
    assert f"{url}/chat/completions" in str(info.value) and "ConnectError" in str(info.value)
    assert info.value.attempts == 3
    assert not (tmp_path / "c").exists()  # failures are not cached


def test_silent_endpoint_times_out():
    with socket.socket() as sock:  # accepts connections (kernel backlog) but never answers
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        client = ChatClient(url, "m", timeout_s=0.3, max_retries=1, backoff_s=0.0)
        start = time.perf_counter()
        with pytest.raises(EndpointUnreachable, match=r"timed out after 0\.3s"):
            client.chat([{"role": "user", "content": "q"}])
        assert time.perf_counter() - start < 3


def test_judge_prompt_cache_key_and_model(tmp_path):
    sent = []

    def handler(request):
        sent.append(json.loads(request.content))
        return _ok("0")

    def client(model):
        return ChatClient("http://j.invalid/v1", model, max_retries=0, transport=httpx.MockTransport(handler))

    judge = LLMJudge(client("a"), cache_path=tmp_path / "cache.jsonl")
    judge.judge("Q?", "Paris", "Lyon")
    assert sent[-1]["temperature"] == 0.0 and sent[-1]["max_tokens"] == 10  # the paper's settings
    assert sent[-1]["messages"] == [
        {
            "role": "user",
            "content": f"{PAPER_PROMPT}\nQuestion:Q?\nGround Truth Answer:Paris\nPredicted Answer:Lyon",
        }
    ]
    judge.judge("Q?", "Paris", "Lyon")
    judge.judge("Q?", ["Paris"], "Lyon")  # the same single gold as a list: same key
    assert len(sent) == 1
    judge.judge("Q?", "Paris", "Lyon ")  # another prediction
    LLMJudge(client("b"), cache_path=tmp_path / "cache.jsonl").judge("Q?", "Paris", "Lyon")  # another model
    assert len(sent) == 3
    assert format_ground_truth(["A", "B"]) == "\n- A\n- B"
    with pytest.raises(ValueError, match="empty"):
        format_ground_truth([])
    (tmp_path / "broken.jsonl").write_text("not json\n")
    with pytest.raises(ValueError, match=r"broken\.jsonl:1"):
        LLMJudge(client("a"), cache_path=tmp_path / "broken.jsonl")


def test_client_argument_errors():
    with pytest.raises(ValueError, match="base_url"):
        ChatClient("localhost:8000", "m")
    with pytest.raises(ValueError, match="max_retries"):
        ChatClient("http://x/v1", "m", max_retries=-1)
    with pytest.raises(ValueError, match="timeout_s"):
        ChatClient("http://x/v1", "m", timeout_s=0)


# -- loading ----------------------------------------------------------------------------------------------


def test_resolve_checkpoint_paths_and_missing_model(tmp_path):
    from horizonrl.serve import load_app, resolve_model_path

    run = tmp_path / "run"
    for step in (1, 2):
        ckpt = run / "checkpoints" / f"step_{step}"
        ckpt.mkdir(parents=True)
        (ckpt / "trainer_state.pt").write_bytes(b"x")
    (run / "checkpoints" / "latest").write_text("step_1\n")
    assert resolve_model_path(run) == str(run / "checkpoints" / "step_1")
    assert resolve_model_path(run / "checkpoints") == str(run / "checkpoints" / "step_1")
    assert resolve_model_path("tiny") == "tiny"
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_app(tmp_path / "nowhere", device="cpu")


def test_chat_endpoint_knob_becomes_a_bound_chat_callable():
    from horizonrl.train.rollout.env_knobs import resolve_knobs

    out = resolve_knobs(
        {
            "user": "llm",
            "user_chat": {"chat_endpoint": "http://127.0.0.1:9/v1", "model": "m", "temperature": 0.5},
        }
    )
    assert out["user"] == "llm"
    chat = out["user_chat"]
    assert chat.func.__self__.__class__.__name__ == "ChatClient" and chat.keywords == {"temperature": 0.5}
    with pytest.raises(ValueError, match="unknown chat endpoint settings"):
        resolve_knobs({"user_chat": {"chat_endpoint": "http://x/v1", "model": "m", "bogus": 1}})


def test_openai_client_streams_tool_calls_and_forced_tool_choice(scripted):
    openai = pytest.importorskip("openai")
    from horizonrl.models import ChatRenderer

    url, engine, tok, _ = scripted
    msgs = [{"role": "user", "content": "Who is Ana?"}]
    reply = (
        'Let me look.\n<tool_call>{"name": "search", "arguments": {"query": "Ana"}}</tool_call>\n'
        '<tool_call>{"name": "search", "arguments": {"query": "Bo"}}</tool_call>'
    )
    engine.replies += [reply, reply]
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
    full = client.chat.completions.create(model="scripted", messages=msgs, tools=TOOLS)
    content, calls, reasons = [], {}, []
    for chunk in client.chat.completions.create(model="scripted", messages=msgs, tools=TOOLS, stream=True):
        for c in chunk.choices:
            content.append(c.delta.content or "")
            for tc in c.delta.tool_calls or []:
                calls.setdefault(tc.index, []).append(tc)
            reasons += [c.finish_reason] if c.finish_reason else []
    assert "".join(content) == full.choices[0].message.content == "Let me look."
    assert reasons == ["tool_calls"] == [full.choices[0].finish_reason]
    streamed = [(c[0].function.name, json.loads(c[0].function.arguments)) for _, c in sorted(calls.items())]
    assert streamed == [("search", {"query": "Ana"}), ("search", {"query": "Bo"})]
    assert all(c[0].id.startswith("call_") and c[0].type == "function" for c in calls.values())

    base_prompt = ChatRenderer(tok).initial_ids(msgs, TOOLS)
    opening = '<tool_call>{"name": "search", "arguments":'
    engine.replies += [' {"query": "Cy"}}</tool_call>', '{"name": "search", "arguments": {}}</tool_call>']
    named = client.chat.completions.create(
        model="scripted",
        messages=msgs,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "search"}},
    )
    assert engine.prompts[-1] == base_prompt + tok.encode(opening, add_special_tokens=False)
    (call,) = named.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("search", {"query": "Cy"})
    assert named.choices[0].message.content is None and named.choices[0].finish_reason == "tool_calls"
    required = client.chat.completions.create(
        model="scripted", messages=msgs, tools=TOOLS, tool_choice="required"
    )
    assert engine.prompts[-1] == base_prompt + tok.encode("<tool_call>", add_special_tokens=False)
    (call,) = required.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("search", {})
