"""The reproduction harness: statistics by hand, budget matching, and a miniature end-to-end run."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from horizonrl.reproduce import Arm, Comparison, GateError, Paper, Settings, reproduce
from horizonrl.reproduce.stats import paired_bootstrap, t_interval


def test_t_interval_matches_a_hand_computation():
    d = [0.10, 0.02, 0.06, -0.01, 0.08]
    m = sum(d) / 5  # 0.05
    sd = math.sqrt(sum((x - m) ** 2 for x in d) / 4)  # sample sd
    t975_4 = 2.7764451051977987  # Student t quantile, 4 degrees of freedom (tables)
    iv = t_interval(d)
    assert iv.mean == pytest.approx(0.05)
    assert iv.hi - iv.mean == pytest.approx(t975_4 * sd / math.sqrt(5))
    assert iv.mean - iv.lo == pytest.approx(t975_4 * sd / math.sqrt(5))
    one = t_interval([0.3])
    assert (one.lo, one.mean, one.hi, one.n) == (0.3, 0.3, 0.3, 1)


def test_paired_bootstrap_resamples_tasks_the_same_way_for_every_seed():
    # Two seeds x 4 tasks. The per-task mean differences are [1, 0, 0, 0] -> mean 0.25.
    a = np.array([[1.0, 1.0, 0.0, 1.0], [1.0, 0.0, 1.0, 0.0]])
    b = np.array([[0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]])
    iv = paired_bootstrap(a, b, n_boot=4000, seed=1)
    assert iv.mean == pytest.approx(0.25)
    # The bootstrap mean of 4 draws from {1, 0, 0, 0} takes values k/4; its 2.5% and 97.5% quantiles
    # are 0 and 0.75 (P(k >= 3) = 13/256 = 0.051 > 0.025, P(k = 4) = 1/256 < 0.025).
    assert iv.lo == 0.0 and iv.hi == 0.75
    # Identical arms: every draw is exactly 0.
    z = paired_bootstrap(a, a, n_boot=200)
    assert (z.lo, z.hi) == (0.0, 0.0)


MINI = (
    "model.tiny_hidden=32",
    "model.tiny_layers=2",
    "model.tiny_vocab=400",
    "model.tiny_pretrain_steps=20",
    "sft.demos=24",
    "sft.epochs=1",
    "env.train_tasks=60",
    "rollout.tasks_per_step=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=16",
    "rollout.max_turns=2",
)


def _paper(**kw) -> Paper:
    base = dict(
        name="mini",
        title="Miniature",
        claim="RLOO beats GRPO (a test, not a claim).",
        base="quickstart",
        arms=(Arm("grpo"), Arm("rloo", ("algo.estimator=rloo",))),
        comparisons=(Comparison("rloo", "grpo", "rloo > grpo"),),
        overrides=MINI,
        budget_tokens=300,
        seeds=2,
        eval_tasks=6,
        gate=(0.0, 1.0),
        gate_tasks=4,
        gate_samples=1,
        diagnostics=("rollout/turns_mean",),
    )
    base.update(kw)
    return Paper(**base)


def test_miniature_reproduction_end_to_end_and_resume(tmp_path):
    paper = _paper()
    logs: list[str] = []
    settings = Settings(seeds=2, jobs=2, out=tmp_path / "runs", log=logs.append)
    res = reproduce(paper, settings, results_dir=tmp_path / "results")
    # Budget: matched on generated tokens and never overshot, in every arm-seed.
    for arm in ("grpo", "rloo"):
        seeds = res["arms"][arm]["seeds"]
        assert [s["seed"] for s in seeds] == [0, 1]
        for s in seeds:
            assert 0 < s["generated_tokens"] <= 300
            assert s["rollouts"] > 0 and s["trainable_tokens"] > 0
            assert s["curve"][-1]["pass@1"] == s["pass@1"]
            assert len(s["per_task"][-1]) == 6
    # Both arms share the start evaluation (same policy, agent and evaluation draws).
    assert res["arms"]["grpo"]["start"] == res["arms"]["rloo"]["start"]
    c = res["comparisons"][0]
    arms = res["arms"]
    want = [arms["rloo"]["seeds"][i]["pass@1"] - arms["grpo"]["seeds"][i]["pass@1"] for i in range(2)]
    assert c["diffs"] == pytest.approx(want)
    assert c["t"]["mean"] == pytest.approx(sum(want) / 2)
    page = (tmp_path / "results" / "mini.md").read_text()
    assert "rloo` − `grpo" in page and "Warm-start pass@1" in page
    data = json.loads((tmp_path / "results" / "mini.json").read_text())
    assert data["paper"] == "mini" and "pass@1" in data["warm_start"]
    assert (tmp_path / "results" / "mini_curves.png").stat().st_size > 1000
    # A rerun resumes: every arm-seed is already finished, nothing is trained again.
    logs.clear()
    again = reproduce(paper, settings, results_dir=None)
    assert any("already finished" in m for m in logs)
    assert again["comparisons"][0]["diffs"] == c["diffs"]


def test_gate_refuses_with_the_measured_value_and_the_knob(tmp_path):
    paper = _paper(gate=(0.99, 1.0), arms=(Arm("grpo"),), comparisons=())
    with pytest.raises(GateError, match=r"warm-start pass@1 .* outside the gate \[0.99, 1.0\].*sft.noise"):
        reproduce(paper, Settings(seeds=1, out=tmp_path / "runs", log=lambda m: None), results_dir=None)
