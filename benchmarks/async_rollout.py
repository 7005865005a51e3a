"""Rollout throughput: the episode-level asynchronous driver vs the round-synchronous one, as ratios.

A multi-turn workload with what makes rounds wait: generation lengths that differ (a
few token ids count as end-of-sequence, so lengths are geometric, capped at
``--new-tokens``) and environment steps with latency (a declared sleep drawn per
episode and turn from an exponential of mean ``--env-ms``, with a ``--slow-frac``
share of steps ``--slow-x`` times longer: a sandboxed tool, a remote service). Each
episode appends its generation and a ``--obs-len``-token observation to its context
for ``--turns`` turns. The same episodes run under four or five drivers, taken in turns for
``--rounds`` rounds (median reported, so load changes hit all alike). Every request is
sampled from its path seed and the engine is reseeded per round, so within a round every
driver generates the same tokens and the tokens/s ratio is the inverse wall-time ratio:

- ``sync``: the round-synchronous driver as trainers run it by default (one thread; path
  seeds instead of engine-drawn ones change which tokens, not what a call costs);
- ``sync_threads``: the same with the environment steps of a round in ``--threads`` threads;
- ``async_calls``: the asynchronous driver over whole engine calls (what engines without a
  continuous batcher get: a call takes every request waiting when the engine is free);
- ``async_no_reuse`` (HF only): the same as ``async`` with the HF engine's prefix reuse off
  (``inference.params.prefix_reuse: false``);
- ``async``: ``rollout.driver: async`` with ``--threads`` program threads and the engine's
  continuous batcher (:mod:`horizonrl.inference.hf_stream`; vLLM's engine loop,
  :mod:`horizonrl.inference.vllm_stream`).

Reported per driver: generated tokens/s, wall time, engine calls (decode steps for a
stream), and the engine-idle fraction (share of the wall time no engine call was
running: on a GPU, the time it would sit idle). Ratios are against ``sync`` and
``sync_threads``. HF runs on one torch thread; nothing else should run on the
machine. Engines: the embedded tiny model's
default shape through the HF engine; ``--engine vllm`` through vLLM (CPU build in
``.venv-vllm``; on a GPU, ``scripts/gpu_smoke.sh``)::

    .venv/bin/python benchmarks/async_rollout.py
    .venv/bin/python benchmarks/async_rollout.py --env-ms 0     # generation lengths only

``--train CONFIG`` instead trains ``--steps`` steps of a shipped or given config with each driver
(``rollout.driver: sync`` then ``async``, same seed, no evaluation, no checkpoints) and prints the
trainer's own rollout and update times and their ratios: what the driver changes in a training run::

    .venv/bin/python benchmarks/async_rollout.py --train src/horizonrl/configs/rtpo_arithmetic.yaml --steps 6
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

from horizonrl.agents.driver import Generate, drive
from horizonrl.agents.scheduler import DriveStats, drive_async
from horizonrl.inference.base import EngineWrapper, SamplingParams


class TimedEngine(EngineWrapper):
    """Counts the wall time spent inside ``generate`` (engine busy time) and the calls."""

    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.busy = 0.0
        self.calls = 0

    def generate(self, prompts, params, **kw):
        t = time.perf_counter()
        gens = self.inner.generate(prompts, params, **kw)
        self.busy += time.perf_counter() - t
        self.calls += 1
        return gens


def episode(i: int, args, params: SamplingParams, vocab: int):
    """One multi-turn episode: generate, then an environment step of declared latency; returns the
    number of tokens it generated."""
    rng = np.random.default_rng(1000 + i)
    ctx = [int(x) for x in rng.integers(5, vocab, size=args.prompt_len)]
    generated = 0
    for _ in range(args.turns):
        gen = yield Generate(ctx, params)
        delay = rng.exponential(args.env_ms / 1000.0) if args.env_ms > 0 else 0.0
        if rng.random() < args.slow_frac:
            delay *= args.slow_x
        time.sleep(delay)
        generated += len(gen.ids)
        ctx = ctx + list(gen.ids) + [int(x) for x in rng.integers(5, vocab, size=args.obs_len)]
    return generated


def make_engine(args, work: Path):
    from horizonrl.config import ModelConfig
    from horizonrl.models import load_model_and_tokenizer
    from horizonrl.train.warmstart.bootstrap import build_tiny

    path = Path(args.model) if args.model else work / "tiny"
    if not (path / "config.json").exists():
        build_tiny(ModelConfig(tiny_pretrain_steps=20), path)  # the default tiny shape
    model, tok = load_model_and_tokenizer(path)
    model.eval()
    if args.engine == "vllm":
        from horizonrl.inference.vllm_engine import VLLMEngine

        engine = VLLMEngine(model, tok, max_batch_size=256, dtype="float32")
    else:
        from horizonrl.inference import HFEngine

        engine = HFEngine(model, tok, max_batch_size=256, device=args.device)
    # Lengths: every token in ``stop`` ends a generation, so a length is geometric with mean ~ vocab / |stop|.
    vocab = len(tok)
    engine.eos_ids = frozenset(range(5, 5 + max(1, round(vocab / args.mean_tokens))))
    return engine, vocab


def run_driver(name: str, engine, args, vocab: int, seed: int = 0) -> dict:
    params = SamplingParams(max_new_tokens=args.new_tokens)
    programs = [episode(i, args, params, vocab) for i in range(args.episodes)]
    engine.set_seed(seed)  # every driver of a round samples the same tokens (path seeds)
    t = time.perf_counter()
    if name.startswith("async") and name != "async_calls":  # the engine itself: the driver gets its stream
        reuse = getattr(engine, "prefix_reuse", None)
        if reuse is not None:
            engine.prefix_reuse = name == "async"
        stats = DriveStats()
        tokens = sum(drive_async(engine, programs, threads=args.threads, stats=stats))
        busy, calls = stats.engine_busy, stats.calls
        if reuse is not None:
            engine.prefix_reuse = reuse
    else:  # a wrapper with no stream: whole calls, timed
        timed = TimedEngine(engine)
        timed.program_threads = 1 if name == "sync" else args.threads
        mode = "async" if name == "async_calls" else "sync"
        tokens = sum(drive(timed, programs, mode=mode, path_seeds=True))
        busy, calls = timed.busy, timed.calls
    wall = time.perf_counter() - t
    return {"wall_s": wall, "tokens": tokens, "calls": calls, "idle": 1.0 - busy / wall}


def train_drivers(args) -> dict:
    """``--train``: the same short run under each driver; the trainer's time metrics side by side."""
    from horizonrl.config import load_config
    from horizonrl.train.records.metrics import read_metrics
    from horizonrl.train.trainers.registry import make_trainer

    work = Path(tempfile.mkdtemp(prefix="horizonrl-bench-train-"))
    out: dict = {"config": args.train, "steps": args.steps, "drivers": {}}
    for driver in ("sync", "async"):
        overrides = [
            f"rollout.driver={driver}",
            f"train.steps={args.steps}",
            "train.eval_at_start=false",
            f"train.eval_every={10**6}",
            "train.save_every=0",
            "train.progress=false",
            f"train.out_dir={work / driver}",
        ]
        cfg = load_config(args.train, overrides)
        t = time.perf_counter()
        trainer = make_trainer(cfg)
        trainer.fit()
        trainer.close()
        wall = time.perf_counter() - t
        rows = [m for m in read_metrics(work / driver) if "time/rollout_s" in m]
        out["drivers"][driver] = {
            "wall_s": round(wall, 1),
            # RTPO's trunk phase (time/phase1_s) is rollout time too
            "rollout_s": round(sum(m["time/rollout_s"] + m.get("time/phase1_s", 0.0) for m in rows), 1),
            "update_s": round(sum(m.get("time/update_s", 0.0) for m in rows), 1),
            "gen_tokens": int(rows[-1].get("budget/gen_tokens", 0)) if rows else 0,
        }
    s, a = out["drivers"]["sync"], out["drivers"]["async"]
    out["rollout_speedup"] = round(s["rollout_s"] / max(a["rollout_s"], 1e-9), 2)
    out["wall_speedup"] = round(s["wall_s"] / max(a["wall_s"], 1e-9), 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    ap.add_argument("--model", default=None, help="a model directory (default: the tiny model, built)")
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=48)
    ap.add_argument("--obs-len", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=96, help="cap of one generation")
    ap.add_argument("--mean-tokens", type=float, default=24.0, help="mean generation length before the cap")
    ap.add_argument("--env-ms", type=float, default=30.0, help="mean environment-step latency (ms)")
    ap.add_argument("--slow-frac", type=float, default=0.1, help="share of steps that are slow")
    ap.add_argument("--slow-x", type=float, default=10.0, help="how much slower a slow step is")
    ap.add_argument("--threads", type=int, default=16, help="program threads (sync_threads, async)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--device", default="cpu", help="--engine hf: where the engine runs (cpu, cuda)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--train", default=None, help="a config to train with each driver (see the docstring)")
    ap.add_argument("--steps", type=int, default=6, help="training steps per driver with --train")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.train:
        summary = train_drivers(args)
        print(json.dumps(summary, indent=1))
        if args.out:
            Path(args.out).write_text(json.dumps(summary, indent=1))
        return
    work = Path(tempfile.mkdtemp(prefix="horizonrl-bench-async-"))
    load = os.getloadavg()
    engine, vocab = make_engine(args, work)
    drivers = ("sync", "sync_threads", "async_calls", "async_no_reuse", "async")
    if args.engine != "hf":  # vLLM's prefix caching is its own, always on
        drivers = tuple(d for d in drivers if d != "async_no_reuse")
    runs: dict[str, list[dict]] = {d: [] for d in drivers}
    run_driver(
        "sync", engine, argparse.Namespace(**{**vars(args), "episodes": 4, "turns": 1}), vocab
    )  # warm-up
    for r in range(args.rounds):
        for d in drivers:
            runs[d].append(run_driver(d, engine, args, vocab, seed=r))
    summary: dict = {"engine": args.engine, "settings": vars(args), "drivers": {}}
    for d in drivers:
        med = statistics.median(r["tokens"] / r["wall_s"] for r in runs[d])
        summary["drivers"][d] = {
            "tok_s": round(med, 1),
            "wall_s": round(statistics.median(r["wall_s"] for r in runs[d]), 2),
            "tokens": [r["tokens"] for r in runs[d]],
            "calls": int(statistics.median(r["calls"] for r in runs[d])),
            "engine_idle_frac": round(statistics.median(r["idle"] for r in runs[d]), 3),
        }
    tok = {d: summary["drivers"][d]["tok_s"] for d in drivers}
    summary["async_vs_sync"] = round(tok["async"] / tok["sync"], 2)
    summary["async_vs_sync_threads"] = round(tok["async"] / tok["sync_threads"], 2)
    if "async_no_reuse" in tok:
        summary["prefix_reuse_gain"] = round(tok["async"] / tok["async_no_reuse"], 2)
    summary["loadavg"] = [load, os.getloadavg()]
    print(json.dumps(summary, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1))
    getattr(engine, "close", lambda: None)()


if __name__ == "__main__":
    main()
