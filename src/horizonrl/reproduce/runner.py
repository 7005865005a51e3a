"""Run a reproduction: warm start (cached) and gate, then every arm x seed, resumably.

Layout under ``OUT/NAME/`` (default ``runs/reproduce/NAME``)::

    warmstart[_<scenario>]/ base_model/, sft/ (the shared warm start), warmstart.json (key, gate)
    start/<sig>/            the start-of-RL evaluation, once per evaluation signature
    <arm>/seed_<s>/         one trainer run; result.json marks it done

An arm-seed is a plain ``horizonrl`` training run (the paper's base config + the
paper's overrides + the arm's overrides + the harness's: seed, warm start,
token budget, evaluation settings), executed in a subprocess with one torch
thread, ``jobs`` at a time. A killed reproduction rerun skips every arm-seed
with a ``result.json``; an arm-seed that was stopped part way resumes from its
last checkpoint when the paper checkpoints (``Paper.checkpoint_every``), else it
reruns from scratch. Its ``wall_s`` adds up the sessions it ran in
(:class:`RunClock`).
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from horizonrl.config import ConfigError, RunConfig, load_config
from horizonrl.reproduce.spec import Arm, Paper, check_miss


class GateError(RuntimeError):
    """The warm start (or a regime check) is outside the range where groups carry signal."""


@dataclass
class Settings:
    """Run-time choices of one reproduction (the CLI's flags)."""

    seeds: int
    jobs: int = 1
    out: Path = Path("runs/reproduce")
    arms: tuple[str, ...] | None = None
    overrides: tuple[str, ...] = ()  # appended to every stage (e.g. a smaller model for a smoke run)
    budget_tokens: int | None = None
    eval_tasks: int | None = None
    #: also evaluate after half the budget (the page's "mid" column); off by default since issue 27:
    #: a held-out evaluation costs about as many generated tokens as a third of an arm's training
    mid_eval: bool = False
    force: bool = False
    log: Any = field(default=print, repr=False)

    def root(self, paper: Paper) -> Path:
        return Path(self.out) / paper.name


# ------------------------------------------------------------------ configs


def _packaged(name: str) -> Path:
    from horizonrl.train.recipes import packaged_config

    return packaged_config(name)


def base_overrides(paper: Paper, settings: Settings, scenario: str = "") -> list[str]:
    if scenario and scenario not in paper.scenarios:
        raise KeyError(
            f"paper {paper.name!r} has no scenario {scenario!r}; scenarios: {sorted(paper.scenarios)}"
        )
    return [*paper.overrides, *paper.scenarios.get(scenario, ()), *settings.overrides]


def stage_config(paper: Paper, settings: Settings, *items: str, scenario: str = "") -> RunConfig:
    return load_config(_packaged(paper.base), [*base_overrides(paper, settings, scenario), *items])


def warmstart_dir(paper: Paper, settings: Settings, scenario: str = "") -> Path:
    return settings.root(paper) / ("warmstart" + (f"_{scenario}" if scenario else ""))


def _key(d: Any) -> str:
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def budget_of(paper: Paper, settings: Settings) -> int:
    return settings.budget_tokens if settings.budget_tokens is not None else paper.budget_tokens


def eval_items(paper: Paper, settings: Settings) -> list[str]:
    n = settings.eval_tasks if settings.eval_tasks is not None else paper.eval_tasks
    return [
        f"env.test_tasks={n}",
        f"train.eval_samples={paper.eval_samples}",
        f"train.eval_temperature={paper.eval_temperature}",
        f"train.eval_seed={paper.eval_seed}",
        *(["train.eval_greedy=true"] if paper.eval_greedy else []),
    ]


def arm_items(paper: Paper, settings: Settings, arm: Arm, seed: int, out_dir: Path) -> list[str]:
    """Overrides of one arm-seed run (after the paper's base overrides)."""
    ws = warmstart_dir(paper, settings, arm.scenario) / "sft"
    return [
        *arm.overrides,
        *eval_items(paper, settings),
        f"train.seed={seed}",
        f"train.init={ws}" if paper.sft_warm_start else "train.init=null",
        f"train.out_dir={out_dir}",
        f"train.steps={paper.max_steps}",
        f"train.max_gen_tokens={budget_of(paper, settings)}",
        f"train.eval_fractions={'[0.5]' if settings.mid_eval else '[]'}",
        "train.eval_every=0",
        "train.eval_at_start=false",
        f"train.save_every={paper.checkpoint_every}",
        "train.keep_checkpoints=1",
        "train.progress=false",
    ]


# ------------------------------------------------------------------ warm start and gate


def warmstart_config(paper: Paper, settings: Settings, scenario: str = "") -> RunConfig:
    """The config the warm start of ``scenario`` is built and gated with."""
    root = warmstart_dir(paper, settings, scenario)
    return stage_config(paper, settings, f"sft.out_dir={root / 'sft'}", "train.init=null", scenario=scenario)


def warmstart_key(cfg: RunConfig) -> str:
    """What a warm start depends on (model, env, rollout, sft but its out_dir), hashed: a cached warm
    start is reused, and a results page's scenario carried over, only while this key is unchanged."""
    sig = {k: v for k, v in cfg.to_dict().items() if k in ("model", "env", "rollout", "sft")}
    sig["sft"] = {k: v for k, v in sig["sft"].items() if k != "out_dir"}
    return _key(sig)


def warm_start(paper: Paper, settings: Settings, scenario: str = "") -> dict[str, Any]:
    """Build (or reuse) the shared warm start and measure the gate on the training distribution.

    Without an SFT warm start (``paper.sft_warm_start`` false) the start is ``model.path`` itself."""
    from horizonrl.train.recipes import evaluate_model, run_sft
    from horizonrl.train.warmstart.bootstrap import base_model_dir

    root = warmstart_dir(paper, settings, scenario)
    cfg = warmstart_config(paper, settings, scenario)
    key = warmstart_key(cfg)
    meta_path = root / "warmstart.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    model_dir = root / "sft" if paper.sft_warm_start else base_model_dir(cfg.model, root)
    if meta.get("key") != key:
        meta = {"key": key}
    if paper.sft_warm_start and ("sft_s" not in meta or not (model_dir / "config.json").exists()):
        tag = f" ({scenario})" if scenario else ""
        settings.log(f"[warm start{tag}] SFT on {cfg.sft.demos} expert demonstrations -> {root / 'sft'}")
        t0 = time.perf_counter()
        run_sft(cfg, work_dir=root)
        meta = {"key": key, "sft_s": time.perf_counter() - t0}
        pre = root / "base_model" / "pretrain.json"
        if pre.exists():
            meta["pretrain"] = json.loads(pre.read_text())
    if "gate" not in meta:
        t0 = time.perf_counter()
        m = evaluate_model(
            cfg,
            model_dir,
            split="train",
            n_tasks=paper.gate_tasks,
            samples=paper.gate_samples,
            temperature=cfg.rollout.temperature,
        )
        meta["gate"] = {
            "pass@1": m["eval/pass@1"],
            "tasks": paper.gate_tasks,
            "samples": paper.gate_samples,
            "seconds": time.perf_counter() - t0,
        }
    if "checks" not in meta and (paper.checks is not None or paper.warm_checks is not None):
        rows = paper.checks(cfg) if paper.checks is not None else []
        if paper.warm_checks is not None:
            rows = [*rows, *paper.warm_checks(cfg, model_dir)]
        meta["checks"] = rows
    root.mkdir(parents=True, exist_ok=True)
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def check_gate(paper: Paper, meta: dict[str, Any], settings: Settings, scenario: str = "") -> None:
    """Refuse to start RL outside ``paper.gate`` or with a failed gating regime check (unless ``force``)."""
    lo, hi = paper.gate
    p = meta["gate"]["pass@1"]
    problems = []
    where = f" ({scenario})" if scenario else ""
    if not lo <= p <= hi:
        problems.append(
            f"warm-start{where} pass@1 on the training distribution is {p:.3f}, outside the gate "
            f"[{lo}, {hi}] ({meta['gate']['tasks']} tasks x {meta['gate']['samples']}); change the warm "
            "start "
            f"(sft.noise, sft.demos, sft.epochs) or the task difficulty (env.knobs) with --set, or --force"
        )
    for c in meta.get("checks") or []:
        if check_miss(c) == "FAILED":
            problems.append(f"regime check{where} {c['name']} = {c['value']} misses its target {c['target']}")
    if problems and not settings.force:
        raise GateError("; ".join(problems))
    for msg in problems:
        settings.log(f"[gate] WARNING (--force): {msg}")


# ------------------------------------------------------------------ jobs


def eval_signature(cfg: RunConfig) -> str:
    """Runs whose start evaluations are identical share a signature (same policy, agent and eval draws)."""
    d = cfg.to_dict()
    t = d["train"]
    return _key(
        {
            "env": d["env"],
            "rollout": d["rollout"],
            "init": t["init"],
            # greedy only when on, so signatures (and cached start evaluations) without it are unchanged
            "eval": [
                t["eval_samples"],
                t["eval_temperature"],
                t["eval_seed"],
                *(["greedy"] * t["eval_greedy"]),
            ],
        }
    )


@dataclass
class Job:
    kind: str  # "arm" | "start"
    arm: str
    seed: int
    out_dir: Path
    overrides: list[str]

    scenario: str = ""

    def to_json(self, paper: Paper, settings: Settings) -> str:
        return json.dumps(
            {
                "kind": self.kind,
                "base": str(_packaged(paper.base)),
                "overrides": [*base_overrides(paper, settings, self.scenario), *self.overrides],
                "out_dir": str(self.out_dir),
                "diagnostics": list(dict.fromkeys([*paper.diagnostics, *paper.per_seed])),
                "zero_adv_metrics": list(paper.zero_adv_metrics),
            }
        )


def planned_arms(paper: Paper, settings: Settings) -> list[Arm]:
    """The arms this invocation runs: ``--arms``, else every declared one."""
    return [paper.arm(a) for a in settings.arms] if settings.arms else list(paper.arms)


def probe_config(paper: Paper, settings: Settings, arm: Arm) -> RunConfig:
    """``arm``'s config for seed 0 (its output directory a placeholder): what its runs share."""
    items = arm_items(paper, settings, arm, 0, settings.root(paper) / "probe")
    return stage_config(paper, settings, *items, scenario=arm.scenario)


def plan(paper: Paper, settings: Settings) -> tuple[list[Job], dict[str, Path]]:
    """Every job of the reproduction, and each arm's start-evaluation directory."""
    root = settings.root(paper)
    arms = planned_arms(paper, settings)
    jobs: list[Job] = []
    starts: dict[str, Path] = {}
    for arm in arms:
        sig = eval_signature(probe_config(paper, settings, arm))
        start_dir = root / "start" / sig
        starts[arm.name] = start_dir
        if not any(j.kind == "start" and j.out_dir == start_dir for j in jobs):
            items = [
                *arm_items(paper, settings, arm, 0, start_dir),
                "train.steps=0",
                "train.eval_at_start=true",
            ]
            jobs.append(Job("start", arm.name, 0, start_dir, items, arm.scenario))
    for seed in range(settings.seeds):
        for arm in arms:
            out = root / arm.name / f"seed_{seed}"
            items = arm_items(paper, settings, arm, seed, out)
            jobs.append(Job("arm", arm.name, seed, out, items, arm.scenario))
    return jobs, starts


def check_tasks(paper: Paper, settings: Settings) -> None:
    """Generate every arm's training and held-out tasks, so a declaration asking for more unique tasks
    than its knobs allow fails (a ConfigError naming the field) before the warm start, not after it."""
    from horizonrl.train.rollout.env_setup import env_setup

    seen = set()
    for arm in planned_arms(paper, settings):
        env = probe_config(paper, settings, arm).env
        key = repr(env)
        if key in seen:  # arms that differ only in the method share their tasks
            continue
        seen.add(key)
        setup = env_setup(env)
        for split, n in (("train", env.train_tasks), ("test", env.test_tasks)):
            setup.tasks(n, seed=env.seed, split=split)


def run_jobs(paper: Paper, settings: Settings, jobs: list[Job]) -> None:
    """Run the jobs without a ``result.json``, ``settings.jobs`` at a time, each in its own process."""
    todo = [j for j in jobs if not (j.out_dir / "result.json").exists()]
    done = len(jobs) - len(todo)
    if done:
        settings.log(f"[resume] {done} of {len(jobs)} runs already finished")
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")

    def one(job: Job) -> tuple[Job, int, float]:
        job.out_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with open(job.out_dir / "log.txt", "a") as log:  # a resumed run's log goes on
            rc = subprocess.run(
                [sys.executable, "-m", "horizonrl.reproduce", job.to_json(paper, settings)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                check=False,
            ).returncode
        return job, rc, time.perf_counter() - t0

    failures = []
    with cf.ThreadPoolExecutor(max_workers=max(1, settings.jobs)) as pool:
        for job, rc, secs in pool.map(one, todo) if settings.jobs <= 1 else _as_done(pool, one, todo):
            tag = "start eval" if job.kind == "start" else f"{job.arm} seed {job.seed}"
            if rc != 0:
                failures.append(f"{tag} (exit {rc}; see {job.out_dir / 'log.txt'})")
                settings.log(f"[run] {tag}: FAILED (exit {rc}) after {secs:.0f}s")
            else:
                r = json.loads((job.out_dir / "result.json").read_text())
                settings.log(
                    f"[run] {tag}: pass@1 {r['pass@1']:.3f}, {r['generated_tokens']:,} tokens, {secs:.0f}s"
                )
    if failures:
        raise RuntimeError("runs failed: " + "; ".join(failures))


def _as_done(pool, fn, items):
    futures = [pool.submit(fn, j) for j in items]
    for f in cf.as_completed(futures):
        yield f.result()


# ------------------------------------------------------------------ one run (subprocess entry)


#: The scalar summaries of one held-out evaluation (:func:`eval_summary`) a run's ``result.json`` keeps
#: for its last evaluation (``None`` where the evaluation did not measure it).
EVAL_KEYS = ("pass@1", "pass@k", "pass@1_greedy", "tool_calls_mean", "greedy_tool_calls_mean")


def eval_summary(e: dict[str, Any]) -> dict[str, Any]:
    """One ``eval/step_N.json`` with its scalar summaries added.

    With ``k = samples`` episodes per task and ``c_i`` successes on task ``i`` of ``N``:
    ``pass@1 = sum_i c_i / (k N)``; ``pass@k = #{i : c_i > 0} / N`` (only when ``k > 1``: with one sample
    it is pass@1); ``pass@1_greedy`` the share of tasks the greedy episode solved (``train.eval_greedy``).
    """
    k, correct = max(1, e["samples"]), e["correct"]
    n = max(1, len(correct))
    out = {**e, "pass@1": sum(correct) / (k * n)}
    if k > 1:
        out["pass@k"] = sum(1 for c in correct if c > 0) / n
    if e.get("greedy_correct") is not None:
        out["pass@1_greedy"] = sum(e["greedy_correct"]) / max(1, len(e["greedy_correct"]))
    return out


def summarize_run(
    out_dir: Path,
    diagnostics: list[str],
    wall_s: float,
    zero_adv_metrics: Sequence[str] = Paper.zero_adv_metrics,
) -> dict[str, Any]:
    """``result.json`` of a finished run: evaluations (per task), budget, diagnostics, wall time.

    ``zero_adv_group_rate`` is the mean of the first of ``zero_adv_metrics`` the run reports
    (:attr:`Paper.zero_adv_metrics`).
    """
    from horizonrl.train.records.metrics import read_metrics

    evals = [
        eval_summary(json.loads(p.read_text()))
        for p in sorted((out_dir / "eval").glob("step_*.json"), key=lambda p: int(p.stem.split("_")[1]))
    ]
    records = read_metrics(out_dir)
    steps = [r for r in records if r.get("step", 0) > 0]
    last = steps[-1] if steps else {}

    def mean_of(key: str) -> float | None:
        vals = [r[key] for r in steps if isinstance(r.get(key), int | float)]
        return sum(vals) / len(vals) if vals else None

    diag = {k: mean_of(k) for k in diagnostics}
    zero = next((z for z in map(mean_of, zero_adv_metrics) if z is not None), None)
    ratios = [r["train/ratio_geomean"] for r in steps if isinstance(r.get("train/ratio_geomean"), float)]
    curve_keys = ("step", "gen_tokens", "pass@1", "pass@k", "pass@1_greedy")
    return {
        **{k: evals[-1].get(k) if evals else None for k in EVAL_KEYS},
        "curve": [{k: e[k] for k in curve_keys if k in e} for e in evals],
        "per_task": [list(e["correct"]) for e in evals],
        **(
            {"per_task_greedy": [e.get("greedy_correct") for e in evals]}
            if any("greedy_correct" in e for e in evals)
            else {}
        ),
        "samples": evals[-1]["samples"] if evals else None,
        "generated_tokens": int(last.get("budget/gen_tokens", 0)),
        "rollouts": int(last.get("budget/rollouts", 0)),
        "trainable_tokens": int(last.get("budget/trainable_tokens", 0)),
        "updates": sum(1 for r in steps if "train/loss" in r),
        "incomplete_phases": int(sum(r.get("budget/incomplete_phases", 0) for r in steps)),
        "zero_adv_group_rate": zero,
        "ratio_geomean_mean": sum(ratios) / len(ratios) if ratios else None,
        "ratio_geomean_min": min(ratios) if ratios else None,
        "diagnostics": diag,
        "wall_s": wall_s,
    }


class RunClock:
    """Wall time of one arm-seed over every session it ran in: ``wall.json`` maps each finished step to
    the seconds spent up to it, so a run resumed from its checkpoint at step ``n`` counts what came
    before ``n`` once (steps redone after ``n`` are timed again, not twice)."""

    def __init__(self, out_dir: Path, start_step: int) -> None:
        self.path = out_dir / "wall.json"
        old = json.loads(self.path.read_text()) if start_step and self.path.exists() else {}
        self.marks = {int(k): v for k, v in old.get("marks", {}).items() if int(k) <= start_step}
        self.base = self.marks.get(start_step, 0.0)
        self.sessions = int(old.get("sessions", 0)) + 1
        self.t0 = time.perf_counter()

    def total(self) -> float:
        return self.base + time.perf_counter() - self.t0

    def tick(self, step: int, _metrics: Any = None) -> None:
        self.marks[step] = self.total()
        data = {"sessions": self.sessions, "marks": self.marks}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.path)


def _run_one(spec: dict[str, Any]) -> None:
    import torch

    from horizonrl.train.records.checkpoint import latest_checkpoint
    from horizonrl.train.trainers.registry import make_trainer

    torch.set_num_threads(1)
    cfg = load_config(spec["base"], spec["overrides"])
    out = Path(spec["out_dir"])
    resume = latest_checkpoint(out / "checkpoints") is not None
    trainer = make_trainer(cfg, resume=resume)
    if resume:
        print(f"[resume] from the checkpoint of step {trainer.step}", flush=True)
    clock = RunClock(out, trainer.step)
    try:
        trainer.fit(progress_cb=clock.tick)
    finally:
        trainer.close()
    result = summarize_run(out, spec["diagnostics"], clock.total(), spec["zero_adv_metrics"])
    result["sessions"] = clock.sessions
    result["config"] = cfg.to_dict()
    tmp = out / "result.json.tmp"
    tmp.write_text(json.dumps(result) + "\n")
    tmp.replace(out / "result.json")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        _run_one(json.loads(argv[0]))
    except ConfigError as e:
        print(f"horizonrl reproduce: error: {e}", file=sys.stderr)
        return 2
    return 0
