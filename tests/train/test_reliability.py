"""Determinism across processes, exact resume after kill -9, corrupted checkpoints, full disk, resume config.

The subprocess tests run the real ``horizonrl train`` CLI on the tiny model (one torch thread each,
different PYTHONHASHSEEDs) and compare final weights bit for bit and metrics.jsonl without the
timing keys (``NONDETERMINISTIC_KEYS``).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import horizonrl
from helpers.shaped_env import arith_run_overrides
from horizonrl.cli import main
from horizonrl.config import ConfigError, load_config
from horizonrl.errors import CheckpointError, HorizonWarning
from horizonrl.train.records import checkpoint as ckpt
from horizonrl.train.records.metrics import read_metrics
from horizonrl.train.trainers.group import NONDETERMINISTIC_KEYS, GroupTrainer

SRC = str(Path(horizonrl.__file__).resolve().parents[1])
STEPS = 4


def _args(model_dir, out_dir, *extra):
    return arith_run_overrides(
        model_dir,
        out_dir,
        # IGPO's turn-level information gain gives every step a gradient even when no rollout of the
        # untrained tiny model succeeds (GRPO's advantages would all be 0 and the weights never move).
        "algo.estimator=igpo",
        "train.eval_every=2",
        "train.save_every=1",
        *extra,
    )


def _spawn(model_dir, out_dir, *extra, hashseed: int, resume: bool = False) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=SRC, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PYTHONHASHSEED"] = str(hashseed)
    cmd = [sys.executable, "-m", "horizonrl.cli", "train", *(["--resume"] if resume else [])]
    cmd += _args(model_dir, out_dir, f"train.steps={STEPS}", *extra)
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> None:
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]


def _weights(run: Path, step: int = STEPS) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / f"step_{step}" / "model.safetensors"))


def _metrics(run: Path) -> str:
    recs = [
        {k: v for k, v in r.items() if not k.startswith(NONDETERMINISTIC_KEYS)} for r in read_metrics(run)
    ]
    return json.dumps(recs, sort_keys=True)


def _assert_same_run(a: Path, b: Path) -> None:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    assert _metrics(a) == _metrics(b)
    assert [r["step"] for r in read_metrics(b)] == list(range(STEPS + 1))
    assert all(r["train/grad_norm"] > 0 for r in read_metrics(b)[1:])  # every step moved the weights
    for f in sorted((a / "rollouts").glob("*.jsonl")):  # the sampled rollouts, byte for byte
        assert f.read_bytes() == (b / "rollouts" / f.name).read_bytes(), f.name


@pytest.fixture(scope="module")
def two_runs(tiny_model_dir, tmp_path_factory):
    """The same config and seed trained in two processes at once (different hash seeds)."""
    root = tmp_path_factory.mktemp("det")
    procs = [_spawn(tiny_model_dir, root / name, hashseed=seed) for name, seed in (("a", 1), ("b", 2))]
    for p in procs:
        _finish(p)
    return root / "a", root / "b"


def test_same_config_and_seed_are_bit_identical_in_two_processes(two_runs, tiny_model_dir):
    a, b = two_runs
    _assert_same_run(a, b)
    start = load_file(str(tiny_model_dir / "model.safetensors"))
    assert any(not torch.equal(start[k], v) for k, v in _weights(a).items() if k in start)  # it trained


def test_kill_9_after_the_first_checkpoint_resumes_exactly(two_runs, tiny_model_dir, tmp_path):
    reference, _ = two_runs
    run = tmp_path / "killed"
    proc = _spawn(tiny_model_dir, run, hashseed=3)
    deadline = time.monotonic() + 240
    while not (run / "checkpoints" / "step_1").is_dir():
        assert proc.poll() is None, f"exited before its first checkpoint: {proc.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline, "no checkpoint within the deadline"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL  # killed mid-run, not finished
    assert not (run / "checkpoints" / f"step_{STEPS}").exists()
    _finish(_spawn(tiny_model_dir, run, hashseed=4, resume=True))
    _assert_same_run(reference, run)
    assert not list((run / "checkpoints").glob(".step_*.tmp"))


# ------------------------------------------------------------------ corrupted checkpoints (in process)


def _cfg(model_dir, out_dir, *extra):
    return load_config(None, _args(model_dir, out_dir, "train.keep_checkpoints=3", *extra))


@pytest.fixture(scope="module")
def base_run(tiny_model_dir, tmp_path_factory):
    """A 3-step run with checkpoints 1, 2, 3; returns (run dir, final weights, metrics text)."""
    run = tmp_path_factory.mktemp("base") / "run"
    trainer = GroupTrainer(_cfg(tiny_model_dir, run, "train.steps=3"))
    trainer.fit()
    final = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    return run, final, _metrics(run)


def _copy(base_run, tmp_path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(base_run[0], run)
    return run


def _truncate(path: Path, keep: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.mark.parametrize(
    ("name", "keep", "reason"),
    [
        ("model.safetensors", 0.5, "the weights do not load"),
        ("trainer_state.pt", 0.5, "trainer_state.pt does not load"),
        ("trainer_state.pt", 0.0, "the file is empty"),
    ],
)
def test_a_corrupt_latest_checkpoint_falls_back_to_the_previous_one_exactly(
    base_run, tiny_model_dir, tmp_path, name, keep, reason
):
    run = _copy(base_run, tmp_path)
    _truncate(run / "checkpoints" / "step_3" / name, keep)
    with pytest.warns(HorizonWarning, match=rf"step_3: .*{reason}.*falling back to .*step_2 \(step 2\)"):
        trainer = GroupTrainer(_cfg(tiny_model_dir, run, "train.steps=3"), resume=True)
    assert trainer.step == 2
    trainer.fit()  # retrains step 3: the same weights and metrics as the uninterrupted run
    for k, v in base_run[1].items():
        assert torch.equal(trainer.model.state_dict()[k], v), k
    assert _metrics(run) == base_run[2]
    ckpt.read_checkpoint(run / "checkpoints" / "step_3")  # rewritten whole


def test_no_usable_checkpoint_is_refused_listing_each(base_run, tiny_model_dir, tmp_path):
    run = _copy(base_run, tmp_path)
    for s in (1, 2, 3):
        (run / "checkpoints" / f"step_{s}" / "trainer_state.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match="no usable checkpoint") as e:
        GroupTrainer(_cfg(tiny_model_dir, run, "train.steps=3"), resume=True)
    assert all(f"step_{s}: trainer_state.pt does not load" in str(e.value) for s in (1, 2, 3))


def test_a_full_disk_mid_save_leaves_no_temporary_directory(base_run, tiny_model_dir, tmp_path, monkeypatch):
    run = _copy(base_run, tmp_path)
    real_save = torch.save

    def full_disk(obj, f, *a, **k):
        Path(f).write_bytes(b"PK\x03\x04 partial")  # some bytes made it, then the disk filled
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))

    monkeypatch.setattr(ckpt.torch, "save", full_disk)
    trainer = GroupTrainer(_cfg(tiny_model_dir, run, "train.steps=4"), resume=True)
    with pytest.raises(
        CheckpointError, match=r"could not write checkpoint .*step_4: No space left on device"
    ):
        trainer.fit()
    monkeypatch.setattr(ckpt.torch, "save", real_save)
    root = run / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_1", "step_2", "step_3"]
    assert (root / "latest").read_text() == "step_3\n"
    # Through the CLI it is one line and exit status 2.
    monkeypatch.setattr(ckpt.torch, "save", full_disk)
    code = main(
        ["train", "--resume", *_args(tiny_model_dir, run, "train.keep_checkpoints=3", "train.steps=4")]
    )
    assert code == 2


def test_stale_temporaries_of_a_crashed_save_are_removed_at_start(base_run, tiny_model_dir, tmp_path):
    run = _copy(base_run, tmp_path)
    stale = run / "checkpoints" / ".step_4.tmp"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    (run / "checkpoints" / "latest.tmp").write_text("step_4")
    GroupTrainer(_cfg(tiny_model_dir, run, "train.steps=3"), resume=True)
    assert not stale.exists() and not (run / "checkpoints" / "latest.tmp").exists()


# ------------------------------------------------------------------ resume with another config


RESUME_CHANGES = [
    (["optim.lr=0.01"], ["optim.lr: 0.001 -> 0.01"]),
    (
        ["rollout.group_size=2", "algo.estimator=rloo"],
        ["rollout.group_size: 4 -> 2", "algo.estimator: 'igpo' -> 'rloo'"],
    ),
    (["env.knobs={n_ops: 2, max_operand: 9}"], ["env.knobs.n_ops: 1 -> 2"]),
    (
        ["env.name=lookup", "env.knobs={}"],
        [
            "env.name: 'arithmetic' -> 'lookup'",
            "env.knobs.max_operand: 9 -> <unset>",
            "env.knobs.n_ops: 1 -> <unset>",
        ],
    ),
    (["model.path=tiny", "model.tiny_hidden=64"], ["model.path:", "model.tiny_hidden: 128 -> 64"]),
]


@pytest.mark.parametrize(("overrides", "lines"), RESUME_CHANGES)
def test_resume_with_a_different_config_is_refused_naming_each_field(
    base_run, tiny_model_dir, tmp_path, overrides, lines
):
    run = _copy(base_run, tmp_path)
    saved = (run / "config.yaml").read_bytes()
    with pytest.raises(ConfigError, match="differs from the run's saved") as e:
        GroupTrainer(_cfg(tiny_model_dir, run, "train.steps=3", *overrides), resume=True)
    got = str(e.value).splitlines()[1:]
    assert len(got) == len(lines), got
    for want, line in zip(lines, got, strict=True):
        assert line.strip().startswith(want), (want, line)
    assert (run / "config.yaml").read_bytes() == saved  # not rewritten to claim the new values


def test_resume_may_change_the_run_length_and_output_settings(base_run, tiny_model_dir, tmp_path):
    run = _copy(base_run, tmp_path)
    extra = ("train.steps=5", "train.progress=true", "train.save_every=2", "train.save_rollouts=false")
    trainer = GroupTrainer(_cfg(tiny_model_dir, run, *extra), resume=True)
    assert trainer.step == 3
    assert load_config(run / "config.yaml").train.steps == 5


def test_resume_refusal_through_the_cli_is_one_error_and_status_2(base_run, tiny_model_dir, tmp_path, capsys):
    run = _copy(base_run, tmp_path)
    code = main(
        ["train", "--resume", *_args(tiny_model_dir, run, "train.keep_checkpoints=3", "optim.lr=0.01")]
    )
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert (
        err.startswith("horizonrl: error: --resume: the config differs") and "optim.lr: 0.001 -> 0.01" in err
    )


def test_resuming_with_another_thread_count_warns(base_run, tiny_model_dir, tmp_path):
    run = _copy(base_run, tmp_path)
    saved = ckpt.load_trainer_state(run / "checkpoints" / "step_3")["threads"]
    before = torch.get_num_threads()
    torch.set_num_threads(saved + 1)
    try:
        with pytest.warns(HorizonWarning, match=rf"written with {saved} torch thread"):
            GroupTrainer(_cfg(tiny_model_dir, run, "train.steps=3"), resume=True)
    finally:
        torch.set_num_threads(before)


def test_weights_of_another_model_are_a_clear_checkpoint_error(base_run, tmp_path):
    from horizonrl.models import TinyModelConfig, build_tiny_model, load_model_and_tokenizer

    _, tok = load_model_and_tokenizer(base_run[0] / "checkpoints" / "step_3")
    other = build_tiny_model(tok, TinyModelConfig(hidden_size=16, num_layers=1, intermediate_size=48))
    with pytest.raises(CheckpointError, match=r"does not match the model .*shape mismatch"):
        ckpt.load_weights_into(other, base_run[0] / "checkpoints" / "step_3")
