"""CCPO vs CCPO + episode vs GiGPO vs GRPO on the rooms game, from one warm start (paper Sec. 4.2, Table 4).

Stages (all on CPU with the embedded tiny model):

1. the tiny base model (tokenizer + copy pretraining, ``model`` section of
   ``ccpo_rooms.yaml``), or ``--base DIR``;
2. the shared warm start: SFT on step-wise noisy-expert demonstrations whose
   prompts are exactly the ``stepwise`` agent's
   (:func:`horizonrl.agents.stepwise.stepwise_demos`), or ``--sft DIR``;
3. for every seed and method (packaged configs ``ccpo_rooms``,
   ``ccpo_episode_rooms``, ``gigpo_rooms``, ``grpo_rooms``; identical except for
   the estimator), ``--steps`` steps of :class:`~horizonrl.train.trainers.group.GroupTrainer`
   from the warm start with the same seed, then a held-out evaluation
   (``--test-tasks`` x ``--eval-samples`` rollouts at the configs' validation
   temperature, same engine seed for every method).

Printed per method (mean over seeds): held-out success, revisit rate (share of
steps whose state was already visited earlier in the same trajectory, from the
rollouts' ``obs_key`` s: :func:`horizonrl.agents.stepwise.revisit_rate`), steps
per rollout, invalid-action rate, training success over the last half of the
steps and seconds per step. Methods train in ``--jobs`` processes of
``--threads`` torch threads (default 2 x 1: tiny-model kernels are overhead-bound,
and one thread per process is fastest on a shared 2-core box); results do not
depend on ``--jobs``. The defaults take about 700 CPU-seconds (about 9 minutes on
2 free cores; 16 minutes measured with other jobs loading the 2 cores to ~3); they
show the pipeline and the cost, not the paper's effect sizes (that needs the
full configs: ``horizonrl train --config .../ccpo_rooms.yaml``). ``--sft DIR``
reuses a warm start (``OUT/sft``) and skips about 300 CPU-seconds::

    python benchmarks/ccpo.py
    python benchmarks/ccpo.py --sft runs/bench_ccpo/sft --steps 30 --seeds 0 1 2 --group-size 8

The cost of ``contextual_credit`` itself at the paper's scale (16 tasks x 8
rollouts x 50 steps, 1,536-dim states) is measured by ``benchmarks/ccpo_credit.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import resource
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

import horizonrl.train.methods.ccpo  # noqa: F401  (registers the hidden-state feature provider)

# importing registers the stepwise agent
from horizonrl.agents.stepwise import revisit_rate, rollout_states, stepwise_demos
from horizonrl.config import RunConfig, load_config
from horizonrl.inference.base import SamplingParams
from horizonrl.train.recipes import packaged_config
from horizonrl.train.rollout.collect import collect_groups
from horizonrl.train.warmstart.bootstrap import load_policy, resolve_device, tiny_base, write_demos
from horizonrl.train.warmstart.sft import demo_rows, sft_train

METHODS = {
    "ccpo": "ccpo_rooms",
    "ccpo+episode": "ccpo_episode_rooms",
    "gigpo": "gigpo_rooms",
    "grpo": "grpo_rooms",
}


_T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - _T0:6.0f}s] {msg}", flush=True)


def _init_worker(threads: int, t0: float) -> None:
    global _T0
    _T0 = t0
    torch.set_num_threads(threads)


def load(method: str, overrides: list[str]) -> RunConfig:
    return load_config(packaged_config(METHODS[method]), overrides)


def warm_start(cfg: RunConfig, out: Path, *, base: str | None, demos: int) -> Path:
    """Build (or reuse) the base model and SFT it on step-wise demos; return the SFT model dir."""
    from horizonrl.models import ChatRenderer, save_model_and_tokenizer

    t0 = time.perf_counter()
    base_dir = Path(base) if base else out / "base_model"
    if not (base_dir / "config.json").exists():
        log(f"building the tiny base model in {base_dir}")
        tiny_base(cfg.model, base_dir)
    model, tok = load_policy(cfg.model, init=str(base_dir), work_dir=out)
    records = stepwise_demos(
        cfg.env.name,
        demos,
        seed=cfg.train.seed,
        noise=cfg.sft.noise,
        max_turns=cfg.rollout.max_turns,
        knobs=dict(cfg.env.knobs),
        task_seed=cfg.env.seed,
        **cfg.rollout.agent_params,
    )
    sft_dir = out / "sft"
    sft_dir.mkdir(parents=True, exist_ok=True)
    write_demos(sft_dir / "demos.jsonl", records)
    rows = demo_rows(ChatRenderer(tok), records)
    log(f"SFT on {len(records)} step records from {demos} noisy-expert episodes (noise={cfg.sft.noise})")
    device = resolve_device(cfg.model.device)
    model.to(device)
    losses = sft_train(
        model,
        rows,
        epochs=cfg.sft.epochs,
        batch_size=cfg.sft.batch_size,
        lr=cfg.sft.lr,
        seed=cfg.train.seed,
        device=device,
        pad_id=tok.pad_token_id or 0,
        micro_batch_tokens=cfg.algo.micro_batch_tokens,
    )
    save_model_and_tokenizer(model, tok, sft_dir)
    log(f"warm start done in {time.perf_counter() - t0:.0f}s (final SFT loss {losses[-1]:.3f})")
    return sft_dir


def evaluate_rollouts(trainer) -> dict[str, float]:
    """Held-out rollouts of ``trainer``'s policy -> success, revisit rate, steps, invalid rate."""
    cfg = trainer.cfg
    saved = trainer.engine.rng_state()
    trainer.engine.set_seed(cfg.train.seed + 1_000_003)
    params = SamplingParams(
        temperature=cfg.train.eval_temperature,
        top_p=cfg.rollout.top_p,
        max_new_tokens=cfg.rollout.max_new_tokens,
    )
    try:
        groups = collect_groups(
            trainer.engine,
            trainer.renderer,
            trainer.make_env,
            trainer.test_tasks,
            cfg.train.eval_samples,
            params,
            trainer.limits,
            tag="eval",
            agent=trainer.agent,
            spec=trainer.agent_spec(params),
        )
    finally:
        trainer.engine.set_rng_state(saved)
    return rollout_summary([r for g in groups for r in g.rollouts])


