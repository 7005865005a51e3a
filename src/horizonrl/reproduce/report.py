"""Results of a reproduction: one JSON with every number, a Markdown page, PNG plots.

:func:`collect` reads the finished runs into the JSON structure
(``{"paper", "warm_start": {"pass@1"}, "arms": {ARM: {"seeds": [...]}}, "comparisons": [...]}``);
:func:`write_page` renders ``docs/results/NAME.md`` and the plots from that JSON
alone, so a page can be regenerated without rerunning anything
(``horizonrl reproduce NAME --report-only``).
"""

from __future__ import annotations

import json
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from horizonrl.reproduce.learning import MEASURES, all_gains, gain_table, rates
from horizonrl.reproduce.plots import plot_curves, plot_diffs
from horizonrl.reproduce.runner import EVAL_KEYS
from horizonrl.reproduce.spec import Paper, check_miss
from horizonrl.reproduce.stats import Interval, mean_sd, paired_bootstrap, t_interval


def _read(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def _warm(meta: dict[str, Any]) -> dict[str, Any]:
    return {
        **meta.get("gate", {}),
        "pretrain": meta.get("pretrain"),
        "sft_s": meta.get("sft_s"),
        "key": meta.get("key"),
    }


def start_entry(start: dict[str, Any]) -> dict[str, Any]:
    """A start evaluation's ``result.json`` as the results JSON keeps it: its measured summaries
    (:data:`~horizonrl.reproduce.runner.EVAL_KEYS`), per-task counts, and greedy ones when measured."""
    out = {k: start[k] for k in EVAL_KEYS if start.get(k) is not None}
    out["per_task"] = start["per_task"][0]
    if start.get("per_task_greedy"):
        out["per_task_greedy"] = start["per_task_greedy"][0]
    return out


def collect(paper: Paper, settings, metas: dict[str, Any], jobs, starts: dict[str, Path]) -> dict[str, Any]:
    """The results JSON of the finished runs (module docstring); ``metas``: the warm start per scenario."""
    root = settings.root(paper)
    arms: dict[str, Any] = {}
    for arm in paper.arms:
        if settings.arms and arm.name not in settings.arms:
            continue
        start = _read(starts[arm.name] / "result.json")
        seeds = []
        for s in range(settings.seeds):
            r = _read(root / arm.name / f"seed_{s}" / "result.json")
            if r is not None:
                r = {k: v for k, v in r.items() if k != "config"}
                seeds.append({"seed": s, **r})
        arms[arm.name] = {
            "scenario": arm.scenario,
            "label": arm.label or arm.name,
            "help": arm.help,
            "overrides": list(arm.overrides),
            "start": None if start is None else start_entry(start),
            "seeds": seeds,
        }
    return {
        **header(paper, settings, metas),
        "status": "done",
        "arms": arms,
        "comparisons": compare(paper, arms),
    }


def paired_metric_diffs(
    a: dict[int, dict[str, Any]], b: dict[int, dict[str, Any]], seeds: list[int], keys: Sequence[str]
) -> dict[str, Any]:
    """Per key of ``Paper.paired_metrics``: the per-seed differences of the runs' diagnostic (arm - baseline,
    seeds where both logged it) and their t-interval over seeds."""
    out = {}
    for k in keys:
        both = [
            s
            for s in seeds
            if a[s]["diagnostics"].get(k) is not None and b[s]["diagnostics"].get(k) is not None
        ]
        if both:
            diffs = [a[s]["diagnostics"][k] - b[s]["diagnostics"][k] for s in both]
            out[k] = {"seeds": both, "diffs": diffs, "t": vars(t_interval(diffs))}
    return out


def compare(paper: Paper, arms: dict[str, Any]) -> list[dict[str, Any]]:
    """The paper's comparisons among ``arms`` (both arms present, over their common seeds)."""
    comparisons = []
    for c in paper.comparisons:
        if c.arm not in arms or c.baseline not in arms:
            continue
        a = {s["seed"]: s for s in arms[c.arm]["seeds"]}
        b = {s["seed"]: s for s in arms[c.baseline]["seeds"]}
        common = sorted(set(a) & set(b))
        if not common:
            continue
        diffs = [a[s]["pass@1"] - b[s]["pass@1"] for s in common]
        t = t_interval(diffs)
        boot = paired_bootstrap(
            np.stack([rates(a[s]) for s in common]), np.stack([rates(b[s]) for s in common])
        )
        comparisons.append(
            {
                "arm": c.arm,
                "baseline": c.baseline,
                "claim": c.claim,
                "seeds": common,
                "diffs": diffs,
                "t": vars(t),
                "bootstrap": vars(boot),
                "verdict": verdict(t),
                "metrics": paired_metric_diffs(a, b, common, paper.paired_metrics),
            }
        )
    return comparisons


def header(paper: Paper, settings, metas: dict[str, Any]) -> dict[str, Any]:
    """The part of the results JSON that exists before any arm runs: setup, warm starts, regime checks."""
    return {
        "paper": paper.name,
        "title": paper.title,
        "claim": paper.claim,
        "notes": paper.notes,
        "declared_arms": [a.name for a in paper.arms],
        "setup": {
            "base_config": paper.base,
            "overrides": [*paper.overrides, *settings.overrides],
            "budget_tokens": settings.budget_tokens or paper.budget_tokens,
            "seeds": settings.seeds,
            "eval_tasks": settings.eval_tasks or paper.eval_tasks,
            "eval_samples": paper.eval_samples,
            "eval_temperature": paper.eval_temperature,
            "eval_seed": paper.eval_seed,
            "eval_greedy": paper.eval_greedy,
            "gate": list(paper.gate),
            "jobs": settings.jobs,
            "machine": f"{platform.machine()}, {platform.python_version()}, {_cpus()} CPUs",
        },
        "warm_start": _warm(next(iter(metas.values()))),
        "warm_starts": {s: _warm(m) for s, m in metas.items()},
        "checks": [{"scenario": s, **c} for s, m in metas.items() for c in (m.get("checks") or [])],
        "provenance": dict.fromkeys(metas, _stamp()),
    }


def _git(*args: str, cwd: Path | None = None) -> str | None:
    """The stripped output of ``git ARGS`` (None outside a git checkout, or if it prints nothing)."""
    import subprocess

    try:
        out = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out or None


def _stamp() -> dict[str, Any]:
    """When and at which commit a scenario's runs were collected (commit None outside a git checkout)."""
    import datetime

    utc = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M")
    return {"commit": _git("rev-parse", "--short", "HEAD"), "utc": utc}


def last_commit(path: Path) -> str | None:
    """The commit that last changed ``path`` (None outside a git checkout or if never committed)."""
    return _git("log", "-1", "--format=%h", "--", path.name, cwd=path.parent)


def gate_refusal(paper: Paper, settings, metas: dict[str, Any], reason: str) -> dict[str, Any]:
    """The results JSON of a reproduction whose gate refused to start RL: the measured regime, no arms."""
    return {**header(paper, settings, metas), "status": "gate_refused", "refused": reason, "arms": {},
            "comparisons": []}  # fmt: skip


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def verdict(t: Interval, *, above: str = "arm better", below: str = "arm worse") -> str:
    """The reading of a paired difference's t-interval (``above``/``below``: what a resolved sign means;
    a diagnostic's difference reads as a direction, ``arm higher``/``arm lower``)."""
    if t.n < 2:
        return "one seed: no interval"
    if t.lo > 0:
        return f"{above} (95% CI above 0)"
    if t.hi < 0:
        return f"{below} (95% CI below 0)"
    return "no difference resolved (95% CI includes 0)"


# ------------------------------------------------------------------ page


def _fmt(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _ms(values: list[float], digits: int = 3) -> str:
    if not values:
        return "–"
    m, sd = mean_sd(values)
    return f"{m:.{digits}f} ± {sd:.{digits}f}" if len(values) > 1 else f"{m:.{digits}f}"


def _mid(seed: dict[str, Any]) -> float | None:
    return seed["curve"][0]["pass@1"] if len(seed["curve"]) > 1 else None


#: Columns of the arm table shown only when some start evaluation measured them: (title, the start's
#: and each seed's key, digits).
OPTIONAL_COLUMNS = (
    ("pass@k", "pass@k", 3),
    ("greedy pass@1", "pass@1_greedy", 3),
    ("tool calls / episode", "tool_calls_mean", 2),
    ("greedy tool calls", "greedy_tool_calls_mean", 2),
)


def _optional(res: dict[str, Any]) -> list[tuple[str, str, int]]:
    """The :data:`OPTIONAL_COLUMNS` some arm's start evaluation measured."""
    starts = [a["start"] for a in res["arms"].values() if a.get("start")]
    return [c for c in OPTIONAL_COLUMNS if any(st.get(c[1]) is not None for st in starts)]


def arm_table(res: dict[str, Any], diag_keys: list[str]) -> str:
    optional = _optional(res)
    head = [
        "arm",
        "scenario",
        "start pass@1",
        "mid pass@1",
        "end pass@1",
        *(f"{title} start → end" for title, _, _ in optional),
        "gen tokens",
        "rollouts",
        "trainable tok",
        "updates",
        "zero-adv groups",
        "ratio geomean (min)",
        "wall s / seed",
        *diag_keys,
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, a in res["arms"].items():
        s = a["seeds"]
        mids = [m for m in (_mid(x) for x in s) if m is not None]
        zero = [x["zero_adv_group_rate"] for x in s if x["zero_adv_group_rate"] is not None]
        ratio = [x["ratio_geomean_mean"] for x in s if x["ratio_geomean_mean"] is not None]
        rmin = [x["ratio_geomean_min"] for x in s if x["ratio_geomean_min"] is not None]
        row = [
            f"`{name}`",
            a.get("scenario") or "–",
            _fmt(a["start"]["pass@1"]) if a["start"] else "–",
            _ms(mids),
            _ms([x["pass@1"] for x in s]),
            *(
                f"{_fmt((a['start'] or {}).get(key), digits)} → "
                f"{_ms([x[key] for x in s if x.get(key) is not None], digits)}"
                for _, key, digits in optional
            ),
            _ms([x["generated_tokens"] for x in s], 0),
            _ms([x["rollouts"] for x in s], 0),
            _ms([x["trainable_tokens"] for x in s], 0),
            _ms([x["updates"] for x in s], 0),
            _ms(zero, 2),
            f"{_ms(ratio, 4)} ({_fmt(min(rmin) if rmin else None, 4)})",
            _ms([x["wall_s"] for x in s], 0),
        ]
        for k in diag_keys:
            row.append(_ms([x["diagnostics"][k] for x in s if x["diagnostics"].get(k) is not None]))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def comparison_table(res: dict[str, Any]) -> str:
    head = [
        "comparison",
        "claim",
        "per-seed Δ pass@1",
        "mean Δ [95% t-CI over seeds]",
        "task bootstrap 95% CI",
        "reading",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in res["comparisons"]:
        t, b = Interval(**c["t"]), Interval(**c["bootstrap"])
        lines.append(
            "| "
            + " | ".join(
                [
                    f"`{c['arm']}` − `{c['baseline']}`",
                    c["claim"],
                    ", ".join(f"{d:+.3f}" for d in c["diffs"]),
                    t.fmt(),
                    f"[{b.lo:+.3f}, {b.hi:+.3f}]",
                    c["verdict"],
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def metric_table(res: dict[str, Any]) -> str:
    """Paired differences of ``Paper.paired_metrics`` per comparison ('' when there are none)."""
    rows = [
        f"| `{c['arm']}` − `{c['baseline']}` | `{k}` | {', '.join(f'{d:+.3f}' for d in m['diffs'])} | "
        f"{Interval(**m['t']).fmt()} | {verdict(Interval(**m['t']), above='arm higher', below='arm lower')} |"
        for c in res["comparisons"]
        for k, m in (c.get("metrics") or {}).items()
    ]
    if not rows:
        return ""
    head = (
        "| comparison | metric | per-seed Δ | mean Δ [95% t-CI over seeds] | reading |\n|---|---|---|---|---|"
    )
    return "\n\nPaired differences of run diagnostics (each run's mean over its updates):\n\n" + "\n".join(
        [head, *rows]
    )


def write_page(
    res: dict[str, Any],
    results_dir: Path,
    *,
    command: str,
    diag_keys: list[str],
    seed_keys: Sequence[str] = (),
) -> Path:
    """``NAME.md``, ``NAME.json``, ``NAME_curves.png`` and ``NAME_diffs.png`` under ``results_dir``."""
    results_dir.mkdir(parents=True, exist_ok=True)
    name = res["paper"]
    refused = res.get("status") == "gate_refused"
    res = {**res, "command": command} if refused else {**res, "command": command, **all_gains(res)}
    (results_dir / f"{name}.json").write_text(json.dumps(res, indent=1) + "\n")
    if not refused:
        plot_curves(res, results_dir / f"{name}_curves.png")
        if res["comparisons"]:
            plot_diffs(res, results_dir / f"{name}_diffs.png")
    st = res["setup"]
    checks = "\n".join(
        f"| {c.get('scenario') or '–'} | {c['name']} | {c['value']} | {c['target']} | "
        f"{check_miss(c) or 'yes'} |"
        for c in res["checks"]
    )
    warm = "\n".join(
        f"- {f'`{s}`: ' if s else ''}**{_fmt(w.get('pass@1'))}** ({w.get('tasks')} tasks x "
        f"{w.get('samples')} samples; gate {st['gate']}"
        + (
            f"; copy pretraining converged: {w['pretrain'].get('converged')}{_steps(w)})"
            if w.get("pretrain")
            else ")"
        )
        for s, w in res["warm_starts"].items()
    )
    check_table = (
        "| scenario | check | value | target | ok |\n|---|---|---|---|---|\n" + checks if checks else "(none)"
    )
    overrides = ", ".join(f"`{o}`" for o in st["overrides"]) or "no overrides"
    greedy = (
        ", and one greedy episode per task (greedy pass@1: what the policy's most likely actions solve, "
        "which sampling can sharpen without changing)"
        if st.get("eval_greedy")
        else ""
    )
    page = f"""# {res["title"]}

_Generated by `{command}` from `{name}.json`; do not edit by hand._

**Paper's claim.** {res["claim"]}

**Setup.** Base config `{st["base_config"]}` with {overrides}.
Every arm starts from one shared warm start and runs {st["seeds"]} seeds (the same seeds, hence the same task
order, in every arm) until {st["budget_tokens"]:,} generated tokens (all engine calls; a phase predicted to
overrun does not start, generation is clipped so it is never exceeded). Every evaluation uses the same
{st["eval_tasks"]} held-out tasks x {st["eval_samples"]} sample(s) at temperature {st["eval_temperature"]},
seed {st["eval_seed"]}{greedy}; start = the warm start, mid = first evaluation after half the budget
(runs with `--mid-eval`; "–" without), end = after the budget. Machine: {st["machine"]}, {st["jobs"]}
run(s) in parallel, one torch thread each.

{res.get("notes") or ""}
{_carried_text(res)}{_absent_text(res)}
## Regime

Warm-start pass@1 on the training distribution (one warm start per scenario, shared by its arms):

{warm}

Checks of the regime before any RL, with the scripted expert at the warm start's noise (rows named
`warm start: ...`: on the warm start's own groups, 16 training tasks x G samples):

{check_table}

## Results

{_refused_text(res) if refused else _results_text(res, diag_keys, seed_keys) + _partial_text(res)}"""
    path = results_dir / f"{name}.md"
    path.write_text(page)
    return path


def seed_table(res: dict[str, Any], keys: list[str]) -> str:
    """One row per arm-seed: end pass@1, updates and ``keys`` (each run's mean over its steps)."""
    head = ["arm", "seed", "end pass@1", "updates", *keys]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, a in res["arms"].items():
        for x in a["seeds"]:
            diag = x["diagnostics"]
            row = [f"`{name}`", str(x["seed"]), _fmt(x["pass@1"]), str(x["updates"])]
            lines.append("| " + " | ".join([*row, *(_fmt(diag.get(k)) for k in keys)]) + " |")
    return "\n".join(lines)


def _results_text(res: dict[str, Any], diag_keys: list[str], seed_keys: Sequence[str] = ()) -> str:
    name = res["paper"]
    per_seed = ""
    if seed_keys:
        per_seed = "\n\nPer arm-seed (each value is the run's mean over its updates):\n\n" + seed_table(
            res, list(seed_keys)
        )
    paired = (
        f"Paired differences of end pass@1 (same seed, same tasks):\n\n{comparison_table(res)}"
        if res["comparisons"]
        else "No comparisons are declared: the question is only whether each arm learned."
    )
    diffs = f"\n![paired differences]({name}_diffs.png)" if res["comparisons"] else ""
    learning = "".join(gain_table(res.get(m.gains_key) or {}, name) for name, m in MEASURES.items())
    return f"""{arm_table(res, diag_keys)}{per_seed}

Values are mean ± sd over seeds. {paired}{metric_table(res)}{learning}

![learning curves]({name}_curves.png){diffs}
"""


def _steps(warm: dict[str, Any]) -> str:
    """`` in N steps`` of the base model's copy pretraining: built from the same seed on two machines it
    took 3,124 and 2,712 steps, so warm starts built on different machines start from different models."""
    steps = (warm.get("pretrain") or {}).get("steps")
    return f" in {steps} steps" if steps else ""


def _carried_text(res: dict[str, Any]) -> str:
    """Which scenarios and arms this page carries over from an earlier run (:mod:`.carry`); empty if none."""
    carried, arms_carried = res.get("carried") or {}, res.get("carried_arms") or {}
    if not carried and not arms_carried:
        return ""
    lines = [""]

    def origin(c: dict[str, Any]) -> str:
        return f"commit {c.get('commit') or 'unknown'}" + (f", {c['utc']} UTC" if c.get("utc") else "")

    for s, c in carried.items():
        arms = ", ".join(f"`{a}`" for a, v in res["arms"].items() if v["scenario"] == s) or "none ran"
        key = (
            "its warm-start declaration is unchanged"
            if c.get("key_checked")
            else "the earlier page did not record its warm-start key, so only the setup and the arms' "
            "overrides were compared"
        )
        name = f"Scenario `{s}`" if s else "The base scenario"
        lines.append(
            f"**{name} is carried over** from an earlier run ({origin(c)}; arms {arms}): this run "
            f"did not rerun it. The setup and the arms' overrides match; {key}."
        )
    by_run: dict[tuple, list[str]] = {}
    for a, c in arms_carried.items():
        by_run.setdefault((res["arms"][a]["scenario"], origin(c)), []).append(f"`{a}`")
    for (s, where), arms in by_run.items():
        scenario = f" scenario `{s}`" if s else ""
        lines.append(
            f"**Arms {', '.join(arms)}{' of' if s else ''}{scenario} are carried over** from an earlier "
            f"run ({where}): this run did not rerun them. Their overrides and the setup match, and this "
            f"run's{scenario} warm start is the earlier one (the same declaration, and the same start "
            "evaluation on every held-out task). Their wall times are that run's, on its machine: "
            "compare them with this run's only on the same machine."
        )
    return "\n\n".join(lines) + "\n"


def absent_arms(res: dict[str, Any]) -> list[str]:
    """The declared arms this page has no runs of (neither run nor carried; not in a refused scenario)."""
    refused = {a for r in (res.get("refused_scenarios") or {}).values() for a in r["arms"]}
    return [a for a in res.get("declared_arms") or [] if a not in res["arms"] and a not in refused]


def with_status(res: dict[str, Any]) -> dict[str, Any]:
    """``status`` ``partial`` and ``absent_arms`` named when a declared arm has no runs on the page."""
    absent = absent_arms(res)
    if not absent or res.get("status") == "gate_refused":
        return res
    return {**res, "status": "partial", "absent_arms": absent}


def _absent_text(res: dict[str, Any]) -> str:
    """The page's paragraph naming :func:`absent_arms`; empty when every declared arm is there."""
    absent = absent_arms(res)
    if not absent:
        return ""
    names = ", ".join(f"`{a}`" for a in absent)
    return (
        f"\n**Not on this page:** {names}, declared but neither run nor carried over at this setup "
        f"(`horizonrl reproduce {res['paper']} --arms {','.join(absent)}` adds them); the comparisons "
        "that need them are left out.\n"
    )


def _partial_text(res: dict[str, Any]) -> str:
    """The scenarios whose gate refused while others ran (status ``partial``); empty otherwise."""
    refused = res.get("refused_scenarios") or {}
    if not refused:
        return ""
    lines = ["", "## Scenarios not run", ""]
    for s, r in refused.items():
        arms = ", ".join(f"`{a}`" for a in r["arms"])
        lines.append(f"- **`{s}`** (arms {arms}): the gate refused to start RL. {r['reason']}.")
    lines += [
        "",
        "Their comparisons are not reported: nothing about the paper's claim in that scenario was measured.",
        "",
    ]
    return "\n".join(lines)


def _refused_text(res: dict[str, Any]) -> str:
    return f"""**Not run: the gate refused to start RL.** {res["refused"]}.

No arm was trained, so nothing about the paper's claim was measured: with the warm start outside the gate
most groups would carry no signal (all rewards equal), and any difference between arms would be noise.
"""


# ------------------------------------------------------------------ plots
