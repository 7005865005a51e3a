"""``horizonrl`` command line: train, sft, eval, export, demos, quickstart, view, plot, and listings."""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

import horizonrl
from horizonrl.config import ConfigError, describe, load_config
from horizonrl.errors import HorizonWarning, is_user_error


def _cmd_train(args) -> int:
    from horizonrl.train.trainers.registry import make_trainer

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


def _cmd_export(args) -> int:
    from horizonrl.train.records.export import export_merged

    out = export_merged(args.model, args.out, base=args.base, dtype=args.dtype)
    print(f"model written to {out}")
    return 0


def _cmd_demos(args) -> int:
    from horizonrl.jsonl import loads
    from horizonrl.train.trainers.checks import check_env_knobs
    from horizonrl.train.warmstart.bootstrap import generate_demos, write_demos

    knobs = {}
    if args.knobs:
        try:
            knobs = loads(args.knobs)
        except ValueError as e:
            raise ConfigError(f"--knobs {args.knobs!r}: not valid JSON ({getattr(e, 'msg', e)})") from None
        if not isinstance(knobs, dict):
            raise ConfigError(f"--knobs {args.knobs!r}: must be a JSON object of knob names to values")
    for name, value, lo, hi in (("--n", args.n, 1, 10**7), ("--max-turns", args.max_turns, 1, 10**5)):
        if not lo <= value <= hi:
            raise ConfigError(f"{name}={value}: must be in [{lo}, {hi}]")
    if not 0.0 <= args.noise <= 1.0:
        raise ConfigError(f"--noise={args.noise}: must be in [0, 1]")
    if not 0 <= args.seed <= 2**32 - 1:
        raise ConfigError(f"--seed={args.seed}: must be in [0, 2**32 - 1]")
    check_env_knobs(args.env, knobs, field="--knobs", name_field="--env")
    demos = generate_demos(
        args.env, args.n, seed=args.seed, noise=args.noise, max_turns=args.max_turns, knobs=knobs
    )
    write_demos(args.out, demos)
    rate = sum(d["success"] for d in demos) / max(1, len(demos))
    print(f"wrote {len(demos)} demonstrations to {args.out} (expert success {rate:.2f})")
    return 0


def _cmd_quickstart(args) -> int:
    from horizonrl.train.recipes import quickstart

    res = quickstart(out_dir=args.out, overrides=args.overrides)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


def _reproduce_command(args) -> str:
    """The command a results page cites: the options that shape the results (``--out``, ``--results``
    and ``--report-only`` only say where files go or skip the runs, so they are left out)."""
    import shlex

    parts = ["horizonrl", "reproduce", args.name]
    for flag, value in (
        ("--seeds", args.seeds),
        ("--arms", args.arms),
        ("--budget", args.budget),
        ("--eval-tasks", args.eval_tasks),
    ):
        if value is not None:
            parts += [flag, str(value)]
    for item in args.set or ():
        parts += ["--set", item]
    if args.jobs != 1:
        parts += ["--jobs", str(args.jobs)]
    if args.mid_eval:  # adds an evaluation to every run: a column of the page and a point of its curves
        parts.append("--mid-eval")
    if args.force:
        parts.append("--force")
    return shlex.join(parts)


def _cmd_reproduce(args) -> int:
    from pathlib import Path

    from horizonrl.reproduce import GateError, Settings, get_paper, list_papers, render, reproduce

    if args.name in (None, "list"):
        for name in list_papers():
            p = get_paper(name)
            print(f"{name:10s} {p.title} ({len(p.arms)} arms: {', '.join(a.name for a in p.arms)})")
        return 0
    try:
        paper = get_paper(args.name)
    except KeyError as e:
        raise ConfigError(e.args[0]) from None
    settings = Settings(
        seeds=args.seeds if args.seeds is not None else paper.seeds,
        jobs=args.jobs,
        out=Path(args.out),
        arms=tuple(a for a in args.arms.split(",") if a) if args.arms else None,
        overrides=tuple(args.set or ()),
        budget_tokens=args.budget,
        eval_tasks=args.eval_tasks,
        mid_eval=args.mid_eval,
        force=args.force,
    )
    if settings.arms:
        for a in settings.arms:
            try:
                paper.arm(a)
            except KeyError as e:
                raise ConfigError(f"--arms: {e.args[0]}") from None
    if args.render:
        if args.results in ("", "none"):
            raise ConfigError("--render rewrites the page in --results: it cannot be 'none'")
        print(f"[report] {render(paper, Path(args.results))}")
        return 0
    try:
        reproduce(
            paper,
            settings,
            results_dir=None if args.results in ("", "none") else Path(args.results),
            command=_reproduce_command(args),
            report_only=args.report_only,
        )
    except GateError as e:
        print(f"horizonrl reproduce: refused: {e}", file=sys.stderr)
        return 3
    return 0


