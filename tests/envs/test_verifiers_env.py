"""The ``verifiers`` adapter (verifiers 0.3.1's classic API; ``make test-hubs``, its own venv): episodes
run the environment's tools and rubric, what cannot be mapped is a config error, failures end one
episode only, and GRPO trains on it token-exactly."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("verifiers")
pytestmark = pytest.mark.hubs

from helpers.hub_training import annotated, assert_token_exact_grpo, train_example, train_steps  # noqa: E402
from horizonrl.config import load_config  # noqa: E402
from horizonrl.envs import get_env  # noqa: E402
from horizonrl.errors import ConfigError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = str(ROOT / "examples" / "hubs")
ODD = str(ROOT / "tests" / "data" / "vf_envs")
ADD = {"id": "hz_vf_add", "path": EXAMPLES, "args": {"n": 24, "max_operand": 9}}


def _env(**knobs):
    return get_env("verifiers")(**knobs)


def _call(a: int, b: int) -> str:
    return f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'


def _operands(prompt: str) -> tuple[int, int]:
    a, b = prompt.removeprefix("What is ").removesuffix("?").split(" + ")
    return int(a), int(b)


def test_a_tool_env_episode_by_hand_runs_its_tools_and_rubric():
    env = _env(**ADD)  # imports examples/hubs/hz_vf_add.py through knob 'path'
    task = env.tasks(1, seed=0)[0]
    first = env.reset(task)
    a, b = _operands(first)
    assert first == task.prompt and task.answer == str(a + b)
    assert env.system_prompt == sys.modules["hz_vf_add"].SYSTEM
    (tool,) = env.tools
    assert tool.name == "add" and set(tool.parameters["properties"]) == {"a", "b"}
    r1 = env.step("Let me add. " + _call(a, b))
    assert (r1.observation, r1.role, r1.done, r1.tool_calls) == (str(a + b), "tool", False, 1)
    assert r1.obs_key == r1.observation
    r2 = env.step(f"The sum is {a + b}.")
    assert r2.done and r2.success and r2.reward == pytest.approx(1.2)  # correct (1.0) + numeric (0.2)
    m = r2.info["env_metrics"]
    assert (m["correct"], m["numeric"], m["total_tool_calls"], m["add_calls"], m["num_turns"]) == (
        1,
        1,
        1,
        1,
        2,
    )
    assert env.step("more").invalid


def test_wrong_answers_malformed_calls_and_the_turn_limit():
    env = _env(**ADD)
    task = env.tasks(2, seed=1)[1]
    a, b = _operands(env.reset(task))
    bad = env.step('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
    assert bad.invalid and not bad.done and "b" in bad.observation  # not forwarded to the environment
    assert env.step("I do not know.").reward == 0.0  # no tool call: the rollout ends, nothing right
    env.reset(task)
    assert env.step(f"{a + b + 1}").reward == pytest.approx(0.2)  # numeric only
    env.reset(task)
    results = [env.step(_call(a, b)) for _ in range(3)]  # ToolEnv's max_turns=3
    assert [r.done for r in results] == [False, False, True] and results[-1].reward == 0.0
    env.close()


def test_parallel_calls_come_back_as_one_tool_message_each_with_its_call_id():
    """verifiers' ToolEnv answers two calls with two tool messages; the adapter keeps them separate (each
    with the id of the call it answers), so the chat template renders two tool results, not one text."""
    env = _env(**ADD)
    a, b = _operands(env.reset(env.tasks(1, seed=0)[0]))
    res = env.step(_call(a, b) + _call(b, 1))
    assert [(m.role, m.content, m.tool_call_id) for m in res.messages] == [
        ("tool", str(a + b), "call_1_0"),
        ("tool", str(b + 1), "call_1_1"),
    ]
    assert (res.role, res.observation, res.tool_calls) == ("tool", f"{a + b}\n{b + 1}", 2)
    bad = env.step('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>' * 2)
    assert [m.role for m in bad.messages] == ["tool", "tool"] and bad.invalid
    env.close()


def test_tasks_are_rows_seeded_disjoint_and_cycled():
    train = _env(**ADD).tasks(30, seed=0)
    test = _env(**ADD).tasks(4, seed=0, split="test")
    assert [t.id for t in train] == [t.id for t in _env(**ADD).tasks(30, seed=0)]
    base = {t.id.split("#")[0] for t in train}
    assert not base & {t.id.split("#")[0] for t in test}
    assert len(base) < 30 and any("#1" in t.id for t in train)  # fewer train rows than tasks: cycled
    assert all(t.meta["env"] == "verifiers" and t.meta["id"] == "hz_vf_add" for t in train)


@pytest.mark.parametrize(
    "knobs, message",
    [
        ({"id": "no_such_vf_env"}, r"env.knobs.id='no_such_vf_env': verifiers could not load it"),
        ({"id": "hz_vf_odd", "path": ODD, "args": {"kind": "few_shot"}}, r"few-shot examples \(few_shot\)"),
        ({"id": "hz_vf_odd", "path": ODD, "args": {"kind": "group"}}, r"group-level reward functions"),
    ],
)
def test_what_cannot_be_mapped_is_a_config_error_naming_it(knobs, message):
    with pytest.raises(ConfigError, match=message):
        _env(**knobs)


@pytest.mark.parametrize(
    "knobs, message",
    [
        ({}, r"knob 'id' must name the environment"),
        ({"id": "x", "args": [1]}, r"knob 'args' must be a mapping"),
        ({"id": "x", "colour": 1}, r"unknown knob 'colour'"),
        ({"id": "x", "obs_key": "state"}, r"knob 'obs_key'"),
    ],
)
def test_bad_knobs_are_one_line_errors(knobs, message):
    with pytest.raises(ValueError, match=message):
        _env(**knobs)


def test_a_bad_reward_and_a_raising_tool_lose_nothing():
    env = _env(id="hz_vf_odd", path=ODD, args={"kind": "nan"})
    env.reset(env.tasks(1, seed=0)[0])
    r = env.step("5")
    assert r.done and r.reward == 0.0 and "not a finite number" in r.info["env_error"]
    env = _env(id="hz_vf_odd", path=ODD, args={"kind": "raising_tool"})
    env.reset(env.tasks(1, seed=0)[0])
    r1 = env.step('<tool_call>{"name": "boom", "arguments": {"x": 1}}</tool_call>')
    assert r1.observation == "boom" and not r1.done  # ToolEnv's own error message, the episode goes on
    r2 = env.step("done")
    assert r2.done and r2.reward == 0.5


def test_an_environment_that_raises_or_hangs_mid_episode_ends_that_episode_only():
    env = _env(id="hz_vf_odd", path=ODD, args={"kind": "raising_env"})
    task = env.tasks(1, seed=0)[0]
    env.reset(task)
    r = env.step("hello")
    assert r.done and r.reward == 0.0 and "the environment broke" in r.info["env_error"]
    env = _env(id="hz_vf_odd", path=ODD, args={"kind": "slow_env"}, timeout_s=0.5)
    env.reset(task)
    t0 = time.monotonic()
    r = env.step("hello")
    assert r.done and r.reward == 0.0 and "timeout_s=0.5" in r.info["env_error"]
    assert time.monotonic() - t0 < 10  # the stuck rollout is cancelled, not waited for
    assert env.reset(task) == task.prompt  # and the next episode starts cleanly
    env.close()
    env = _env(id="hz_vf_odd", path=ODD, args={"kind": "bad_setup"})
    first = env.reset(task)
    assert (
        first.startswith("Error: the rollout ended before its first model request") and "no sandbox" in first
    )
    r = env.step("hello")
    assert r.done and r.reward == 0.0 and "no sandbox" in r.info["env_error"]


def test_rtpo_refuses_it(tiny_model_dir, tmp_path):
    from horizonrl.train.methods.reverse_turn import ReverseTurnTrainer

    cfg = load_config(
        None,
        [
            f"model.path={tiny_model_dir}",
            "train.trainer=rtpo",
            "env.name=verifiers",
            f"env.knobs={json.dumps(ADD)}",
            "train.progress=false",
            f"train.out_dir={tmp_path / 'run'}",
        ],
    )
    with pytest.raises(ConfigError, match="cannot fork"):
        ReverseTurnTrainer(cfg)


def _rubric_reward(rollout) -> float:
    """The example rubric's weighted sum, from the metrics the last step carries."""
    m = rollout.turns[-1].info["env_metrics"]
    return 1.0 * m["correct"] + 0.2 * m["numeric"]