def rollout_summary(rollouts) -> dict[str, float]:
    """success rate; revisit rate pooled over steps; mean steps; invalid-step rate."""
    steps = sum(r.num_turns for r in rollouts)
    revisits = sum(revisit_rate(rollout_states(r)) * r.num_turns for r in rollouts)
    return {
        "success": sum(r.success for r in rollouts) / max(len(rollouts), 1),
        "revisit": revisits / max(steps, 1),
        "steps": steps / max(len(rollouts), 1),
        "invalid": sum(t.invalid for r in rollouts for t in r.turns) / max(steps, 1),
    }


def train_method(method: str, seed: int, args, sft_dir: Path, out: Path, eval_before: bool) -> dict[str, Any]:
    """Train ``method`` from ``sft_dir`` with ``seed``; held-out summaries before (optional) and after."""
    from horizonrl.train.trainers.group import GroupTrainer

    overrides = [
        f"train.init={sft_dir}",
        f"train.out_dir={out / f'{method}-s{seed}'}",
        f"train.seed={seed}",
        f"train.steps={args.steps}",
        "train.progress=false",
        "train.save_rollouts=false",
        f"train.eval_samples={args.eval_samples}",
        f"env.test_tasks={args.test_tasks}",
        f"rollout.tasks_per_step={args.tasks_per_step}",
        f"rollout.group_size={args.group_size}",
        *args.override,
    ]
    cfg = load(method, overrides)
    trainer = GroupTrainer(cfg)
    before = evaluate_rollouts(trainer) if eval_before else None
    t0 = time.perf_counter()
    history = []
    for _ in range(cfg.train.steps):
        m = trainer.train_step()
        trainer.logger.log(trainer.step, m)
        history.append(m)
        extra = f" hidden {m['time/feature_hidden_s']:.2f}s" if "time/feature_hidden_s" in m else ""
        log(
            f"  {method} seed {seed} step {trainer.step}/{cfg.train.steps}: success "
            f"{m['success/rate']:.2f} revisit {m.get('rollout/revisit_rate', float('nan')):.2f} "
            f"{m['time/step_s']:.1f}s{extra}"
        )
    train_s = time.perf_counter() - t0
    after = evaluate_rollouts(trainer)
    trainer.logger.close()
    tail = history[len(history) // 2 :] or history
    return {
        "before": before,
        "after": after,
        "train_success": statistics.fmean(m["success/rate"] for m in tail) if tail else float("nan"),
        "s_per_step": train_s / max(len(history), 1),
    }


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _mean(xs: list[float]) -> str:
    if len(xs) == 1:
        return f"{xs[0]:.3f}"
    return f"{statistics.fmean(xs):.3f}±{statistics.stdev(xs):.3f}"


def table(results: dict[str, list[dict[str, Any]]], before: list[dict[str, float]]) -> str:
    cols = ("success", "revisit", "steps", "invalid", "train succ", "s/step")
    head = f"{'method':<14}" + "".join(f"{c:>16}" for c in cols)
    lines = [head, "-" * len(head)]
    if before:
        vals = [_mean([b[k] for b in before]) for k in ("success", "revisit", "steps", "invalid")]
        lines.append(f"{'warm start':<14}" + "".join(f"{v:>16}" for v in vals) + f"{'-':>16}{'-':>16}")
    for method, runs in results.items():
        vals = [_mean([r["after"][k] for r in runs]) for k in ("success", "revisit", "steps", "invalid")]
        vals += [_mean([r["train_success"] for r in runs]), _mean([r["s_per_step"] for r in runs])]
        lines.append(f"{method:<14}" + "".join(f"{v:>16}" for v in vals))
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/bench_ccpo")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--steps", type=int, default=4, help="training steps per method and seed")
    p.add_argument("--tasks-per-step", type=int, default=4)
    p.add_argument("--group-size", type=int, default=6)
    p.add_argument("--test-tasks", type=int, default=16)
    p.add_argument("--eval-samples", type=int, default=2)
    p.add_argument("--demos", type=int, default=300, help="noisy-expert episodes for the SFT warm start")
    p.add_argument(
        "--pretrain-steps",
        type=int,
        default=None,
        help="copy-pretraining steps of the base model (config: 1500)",
    )
    p.add_argument("--base", default=None, help="reuse this base model directory")
    p.add_argument("--sft", default=None, help="reuse this warm-start (SFT) model directory")
    p.add_argument("--no-eval-before", dest="eval_before", action="store_false")
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads (1 is fastest on a shared 2-core box)"
    )
    p.add_argument(
        "--jobs", type=int, default=2, help="methods trained in parallel processes (1 thread each)"
    )
    p.add_argument("--override", nargs="*", default=[], help="extra config overrides (section.field=value)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pretrain = [] if args.pretrain_steps is None else [f"model.tiny_pretrain_steps={args.pretrain_steps}"]
    base_cfg = load(args.methods[0], [*pretrain, *args.override])
    base_cfg = dataclasses.replace(base_cfg, train=dataclasses.replace(base_cfg.train, seed=args.seeds[0]))
    sft_dir = Path(args.sft) if args.sft else warm_start(base_cfg, out, base=args.base, demos=args.demos)
    # Every method starts from the same weights and engine seed: one warm-start evaluation per seed.
    runs = [(m, seed, args, sft_dir, out, args.eval_before and k == 0)
            for seed in args.seeds for k, m in enumerate(args.methods)]  # fmt: skip
    if args.jobs > 1:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.jobs, mp_context=ctx, initializer=_init_worker,
                                 initargs=(args.threads, _T0)) as pool:  # fmt: skip
            outcomes = list(pool.map(train_method, *zip(*runs, strict=True)))
    else:
        outcomes = [train_method(*run) for run in runs]
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in args.methods}
    before: list[dict[str, float]] = []
    for (method, seed, *_), res in zip(runs, outcomes, strict=True):
        if res["before"] is not None:
            before.append(res["before"])
            log(f"warm start (seed {seed}): {res['before']}")
        log(f"{method} seed {seed}: {res['after']}")
        results[method].append(res)
    c = base_cfg
    print(
        f"\nrooms {dict(c.env.knobs)}; {args.steps} steps x {args.tasks_per_step} tasks"
        f" x G={args.group_size}; "
        f"held-out {args.test_tasks} tasks x {args.eval_samples} samples at T={c.train.eval_temperature}; "
        f"seeds {args.seeds}\n"
    )
    print(table(results, before))
    print(
        f"\ntotal {time.perf_counter() - _T0:.0f}s wall, {time.process_time() + _children_cpu():.0f}s CPU;"
        " credit cost at paper scale: benchmarks/ccpo_credit.py"
    )


if __name__ == "__main__":
    main()
