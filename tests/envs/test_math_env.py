"""``math_python``: reasoning-gym tasks, the sandboxed python tool, expert, rewards, forking, cleanup."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import reasoning_gym

import horizonrl.envs.builtin.math_tool  # noqa: F401  (registers math_python)
from horizonrl.envs import format_tool_call, get_env, make_env
from horizonrl.envs.builtin.math_tool import MathPythonEnv, gold_contradicts_question
from horizonrl.envs.sandbox import sandbox_backend

FAST = {"timeout_s": 5.0, "cpu_s": 2, "memory_mb": 256}


def rg_entry(task) -> tuple[Any, dict]:
    """The task's reasoning-gym entry, regenerated straight from reasoning-gym."""
    m = task.meta
    ds = reasoning_gym.create_dataset(
        m["dataset"], seed=m["dataset_seed"], size=m["dataset_size"], **m["dataset_config"]
    )
    return ds, ds[m["index"]]


def run_expert(env, task, rng, noise=0.0, max_turns=8):
    env.reset(task)
    steps = []
    for _ in range(max_turns):
        action = env.expert_action(rng, noise)
        steps.append((action, env.step(action)))
        if steps[-1][1].done:
            break
    return steps


def children() -> set[int]:
    me, out = str(os.getpid()), set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[1] == me:
                    out.add(int(pid))
        except OSError:
            continue
    return out


def test_registered_with_a_python_tool_and_the_active_backend():
    assert get_env("math_python") is MathPythonEnv
    env = make_env("math_python")
    assert [t.name for t in env.tools] == ["python"] and env.tools[0].parameters["required"] == ["code"]
    assert env.sandbox == sandbox_backend()
    assert (MathPythonEnv.__doc__ or "").strip().splitlines()[0]


@pytest.mark.parametrize("split", ["train", "test"])
def test_expert_solves_tasks_with_one_python_call(split):
    env = MathPythonEnv(**FAST)
    tasks = env.tasks(8, seed=11, split=split)
    assert {t.meta["dataset"] for t in tasks} == {"gsm_symbolic", "basic_arithmetic"}
    for task in tasks:
        steps = run_expert(env, task, random.Random(0))
        (call, first), (answer, last) = steps
        assert '"name": "python"' in call and first.role == "tool" and not first.invalid
        assert first.observation == task.answer  # the program printed the reasoning-gym answer
        assert first.info["sandbox_status"] == ["ok"] and first.info["sandbox"] == env.sandbox
        assert answer == f"<answer>{task.answer}</answer>"
        assert last.done and last.success and last.reward == 1.0 and first.reward == 0.0


def test_tasks_are_reasoning_gym_entries_deterministic_and_split_disjoint():
    a = MathPythonEnv.make_tasks(40, seed=3)
    assert [dataclasses.asdict(t) for t in a] == [
        dataclasses.asdict(t) for t in MathPythonEnv.make_tasks(40, seed=3)
    ]
    assert [t.id for t in MathPythonEnv.make_tasks(40, seed=4)] != [t.id for t in a]
    for t in a[:10]:
        json.dumps(dataclasses.asdict(t))
        _, entry = rg_entry(t)
        assert t.prompt == entry["question"] and t.answer == entry["answer"]
        assert t.meta["env"] == "math_python" and t.meta["split"] == "train" and t.meta["max_steps"] == 6
    # a small pool forces repeats: identical questions must never cross the split
    knobs = {"datasets": ["basic_arithmetic"], "dataset_size": 300}
    train = {t.prompt for t in MathPythonEnv.make_tasks(150, seed=0, **knobs)}
    test = {t.prompt for t in MathPythonEnv.make_tasks(30, seed=1, split="test", **knobs)}
    assert len(train) == 150 and len(test) == 30 and not train & test


