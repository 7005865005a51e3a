"""The reproduction harness: statistics by hand, budget matching, and a miniature end-to-end run."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from horizonrl.reproduce import Arm, Comparison, GateError, Paper, Settings, reproduce
from horizonrl.reproduce.runner import check_gate
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


def test_mid_evaluation_is_opt_in():
    from horizonrl.reproduce.runner import arm_items

    paper = _paper()
    arm = paper.arms[0]
    off = arm_items(paper, Settings(seeds=1), arm, 0, Path("x"))
    on = arm_items(paper, Settings(seeds=1, mid_eval=True), arm, 0, Path("x"))
    assert "train.eval_fractions=[]" in off and "train.eval_fractions=[0.5]" in on


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
            assert len(s["curve"]) == 1  # the end only: no mid evaluation without --mid-eval
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


@pytest.mark.integration
def test_a_stopped_arm_seed_resumes_from_its_checkpoint(tmp_path):
    # Two runs of the same arm-seed: one uninterrupted for 4 steps, one stopped after 2 steps (its
    # result.json removed, as a reproduction killed between its checkpoint and its end leaves it) and
    # rerun: it resumes at step 2 and ends where the uninterrupted one does.
    def run(out, steps):
        paper = _paper(
            sft_warm_start=False, arms=(Arm("grpo"),), comparisons=(), seeds=1, budget_tokens=10_000,
            max_steps=steps, checkpoint_every=1,
        )  # fmt: skip
        reproduce(paper, Settings(seeds=1, out=out, log=lambda m: None), results_dir=None)
        return out / "mini" / "grpo" / "seed_0"

    whole = json.loads((run(tmp_path / "a", 4) / "result.json").read_text())
    seed = run(tmp_path / "b", 2)
    first = json.loads((seed / "result.json").read_text())
    assert first["sessions"] == 1 and first["updates"] == 2
    (seed / "result.json").unlink()
    resumed = json.loads((run(tmp_path / "b", 4) / "result.json").read_text())
    assert "[resume] from the checkpoint of step 2" in (seed / "log.txt").read_text()
    assert resumed["sessions"] == 2 and resumed["updates"] == whole["updates"] == 4
    # (the first session's end evaluation at step 2 stays on disk: compare the final evaluations)
    assert resumed["per_task"][-1] == whole["per_task"][-1] and resumed["pass@1"] == whole["pass@1"]
    assert resumed["generated_tokens"] == whole["generated_tokens"]
    # the wall time adds the first session's two steps to the second session's own
    marks = json.loads((seed / "wall.json").read_text())["marks"]
    assert sorted(int(k) for k in marks) == [1, 2, 3, 4] and resumed["wall_s"] == pytest.approx(
        marks["4"], rel=0.2
    )
    assert marks["3"] > marks["2"] >= first["wall_s"] * 0.5


def test_a_reproduction_without_sft_starts_from_the_base_model(tmp_path):
    from horizonrl.reproduce.runner import arm_items

    paper = _paper(sft_warm_start=False, arms=(Arm("grpo"),), comparisons=(), seeds=1, budget_tokens=120)
    assert "train.init=null" in arm_items(paper, Settings(seeds=1), paper.arms[0], 0, Path("x"))
    settings = Settings(seeds=1, out=tmp_path / "runs", log=lambda m: None)
    res = reproduce(paper, settings, results_dir=tmp_path / "results")
    ws = tmp_path / "runs" / "mini" / "warmstart"
    assert not (ws / "sft").exists()  # no SFT: the gate measured the tiny base model itself
    assert (ws / "base_model" / "config.json").exists() and "sft_s" not in json.loads(
        (ws / "warmstart.json").read_text()
    )
    run = json.loads((tmp_path / "runs" / "mini" / "grpo" / "seed_0" / "result.json").read_text())
    assert run["config"]["train"]["init"] is None and run["config"]["model"]["path"] == "tiny"
    res = json.loads((tmp_path / "results" / "mini.json").read_text())
    g = res["gains"]["grpo"]
    end = res["arms"]["grpo"]["seeds"][0]["pass@1"]
    assert g["per_seed"][0]["end"] == end
    assert g["per_seed"][0]["bootstrap"]["mean"] == pytest.approx(
        end - res["arms"]["grpo"]["start"]["pass@1"]
    )


def test_gate_refuses_with_the_measured_value_and_the_knob(tmp_path):
    paper = _paper(gate=(0.99, 1.0), arms=(Arm("grpo"),), comparisons=())
    with pytest.raises(GateError, match=r"warm-start pass@1 .* outside the gate \[0.99, 1.0\].*sft.noise"):
        reproduce(paper, Settings(seeds=1, out=tmp_path / "runs", log=lambda m: None), results_dir=tmp_path)
    # The refusal is recorded: the measured warm start and the reason, no arms, no plots.
    data = json.loads((tmp_path / "mini.json").read_text())
    meta = json.loads((tmp_path / "runs" / "mini" / "warmstart" / "warmstart.json").read_text())
    assert data["status"] == "gate_refused" and data["arms"] == {} and data["comparisons"] == []
    assert data["warm_start"]["pass@1"] == meta["gate"]["pass@1"] < 0.99
    page = (tmp_path / "mini.md").read_text()
    assert "Not run: the gate refused" in page and f"{meta['gate']['pass@1']:.3f}" in page
    assert not (tmp_path / "mini_curves.png").exists()


def _two_scenarios(checks, warm_checks=None) -> Paper:
    """Arm ``a`` in scenario ``short`` (1 turn), arm ``b`` (RLOO) in ``long`` (2 turns), one seed."""
    return _paper(
        warm_checks=warm_checks,
        arms=(Arm("a", scenario="short"), Arm("b", ("algo.estimator=rloo",), scenario="long")),
        comparisons=(Comparison("b", "a", "b > a"),),
        scenarios={"short": ("rollout.max_turns=1",), "long": ("rollout.max_turns=2",)},
        checks=checks,
        budget_tokens=120,
        seeds=1,
    )


@pytest.mark.integration
def test_scenarios_get_their_own_warm_start_gate_and_checks(tmp_path):
    calls = []

    def checks(cfg):
        calls.append(cfg.rollout.max_turns)
        return [{"name": "turns", "value": cfg.rollout.max_turns, "target": "report", "ok": True}]

    warm = []

    def warm_checks(cfg, model_dir):  # the warm start's own rollouts: called with its model directory
        warm.append((cfg.rollout.max_turns, Path(model_dir)))
        assert (Path(model_dir) / "config.json").exists()
        return [{"name": "warm start: turns", "value": cfg.rollout.max_turns, "target": "report", "ok": True}]

    paper = _two_scenarios(checks, warm_checks)
    res = reproduce(paper, Settings(seeds=1, out=tmp_path / "runs", log=lambda m: None), results_dir=None)
    root = tmp_path / "runs" / "mini"
    assert (root / "warmstart_short" / "sft" / "config.json").exists()
    assert (root / "warmstart_long" / "sft" / "config.json").exists()
    assert sorted(calls) == [1, 2] and set(res["warm_starts"]) == {"short", "long"}
    assert sorted(warm) == [(1, root / "warmstart_short" / "sft"), (2, root / "warmstart_long" / "sft")]
    assert sorted((c["scenario"], c["name"]) for c in res["checks"]) == [
        ("long", "turns"),
        ("long", "warm start: turns"),
        ("short", "turns"),
        ("short", "warm start: turns"),
    ]
    # Each arm trained from its own scenario's warm start, with its scenario's overrides.
    for arm, turns in (("a", 1), ("b", 2)):
        cfg = json.loads((root / arm / "seed_0" / "result.json").read_text())["config"]
        assert cfg["rollout"]["max_turns"] == turns
        assert cfg["train"]["init"].endswith("warmstart_short/sft" if arm == "a" else "warmstart_long/sft")


@pytest.mark.integration
def test_a_refused_scenario_is_recorded_while_the_other_scenarios_run(tmp_path):
    def checks(cfg):  # the "long" scenario misses its regime target
        n = cfg.rollout.max_turns
        return [{"name": "turns", "value": n, "target": "1", "ok": n == 1}]

    paper = _two_scenarios(checks)
    settings = Settings(seeds=1, out=tmp_path / "runs", log=lambda m: None)
    with pytest.raises(
        GateError, match=r"scenario 'long': regime check \(long\) turns = 2 .*other scenarios ran"
    ):
        reproduce(paper, settings, results_dir=tmp_path)
    root = tmp_path / "runs" / "mini"
    assert (root / "a" / "seed_0" / "result.json").exists() and not (root / "b").exists()
    data = json.loads((tmp_path / "mini.json").read_text())
    assert data["status"] == "partial" and set(data["arms"]) == {"a"}
    assert data["comparisons"] == []  # b - a needs the refused arm
    long = data["refused_scenarios"]["long"]
    assert long["arms"] == ["b"] and long["pass@1"] == data["warm_starts"]["long"]["pass@1"]
    page = (tmp_path / "mini.md").read_text()
    assert "## Scenarios not run" in page and "**`long`** (arms `b`)" in page and "turns = 2" in page
    # The README's summary says which scenario did not run, next to the rows of the ones that did.
    mod = _update_readme()
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "mosaic.json").write_text(json.dumps(data))
    mod.ROOT = tmp_path
    row = [r for r in mod.results_block().splitlines() if r.startswith("| [mosaic]")]
    assert row == [
        f"| [mosaic](docs/results/mosaic.md) | scenario `long` | – | not run: warm-start pass@1 "
        f"{long['pass@1']:.3f} outside the gate [0.0, 1.0] | – | – | – | – |"
    ]


def test_a_missed_claim_row_is_reported_but_only_a_gating_row_refuses():
    paper = _paper(gate=(0.0, 1.0))
    settings = Settings(seeds=1, log=(logged := []).append)
    claim = {"name": "volume", "value": 2.0, "target": "< 1", "ok": False, "gate": False}
    meta = {"gate": {"pass@1": 0.5, "tasks": 4, "samples": 1}, "checks": [claim]}
    check_gate(paper, meta, settings)  # a claim read off the expert's episodes does not refuse RL
    assert logged == []
    meta["checks"].append({"name": "turns", "value": 3, "target": "2", "ok": False})  # gate defaults to true
    with pytest.raises(GateError, match=r"regime check turns = 3 misses its target 2") as e:
        check_gate(paper, meta, settings)
    assert "volume" not in str(e.value)


def _update_readme():
    """``scripts/update_readme.py`` as a module (scripts are not a package)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "update_readme", Path(__file__).parents[2] / "scripts" / "update_readme.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_summary_rows_from_results_json(tmp_path, monkeypatch):
    mod = _update_readme()
    (tmp_path / "docs" / "results").mkdir(parents=True)
    refused = {"status": "gate_refused", "warm_start": {"pass@1": 0.1054}, "setup": {"gate": [0.25, 0.75]}}
    (tmp_path / "docs" / "results" / "ccpo.json").write_text(json.dumps(refused))
    t = {"mean": 0.05, "lo": -0.01, "hi": 0.11, "n": 5}
    done = {
        "comparisons": [{"arm": "rtpo", "baseline": "grpo", "claim": "c", "t": t, "verdict": "inside noise"}],
        "arms": {
            "rtpo": {"seeds": [{"updates": u} for u in (44, 40, 51, 47)]},  # median (44 + 47) / 2
            "grpo": {"seeds": [{"updates": u} for u in (29, 31, 30)]},
        },
        "gains": {"rtpo": {"reading": "no change resolved"}, "grpo": {"reading": "fell (both CIs below 0)"}},
    }
    (tmp_path / "docs" / "results" / "rtpo.json").write_text(json.dumps(done))
    monkeypatch.setattr(mod, "ROOT", tmp_path)
    rows = mod.results_block().splitlines()[2:]
    assert (
        rows[0] == "| [rtpo](docs/results/rtpo.md) | `rtpo` − `grpo` | c | +0.050 [-0.010, +0.110] | 5 "
        "| 45.5 / 30 | inside noise | unresolved / fell |"
    )
    assert rows[1] == (
        "| [ccpo](docs/results/ccpo.md) | – | – | not run: warm-start pass@1 0.105 outside the gate "
        "[0.25, 0.75] | – | – | – | – |"
    )
    assert rows[2:] == [
        "| mosaic | – | – | not run yet | – | – | – | – |",
        "| echo | – | – | not run yet | – | – | – | – |",
    ]


