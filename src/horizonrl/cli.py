"""``horizonrl`` command line: train, sft, eval, demos, quickstart, view, and listings."""

from __future__ import annotations

import argparse
import json
import sys

from horizonrl.config import ConfigError, describe, load_config


def _cmd_train(args) -> int:
    from horizonrl.train.trainers import make_trainer

    cfg = load_config(args.config, args.overrides)
    trainer = make_trainer(cfg, resume=args.resume)
    try:
        records = trainer.fit()
    finally:
        trainer.close()
    last = records[-1] if records else {}
    print(json.dumps({k: v for k, v in last.items() if k.startswith(("eval/pass", "step", "success"))}))
    return 0


def _cmd_sft(args) -> int:
    from horizonrl.train.recipes import run_sft

    cfg = load_config(args.config, args.overrides)
    out = run_sft(cfg)
    print(f"SFT model written to {out}")
    return 0


def _cmd_eval(args) -> int:
    from horizonrl.train.recipes import evaluate_model

    cfg = load_config(args.config, args.overrides)
    print(json.dumps(evaluate_model(cfg, args.model), indent=2))
    return 0


def _cmd_demos(args) -> int:
    from horizonrl.train.bootstrap import generate_demos, write_demos

    knobs = json.loads(args.knobs) if args.knobs else {}
    demos = generate_demos(
        args.env, args.n, seed=args.seed, noise=args.noise, max_turns=args.max_turns, knobs=knobs
    )
    write_demos(args.out, demos)
    rate = sum(d["success"] for d in demos) / max(1, len(demos))
    print(f"wrote {len(demos)} demonstrations to {args.out} (expert success {rate:.2f})")
    return 0


def _cmd_quickstart(args) -> int:
    from horizonrl.train.recipes import quickstart

    quickstart(out_dir=args.out, overrides=args.overrides)
    return 0


def _cmd_reproduce(args) -> int:
    from pathlib import Path

    from horizonrl.reproduce import GateError, Settings, get_paper, list_papers, reproduce

    if args.name in (None, "list"):
        for name in list_papers():
            p = get_paper(name)
            print(f"{name:10s} {p.title} ({len(p.arms)} arms: {', '.join(a.name for a in p.arms)})")
        return 0
    paper = get_paper(args.name)
    settings = Settings(
        seeds=args.seeds if args.seeds is not None else paper.seeds,
        jobs=args.jobs,
        out=Path(args.out),
        arms=tuple(a for a in args.arms.split(",") if a) if args.arms else None,
        overrides=tuple(args.set or ()),
        budget_tokens=args.budget,
        eval_tasks=args.eval_tasks,
        force=args.force,
    )
    if settings.arms:
        for a in settings.arms:
            paper.arm(a)  # KeyError naming the known arms
    try:
        reproduce(
            paper,
            settings,
            results_dir=None if args.results in ("", "none") else Path(args.results),
            command="horizonrl reproduce " + " ".join(sys.argv[2:] if len(sys.argv) > 2 else [args.name]),
            report_only=args.report_only,
        )
    except GateError as e:
        print(f"horizonrl reproduce: refused: {e}", file=sys.stderr)
        return 3
    return 0


def _cmd_view(args) -> int:
    from horizonrl.trajectory import read_jsonl

    for i, r in enumerate(read_jsonl(args.file)):
        if args.index is not None and i != args.index:
            continue
        print(
            f"=== rollout {r.uid} task={r.task_id} reward={r.reward} success={r.success} end={r.termination}"
        )
        for si, seg in enumerate(r.segments):
            print(f"--- segment {si} ({seg.kind})")
            for ti, t in enumerate(seg.turns):
                print(f"[turn {ti}] assistant ({len(t.response_ids)} tokens): {t.response_text}")
                if t.observation is not None:
                    print(f"[turn {ti}] observation: {t.observation}")
    return 0


def _cmd_envs(args) -> int:
    from horizonrl.envs import get_env, list_envs

    for name in list_envs():
        doc = (get_env(name).__doc__ or "").strip().splitlines()
        print(f"{name:12s} {doc[0] if doc else ''}")
    return 0


def _cmd_estimators(args) -> int:
    from horizonrl import credit

    for name in credit.list_estimators():
        spec = credit.get_estimator(name)
        print(f"{name:12s} loss_agg={spec.loss_agg_mode:26s} {spec.description}")
    return 0


def _cmd_config(args) -> int:
    print(describe())
    return 0