def test_dataset_config_reaches_reasoning_gym():
    config = {"basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 3, "max_digits": 3}}
    env = MathPythonEnv(datasets=["basic_arithmetic"], dataset_config=config, **FAST)
    for task in env.tasks(5, seed=0):
        _, entry = rg_entry(task)
        assert (
            entry["metadata"]["num_terms"] == 2 and task.meta["dataset_config"] == config["basic_arithmetic"]
        )
        assert run_expert(env, task, random.Random(0))[-1][1].success


def test_contradicted_answers_are_dropped_and_the_rest_kept():
    # reasoning-gym 0.1.25's simple path (allow_parentheses: false) scores left to right, ignoring
    # precedence, and may swap a divisor without changing the question. By hand:
    def entry(expression, answer):
        return {"answer": answer, "metadata": {"expression": expression}}

    assert gold_contradicts_question("basic_arithmetic", entry("28 + 37 * 83", "5395"))  # (28+37)*83
    assert not gold_contradicts_question("basic_arithmetic", entry("28 + 37 * 83", "3099"))
    assert gold_contradicts_question("basic_arithmetic", entry("13 / 92", "806"))
    assert not gold_contradicts_question("basic_arithmetic", entry("84 / 7 - 2", "10"))
    assert not gold_contradicts_question("basic_arithmetic", entry("3/ 4+10", "43/4"))  # random spacing
    assert not gold_contradicts_question("basic_arithmetic", entry("-(2 - 5) * 4", "12"))
    assert gold_contradicts_question("basic_arithmetic", entry("2 ** 3", "8"))  # not + - * /: unchecked
    assert gold_contradicts_question("basic_arithmetic", entry("1 / 0", "1"))
    assert not gold_contradicts_question("gsm_symbolic", entry("1 + 1", "3"))  # other datasets: not checked
    config = {
        "basic_arithmetic": {"min_terms": 2, "max_terms": 3, "max_digits": 3, "allow_parentheses": False}
    }
    knobs = {"datasets": ["basic_arithmetic"], "dataset_config": config}
    kept = MathPythonEnv.make_tasks(60, seed=0, **knobs)
    for t in kept:  # every kept question's own value is its answer (Python's precedence)
        expression = t.prompt.removeprefix("Calculate ").removesuffix(".")
        assert eval(expression) == int(t.answer), t.prompt

    def value(t):
        try:
            return eval(t.prompt.removeprefix("Calculate ").removesuffix("."))
        except ZeroDivisionError:
            return None

    raw = MathPythonEnv.make_tasks(60, seed=0, drop_contradicted=False, **knobs)
    wrong = [t for t in raw if value(t) != int(t.answer)]
    assert len(wrong) >= 10  # ~40 % of this config's entries contradict their question


def test_reward_is_the_reasoning_gym_score():
    task = MathPythonEnv.make_tasks(1, seed=0, datasets=["gsm_symbolic"])[0]
    ds, entry = rg_entry(task)
    wrong = str(int(task.answer) + 1)
    for partial, expected in ((True, ds.score_answer(wrong, entry)), (False, 0.0)):
        env = MathPythonEnv(partial_credit=partial)
        env.reset(task)
        res = env.step(f"<answer>{wrong}</answer>")
        assert res.done and not res.success and res.reward == expected and res.final_answer == wrong
    assert ds.score_answer(wrong, entry) == 0.01  # gsm_symbolic rewards a well-formed wrong number a little
    env = MathPythonEnv()
    env.reset(task)
    res = env.step(f"So the total is <answer>The answer is {task.answer}.</answer>")
    assert res.success and res.reward == 1.0 == ds.score_answer(f"The answer is {task.answer}.", entry)


@pytest.mark.parametrize(
    ("action", "role", "fragment"),
    [
        ('<tool_call>{"name": "python", "arguments": {"code": 1}}</tool_call>', "tool", "must be a string"),
        (
            '<tool_call>{"name": "python", "arguments": {}}</tool_call>',
            "tool",
            'missing required argument "code"',
        ),
        ("<tool_call>print(1)</tool_call>", "tool", "not valid JSON"),
        (
            '<tool_call>{"name": "calculator", "arguments": {}}</tool_call>',
            "tool",
            'unknown tool "calculator"',
        ),
        ('<tool_call>{"name": "python", "arguments": {"code": "print(1)"}', "tool", "missing </tool_call>"),
        ("I think it is 7.", "user", "No tool call or answer found"),
    ],
)
def test_malformed_actions_give_error_observations(action, role, fragment):
    env = MathPythonEnv(**FAST)
    task = env.tasks(1, seed=2)[0]
    env.reset(task)
    res = env.step(action)
    assert res.invalid and not res.done and res.reward == 0.0 and res.role == role
    assert fragment in res.observation, res.observation
    assert run_expert(env, task, random.Random(0))[-1][1].success


@pytest.fixture
def host_dir_outside_tmp():
    """A fresh writable host directory outside /tmp, wherever the checkout lives.

    Not under /tmp: bwrap gives the program a private /tmp, where a host path there merely does not exist
    (the write fails as ``error``, refused by nothing). Outside it, the sandbox must refuse the write.
    """
    for parent in (Path("/var/tmp"), Path(os.path.expanduser("~")), Path(__file__).resolve().parent):
        if parent.is_dir() and not parent.resolve().is_relative_to("/tmp") and os.access(parent, os.W_OK):
            path = Path(tempfile.mkdtemp(prefix="horizonrl-outside-", dir=parent))
            yield path
            shutil.rmtree(path)
            return
    pytest.skip("no writable directory outside /tmp on this machine")


def test_hostile_programs_are_tool_errors_and_the_env_keeps_working(host_dir_outside_tmp):
    env = MathPythonEnv(timeout_s=20.0, cpu_s=1, memory_mb=128, max_output_chars=500, max_steps=20)
    task = env.tasks(1, seed=5)[0]
    outside = host_dir_outside_tmp / "outside.txt"
    programs = {
        "while True:\n    pass": "cpu_limit",
        "x = bytearray(1 << 34)": "memory_limit",
        "import os\nwhile True:\n    os.fork()": "blocked",
        "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)": "blocked",
        f"open({str(outside)!r}, 'w').write('x')": "blocked",
        "while True:\n    print('x' * 100)": "output_limit",
        "1 / 0": "error",
    }
    env.reset(task)
    for code, status in programs.items():
        res = env.step(format_tool_call("python", {"code": code}))
        assert res.invalid and res.role == "tool" and not res.done, res
        assert res.observation.startswith("Error: ") and len(res.observation) < 2000
        assert res.info["tool_errors"] == 1 and res.info["sandbox_status"] == [status]
    assert list(host_dir_outside_tmp.iterdir()) == []  # nothing was written outside
    assert env.state["calls"] == len(programs) and env.state["outputs"] == []
    ok = env.step(format_tool_call("python", {"code": "print(6 * 7)"}))
    assert ok.observation == "42" and not ok.invalid and ok.obs_key.endswith("outputs=42")
    assert run_expert(env, task, random.Random(0))[-1][1].success


def test_two_calls_in_one_message_run_in_order():
    env = MathPythonEnv(**FAST)
    env.reset(env.tasks(1, seed=0)[0])
    two = format_tool_call("python", {"code": "print(1)"}) + format_tool_call("python", {"code": "print(2)"})
    res = env.step(two + format_tool_call("python", {"code": "print(3)"}))
    assert res.observation == "1\n2\nOnly the first 2 tool calls were run." and res.tool_calls == 2


def test_snapshot_restore_replays_identically():
    env = MathPythonEnv(**FAST)
    for i, task in enumerate(env.tasks(2, seed=8)):
        env.reset(task)
        rng = random.Random(i)
        snaps, actions, results = [env.snapshot()], [], []
        for _ in range(6):
            actions.append(env.expert_action(rng, noise=0.4))
            results.append(env.step(actions[-1]))
            snaps.append(env.snapshot())
            if results[-1].done:
                break
        for t in range(len(actions)):
            env.restore(snaps[t])
            env.step(format_tool_call("python", {"code": "print('diverge')"}))
            env.restore(snaps[t])
            replay = [env.step(a) for a in actions[t:]]
            assert [dataclasses.asdict(r) for r in replay] == [dataclasses.asdict(r) for r in results[t:]]
            assert env.snapshot() == snaps[-1]


def test_noisy_expert_fails_and_is_deterministic():
    env = MathPythonEnv(**FAST)
    tasks = env.tasks(4, seed=6)
    for t in tasks:
        assert not run_expert(env, t, random.Random(0), noise=1.0)[-1][1].success
    transcript = [
        (a, r.observation, r.reward) for a, r in run_expert(env, tasks[0], random.Random(3), noise=0.5)
    ]
    assert transcript == [
        (a, r.observation, r.reward) for a, r in run_expert(env, tasks[0], random.Random(3), noise=0.5)
    ]
    with pytest.raises(ValueError, match="noise"):
        env.expert_action(random.Random(0), noise=2)


def test_max_steps_ends_the_episode():
    env = MathPythonEnv(max_steps=2, **FAST)
    task = env.tasks(1, seed=0)[0]
    assert task.meta["max_steps"] == 2
    env.reset(task)
    assert not env.step("thinking").done
    res = env.step(format_tool_call("python", {"code": "print(1)"}))
    assert res.done and res.reward == 0.0 and "Out of steps." in res.observation


def test_no_leaked_processes_or_temp_dirs(tmp_path, monkeypatch):
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    before = children()
    env = MathPythonEnv(timeout_s=1.0, **{k: v for k, v in FAST.items() if k != "timeout_s"})
    for task in env.tasks(2, seed=1):
        run_expert(env, task, random.Random(0))
    env.reset(env.tasks(1, seed=1)[0])
    code = "import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()\nprint('started')"
    res = env.step(format_tool_call("python", {"code": code}))  # the thread keeps it alive past the timeout
    assert res.info["sandbox_status"] == ["timeout"] and "[stdout]\nstarted" in res.observation
    env.close()
    assert list(root.iterdir()) == [] and children() <= before


@pytest.mark.parametrize(
    ("knob", "value"),
    [
        ("datasets", []),
        ("datasets", "gsm_symbolic"),
        ("datasets", ["gsm_symbolc"]),
        ("datasets", ["gsm_symbolic", "gsm_symbolic"]),
        ("dataset_size", 0),
        ("dataset_seed", -1),
        ("dataset_config", {"basic_arithmetic": {"no_such_field": 1}}),
        ("dataset_config", {"chain_sum": {}}),
        ("dataset_config", {"gsm_symbolic": {"seed": 3}}),
        ("max_steps", 0),
        ("partial_credit", "yes"),
        ("drop_contradicted", 1),
        ("timeout_s", 0),
        ("cpu_s", 1.5),
        ("memory_mb", 8),
        ("max_output_chars", 0),
        ("sandbox", "docker"),
        ("colour", 1),
    ],
)
def test_knob_validation_names_the_knob(knob, value):
    with pytest.raises(ValueError, match=f"'{knob}'") as e:
        MathPythonEnv(**{knob: value})
    assert "math_python" in str(e.value)
    with pytest.raises(ValueError, match=f"'{knob}'"):
        MathPythonEnv.make_tasks(1, seed=0, **{knob: value})


def test_unknown_dataset_error_suggests_the_close_name():
    with pytest.raises(ValueError, match="did you mean gsm_symbolic"):
        MathPythonEnv(datasets=["gsm_symbolc"])
