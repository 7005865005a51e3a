"""Did each arm learn? End minus start pass@1 on the same held-out tasks, from the results JSON alone.

The paired comparisons (:func:`horizonrl.reproduce.report.compare`) say which arm ends higher; they
cannot say whether either arm learned. An arm that beats its baseline because the baseline fell below
their shared warm start is a different finding from one that rose above it. For each arm, with
``p_start`` its warm start's held-out pass@1 (one evaluation, shared by every seed) and ``p_end(s)``
seed ``s``'s:

- ``t``: ``mean_s (p_end(s) - p_start)`` with the Student-t interval over seeds
  (:func:`~horizonrl.reproduce.stats.t_interval`); the start is held fixed, so its own sampling noise
  on the held-out tasks is not in this interval;
- ``bootstrap``: the held-out tasks resampled (:func:`~horizonrl.reproduce.stats.paired_bootstrap`, the
  start's per-task rate repeated for every seed), which carries the start's sampling noise but not the
  spread between seeds.

An arm **rose** (or **fell**) only when both intervals exclude 0 on the same side.

Each seed also gets its own ``end(s) - start`` with the task bootstrap of that seed alone
(``per_seed``): whether *every* seed rose, which a mean over seeds cannot say.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from horizonrl.reproduce.stats import Interval, paired_bootstrap, t_interval


def rates(result: dict[str, Any], index: int = -1) -> np.ndarray:
    """Per-task success rate of evaluation ``index`` of a run (``per_task`` counts / ``samples``)."""
    return np.asarray(result["per_task"][index], dtype=np.float64) / max(1, result["samples"] or 1)


def reading(t: Interval, boot: Interval) -> str:
    """``rose`` / ``fell`` when both intervals exclude 0 on that side; otherwise not resolved."""
    if t.n < 2:
        return "one seed: no interval"
    if t.lo > 0 and boot.lo > 0:
        return "rose (both CIs above 0)"
    if t.hi < 0 and boot.hi < 0:
        return "fell (both CIs below 0)"
    return "no change resolved"


def arm_gain(arm: dict[str, Any], eval_samples: int) -> dict[str, Any] | None:
    """``{"start", "t", "bootstrap", "reading"}`` of one arm of a results JSON (module docstring);
    ``None`` without a start evaluation or seeds."""
    start, seeds = arm.get("start"), arm.get("seeds") or []
    if not start or not seeds:
        return None
    ends = np.stack([rates(x) for x in seeds])
    s0 = np.asarray(start["per_task"], dtype=np.float64) / max(1, eval_samples)
    t = t_interval([x["pass@1"] - start["pass@1"] for x in seeds])
    boot = paired_bootstrap(ends, np.broadcast_to(s0, ends.shape))
    per_seed = []
    for x, end in zip(seeds, ends, strict=True):
        b = paired_bootstrap(end[None], s0[None])
        word = "rose" if b.lo > 0 else "fell" if b.hi < 0 else "not resolved"
        per_seed.append({"seed": x.get("seed"), "end": x["pass@1"], "bootstrap": vars(b), "reading": word})
    return {
        "start": start["pass@1"],
        "t": vars(t),
        "bootstrap": vars(boot),
        "reading": reading(t, boot),
        "per_seed": per_seed,
    }


def gains(res: dict[str, Any]) -> dict[str, Any]:
    """:func:`arm_gain` of every arm of a results JSON that has a start evaluation."""
    samples = res["setup"].get("eval_samples") or 1
    out = {name: arm_gain(a, samples) for name, a in res["arms"].items()}
    return {name: g for name, g in out.items() if g is not None}


def gain_table(arm_gains: dict[str, Any]) -> str:
    """The page's table of :func:`gains`' result (``''`` when no arm has a start evaluation)."""
    rows = [
        f"| `{name}` | {g['start']:.3f} | {Interval(**g['t']).fmt()} | "
        f"[{g['bootstrap']['lo']:+.3f}, {g['bootstrap']['hi']:+.3f}] | {g['reading']} |"
        for name, g in arm_gains.items()
    ]
    if not rows:
        return ""
    head = (
        "| arm | start pass@1 | mean end − start [95% t-CI over seeds] | task bootstrap 95% CI | reading |\n"
        "|---|---|---|---|---|"
    )
    seed_rows = [
        f"| `{name}` | {x['seed']} | {x['end']:.3f} | {x['bootstrap']['mean']:+.3f} "
        f"[{x['bootstrap']['lo']:+.3f}, {x['bootstrap']['hi']:+.3f}] | {x['reading']} |"
        for name, g in arm_gains.items()
        for x in g.get("per_seed") or []
    ]
    seed_head = (
        "| arm | seed | end pass@1 | end − start [task bootstrap 95% CI] | reading |\n|---|---|---|---|---|"
    )
    return (
        "\n\nLearning over the warm start (end − start pass@1 on the same held-out tasks; the t-interval "
        "holds the start fixed, the task bootstrap carries its sampling noise; an arm rose or fell only "
        "when both exclude 0):\n\n"
        + "\n".join([head, *rows])
        + (
            "\n\nEach seed on its own (the task bootstrap of that seed's end against the start):\n\n"
            + "\n".join([seed_head, *seed_rows])
            if seed_rows
            else ""
        )
    )