def _cmd_serve(args) -> int:
    try:
        from horizonrl.serve import serve
    except ImportError as e:  # fastapi/uvicorn are the optional "serve" extra
        print(f"horizonrl: error: {e}", file=sys.stderr)
        return 2
    if not 0 <= args.port <= 65535:
        print(f"horizonrl: error: --port must be in [0, 65535], got {args.port}", file=sys.stderr)
        return 2
    serve(
        args.model,
        args.host,
        args.port,
        model_name=args.model_name,
        device=args.device,
        dtype=args.dtype,
        seed=args.seed,
        max_batch_size=args.max_batch_size,
        default_max_tokens=args.max_tokens,
        cache_dir=args.cache_dir,
        log_level=args.log_level,
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="horizonrl", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    def with_config(sp):
        sp.add_argument("--config", "-c", default=None, help="YAML config file")
        sp.add_argument("overrides", nargs="*", help="section.field=value overrides")

    sp = sub.add_parser("train", help="train (train.trainer picks the group, rtpo or seeupo trainer)")
    with_config(sp)
    sp.add_argument("--resume", action="store_true", help="resume from the run's latest checkpoint")
    sp.set_defaults(fn=_cmd_train)

    sp = sub.add_parser("sft", help="supervised warm start on demonstrations")
    with_config(sp)
    sp.set_defaults(fn=_cmd_sft)

    sp = sub.add_parser("eval", help="held-out pass@1 / pass@k of a model directory")
    with_config(sp)
    sp.add_argument("--model", required=True, help="model directory (e.g. a checkpoint)")
    sp.set_defaults(fn=_cmd_eval)

    sp = sub.add_parser("demos", help="write expert demonstrations as JSONL")
    sp.add_argument("--env", required=True)
    sp.add_argument("--n", type=int, default=200)
    sp.add_argument("--noise", type=float, default=0.0)
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--max-turns", type=int, default=8)
    sp.add_argument("--knobs", default=None, help="JSON object of environment knobs")
    sp.add_argument("--out", required=True)
    sp.set_defaults(fn=_cmd_demos)

    sp = sub.add_parser("serve", help="OpenAI-compatible chat-completions server for a model")
    sp.add_argument("model", help="'tiny', 'smollm2', a model directory, a checkpoint or a run directory")
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=int, default=8000)
    sp.add_argument("--model-name", default=None, help="name clients send as 'model' (default: from MODEL)")
    sp.add_argument("--device", default="auto", help="'auto', 'cpu', 'cuda' or 'cuda:N'")
    sp.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    sp.add_argument("--seed", type=int, default=0, help="sampling seed (a request's 'seed' overrides it)")
    sp.add_argument("--max-batch-size", type=int, default=16, help="rows per generation batch")
    sp.add_argument("--max-tokens", type=int, default=512, help="max_tokens of requests that give none")
    sp.add_argument(
        "--cache-dir", default=None, help="where 'tiny' is built (default ~/.cache/horizonrl/tiny)"
    )
    sp.add_argument(
        "--log-level", default="info", choices=("critical", "error", "warning", "info", "debug", "trace")
    )
    sp.set_defaults(fn=_cmd_serve)

    sp = sub.add_parser("quickstart", help="tiny model: SFT warm start, GRPO, before/after table")
    sp.add_argument("--out", default="runs/quickstart")
    sp.add_argument("overrides", nargs="*", help="section.field=value overrides of the quickstart config")
    sp.set_defaults(fn=_cmd_quickstart)

    sp = sub.add_parser("reproduce", help="seeded paired reproduction of a paper's comparison")
    sp.add_argument("name", nargs="?", default=None, help="rtpo | ccpo | mosaic | echo (omit to list)")
    sp.add_argument("--seeds", type=int, default=None, help="seeds per arm (default: the paper's, 5)")
    sp.add_argument("--jobs", type=int, default=1, help="arm-seed runs in parallel (one torch thread each)")
    sp.add_argument("--arms", default=None, help="comma-separated subset of the arms")
    sp.add_argument("--out", default="runs/reproduce", help="where runs and the cached warm start live")
    sp.add_argument("--results", default="docs/results", help="where NAME.md/.json/.png go ('none': skip)")
    sp.add_argument("--budget", type=int, default=None, help="generated tokens per arm-seed")
    sp.add_argument("--eval-tasks", type=int, default=None, help="held-out tasks per evaluation")
    sp.add_argument("--set", action="append", help="section.field=value applied to every stage (repeatable)")
    sp.add_argument("--force", action="store_true", help="run even if the warm-start gate or a check fails")
    sp.add_argument("--report-only", action="store_true", help="rebuild the page from finished runs")
    sp.set_defaults(fn=_cmd_reproduce)

    sp = sub.add_parser("view", help="print rollouts from a rollouts/*.jsonl file")
    sp.add_argument("file")
    sp.add_argument("--index", type=int, default=None)
    sp.set_defaults(fn=_cmd_view)

    sub.add_parser("envs", help="list environments").set_defaults(fn=_cmd_envs)
    sub.add_parser("estimators", help="list credit estimators").set_defaults(fn=_cmd_estimators)
    sub.add_parser("config-reference", help="print every config field").set_defaults(fn=_cmd_config)
    return p


def _quiet_transformers() -> None:
    """Our own progress bar and logs are enough; hide transformers' per-load bars."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _quiet_transformers()
    try:
        return args.fn(args)
    except (ConfigError, KeyError, FileNotFoundError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"horizonrl: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


__all__ = ["build_parser", "main"]