def test_greedy_and_pass_at_k_reach_the_results_json_and_page(tmp_path):
    paper = _paper(
        sft_warm_start=False,
        arms=(Arm("grpo"),),
        comparisons=(),
        seeds=1,
        budget_tokens=120,
        eval_samples=2,
        eval_greedy=True,
    )
    settings = Settings(seeds=1, out=tmp_path / "runs", log=lambda m: None)
    reproduce(paper, settings, results_dir=tmp_path / "results")
    res = json.loads((tmp_path / "results" / "mini.json").read_text())
    arm = res["arms"]["grpo"]
    start, run = arm["start"], arm["seeds"][0]
    for r, counts, greedy in (
        (start, start["per_task"], start["per_task_greedy"]),
        (run, run["per_task"][-1], run["per_task_greedy"][-1]),
    ):
        # recomputed from the per-task counts: 2 samples a task, one greedy episode a task
        assert len(counts) == len(greedy) == 6 and set(greedy) <= {0, 1} and max(counts) <= 2
        assert r["pass@1"] == pytest.approx(sum(counts) / 12)
        assert r["pass@k"] == pytest.approx(sum(c > 0 for c in counts) / 6)
        assert r["pass@1_greedy"] == pytest.approx(sum(greedy) / 6)
        assert r["tool_calls_mean"] >= 0 and r["greedy_tool_calls_mean"] >= 0
    assert run["curve"][-1]["pass@1_greedy"] == run["pass@1_greedy"]
    g = res["gains_greedy"]["grpo"]
    assert g["start"] == pytest.approx(start["pass@1_greedy"])
    assert g["per_seed"][0]["bootstrap"]["mean"] == pytest.approx(
        run["pass@1_greedy"] - start["pass@1_greedy"]
    )
    assert res["gains_pass@k"]["grpo"]["per_seed"][0]["end"] == pytest.approx(run["pass@k"])
    assert res["setup"]["eval_greedy"] is True
    page = (tmp_path / "results" / "mini.md").read_text()
    assert "and one greedy episode per task" in page
    assert "| greedy pass@1 start → end |" in page and "Learning over the warm start, greedy decoding" in page
    assert f"{start['pass@1_greedy']:.3f} → {run['pass@1_greedy']:.3f}" in page
    assert "Learning over the warm start, pass@k" in page


