"""Grammar-constrained decoding (horizonrl.inference.constrain): the grammar builder on its own, the HF
engine's masked sampling, a missing llguidance. vLLM's structured outputs:
tests/scale/test_vllm_constrained.py (``make test-vllm``).

The server side (forced tool calls and ``response_format`` through the ``openai`` client) is in
tests/serve/test_serve_openai.py.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch

llguidance = pytest.importorskip("llguidance")

from helpers.grammars import ARGS, HI, TOOLS, accepts  # noqa: E402
from horizonrl.inference.base import SamplingParams  # noqa: E402
from horizonrl.inference.constrain import (  # noqa: E402
    ConstraintError,
    ConstraintUnavailable,
    GrammarBuilder,
    GrammarVocab,
    RowMatchers,
    check_grammar,
    require_llguidance,
)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from horizonrl.models import ChatRenderer, load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    renderer = ChatRenderer(tok)
    return model, tok, renderer, GrammarBuilder.from_tokenizer(tok, renderer.eos_id)


@pytest.fixture(scope="module")
def vocab(tiny):
    return GrammarVocab(tiny[1])


# -- the builder -----------------------------------------------------------------------------------------


def test_literal_matches_atomic_tokens_as_tokens():
    b = GrammarBuilder(2, {"<tool_call>": 390, "</tool_call>": 391, "<|im_end|>": 2})
    assert b.literal('}</tool_call>\n<tool_call>{"a"') == '"}" <[391]> "\\n" <[390]> "{\\"a\\""'
    assert b.literal("") == '""' and b.eos == "<[2]>"
    assert GrammarBuilder(2).literal("<tool_call>") == '"<tool_call>"'


def test_tool_call_grammar_is_the_templates_exact_syntax(tiny, vocab):
    """What the chat template renders for a call (ChatRenderer.response_ids) is accepted token for token
    after the prefill, and the grammar is complete at the end-of-turn token; other spacing is not."""
    _, tok, renderer, b = tiny
    encode = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    call = {"function": {"name": "add", "arguments": {"a": 7, "tag": "y", "note": "hé"}}}
    ping = {"function": {"name": "ping", "arguments": {}}}
    for choice, calls in [
        ("required", [call]),
        ("required", [call, ping]),
        ({"type": "function", "function": {"name": "add"}}, [call]),
        ({"type": "function", "function": {"name": "ping"}}, [ping]),
    ]:
        c = b.tool_calls(TOOLS, choice)
        assert c.forced_call
        check_grammar(c.grammar, "tool_choice")
        ids = renderer.response_ids({"role": "assistant", "content": "", "tool_calls": calls})
        prefill = encode(c.prefill)
        assert ids[: len(prefill)] == prefill
        expect = len(calls) == 1 or choice == "required"
        assert accepts(vocab, c.grammar, ids[len(prefill) :]) == expect, (choice, calls)
    c = b.tool_calls(TOOLS, {"type": "function", "function": {"name": "add"}})
    assert c.prefill == '<tool_call>{"name": "add", "arguments":'
    compact = [*encode('{"a":7,"tag":"y"}}</tool_call>'), renderer.eos_id]
    assert not accepts(vocab, c.grammar, compact)
    invalid = [*encode('{"a": 700, "tag": "y"}}</tool_call>'), renderer.eos_id]  # over the maximum
    assert not accepts(vocab, c.grammar, invalid)
    no_eos = encode('{"a": 7, "tag": "y"}}</tool_call>')
    assert not accepts(vocab, c.grammar, no_eos)
    # parallel_tool_calls=False: exactly one call
    two = renderer.response_ids({"role": "assistant", "content": "", "tool_calls": [call, ping]})
    single = b.tool_calls(TOOLS, "required", parallel=False)
    assert not accepts(vocab, single.grammar, two[len(encode(single.prefill)) :])


def test_json_output_grammar(tiny, vocab):
    _, tok, renderer, b = tiny
    encode = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    c = b.json_output(ARGS)
    assert c.prefill == "" and not c.forced_call
    good = {"a": 3, "tag": "x", "note": "ok"}
    assert accepts(vocab, c.grammar, [*encode(json.dumps(good)), renderer.eos_id])
    assert not accepts(vocab, c.grammar, [*encode(json.dumps({"a": 3})), renderer.eos_id])  # tag missing
    anything = b.json_output(None)  # json_object: any object
    assert accepts(vocab, anything.grammar, [*encode('{"k": [1, {"z": null}]}'), renderer.eos_id])
    assert not accepts(vocab, anything.grammar, [*encode("[1]"), renderer.eos_id])
    # with tools (tool_choice auto): JSON content or the template's tool calls
    both = b.json_output(ARGS, tools=TOOLS)
    call = renderer.response_ids(
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "ping", "arguments": {}}}]}
    )
    assert accepts(vocab, both.grammar, call)
    assert accepts(vocab, both.grammar, [*encode(json.dumps(good)), renderer.eos_id])


def test_builder_errors_name_the_field():
    b = GrammarBuilder(2)
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "strin"}}}]
    with pytest.raises(ConstraintError) as info:
        b.tool_calls(bad, "required")
    assert info.value.param == "tools.0.function.parameters" and "strin" in info.value.message
    with pytest.raises(ConstraintError) as info:
        b.tool_calls(TOOLS, {"type": "function", "function": {"name": "nope"}})
    assert info.value.param == "tool_choice.function.name"
    with pytest.raises(ConstraintError) as info:
        b.tool_calls([], "required")
    assert info.value.param == "tool_choice"
    with pytest.raises(ConstraintError) as info:
        b.tool_calls([TOOLS[0], TOOLS[0]], "required")
    assert info.value.param == "tools"
    for schema in ({"type": "string", "minLength": 5, "maxLength": 2}, {"not": {}}, [1], "x"):
        with pytest.raises(ConstraintError) as info:
            b.json_output(schema)
        assert info.value.param == "response_format.json_schema.schema"
        assert "\n" not in info.value.message and len(info.value.message) < 500
    with pytest.raises(ConstraintError):
        check_grammar("start: %json {", "response_format")


def test_missing_llguidance_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "llguidance", None)
    with pytest.raises(ConstraintUnavailable, match=r"pip install 'horizonrl\[serve\]'"):
        require_llguidance()
    with pytest.raises(ConstraintUnavailable):
        GrammarBuilder(2).json_output(ARGS)
    assert GrammarBuilder(2, check=False).json_output(ARGS).grammar  # building text needs no llguidance


# -- the HF engine ---------------------------------------------------------------------------------------


def _engine(tiny, **kw):
    from horizonrl.inference.hf import HFEngine

    model, tok, renderer, _ = tiny
    engine = HFEngine(model, tok, **kw)
    engine.eos_ids = engine.eos_ids | {renderer.eos_id}
    return engine


def test_no_grammar_never_engages_llguidance(tiny, monkeypatch):
    """grammar=None: the same samples with llguidance unimportable (the constrained path never runs)."""
    _model, _tok, renderer, _ = tiny
    prompts = [renderer.initial_ids(HI), renderer.initial_ids(HI, TOOLS), [5, 6, 7]]
    params = SamplingParams(max_new_tokens=20, temperature=0.8, top_p=0.9, top_logprobs=2)
    want = [(g.ids, g.logprobs, g.meta) for g in _engine(tiny, seed=4).generate(prompts, params)]
    monkeypatch.setitem(sys.modules, "llguidance", None)
    got = [(g.ids, g.logprobs, g.meta) for g in _engine(tiny, seed=4).generate(prompts, params)]
    assert got == want
    seeded = _engine(tiny).generate(prompts, params, seeds=[1, 2, 3])
    assert all(len(g.ids) == len(g.logprobs) for g in seeded)


def test_constrained_rows_and_their_logprobs(tiny, vocab):
    """Every row's output is a complete sentence of the grammar, and each log-prob is log_softmax of the
    temperature-scaled logits over the tokens the grammar allowed at that step (checked by a plain
    forward and a fresh matcher)."""
    model, tok, renderer, b = tiny
    c = b.tool_calls(TOOLS, "required")
    prompt = renderer.initial_ids(HI, TOOLS) + tok.encode(c.prefill, add_special_tokens=False)
    params = SamplingParams(max_new_tokens=120, temperature=0.7, grammar=c.grammar, top_logprobs=3)
    engine = _engine(tiny, seed=1, max_batch_size=3, compact_fraction=0.0)
    gens = engine.generate([prompt] * 5, params, seeds=[10, 11, 12, 13, 14])
    for g in gens:
        assert g.finish_reason == "stop" and g.ids[-1] == renderer.eos_id == g.meta["stop"]
        assert accepts(vocab, c.grammar, g.ids)
        text = c.prefill + tok.decode(g.ids, skip_special_tokens=True)
        from horizonrl.api.chat import extract_tool_calls

        rest, calls = extract_tool_calls(text)
        assert rest == "" and calls
        for call in calls:
            args = json.loads(call["function"]["arguments"])
            assert call["function"]["name"] in ("add", "ping")
            assert args == {} if call["function"]["name"] == "ping" else set(args) >= {"a", "tag"}
    g = gens[0]
    m = RowMatchers(vocab, c.grammar, 1)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + g.ids])).logits[0, len(prompt) - 1 : -1].float() / 0.7
    for t, (tok_id, lp, top) in enumerate(zip(g.ids, g.logprobs, g.meta["top_logprobs"], strict=True)):
        allowed = torch.from_numpy(m.allowed([0], logits.shape[-1])[0])
        masked = torch.log_softmax(logits[t].masked_fill(~allowed, float("-inf")), -1)
        assert lp == pytest.approx(float(masked[tok_id]), abs=1e-4)
        assert all(allowed[i] for i, _ in top) and len(top) == min(3, int(allowed.sum()))
        assert m.consume(0, tok_id)
    assert any(lp == 0.0 for lp in g.logprobs)  # tokens the grammar forces are certain


def test_constrained_greedy_resumes_across_calls(tiny, vocab):
    """A row cut after k tokens and continued with ``generated=k`` ends exactly as one whole call."""
    _model, tok, renderer, b = tiny
    c = b.json_output(ARGS)
    prompt = renderer.initial_ids(HI)
    params = SamplingParams(max_new_tokens=60, greedy=True, grammar=c.grammar)
    engine = _engine(tiny)
    (whole,) = engine.generate([prompt], params)
    assert whole.finish_reason == "stop" and accepts(vocab, c.grammar, whole.ids)
    k = 5
    first = engine.generate([prompt], SamplingParams(max_new_tokens=k, greedy=True, grammar=c.grammar))[0]
    assert first.ids == whole.ids[:k] and first.finish_reason == "length"
    (rest,) = engine.generate([prompt + first.ids], params, generated=[k])
    assert first.ids + rest.ids == whole.ids
    json.loads(tok.decode(whole.ids, skip_special_tokens=True))
    with pytest.raises(ValueError, match="generated counts"):
        engine.generate([prompt], params, generated=[1, 2])


def test_a_row_whose_grammar_allows_nothing_is_marked_dead(tiny, vocab):
    """A live row whose grammar allows no token of the logits (e.g. a head narrower than the tokenizer) is
    left unmasked and marked dead, so it ends instead of sampling from NaNs; an invalid grammar is a
    ValueError before anything is sampled."""
    _, tok, renderer, _ = tiny
    engine = _engine(tiny)
    wanted = tok.encode("hello", add_special_tokens=False)[0]
    matchers = RowMatchers(vocab, f"start: <[{wanted}]>\n", 2)
    logits = torch.zeros((2, wanted))  # the only allowed token is past this width
    masked, dead = engine._constrain(logits, matchers, [0, 1], [True, False])
    assert dead == [True, False] and bool(torch.isfinite(masked).all())
    masked, dead = engine._constrain(torch.zeros((2, wanted + 1)), matchers, [0, 1], [True, True])
    assert dead == [False, False] and int(torch.isfinite(masked).sum()) == 2
    with pytest.raises(ValueError, match="invalid grammar"):
        engine.generate([renderer.initial_ids(HI)], SamplingParams(grammar=f"start: <[{len(tok) + 5}]>\n"))


def test_no_llguidance_is_a_400_from_the_server(tiny, monkeypatch):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from horizonrl.serve import create_app

    model, tok, _, _ = tiny
    from horizonrl.inference.hf import HFEngine

    monkeypatch.setitem(sys.modules, "llguidance", None)
    app = create_app(HFEngine(model, tok), tok, "tiny")
    with TestClient(app) as http:
        r = http.post(
            "/v1/chat/completions", json={"messages": HI, "tools": TOOLS, "tool_choice": "required"}
        )
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "tool_choice" and "pip install 'horizonrl[serve]'" in err["message"]
        plain = http.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 4})
        assert plain.status_code == 200  # unconstrained requests need no llguidance
