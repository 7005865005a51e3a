"""One GPU, one command: train a local 0.5B-1.5B instruct model with vLLM on a packaged environment.

    python scripts/gpu_recipe.py --model /models/Qwen2.5-0.5B-Instruct            # GRPO then RTPO
    python scripts/gpu_recipe.py --model DIR --env search --methods grpo --budget 4e6
    python scripts/gpu_recipe.py --cpu                       # the same code on CPU: a tiny model, hf engine

Nothing is downloaded: ``--model`` is a local Hugging Face model directory (``config.json``, the
weights, the tokenizer and its chat template). The GPU machine has no hub access, so place the weights
first (``python scripts/gpu_recipe.py`` without ``--model`` prints how). The family (tool syntax,
stop tokens, thinking) is detected from the chat template.

Each method (``--methods``: ``grpo``, and ``rtpo``, one of the four papers' methods) trains from the
same model on the packaged ``smollm2_<env>.yaml`` settings (environment, few-shot examples, sampling)
with the GPU's settings on top: the ``vllm`` engine in bfloat16 with CUDA graphs, float32 master
weights with a bf16 autocast update (chunked log-probs, packed rows), ``algo.old_logprobs: recompute``
with token-level TIS for the engine/trainer mismatch, and a fixed generation budget
(``train.max_gen_tokens = --budget``). Held-out pass@1 is measured at the start and every
``--eval-every`` steps. It prints, per step, the reward, rollout tokens/s (sampled tokens / rollout
seconds), update tokens/s (trained tokens / update seconds, weight sync included), sync seconds and GPU
memory (every process on the device, and the trainer's own peak), then each method's learning curve,
and writes everything as JSON (``--out``). ``--cpu`` is the dry run CI takes
(tests/scripts/test_gpu_recipe.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from horizonrl.benchtools import memory_in_use

ENVS = ("math_python", "search", "household")
#: The methods a recipe can train: overrides on top of the environment's packaged config.
METHODS = {
    "grpo": [],
    "rtpo": ["train.trainer=rtpo", "train.trainer_params={trunks_per_task: 2, siblings: 3}"],
}
GPU = [
    "model.device=cuda",
    "model.dtype=float32",
    "inference.engine=vllm",
    "inference.params={dtype: bfloat16}",
    "algo.old_logprobs=recompute",
    "algo.tis_cap=2.0",
    "train.precision=bf16",
    "train.logprob_chunk_tokens=4096",
    "algo.pack_rows=true",
    "rollout.max_batch_size=256",
    "optim.lr=1e-6",
]
CPU = [
    "model.device=cpu",
    "inference.engine=hf",
    "rollout.group_size=2",
    "rollout.tasks_per_step=2",
    "rollout.max_new_tokens=16",
    "rollout.max_turns=2",
    "rollout.few_shot=1",
    "env.test_tasks=2",
    "train.eval_samples=1",
    "optim.lr=1e-4",
]
PLACE_WEIGHTS = """\
gpu_recipe: --model must be a local model directory (no hub access here). On a machine with access:

    pip install -U huggingface_hub
    huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct --local-dir Qwen2.5-0.5B-Instruct
    # or Qwen/Qwen2.5-1.5B-Instruct, meta-llama/Llama-3.2-1B-Instruct, HuggingFaceTB/SmolLM2-1.7B-Instruct

