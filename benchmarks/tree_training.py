"""Update time and tokens forwarded with shared-prefix (tree) training against the plain update.

``algo.tree_training: auto`` forwards the rows of a micro-batch that share a token prefix as one tree
(train/update/tree.py). This script trains a few steps of each setting with trees off, records every
batch of rows the trainer hands to ``ppo_update`` (the rows real rollouts produce: chat template,
tool observations, the trainer's own row building), and then times ``ppo_update`` on those same
batches with ``tree_training=off`` and ``auto``, alternating, from the same weights and a fresh AdamW
each time, ``--repeats`` times. It prints, per setting:

- ``tokens_plain`` / ``tokens_tree``: tokens the forwards process, padding included (the rows' padded
  micro-batches against the update's plan with trees, which keeps the plain micro-batches of a
  mini-batch whose forests would save under 5 %), and their ratio;
- ``update_s_off`` / ``update_s_auto``: summed update time, best of ``--repeats``, and the speedup.

Settings (shipped configs, shortened warm starts so the script runs in minutes; the policy is
therefore less trained than in the reproductions, and its completions longer):

- ``grpo``: the quickstart's groups (8 rollouts of one prompt);
- ``rtpo``: ``rtpo_lookup`` (RTPO, 3 siblings per boundary, one update per turn);
- ``mosaic``: ``mosaic_fork_lookup`` (subagent forks sharing their parent's context).

``--train CONFIG --steps N`` instead trains the same run twice, trees off and auto, and prints the
trainer's ``time/update_s`` and wall time side by side (the arm-seed measure of the issue). Example::

    .venv/bin/python benchmarks/tree_training.py
    .venv/bin/python benchmarks/tree_training.py --settings rtpo --repeats 5
    .venv/bin/python benchmarks/tree_training.py --train src/horizonrl/configs/rtpo_lookup.yaml --steps 4
    .venv/bin/python benchmarks/tree_training.py --train src/horizonrl/configs/rtpo_lookup.yaml --steps 4 \
        --after rollout.driver=async        # before: sync + no trees; after: async + trees

Time it alone on the machine (2 cores: nothing else running).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import torch

CONFIGS = Path(__file__).resolve().parents[1] / "src" / "horizonrl" / "configs"

#: Setting -> (config, overrides that shorten its warm start and run).
SETTINGS = {
    "grpo": (
        "quickstart.yaml",
        ["model.tiny_pretrain_steps=300", "sft.demos=300", "sft.epochs=1", "rollout.tasks_per_step=8"],
    ),
    "rtpo": ("rtpo_lookup.yaml", []),
    "mosaic": ("mosaic_fork_lookup.yaml", []),
}

COMMON = [
    "train.eval_at_start=false",
    f"train.eval_every={10**6}",
    "train.save_every=0",
    "train.progress=false",
]


def capture(config: str, overrides: list[str], steps: int, work: Path):
    """Train ``steps`` steps with trees off; return (model, settings, [rows of each ppo_update call])."""
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


def forwarded(model, rows, settings) -> tuple[int, int]:
    """Tokens the plain micro-batches and the update's plan with trees forward (padding included)."""
    from horizonrl.train.update.chunks import forwarded_tokens, update_chunks
    from horizonrl.train.update.tree import tree_cost

    seqs, budget, packed = [r.input_ids for r in rows], settings.micro_batch_tokens, settings.pack_rows
    plain = update_chunks(seqs, budget, packed=packed)
    tree = update_chunks(seqs, budget, packed=packed, cost=tree_cost(model))
    return forwarded_tokens(seqs, plain, packed=packed), forwarded_tokens(seqs, tree, packed=packed)