def test_readme_real_model_block_is_one_row_per_seed(tmp_path, monkeypatch):
    mod = _update_readme()
    (tmp_path / "docs" / "results").mkdir(parents=True)
    monkeypatch.setattr(mod, "ROOT", tmp_path)
    assert mod.real_model_block().startswith("not run yet")
    boot = {"mean": 0.125, "lo": 0.05, "hi": 0.2, "n": 128}
    res = {
        "setup": {"eval_tasks": 128, "eval_samples": 1, "eval_temperature": 1.0},
        "arms": {
            "grpo": {"start": {"pass@1": 0.25}, "seeds": [{"seed": 0, "updates": 24, "wall_s": 3000.0}]}
        },
        "gains": {
            "grpo": {
                "start": 0.25,
                "per_seed": [{"seed": 0, "end": 0.375, "bootstrap": boot, "reading": "rose"}],
            }
        },
    }
    (tmp_path / "docs" / "results" / "smollm2.json").write_text(json.dumps(res))
    rows = mod.real_model_block().splitlines()
    assert rows[2] == "| 0 | 0.250 → 0.375 | +0.125 [+0.050, +0.200] | rose | 24 | 50 min |"
    assert "128 held-out tasks x 1 sample" in rows[4] and "greedy" not in rows[4]
    # With greedy evaluations and tool calls: their columns follow the sampled ones.
    gboot = {"mean": -0.0625, "lo": -0.125, "hi": 0.0, "n": 128}
    res["setup"]["eval_greedy"] = True
    res["arms"]["grpo"]["start"]["tool_calls_mean"] = 1.5
    res["arms"]["grpo"]["seeds"][0]["tool_calls_mean"] = 2.25
    res["gains_greedy"] = {
        "grpo": {
            "start": 0.5,
            "per_seed": [{"seed": 0, "end": 0.4375, "bootstrap": gboot, "reading": "not resolved"}],
        }
    }
    (tmp_path / "docs" / "results" / "smollm2.json").write_text(json.dumps(res))
    rows = mod.real_model_block().splitlines()
    assert rows[0].startswith("| seed | pass@1 start → end |") and "| greedy pass@1 start → end |" in rows[0]
    assert rows[2] == (
        "| 0 | 0.250 → 0.375 | +0.125 [+0.050, +0.200] | rose | 0.500 → 0.438 | -0.062 [-0.125, +0.000] "
        "| not resolved | 1.50 → 2.25 | 24 | 50 min |"
    )
    assert "and one greedy episode per task" in rows[4]


