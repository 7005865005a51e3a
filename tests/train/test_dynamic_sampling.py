"""Dynamic sampling (train/rollout/dynamic.py, DAPO): the kept groups derived by hand, the group trainer
drawing until its step holds groups with signal (metrics, budget, rollout log), the refusals, and the
zero-signal watch reading RTPO's sibling sets."""

from __future__ import annotations

import warnings

import pytest
import torch

from helpers.shaped_env import two_op_run_config
from horizonrl.config import ConfigError
from horizonrl.errors import HorizonWarning
from horizonrl.train.rollout.dynamic import fill_with_signal, has_signal
from horizonrl.train.trainers.checks import check_names
from horizonrl.trajectory import Group, Rollout, read_jsonl


def _group(gid: str, rewards: list[float]) -> Group:
    g = Group(group_id=gid, task_id=gid)
    g.rollouts = [
        Rollout(uid=f"{gid}-{k}", task_id=gid, group_id=gid, reward=r) for k, r in enumerate(rewards)
    ]
    return g


#: Three draws of three groups each: "a1", "b0", "b2", "c1", "c2" have rewards that differ.
DRAWS = [
    [_group("a0", [0, 0]), _group("a1", [0, 1]), _group("a2", [1, 1])],
    [_group("b0", [1, 0]), _group("b1", [0, 0]), _group("b2", [0.5, 1])],
    [_group("c0", [1, 1]), _group("c1", [0, 1]), _group("c2", [1, 0])],
]


def _drawer(calls: list[int]):
    def draw(k: int):
        calls.append(k)
        return DRAWS[k]

    return draw


def _ids(groups):
    return [g.group_id for g in groups]


def test_kept_groups_by_hand():
    calls: list[int] = []
    f = fill_with_signal(_drawer(calls), want=3, max_draws=4)
    # Draw 0 holds one group with signal (a1), draw 1 two more (b0, b2): three, so no third draw.
    assert calls == [0, 1] and f.draws == 2 and not f.capped
    assert _ids(f.kept) == ["a1", "b0", "b2"]
    assert _ids(f.drawn) == ["a0", "a1", "a2", "b0", "b1", "b2"]
    assert f.metrics() == {
        "rollout/groups_drawn": 6.0,
        "rollout/zero_adv_dropped": 3.0,  # a0, a2, b1
        "rollout/groups_kept": 3.0,
        "rollout/draws": 2.0,
        "rollout/dynamic_cap_reached": 0.0,
    }


def test_surplus_groups_with_signal_are_trimmed():
    f = fill_with_signal(_drawer([]), want=2, max_draws=4)
    assert _ids(f.kept) == ["a1", "b0"] and f.draws == 2  # b2 had signal too, beyond the two wanted


def test_the_cap_trains_on_what_it_has():
    calls: list[int] = []
    f = fill_with_signal(_drawer(calls), want=6, max_draws=3)
    assert calls == [0, 1, 2] and f.capped
    assert _ids(f.kept) == ["a1", "b0", "b2", "c1", "c2"]  # five of the six wanted
    assert f.metrics()["rollout/dynamic_cap_reached"] == 1.0


def test_no_group_with_signal_trains_on_the_last_draw():
    flat = [[_group("x", [0, 0])], [_group("y", [1, 1])]]
    f = fill_with_signal(lambda k: flat[k], want=1, max_draws=2)
    assert f.capped and _ids(f.kept) == ["y"] and f.metrics()["rollout/zero_adv_dropped"] == 2.0


def test_stop_ends_the_draws_after_the_first():
    calls: list[int] = []
    f = fill_with_signal(_drawer(calls), want=3, max_draws=4, stop=lambda: True)
    assert calls == [0] and _ids(f.kept) == ["a1"] and f.capped


def test_has_signal_and_bad_arguments():
    assert has_signal(_group("g", [0, 0.5])) and not has_signal(_group("g", [1, 1, 1]))
    with pytest.raises(ValueError, match="max_draws=0"):
        fill_with_signal(_drawer([]), want=1, max_draws=0)


