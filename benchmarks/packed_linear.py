"""Packed bf16 linear weights (``inference.precision.pack_linears``) against ``F.linear``, side by side.

Two parts, both in one process with ``--threads`` torch threads:

- ``shapes``: one ``nn.Linear`` of each of SmolLM2-135M's shapes (q/o ``[576, 576]``, k/v ``[192, 576]``,
  gate/up ``[1536, 576]``, down ``[576, 1536]``, the LM head ``[49152, 576]``) in bfloat16, for 1, 6, 16
  and 512 rows: microseconds per call through ``F.linear`` (oneDNN reorders the weight on every call) and
  through the weight packed once, and their ratio;
- ``decode``: the HF engine's bf16 sampling copy of SmolLM2-135M-Instruct (real weights, shared prefix)
  decoding for 1, 6 and 16 rows after a 600-token shared prefix, with the packed forwards switched off and
  on in turn (three alternating repetitions each; medians), milliseconds per decode step.

Example (about 3 minutes on 2 cores; nothing else should run meanwhile)::

    PYTHONPATH=src python benchmarks/packed_linear.py --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

SHAPES = {
    "q/o": (576, 576),
    "k/v": (192, 576),
    "gate/up": (1536, 576),
    "down": (576, 1536),
    "head": (49152, 576),
}


def _us(fn, calls: int) -> float:
    for _ in range(3):
        fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def shapes() -> None:
    from horizonrl.inference.precision import pack_linears

    print("shapes: microseconds per call, bf16, F.linear vs packed")
    for name, (out_f, in_f) in SHAPES.items():
        layer = torch.nn.Linear(in_f, out_f, bias=False).to(torch.bfloat16).requires_grad_(False)
        plain = torch.nn.Linear(in_f, out_f, bias=False).to(torch.bfloat16).requires_grad_(False)
        plain.weight.copy_(layer.weight)
        if not pack_linears(layer):
            raise SystemExit("this torch has no oneDNN linear packing: nothing to compare")
        cells = []
        for rows in (1, 6, 16, 512):
            x = torch.randn(rows, in_f, dtype=torch.bfloat16)
            calls = max(3, int(2e8 / (rows * in_f * out_f)))
            a, b = _us(lambda x=x, m=plain: m(x), calls), _us(lambda x=x, m=layer: m(x), calls)
            cells.append(f"{rows:>3d} rows {a:8.1f} {b:8.1f} x{a / b:.2f}")
        print(f"  {name:8s} " + "   ".join(cells), flush=True)


def smollm2_engine(**params):
    """The HF engine over SmolLM2-135M-Instruct (real weights) as the packaged config samples: a bf16 copy
    with the shared prefix, batches of up to 16 rows; ``params`` add to its engine parameters."""
    from horizonrl.inference import make_engine
    from horizonrl.models.loading import load_smollm2

    model, tok = load_smollm2(Path.home() / ".cache" / "horizonrl" / "smollm2-135m-instruct")
    return make_engine(
        "hf",
        model,
        tok,
        device="cpu",
        max_batch_size=16,
        seed=0,
        params={"dtype": "bfloat16", "shared_prefix": True, **params},
    )


def shared_prefix_prompts(rows: int, prefix_len: int = 600, seed: int = 0) -> list[list[int]]:
    """``rows`` prompts of random ids: the same ``prefix_len`` ids, then 20, 22, ... ids of each row's own."""
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(100, 40000, (prefix_len,), generator=g).tolist()
    return [prefix + torch.randint(100, 40000, (20 + 2 * i,), generator=g).tolist() for i in range(rows)]


def decode_step_ms(engine, prompts: list[list[int]], steps: int) -> float:
    """Milliseconds of one decode step of ``prompts``: a generation of ``steps`` tokens minus one of 1 (its
    prefill), over ``steps - 1``."""
    from horizonrl.inference import SamplingParams

    one = SamplingParams(temperature=1.0, max_new_tokens=1, ignore_eos=True)
    many = SamplingParams(temperature=1.0, max_new_tokens=steps, ignore_eos=True)
    t0 = time.perf_counter()
    engine.generate(prompts, one)
    t1 = time.perf_counter()
    engine.generate(prompts, many)
    return ((time.perf_counter() - t1) - (t1 - t0)) / (steps - 1) * 1e3


def decode() -> None:
    from horizonrl.inference.precision import _PackedLinear

    engine = smollm2_engine()
    packed = {
        m: m.forward for m in engine.model.modules() if isinstance(m.__dict__.get("forward"), _PackedLinear)
    }

    def use_packed(on: bool) -> None:
        for module, fwd in packed.items():
            if on:
                module.forward = fwd
            else:
                module.__dict__.pop("forward", None)

    steps = 33
    print(
        f"decode: SmolLM2 bf16 copy, shared 600-token prefix, ms per decode step ({steps - 1} steps), "
        "medians of 3"
    )
    for rows in (1, 6, 16):
        prompts = shared_prefix_prompts(rows)

        def step_ms(prompts=prompts) -> float:
            return decode_step_ms(engine, prompts, steps)

        res: dict[bool, list[float]] = {False: [], True: []}
        for on in (False, True):  # warm-up: the first packed call packs
            use_packed(on)
            step_ms()
        for _ in range(3):
            for on in (False, True):
                use_packed(on)
                res[on].append(step_ms())
        a, b = statistics.median(res[False]), statistics.median(res[True])
        print(f"  {rows:2d} rows  F.linear {a:6.1f} ms  packed {b:6.1f} ms  x{a / b:.2f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="shapes,decode", help="comma-separated: shapes, decode")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{args.threads} threads, torch {torch.__version__}")
    parts = set(args.parts.split(","))
    if "shapes" in parts:
        shapes()
    if "decode" in parts:
        decode()


if __name__ == "__main__":
    main()
