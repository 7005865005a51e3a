"""The SFT warm start with and without prefix-shared training, side by side on the same demonstrations.

The quickstart's warm start trains the tiny model on expert demonstrations whose system prompt and tool
block (about 245 of each row's ~310 tokens) are the same in every row. With ``algo.tree_training: auto``
``sft_train`` forwards that prefix once per micro-batch and runs the LM head only at assistant tokens
(train/update/prefix.py); ``off`` forwards every row whole. Each repeat trains ``--steps`` SFT steps of
the quickstart's settings (batch 16, lr 1e-3) from the shipped base model with sharing off, then auto,
on the same demonstrations, and reports seconds a step (best of ``--repeats``), the ratio, and the
largest relative difference of the two runs' per-step losses (float rounding only). Time it alone
(2 cores: nothing else running)::

    .venv/bin/python benchmarks/sft_prefix.py --steps 30 --repeats 2 --json docs/benchmarks/sft_prefix.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from horizonrl.config import load_config
from horizonrl.models.chat import renderer_for
from horizonrl.train.recipes import generate_demos, load_policy, packaged_config
from horizonrl.train.warmstart.sft import demo_rows, sft_train


def run(steps: int, share: bool, demos: list, work: Path) -> tuple[float, list[float], float]:
    """Seconds of ``steps`` SFT steps from the shipped base, their losses, and the rows' mean length."""
    cfg = load_config(packaged_config("quickstart"), [])
    model, tok = load_policy(cfg.model, init=None, work_dir=work)
    rows = demo_rows(renderer_for(tok, cfg), demos)
    t0 = time.perf_counter()
    losses = sft_train(
        model, rows, epochs=1, batch_size=cfg.sft.batch_size, lr=cfg.sft.lr, seed=0,
        device=torch.device("cpu"), share_prefix=share,
    )  # fmt: skip
    return time.perf_counter() - t0, losses, sum(map(len, rows)) / len(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30, help="SFT steps of 16 demonstrations")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--work", default="runs/bench_sft_prefix")
    ap.add_argument("--json", default=None, help="write the measurements here")
    args = ap.parse_args()
    cfg = load_config(packaged_config("quickstart"), [])
    demos = generate_demos(
        cfg.env.name, 16 * args.steps, seed=0, noise=cfg.sft.noise, max_turns=cfg.rollout.max_turns,
        knobs=dict(cfg.env.knobs), task_seed=cfg.env.seed, setup=None,
    )  # fmt: skip
    best = {False: float("inf"), True: float("inf")}
    losses = {}
    for _ in range(args.repeats):
        for share in (False, True):
            sec, losses[share], mean_len = run(args.steps, share, demos, Path(args.work))
            best[share] = min(best[share], sec)
    diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses[True], losses[False], strict=True))
    print(
        f"SFT warm start, quickstart settings: {args.steps} steps x 16 demonstrations, "
        f"mean {mean_len:.0f} tokens"
    )
    print(f"{'tree_training':>14} {'s/step':>8}")
    for share, name in ((False, "off"), (True, "auto")):
        print(f"{name:>14} {best[share] / args.steps:>8.3f}")
    ratio = best[False] / best[True]
    print(f"auto vs off: {ratio:.2f}x faster; largest relative loss difference {diff:.1e}")
    if args.json:
        record = {
            "steps": args.steps, "repeats": args.repeats, "mean_row_tokens": round(mean_len, 1),
            "seconds_per_step": {"off": best[False] / args.steps, "auto": best[True] / args.steps},
            "speedup": ratio, "max_relative_loss_difference": diff,
            "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
            "torch": torch.__version__,
        }  # fmt: skip
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
