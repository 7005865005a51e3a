"""RTPO vs GRPO vs SeeUPO at a matched generation budget, from one warm start (issue 4).

Task: ``arithmetic`` with two additions of one-digit operands (two calculator
calls and the answer: ``K = 3`` turns). The embedded tiny model (128 hidden, 4
layers) is built and warm-started by SFT on expert demonstrations (noise 0.1)
recorded under the benchmark's conditioning map ``psi = turn_summary``
(``recipes.run_sft`` drives the same agent programs with the scripted expert, so
every demo turn has exactly the context the policy will see).
From that checkpoint each method trains until it has generated the same number
of rollouts (``--budget``):

- ``grpo``: group trainer, ``G`` chains per task, every turn trained under its exact context;
- ``rtpo``: reverse-turn trainer (trunks, ``G-1 = 2`` on-policy siblings per boundary),
  ``train.trainer_params.max_rollouts = budget``;
- ``rtpo_flat``: the same, log-probs recomputed under the concatenated full history;
- ``seeupo``: ``G`` independent chains, reverse per-turn updates over flat histories.

Reported per method: held-out pass@1 of the warm start and after training,
rollouts and tokens generated, wall time, and the rollout/train consistency
before each update — ``train/ratio_geomean = exp(mean(logp_train - logp_rollout))``
(mean and worst over updates) and ``KL(pi_rollout || pi_train)`` (k3). Under
per-turn summaries RTPO (and GRPO, which also trains at the recorded contexts)
stays at 1.0; flat training drifts.

    python benchmarks/rtpo.py --out runs/bench_rtpo
    python benchmarks/rtpo.py --methods rtpo,rtpo_flat --budget 200   # reuses runs/bench_rtpo/sft if present

Time (defaults, one thread, 2-core machine shared with other jobs): base model +
SFT 395 s, grpo 130 s, rtpo 63 s, rtpo_flat 65 s, seeupo 183 s (three updates per
batch over flat histories), about 14 minutes in all. Numbers of that run
(32 held-out tasks x 2 samples, so one success is 0.016 of pass@1)::

    method   pass@1 start -> end  rollouts  gen_tokens  ratio_mean  ratio_worst  KL
    grpo          0.234 -> 0.344       896       58450      1.0000       1.0000   -
    rtpo          0.234 -> 0.250       872       36168      1.0000       1.0000   0.00000
    rtpo_flat     0.234 -> 0.219       868       35142      0.4645       0.0607   1.05131
    seeupo        0.234 -> 0.250       896       58770      0.4964       0.0859   0.84892
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import torch

from horizonrl.agents import psi as _psi  # noqa: F401  (registers the conditioning maps)
from horizonrl.config import RunConfig, load_config
from horizonrl.train.recipes import packaged_config, run_sft
from horizonrl.train.trainers.registry import make_trainer

METHODS = ("grpo", "rtpo", "rtpo_flat", "seeupo")


def base_config(args, out: Path) -> RunConfig:
    over = [
        f"model.tiny_hidden={args.hidden}",
        f"model.tiny_layers={args.layers}",
        f"model.tiny_pretrain_steps={args.pretrain_steps}",
        f"env.knobs={{n_ops: 2, max_operand: {args.max_operand}, ops: '{args.ops}'}}",
        f"env.train_tasks={args.train_tasks}",
        f"env.test_tasks={args.test_tasks}",
        f"rollout.tasks_per_step={args.tasks}",
        f"rollout.group_size={args.group}",
        f"rollout.max_new_tokens={args.max_new_tokens}",
        f"optim.lr={args.lr}",
        f"train.seed={args.seed}",
        f"train.eval_samples={args.eval_samples}",
        "train.eval_every=0",
        "train.save_every=0",
        "train.save_rollouts=false",
        "train.progress=false",
        f"sft.demos={args.demos}",
        f"sft.epochs={args.sft_epochs}",
        f"sft.noise={args.sft_noise}",
        f"sft.out_dir={out / 'sft'}",
    ]
    return load_config(packaged_config("rtpo_arithmetic"), over)


def warm_start(cfg: RunConfig, out: Path) -> Path:
    """Tiny model + SFT on expert demos recorded under ``rollout.context`` (``recipes.run_sft``)."""
    sft_dir = Path(cfg.sft.out_dir)
    if (sft_dir / "config.json").exists():
        return sft_dir

    def log(i, n, loss):
        if i == 1 or i == n:
            print(f"  sft step {i}/{n} loss {loss:.3f}", flush=True)

    return run_sft(cfg, work_dir=out, log=log)


def method_config(cfg: RunConfig, method: str, budget: int, sft: Path, out: Path) -> RunConfig:
    per_step = cfg.rollout.tasks_per_step * cfg.rollout.group_size
    steps = max(1, budget // per_step)
    trainer = {"grpo": "group", "rtpo": "rtpo", "rtpo_flat": "rtpo", "seeupo": "seeupo"}[method]
    params = {**cfg.train.trainer_params, "max_rollouts": budget, "flat": method == "rtpo_flat"}
    train = dataclasses.replace(
        cfg.train,
        trainer=trainer,
        init=str(sft),
        out_dir=str(out / method),
        steps=10_000 if trainer == "rtpo" else steps,
        trainer_params=params if trainer != "group" else {},
    )
    algo = cfg.algo if trainer != "group" else dataclasses.replace(cfg.algo, loss_agg_mode=None)
    return dataclasses.replace(cfg, train=train, algo=algo)


def summarize(method: str, cfg: RunConfig, records: list[dict], seconds: float) -> dict:
    updates = [r for r in records if "train/ratio_geomean" in r]
    ratios = [r["train/ratio_geomean"] for r in updates]
    kls = [r["train/kl_rollout_train"] for r in updates if "train/kl_rollout_train" in r]
    if method == "grpo":
        per_step = cfg.rollout.tasks_per_step * cfg.rollout.group_size
        rollouts = per_step * len(updates)
        tokens = sum(r["rollout/response_tokens_mean"] * per_step for r in updates)
    else:
        last = next(r for r in reversed(records) if "budget/rollouts" in r)
        rollouts, tokens = last["budget/rollouts"], last["budget/gen_tokens"]
    return {
        "method": method,
        "pass@1_start": records[0]["eval/pass@1"],
        "pass@1_end": records[-1]["eval/pass@1"],
        "updates": len(updates),
        "rollouts": int(rollouts),
        "gen_tokens": int(tokens),
        "wall_s": seconds,
        "ratio_mean": float(np.mean(ratios)) if ratios else float("nan"),
        "ratio_worst": float(max(ratios, key=lambda x: abs(np.log(x)))) if ratios else float("nan"),
        "kl_mean": float(np.mean(kls)) if kls else float("nan"),
    }


def table(rows: list[dict]) -> str:
    cols = [
        ("method", "{:<10}"),
        ("pass@1_start", "{:>12.3f}"),
        ("pass@1_end", "{:>10.3f}"),
        ("updates", "{:>8d}"),
        ("rollouts", "{:>9d}"),
        ("gen_tokens", "{:>11d}"),
        ("wall_s", "{:>8.0f}"),
        ("ratio_mean", "{:>11.4f}"),
        ("ratio_worst", "{:>12.4f}"),
        ("kl_mean", "{:>9.5f}"),
    ]
    widths = [len(f.format("" if name == "method" else 0)) for name, f in cols]
    lines = [
        "  ".join(
            name.rjust(w) if i else name.ljust(w)
            for i, ((name, _), w) in enumerate(zip(cols, widths, strict=True))
        )
    ]
    for r in rows:
        lines.append("  ".join(f.format(r[name]) for name, f in cols))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/bench_rtpo")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--budget", type=int, default=896, help="generated rollouts per method")
    ap.add_argument("--tasks", type=int, default=8, help="tasks per step / iteration")
    ap.add_argument("--group", type=int, default=8, help="G of GRPO and SeeUPO")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--pretrain-steps", type=int, default=1500)
    ap.add_argument("--demos", type=int, default=1000)
    ap.add_argument("--sft-epochs", type=int, default=3)
    ap.add_argument("--sft-noise", type=float, default=0.1, help="expert noise of the demonstrations")
    ap.add_argument("--max-operand", type=int, default=9)
    ap.add_argument("--ops", default="+", help="arithmetic operators of the tasks")
    ap.add_argument("--train-tasks", type=int, default=1000)
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--test-tasks", type=int, default=32)
    ap.add_argument("--eval-samples", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise SystemExit(f"--methods: unknown {unknown}; known: {list(METHODS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = base_config(args, out)
    t0 = time.perf_counter()
    print(f"[warm start] tiny model (hidden {args.hidden}, {args.layers} layers), SFT on {args.demos} demos")
    sft = warm_start(cfg, out)
    print(f"  done in {time.perf_counter() - t0:.0f}s")
    results = []
    for method in methods:
        mcfg = method_config(cfg, method, args.budget, sft, out)
        t1 = time.perf_counter()
        records = make_trainer(mcfg).fit()
        res = summarize(method, mcfg, records, time.perf_counter() - t1)
        results.append(res)
        print(
            f"[{method}] "
            + json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in res.items()})
        )
    print()
    print(table(results))
    print(f"\ntotal {time.perf_counter() - t0:.0f}s; results in {out / 'results.json'}")
    (out / "results.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=2))


if __name__ == "__main__":
    main()
