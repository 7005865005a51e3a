"""The quickstart learns on every fresh machine: run it for several seeds and assert each gains.

    python scripts/quickstart_check.py --jobs 3       # seeds 0 1 2 side by side, >= +15 points
    python scripts/quickstart_check.py --seeds 3 4 --jobs 1 --min-gain 20
    python scripts/quickstart_check.py --rebuild      # each seed also builds its own base model

Each seed trains with its own ``train.seed`` (its own SFT demonstrations and order, its own GRPO
samples) from the base model the quickstart ships, which is what every user's quickstart starts from.
``--rebuild`` also builds and copy-pretrains each seed's own base model (``model.seed``,
``model.tiny_pretrain=rebuild``), so a lucky initialisation cannot pass for the others; that adds
10-20 minutes a seed on 2 cores, which CI's budget does not hold. With ``--jobs 2`` two runs share the
machine, one torch thread each (the results do not depend on it; the wall time does). Exits
non-zero, naming the seed, when a run gains less than ``--min-gain`` points of held-out pass@1.
``make quickstart-check`` runs this; ``.ci/run`` calls it after the default suite.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def run_seed(seed: int, out: Path, threads: int, rebuild: bool = False) -> dict:
    d = out / f"seed_{seed}"
    d.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    cmd = [sys.executable, "-m", "horizonrl.cli", "quickstart", "--out", str(d),
           "--json", str(d / "result.json"), f"train.seed={seed}", "train.progress=false"]  # fmt: skip
    if rebuild:
        cmd += [f"model.seed={seed}", "model.tiny_pretrain=rebuild"]
    t0 = time.perf_counter()
    with open(d / "log.txt", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, check=False).returncode
    if rc != 0:
        return {"seed": seed, "error": f"exit {rc}, see {d / 'log.txt'}"}
    res = json.loads((d / "result.json").read_text())
    before, after = res["before"]["eval/pass@1"], res["after"]["eval/pass@1"]
    return {"seed": seed, "before": before, "after": after, "gain": 100 * (after - before),
            "seconds": time.perf_counter() - t0}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--min-gain", type=float, default=15.0, help="points of held-out pass@1")
    ap.add_argument("--out", default="runs/quickstart_check")
    ap.add_argument("--rebuild", action="store_true", help="each seed builds its own base model too")
    args = ap.parse_args()
    out = Path(args.out)
    threads = 1 if args.jobs > 1 else max(1, os.cpu_count() or 1)
    with cf.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(lambda s: run_seed(s, out, threads, args.rebuild), args.seeds))
    print(f"{'seed':>4} {'SFT start':>10} {'after GRPO':>11} {'gain (points)':>14} {'seconds':>8}")
    failed = []
    for r in results:
        if "error" in r:
            print(f"{r['seed']:>4}  {r['error']}")
            failed.append(r["seed"])
            continue
        row = f"{r['seed']:>4} {r['before']:>10.3f} {r['after']:>11.3f} {r['gain']:>+14.1f}"
        print(f"{row} {r['seconds']:>8.0f}")
        if r["gain"] < args.min_gain:
            failed.append(r["seed"])
    (out / "summary.json").write_text(json.dumps(results, indent=1) + "\n")
    if failed:
        print(
            f"quickstart-check FAILED: seeds {failed} gained less than {args.min_gain} points",
            file=sys.stderr,
        )
        return 1
    print(f"quickstart-check passed: every seed gained at least {args.min_gain} points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