def test_the_group_trainer_fills_its_step_with_groups_that_carry_signal(
    tiny_model_dir, tmp_path, monkeypatch
):
    """Rewards rigged per draw: draw 0 gives one group with signal, draw 1 two more; the step trains on
    the first two with signal, its metrics count all four drawn groups, and the budget every rollout."""
    from horizonrl.train.trainers.group import GroupTrainer

    torch.set_num_threads(1)
    t = GroupTrainer(
        two_op_run_config(
            tiny_model_dir, tmp_path, "rollout.dynamic_sampling=true", "rollout.max_draws=3", "train.steps=1"
        )
    )
    real = t.collect
    rigged = {0: [[0, 0, 0, 0], [0, 1, 0, 1]], 1: [[1, 0, 0, 0], [1, 1, 0, 1]]}
    drawn = []

    def collect(tasks, draw=0):
        groups = real(tasks, draw)
        for g, rewards in zip(groups, rigged[draw], strict=True):
            for r, x in zip(g.rollouts, rewards, strict=True):
                r.reward = float(x)
        drawn.extend(groups)
        return groups

    monkeypatch.setattr(t, "collect", collect)
    try:
        (m,) = t.fit()
    finally:
        t.close()
    assert [g.group_id for g in drawn] == ["s0-0", "s0-1", "s0-d1-0", "s0-d1-1"]
    assert m["rollout/draws"] == 2.0 and m["rollout/groups_drawn"] == 4.0
    assert m["rollout/zero_adv_dropped"] == 1.0 and m["rollout/groups_kept"] == 2.0
    assert m["rollout/dynamic_cap_reached"] == 0.0
    assert m["train/zero_adv_group_rate"] == 0.25  # over the drawn groups
    assert m["reward/mean"] == pytest.approx(6 / 16)  # every drawn rollout: (0 + 2 + 1 + 3) / 16
    assert t.budget.rollouts == 16
    logged = read_jsonl(tmp_path / "rollouts" / "step_1.jsonl")
    assert sorted({r.group_id for r in logged}) == ["s0-1", "s0-d1-0"]  # what the update trained on


def test_a_capped_step_warns_once_and_trains(tiny_model_dir, tmp_path, monkeypatch):
    from horizonrl.train.trainers.group import GroupTrainer

    torch.set_num_threads(1)
    t = GroupTrainer(
        two_op_run_config(
            tiny_model_dir,
            tmp_path,
            "rollout.dynamic_sampling=true",
            "rollout.max_draws=2",
            "train.steps=2",
            "train.no_signal_steps=0",
        )
    )
    real = t.collect

    def collect(tasks, draw=0):
        groups = real(tasks, draw)
        for g in groups:
            for r in g.rollouts:
                r.reward = 0.0
        return groups

    monkeypatch.setattr(t, "collect", collect)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            records = t.fit()
    finally:
        t.close()
    said = [w for w in caught if issubclass(w.category, HorizonWarning) and "max_draws=2" in str(w.message)]
    assert len(said) == 1 and "0 of 2 groups with signal" in str(said[0].message)
    assert [r["rollout/dynamic_cap_reached"] for r in records] == [1.0, 1.0]
    assert [r["rollout/groups_drawn"] for r in records] == [4.0, 4.0]
    assert all("train/ratio_geomean" in r for r in records)  # each step still ran its update


def test_dynamic_sampling_is_refused_where_it_is_not_read(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"rollout.dynamic_sampling=true: read by train.trainer=group"):
        check_names(
            two_op_run_config(tiny_model_dir, tmp_path, "rollout.dynamic_sampling=true", "train.trainer=rtpo")
        )
    with pytest.raises(ConfigError, match=r"train.max_staleness=1"):
        check_names(
            two_op_run_config(
                tiny_model_dir, tmp_path, "rollout.dynamic_sampling=true", "train.max_staleness=1"
            )
        )
    with pytest.raises(ConfigError, match=r"rollout\.max_draws"):
        two_op_run_config(tiny_model_dir, tmp_path, "rollout.max_draws=0")


def test_rtpo_feeds_the_zero_signal_watch(tiny_model_dir, tmp_path):
    """RTPO logs its sibling sets' zero-advantage rate under the common key, so the watch counts it."""
    from horizonrl.train.methods.rtpo import RTPOTrainer

    torch.set_num_threads(1)
    t = RTPOTrainer(
        two_op_run_config(
            tiny_model_dir,
            tmp_path,
            "train.trainer=rtpo",
            "train.trainer_params.siblings=3",
            "train.steps=1",
            "train.eval_at_start=false",
        )
    )
    try:
        records = t.fit()
    finally:
        t.close()
    staged = [r for r in records if "rtpo/zero_adv_rate" in r]
    assert staged
    for r in staged:
        assert r["train/zero_adv_group_rate"] == r["rtpo/zero_adv_rate"]
        assert "train/no_signal_steps" in r  # the watch observed the stage
