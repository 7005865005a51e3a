"""``rollout.few_shot``: expert episodes shown before the task in the model family's own syntax."""

from __future__ import annotations

import json
import re

import pytest

from helpers.family_tokenizers import family_tokenizer
from horizonrl.agents.react import start_episode
from horizonrl.config import ConfigError, EnvConfig, from_dict
from horizonrl.envs.core.tools import ToolCall, parse_tool_calls
from horizonrl.models.chat import ChatRenderer
from horizonrl.train.rollout.env_setup import env_setup
from horizonrl.train.warmstart.few_shot import few_shot_messages, structured_turn

ARITH = EnvConfig(name="arithmetic", knobs={"n_ops": 2, "max_operand": 9, "ops": "+-"})


def test_structured_turn_splits_canonical_calls_and_keeps_other_text():
    text = 'First.<tool_call>{"name": "calc", "arguments": {"a": 1}}</tool_call> then '
    text += '<tool_call>{"name": "calc", "arguments": {"a": [2, "x"]}}</tool_call>'
    m = structured_turn(text)
    assert m == {
        "role": "assistant",
        "content": "First. then",
        "tool_calls": [
            {"name": "calc", "arguments": {"a": 1}},
            {"name": "calc", "arguments": {"a": [2, "x"]}},
        ],
    }
    # No call, or a malformed one: the text is shown as it was written.
    for plain in ("<answer>7</answer>", '<tool_call>{"name": "calc", "arguments": }</tool_call>'):
        assert structured_turn(plain) == {"role": "assistant", "content": plain}


def test_examples_are_successful_expert_episodes_without_system_messages():
    setup = env_setup(ARITH)
    shown = few_shot_messages(setup, 2, seed=0, max_turns=8)
    assert shown[0]["role"] == "user" and all(m["role"] != "system" for m in shown)
    starts = [i for i, m in enumerate(shown) if m["role"] == "user" and "Compute" in m["content"]]
    assert len(starts) == 2
    # Replay each example on a fresh environment: its calls are the expert's and it ends with success.
    tasks = {setup.make().reset(t): t for t in setup.tasks(16, seed=0 + 7_919, split="train")}
    for a, b in zip(starts, [*starts[1:], len(shown)], strict=True):
        env = setup.make()
        env.reset(tasks[shown[a]["content"]])
        for m in shown[a + 1 : b]:
            if m["role"] != "assistant":
                continue
            calls = "".join(
                f"<tool_call>{json.dumps({'name': c['name'], 'arguments': c['arguments']})}</tool_call>"
                for c in m.get("tool_calls", [])
            )
            result = env.step(m["content"] + calls)
        assert result.done and result.success
    # The same examples for the same seed; others for another.
    assert few_shot_messages(setup, 2, seed=0, max_turns=8) == shown
    assert few_shot_messages(setup, 2, seed=1, max_turns=8) != shown
    assert few_shot_messages(setup, 0, seed=0, max_turns=8) == ()


def test_examples_that_cannot_finish_are_a_config_error():
    with pytest.raises(ConfigError, match=r"rollout.few_shot=2: only 0 of 16 expert episodes succeeded"):
        few_shot_messages(env_setup(ARITH), 2, seed=0, max_turns=1)


@pytest.mark.parametrize(("family", "syntax"), [("qwen2_5", "<tool_call>\n{"), ("llama3_1", '{"name": ')])
def test_examples_are_rendered_in_the_family_tool_syntax(family, syntax):
    tok = family_tokenizer(family)
    renderer = ChatRenderer(tok)
    setup = env_setup(ARITH)
    shown = few_shot_messages(setup, 1, seed=0, max_turns=8)
    env = setup.make()
    task = setup.tasks(1, seed=0, split="test")[0]
    ep = start_episode(env, task, renderer, uid="u", group_id="g", preamble=shown)
    assert ep.messages[1:-1] == list(shown) and ep.messages[-1]["role"] == "user"
    assert ep.messages[-1]["content"] == env.reset(task)
    assert ep.context == renderer.initial_ids(ep.messages, tools=ep.tools)
    text = tok.decode(ep.context)
    calls = [c for m in shown for c in m.get("tool_calls", [])]
    assert calls and text.count(syntax) >= len(calls)
    # The tool calls in the prompt are the family's: no canonical compact block outside the tools text.
    turn = r"assistant(?:<\|end_header_id\|>)?\n+(.*?)(?:<\|im_end\|>|<\|eot_id\|>)"
    assistant_parts = re.findall(turn, text, re.S)
    assert len(assistant_parts) == sum(m["role"] == "assistant" for m in shown)
    for part, m in zip(assistant_parts, [m for m in shown if m["role"] == "assistant"], strict=True):
        parsed = [c for c in parse_tool_calls(renderer.canonical_text(part)) if isinstance(c, ToolCall)]
        assert [(c.name, c.arguments) for c in parsed] == [
            (c["name"], c["arguments"]) for c in m.get("tool_calls", [])
        ]


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ({"rollout": {"few_shot": 2, "agent": "stepwise"}}, r"rollout.agent='stepwise'"),
        ({"rollout": {"few_shot": 2}, "train": {"trainer": "gateway"}}, r"train.trainer='gateway'"),
        ({"rollout": {"few_shot": 17}}, r"rollout.few_shot"),
    ],
)
def test_few_shot_is_refused_where_no_prompt_shows_it(tiny_model_dir, override, match):
    from horizonrl.train.trainers.checks import check_names

    base = {"model": {"path": str(tiny_model_dir)}, "env": {"name": "rooms"}}
    extra = {"gateway": {"command": "true"}} if "train" in override else {}
    with pytest.raises(ConfigError, match=match):
        check_names(from_dict({**base, **override, **extra}))


def test_a_trained_episode_starts_with_the_examples(tiny_model_dir, tmp_path):
    from horizonrl.train.trainers.group import GroupTrainer

    cfg = from_dict(
        {
            "model": {"path": str(tiny_model_dir), "device": "cpu"},
            "env": {"name": "arithmetic", "knobs": dict(ARITH.knobs), "train_tasks": 4, "test_tasks": 2},
            "rollout": {"group_size": 2, "tasks_per_step": 2, "max_new_tokens": 8, "few_shot": 2},
            "train": {"steps": 1, "out_dir": str(tmp_path), "eval_every": 0, "progress": False},
        }
    )
    trainer = GroupTrainer(cfg)
    try:
        groups = trainer.collect(trainer.train_tasks[:2])
    finally:
        trainer.close()
    shown = few_shot_messages(env_setup(cfg.env), 2, seed=cfg.env.seed, max_turns=cfg.rollout.max_turns)
    assert trainer.preamble == shown
    rollouts = [r for g in groups for r in g.rollouts]
    assert len(rollouts) == 4
    for r in rollouts:
        env = trainer.make_env()
        user = {"role": "user", "content": env.reset(trainer.tasks_by_id[r.task_id])}
        messages = [{"role": "system", "content": env.system_prompt}, *shown, user]
        tools = [t.to_schema() for t in env.tools] or None
        assert r.segments[0].turns[0].prompt_ids == trainer.renderer.initial_ids(messages, tools=tools)
