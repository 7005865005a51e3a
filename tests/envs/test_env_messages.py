"""A step's reply as separate messages (``StepResult.messages``, :class:`EnvMessage`): one tool message
per tool call, named after the tool.

The built-in environments answer each tool call of an assistant message with its own tool message
(named after the tool), so the chat template renders one result per call; a plain string is still one
message. The token-level checks against the published templates are in
``tests/models/test_env_messages_families.py``.
"""

from __future__ import annotations

import random

import pytest

from helpers.shelf_env import NUDGE, QUESTION, STOCK, Shelf, count_calls, loop_prompts
from horizonrl.envs import EnvMessage, StepResult, format_tool_call, get_env
from horizonrl.envs.core.tools import ToolCall, parse_tool_calls

# -- the type ---------------------------------------------------------------------------------------


def test_a_plain_string_is_one_message_with_the_envs_role():
    r = StepResult("Error: no such item", role="user", invalid=True)
    assert r.messages == (EnvMessage("user", "Error: no such item"),)
    assert (r.observation, r.role) == ("Error: no such item", "user")
    assert r.chat_messages() == [{"role": "user", "content": "Error: no such item"}]
    assert StepResult().messages == (EnvMessage("tool", ""),)  # the old default: an empty tool reply


def test_messages_give_the_joined_text_and_the_role():
    r = StepResult(messages=[EnvMessage("tool", "5", name="count"), {"role": "tool", "content": " 11"}])
    assert r.observation == "5\n 11" and r.role == "tool" and not r.has_user_message
    assert r.chat_messages() == [
        {"role": "tool", "content": "5", "name": "count"},
        {"role": "tool", "content": " 11"},
    ]
    mixed = StepResult(messages=[EnvMessage("tool", "5"), EnvMessage("user", "Go on.")])
    assert mixed.role == "user" and mixed.has_user_message
    call = EnvMessage("tool", "ok", tool_call_id="call_0")
    assert call.to_chat() == {"role": "tool", "content": "ok", "tool_call_id": "call_0"}


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: EnvMessage("assistant", "x"),
            r"EnvMessage.role must be one of \('tool', 'user'\), got 'assistant'",
        ),
        (lambda: EnvMessage("tool", 5), "EnvMessage.content must be a string, got int 5"),
        (
            lambda: EnvMessage("tool", "x", name=""),
            "EnvMessage.name must be a non-empty string or None, got ''",
        ),
        (lambda: EnvMessage("user", "x", tool_call_id="c1"), "tool_call_id='c1' is set on a 'user' message"),
        (
            lambda: StepResult(["a", "b"]),
            r"StepResult.observation must be a string, got list.*StepResult.messages",
        ),
        (lambda: StepResult(messages="a"), "StepResult.messages must be a list of EnvMessage, got str 'a'"),
        (
            lambda: StepResult(role="system"),
            r"StepResult.role must be one of \('tool', 'user'\), got 'system'",
        ),
        (
            lambda: StepResult(messages=[{"role": "tool", "text": "x"}]),
            r"StepResult.messages\[0\]: keys must be .*missing \['content'\], unknown \['text'\]",
        ),
        (
            lambda: StepResult(messages=[EnvMessage("tool", "a"), 7]),
            r"StepResult.messages\[1\] must be an EnvMessage or a mapping.*got int 7",
        ),
        (
            lambda: StepResult(messages=[{"role": "bot", "content": "x"}]),
            r"StepResult.messages\[0\]: EnvMessage.role must be one of .*got 'bot'",
        ),
        (
            lambda: StepResult("other", messages=[EnvMessage("tool", "a")]),
            "give the reply as observation='other' or as messages, not both",
        ),
    ],
)
def test_a_malformed_reply_is_an_error_naming_the_field_and_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_a_reply_survives_pickling_and_the_rollout_record():
    """Environments in Ray workers send their StepResult pickled; the rollout JSONL keeps the messages."""
    import pickle

    from horizonrl.trajectory import Rollout, Segment, Turn
    from horizonrl.trajectory.types import rollout_from_dict, rollout_to_dict

    r = StepResult(messages=[EnvMessage("tool", "5", name="count"), EnvMessage("user", "Go on.")], reward=0.5)
    assert pickle.loads(pickle.dumps(r)) == r
    turn = Turn(prompt_ids=[1], response_ids=[2], logprobs=[0.0], info={"obs_messages": r.chat_messages()})
    rollout = Rollout(uid="u", task_id="t", group_id="g", segments=[Segment(kind="normal", turns=[turn])])
    back = rollout_from_dict(rollout_to_dict(rollout))
    assert back.turns[0].info["obs_messages"] == r.chat_messages()


