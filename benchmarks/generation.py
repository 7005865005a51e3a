"""Throughput of ``HFEngine.generate`` vs ``model.generate(do_sample=True)`` on a tiny random Qwen2.

Both get the same left-padded prompts, the same sampling settings and the same
eos ids; tokens/s counts the tokens each actually generated (up to and
including eos). Example::

    python benchmarks/generation.py --batch 32 --new-tokens 64 --prompt-len 64
    python benchmarks/generation.py --eos-ids 40 --stop   # rows finish early; stop-string overhead
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from horizonrl.inference import HFEngine, SamplingParams


def build(args) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    """A random Qwen2 and a byte-level BPE tokenizer of ``args.vocab`` tokens (ids 0/1: pad/eos)."""
    heads = max(1, args.hidden // 64)
    cfg = Qwen2Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 4,
        num_hidden_layers=args.layers,
        num_attention_heads=heads,
        num_key_value_heads=next(d for d in range(max(1, heads // 3), heads + 1) if heads % d == 0),
        max_position_embeddings=4096,
        eos_token_id=1,
        pad_token_id=0,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).eval()
    # A byte-level BPE trained on random pseudo-words: realistic incremental decoding for stop strings.
    rng = np.random.default_rng(0)
    syllables = [a + b for a in "bcdfghklmnprstvz" for b in "aeiou"] + list(".,;:!?()[]{}<>/=+-_0123456789")
    words = ["".join(rng.choice(syllables, size=rng.integers(1, 5))) for _ in range(20000)]
    corpus = [" ".join(rng.choice(words, size=200)) for _ in range(500)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab,
        special_tokens=["<pad>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    tok.add_tokens([f"<x{i}>" for i in range(args.vocab - tok.get_vocab_size())])  # if merges ran out
    return model, PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")


def bench(fn, repeats: int) -> tuple[float, int]:
    """Best wall time over ``repeats`` runs (after one warm-up) and the token count of the last run."""
    fn()
    best, tokens = float("inf"), 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        tokens = fn()  # both return Python ints read off the device, so the work is done here
        best = min(best, time.perf_counter() - t0)
    return best, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=64, help="longest prompt; lengths vary down to half")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument(
        "--eos-ids", type=int, default=1, help="treat ids [1, N] as eos (more: rows finish earlier)"
    )
    ap.add_argument("--stop", action="store_true", help="also pass a never-matching stop string")
    ap.add_argument("--compact", type=float, default=0.25, help="HFEngine compact_fraction")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave the default)")
    ap.add_argument("--device", default="cpu", help="where both generate (cpu, cuda)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model, tokenizer = build(args)
    model.to(args.device)
    rng = np.random.default_rng(0)
    lengths = rng.integers(max(1, args.prompt_len // 2), args.prompt_len + 1, size=args.batch)
    prompts = [rng.integers(2, args.vocab, size=int(n)).tolist() for n in lengths]
    eos = list(range(1, args.eos_ids + 1))
    stop = ("never matches",) if args.stop else ()

    engine = HFEngine(model, tokenizer, max_batch_size=args.batch, seed=0, compact_fraction=args.compact)
    engine.eos_ids = frozenset(eos)
    params = SamplingParams(
        temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.new_tokens, stop=stop
    )

    def run_engine() -> int:
        return sum(len(g.ids) for g in engine.generate(prompts, params))

    enc = tokenizer.pad({"input_ids": prompts}, padding_side="left", return_tensors="pt").to(args.device)
    extra = {"stop_strings": list(stop), "tokenizer": tokenizer} if stop else {}

    def run_hf() -> int:
        out = model.generate(
            **enc,
            do_sample=True,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=0,
            max_new_tokens=args.new_tokens,
            eos_token_id=eos,
            pad_token_id=0,
            **extra,
        )[:, enc["input_ids"].shape[1] :]
        total = 0
        for row in out.tolist():
            hits = [j for j, t in enumerate(row) if t in eos]
            total += hits[0] + 1 if hits else len(row)
        return total

    t_eng, n_eng = bench(run_engine, args.repeats)
    t_hf, n_hf = bench(run_hf, args.repeats)
    print(
        f"model: hidden={args.hidden} layers={args.layers} vocab={args.vocab} | batch={args.batch} "
        f"prompt_len<={args.prompt_len} new_tokens={args.new_tokens} eos_ids={args.eos_ids} "
        f"stop={bool(stop)} threads={torch.get_num_threads()} device={args.device}"
    )
    print(f"{'':16}{'tokens':>8}{'seconds':>10}{'tokens/s':>11}")
    print(f"{'HFEngine':16}{n_eng:>8}{t_eng:>10.3f}{n_eng / t_eng:>11.1f}")
    print(f"{'model.generate':16}{n_hf:>8}{t_hf:>10.3f}{n_hf / t_hf:>11.1f}")
    print(f"speed-up (tokens/s ratio): {(n_eng / t_eng) / (n_hf / t_hf):.2f}x")


if __name__ == "__main__":
    main()
