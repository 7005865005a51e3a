"""scripts/gpu_recipe.py: its CPU dry run (a tiny model, the hf engine) and its refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_recipe.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=900)


def test_cpu_dry_run_trains_both_methods_and_reports_curves(tmp_path):
    out = tmp_path / "recipe.json"
    proc = _run("--cpu", "--out", str(out), "--work", str(tmp_path / "work"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["cpu"] and result["env"] == "math_python"
    assert [r["method"] for r in result["runs"]] == ["grpo", "rtpo"]
    for run in result["runs"]:
        assert run["steps"], run
        for row in run["steps"]:
            assert row["rollout_tok_s"] > 0 and row["update_tok_s"] > 0 and row["rss_gib"] > 0.1
            assert abs(row["ratio"] - 1.0) < 1e-3  # float32 hf engine: the update recomputes its log-probs
        # The curve: an evaluation before the first step, then every --eval-every steps.
        assert run["evals"][0]["step"] == 0 and run["evals"][0]["gen_tokens"] == 0
        assert all(0.0 <= e["pass@1"] <= 1.0 for e in run["evals"])
    assert "learning curve (held-out pass@1): step 0" in proc.stdout
    assert "grpo step 1: reward" in proc.stdout and "rollout_tok_s" in proc.stdout


def test_without_a_local_model_it_says_how_to_place_the_weights(tmp_path):
    for args in ([], ["--model", str(tmp_path)], ["--model", str(tmp_path / "nope")]):
        proc = _run(*args)
        assert proc.returncode == 2
        assert "huggingface-cli download" in proc.stderr and "rsync" in proc.stderr
    proc = _run("--model", str(tmp_path))
    assert "missing config.json, *.safetensors weights, tokenizer.json" in proc.stderr
    assert "choose from ['grpo', 'rtpo']" in _run("--cpu", "--methods", "ppo").stderr
