"""The ``gym`` adapter: gymnasium-style text environments (and plain reset/step objects) in horizonrl."""

from __future__ import annotations

import json
import random

import pytest

from helpers import gym_games  # registers HorizonLetters-v0 with gymnasium
from helpers.hub_training import annotated, assert_token_exact_grpo, train_example, train_steps
from horizonrl.config import load_config
from horizonrl.envs import get_env
from horizonrl.envs.hubs.gym_text import step_outcome
from horizonrl.errors import ConfigError

LETTERS = {"id": "HorizonLetters-v0", "kwargs": {"letters": 2, "max_steps": 2}}
COUNTER = {"entry": "helpers.gym_games:make_counter", "action_pattern": r"\[(.*?)\]"}


def _env(**knobs):
    return get_env("gym")(**knobs)


def test_gymnasium_env_by_id_seeds_tasks_and_steps_by_hand():
    env = _env(**LETTERS)
    train, test = env.tasks(6, seed=0, split="train"), env.tasks(6, seed=0, split="test")
    assert [t.id for t in train] == [t.id for t in env.tasks(6, seed=0, split="train")]  # deterministic
    assert not {t.meta["seed"] for t in train} & {t.meta["seed"] for t in test}  # disjoint splits
    task = train[0]
    direct = gym_games.LetterGame(letters=2)
    want_obs, info = direct.reset(seed=task.meta["seed"])
    assert env.reset(task) == want_obs and env.state_key() == want_obs
    a, b = info["target"]
    other = next(c for c in gym_games.LETTERS if c not in info["target"])
    # thinking is not part of the action; one of the two letters: reward 1/2, truncation not yet reached
    r1 = env.step(f"<think>{a}{b}</think> {a}{other}")
    assert (r1.reward, r1.done, r1.role, r1.invalid) == (0.5, False, "user", False)
    assert r1.observation == f"You used {a} of {info['target']}. Try again." and r1.obs_key == r1.observation
    r2 = env.step(f"{b}{a}")
    # the reward is the gain over the best score so far: the return is the best score, 1.0
    assert (r2.reward, r2.done, r2.success, r2.observation) == (0.5, True, True, "Solved.")
    env.close()


def test_plain_object_old_style_step_and_action_pattern():
    env = _env(**COUNTER)
    (task,) = env.tasks(1, seed=3)
    assert env.reset(task) == "count 0 of 2"
    miss = env.step("plus one please")
    assert miss.invalid and miss.role == "user" and "\\[(.*?)\\]" in miss.observation
    assert env.state["game"].steps == 0  # the environment was not stepped
    assert env.step("I say [+]").observation == "count 1 of 2"
    last = env.step("[ + ]")
    assert (last.reward, last.done, last.success) == (1.0, True, True)  # return 1.0 >= success_reward


def test_step_outcome_conventions():
    assert step_outcome(("o", 1, True, False, {"x": 1})) == ("o", 1, True, {"x": 1})
    assert step_outcome(("o", 0, False, True, None)) == ("o", 0, True, {})  # truncated ends it
    assert step_outcome(("o", 0.5, 1, {})) == ("o", 0.5, True, {})
    with pytest.raises(ValueError, match="3-tuple"):
        step_outcome(("o", 1, True))