def _cmd_view(args) -> int:
    from horizonrl.errors import DataError
    from horizonrl.viz.data import WANTED, check_run_dir

    path = Path(args.path)
    if path.is_file():
        if args.serve:
            print("horizonrl: error: view --serve takes a run directory, not a file", file=sys.stderr)
            return 2
        if path.suffix != ".jsonl":
            raise DataError(f"{path} is not a rollouts file (*.jsonl); expected {WANTED}")
        from horizonrl.viz.text import print_rollouts

        print_rollouts(path, index=args.index)
        return 0
    check_run_dir(path)  # a missing path, or a directory without a run: one error line, nothing written
    if args.serve:
        from horizonrl.viz.serve import serve

        if not 0 <= args.port <= 65535:
            print(f"horizonrl: error: --port must be in [0, 65535], got {args.port}", file=sys.stderr)
            return 2
        serve(path, port=args.port, tokenizer=args.tokenizer)
        return 0
    from horizonrl.viz.html import write_html

    out, problems = write_html(path, args.out, tokenizer=args.tokenizer)
    for p in problems:
        print(f"horizonrl: warning: {p}", file=sys.stderr)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB); open it in a browser")
    return 0


def _cmd_plot(args) -> int:
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        print("horizonrl: error: plot needs matplotlib: pip install 'horizonrl[viewer]'", file=sys.stderr)
        return 2
    from horizonrl.viz.plot import plot_runs

    for d in args.runs:
        if not (Path(d) / "metrics.jsonl").is_file():
            raise FileNotFoundError(f"{d}: no metrics.jsonl (is it a run directory?)")
    keys = [k.strip() for k in args.keys.split(",") if k.strip()] if args.keys else None
    labels = [x.strip() for x in args.labels.split(",")] if args.labels else None
    out = args.out or str(Path(args.runs[0]) / "plots" / "curves")
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    try:
        paths = plot_runs(args.runs, out, keys=keys, labels=labels, formats=formats, smooth=args.smooth)
    except ValueError as e:
        print(f"horizonrl: error: {e}", file=sys.stderr)
        return 2
    for p in paths:
        print(f"wrote {p}")
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
        if spec.agg_source:
            print(f"{'':12s} (aggregation: {spec.agg_source})")
    return 0


def _cmd_config(args) -> int:
    print(describe())
    return 0


def _cmd_trainers(args) -> int:
    from horizonrl.train.trainers.registry import trainer_reference

    print(trainer_reference())
    return 0


def _cmd_families(args) -> int:
    from horizonrl.models.families import FAMILIES
    from horizonrl.tool_formats import get_tool_format

    for name, fam in FAMILIES.items():
        think = " / ".join(fam.think) if fam.think else "none"
        print(
            f"{name}\n  tool calls: {get_tool_format(fam.tool_format).syntax}\n  thinking: {think}"
            f"{' (template drops earlier thinking: rollout.thinking_history)' if fam.drops_thinking else ''}"
            f"\n  {fam.about}"
        )
    return 0


def _server_kwargs(args) -> dict:
    """The engine and server settings ``serve`` and ``gateway`` share (their common flags)."""
    return {
        "model_name": args.model_name,
        "device": args.device,
        "dtype": args.dtype,
        "seed": args.seed,
        "max_batch_size": args.max_batch_size,
        "default_max_tokens": args.max_tokens,
        "max_request_tokens": args.max_request_tokens,
        "slice_tokens": args.slice_tokens,
        "cache_dir": args.cache_dir,
        "log_level": args.log_level,
    }


