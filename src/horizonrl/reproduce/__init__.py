"""Seeded, paired reproductions of the papers' comparisons (``horizonrl reproduce NAME``).

Per paper (:mod:`.papers`): one shared warm start built once and cached, a gate on
its pass@1 over the training distribution, ``S`` seeds per arm from that warm
start with the same task order, token-matched budgets, the same held-out tasks
and evaluation seed for every arm (start, middle, end), paired differences with
t-intervals over seeds and a task bootstrap, and a results page
(``docs/results/NAME.md`` + ``.json`` + plots). See ``docs/reproduce.md``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

# The built-in declarations register into spec.PAPERS here, above both modules: spec knows no paper, and
# every import of spec (or of anything in this package) runs this first.
from horizonrl.reproduce import papers, pretrained  # noqa: F401  (register the reproductions)
from horizonrl.reproduce.runner import (
    GateError,
    Settings,
    check_gate,
    check_tasks,
    plan,
    run_jobs,
    warm_start,
)
from horizonrl.reproduce.spec import (
    Arm,
    Comparison,
    Paper,
    check_miss,
    get_paper,
    list_papers,
    register_paper,
)


def reproduce(
    paper: Paper,
    settings: Settings,
    *,
    results_dir: Path | None = Path("docs/results"),
    command: str = "",
    report_only: bool = False,
) -> dict[str, Any]:
    """Warm start, gate, all arm-seeds (resumable), then the results JSON/page; returns the JSON."""
    from horizonrl.reproduce.report import collect, gate_refusal, with_status, write_page

    log = settings.log
    used = {paper.arm(a).scenario for a in settings.arms} if settings.arms else set(paper.scenario_names())
    if not report_only:
        check_tasks(paper, settings)
    metas = {}
    for scenario in (s for s in paper.scenario_names() if s in used):
        meta = warm_start(paper, settings, scenario) if not report_only else _meta(paper, settings, scenario)
        tag = f" ({scenario})" if scenario else ""
        g = meta["gate"]
        gate = list(paper.gate)
        log(f"[gate{tag}] warm-start pass@1 on the training distribution {g['pass@1']:.3f} (gate {gate})")
        for c in meta.get("checks") or []:
            miss = f"  {check_miss(c)}" if check_miss(c) else ""
            log(f"[check{tag}] {c['name']} = {c['value']} (target {c['target']}){miss}")
        metas[scenario] = meta
    refused: dict[str, str] = {}
    for scenario, meta in metas.items():
        try:
            check_gate(paper, meta, settings, scenario)
        except GateError as e:
            refused[scenario] = str(e)
    if refused and len(refused) == len(metas):  # the measured regime is a finding too: recorded, refused
        reason = "; ".join(refused.values())
        if results_dir is not None:
            page = write_page(
                gate_refusal(paper, settings, metas, reason),
                Path(results_dir),
                command=command or f"horizonrl reproduce {paper.name}",
                diag_keys=[],
            )
            log(f"[report] {page} (gate refused)")
        raise GateError(reason)
    if refused:  # a scenario that passed still runs; the refused one is recorded on the page
        arms = [
            a for a in (settings.arms or [a.name for a in paper.arms]) if paper.arm(a).scenario not in refused
        ]
        settings = dataclasses.replace(settings, arms=tuple(arms))
        for scenario, reason in refused.items():
            log(f"[gate ({scenario})] refused, its arms do not run: {reason}")
    jobs, starts = plan(paper, settings)
    if not report_only:
        run_jobs(paper, settings, jobs)
    res = collect(paper, settings, metas, jobs, starts)
    if refused:
        res["status"] = "partial"
        res["refused_scenarios"] = {
            s: {"reason": r, "pass@1": metas[s]["gate"]["pass@1"],
                "arms": [a.name for a in paper.arms if a.scenario == s]}
            for s, r in refused.items()
        }  # fmt: skip
    if results_dir is not None and settings.arms:
        _carry(paper, settings, res, Path(results_dir) / f"{paper.name}.json")
    res = with_status(res)  # "partial" while a declared arm is neither run nor carried
    for c in res["comparisons"]:
        t = c["t"]
        ci = f"{t['mean']:+.3f} [{t['lo']:+.3f}, {t['hi']:+.3f}]"
        log(f"[result] {c['arm']} - {c['baseline']}: {ci} {c['verdict']}")
    if results_dir is not None:
        page = write_page(
            res,
            Path(results_dir),
            command=command or f"horizonrl reproduce {paper.name}",
            diag_keys=list(paper.diagnostics),
            seed_keys=list(paper.per_seed),
        )
        log(f"[report] {page}")
    if refused:
        raise GateError(
            "; ".join(f"scenario {k!r}: {v}" for k, v in refused.items()) + " (the other scenarios ran)"
        )
    return res


def render(paper: Paper, results_dir: Path = Path("docs/results")) -> Path:
    """Rewrite ``NAME.md``, its plots and ``NAME.json`` from ``NAME.json`` alone, no run directories
    (``horizonrl reproduce NAME --render``): for a change in how pages are written. The page keeps the
    command it cites (the JSON's ``command``, else the existing page's ``Generated by`` line)."""
    import json
    import re

    from horizonrl.errors import DataError
    from horizonrl.reproduce.report import with_status, write_page

    path = Path(results_dir) / f"{paper.name}.json"
    if not path.exists():
        raise DataError(f"--render: no results at {path}; run `horizonrl reproduce {paper.name}` first")
    res = json.loads(path.read_text())
    if res.get("paper") != paper.name:
        raise DataError(f"--render: {path} is paper {res.get('paper')!r}, not {paper.name!r}")
    command = res.get("command")
    page = path.with_suffix(".md")
    if not command and page.exists():
        found = re.search(r"^_Generated by `(.+?)` from ", page.read_text(), re.MULTILINE)
        command = found.group(1) if found else None
    return write_page(
        with_status(res),  # a page written before partial pages said so
        Path(results_dir),
        command=command or f"horizonrl reproduce {paper.name}",
        diag_keys=list(paper.diagnostics),
        seed_keys=list(paper.per_seed),
    )


def _carry(paper: Paper, settings: Settings, res: dict[str, Any], previous: Path) -> None:
    """Keep the earlier page's scenarios and arms that ``--arms`` left out (:mod:`.carry`)."""
    import json

    from horizonrl.reproduce.carry import carry_over
    from horizonrl.reproduce.report import last_commit
    from horizonrl.reproduce.runner import warmstart_config, warmstart_key

    if not previous.exists():
        return
    keys = {
        s: warmstart_key(warmstart_config(paper, settings, s))
        for s in paper.scenario_names()
        if s not in res["warm_starts"]
    }
    prev = json.loads(previous.read_text())
    for why in carry_over(res, prev, paper, keys=keys, fallback_commit=last_commit(previous)):
        settings.log(f"[report] {why}")
    for s, c in (res.get("carried") or {}).items():
        settings.log(f"[report] scenario {s!r} carried over from {previous} (commit {c['commit']})")
    for a, c in (res.get("carried_arms") or {}).items():
        settings.log(
            f"[report] arm {a!r} carried over from {previous} (commit {c['commit']}): same warm start"
        )


def _meta(paper: Paper, settings: Settings, scenario: str = "") -> dict[str, Any]:
    import json

    from horizonrl.reproduce.runner import warmstart_dir

    path = warmstart_dir(paper, settings, scenario) / "warmstart.json"
    if not path.exists():
        raise FileNotFoundError(f"--report-only: no warm start at {path}; run the reproduction first")
    return json.loads(path.read_text())


__all__ = [
    "Arm",
    "Comparison",
    "GateError",
    "Paper",
    "Settings",
    "get_paper",
    "list_papers",
    "register_paper",
    "render",
    "reproduce",
]
