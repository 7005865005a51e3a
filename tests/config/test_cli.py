"""CLI: listings, config errors that name the field, demos, view."""

from __future__ import annotations

import json

from horizonrl.cli import main
from horizonrl.credit import list_estimators
from horizonrl.envs import list_envs


def test_listings(capsys):
    assert main(["envs"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in list_envs())
    assert main(["estimators"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in list_estimators())
    assert main(["config-reference"]) == 0
    assert "`algo.clip_high`" in capsys.readouterr().out


def test_bad_config_is_a_named_error(capsys, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("rollout:\n  group_size: -1\n")
    assert main(["train", "--config", str(cfg)]) == 2
    assert "rollout.group_size=-1" in capsys.readouterr().err


def test_unknown_estimator_lists_known_ones(capsys, tmp_path):
    assert main(["train", f"train.out_dir={tmp_path}", "algo.estimator=nope"]) == 2
    err = capsys.readouterr().err
    assert "nope" in err and "grpo" in err


def test_demos_and_view(capsys, tmp_path):
    out = tmp_path / "d.jsonl"
    assert main(["demos", "--env", "lookup", "--n", "5", "--out", str(out), "--knobs", '{"hops": 1}']) == 0
    demos = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(demos) == 5 and all(d["success"] for d in demos)
    assert demos[0]["messages"][0]["role"] == "system" and demos[0]["tools"]
