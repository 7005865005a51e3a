"""The registry and the synthetic environments: experts, malformed calls, forking, tasks, knobs."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from horizonrl.envs import (
    ArithmeticEnv,
    Env,
    LookupEnv,
    RoomsEnv,
    StepResult,
    format_answer,
    format_tool_call,
    get_env,
    list_envs,
    make_env,
    register_env,
)

NAMES = ["arithmetic", "lookup", "rooms"]


def run(env: Env, task, rng: random.Random, noise: float = 0.0, max_turns: int = 40):
    """Roll out the expert; return [(action, StepResult)]."""
    env.reset(task)
    out: list[tuple[str, StepResult]] = []
    for _ in range(max_turns):
        action = env.expert_action(rng, noise)
        res = env.step(action)
        out.append((action, res))
        if res.done:
            break
    return out


def transcript(steps):
    return [(a, r.observation, r.reward, r.done, r.success, r.role, r.obs_key, r.invalid) for a, r in steps]


# ---------------------------------------------------------------- registry


def test_registry_lists_and_gets():
    assert set(NAMES) <= set(list_envs())
    assert (
        get_env("lookup") is LookupEnv
        and get_env("rooms") is RoomsEnv
        and get_env("arithmetic") is ArithmeticEnv
    )
    assert isinstance(make_env("arithmetic", n_ops=1), ArithmeticEnv)
    with pytest.raises(KeyError) as e:
        get_env("nope")
    assert "unknown environment 'nope'" in str(e.value) and "lookup" in str(e.value)


def test_registry_rejects_duplicates():
    with pytest.raises(ValueError, match="already registered"):

        @register_env("lookup")
        class Other(LookupEnv):
            pass

    with pytest.raises(TypeError):
        register_env("x")(int)  # type: ignore[arg-type]


# ---------------------------------------------------------------- experts


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("split", ["train", "test"])
def test_expert_solves_all(name, split):
    env = make_env(name)
    for task in env.tasks(20, seed=3, split=split):
        steps = run(env, task, random.Random(0))
        last = steps[-1][1]
        assert last.done and last.success and last.reward == 1.0, transcript(steps)
        assert sum(r.reward for _, r in steps) == 1.0
        assert not any(r.invalid for _, r in steps)
        assert len(steps) <= 8
        assert all(r.role == "tool" for _, r in steps[:-1])


@pytest.mark.parametrize(
    ("name", "knobs"),
    [
        ("lookup", {"hops": 4, "n_entities": 30, "obs_facts": 20, "decompose": True}),
        ("lookup", {"hops": 1, "n_entities": 2}),
        ("rooms", {"n_rooms": 6, "n_objects": 8, "max_steps": 40}),
        ("rooms", {"n_rooms": 1, "n_objects": 1}),
        ("arithmetic", {"n_ops": 5, "min_operand": -9, "max_operand": 9, "ops": "+-*/"}),
        ("arithmetic", {"n_ops": 3, "ops": "/", "min_operand": 1, "max_operand": 12}),
    ],
)
def test_expert_solves_harder_knobs(name, knobs):
    env = make_env(name, **knobs)
    for task in env.tasks(10, seed=1):
        assert run(env, task, random.Random(0))[-1][1].success


@pytest.mark.parametrize("name", NAMES)
def test_noisy_expert_is_worse_and_deterministic(name):
    env = make_env(name)
    tasks = env.tasks(40, seed=5)
    solved = sum(run(env, t, random.Random(i), noise=0.5)[-1][1].success for i, t in enumerate(tasks))
    assert solved < 40
    for i, t in enumerate(tasks[:5]):
        a = transcript(run(env, t, random.Random(i), noise=0.5))
        b = transcript(run(env, t, random.Random(i), noise=0.5))
        assert a == b
    with pytest.raises(ValueError, match="noise"):
        env.reset(tasks[0])
        env.expert_action(random.Random(0), noise=1.5)


def test_noise_one_always_fails_lookup_and_arithmetic():
    for name in ["lookup", "arithmetic"]:
        env = make_env(name)
        for t in env.tasks(10, seed=0):
            assert not run(env, t, random.Random(0), noise=1.0)[-1][1].success


def test_answer_ends_episode_and_wrong_answer_scores_zero():
    env = ArithmeticEnv()
    task = env.tasks(1, seed=0)[0]
    env.reset(task)
    res = env.step("<answer>-99999</answer>")
    assert res.done and not res.success and res.reward == 0.0 and res.final_answer == "-99999"
    env.reset(task)
    res = env.step(f"The result is <answer> {task.answer}. </answer>")
    assert res.done and res.success and res.reward == 1.0 and res.role == "user"


# ---------------------------------------------------------------- snapshot / restore


@pytest.mark.parametrize("name", NAMES)
def test_snapshot_restore_replay_is_exact(name):
    env = make_env(name)
    for i, task in enumerate(env.tasks(5, seed=2)):
        env.reset(task)
        rng = random.Random(i)
        snaps, actions, results = [env.snapshot()], [], []
        for _ in range(30):
            actions.append(env.expert_action(rng, noise=0.4))
            results.append(env.step(actions[-1]))
            snaps.append(env.snapshot())
            if results[-1].done:
                break
        for t in range(len(actions)):
            env.restore(snaps[t])
            env.step("garbage that changes nothing but the turn counter")  # diverge, then fork again
            env.restore(snaps[t])
            replay = [env.step(a) for a in actions[t:]]
            assert [dataclasses.asdict(r) for r in replay] == [dataclasses.asdict(r) for r in results[t:]]
            assert env.snapshot() == snaps[-1]


def test_restore_is_isolated_from_later_steps():
    env = RoomsEnv()
    env.reset(env.tasks(1, seed=0)[0])
    snap = env.snapshot()
    env.step(env.expert_action(random.Random(0)))
    assert env.snapshot() != snap
    env.restore(snap)
    env.step(env.expert_action(random.Random(0)))
    env.restore(snap)
    assert env.snapshot() == snap


# ---------------------------------------------------------------- tasks


@pytest.mark.parametrize("name", NAMES)
def test_make_tasks_deterministic_serializable_and_split_disjoint(name):
    cls = get_env(name)
    a = cls.make_tasks(50, seed=7)
    b = cls.make_tasks(50, seed=7)
    assert [dataclasses.asdict(t) for t in a] == [dataclasses.asdict(t) for t in b]
    assert [t.id for t in cls.make_tasks(50, seed=8)] != [t.id for t in a]
    assert len({t.id for t in a}) == 50
    for t in a:
        json.dumps(dataclasses.asdict(t))
        assert t.meta["env"] == name and t.meta["split"] == "train"
    test = cls.make_tasks(50, seed=7, split="test")
    assert all(t.meta["split"] == "test" for t in test)
    train_keys = {t.id for t in a} | {t.prompt + json.dumps(t.meta.get("facts")) for t in a}
    assert not train_keys & (
        {t.id for t in test} | {t.prompt + json.dumps(t.meta.get("facts")) for t in test}
    )
    # disjoint across seeds too: a test task is never a train task of another seed
    other_train = {t.id for t in cls.make_tasks(200, seed=9)}
    assert not other_train & {t.id for t in test}
    with pytest.raises(ValueError, match="split"):
        cls.make_tasks(1, seed=0, split="dev")


def test_arithmetic_split_disjoint_by_expression():
    train = {t.prompt for t in ArithmeticEnv.make_tasks(150, seed=0, n_ops=1, max_operand=9)}
    test = {t.prompt for t in ArithmeticEnv.make_tasks(30, seed=1, split="test", n_ops=1, max_operand=9)}
    assert train and test and not train & test


def test_too_narrow_knobs_raise():
    with pytest.raises(ValueError, match="widen the knobs"):
        ArithmeticEnv.make_tasks(500, seed=0, n_ops=1, min_operand=1, max_operand=2)


def test_env_instance_knobs_flow_into_tasks_and_reset():
    env = LookupEnv(hops=3, obs_facts=2, decompose=True)
    task = env.tasks(1, seed=0)[0]
    assert task.meta["hops"] == 3 and "Hint: find the company of" in task.prompt
    assert task.prompt.startswith("What is the country of the city of the company of ")
    env.reset(task)
    res = env.step(env.expert_action(random.Random(0)))
    assert res.observation.count(".") >= 3  # the fact plus 2 distractors
    with pytest.raises(ValueError, match="not 'rooms'"):
        RoomsEnv().reset(task)


# ---------------------------------------------------------------- knobs


@pytest.mark.parametrize(
    ("name", "knob", "value"),
    [
        ("lookup", "hops", 0),
        ("lookup", "hops", 5),
        ("lookup", "n_entities", 1),
        ("lookup", "obs_facts", -1),
        ("lookup", "decompose", "yes"),
        ("rooms", "n_rooms", 0),
        ("rooms", "n_rooms", 9),
        ("rooms", "n_objects", 0),
        ("rooms", "max_steps", 2.5),
        ("rooms", "max_steps", 1),
        ("arithmetic", "n_ops", 0),
        ("arithmetic", "n_ops", True),
        ("arithmetic", "max_operand", 0),
        ("arithmetic", "ops", "+^"),
        ("arithmetic", "ops", ""),
        ("arithmetic", "ops", "++"),
        ("lookup", "colour", 1),
    ],
)
def test_knob_validation_names_the_knob(name, knob, value):
    cls = get_env(name)
    with pytest.raises(ValueError, match=f"'{knob}'"):
        cls(**{knob: value})
    with pytest.raises(ValueError, match=f"'{knob}'") as e:
        cls.make_tasks(1, seed=0, **{knob: value})
    assert name in str(e.value)


# ---------------------------------------------------------------- env specifics


def test_lookup_search_behaviour():
    env = LookupEnv(n_entities=6, obs_facts=0)
    task = env.tasks(1, seed=0)[0]
    assert env.reset(task) == task.prompt and env.state_key().endswith("searched=")
    chain = env.state["chain"]
    res = env.step(format_tool_call("search", {"query": chain[0].lower() + "."}))
    assert f"{chain[0]} works at {chain[1]}." in res.observation and not res.invalid
    res = env.step(format_tool_call("search", {"query": "Nobody"}))
    assert res.observation == 'No facts about "Nobody".'
    assert res.obs_key.endswith(f"searched={chain[0]}")
    long = LookupEnv(obs_facts=50, n_entities=20)
    t = long.tasks(1, seed=0)[0]
    long.reset(t)
    assert len(long.step(long.expert_action(random.Random(0))).observation) > 500


def test_rooms_invalid_commands_revisits_and_max_steps():
    env = RoomsEnv(n_rooms=3, max_steps=6)
    task = env.tasks(1, seed=4)[0]
    first = env.reset(task)
    assert first.startswith("Your task: put the ") and "\nActions: " in first
    key0 = env.state_key()
    res = env.step(format_tool_call("act", {"command": "fly to the moon"}))
    assert res.invalid and res.observation.startswith("Nothing happens.") and "Actions: " in res.observation
    room = env.state["at"]
    nb = env.state["doors"][room][0]
    there = env.step(format_tool_call("act", {"command": f"Go to the {nb}."}))
    assert not there.invalid and env.state["at"] == nb
    back = env.step(format_tool_call("act", {"command": f"go {room}"}))
    assert back.obs_key == key0 and back.observation.split("\n", 1)[1] == first.split("\n", 1)[1]
    res = None
    for _ in range(3):
        res = env.step(format_tool_call("act", {"command": "look"}))
    assert res.done and not res.success and res.reward == 0.0 and "Out of steps." in res.observation
    env.reset(task)
    res = env.step("<answer>done</answer>")
    assert res.done and res.reward == 0.0


def test_rooms_expert_plan_is_shortest_on_simple_world():
    env = RoomsEnv(n_rooms=1, n_objects=1)
    for task in env.tasks(10, seed=0):
        steps = run(env, task, random.Random(0))
        closed = sum(
            1
            for c, v in task.meta["open"].items()
            if not v and c in (task.meta["goal"][1], task.meta["where"][task.meta["goal"][0]])
        )
        assert len(steps) == 2 + closed


def test_arithmetic_expert_steps_and_calculator_tool():
    env = ArithmeticEnv(n_ops=3)
    task = env.tasks(1, seed=0)[0]
    steps = run(env, task, random.Random(0))
    assert len(steps) == 4 and steps[-1][0] == f"<answer>{task.answer}</answer>"
    env.reset(task)
    res = env.step(format_tool_call("calculator", {"expression": "__import__('os').system('ls')"}))
    assert res.invalid and res.role == "tool" and res.observation.startswith("Error: ")
    res = env.step(format_tool_call("calculator", {"expression": "(2 + 3) * 4"}))
    assert res.observation == "20" and not res.invalid and res.obs_key.endswith("results=20")


def test_lookup_fork_direct_makes_searching_a_hop_the_noise_free_experts_own_choice():
    def noise_free(env, rng_seed, forks):
        return env.delegation_expert(random.Random(rng_seed), 0.0, forks)

    # fork_direct = 1: every hop is searched by the main agent, then it answers (no subagent at all).
    env = LookupEnv(hops=2, n_entities=4, fork_direct=1.0)
    env.reset(env.tasks(1, seed=3)[0])
    chain = env.state["chain"]
    for k in range(2):
        action = noise_free(env, 0, 0)
        assert action == format_tool_call("search", {"query": chain[k]})
        env.step(action)
    assert noise_free(env, 0, 0) == format_answer(chain[2])
    # fork_direct = 0 (the default): the original expert delegates the first hop.
    env0 = LookupEnv(hops=2, n_entities=4)
    env0.reset(env0.tasks(1, seed=3)[0])
    want = format_tool_call("fork", {"subagents": [{"task": LookupEnv.subtask(0, chain[0])}]})
    assert noise_free(env0, 0, 0) == want
    # fork_direct = 0.5: about half the first hops are searched; the choice does not depend on the rng
    # that asks (a clean label, drawn with another rng, agrees with the action taken).
    half = LookupEnv(hops=2, n_entities=4, fork_direct=0.5)
    direct = 0
    for task in half.tasks(400, seed=0):
        half.reset(task)
        a, b = noise_free(half, 1, 0), noise_free(half, 2, 0)
        assert a == b
        direct += '"name": "search"' in a
    assert 160 <= direct <= 240  # Binomial(400, 0.5): mean 200, sd 10
    with pytest.raises(ValueError, match="fork_direct"):
        LookupEnv(fork_direct=1.5)