def _cmd_serve(args) -> int:
    try:
        from horizonrl.serve import serve
    except ImportError as e:  # fastapi/uvicorn are the optional "serve" extra
        print(f"horizonrl: error: {e}", file=sys.stderr)
        return 2
    error = _check_server_args(args)
    if error:
        print(f"horizonrl: error: {error}", file=sys.stderr)
        return 2
    serve(args.model, args.host, args.port, **_server_kwargs(args))
    return 0


def _cmd_gateway(args) -> int:
    if args.config is not None or args.overrides:  # trainer mode
        from horizonrl.train.trainers.registry import make_trainer

        if args.model is not None:
            args.overrides = [args.model, *args.overrides]  # argparse put the first override there
        cfg = load_config(args.config, [*args.overrides, "train.trainer=gateway"])
        try:
            records = make_trainer(cfg, resume=args.resume).fit()
        except RuntimeError as e:  # e.g. every episode of a step was dropped
            print(f"horizonrl: error: {e}", file=sys.stderr)
            return 1
        last = records[-1] if records else {}
        print(json.dumps({k: v for k, v in last.items() if k.startswith(("eval/", "step", "gateway/"))}))
        return 0
    if args.model is None:
        print("horizonrl: error: gateway needs MODEL (record only) or --config (train)", file=sys.stderr)
        return 2
    try:
        from horizonrl.serve import serve_gateway
    except ImportError as e:
        print(f"horizonrl: error: {e}", file=sys.stderr)
        return 2
    error = _check_server_args(args)
    if error:
        print(f"horizonrl: error: {error}", file=sys.stderr)
        return 2
    serve_gateway(args.model, args.host, args.port, out_dir=args.out, **_server_kwargs(args))
    return 0


def _check_server_args(args) -> str | None:
    if not 0 <= args.port <= 65535:
        return f"--port must be in [0, 65535], got {args.port}"
    for flag in ("max_batch_size", "max_tokens", "max_request_tokens", "slice_tokens"):
        if getattr(args, flag) < 1:
            return f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}"
    return None


def _server_args(sp) -> None:
    """Flags shared by ``serve`` and ``gateway``."""
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=int, default=8000)
    sp.add_argument("--model-name", default=None, help="name clients send as 'model' (default: from MODEL)")
    sp.add_argument("--device", default="auto", help="'auto', 'cpu', 'cuda' or 'cuda:N'")
    sp.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    sp.add_argument("--seed", type=int, default=0, help="sampling seed (a request's 'seed' overrides it)")
    sp.add_argument("--max-batch-size", type=int, default=16, help="rows per generation batch")
    sp.add_argument("--max-tokens", type=int, default=512, help="max_tokens of requests that give none")
    sp.add_argument(
        "--max-request-tokens", type=int, default=8192, help="cap on n x max_tokens of one request"
    )
    sp.add_argument(
        "--slice-tokens",
        type=int,
        default=32,
        help="decode steps per engine call; requests take turns between slices",
    )
    sp.add_argument(
        "--cache-dir", default=None, help="where 'tiny' is built (default ~/.cache/horizonrl/tiny)"
    )
    sp.add_argument(
        "--log-level", default="info", choices=("critical", "error", "warning", "info", "debug", "trace")
    )