def test_readme_quickstart_check_block_is_the_printed_table():
    mod = _update_readme()
    table = [
        "seed  SFT start  after GRPO  gain (points)  seconds",
        "   0      0.320       0.980          +66.0     1458",
        "quickstart-check passed: every seed gained at least 15.0 points",
    ]
    log = "\n".join(["some warning", *table, "trailing"]) + "\n"
    assert mod.check_block(log) == "```\n" + "\n".join(table) + "\n```\n"
    text = "a\n<!-- quickstart-check -->\nold\n<!-- /quickstart-check -->\nb\n"
    assert mod.replace_block(text, "quickstart-check", mod.check_block(log)).count("+66.0") == 1


def test_readme_quickstart_block_drops_progress_bars():
    mod = _update_readme()
    log = (
        "noise\n[1/3] build\n[2/3] GRPO\n"
        "\rgroup:   0%|   | 0/40 [00:00<?, ?step/s]\rgroup: 100%|###| 40/40 [03:25<00:00, 5.1s/step]\n"
        "      done in 211s\n\nSFT start 0.312\n"
    )
    assert (
        mod.quickstart_block(log)
        == "```\n[1/3] build\n[2/3] GRPO\n      done in 211s\n\nSFT start 0.312\n```\n"
    )


def test_results_page_cites_the_options_that_shape_results_not_where_files_go():
    from horizonrl.cli import _reproduce_command, build_parser

    argv = ["reproduce", "rtpo", "--jobs", "2", "--out", "/scratch/x", "--results", "/tmp/r", "--report-only"]
    assert _reproduce_command(build_parser().parse_args(argv)) == "horizonrl reproduce rtpo --jobs 2"
    argv = [
        "reproduce",
        "ccpo",
        "--seeds",
        "3",
        "--set",
        "sft.epochs=3",
        "--set",
        "env.knobs={a: 1}",
        "--force",
        "--mid-eval",
    ]
    assert (
        _reproduce_command(build_parser().parse_args(argv))
        == "horizonrl reproduce ccpo --seeds 3 --set sft.epochs=3 --set 'env.knobs={a: 1}' --mid-eval --force"
    )


