"""Weight sync to vLLM: one safetensors file per step (``file``) against a gloo broadcast (``collective``).

For each model, one vLLM engine (the CPU build here) takes ``--rounds`` syncs of freshly perturbed
weights (a training-like update of the model in place), the two routes in turns (file, collective,
file, ...), so a change in machine load hits both alike; the median seconds per sync of each route
and their ratio are printed, and after the last round of each route the engine's parameter sum and
its greedy log-probs on four prompts are compared with the other route's for the same weights (they
must be equal). Models are random, built from configs: the embedded tiny model's shape,
SmolLM2-135M's (Llama, hidden 576, 30 layers, vocabulary 49,152) and Qwen2.5-0.5B's (hidden 896,
24 layers, vocabulary 151,936), in float32::

    .venv-vllm/bin/python benchmarks/weight_sync.py --models tiny smollm2 qwen --rounds 5

Both routes reach the same loader (``model_runner.reload_weights``), so the difference is the transfer:
serialising and reading a file in ``/dev/shm`` against a loopback broadcast of each tensor.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def build(name: str):
    import transformers

    torch.manual_seed(0)
    if name == "tiny":
        cfg = transformers.LlamaConfig(
            hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=4, vocab_size=400, tie_word_embeddings=True, max_position_embeddings=1024,
        )  # fmt: skip
    elif name == "smollm2":
        cfg = transformers.LlamaConfig(
            hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
            num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=2048,
        )  # fmt: skip
    elif name == "qwen":
        cfg = transformers.Qwen2Config(
            hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
            num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=2048,
        )  # fmt: skip
    else:
        raise SystemExit(f"unknown model {name!r}; known: tiny, smollm2, qwen")
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


def bench(name: str, rounds: int) -> dict:
    from horizonrl.inference import SamplingParams
    from horizonrl.inference.vllm_engine import VLLMEngine

    model = build(name)
    params = sum(p.numel() for p in model.parameters())
    engine = VLLMEngine(model, None, max_model_len=256, kv_cache_memory_bytes=256 << 20)
    times: dict[str, list[float]] = {"file": [], "collective": []}
    sums: dict[str, float] = {}
    g = torch.Generator().manual_seed(0)
    prompts = [
        [int(t) for t in torch.randint(5, model.config.vocab_size, (16,), generator=g)] for _ in range(4)
    ]
    greedy = SamplingParams(greedy=True, max_new_tokens=8)
    gens = {}
    try:
        for r in range(rounds):
            with torch.no_grad():  # a training-like update (tied tensors stay tied, as in training)
                for p in model.parameters():
                    p.add_(1e-3 * torch.randn(p.shape, generator=g))
            sd = model.state_dict()
            for route in ("file", "collective"):
                engine.weight_sync = route
                t = time.perf_counter()
                engine.sync(sd)
                times[route].append(time.perf_counter() - t)
                if r == rounds - 1:
                    sums[route] = engine.param_sum()
                    gens[route] = engine.generate(prompts, greedy)
        nbytes = engine.last_sync_bytes
    finally:
        engine.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {
        "model": name,
        "params": params,
        "bytes": nbytes,
        "rounds": rounds,
        "file_s": round(med["file"], 4),
        "collective_s": round(med["collective"], 4),
        "file_over_collective": round(med["file"] / med["collective"], 2),
        "same_weights": sums["file"] == sums["collective"],
        "greedy_max_abs_dlogp": max(
            float((torch.tensor(a.logprobs) - torch.tensor(b.logprobs)).abs().max())
            for a, b in zip(gens["file"], gens["collective"], strict=True)
        ),
        "first_collective_s": round(times["collective"][0], 4),  # includes building the group
    }
    print(
        f"{name:8s} {params / 1e6:7.1f}M params {nbytes / 2**20:8.1f} MiB   file {med['file']:.3f} s   "
        f"collective {med['collective']:.3f} s   file/collective {out['file_over_collective']:.2f}x   "
        f"same weights: {out['same_weights']} (greedy max |dlogp| {out['greedy_max_abs_dlogp']:.1e})",
        flush=True,
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "smollm2", "qwen"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    import platform

    results = [bench(m, args.rounds) for m in args.models]
    doc = {"machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads", "results": results}
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