def test_grpo_trains_on_it_token_exact_and_credits_the_rubric(tiny_model_dir, tmp_path):
    from horizonrl.viz.data import Run, step_payload

    metrics = train_steps(tiny_model_dir, tmp_path, "verifiers", ADD)
    rollouts = [r for r, _ in assert_token_exact_grpo(tmp_path, metrics)]
    finished = [r for r in rollouts if r.turns[-1].info.get("env_metrics")]
    assert finished and all(r.reward == pytest.approx(_rubric_reward(r)) for r in finished)
    assert any(r.reward > 0 for r in rollouts)
    assert len(step_payload(Run(tmp_path), "step_2")["R"]) == 8  # the viewer shows every rollout


def test_a_step_credit_method_trains_on_it(tiny_model_dir, tmp_path):
    metrics = train_steps(tiny_model_dir, tmp_path, "verifiers", ADD, "algo.estimator=gigpo")
    assert all(abs(m["train/ratio_geomean"] - 1.0) < 1e-3 for m in metrics[1:])
    rows = annotated(tmp_path, 1)
    assert all(r.turns[-1].info.get("env_metrics") for r, _ in rows)  # every episode scored by its rubric
    inner = [t for r, _ in rows for t in r.turns[:-1]]  # the last observation ends the episode
    assert all(t.obs_key == t.observation for t in inner)


