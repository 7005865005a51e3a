"""A results page's two figures, drawn from its JSON alone: learning curves and paired differences."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def _ci(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and 95% t band over axis 0."""
    mean = values.mean(axis=0)
    if values.shape[0] < 2:
        return mean, mean, mean
    from scipy import stats as st

    half = st.t.ppf(0.975, values.shape[0] - 1) * values.std(axis=0, ddof=1) / np.sqrt(values.shape[0])
    return mean, mean - half, mean + half


def plot_curves(res: dict[str, Any], path: Path) -> None:
    """Held-out pass@1 against generated tokens, per arm: mean over seeds with its 95% t band, from
    the shared start; with greedy evaluations, greedy pass@1 dashed in the same colour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for a in res["arms"].values():
        seeds = a["seeds"]
        if not seeds or a["start"] is None:
            continue
        n = min(len(s["curve"]) for s in seeds)
        ys = np.array([[a["start"]["pass@1"]] + [p["pass@1"] for p in s["curve"][:n]] for s in seeds])
        xs = np.array([[0] + [p["gen_tokens"] for p in s["curve"][:n]] for s in seeds]).mean(axis=0)
        m, lo, hi = _ci(ys)
        (line,) = ax.plot(xs, m, marker="o", label=a["label"])
        ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15)
        greedy = [[p.get("pass@1_greedy") for p in s["curve"][:n]] for s in seeds]
        if a["start"].get("pass@1_greedy") is not None and all(None not in g for g in greedy):
            g = np.array([[a["start"]["pass@1_greedy"], *row] for row in greedy]).mean(axis=0)
            ax.plot(xs, g, marker="s", ls="--", color=line.get_color(), label=f"{a['label']} (greedy)")
    ax.set_xlabel("generated tokens")
    ax.set_ylabel("held-out pass@1")
    ax.set_title(f"{res['paper']}: mean over seeds, 95% t band")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_diffs(res: dict[str, Any], path: Path) -> None:
    """Each comparison's per-seed differences of end pass@1, with its t-interval and task bootstrap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    comps = res["comparisons"]
    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.55 * max(1, len(comps))))
    for i, c in enumerate(comps):
        t, b = c["t"], c["bootstrap"]
        ax.scatter(c["diffs"], [i] * len(c["diffs"]), color="gray", s=14, zorder=3)
        ax.errorbar(
            t["mean"],
            i + 0.18,
            xerr=[[t["mean"] - t["lo"]], [t["hi"] - t["mean"]]],
            fmt="o",
            color="C0",
            capsize=3,
            label="95% t-CI (seeds)" if i == 0 else None,
        )
        ax.errorbar(
            b["mean"],
            i - 0.18,
            xerr=[[b["mean"] - b["lo"]], [b["hi"] - b["mean"]]],
            fmt="s",
            color="C1",
            capsize=3,
            label="task bootstrap" if i == 0 else None,
        )
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(range(len(comps)), [f"{c['arm']} − {c['baseline']}" for c in comps], fontsize=8)
    ax.set_xlabel("Δ end pass@1 (paired by seed)")
    ax.grid(alpha=0.3, axis="x")
    if comps:
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
