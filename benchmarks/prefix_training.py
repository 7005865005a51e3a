"""The update with and without prefix-shared training, side by side on the same recorded rows.

``algo.tree_training: auto`` forwards a prefix that rows share once and runs each row's own tokens
against its keys and values (train/update/prefix.py). This script trains ``--steps`` steps of each
setting with sharing off, records every batch of rows the trainer hands to ``ppo_update`` (the rows
real rollouts produce: chat template, few-shot block, tool observations, the trainer's own row
building), and then runs ``ppo_update`` on those same batches with ``tree_training=off`` and ``auto``,
alternating, from the recorded weights and a fresh AdamW each time, ``--repeats`` times. Per setting:

- ``tokens``: tokens the update's forwards process (padding included), plain against shared, and the
  rows' own tokens;
- ``update s``: the whole ``ppo_update`` (recomputed pi_old included where the config recomputes it),
  best of ``--repeats``, and trained (trainable) tokens per second, in three modes: ``before`` (the
  update before this work: sharing off and the LM head at every position), ``off`` (sharing off, the
  head only where a loss reads) and ``auto``;
- ``recompute s``: the no-grad recompute pass (``score_rows``) alone, off and auto;
- ``peak MB``: the process's resident memory above its level before the update, sampled every 5 ms;
- ``phases`` (``auto``): where the shared update's time goes (recompute, forward, backward,
  optimizer step) and the FLOPs its forwards and backwards do against what a plain matrix product of
  the model's width reaches on this machine (the floor for the FLOPs left).

Settings (shipped configs; the tiny ones with shortened warm starts so the script runs in minutes):

- ``smollm2``: ``smollm2_math_python.yaml``, the packaged real-model step (2 tasks x 8 episodes, each
  after the same ~560-token system prompt, tool block and few-shot episodes), one step;
- ``grpo``: the quickstart's groups (8 rollouts of one prompt, tiny model);
- ``rtpo``: ``rtpo_lookup`` (RTPO, 3 siblings per boundary, one update per turn, tiny model);
- ``mosaic``: ``mosaic_fork_lookup`` (subagent forks sharing their parent's context, tiny model).

``--docs`` writes the smollm2 table into docs/models.md's ``<!-- prefix-training -->`` block and the
tiny settings' into docs/scale.md's. On a CPU without bf16 units (no ``amx_bf16`` / ``avx512_bf16``) SmolLM2's
packaged bf16 settings run in float32 instead (``--precision``; torch emulates bf16 there, and the bf16
update measured 25x slower). Time it alone on the machine (2 cores: nothing else running)::

    .venv/bin/python benchmarks/prefix_training.py --settings smollm2 --docs
    .venv/bin/python benchmarks/prefix_training.py --settings grpo rtpo mosaic --docs
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import os
import tempfile
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "src" / "horizonrl" / "configs"

#: Setting -> (config, overrides that shorten its warm start and run, steps recorded).
SETTINGS = {
    "smollm2": ("smollm2_math_python.yaml", [], 1),
    "grpo": (
        "quickstart.yaml",
        ["model.tiny_pretrain_steps=300", "sft.demos=300", "sft.epochs=1", "rollout.tasks_per_step=8"],
        2,
    ),
    "rtpo": ("rtpo_lookup.yaml", [], 2),
    "mosaic": ("mosaic_fork_lookup.yaml", [], 2),
}
#: Where --docs writes each setting's table.
DOCS = {"smollm2": ("models.md", "prefix-training"), "tiny": ("scale.md", "prefix-training")}

COMMON = [
    "train.eval_at_start=false",
    f"train.eval_every={10**6}",
    "train.save_every=0",
    "train.progress=false",
    "env.test_tasks=4",  # the trainer evaluates after its last step: keep it short
]


#: Where the CPU emulates bf16 (no amx_bf16 / avx512_bf16), SmolLM2's packaged bf16 settings run in
#: float32 (its bf16 autocast update measured 25x slower there): ``--precision fp32``.
FP32 = ["train.precision=fp32", "inference.params.dtype=float32"]


def capture(config: str, overrides: list[str], steps: int, work: Path):
    """Train ``steps`` steps with sharing off; return (model, [(weights, rows, settings) per update])."""
    import horizonrl.train.methods.reverse_turn as reverse_turn
    import horizonrl.train.trainers.group as group
    from horizonrl.config import load_config
    from horizonrl.train.trainers.registry import make_trainer

    calls = []
    original = group.ppo_update

    def recording(model, optimizer, scheduler, rows, settings, **kw):
        calls.append((copy.deepcopy(model.state_dict()), list(rows), settings))
        return original(model, optimizer, scheduler, rows, settings, **kw)

    group.ppo_update = reverse_turn.ppo_update = recording
    try:
        cfg = load_config(
            str(CONFIGS / config),
            [*overrides, *COMMON, f"train.steps={steps}", "algo.tree_training=off", f"train.out_dir={work}"],
        )
        trainer = make_trainer(cfg)
        trainer.fit()
        model = trainer.train_model
        trainer.close()
    finally:
        group.ppo_update = reverse_turn.ppo_update = original
    return model, calls


def forwarded(model, rows, settings) -> tuple[int, int, int]:
    """Tokens the plain micro-batches and the update's shared plan forward, and the rows' own tokens."""
    from horizonrl.train.update.chunks import forwarded_tokens, update_chunks
    from horizonrl.train.update.prefix import prefix_cost

    seqs, budget, packed = [r.input_ids for r in rows], settings.micro_batch_tokens, settings.pack_rows
    plain = update_chunks(seqs, budget, packed=packed)
    shared = update_chunks(seqs, budget, packed=packed, cost=prefix_cost(model))
    own = sum(map(len, seqs))
    return forwarded_tokens(seqs, plain, packed=packed), forwarded_tokens(seqs, shared, packed=packed), own


class PeakRSS:
    """The process's peak resident memory above its level at entry, sampled every 5 ms (MB)."""

    def __enter__(self) -> PeakRSS:
        self.base = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def mb(self) -> float:
        return (self.peak - self.base) / 2**20


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextlib.contextmanager
def _mode(mode: str):
    """``before``: the update as it was before prefix sharing, sharing off and the LM head run at every
    position (``loss_positions`` all true); ``off`` / ``auto``: ``tree_training``."""
    import horizonrl.train.update.forward as forward

    original = forward.loss_positions
    if mode == "before":
        forward.loss_positions = lambda batch: torch.ones_like(batch.mask, dtype=torch.bool)
    try:
        yield "off" if mode == "before" else mode
    finally:
        forward.loss_positions = original


