"""What bounds a SmolLM2 decode step on this CPU: memory bandwidth, a profile, and a compiled decode step.

Three parts, each printing what docs/models.md ("What bounds a decode step now") cites:

- ``bandwidth``: GB/s of a streaming read (the sum of 256 MiB of bf16) on 1 and 2 threads, next to the
  bytes of the engine's bf16 copy of SmolLM2-135M-Instruct (what every decode step reads);
- ``profile``: ``cProfile`` of 64 decode steps of 1 row after a 600-token shared prefix (one thread): the
  time in the linear layers per step and the read rate it implies; then one real rollout step of the
  packaged ``smollm2_math_python.yaml`` (2 tasks x 8, ``--threads``): its total time and the share of
  ``torch.cat`` (the per-step growth of each row's KV cache, which a preallocated cache would remove);
- ``compile``: a decode step of 6 rows eager and through ``torch.compile(model.forward, dynamic=True)``
  (inductor's C++ backend), and the seconds compiling and warming up took; both without the packed
  weights, which inductor cannot lower (it packs weights itself);
- ``lean``: a decode step of 1, 4 and 16 rows after a 600-token shared prefix through transformers'
  forward and through the lean step (``inference.params.lean_decode``), medians of 3 alternating runs;
  ``--docs FILE`` writes them into FILE's ``<!-- smollm2-lean -->`` block (docs/models.md).

Example (``--parts bandwidth,profile`` about 2 minutes; ``compile`` about 9; ``lean`` about 2; nothing else
should run)::

    PYTHONPATH=src python benchmarks/smollm2_decode.py --parts bandwidth,profile,compile
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import tempfile
import time
from pathlib import Path

import torch

from horizonrl.benchtools import Printed, write_block
from packed_linear import decode_step_ms, shared_prefix_prompts, smollm2_engine


def bandwidth() -> None:
    x = torch.ones(2**27, dtype=torch.bfloat16)  # 256 MiB
    for threads in (1, 2):
        torch.set_num_threads(threads)
        x.sum()
        t0 = time.perf_counter()
        for _ in range(5):
            x.sum()
        gbs = x.numel() * 2 * 5 / (time.perf_counter() - t0) / 1e9
        print(f"bandwidth: streaming read {gbs:5.1f} GB/s on {threads} thread(s)", flush=True)


def _weights_mb(model: torch.nn.Module) -> float:
    return sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6


def profile(threads: int) -> None:
    from horizonrl.inference import SamplingParams

    torch.set_num_threads(1)
    engine = smollm2_engine()
    mb = _weights_mb(engine.model)
    prompts = shared_prefix_prompts(1)
    engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=3, ignore_eos=True))
    steps = 64
    prof = cProfile.Profile()
    prof.enable()
    engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=steps, ignore_eos=True))
    prof.disable()
    stats = pstats.Stats(prof).stats
    total = sum(v[2] for v in stats.values())  # tottime of every function: the call's wall time
    linear = sum(
        v[2]
        for k, v in stats.items()
        if "_linear_pointwise" in k[2] or k[2] == "<built-in method torch._C._nn.linear>"
    )
    print(
        f"profile: 1 row, 1 thread, {steps} decode steps: {total / steps * 1e3:.1f} ms a step (cProfile), "
        f"linear layers {linear / steps * 1e3:.1f} ms a step reading {mb:.0f} MB of weights: "
        f"{mb / 1e3 / (linear / steps):.1f} GB/s",
        flush=True,
    )
    import smollm2_rollout

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as out:
        trainer = smollm2_rollout._trainer({"tasks": 2}, out)
        tasks = trainer.task_rng.sample(trainer.train_tasks, 2)
        prof = cProfile.Profile()
        prof.enable()
        trainer.collect(tasks)
        prof.disable()
    stats = pstats.Stats(prof).stats
    total = sum(v[2] for v in stats.values())
    cat = sum(v[2] for k, v in stats.items() if k[2] == "<built-in method torch.cat>")
    print(
        f"profile: one real rollout step (2 tasks x 8), {threads} threads: {total:.1f} s under cProfile, "
        f"torch.cat {cat:.1f} s ({cat / total:.1%})",
        flush=True,
    )


def compiled(threads: int) -> None:

    torch.set_num_threads(threads)
    engine = smollm2_engine()
    # Inductor cannot lower the packed forwards (their oneDNN weight is not a graph constant): both sides
    # run F.linear, and inductor does its own weight packing.
    for module in engine.model.modules():
        module.__dict__.pop("forward", None)
    prompts = shared_prefix_prompts(6)
    steps = 48

    def step_ms() -> float:
        return decode_step_ms(engine, prompts, steps)

    step_ms()
    eager = step_ms()
    t0 = time.perf_counter()
    engine.model.forward = torch.compile(engine.model.forward, dynamic=True)
    with torch.no_grad():
        step_ms()  # compiles, and recompiles while the shapes settle
        warm = time.perf_counter() - t0
        fast = step_ms()
    print(
        f"compile: 6 rows, {threads} threads: eager {eager:.1f} ms a step, compiled {fast:.1f} ms "
        f"(x{eager / fast:.2f}); compiling and warming up took {warm:.0f} s",
        flush=True,
    )


def lean(threads: int) -> list[str]:
    emit = Printed()
    torch.set_num_threads(threads)
    engines = {name: smollm2_engine(lean_decode=on) for name, on in (("transformers", False), ("lean", True))}
    for rows in (1, 4, 16):
        prompts = shared_prefix_prompts(rows)
        ms: dict[str, list[float]] = {name: [] for name in engines}
        for engine in engines.values():
            decode_step_ms(engine, prompts, 5)  # warm: the prefix, the packed weights
        for _ in range(3):
            for name, engine in engines.items():
                ms[name].append(decode_step_ms(engine, prompts, 33))
        a, b = (statistics.median(v) for v in ms.values())
        emit(
            f"lean: {rows:2d} rows, {threads} threads: transformers {a:5.1f} ms a step, lean {b:5.1f} ms "
            f"(x{a / b:.2f})"
        )
    return emit.lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--parts", default="bandwidth,profile", help="comma-separated: bandwidth, profile, compile, lean"
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--docs", type=Path, default=None, help="write the lean part's lines into this file's block"
    )
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    print(f"torch {torch.__version__}", flush=True)
    if "bandwidth" in parts:
        bandwidth()
    if "profile" in parts:
        profile(args.threads)
    if "compile" in parts:
        compiled(args.threads)
    if "lean" in parts:
        lines = lean(args.threads)
        if args.docs is not None:
            command = (
                f"PYTHONPATH=src python benchmarks/smollm2_decode.py --parts lean --threads {args.threads}"
            )
            write_block(args.docs, "smollm2-lean", lines, f"{command} --docs {args.docs}")


if __name__ == "__main__":
    main()