then copy the directory to this machine (rsync -a Qwen2.5-0.5B-Instruct gpu:/models/) and run
    scripts/gpu_smoke.sh recipe --model /models/Qwen2.5-0.5B-Instruct"""


def check_model_dir(path: str | None) -> str | None:
    """Why ``path`` is not a usable local model directory, or None when it is."""
    if not path:
        return "no --model given"
    p = Path(path)
    if not p.is_dir():
        return f"--model {path}: no such directory"
    missing = [f for f in ("config.json",) if not (p / f).is_file()]
    if not any(p.glob("*.safetensors")) and not any(p.glob("pytorch_model*.bin")):
        missing.append("*.safetensors weights")
    if not (p / "tokenizer.json").is_file() and not (p / "tokenizer_config.json").is_file():
        missing.append("tokenizer.json")
    return f"--model {path}: missing {', '.join(missing)}" if missing else None


def train(method: str, model: str, args, out_dir: Path) -> dict:
    """One method's run: per-step rows, evaluations and peak memory."""
    from horizonrl.config import load_config
    from horizonrl.train.trainers.registry import make_trainer

    base = Path(__file__).resolve().parents[1] / "src" / "horizonrl" / "configs" / f"smollm2_{args.env}.yaml"
    cfg = load_config(
        str(base),
        [
            f"model.path={model}",
            *(CPU if args.cpu else GPU),
            *METHODS[method],
            f"train.max_gen_tokens={int(args.budget)}",
            f"train.steps={args.steps}",
            f"train.eval_every={args.eval_every}",
            "train.eval_at_start=true",
            "train.save_every=0",
            "train.progress=false",
            f"train.out_dir={out_dir / method}",
            *args.overrides,
        ],
    )
    t0 = time.perf_counter()
    trainer = make_trainer(cfg)
    rows: list[dict] = []
    evals: list[dict] = []  # the learning curve
    peak: dict[str, float] = {}

    def on_step(step: int, m: dict) -> None:
        for k, v in memory_in_use(args.cpu).items():
            peak[k] = max(peak.get(k, 0.0), v)
        if step == 0 or "time/update_s" not in m:
            return
        row = {
            "step": step,
            "reward": m.get("reward/mean", 0.0),
            "rollout_tok_s": m.get("throughput/tokens_per_s", 0.0),
            "update_tok_s": m.get("train/trainable_tokens", 0.0) / max(m["time/update_s"], 1e-9),
            "sync_s": float(getattr(trainer.engine, "last_sync_s", 0.0) or 0.0),
            "ratio": m.get("train/ratio_geomean", float("nan")),
            **memory_in_use(args.cpu),
        }
        rows.append(row)
        print(f"  {method} step {step}: " + ", ".join(f"{k} {v:.4g}" for k, v in row.items() if k != "step"))

    try:
        records = trainer.fit(progress_cb=on_step)
    finally:
        trainer.close()
    for m in records:  # the evaluation before the first step is logged without a step callback
        if "eval/pass@1" in m:
            evals.append(
                {"step": m["step"], "gen_tokens": m.get("budget/gen_tokens", 0.0), "pass@1": m["eval/pass@1"]}
            )
    return {
        "method": method,
        "total_s": time.perf_counter() - t0,
        "steps": rows,
        "evals": evals,
        "peak": peak,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="local Hugging Face model directory (0.5B-1.5B instruct)")
    ap.add_argument(
        "--env", default="math_python", choices=ENVS, help="packaged environment (smollm2_<env>.yaml)"
    )
    ap.add_argument("--methods", default="grpo,rtpo", help=f"comma-separated, of {sorted(METHODS)}")
    ap.add_argument(
        "--budget", type=float, default=None, help="generated tokens per method (GPU 2e6, CPU 2e3)"
    )
    ap.add_argument("--steps", type=int, default=None, help="step cap (GPU 200, CPU 2)")
    ap.add_argument("--eval-every", type=int, default=None, help="steps between evaluations (GPU 10, CPU 2)")
    ap.add_argument("--cpu", action="store_true", help="dry run on CPU: a tiny model, the hf engine")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--work", default=None, help="run directories (default: a temporary directory)")
    ap.add_argument("overrides", nargs="*", help="more section.field=value overrides")
    args = ap.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        print(f"gpu_recipe: --methods {args.methods!r}: choose from {sorted(METHODS)}", file=sys.stderr)
        return 2
    args.budget = args.budget or (2e3 if args.cpu else 2e6)
    args.steps = args.steps or (2 if args.cpu else 200)
    args.eval_every = args.eval_every or (2 if args.cpu else 10)
    work = Path(args.work or tempfile.mkdtemp(prefix="horizonrl-gpu-recipe-"))
    work.mkdir(parents=True, exist_ok=True)
    model = args.model
    if args.cpu and model is None:
        from horizonrl.config import ModelConfig
        from horizonrl.train.warmstart.bootstrap import build_tiny

        model = str(work / "tiny")
        if not (work / "tiny" / "config.json").exists():
            build_tiny(
                ModelConfig(tiny_hidden=64, tiny_layers=2, tiny_vocab=400, tiny_pretrain_steps=20), model
            )
    problem = check_model_dir(model)
    if problem:
        print(f"{problem}\n{PLACE_WEIGHTS}", file=sys.stderr)
        return 2
    if not args.cpu:
        import torch

        if not torch.cuda.is_available():
            print("gpu_recipe: no CUDA device (use --cpu for the CPU dry run)", file=sys.stderr)
            return 2
        print(f"GPU: {torch.cuda.get_device_name(0)}", flush=True)
    print(
        f"gpu_recipe: {model} on {args.env}, methods {methods}, budget {args.budget:.3g} tokens", flush=True
    )
    results = [train(m, model, args, work) for m in methods]
    for r in results:
        steady = r["steps"][1:] or r["steps"]  # the first step includes warm-up (CUDA graphs, caches)
        mean = {k: sum(s[k] for s in steady) / max(len(steady), 1) for k in ("rollout_tok_s", "update_tok_s")}
        r.update(mean)
        print(
            f"{r['method']}: {len(r['steps'])} steps in {r['total_s']:.0f} s, "
            f"rollout {mean['rollout_tok_s']:.0f} tok/s, update {mean['update_tok_s']:.0f} tok/s, peak "
            + ", ".join(f"{k} {v:.2f}" for k, v in r["peak"].items())
        )
        print(
            "  learning curve (held-out pass@1): "
            + "  ".join(
                f"step {e['step']} ({e['gen_tokens']:.3g} tok): {e['pass@1']:.3f}" for e in r["evals"]
            )
        )
    if args.out:
        Path(args.out).write_text(
            json.dumps({"cpu": args.cpu, "model": model, "env": args.env, "runs": results}, indent=1)
        )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
