"""env.reward: named rewards, module:function rewards, and the LLM judge served by `horizonrl serve`."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.ports import free_port
from horizonrl.config import ConfigError, load_config
from horizonrl.envs import format_answer
from horizonrl.rewards import AnswerReward, RewardConfigError, make_reward
from horizonrl.train.rollout.env_setup import env_setup

# -- named and user rewards --------------------------------------------------------------------------------


def test_named_rewards():
    assert make_reward("exact_match")("The Paris!", ["paris"]) == 1.0
    assert make_reward("token_f1")("new york city", ["new york"]) == pytest.approx(0.8)
    r = make_reward("math_equivalent", {"timeout_s": 1.5})
    assert r("\\boxed{\\frac{1}{2}}", ["0.5"]) == 1.0 and r("0.6", ["0.5"]) == 0.0
    assert r.params == {"timeout_s": 1.5}


@pytest.mark.parametrize(
    ("spec", "params", "message"),
    [
        (
            "nope",
            {},
            r"env.reward: unknown reward 'nope'; known: \[.*'exact_match'.*\]; register one with "
            r".*; env.reward may also be judge or module:function",
        ),
        ("exact_match", {"x": 1}, "env.reward='exact_match': exact_match cannot be called"),
        ("math_equivalent", {"timeout_s": -1}, "timeout_s must be a number in"),
        ("no_such_module:f", {}, "env.reward: cannot import 'no_such_module'"),
        ("json:no_such_fn", {}, "env.reward='json:no_such_fn': 'json' has no attribute 'no_such_fn'"),
        ("json:__name__", {}, "str object is not callable"),
        ("judge", {"url": "localhost:8000"}, "env.reward_params.url='localhost:8000'"),
        ("judge", {"url": "http://x", "colour": 1}, r"unknown judge parameter\(s\) \['colour'\]"),
    ],
)
def test_bad_reward_specs_are_one_line_errors(spec, params, message):
    with pytest.raises((RewardConfigError, ValueError), match=message) as e:
        make_reward(spec, params)
    assert "\n" not in str(e.value)


USER_REWARDS = """
def contains(prediction, golds, *, bonus=0.0):
    return float(any(g.lower() in (prediction or "").lower() for g in golds)) + bonus

def with_question(prediction, golds, question):
    return 1.0 if question.startswith("Q:") and prediction == golds[0] else 0.0

def broken(prediction, golds):
    return float("nan")
