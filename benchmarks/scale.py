"""Costs of scaling out on one machine: Ray start, Ray replicas vs the local engine, 1 vs 2 update processes.

Runs, in turns on the same tiny model and config (``tests/helpers/shaped_env.py``'s dense-reward arithmetic):

- ``ray``: private Ray start (``horizonrl.cluster.connect``), replica start, then the median
  ``time/step_s`` / ``time/rollout_s`` of group-trainer steps with the local engine
  (``distributed.seeding=request``), 1 Ray replica and 2 Ray replicas;
- ``torchrun``: the median ``time/update_s`` of the same steps with 1 process and with
  ``torchrun --nproc-per-node 2`` (DDP and FSDP2, gloo);
- ``async``: wall time per step of ``train.max_staleness`` 0 and 1 and the median ``async/wait_s``.

On 2 cores the replicas and ranks compete with the trainer for the same CPUs, so these numbers are the
*overhead* of the machinery, not a speed-up (that needs cores or GPUs per replica / rank). Example::

    PYTHONPATH=src python benchmarks/scale.py --steps 4 --model-dir /tmp/tinym

Measured on the shared 2-core CI-like machine (load average 4-6 from other jobs), tiny model (hidden 128,
4 layers), 8 rollouts x 2 turns per step, medians of 4 steps, two runs:

    Ray start 4.2 s; trainer start: local 0.3-0.5 s, 1 replica 3.6-3.8 s, 2 replicas 5.6-5.9 s
    step: local 0.50-0.54 s, 1 replica 0.59-0.66 s (+19-22 %), 2 replicas 0.55-0.60 s (+11 %)
    update: 1 process 0.27-0.31 s, 2 DDP 0.26-0.30 s, 2 FSDP2 0.41-0.45 s (incl. the weight gather)
    async: staleness 0 0.52-0.54 s/step, staleness 1 0.61-0.65 s/step (batch always ready: wait 0 s)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _shaped_env():
    """``tests/helpers/shaped_env.py``, loaded from its file (it registers ``arith_shaped``; the torchrun
    workers, ``tests/helpers/dist_run.py``, register the same module): the distributed tests' environment
    and run, one copy."""
    import importlib.util

    if "shaped_env" not in sys.modules:
        path = ROOT / "tests" / "helpers" / "shaped_env.py"
        spec = importlib.util.spec_from_file_location("shaped_env", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["shaped_env"] = module
        spec.loader.exec_module(module)
    return sys.modules["shaped_env"]


def overrides(model_dir: str, out: str, *extra: str) -> list[str]:
    small_run_overrides = _shaped_env().small_run_overrides

    return small_run_overrides(model_dir, "algo.mini_batches=2", f"train.out_dir={out}", *extra)


def median_steps(trainer, steps: int) -> dict[str, float]:
    recs = [trainer.train_step() for _ in range(steps)]
    recs = recs[1:] if len(recs) > 1 else recs  # the first step warms up
    return {
        k: statistics.median(r[k] for r in recs) for k in ("time/step_s", "time/rollout_s", "time/update_s")
    }


def bench_ray(args) -> dict:
    shaped_env = _shaped_env()
    from horizonrl import cluster
    from horizonrl.config import load_config
    from horizonrl.train.trainers.group import GroupTrainer

    out: dict = {}
    t = time.perf_counter()
    ray = cluster.connect(None, num_cpus=2)
    out["ray_init_s"] = time.perf_counter() - t
    ray.cloudpickle.register_pickle_by_value(shaped_env)
    try:
        for name, extra in (
            ("local", ["distributed.seeding=request"]),
            ("ray_1_replica", ["distributed.backend=ray", "distributed.num_engine_replicas=1"]),
            ("ray_2_replicas", ["distributed.backend=ray", "distributed.num_engine_replicas=2"]),
        ):
            t = time.perf_counter()
            tr = GroupTrainer(load_config(None, overrides(args.model_dir, f"{args.out}/{name}", *extra)))
            out[f"{name}/start_s"] = time.perf_counter() - t
            out.update({f"{name}/{k}": v for k, v in median_steps(tr, args.steps).items()})
            tr.close()
    finally:
        cluster.release()
    return out


def bench_torchrun(args) -> dict:
    out: dict = {}
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    common = overrides(args.model_dir, "x", f"train.steps={args.steps}", "distributed.seeding=request")
    for name, nproc, extra in (
        ("1_process", 1, []),
        ("2_ddp", 2, ["distributed.update=ddp"]),
        ("2_fsdp", 2, ["distributed.update=fsdp"]),
    ):
        dest = Path(args.out) / f"tr_{name}"
        script = [
            str(ROOT / "tests" / "helpers" / "dist_run.py"),
            str(dest),
            *common,
            f"train.out_dir={dest}/run",
            *extra,
        ]
        if nproc == 1:
            cmd = [sys.executable, *script]
        else:
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                f"--nproc-per-node={nproc}",
                "--master-addr=127.0.0.1",
                "--master-port=29561",
                *script,
            ]
        t = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, capture_output=True)
        out[f"{name}/wall_s"] = time.perf_counter() - t
        upd = json.loads((dest / "time.json").read_text())["update_s"]
        out[f"{name}/update_s_median"] = statistics.median(upd[1:] or upd)
    return out


def bench_async(args) -> dict:
    _shaped_env()  # registers arith_shaped
    from horizonrl.config import load_config
    from horizonrl.train.trainers.group import GroupTrainer

    out: dict = {}
    for k in (0, 1):
        tr = GroupTrainer(
            load_config(None, overrides(args.model_dir, f"{args.out}/async{k}", f"train.max_staleness={k}"))
        )
        tr.train_step()  # warm-up (and, for k = 1, the first batch)
        t = time.perf_counter()
        recs = [tr.train_step() for _ in range(args.steps)]
        out[f"staleness_{k}/step_wall_s"] = (time.perf_counter() - t) / args.steps
        if k:
            out[f"staleness_{k}/wait_s_median"] = statistics.median(r["async/wait_s"] for r in recs)
        tr.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", required=True, help="a tiny model directory (e.g. from build_tiny)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", default="/tmp/horizonrl_scale_bench")
    ap.add_argument("--only", choices=("ray", "torchrun", "async"), default=None)
    args = ap.parse_args()
    res: dict = {}
    if args.only in (None, "ray"):
        res.update(bench_ray(args))
    if args.only in (None, "torchrun"):
        res.update(bench_torchrun(args))
    if args.only in (None, "async"):
        res.update(bench_async(args))
    print(json.dumps({k: round(v, 4) for k, v in res.items()}, indent=1))


if __name__ == "__main__":
    main()
