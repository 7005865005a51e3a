"""SmolLM2-135M-Instruct rollout speed: the HF engine's settings side by side, and ``model.generate``.

Records the generation calls of one real rollout step of the packaged ``smollm2_math_python.yaml``
(``--tasks`` tasks x 8 episodes, few-shot preamble, every turn), then replays exactly those calls (the
same prompts, each call's longest generation as its length for every row, ``ignore_eos``) under each
setting, so every setting does the same work:

- ``generate``: transformers' ``model.generate`` in float32, sampling, the same prompts (left-padded),
  batches of the same size (the reference);
- ``fp32``: the engine as it was before (float32, no shared prefix, batches of 16);
- ``+bf16``: sampling from a bfloat16 copy (``inference.params.dtype=bfloat16``);
- ``+prefix``: the shared static prefix (``inference.params.shared_prefix=true``);
- ``+prefill``: the engine's prefill fixes (the rows above run without them): the LM head's input made
  contiguous (bf16 ``F.linear`` on the CPU copied the head's weight per row for a sliced input) and
  the two-part softmax for prefills of up to 48 queries per row (``sdpa`` copied the prefix per row);
- ``+packed``: the bf16 copy's linear layers with weights pre-packed in oneDNN's layout
  (``precision.pack_linears``; the rows above reorder every weight on every call);
- ``+batch``: all of a call's rows in one batch (``rollout.max_batch_size`` as the packaged config);
- ``+lean``: decode steps through the lean step (``inference.params.lean_decode``, fused projections and
  fewer ops: :mod:`horizonrl.inference.lean_decode`).

Each setting runs in its own subprocess with ``--threads`` torch threads; generated tokens/s and the ratio
to ``fp32`` and to ``generate`` are printed. A second part (``--parts step``) times one whole rollout step
of the packaged config (its own sampled lengths) as it was before (float32), with the bf16 copy and shared
prefix as they first landed (no prefill fixes, no packed weights), with those fixes (``packed``: no lean
step, no turn reuse) and as it is (``packaged``). Turn reuse (``inference.params.turn_reuse``: the next
turn prefills only what it adds to the kept cache of its row) shows only in the step: a replay's
generations are not the recorded ones, so its next prompts extend none of them. Each arm runs
``--repeats`` times (the same seed, so the same work) and the fastest rollout is printed.
``--docs FILE`` writes what was printed into FILE's ``<!-- smollm2-rollout -->`` block (docs/models.md).

Example (about 25 minutes on 2 cores; nothing else should run meanwhile)::

    PYTHONPATH=src python benchmarks/smollm2_rollout.py
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

from horizonrl.benchtools import Printed, write_block

#: The engine's speed-ups that :func:`_without` can turn off, so earlier rows measure the engine before them.
FIXES = ("prefill", "packed", "lean", "turns")
_BF16 = {"dtype": "bfloat16", "shared_prefix": True}
#: (name, inference.params, max batch size (None = the packaged config's), fixes turned off) per replayed
#: setting.
SETTINGS = [
    ("fp32", {}, 16, FIXES),
    ("+bf16", {"dtype": "bfloat16"}, 16, FIXES),
    ("+prefix", _BF16, 16, FIXES),
    ("+prefill", _BF16, 16, ("packed",)),
    ("+packed", _BF16, 16, ()),
    ("+batch", _BF16, None, ()),
    ("+lean", {**_BF16, "lean_decode": True}, None, ()),
]
#: The packaged config as it was before (float32 sampling and update, batches of 16, pi_old from the rollout).
BEFORE = [
    "inference.params={}",
    "rollout.max_batch_size=16",
    "algo.old_logprobs=rollout",
    "algo.tis_cap=null",
    "train.precision=fp32",
    "train.logprob_chunk_tokens=0",
]


def _without(fixes) -> None:
    """The HF engine before the named speed-ups. ``prefill``: the LM head's input as transformers slices it
    (a non-contiguous view, which bf16 ``F.linear`` on the CPU expands and copies the head's weight for:
    ``precision.contiguous_head``), and ``sdpa`` over the expanded prefix for every prefill
    (``shared_prefix.TWO_PART_MAX_QUERIES``). ``packed``: the linear layers through ``F.linear``, which
    reorders each bf16 weight on every call (``precision.pack_linears``). ``lean``: decode steps through
    transformers' forward (``inference.params.lean_decode`` ignored). ``turns``: every turn's prompt
    prefilled whole (``inference.params.turn_reuse`` ignored)."""
    from horizonrl.inference import hf, shared_prefix

    if "prefill" in fixes:
        shared_prefix.TWO_PART_MAX_QUERIES = 1
        hf.contiguous_head = lambda model: None
    if "packed" in fixes:
        hf.pack_linears = lambda model: 0
    if "lean" in fixes:
        hf.supports_lean_decode = lambda model: False
    if "turns" in fixes:
        init = hf.HFEngine.__init__
        hf.HFEngine.__init__ = lambda self, *a, turn_reuse=False, **kw: init(self, *a, **kw)


def _config(overrides):
    from horizonrl.config import load_config

    path = resources.files("horizonrl") / "configs" / "smollm2_math_python.yaml"
    return load_config(str(path), ["model.device=cpu", "train.progress=false", *overrides])


def _trainer(job, out):
    from horizonrl.train.trainers.group import GroupTrainer

    cfg = _config(
        [
            f"rollout.tasks_per_step={job['tasks']}",
            "train.steps=1",
            "train.eval_every=0",
            "train.eval_at_start=false",
            "env.test_tasks=1",
            "train.save_every=0",
            f"train.out_dir={out}",
            *job.get("overrides", []),
        ]
    )
    return GroupTrainer(cfg)


def _record(job) -> dict:
    """Run one rollout step and return its generation calls: prompts and the longest generation."""
    with tempfile.TemporaryDirectory() as out:
        tr = _trainer(job, out)
        calls = []
        inner = tr.engine.generate

        def recording(prompts, params, **kw):
            gens = inner(prompts, params, **kw)
            calls.append({"prompts": [list(p) for p in prompts], "new": max(len(g.ids) for g in gens)})
            return gens

        tr.engine.generate = recording
        tr.collect(tr.task_rng.sample(tr.train_tasks, job["tasks"]))
        return {"calls": calls, "batch": tr.cfg.rollout.max_batch_size}


def _replay(job) -> dict:
    import torch

    from horizonrl.inference import SamplingParams, make_engine
    from horizonrl.inference.batching import left_pad
    from horizonrl.models.loading import load_smollm2

    model, tok = load_smollm2(Path.home() / ".cache" / "horizonrl" / "smollm2-135m-instruct")
    calls = json.loads(Path(job["calls"]).read_text())
    batch = job["batch"]
    n_tok, t0 = 0, time.perf_counter()
    if job["name"] == "generate":
        model.generation_config.pad_token_id = tok.pad_token_id
        for c in calls:
            for lo in range(0, len(c["prompts"]), batch):
                ids, mask, _ = left_pad(c["prompts"][lo : lo + batch], tok.pad_token_id, "cpu")
                out = model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    do_sample=True,
                    temperature=1.0,
                    top_p=1.0,
                    top_k=0,
                    max_new_tokens=c["new"],
                    min_new_tokens=c["new"],
                )
                n_tok += (out.shape[1] - ids.shape[1]) * ids.shape[0]
    else:
        engine = make_engine(
            "hf", model, tok, device="cpu", max_batch_size=batch, seed=0, params=job["params"]
        )
        for c in calls:
            params = SamplingParams(temperature=1.0, max_new_tokens=c["new"], ignore_eos=True)
            gens = engine.generate(c["prompts"], params)
            n_tok += sum(len(g.ids) for g in gens)
    dt = time.perf_counter() - t0
    return {"tokens": n_tok, "s": dt, "threads": torch.get_num_threads()}


def _step(job) -> dict:
    with tempfile.TemporaryDirectory() as out:
        m = _trainer(job, out).train_step()
    n = m["throughput/tokens_per_s"] * m["time/rollout_s"]
    return {
        "tokens": round(n),
        "s": m["time/rollout_s"],
        "update_s": m["time/update_s"],
        "trained": m["train/trainable_tokens"],
        "ratio": m.get("train/ratio_geomean", 1.0),
        "reward": m["reward/mean"],
    }


def _run(job: dict) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(job)], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"job {job.get('name', job['part'])} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="replay,step", help="comma-separated: replay, step")
    ap.add_argument("--tasks", type=int, default=2, help="tasks of the recorded step (x 8 episodes)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="runs of each step arm (the fastest is printed)")
    ap.add_argument("--docs", type=Path, default=None, help="write the output into this file's block")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        job = json.loads(args.child)
        import torch

        torch.set_num_threads(job["threads"])
        _without(job.get("without", ()))
        print(json.dumps({"record": _record, "replay": _replay, "step": _step}[job["part"]](job)))
        return
    parts = set(args.parts.split(","))
    base = {"tasks": args.tasks, "threads": args.threads}
    emit = Printed()
    if "replay" in parts:
        with tempfile.TemporaryDirectory() as tmp:
            rec = _run({**base, "part": "record"})
            path = Path(tmp) / "calls.json"
            path.write_text(json.dumps(rec["calls"]))
            rows = sum(len(c["prompts"]) for c in rec["calls"])
            mean_prompt = sum(len(p) for c in rec["calls"] for p in c["prompts"]) / rows
            emit(
                f"replay: {len(rec['calls'])} generation calls of one step ({args.tasks} tasks x 8), {rows} "
                f"rows, mean prompt {mean_prompt:.0f} tokens, {args.threads} threads",
            )
            res = {}
            for name, params, batch, without in [("generate", {}, 16, ()), *SETTINGS]:
                job = {**base, "part": "replay", "name": name, "params": params, "calls": str(path)}
                r = res[name] = _run({**job, "batch": batch or rec["batch"], "without": list(without)})
                tps = r["tokens"] / r["s"]
                ratios = [
                    (ref, res[ref]["tokens"] / res[ref]["s"]) for ref in ("fp32", "generate") if ref in res
                ]
                emit(
                    f"  {name:9s} {r['tokens']:6d} tokens {r['s']:7.1f} s {tps:7.1f} tok/s   "
                    + "  ".join(f"x{tps / ref_tps:.2f} {ref}" for ref, ref_tps in ratios),
                )
    if "step" in parts:
        emit(
            f"step: one GRPO step of the packaged config ({args.tasks} tasks x 8), its own sampled lengths, "
            f"fastest rollout of {args.repeats}",
        )
        res: dict[str, dict] = {}
        arms = (
            ("before", BEFORE, FIXES),
            ("prefix", [], FIXES),
            ("packed", [], ("lean", "turns")),
            ("packaged", [], ()),
        )
        for _ in range(args.repeats):  # arms alternate, so a slow spell of the machine hits them alike
            for name, ov, without in arms:
                r = _run({**base, "part": "step", "overrides": ov, "without": list(without)})
                if name not in res or r["s"] < res[name]["s"]:
                    res[name] = r
        for name, _, _ in arms:
            r = res[name]
            emit(
                f"  {name:9s} rollout {r['tokens']:6d} tokens {r['s']:6.1f} s "
                f"{r['tokens'] / r['s']:6.1f} tok/s  "
                f"update {r['update_s']:6.1f} s ({r['trained'] / r['update_s']:5.0f} trained tok/s)  "
                f"ratio {r['ratio']:.4f}  reward {r['reward']:.3f}",
            )
        b = res["packaged"]
        for name in ("before", "prefix", "packed"):
            a = res[name]
            rollout = (b["tokens"] / b["s"]) / (a["tokens"] / a["s"])
            update = (b["trained"] / b["update_s"]) / (a["trained"] / a["update_s"])
            emit(f"  packaged / {name}: rollout x{rollout:.2f} tok/s, update x{update:.2f} trained tok/s")
    if args.docs is not None:
        cmd = "PYTHONPATH=src python benchmarks/smollm2_rollout.py"
        command = (
            f"{cmd} --parts {args.parts} --threads {args.threads} --repeats {args.repeats} --docs {args.docs}"
        )
        write_block(args.docs, "smollm2-rollout", emit.lines, command)


if __name__ == "__main__":
    main()
