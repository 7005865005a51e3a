"""scripts/smollm2_gpu.py: the weights split into parts and joined back exactly, refusals naming what is
wrong, and (integration) its CPU dry run on the real SmolLM2 weights."""

from __future__ import annotations

import hashlib
import json

import pytest

from helpers.script_loader import load_script


def _script():
    return load_script("scripts/smollm2_gpu.py")


def test_split_and_join_round_trip(tmp_path):
    mod = _script()
    src = tmp_path / "w.gguf"
    data = bytes(range(256)) * 41 + b"tail"  # 10500 bytes, not a multiple of 3
    src.write_bytes(data)
    dirs = mod.split(src, 3, tmp_path / "out")
    sizes = [(d / f"smollm2.gguf.{i}").stat().st_size for i, d in enumerate(dirs)]
    assert sizes == [3500, 3500, 3500]
    manifest = json.loads((dirs[0] / "manifest.json").read_text())
    assert manifest == {"parts": 3, "bytes": 10500, "sha256": hashlib.sha256(data).hexdigest()}
    joined = mod.join(dirs, tmp_path / "joined.gguf")
    assert joined.read_bytes() == data
    with pytest.raises(SystemExit, match="2 part folders given, the manifest says 3"):
        mod.join(dirs[:2], tmp_path / "x")
    (dirs[2] / "smollm2.gguf.2").write_bytes(b"other")
    with pytest.raises(SystemExit, match="do not match the manifest"):
        mod.join(dirs, tmp_path / "x")
    (dirs[1] / "smollm2.gguf.1").unlink()
    with pytest.raises(SystemExit, match="part 1 missing"):
        mod.join(dirs, tmp_path / "x")


def test_wilson_interval_by_hand():
    lo, hi = _script().wilson(10, 100)
    # p = 0.1, n = 100, z = 1.96: centre 0.1168, half-width 0.0623 (Wilson's formula by hand).
    assert abs(lo - 0.0552) < 1e-3 and abs(hi - 0.1744) < 1e-3


@pytest.mark.integration
def test_cpu_dry_run_on_the_real_weights(tmp_path, capsys):
    pytest.importorskip("gguf")
    from horizonrl.models.loading import smollm2_gguf_path

    try:
        gguf = smollm2_gguf_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    mod = _script()
    dirs = mod.split(gguf, 2, tmp_path / "parts")
    mod.main(
        [
            "train",
            "--parts",
            *map(str, dirs),
            "--cache",
            str(tmp_path / "model"),
            "--device",
            "cpu",
            "--dry-run",
            "--eval-tasks",
            "2",
        ]
    )
    out = capsys.readouterr().out
    result = json.loads(out.strip().splitlines()[-1])
    assert result["steps"] == 1 and result["device"] == "cpu" and result["eval_tasks"] == 2
    assert 0.0 <= result["pass1_start"] <= 1.0 and result["rollout_tok_s"] > 0
    assert "held-out pass@1 (2 tasks): start" in out
