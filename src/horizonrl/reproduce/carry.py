"""Carry results of an earlier results page into a rerun restricted with ``--arms``.

A reproduction rerun with ``--arms`` keeps what it did not rerun from the page's earlier JSON, so one
scenario, or one arm, can be added or rerun without rerunning the rest. Carried only while nothing that
shapes the numbers changed:

- a **scenario** that did not run: the setup (:data:`CARRY_SETUP`), each of its arms' overrides, and its
  warm-start key (the declaration the warm start is built from) are unchanged;
- an **arm** of a scenario that did run: the same, and this run's warm start is the earlier one — the
  same key, and the same start evaluation task for task (the held-out tasks at the fixed evaluation
  seed). A warm start rebuilt from the same declaration on another machine can differ (float rounding
  in the copy pretraining), and then its arms are rerun, not carried.

Every comparison is recomputed over the arms present, and ``res["carried"]`` / ``res["carried_arms"]``
record where each carried part came from.
"""

from __future__ import annotations

from typing import Any

from horizonrl.reproduce.report import compare
from horizonrl.reproduce.spec import Paper

# The setup fields that must match for an earlier page's results to be carried into a new one.
CARRY_SETUP = (
    "base_config",
    "overrides",
    "budget_tokens",
    "seeds",
    "eval_tasks",
    "eval_samples",
    "eval_temperature",
    "eval_seed",
    "eval_greedy",
    "gate",
)
#: What a setup field was before the JSON recorded it (pages written before ``eval_greedy`` existed).
SETUP_DEFAULTS = {"eval_greedy": False}


def _spelled_now(item: str) -> str:
    """An override as today's config spells it: a field of a section that moved
    (``config.run.MOVED_SECTIONS``, e.g. ``rtpo.siblings=4``) under its new place
    (``train.trainer_params.siblings=4``), as loading the config reads it."""
    from horizonrl.config.run import MOVED_SECTIONS

    section, dot, rest = item.partition(".")
    if dot and section in MOVED_SECTIONS:
        return f"{MOVED_SECTIONS[section][0]}.{rest}"
    return item


#: Overrides that restate what an earlier declaration got without them: a group arm of a base config
#: whose trainer takes parameters clears them; before ``train.trainer_params`` existed those parameters
#: lived in their own section (``rtpo:``), which other trainers ignored.
_NO_OPS = frozenset({"train.trainer_params={}"})


def _stale(paper: Paper, old_arms: dict[str, Any]) -> list[str]:
    """Earlier arms whose declaration is gone or whose overrides changed (a moved section's spelling, or
    an override of :data:`_NO_OPS`, is not a change)."""
    arms = {a.name: a for a in paper.arms}

    def norm(items) -> list[str]:
        return [_spelled_now(o) for o in items if o not in _NO_OPS]

    return [
        n for n, a in old_arms.items() if n not in arms or norm(a["overrides"]) != norm(arms[n].overrides)
    ]


def _start(res: dict[str, Any], scenario: str) -> list | None:
    """The start evaluation's per-task outcomes of ``scenario``'s warm start in ``res`` (None if absent)."""
    for a in res["arms"].values():
        if a["scenario"] == scenario and a.get("start"):
            return a["start"]["per_task"]
    return None


def carry_over(
    res: dict[str, Any],
    previous: dict[str, Any],
    paper: Paper,
    *,
    keys: dict[str, str],
    fallback_commit: str | None = None,
) -> list[str]:
    """Copy into ``res`` the scenarios and arms of ``previous`` (the earlier JSON) this run did not run.

    ``keys``: the current declaration's warm-start key of each scenario that did not run (an earlier page
    that did not record its key is carried with ``key_checked: false``). ``fallback_commit``: the commit
    that last wrote the earlier JSON, for a page without provenance. Returns why each scenario or arm that
    could not be carried was not.
    """
    ran = set(res["warm_starts"])
    old = previous.get("warm_starts") or {}
    todo = [s for s in paper.scenario_names() if s not in ran and s in old]
    declared = {a.name for a in paper.arms}
    left = {
        n: a
        for n, a in previous.get("arms", {}).items()
        if a["scenario"] in ran and n not in res["arms"] and n in declared
    }
    if not todo and not left:
        return []
    if previous.get("paper") != res["paper"]:
        return [f"the earlier page is of paper {previous.get('paper')!r}"]
    changed = [
        k
        for k in CARRY_SETUP
        if previous["setup"].get(k, SETUP_DEFAULTS.get(k)) != res["setup"].get(k, SETUP_DEFAULTS.get(k))
    ]
    if changed:
        return [
            f"scenarios {todo} and arms {sorted(left)} not carried: the setup changed ({', '.join(changed)})"
        ]
    why = []

    def source(s: str, arm: str | None = None) -> dict[str, Any]:
        """Where the earlier page got it: carried there too (the original run), or run there."""
        carried = (previous.get("carried_arms") or {}).get(arm) or (previous.get("carried") or {}).get(s)
        run_there = (previous.get("provenance") or {}).get(s)
        found = carried or run_there or {"commit": fallback_commit, "utc": None}
        return {"commit": found.get("commit"), "utc": found.get("utc")}

    for s in todo:
        old_key = old[s].get("key")
        if old_key is not None and old_key != keys.get(s):
            why.append(f"scenario {s!r} not carried: its warm start's declaration changed")
            continue
        old_arms = {n: a for n, a in previous["arms"].items() if a["scenario"] == s}
        stale = _stale(paper, old_arms)
        if stale:
            why.append(f"scenario {s!r} not carried: arms {stale} changed or were removed")
            continue
        res["warm_starts"][s] = old[s]
        res["checks"] += [c for c in previous.get("checks", []) if c.get("scenario") == s]
        res["arms"].update(old_arms)
        refused = (previous.get("refused_scenarios") or {}).get(s)
        if refused is not None:
            res.setdefault("refused_scenarios", {})[s] = refused
            res["status"] = "partial"
        res.setdefault("carried", {})[s] = {**source(s), "key_checked": old_key is not None}
    for n, a in left.items():
        s = a["scenario"]
        if _stale(paper, {n: a}):
            why.append(f"arm {n!r} not carried: its overrides changed")
        elif old.get(s, {}).get("key") is None or old[s]["key"] != res["warm_starts"][s].get("key"):
            why.append(f"arm {n!r} not carried: scenario {s!r}'s warm start is not the earlier one (key)")
        elif a.get("start") is None or a["start"]["per_task"] != _start(res, s):
            why.append(
                f"arm {n!r} not carried: scenario {s!r}'s warm start scores differently on the held-out "
                "tasks than the earlier one (another model: rerun the arm)"
            )
        else:
            res["arms"][n] = a
            res.setdefault("carried_arms", {})[n] = source(s, n)
    names = paper.scenario_names()
    res["warm_starts"] = {s: res["warm_starts"][s] for s in names if s in res["warm_starts"]}
    res["checks"].sort(key=lambda c: names.index(c["scenario"]) if c.get("scenario") in names else len(names))
    order = {a.name: i for i, a in enumerate(paper.arms)}
    res["arms"] = dict(sorted(res["arms"].items(), key=lambda kv: order.get(kv[0], len(order))))
    res["comparisons"] = compare(paper, res["arms"])
    return why