def test_the_gateway_route_records_the_environments_own_rollouts(tiny_model_dir, tmp_path):
    from horizonrl.config import from_dict
    from horizonrl.train.trainers.registry import make_trainer
    from horizonrl.trajectory import read_jsonl

    cfg = from_dict(
        {
            "model": {"path": str(tiny_model_dir), "device": "cpu"},
            "env": {"name": "verifiers", "knobs": ADD, "train_tasks": 8, "test_tasks": 2},
            "rollout": {"group_size": 2, "tasks_per_step": 2, "max_new_tokens": 12, "context_budget": 768},
            "train": {
                "trainer": "gateway",
                "steps": 2,
                "out_dir": str(tmp_path / "run"),
                "eval_samples": 1,
                "save_every": 0,
                "progress": False,
            },
            "gateway": {"callable": "horizonrl.envs.hubs.verifiers_env:gateway_rollout"},
        }
    )
    records = make_trainer(cfg).fit()
    steps = [r for r in records if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(m["gateway/episodes"] == 4 and abs(m["train/ratio_geomean"] - 1.0) < 1e-3 for m in steps)
    rollouts = list(read_jsonl(tmp_path / "run" / "rollouts" / "step_2.jsonl"))
    assert len(rollouts) == 4 and all(r.env["rewarded"] for r in rollouts)
    assert all(r.reward in (0.0, 0.2, 1.0, 1.2) for r in rollouts)


def test_the_hub_example_config_trains_two_steps(tiny_model_dir, tmp_path, monkeypatch):

    monkeypatch.chdir(ROOT)  # the example's knob 'path' is relative to the repository root
    records, cfg = train_example("examples/hubs/verifiers_add.yaml", tiny_model_dir, tmp_path)
    assert [r["step"] for r in records][-1] == 2 and cfg.env.name == "verifiers"