def wide_model(vocab: int, layers: int):
    """A random float32 model of SmolLM2-135M's width (hidden 576, MLP 1536, 9 heads, 3 KV heads) with
    ``layers`` layers and the recorded rows' vocabulary: where the linear layers, not the masked
    attention, dominate the update, as in real models."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).float().train()


def time_updates(model, calls, mode: str, state=None, device: str = "cpu") -> float:
    """Seconds of ``ppo_update`` over every recorded call with ``tree_training=mode`` (each call from its
    recorded weights, or from ``state`` for a model of another shape), on ``device``."""
    from horizonrl.train.update.ppo import ppo_update

    model.to(device)
    total = 0.0
    for recorded, rows, settings in calls:
        model.load_state_dict(state if state is not None else recorded)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
        s = dataclasses.replace(settings, tree_training=mode)
        _sync(device)
        t = time.perf_counter()
        ppo_update(model, opt, None, rows, s, generator=torch.Generator().manual_seed(0), device=device)
        _sync(device)
        total += time.perf_counter() - t
    return total


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bench_setting(name: str, args) -> dict:
    config, overrides = SETTINGS[name]
    work = Path(tempfile.mkdtemp(prefix=f"horizonrl-bench-tree-{name}-"))
    model, calls = capture(config, overrides, args.steps, work)
    plain = tree = 0
    for _, rows, settings in calls:
        p, t = forwarded(model, rows, settings)
        plain, tree = plain + p, tree + t
    best = {"off": float("inf"), "auto": float("inf")}
    for _ in range(args.repeats):
        for mode in best:
            best[mode] = min(best[mode], time_updates(model, calls, mode, device=args.device))
    out = {
        "config": config,
        "updates": len(calls),
        "rows": sum(len(rows) for _, rows, _ in calls),
        "tokens_plain": plain,
        "tokens_tree": tree,
        "token_ratio": round(plain / max(tree, 1), 2),
        "update_s_off": round(best["off"], 3),
        "update_s_auto": round(best["auto"], 3),
        "speedup": round(best["off"] / max(best["auto"], 1e-9), 2),
    }
    if args.wide_layers:
        wide = wide_model(model.config.vocab_size, args.wide_layers)
        state = copy.deepcopy(wide.state_dict())
        sub = calls[: args.wide_calls]
        t = {mode: time_updates(wide, sub, mode, state, args.device) for mode in ("off", "auto")}
        out["wide"] = {
            "layers": args.wide_layers,
            "updates": len(sub),
            "update_s_off": round(t["off"], 2),
            "update_s_auto": round(t["auto"], 2),
            "speedup": round(t["off"] / max(t["auto"], 1e-9), 2),
        }
    return out


def train_both(args) -> dict:
    """``--train``: the same run with trees off and auto (``--after``: overrides of the auto run only, e.g.
    ``rollout.driver=async`` for before/after both changes); the trainer's time metrics side by side."""
    from horizonrl.config import load_config
    from horizonrl.train.records.metrics import read_metrics
    from horizonrl.train.trainers.registry import make_trainer

    work = Path(tempfile.mkdtemp(prefix="horizonrl-bench-tree-train-"))
    out: dict = {"config": args.train, "steps": args.steps, "after": args.after, "modes": {}}
    for mode in ("off", "auto"):
        cfg = load_config(
            args.train,
            [
                *COMMON,
                f"train.steps={args.steps}",
                f"algo.tree_training={mode}",
                *(args.after if mode == "auto" else []),
                f"train.out_dir={work / mode}",
            ],
        )
        t = time.perf_counter()
        trainer = make_trainer(cfg)
        trainer.fit()
        trainer.close()
        wall = time.perf_counter() - t
        rows = [m for m in read_metrics(work / mode) if "time/update_s" in m or "time/step_s" in m]
        out["modes"][mode] = {
            "wall_s": round(wall, 1),
            "update_s": round(sum(m.get("time/update_s", 0.0) for m in rows), 1),
            "final_reward": rows[-1].get("reward/mean") if rows else None,
        }
    off, auto = out["modes"]["off"], out["modes"]["auto"]
    out["update_speedup"] = round(off["update_s"] / max(auto["update_s"], 1e-9), 2)
    out["wall_speedup"] = round(off["wall_s"] / max(auto["wall_s"], 1e-9), 2)
    return out


def table(results: dict) -> str:
    """The docs/scale.md table of a settings run (``--docs`` writes it between the markers)."""
    head = (
        "setting  updates  rows  tokens plain/tree  ratio  update s off/auto  speedup  wide s off/auto  "
        "wide speedup"
    )
    lines = [head, "-" * len(head)]
    for name, r in results.items():
        w = r.get("wide")
        wide = f"{w['update_s_off']:>7.1f}/{w['update_s_auto']:<7.1f}  {w['speedup']:>12.2f}" if w else ""
        lines.append(
            f"{name:<7}  {r['updates']:>7}  {r['rows']:>4}  {r['tokens_plain']:>8}/{r['tokens_tree']:<8}  "
            f"{r['token_ratio']:>5.2f}  {r['update_s_off']:>8.2f}/{r['update_s_auto']:<8.2f}  "
            f"{r['speedup']:>7.2f}  {wide}".rstrip()
        )
    return "```\n" + "\n".join(lines) + "\n```\n"


def write_docs(results: dict) -> None:
    """Replace the ``tree-training`` block of docs/scale.md with :func:`table`."""
    from docs_block import replace_block

    doc = CONFIGS.parents[2] / "docs" / "scale.md"
    doc.write_text(replace_block(doc.read_text(), "tree-training", table(results), where=str(doc)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument(
        "--steps", type=int, default=2, help="training steps whose updates are recorded / trained"
    )
    ap.add_argument("--repeats", type=int, default=3, help="timed passes per mode (the best is kept)")
    ap.add_argument(
        "--wide-layers",
        type=int,
        default=0,
        help="also time the recorded updates on a SmolLM2-wide random model",
    )
    ap.add_argument("--wide-calls", type=int, default=3, help="recorded updates timed on the wide model")
    ap.add_argument(
        "--train", default=None, help="a config to train with trees off and auto (see the docstring)"
    )
    ap.add_argument("--device", default="cpu", help="where the updates are timed (cpu, cuda)")
    ap.add_argument("--after", nargs="*", default=[], help="--train: overrides of the trees-on run only")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    ap.add_argument("--docs", action="store_true", help="write the table into docs/scale.md")
    ap.add_argument(
        "--from-json", default=None, help="only print (and with --docs write) a saved run's table"
    )
    args = ap.parse_args()
    if args.from_json:
        out = json.loads(Path(args.from_json).read_text())
    elif args.train:
        out = train_both(args)
    else:
        out = {name: bench_setting(name, args) for name in args.settings}
    print(json.dumps(out, indent=2))
    if not args.train:
        print(table(out))
    if args.json and not args.from_json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    if args.docs and not args.train:
        write_docs(out)


if __name__ == "__main__":
    main()