@pytest.mark.integration
def test_rerunning_one_scenario_carries_the_others_from_the_earlier_page(tmp_path):
    """`--arms` of one scenario keeps the other scenario's results from the earlier page, and only while
    the setup, the arms' overrides and its warm-start declaration are unchanged."""
    paper = _two_scenarios(None)
    logs: list[str] = []
    settings = Settings(seeds=1, out=tmp_path / "runs", log=logs.append)
    full = reproduce(paper, settings, results_dir=tmp_path / "r")
    assert set(full["arms"]) == {"a", "b"} and len(full["comparisons"]) == 1
    assert full["warm_starts"]["long"]["key"] and "carried" not in full
    only_a = dataclasses.replace(settings, arms=("a",))
    res = reproduce(paper, only_a, results_dir=tmp_path / "r")
    assert list(res["arms"]) == ["a", "b"] and res["arms"]["b"] == full["arms"]["b"]
    assert res["comparisons"] == full["comparisons"], (res["comparisons"], full["comparisons"])
    assert list(res["warm_starts"]) == ["short", "long"]
    assert res["carried"]["long"]["key_checked"] and res["carried"]["long"]["utc"]
    assert res["carried"]["long"]["commit"] == full["provenance"]["long"]["commit"]
    assert "long" not in res["provenance"] and "short" in res["provenance"]
    # Carried again from a page that carried it: still the run it came from, not the page's commit.
    again = reproduce(paper, only_a, results_dir=tmp_path / "r")
    assert again["carried"]["long"] == res["carried"]["long"]
    page = (tmp_path / "r" / "mini.md").read_text()
    assert "**Scenario `long` is carried over**" in page and "arms `b`" in page
    assert "warm-start declaration is unchanged" in page
    # An earlier page without a recorded key (or provenance) is carried, saying what was not checked.
    prev = json.loads((tmp_path / "r" / "mini.json").read_text())
    del prev["warm_starts"]["long"]["key"], prev["carried"]
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "mini.json").write_text(json.dumps(prev))
    res = reproduce(paper, only_a, results_dir=tmp_path / "old")
    assert res["carried"]["long"]["key_checked"] is False and res["carried"]["long"]["commit"] is None
    assert "did not record its warm-start key" in (tmp_path / "old" / "mini.md").read_text()
    # A changed warm-start declaration, or changed arm overrides, is not carried: the page loses it.
    for changed in (
        dataclasses.replace(paper, scenarios={**paper.scenarios, "long": ("rollout.max_turns=3",)}),
        dataclasses.replace(paper, arms=(paper.arms[0], Arm("b", ("algo.estimator=grpo",), scenario="long"))),
    ):
        logs.clear()
        (tmp_path / "r" / "mini.json").write_text(json.dumps(full))
        res = reproduce(changed, only_a, results_dir=tmp_path / "r")
        assert set(res["arms"]) == {"a"} and res["comparisons"] == [] and "carried" not in res
        assert any("'long' not carried" in m for m in logs), logs
        assert res["status"] == "partial" and res["absent_arms"] == ["b"]
        assert json.loads((tmp_path / "r" / "mini.json").read_text())["status"] == "partial"