# -- the built-in environments ------------------------------------------------------------------------

TOOL_ENVS = ["arithmetic", "lookup", "rooms", "household", "search", "math_python", "airline"]


def _started(name: str):
    env = get_env(name)()
    env.reset(env.tasks(1, seed=0, split="train")[0])
    return env


@pytest.mark.parametrize("name", TOOL_ENVS)
def test_each_builtin_env_answers_two_calls_with_two_tool_messages(name):
    """The expert's call, twice in one message: one tool message per call, the first equal to what the
    same call alone returns on a fresh episode (so the messages are the results, not a split text)."""
    env = _started(name)
    action = env.expert_action(random.Random(0), 0.0)
    (call,) = [c for c in parse_tool_calls(action, env.tools) if isinstance(c, ToolCall)]
    alone = _started(name).step(action)
    both = env.step(action + "\n" + action)
    assert [(m.role, m.name) for m in both.messages] == [("tool", call.name), ("tool", call.name)]
    assert both.messages[0].content == alone.observation
    assert both.observation == "\n".join(m.content for m in both.messages)
    assert (both.role, both.tool_calls) == ("tool", 2)


def test_a_malformed_call_and_calls_past_the_limit_are_their_own_messages():
    env = _started("arithmetic")
    good = format_tool_call("calculator", {"expression": "2 + 3"})
    res = env.step('<tool_call>{"name": "calculator", "arguments": 3}</tool_call>' + good)
    (bad, ok) = res.messages
    assert (bad.role, bad.name, ok.content, ok.name) == ("tool", "calculator", "5", "calculator")
    assert bad.content.startswith('Error: "arguments" must be a JSON object') and res.invalid
    res = env.step(good * 6)  # max_calls_per_turn = 4
    assert [m.content for m in res.messages] == ["5"] * 4 + ["Only the first 4 tool calls were run."]
    assert res.tool_calls == 4


def test_replies_without_calls_are_one_user_message():
    env = _started("arithmetic")
    reminder = env.step("I am thinking.")
    assert len(reminder.messages) == 1 and reminder.messages[0].role == "user" and reminder.invalid
    verdict = env.step("<answer>0</answer>")
    assert [m.role for m in verdict.messages] == ["user"] and verdict.done


def test_out_of_steps_follows_the_tool_results_as_a_user_message():
    env = get_env("lookup")()
    task = env.tasks(1, seed=0, split="train")[0]
    env.reset(type(task)(task.id, task.prompt, task.answer, task.aliases, {**task.meta, "max_steps": 1}))
    res = env.step(env.expert_action(random.Random(0), 0.0))
    assert [m.role for m in res.messages] == ["tool", "user"] and res.messages[1].content == "Out of steps."
    assert res.done and res.observation.endswith("\nOut of steps.")


def test_airline_answers_the_customer_with_one_user_message():
    env = _started("airline")
    res = env.step("Could you tell me your reservation number, please?")
    assert [m.role for m in res.messages] == ["user"] and res.messages[0].content == res.observation


def test_verifiers_keeps_each_added_message_and_its_call_id():
    """The hub adapter's reply: each message the environment added after the assistant's, tool results
    with their ``tool_call_id`` (verifiers itself is not needed to map them)."""
    from horizonrl.envs.hubs.verifiers_env import VerifiersEnv

    env = object.__new__(VerifiersEnv)
    env.knobs, env.where, env.state = {"obs_key": "observation"}, "verifiers environment 'x'", {"turn": 1}
    env._sent = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    request = [
        *env._sent,
        {"role": "assistant", "content": "", "tool_calls": ["..."]},
        {"role": "tool", "content": "5", "tool_call_id": "call_1_0"},
        {"role": "tool", "content": [{"type": "text", "text": "11"}], "tool_call_id": "call_1_1"},
        {"role": "user", "content": "Anything else?"},
    ]
    res = env._observe(request, 2)
    assert res.messages == (
        EnvMessage("tool", "5", tool_call_id="call_1_0"),
        EnvMessage("tool", "11", tool_call_id="call_1_1"),
        EnvMessage("user", "Anything else?"),
    )
    assert (res.role, res.observation, res.obs_key, res.tool_calls) == (
        "user",
        "5\n11\nAnything else?",
        "5\n11\nAnything else?",
        2,
    )


# -- the agent loop on the default install's template (the tiny model's ChatML) -----------------------


@pytest.fixture(scope="module")
def tiny_tok():
    from horizonrl.models.loading import load_tokenizer
    from horizonrl.models.shipped import SHIPPED_DIR

    return load_tokenizer(SHIPPED_DIR)