def _with_config(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--config", "-c", default=None, help="YAML config file")
    sp.add_argument("overrides", nargs="*", help="section.field=value overrides")


def _add_run_commands(sub) -> None:
    """``train``, ``sft``, ``eval``, ``export``, ``demos``: what a config or a model directory runs."""
    sp = sub.add_parser("train", help="train (train.trainer picks the group, rtpo or seeupo trainer)")
    _with_config(sp)
    sp.add_argument("--resume", action="store_true", help="resume from the run's latest checkpoint")
    sp.set_defaults(fn=_cmd_train)

    sp = sub.add_parser("sft", help="supervised warm start on demonstrations")
    _with_config(sp)
    sp.set_defaults(fn=_cmd_sft)

    sp = sub.add_parser("eval", help="held-out pass@1 / pass@k of a model directory")
    _with_config(sp)
    sp.add_argument("--model", required=True, help="model directory (e.g. a checkpoint)")
    sp.set_defaults(fn=_cmd_eval)

    sp = sub.add_parser(
        "export", help="a checkpoint as a plain HF model directory (LoRA adapters merged into the base)"
    )
    sp.add_argument("model", help="a run directory (its latest checkpoint) or a checkpoint directory")
    sp.add_argument("--out", required=True, help="the new model directory (must not exist or be empty)")
    sp.add_argument("--base", default=None, help="base model directory (default: the one the adapters name)")
    sp.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    sp.set_defaults(fn=_cmd_export)

    sp = sub.add_parser("demos", help="write expert demonstrations as JSONL")
    sp.add_argument("--env", required=True)
    sp.add_argument("--n", type=int, default=200)
    sp.add_argument("--noise", type=float, default=0.0)
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--max-turns", type=int, default=8)
    sp.add_argument("--knobs", default=None, help="JSON object of environment knobs")
    sp.add_argument("--out", required=True)
    sp.set_defaults(fn=_cmd_demos)


def _add_server_commands(sub) -> None:
    """``serve``, ``gateway``, ``quickstart``."""
    sp = sub.add_parser("serve", help="OpenAI-compatible chat-completions server for a model")
    sp.add_argument("model", help="'tiny', 'smollm2', a model directory, a checkpoint or a run directory")
    _server_args(sp)
    sp.set_defaults(fn=_cmd_serve)

    sp = sub.add_parser(
        "gateway",
        help="recording OpenAI-compatible gateway: MODEL records episodes; --config trains a harness",
    )
    sp.add_argument("model", nargs="?", default=None, help="model to serve (record-only mode), as for serve")
    sp.add_argument("--config", "-c", default=None, help="YAML config: train the configured harness")
    sp.add_argument("--resume", action="store_true", help="resume training from the latest checkpoint")
    sp.add_argument("--out", default="runs/gateway", help="record-only mode: where rollouts.jsonl goes")
    _server_args(sp)
    sp.add_argument("overrides", nargs="*", help="section.field=value overrides (trainer mode)")
    sp.set_defaults(fn=_cmd_gateway)

    sp = sub.add_parser("quickstart", help="tiny model: SFT warm start, GRPO, before/after table")
    sp.add_argument("--out", default="runs/quickstart")
    sp.add_argument("--json", default=None, help="also write the before/after metrics to this JSON file")
    sp.add_argument("overrides", nargs="*", help="section.field=value overrides of the quickstart config")
    sp.set_defaults(fn=_cmd_quickstart)


def _add_reproduce_command(sub) -> None:
    """``reproduce``: a paper's seeded paired comparison (:mod:`horizonrl.reproduce`)."""
    sp = sub.add_parser("reproduce", help="seeded paired reproduction of a paper's comparison")
    sp.add_argument("name", nargs="?", default=None, help="a registered reproduction (omit to list them)")
    sp.add_argument("--seeds", type=int, default=None, help="seeds per arm (default: the paper's own)")
    sp.add_argument("--jobs", type=int, default=1, help="arm-seed runs in parallel (one torch thread each)")
    sp.add_argument("--arms", default=None, help="comma-separated subset of the arms")
    sp.add_argument("--out", default="runs/reproduce", help="where runs and the cached warm start live")
    sp.add_argument("--results", default="docs/results", help="where NAME.md/.json/.png go ('none': skip)")
    sp.add_argument("--budget", type=int, default=None, help="generated tokens per arm-seed")
    sp.add_argument("--eval-tasks", type=int, default=None, help="held-out tasks per evaluation")
    sp.add_argument(
        "--mid-eval", action="store_true", help="also evaluate after half the budget (default: start and end)"
    )
    sp.add_argument("--set", action="append", help="section.field=value applied to every stage (repeatable)")
    sp.add_argument("--force", action="store_true", help="run even if the warm-start gate or a check fails")
    sp.add_argument("--report-only", action="store_true", help="rebuild the page from finished runs")
    sp.add_argument(
        "--render", action="store_true", help="rewrite the page from its NAME.json alone (no runs needed)"
    )
    sp.set_defaults(fn=_cmd_reproduce)


def _add_view_commands(sub) -> None:
    """``view`` (rollouts as text or HTML) and ``plot`` (learning curves)."""
    sp = sub.add_parser(
        "view",
        help="view rollouts: a rollouts/*.jsonl file as text, a run directory as HTML (or --serve it)",
    )
    sp.add_argument("path", help="a rollouts/step_N.jsonl file (text) or a run directory (HTML viewer)")
    sp.add_argument("--index", type=int, default=None, help="text mode: only the rollout with this index")
    sp.add_argument("--out", default=None, help="HTML file to write (default RUN_DIR/viewer.html)")
    sp.add_argument("--serve", action="store_true", help="serve the viewer on http://127.0.0.1:PORT/")
    sp.add_argument("--port", type=int, default=8765, help="port for --serve (0 = any free port)")
    sp.add_argument("--tokenizer", default=None, help="tokenizer directory if the run has none")
    sp.set_defaults(fn=_cmd_view)

    sp = sub.add_parser("plot", help="learning curves (PNG + SVG) of one or more run directories")
    sp.add_argument("runs", nargs="+", help="run directories (each with metrics.jsonl)")
    sp.add_argument("--out", default=None, help="output path without suffix (default RUN_DIR/plots/curves)")
    sp.add_argument(
        "--keys",
        default=None,
        help="comma-separated panels or metric keys (default: reward,pass@1,sessions,ratio,kl,tokens/s,time)",
    )
    sp.add_argument("--labels", default=None, help="comma-separated legend labels, one per run")
    sp.add_argument("--formats", default="png,svg", help="comma-separated image formats")
    sp.add_argument("--smooth", type=float, default=0.0, help="EMA smoothing factor in [0, 1)")
    sp.set_defaults(fn=_cmd_plot)


def _add_list_commands(sub) -> None:
    """The listings: ``envs``, ``estimators``, ``config-reference``, ``trainers``, ``families``."""
    sub.add_parser("envs", help="list environments").set_defaults(fn=_cmd_envs)
    sub.add_parser("estimators", help="list credit estimators").set_defaults(fn=_cmd_estimators)
    sub.add_parser("config-reference", help="print every config field").set_defaults(fn=_cmd_config)
    sub.add_parser("trainers", help="list trainers and their train.trainer_params").set_defaults(
        fn=_cmd_trainers
    )
    sub.add_parser("families", help="list model families (model.family)").set_defaults(fn=_cmd_families)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="horizonrl", description=__doc__)
    p.add_argument("--version", action="version", version=f"horizonrl {horizonrl.__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    _add_run_commands(sub)
    _add_server_commands(sub)
    _add_reproduce_command(sub)
    _add_view_commands(sub)
    _add_list_commands(sub)
    return p


def _quiet_transformers() -> None:
    """Our own progress bar and logs are enough; hide transformers' per-load bars."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def _warning_printer(default):
    """``warnings.showwarning`` that prints a HorizonWarning as one ``horizonrl: warning:`` line."""

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, HorizonWarning):
            print(f"horizonrl: warning: {message}", file=sys.stderr)
        else:
            default(message, category, filename, lineno, file, line)

    return show


def main(argv: list[str] | None = None) -> int:
    """Run a command. A user error (:data:`horizonrl.errors.USER_ERRORS`: a bad config value, data
    file or checkpoint, a missing file, a full disk) prints ``horizonrl: error: ...`` and returns 2;
    anything else is a bug and keeps its traceback."""
    args = build_parser().parse_args(argv)
    _quiet_transformers()
    shown = warnings.showwarning
    warnings.showwarning = _warning_printer(shown)
    try:
        return args.fn(args)
    except BrokenPipeError:  # the reader went away (`horizonrl trainers | head`): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as e:
        if not is_user_error(e):
            raise
        print(f"horizonrl: error: {e}", file=sys.stderr)
        return 2
    finally:
        warnings.showwarning = shown


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


__all__ = ["build_parser", "main"]