@pytest.mark.integration
def test_rerunning_one_arm_carries_the_others_only_from_the_same_warm_start(tmp_path):
    """`--arms b` of a scenario that also has arm `a` keeps `a` from the earlier page, but only when this
    run's warm start is the earlier one: the same key and the same start evaluation, task for task."""
    paper = _paper(seeds=1)
    logs: list[str] = []
    settings = Settings(seeds=1, out=tmp_path / "runs", log=logs.append)
    full = reproduce(paper, settings, results_dir=tmp_path / "r")
    only_rloo = dataclasses.replace(settings, arms=("rloo",))
    res = reproduce(paper, only_rloo, results_dir=tmp_path / "r")
    assert list(res["arms"]) == ["grpo", "rloo"] and res["arms"]["grpo"] == full["arms"]["grpo"]
    assert res["comparisons"] == full["comparisons"] and "carried" not in res
    assert full["status"] == res["status"] == "done" and "absent_arms" not in res  # carried: complete
    assert res["carried_arms"]["grpo"]["commit"] == full["provenance"][""]["commit"]
    page = (tmp_path / "r" / "mini.md").read_text()
    assert "**Arms `grpo` are carried over**" in page and "same start evaluation" in page
    # Another model behind the same declaration (its start evaluation differs on a task): not carried.
    prev = json.loads(json.dumps(full))
    prev["arms"]["grpo"]["start"]["per_task"][0] = 1.0 - prev["arms"]["grpo"]["start"]["per_task"][0]
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "mini.json").write_text(json.dumps(prev))
    logs.clear()
    res = reproduce(paper, only_rloo, results_dir=tmp_path / "old")
    assert list(res["arms"]) == ["rloo"] and res["comparisons"] == [] and "carried_arms" not in res
    assert any("'grpo' not carried" in m and "scores differently" in m for m in logs), logs
    assert res["status"] == "partial" and res["absent_arms"] == ["grpo"]
    # Changed overrides are not carried either.
    changed = dataclasses.replace(paper, arms=(Arm("grpo", ("algo.kl_coef=0.5",)), paper.arms[1]))
    (tmp_path / "r" / "mini.json").write_text(json.dumps(full))
    res = reproduce(changed, only_rloo, results_dir=tmp_path / "r")
    assert list(res["arms"]) == ["rloo"] and "carried_arms" not in res


def test_carried_arms_compare_overrides_as_the_config_reads_them():
    """An earlier page's `rtpo.siblings=4` (a section that moved to train.trainer_params) and a group arm
    that did not spell out `train.trainer_params={}` are the same declaration; any other change is not."""
    from horizonrl.reproduce.carry import _stale

    paper = Paper(
        name="p",
        title="t",
        claim="c",
        base="rtpo_arithmetic",
        arms=(
            Arm("rtpo", ("train.trainer=rtpo", "train.trainer_params.siblings=4")),
            Arm("grpo", ("train.trainer=group", "train.trainer_params={}", "rollout.group_size=8")),
        ),
        comparisons=(),
    )
    old = {
        "rtpo": {"overrides": ["train.trainer=rtpo", "rtpo.siblings=4"]},
        "grpo": {"overrides": ["train.trainer=group", "rollout.group_size=8"]},
    }
    assert _stale(paper, old) == []
    old["rtpo"]["overrides"] = ["train.trainer=rtpo", "rtpo.siblings=3"]
    old["gone"] = {"overrides": []}
    assert _stale(paper, old) == ["rtpo", "gone"]