def test_an_env_that_raises_or_returns_a_bad_reward_loses_nothing():
    env = _env(entry="helpers.gym_games:make_counter", kwargs={"fail_at": 2})
    env.reset(env.tasks(1, seed=0)[0])
    assert env.step("+").observation == "count 1 of 2"
    crash = env.step("+")
    assert crash.done and crash.invalid and crash.reward == 0.0 and not crash.success
    assert crash.observation == "Error: step() raised RuntimeError: the game crashed"
    assert crash.info["env_error"] == "step() raised RuntimeError: the game crashed"

    env = _env(entry="helpers.gym_games:make_counter", kwargs={"bad_reward": "lots"})
    env.reset(env.tasks(1, seed=0)[0])
    r = env.step("+")
    assert r.reward == 0.0 and not r.done and "reward 'lots' is not a finite number" in r.info["env_error"]
    env = _env(entry="helpers.gym_games:make_counter", kwargs={"bad_reward": float("nan")})
    env.reset(env.tasks(1, seed=0)[0])
    assert env.step("+").info["env_error"].startswith("reward nan")


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"id": "NoSuchGame-v0"}, "'NoSuchGame-v0' is not a registered gymnasium environment"),
        ({"entry": "helpers.gym_games:nope"}, "has no attribute 'nope'"),
        ({"entry": "no_such_module_xyz:make"}, "no_such_module_xyz"),
        ({}, "exactly one of knob 'entry'"),
        (
            {"entry": "helpers.gym_games:make_counter", "id": "HorizonLetters-v0"},
            "exactly one of knob 'entry'",
        ),
        ({"entry": "helpers.gym_games:make_counter", "obs_key": "state"}, "knob 'obs_key'"),
        ({"entry": "helpers.gym_games:make_counter", "action_pattern": "["}, "not a regular expression"),
        ({"entry": "helpers.gym_games:make_counter", "rounds": 3}, "unknown knob 'rounds'"),
        ({"entry": "helpers.gym_games:LETTERS"}, "is not callable"),
    ],
)
def test_bad_knobs_are_one_line_errors(knobs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")) as e:
        _env(**knobs)
    assert "\n" not in str(e.value)


def test_snapshot_restore_is_exact_and_unforkable_games_say_so():
    env = _env(**LETTERS)
    task = env.tasks(1, seed=1)[0]
    env.reset(task)
    snap = env.snapshot()
    first = env.step("zzz")
    env.restore(snap)
    again = env.step("zzz")
    assert (again.observation, again.reward, again.done) == (first.observation, first.reward, first.done)
    assert env.state["game"].unwrapped.t == 1

    bad = _env(entry="helpers.gym_games:Unforkable")
    bad.reset(bad.tasks(1, seed=0)[0])
    with pytest.raises(ValueError, match=r"cannot be deep-copied .*snapshot: false"):
        bad.snapshot()
    off = _env(entry="helpers.gym_games:Unforkable", snapshot=False)
    assert not off.can_fork


def test_rtpo_refuses_a_game_without_snapshots(tiny_model_dir, tmp_path):
    from horizonrl.train.methods.reverse_turn import ReverseTurnTrainer

    cfg = load_config(
        None,
        [
            f"model.path={tiny_model_dir}",
            "train.trainer=rtpo",
            "env.name=gym",
            "env.knobs={entry: 'helpers.gym_games:make_counter', snapshot: false}",
            "train.progress=false",
            f"train.out_dir={tmp_path / 'run'}",
        ],
    )
    with pytest.raises(ConfigError, match="cannot fork"):
        ReverseTurnTrainer(cfg)


def test_grpo_trains_on_a_gymnasium_game_token_exact_and_credits_its_rewards(tiny_model_dir, tmp_path):
    from horizonrl.viz.data import Run, step_payload

    metrics = train_steps(tiny_model_dir, tmp_path, "gym", LETTERS, "env.imports=[helpers.gym_games]")
    assert all(m["rollout/env_error_rate"] == 0.0 for m in metrics[1:])
    rollouts = [r for r, _ in assert_token_exact_grpo(tmp_path, metrics)]
    assert any(r.reward > 0 for r in rollouts)
    assert all(t.obs_key == t.observation for r in rollouts for t in r.turns if t.observation)
    assert len(step_payload(Run(tmp_path), "step_2")["R"]) == 8  # the viewer shows every rollout


def test_a_step_credit_method_and_a_crashing_game_train(tiny_model_dir, tmp_path):
    knobs = {"entry": "helpers.gym_games:make_counter", "kwargs": {"goal": 2, "fail_at": 2}}
    metrics = train_steps(
        tiny_model_dir, tmp_path, "gym", knobs, "env.imports=[helpers.gym_games]", "algo.estimator=gigpo"
    )
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert all(abs(m["train/ratio_geomean"] - 1.0) < 1e-3 for m in metrics[1:])
    turns = [t for r, _ in annotated(tmp_path, 1) for t in r.turns]
    crashed = [t for t in turns if "env_error" in t.info]
    assert crashed and metrics[1]["rollout/env_error_rate"] == pytest.approx(len(crashed) / len(turns))
    assert all(t.obs_key and t.obs_key.startswith("count ") for t in turns if "env_error" not in t.info)


def test_tasks_are_seeds_and_repeatable_across_instances():
    a, b = _env(**LETTERS), _env(**LETTERS)
    ta, tb = a.tasks(3, seed=7), b.tasks(3, seed=7)
    assert [t.meta["seed"] for t in ta] == [t.meta["seed"] for t in tb]
    rng = random.Random(0)
    t = ta[rng.randrange(3)]
    assert a.reset(t) == b.reset(t)


def test_rtpo_forks_siblings_from_deep_copied_gymnasium_games(tiny_model_dir, tmp_path):
    from horizonrl.train.methods.rtpo import RTPOTrainer

    cfg = load_config(
        None,
        [
            f"model.path={tiny_model_dir}",
            "env.name=gym",
            f"env.knobs={json.dumps(LETTERS)}",
            "env.imports=[helpers.gym_games]",
            "env.train_tasks=8",
            "env.test_tasks=2",
            "rollout.tasks_per_step=2",
            "rollout.max_new_tokens=12",
            "rollout.max_turns=2",
            "rollout.context_budget=768",
            "train.eval_samples=1",
            "train.progress=false",
            "train.trainer=rtpo",
            "train.steps=1",
            "train.trainer_params.siblings=3",
            f"train.out_dir={tmp_path}",
        ],
    )
    records = RTPOTrainer(cfg).fit()
    stage = records[1]
    assert stage["trunk/boundaries"] > 0 and stage["rtpo/groups"] > 0  # siblings forked from snapshots
    assert abs(stage["train/ratio_geomean"] - 1.0) < 1e-3


def test_the_hub_example_config_trains_two_steps(tiny_model_dir, tmp_path, monkeypatch):
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # the example's paths start at the repository root
    records, cfg = train_example("examples/hubs/gym_letters.yaml", tiny_model_dir, tmp_path)
    assert [r["step"] for r in records][-1] == 2 and cfg.env.name == "gym"
