"""Mosaic vs broadcasting, from the same warm start, under compaction and under subagent forking.

For each scenario (``compaction``: ``mosaic_compaction_lookup.yaml``; ``fork``:
``mosaic_fork_lookup.yaml``) the script builds the embedded tiny model once,
warm-starts it by SFT on expert rollouts of that scenario's agent program, then
trains Mosaic and broadcasting from that checkpoint with the same seeds, tasks,
steps and rollout budget, and prints held-out success and sessions per rollout
side by side (the paper: Mosaic more accurate with fewer sessions). Example::

    python benchmarks/mosaic.py --steps 12 --tasks 8 --group 8 --demos 1200
    python benchmarks/mosaic.py --scenarios compaction --steps 4     # quicker look
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from horizonrl.config import load_config
from horizonrl.train.recipes import packaged_config, run_sft
from horizonrl.train.trainers.group import GroupTrainer

SCENARIOS = {"compaction": "mosaic_compaction_lookup", "fork": "mosaic_fork_lookup"}


def run(args) -> list[dict]:
    out = Path(args.out)
    results = []
    for scenario in args.scenarios:
        common = [
            f"train.steps={args.steps}",
            f"rollout.tasks_per_step={args.tasks}",
            f"rollout.group_size={args.group}",
            f"sft.demos={args.demos}",
            f"sft.epochs={args.sft_epochs}",
            f"env.test_tasks={args.test_tasks}",
            f"train.eval_samples={args.eval_samples}",
            f"model.tiny_pretrain_steps={args.pretrain}",
            "train.save_every=0",
            "train.progress=false",
            f"train.seed={args.seed}",
        ]
        base = load_config(packaged_config(SCENARIOS[scenario]), common)
        sft_dir = out / scenario / "sft"
        t0 = time.perf_counter()
        if not (sft_dir / "config.json").exists():
            cfg = dataclasses.replace(base, sft=dataclasses.replace(base.sft, out_dir=str(sft_dir)))
            run_sft(cfg, work_dir=out / scenario)
        sft_s = time.perf_counter() - t0
        for estimator in ("mosaic", "broadcast"):
            params = base.algo.estimator_params if estimator == "mosaic" else {}
            cfg = dataclasses.replace(
                base,
                algo=dataclasses.replace(base.algo, estimator=estimator, estimator_params=dict(params)),
                train=dataclasses.replace(
                    base.train, init=str(sft_dir), out_dir=str(out / scenario / estimator)
                ),
            )
            t1 = time.perf_counter()
            records = GroupTrainer(cfg).fit()
            train_s = time.perf_counter() - t1
            before, after = records[0], records[-1]
            steps = records[1:]
            results.append(
                {
                    "scenario": scenario,
                    "estimator": estimator,
                    "sft_pass@1": before["eval/pass@1"],
                    "pass@1": after["eval/pass@1"],
                    "eval_sessions": after["eval/rollout/sessions_mean"],
                    "train_sessions": sum(r["rollout/sessions_mean"] for r in steps) / max(1, len(steps)),
                    "train_success": sum(r["success/rate"] for r in steps) / max(1, len(steps)),
                    "ig_score_s": sum(r.get("time/ig_score_s", 0.0) for r in steps),
                    "train_s": train_s,
                    "sft_s": sft_s,
                }
            )
            print(json.dumps(results[-1]), flush=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--demos", type=int, default=1200)
    ap.add_argument("--sft-epochs", type=int, default=2)
    ap.add_argument("--pretrain", type=int, default=1500)
    ap.add_argument("--test-tasks", type=int, default=32)
    ap.add_argument("--eval-samples", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/bench_mosaic")
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads (1 is fastest on a shared 2-core box)"
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    results = run(args)
    print(
        f"\n{'scenario':<11}{'estimator':<11}{'SFT p@1':>8}{'p@1':>7}{'sess/eval':>10}"
        f"{'sess/train':>11}{'succ/train':>11}{'IG s':>7}{'train s':>9}"
    )
    for r in results:
        print(
            f"{r['scenario']:<11}{r['estimator']:<11}{r['sft_pass@1']:>8.3f}{r['pass@1']:>7.3f}"
            f"{r['eval_sessions']:>10.2f}{r['train_sessions']:>11.2f}{r['train_success']:>11.3f}"
            f"{r['ig_score_s']:>7.1f}{r['train_s']:>9.0f}"
        )


if __name__ == "__main__":
    main()