def time_updates(model, calls, mode: str, device: str = "cpu") -> tuple[float, float]:
    """(seconds, peak MB) of ``ppo_update`` over every recorded call in ``mode`` (:func:`_mode`; on a
    GPU the peak is torch's allocated memory, on the CPU the process's resident memory)."""
    with _mode(mode) as tree:
        return _time_updates(model, calls, tree, device)


def _time_updates(model, calls, mode: str, device: str) -> tuple[float, float]:
    from horizonrl.train.update.ppo import ppo_update

    model.to(device)
    total, peak = 0.0, 0.0
    for recorded, rows, settings in calls:
        model.load_state_dict(recorded)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
        s = dataclasses.replace(settings, tree_training=mode)
        cuda = device.startswith("cuda")
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        with PeakRSS() as mem:
            t = time.perf_counter()
            ppo_update(model, opt, None, rows, s, generator=torch.Generator().manual_seed(0), device=device)
            if cuda:
                torch.cuda.synchronize()
            total += time.perf_counter() - t
        peak = max(peak, (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else mem.mb)
    return total, peak


def time_recompute(model, calls, mode: str, device: str = "cpu") -> float:
    """Seconds of the no-grad recompute pass (``score_rows``) over every recorded call."""
    from horizonrl.train.update.ppo import score_rows

    total = 0.0
    for recorded, rows, settings in calls:
        model.load_state_dict(recorded)
        s = dataclasses.replace(settings, tree_training=mode)
        t = time.perf_counter()
        score_rows(
            model, rows, device=device, pad_id=0, micro_batch_tokens=s.micro_batch_tokens, forward=s.forward
        )
        total += time.perf_counter() - t
    return total


def phases(model, calls) -> dict:
    """Where the shared update's time goes: one pass over each recorded call's rows (recompute,
    forward, backward, AdamW step), and its FLOPs against a matrix product of the model's width."""
    from horizonrl.train.update.batching import collate, loss_positions
    from horizonrl.train.update.chunks import forward_cost
    from horizonrl.train.update.forward import RowForward
    from horizonrl.train.update.prefix import PrefixCost

    out = {"recompute_s": 0.0, "forward_s": 0.0, "backward_s": 0.0, "step_s": 0.0, "gflop": 0.0}
    cost = PrefixCost.of(model)
    head = 2.0 * model.config.hidden_size * model.config.vocab_size
    for recorded, rows, settings in calls:
        model.load_state_dict(recorded)
        s = dataclasses.replace(settings, tree_training="auto")
        out["recompute_s"] += time_recompute(model, [(recorded, rows, settings)], "auto")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
        model.train()
        fwd = RowForward(model, rows, s.forward, micro_batch_tokens=s.micro_batch_tokens, device="cpu")
        seqs = [r.input_ids for r in rows]
        micro = list(fwd.micro_batches(rows, collate(rows)))
        for m in micro:
            t = time.perf_counter()
            lp = m.logprobs(model, s.forward)
            loss = (lp * m.batch.mask).sum() / max(float(m.batch.mask.sum()), 1.0)
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            out["forward_s"] += t1 - t
            out["backward_s"] += t2 - t1
        t = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out["step_s"] += time.perf_counter() - t
        chunks = [(m.positions, m.plan) for m in micro]
        targets = sum(int(loss_positions(m.batch).sum()) for m in micro)
        # forward + backward (twice the forward) of the decoder, and of the LM head where a loss reads.
        out["gflop"] += (
            3 * (forward_cost(seqs, chunks, dataclasses.replace(cost, per_call=0.0)) + targets * head) / 1e9
        )
    out["matmul_gflops"] = matmul_gflops(model, calls[0][2].precision)
    busy = out["forward_s"] + out["backward_s"]
    out["achieved_gflops"] = out["gflop"] / busy if busy else 0.0
    out["floor_s"] = out["gflop"] / out["matmul_gflops"]
    return {k: round(v, 2) for k, v in out.items()}


def matmul_gflops(model, precision: str) -> float:
    """GFLOP/s of ``[2048, H] x [H, I]`` products under the update's ``precision`` (bf16: autocast;
    the best of 5)."""
    H, width = (
        model.config.hidden_size,
        getattr(model.config, "intermediate_size", 4 * model.config.hidden_size),
    )
    a, b = torch.randn(2048, H), torch.randn(H, width)
    best = float("inf")
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(10):
                a @ b
            best = min(best, (time.perf_counter() - t) / 10)
    return 2 * 2048 * H * width / best / 1e9


def bench_setting(name: str, args) -> dict:
    config, overrides, steps = SETTINGS[name]
    if args.precision == "fp32":
        overrides = [*overrides, *FP32]
    work = Path(tempfile.mkdtemp(prefix=f"horizonrl-bench-prefix-{name}-"))
    model, calls = capture(config, overrides, args.steps or steps, work)
    plain = shared = own = 0
    for _, rows, settings in calls:
        p, s, o = forwarded(model, rows, settings)
        plain, shared, own = plain + p, shared + s, own + o
    best = {"before": (float("inf"), 0.0), "off": (float("inf"), 0.0), "auto": (float("inf"), 0.0)}
    recompute = {"off": float("inf"), "auto": float("inf")}
    for _ in range(args.repeats):
        for mode in best:
            t, mb = time_updates(model, calls, mode, args.device)
            best[mode] = min(best[mode], (t, mb))
            if mode in recompute and calls[0][2].old_logprobs == "recompute":
                recompute[mode] = min(recompute[mode], time_recompute(model, calls, mode, args.device))
    trained = sum(r.num_trainable for _, rows, _ in calls for r in rows)
    out = {
        "config": config,
        "precision": calls[0][2].precision,
        "updates": len(calls),
        "rows": sum(len(rows) for _, rows, _ in calls),
        "tokens_rows": own,
        "tokens_plain": plain,
        "tokens_shared": shared,
        "token_ratio": round(plain / max(shared, 1), 2),
        "trained_tokens": trained,
        **{f"update_s_{m}": round(best[m][0], 2) for m in best},
        **{f"trained_tok_s_{m}": round(trained / best[m][0], 1) for m in best},
        "speedup": round(best["off"][0] / max(best["auto"][0], 1e-9), 2),
        "speedup_before": round(best["before"][0] / max(best["auto"][0], 1e-9), 2),
        "peak_mb_off": round(best["off"][1]),
        "peak_mb_auto": round(best["auto"][1]),
    }
    if recompute["off"] < float("inf"):
        out["recompute_s_off"] = round(recompute["off"], 2)
        out["recompute_s_auto"] = round(recompute["auto"], 2)
    if args.phases and args.device == "cpu":
        out["phases"] = phases(model, calls)
    return out


def table(results: dict) -> list[str]:
    """The printed table of a run (``--docs`` writes it between the markers)."""
    head = (
        "setting  precision  updates  rows  tokens rows/plain/shared  update s before/off/auto  "
        "trained tok/s before/off/auto  auto vs off/before  recompute s off/auto  peak MB off/auto"
    )
    lines = [head]
    for name, r in results.items():
        rec = (
            f"{r['recompute_s_off']:>9.2f}/{r['recompute_s_auto']:<9.2f}"
            if "recompute_s_off" in r
            else " " * 19
        )
        lines.append(
            f"{name:<7}  {r['precision']:<9}  {r['updates']:>7}  {r['rows']:>4}  "
            f"{r['tokens_rows']:>7}/{r['tokens_plain']:>6}/"
            f"{r['tokens_shared']:<6}  {r['update_s_before']:>8.2f}/{r['update_s_off']:.2f}/"
            f"{r['update_s_auto']:<8.2f}  {r['trained_tok_s_before']:>10.1f}/{r['trained_tok_s_off']:.1f}/"
            f"{r['trained_tok_s_auto']:<11.1f}  {r['speedup']:>7.2f}x/{r['speedup_before']:.2f}x  "
            f"{rec}  {r['peak_mb_off']:>7}/{r['peak_mb_auto']:<7}".rstrip()
        )
    for name, r in results.items():
        p = r.get("phases")
        if p:
            lines.append(
                f"{name} shared update by phase: recompute {p['recompute_s']} s, forward "
                f"{p['forward_s']} s, backward {p['backward_s']} s, AdamW step {p['step_s']} s; {p['gflop']} "
                f"GFLOP in the forwards and backwards at {p['achieved_gflops']} GFLOP/s against "
                f"{p['matmul_gflops']} GFLOP/s of a plain matrix product of the model's width "
                f"(floor {p['floor_s']} s)"
            )
    return lines


def write_docs(results: dict, command: str) -> None:
    """Each setting's table into its page's block (:data:`DOCS`)."""
    from horizonrl.benchtools import write_block

    for kind in ("smollm2", "tiny"):
        part = {k: v for k, v in results.items() if (k == "smollm2") == (kind == "smollm2")}
        if part:
            page, block = DOCS[kind]
            write_block(ROOT / "docs" / page, block, table(part), command)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--steps", type=int, default=0, help="training steps recorded (0: each setting's own)")
    ap.add_argument("--repeats", type=int, default=2, help="timed passes per mode (the best is kept)")
    ap.add_argument("--no-phases", dest="phases", action="store_false", help="skip the phase profile")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--device", default="cpu", help="where the updates are timed (cpu, cuda)")
    ap.add_argument(
        "--precision",
        choices=["auto", "packaged", "fp32"],
        default="auto",
        help="packaged: each config's own; fp32: the update and sampling in float32; auto: fp32 on a CPU "
        "that emulates bf16 (no amx_bf16 / avx512_bf16), else packaged",
    )
    ap.add_argument("--json", default=None, help="also write the results to this file")
    ap.add_argument("--docs", action="store_true", help="write the tables into docs/models.md / scale.md")
    args = ap.parse_args()
    if args.precision == "auto":
        from horizonrl.inference.precision import cpu_has_bf16_units

        args.precision = "packaged" if args.device != "cpu" or cpu_has_bf16_units() else "fp32"
    torch.set_num_threads(args.threads)
    out = {name: bench_setting(name, args) for name in args.settings}
    print(json.dumps(out, indent=2))
    lines = table(out)
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    if args.docs:
        names = " ".join(args.settings)
        extra = f" --repeats {args.repeats} --precision {args.precision}"
        extra += "" if args.phases else " --no-phases"
        write_docs(out, f".venv/bin/python benchmarks/prefix_training.py --settings {names}{extra} --docs")


if __name__ == "__main__":
    main()
