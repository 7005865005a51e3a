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

The same gain is measured three ways (:data:`MEASURES`) where the evaluations allow: sampled pass@1
(the results JSON's ``gains``), greedy pass@1 (``gains_greedy``, with ``Paper.eval_greedy``) and
pass@k over the k samples per task (``gains_pass@k``, with ``eval_samples > 1``). A policy that only
sharpens (samples more often what greedy decoding already did) raises sampled pass@1 but not greedy
pass@1 or pass@k; one that learns raises greedy pass@1 too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from horizonrl.reproduce.stats import Interval, paired_bootstrap, t_interval


@dataclass(frozen=True)
class Measure:
    """One way of reading held-out success: which per-task counts, how a count becomes a per-task rate
    (``rate``: divided by the samples per task; ``single``: one episode per task, already 0 or 1; ``any``:
    1.0 where some sample succeeded), where the results JSON keeps its gains, its title on the page and
    the opening of its learning table's caption."""

    counts: str
    kind: str
    gains_key: str
    title: str
    intro: str


#: The measures a gain is computed under (module docstring), in page order.
MEASURES = {
    "sampled": Measure(
        "per_task",
        "rate",
        "gains",
        "pass@1",
        "Learning over the warm start (end − start pass@1 on the same held-out tasks",
    ),
    "greedy": Measure(
        "per_task_greedy",
        "single",
        "gains_greedy",
        "greedy pass@1",
        "Learning over the warm start, greedy decoding (end − start of the share of held-out tasks "
        "one greedy episode solves",
    ),
    "pass@k": Measure(
        "per_task",
        "any",
        "gains_pass@k",
        "pass@k",
        "Learning over the warm start, pass@k (end − start of the share of held-out tasks at least "
        "one of the k samples solves",
    ),
}


def rates(result: dict[str, Any], index: int = -1, measure: str = "sampled") -> np.ndarray:
    """Per-task success of evaluation ``index`` of a run under ``measure`` (:class:`Measure`'s kind)."""
    m = MEASURES[measure]
    counts = np.asarray(result[m.counts][index], dtype=np.float64)
    if m.kind == "any":
        return (counts > 0).astype(np.float64)
    return counts if m.kind == "single" else counts / max(1, result["samples"] or 1)


def _measured(result: dict[str, Any], measure: str) -> bool:
    """Whether a run (or start) holds ``measure``: its per-task counts, and k > 1 samples for pass@k."""
    m = MEASURES[measure]
    have = bool(result.get(m.counts)) and result[m.counts][-1] is not None
    return have and (m.kind != "any" or result["samples"] > 1)


def reading(t: Interval, boot: Interval) -> str:
    """``rose`` / ``fell`` when both intervals exclude 0 on that side; otherwise not resolved."""
    if t.n < 2:
        return "one seed: no interval"
    if t.lo > 0 and boot.lo > 0:
        return "rose (both CIs above 0)"
    if t.hi < 0 and boot.hi < 0:
        return "fell (both CIs below 0)"
    return "no change resolved"


def arm_gain(arm: dict[str, Any], eval_samples: int, measure: str = "sampled") -> dict[str, Any] | None:
    """``{"start", "t", "bootstrap", "reading", "per_seed"}`` of one arm of a results JSON under
    ``measure`` (module docstring; each pass rate is the mean of :func:`rates`); ``None`` without a start
    evaluation, seeds, or that measure in all of them."""
    start, seeds = arm.get("start"), arm.get("seeds") or []
    if not start or not seeds:
        return None
    key = MEASURES[measure].counts
    first = {key: [start.get(key)], "samples": eval_samples}
    if not _measured(first, measure) or not all(_measured(x, measure) for x in seeds):
        return None
    ends = np.stack([rates(x, -1, measure) for x in seeds])
    s0 = rates(first, 0, measure)
    t = t_interval([float(end.mean() - s0.mean()) for end in ends])
    boot = paired_bootstrap(ends, np.broadcast_to(s0, ends.shape))
    per_seed = []
    for x, end in zip(seeds, ends, strict=True):
        b = paired_bootstrap(end[None], s0[None])
        word = "rose" if b.lo > 0 else "fell" if b.hi < 0 else "not resolved"
        per_seed.append(
            {"seed": x.get("seed"), "end": float(end.mean()), "bootstrap": vars(b), "reading": word}
        )
    return {
        "start": float(s0.mean()),
        "t": vars(t),
        "bootstrap": vars(boot),
        "reading": reading(t, boot),
        "per_seed": per_seed,
    }


def gains(res: dict[str, Any], measure: str = "sampled") -> dict[str, Any]:
    """:func:`arm_gain` of every arm of a results JSON that has a start evaluation and ``measure``."""
    samples = res["setup"].get("eval_samples") or 1
    out = {name: arm_gain(a, samples, measure) for name, a in res["arms"].items()}
    return {name: g for name, g in out.items() if g is not None}


def all_gains(res: dict[str, Any]) -> dict[str, Any]:
    """``{gains_key: gains(res, measure)}`` for every measure some arm has (sampled always)."""
    out = {}
    for name, m in MEASURES.items():
        g = gains(res, name)
        if g or name == "sampled":
            out[m.gains_key] = g
    return out


def gain_table(arm_gains: dict[str, Any], measure: str = "sampled") -> str:
    """The page's table of :func:`gains`' result under ``measure`` (``''`` when no arm has one)."""
    what = MEASURES[measure].title
    rows = [
        f"| `{name}` | {g['start']:.3f} | {Interval(**g['t']).fmt()} | "
        f"[{g['bootstrap']['lo']:+.3f}, {g['bootstrap']['hi']:+.3f}] | {g['reading']} |"
        for name, g in arm_gains.items()
    ]
    if not rows:
        return ""
    head = (
        f"| arm | start {what} | mean end − start [95% t-CI over seeds] | task bootstrap 95% CI | reading |\n"
        "|---|---|---|---|---|"
    )
    seed_rows = [
        f"| `{name}` | {x['seed']} | {x['end']:.3f} | {x['bootstrap']['mean']:+.3f} "
        f"[{x['bootstrap']['lo']:+.3f}, {x['bootstrap']['hi']:+.3f}] | {x['reading']} |"
        for name, g in arm_gains.items()
        for x in g.get("per_seed") or []
    ]
    seed_head = (
        f"| arm | seed | end {what} | end − start [task bootstrap 95% CI] | reading |\n|---|---|---|---|---|"
    )
    intro = MEASURES[measure].intro
    return (
        f"\n\n{intro}; the t-interval "
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
