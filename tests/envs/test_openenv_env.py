"""The ``openenv`` adapter: an OpenEnv environment server started on 127.0.0.1, driven over its
WebSocket session protocol, trained token-exactly; the error paths end episodes, never runs."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from helpers.hub_training import annotated, assert_token_exact_grpo, train_steps
from helpers.ports import free_port
from horizonrl.config import ConfigError, load_config
from horizonrl.envs import get_env
from horizonrl.envs.hubs.openenv_client import OpenEnvError

ROOT = Path(__file__).resolve().parents[2]
SERVER = {"app": "openenv_letters:app", "cwd": str(ROOT / "examples" / "hubs")}


def _target(seed: int) -> str:
    """The example server's target letters for a reset seed (its own rule, recomputed here)."""
    return "".join(sorted(random.Random(seed).sample("aeiost", 2)))


def test_an_episode_over_the_websocket_session_by_hand():
    env = get_env("openenv")(**SERVER)
    train, test = env.tasks(4, seed=0), env.tasks(4, seed=0, split="test")
    assert not {t.meta["seed"] for t in train} & {t.meta["seed"] for t in test}
    task = train[0]
    target = _target(task.meta["seed"])
    first = env.reset(task)
    assert first == f"Say a word with the letters {target}." and env.state_key() == first
    other = next(c for c in "aeiost" if c not in target)
    half = env.step(f"<think>{target}</think>{target[0]}{other}")
    assert (half.reward, half.done, half.success, half.role) == (0.5, False, False, "user")
    assert half.observation == f"You used {target[0]} of {target}. Try again." == half.obs_key
    done = env.step(target)
    assert (done.reward, done.done, done.success, done.observation) == (0.5, True, True, "Solved.")
    env.close()


def test_server_errors_end_the_episode_and_are_recorded():
    env = get_env("openenv")(**SERVER)
    env.reset(env.tasks(1, seed=1)[0])
    crash = env.step("crash")
    assert (
        crash.done and crash.invalid and crash.reward == 0.0 and "the game crashed" in crash.info["env_error"]
    )
    # an action the server refuses (a field its Action model does not have): the same, not a crash
    wrong = get_env("openenv")(**SERVER, action_field="word")
    wrong.reset(wrong.tasks(1, seed=1)[0])
    refused = wrong.step("hello")
    assert refused.done and "env_error" in refused.info
    env.close()
    wrong.close()


def test_a_server_without_room_for_the_episodes_stops_the_run_with_what_to_change():
    small = {**SERVER, "env": {"LETTERS_MAX_SESSIONS": "1"}}
    first, second = get_env("openenv")(**small), get_env("openenv")(**small)
    tasks = first.tasks(2, seed=0)
    first.reset(tasks[0])
    with pytest.raises(OpenEnvError, match=r"max_concurrent_envs=N\) must cover") as e:
        second.reset(tasks[1])
    assert "\n" not in str(e.value)
    first.close()
    second.close()


def test_a_server_that_does_not_answer_is_one_line():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(OpenEnvError, match="did not answer /health") as e:
        get_env("openenv")(url=url, startup_timeout_s=1)
    assert "\n" not in str(e.value) and isinstance(e.value, ConfigError)
    with pytest.raises(OpenEnvError, match="no_such_module_xyz") as e:
        get_env("openenv")(app="no_such_module_xyz:app", startup_timeout_s=20)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({}, "exactly one of knob 'url'"),
        ({"url": "http://x", "app": "a:b"}, "exactly one of knob 'url'"),
        ({"url": "ws127.0.0.1"}, "http\\(s\\)://"),
        ({"app": "no_colon"}, "module:attribute"),
        ({"app": "a:b", "message_timeout_s": 0}, "message_timeout_s"),
        ({"app": "a:b", "obs_key": "state"}, "obs_key"),
    ],
)
def test_bad_knobs_are_one_line_errors(knobs, message):
    with pytest.raises(ValueError, match=message):
        get_env("openenv").validate_knobs(knobs)


def test_grpo_and_a_step_credit_method_train_token_exact(tiny_model_dir, tmp_path):
    from horizonrl.viz.data import Run, step_payload

    metrics = train_steps(tiny_model_dir, tmp_path / "grpo", "openenv", SERVER)
    rollouts = [r for r, _ in assert_token_exact_grpo(tmp_path / "grpo", metrics)]
    assert any(r.reward > 0 for r in rollouts) and all(m["rollout/env_error_rate"] == 0 for m in metrics[1:])
    assert len(step_payload(Run(tmp_path / "grpo"), "step_1")["R"]) == 8
    metrics = train_steps(tiny_model_dir, tmp_path / "gigpo", "openenv", SERVER, "algo.estimator=gigpo")
    assert all(abs(m["train/ratio_geomean"] - 1.0) < 1e-3 for m in metrics[1:])
    keys = [t.obs_key for r, _ in annotated(tmp_path / "gigpo", 1) for t in r.turns]
    assert keys and all(k for k in keys)  # every step has the observation key GiGPO groups by


def test_rtpo_refuses_openenv_it_has_no_snapshots(tiny_model_dir, tmp_path):
    from horizonrl.train.methods.reverse_turn import ReverseTurnTrainer

    cfg = load_config(
        None,
        [
            f"model.path={tiny_model_dir}",
            "train.trainer=rtpo",
            "env.name=openenv",
            f"env.knobs={{app: '{SERVER['app']}', cwd: '{SERVER['cwd']}'}}",
            "train.progress=false",
            f"train.out_dir={tmp_path}",
        ],
    )
    with pytest.raises(ConfigError, match="cannot fork"):
        ReverseTurnTrainer(cfg)
