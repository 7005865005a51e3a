"""ECHO vs SUPO vs GRPO (truncation) from one warm start (ECHO paper §5, Figure 1; docs/spec/echo.md).

The three packaged configs (``echo_lookup``, ``supo_lookup``, ``grpo_truncate_lookup``) share the
environment (4-hop lookup, 6 distractor facts per search), the 672-token context budget, the model and
the seeds; they differ in the context manager (turn memory / rolling summary / truncated append) and
the estimator (``echo`` / ``supo`` / ``grpo``). The benchmark

1. builds the embedded tiny model (tokenizer, random init, copy pretraining);
2. warm-starts it once by SFT on expert rollouts of all three protocols
   (:func:`horizonrl.train.recipes.expert_program_rows` per config, ``--sft-demos`` tasks each), so the
   one checkpoint knows the ``<sum_last_turn>``/``<selection>`` and ``<summary>`` protocols;
3. trains each method from that checkpoint with :class:`~horizonrl.train.trainers.group.GroupTrainer`
   (same ``train.seed``: same task order and sampling seed), evaluating before and after;
4. prints held-out pass@1 (after SFT and after RL), tool turns, trajectory volume (prompt + response
   tokens over all turns), split rate (rollouts with a reconstruction/summary), working segments,
   overlong rate and the rate of rollouts ended by the context budget, side by side.

The default (small) settings: hidden 96 x 3 layers, 1500 copy-pretraining steps, 150 expert rollouts
per protocol x 3 SFT epochs, then 4 RL steps x 4 tasks x G = 4 per method, evaluation on 16 held-out
tasks x 2 samples. They ran in 6.0 min on 2 CPU cores (9 min while other jobs shared the cores)::

    python benchmarks/echo.py --out runs/bench_echo
    python benchmarks/echo.py --steps 20 --tasks-per-step 8 --group-size 8 --sft-demos 500   # larger

Torch runs on ``--threads`` threads (default 1: tiny matmuls on a shared machine are much faster
without OpenMP spinning). At the default settings the warm start does not yet solve 4-hop lookups
(it garbles entity names), so every reward is 0, RL does not move the weights, and the table compares
how one SFT checkpoint behaves under the three protocols (volume, splits, overlong / context endings);
accuracy needs a larger budget. The paper's claim (ECHO more accurate than SUPO with fewer turns and
less volume) is about 32k-token contexts; here the protocol text is a large share of a 672-token budget.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

import horizonrl.agents.memory
import horizonrl.agents.summary  # noqa: F401  (register the memory and summary context managers)
from horizonrl.config import load_config
from horizonrl.models import ChatRenderer, load_model_and_tokenizer, save_model_and_tokenizer
from horizonrl.train.recipes import expert_program_rows, packaged_config
from horizonrl.train.trainers.group import GroupTrainer
from horizonrl.train.warmstart.bootstrap import tiny_base
from horizonrl.train.warmstart.sft import sft_train

METHODS = (("ECHO", "echo_lookup"), ("SUPO", "supo_lookup"), ("GRPO (truncation)", "grpo_truncate_lookup"))
COLUMNS = (
    ("pass@1 SFT", "before", "eval/pass@1"),
    ("pass@1 RL", "after", "eval/pass@1"),
    ("tool turns", "after", "eval/rollout/tool_calls_mean"),
    ("volume", "after", "eval/rollout/trajectory_tokens_mean"),
    ("split rate", "after", "eval/rollout/split"),
    ("segments", "after", "eval/rollout/sessions_normal_mean"),
    ("overlong", "after", "eval/rollout/overlong"),
    ("ctx ended", "after", "eval/rollout/context_overflow_rate"),
)


def configs(args) -> list:
    """The three packaged configs with the benchmark's shared overrides."""
    out = Path(args.out)
    common = [
        f"model.tiny_hidden={args.hidden}",
        f"model.tiny_layers={args.layers}",
        f"model.tiny_pretrain_steps={args.pretrain_steps}",
        "model.device=cpu",
        f"env.test_tasks={args.test_tasks}",
        f"rollout.tasks_per_step={args.tasks_per_step}",
        f"rollout.group_size={args.group_size}",
        f"train.steps={args.steps}",
        f"train.seed={args.seed}",
        f"train.eval_samples={args.eval_samples}",
        f"train.init={out / 'sft'}",
        "train.save_every=0",
        "train.keep_checkpoints=1",
        "train.progress=false",
        f"sft.demos={args.sft_demos}",
        f"sft.noise={args.noise}",
    ]
    return [
        load_config(packaged_config(name), [*common, f"train.out_dir={out / name}"]) for _, name in METHODS
    ]