@pytest.mark.parametrize(
    ("nudge", "string", "replies"),
    [
        (False, False, [{"role": "tool", "content": STOCK["pears"]}, {"role": "tool", "content": "11"}]),
        (True, False, [{"role": "tool", "content": STOCK["pears"]}, {"role": "user", "content": NUDGE}]),
        (False, True, [{"role": "tool", "content": STOCK["pears"] + "\n11"}]),  # a custom env's one string
    ],
)
def test_the_loop_renders_each_message_as_the_tiny_models_template(tiny_tok, nudge, string, replies):
    """Two results are two ``<tool_response>`` blocks, a result then a user message two turns, and a
    custom environment that returns one string still gets one message (its pre-list behaviour)."""
    from horizonrl.models.chat import ChatRenderer

    class OneString(Shelf):
        def step(self, action):
            result = super().step(action)
            return result if result.done else StepResult(result.observation, tool_calls=result.tool_calls)

    renderer = ChatRenderer(tiny_tok)
    renderer.check_tokens = True
    env = (OneString if string else Shelf)(nudge=nudge)
    first = count_calls("chatml", ["pears"] if nudge else ["pears", "plums"])
    prompts, ep = loop_prompts(
        renderer, env, [first, {"role": "assistant", "content": "<answer>16</answer>"}]
    )
    tools = [t.to_schema() for t in env.tools]
    conversation = [
        {"role": "system", "content": Shelf.system_prompt},
        {"role": "user", "content": QUESTION},
        first,
        *replies,
    ]
    text = tiny_tok.apply_chat_template(conversation, tools=tools, tokenize=False, add_generation_prompt=True)
    assert prompts[1] == tiny_tok.encode(text, add_special_tokens=False)
    assert text.count("<tool_response>") == sum(r["role"] == "tool" for r in replies)  # one per message
    assert "token_mismatch" not in ep.rollout.env


def test_check_tokens_sees_replies_rendered_as_one_joined_message(tiny_tok, monkeypatch):
    """``rollout.check_tokens`` compares with a transcript of the separate messages, so the pre-list
    rendering (the results joined into one tool message) is reported, at the second result."""
    from horizonrl.agents import context
    from horizonrl.models.chat import ChatRenderer

    def joined(ep, turn, result):  # how a step's reply was rendered before it had messages
        one = [{"role": result.role, "content": result.observation}]
        return list(ep.renderer.end_of_turn_ids(turn.response_ids)) + ep.renderer.continuation_ids(one)

    monkeypatch.setattr(context, "observation_ids", joined)
    renderer = ChatRenderer(tiny_tok)
    renderer.check_tokens = True
    first = count_calls("chatml", ["pears", "plums"])
    _, ep = loop_prompts(renderer, Shelf(), [first, {"role": "assistant", "content": "<answer>16</answer>"}])
    miss = ep.rollout.env["token_mismatch"]
    assert miss["turn"] == 1 and ep.rollout.env["metrics"]["token_mismatch"] == 1.0
    # kept: the second result ("11") after the first; the template closes the first block, opens a second
    assert miss["kept"][:2] == ["1", "1"]
    assert miss["rendered"][:3] == ["</tool_response>", "Ċ", "<tool_response>"]
    # a template gap, not a tokenization: the text differs and the text metric says so
    assert miss["same_text"] is False and ep.rollout.env["metrics"]["token_mismatch_text"] == 1.0


def test_first_mismatch_tells_a_non_canonical_tokenization_from_a_text_difference(tiny_tok):
    """The same text split into other tokens (what a model may sample) is ``same_text``; another token
    in its place is not."""
    from horizonrl.models.chat import ChatRenderer

    renderer = ChatRenderer(tiny_tok)
    messages = [{"role": "system", "content": Shelf.system_prompt}, {"role": "user", "content": QUESTION}]
    fresh = renderer.initial_ids(messages)
    vocab = tiny_tok.get_vocab()
    # the first multi-character token whose characters are each a token: split it into them
    k, pieces = next(
        (i, [vocab[c] for c in tok])
        for i, tok in enumerate(tiny_tok.convert_ids_to_tokens(fresh))
        if len(tok) > 1 and all(c in vocab for c in tok)
    )
    split = [*fresh[:k], *pieces, *fresh[k + 1 :]]
    assert tiny_tok.decode(split) == tiny_tok.decode(fresh) and split != fresh  # same text, other ids
    miss = renderer.first_mismatch(split, messages)
    assert miss["position"] == k and miss["same_text"] is True
    other = next(i for i in pieces if i != fresh[k])  # one character in place of the whole token
    changed = [*fresh[:k], other, *fresh[k + 1 :]]
    assert renderer.first_mismatch(changed, messages)["same_text"] is False