def test_per_seed_table_lists_every_arm_seed_with_its_run_means():
    from horizonrl.reproduce.report import seed_table

    def seed(s, p, upd, diag):
        return {"seed": s, "pass@1": p, "updates": upd, "diagnostics": diag}

    res = {
        "arms": {
            "ccpo": {"seeds": [seed(0, 0.5, 44, {"k": 1.25}), seed(1, 0.25, 41, {"k": None})]},
            "grpo": {"seeds": [seed(0, 0.375, 40, {})]},
        }
    }
    lines = seed_table(res, ["k"]).splitlines()
    assert lines[0] == "| arm | seed | end pass@1 | updates | k |"
    assert lines[2:] == [
        "| `ccpo` | 0 | 0.500 | 44 | 1.250 |",
        "| `ccpo` | 1 | 0.250 | 41 | – |",
        "| `grpo` | 0 | 0.375 | 40 | – |",
    ]


def test_declared_arms_without_runs_are_named_on_the_page():
    from horizonrl.reproduce.report import _absent_text

    res = {"paper": "ccpo", "declared_arms": ["a", "b", "c", "d"], "arms": {"a": {}}}
    res["refused_scenarios"] = {"long": {"arms": ["d"]}}  # a refused scenario has its own section
    text = _absent_text(res)
    assert "**Not on this page:** `b`, `c`, declared" in text
    assert "`horizonrl reproduce ccpo --arms b,c`" in text and "`d`" not in text
    assert _absent_text({**res, "declared_arms": ["a"]}) == ""
    assert _absent_text({"paper": "x", "arms": {}}) == ""  # pages written before the key existed


def test_page_json_is_partial_while_declared_arms_are_absent():
    from horizonrl.reproduce.report import with_status

    res = {"paper": "ccpo", "status": "done", "declared_arms": ["a", "b", "c"], "arms": {"a": {}}}
    res["refused_scenarios"] = {"long": {"arms": ["c"]}}
    assert with_status(res)["status"] == "partial" and with_status(res)["absent_arms"] == ["b"]
    assert res["status"] == "done" and "absent_arms" not in res  # the caller's dict is left alone
    full = {**res, "arms": {"a": {}, "b": {}}}
    assert with_status(full) is full  # every declared arm there (c refused): status untouched
    refused = {**res, "status": "gate_refused", "arms": {}}
    assert with_status(refused)["status"] == "gate_refused"


def test_paired_metric_differences_by_hand():
    from horizonrl.reproduce.report import metric_table, paired_metric_diffs

    def runs(*values):
        return {s: {"diagnostics": {"sessions": v}} for s, v in enumerate(values)}

    # Seed 2's arm run did not log the metric: the pair is left out, not counted as 0.
    m = paired_metric_diffs(runs(2.0, 3.0, None), runs(2.5, 3.1, 1.0), [0, 1, 2], ["sessions", "absent"])
    assert set(m) == {"sessions"} and m["sessions"]["seeds"] == [0, 1]
    assert m["sessions"]["diffs"] == pytest.approx([-0.5, -0.1])
    t = m["sessions"]["t"]  # mean -0.3, sd 0.2828, t(0.975, 1 df) = 12.706: half-width 2.541
    assert t["mean"] == pytest.approx(-0.3) and t["hi"] - t["mean"] == pytest.approx(12.7062 * 0.2, rel=1e-4)
    low = paired_metric_diffs(runs(2.0, 2.9, 3.1), runs(3.0, 4.0, 4.0), [0, 1, 2], ["sessions"])
    # diffs -1.0, -1.1, -0.9: mean -1.0, sd 0.1, t(0.975, 2 df) = 4.303 -> [-1.248, -0.752]
    assert low["sessions"]["t"]["hi"] == pytest.approx(-1.0 + 4.3027 * 0.1 / math.sqrt(3), rel=1e-4)
    res = {"comparisons": [{"arm": "a", "baseline": "b", "metrics": low}, {"arm": "c", "baseline": "b"}]}
    table = metric_table(res)
    assert "| `a` − `b` | `sessions` | -1.000, -1.100, -0.900 |" in table
    assert "arm lower (95% CI below 0)" in table and "`c`" not in table
    assert metric_table({"comparisons": [{"arm": "c", "baseline": "b"}]}) == ""