"""


def test_module_function_rewards_from_a_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(USER_REWARDS)
    r = make_reward(f"{path}:contains", {"bonus": 0.5})
    assert r("it is Paris, France", ["paris"]) == 1.5 and not r.pass_question
    q = make_reward(f"{path}:with_question")
    assert q.pass_question and q("a", ["a"], "Q: x") == 1.0 and q("a", ["a"], "x") == 0.0
    nan = make_reward(f"{path}:broken")
    with pytest.raises(RewardConfigError, match=r"returned nan; a reward must be a finite number"):
        nan("x", ["y"])


def test_configured_reward_replaces_a_builtin_envs_check(tmp_path):
    path = tmp_path / "quarter.py"
    path.write_text("def quarter(prediction, golds):\n    return 0.25 if prediction != golds[0] else 1.0\n")
    cfg = load_config(None, ["env.name=lookup", f"env.reward={path}:quarter", "env.train_tasks=3"])
    setup = env_setup(cfg.env)
    assert isinstance(setup.reward, AnswerReward)
    task = setup.tasks(3, seed=0, split="train")[0]
    env = setup.make()
    env.reset(task)
    wrong = env.step(format_answer("Nobody"))
    assert wrong.done and wrong.reward == 0.25 and not wrong.success
    env.reset(task)
    right = env.step(format_answer(task.answer))
    assert right.reward == 1.0 and right.success
    # the same env without env.reward keeps its own exact-match check
    plain = env_setup(load_config(None, ["env.name=lookup", "env.train_tasks=3"]).env).make()
    plain.reset(task)
    assert plain.step(format_answer("Nobody")).reward == 0.0


def test_non_qa_envs_refuse_a_reward():
    with pytest.raises(ConfigError, match=r"env.reward: environment 'rooms' is not QA-style"):
        env_setup(load_config(None, ["env.name=rooms", "env.reward=exact_match"]).env)


def test_reward_config_syntax_is_checked_at_load():
    with pytest.raises(ConfigError, match=r"env.reward='two words': expected a reward name"):
        load_config(None, ["env.reward=two words"])
    with pytest.raises(ConfigError, match=r"env.reward_params=.*only together with env.reward"):
        load_config(None, ["env.reward_params={url: x}"])


# -- the judge ---------------------------------------------------------------------------------------------


def test_an_unreachable_judge_fails_at_start_with_its_url(tmp_path, capsys):
    pytest.importorskip("httpx")
    from horizonrl.cli import main

    url = f"http://127.0.0.1:{free_port()}/v1"
    t0 = time.monotonic()
    code = main(
        [
            "train",
            "env.name=qa",
            f"env.tasks={{path: {_qa_tasks(tmp_path)}}}",
            "env.reward=judge",
            f"env.reward_params={{url: {url}}}",
            f"train.out_dir={tmp_path / 'run'}",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(
        f"horizonrl: error: env.reward=judge: the judge endpoint {url} is unreachable"
    )
    assert err.count("\n") == 1 and time.monotonic() - t0 < 30
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing was trained


def _qa_tasks(tmp_path: Path) -> Path:
    rows = [
        {"prompt": f"What is {a} plus {b}?", "answer": str(a + b), "split": "test" if a == 3 else "train"}
        for a in range(4)
        for b in range(3)
    ]
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def judge_server(tiny_model_dir, tmp_path_factory):
    """`horizonrl serve <tiny model>` in a subprocess on 127.0.0.1; yields its /v1 URL; stopped after."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    cmd = [sys.executable, "-m", "horizonrl.cli", "serve", str(tiny_model_dir), "--port", str(port)]
    cmd += ["--device", "cpu", "--log-level", "warning"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"horizonrl serve exited with {proc.returncode}:\n{log.read_text()}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"horizonrl serve did not come up in 90 s:\n{log.read_text()}")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_run_rewarded_by_the_judge_served_by_horizonrl_serve(judge_server, tiny_model_dir, tmp_path):
    from horizonrl.judge import LLMJudge
    from horizonrl.train.trainers.group import GroupTrainer
    from horizonrl.trajectory import read_jsonl

    run = tmp_path / "run"
    cfg = load_config(
        None,
        [
            f"model.path={tiny_model_dir}",
            "env.name=qa",
            f"env.tasks={{path: {_qa_tasks(tmp_path)}, split: split}}",
            "env.reward=judge",
            f"env.reward_params={{url: {judge_server}, max_tokens: 4}}",
            "env.test_tasks=2",
            "rollout.group_size=2",
            "rollout.tasks_per_step=2",
            "rollout.max_new_tokens=8",
            "rollout.max_turns=1",
            "rollout.context_budget=512",
            "train.steps=2",
            "train.eval_samples=1",
            "train.progress=false",
            f"train.out_dir={run}",
        ],
    )
    trainer = GroupTrainer(cfg)
    judge = trainer.env_setup.reward.judge
    assert isinstance(judge, LLMJudge) and judge.client.model == "model"  # the name the server lists
    records = trainer.fit()
    assert records[-1]["step"] == 2  # the run completes

    cache = [json.loads(line) for line in (run / "judge_cache.jsonl").read_text().splitlines()]
    assert judge.requests == len(cache) >= 1  # every judgement reached the endpoint once, then the cache
    verdicts = {e["key"]: e for e in cache}
    tasks = trainer.tasks_by_id
    checked = 0
    for step in (1, 2):
        for r in read_jsonl(run / "rollouts" / f"step_{step}.jsonl"):
            assert r.final_answer is not None  # qa: every reply is the answer
            task = tasks[r.task_id]
            key = LLMJudge.cache_key(task.prompt, task.answer, r.final_answer, "model")
            assert r.reward == float(verdicts[key]["correct"]), (r.final_answer, verdicts[key])
            checked += 1
    assert checked == 8
    assert all(math.isfinite(m["reward/mean"]) for m in records if "reward/mean" in m)


def test_judge_reward_uses_its_cache_then_the_endpoint(judge_server, tmp_path):
    from horizonrl.judge import LLMJudge

    cfg = load_config(
        None,
        [
            "env.name=qa",
            f"env.tasks={{path: {_qa_tasks(tmp_path)}, split: split}}",
            "env.reward=judge",
            f"env.reward_params={{url: {judge_server}, model: model, cache: {tmp_path / 'cache.jsonl'}}}",
        ],
    )
    task = env_setup(cfg.env).tasks(1, seed=0, split="train")[0]
    # A verdict already in the cache is used as is (here: "correct" for a wrong answer, to tell it apart).
    key = LLMJudge.cache_key(task.prompt, task.answer, "forty-two", "model")
    seeded = {"key": key, "model": "model", "correct": True, "raw": "1", "parsed": True}
    (tmp_path / "cache.jsonl").write_text(json.dumps(seeded) + "\n")
    setup = env_setup(cfg.env)
    judge = setup.reward.judge
    env = setup.make()
    env.reset(task)
    res = env.step("forty-two")
    assert res.reward == 1.0 and res.success and judge.requests == 0
    env.reset(task)
    other = env.step("something else")  # not cached: asks the served tiny model, whatever it says
    assert judge.requests == 1
    entry = json.loads((tmp_path / "cache.jsonl").read_text().splitlines()[-1])
    assert entry["prediction"] == "something else" and other.reward == float(entry["correct"])