def warm_start(cfgs, args) -> float:
    """Build the tiny model and SFT it on expert rollouts of every protocol; returns seconds."""
    t0 = time.perf_counter()
    out = Path(args.out)
    base = out / "base_model"
    if not (base / "config.json").exists():
        tiny_base(cfgs[0].model, base)
    model, tok = load_model_and_tokenizer(base)
    renderer = ChatRenderer(tok)
    rows = []
    for (label, _), cfg in zip(METHODS, cfgs, strict=True):
        part = expert_program_rows(cfg, renderer, tok)
        print(f"  {label}: {len(part)} SFT rows from {cfg.sft.demos} expert rollouts", flush=True)
        rows += part
    sft = cfgs[0].sft
    losses = sft_train(
        model,
        rows,
        epochs=args.sft_epochs,
        batch_size=sft.batch_size,
        lr=sft.lr,
        seed=args.seed,
        device=torch.device("cpu"),
        pad_id=tok.pad_token_id or 0,
    )
    print(f"  SFT: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}", flush=True)
    save_model_and_tokenizer(model, tok, out / "sft")
    return time.perf_counter() - t0


def train(cfg, label: str) -> tuple[dict, dict, float]:
    t0 = time.perf_counter()

    def log(step, m):
        extra = f" splits {m.get('rollout/splits', 0.0):.2f}" if "rollout/splits" in m else ""
        print(
            f"  {label} step {step}: reward {m['reward/mean']:.2f}, tool calls "
            f"{m['rollout/tool_calls_mean']:.2f}{extra}, {m['time/step_s']:.0f}s",
            flush=True,
        )

    records = GroupTrainer(cfg).fit(progress_cb=log)
    return records[0], records[-1], time.perf_counter() - t0


def table(results) -> str:
    head = f"{'method':<19}" + "".join(f"{name:>12}" for name, _, _ in COLUMNS) + f"{'minutes':>9}"
    lines = [head, "-" * len(head)]
    for label, before, after, seconds in results:
        rec = {"before": before, "after": after}
        cells = "".join(
            f"{rec[when][key]:>12.3f}" if key in rec[when] else f"{'-':>12}" for _, when, key in COLUMNS
        )
        lines.append(f"{label:<19}{cells}{seconds / 60:>9.1f}")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/bench_echo")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=96, help="tiny model width")
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--pretrain-steps", type=int, default=1500, help="copy-pretraining steps")
    p.add_argument("--sft-demos", type=int, default=150, help="expert rollouts per protocol")
    p.add_argument("--sft-epochs", type=int, default=3)
    p.add_argument("--noise", type=float, default=0.1, help="expert noise of the SFT rollouts")
    p.add_argument("--steps", type=int, default=4, help="RL steps per method")
    p.add_argument("--tasks-per-step", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--test-tasks", type=int, default=16)
    p.add_argument("--eval-samples", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    cfgs = configs(args)
    print(f"[1/2] tiny model + SFT on expert rollouts of the 3 protocols ({args.sft_demos} tasks each)")
    seconds = warm_start(cfgs, args)
    print(f"      done in {seconds / 60:.1f} min")
    results = []
    for i, ((label, _), cfg) in enumerate(zip(METHODS, cfgs, strict=True), 1):
        print(
            f"[2/2] ({i}/3) {label}: {args.steps} steps x {args.tasks_per_step} tasks x G={args.group_size}"
        )
        before, after, secs = train(cfg, label)
        results.append((label, before, after, secs))
    k = cfgs[0].env.test_tasks
    print(
        f"\nheld-out lookup tasks ({k} x {args.eval_samples} samples; columns after RL unless marked SFT)\n"
    )
    print(table(results))
    print(f"\ntotal {(time.perf_counter() - t0) / 60:.1f} min; runs under {args.out}")


if __name__ == "__main__":
    main()
