"""``horizonrl plot RUN_DIR [RUN_DIR ...]``: learning curves (PNG and SVG) with matplotlib.

Importable for reports::

    from horizonrl.viz.plot import plot_runs, plot_curves, seed_band
    plot_runs(["runs/a", "runs/b"], "out/curves", keys=["reward", "pass@1"])       # out/curves.png, .svg
    plot_curves({"grpo": seed_band(grpo_dirs, "eval/pass@1")}, "out/pass1", ylabel="pass@1")

Panels (``keys``; a raw metric key such as ``"rollout/turns_mean"`` gets a panel of its own):

==============  ==========================================================
``reward``      ``reward/mean`` (training rollouts)
``pass@1``      ``eval/pass@1`` (held-out; only at evaluation steps)
``sessions``    ``rollout/sessions_mean``
``ratio``       ``train/ratio_geomean`` (rollout/train log-prob consistency)
``kl``          ``train/kl`` (KL to the reference), else ``train/kl_rollout_train``
``tokens/s``    ``throughput/tokens_per_s``
``time``        mean seconds per step in each phase (rollout, phase 1, credit, update), one bar per run
==============  ==========================================================

Several runs are overlaid, one colour each, with a legend. Panels no run has
are left out (with a warning).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from horizonrl.train.records.metrics import read_metrics

PANELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "reward": ("reward (train)", ("reward/mean",)),
    "pass@1": ("held-out pass@1", ("eval/pass@1",)),
    "sessions": ("sessions / rollout", ("rollout/sessions_mean",)),
    "ratio": ("rollout/train ratio (geomean)", ("train/ratio_geomean",)),
    "kl": ("KL", ("train/kl", "train/kl_rollout_train")),
    "tokens/s": ("generated tokens / s", ("throughput/tokens_per_s",)),
}
DEFAULT_KEYS = ("reward", "pass@1", "sessions", "ratio", "kl", "tokens/s", "time")
TIME_PHASES = (
    ("time/rollout_s", "rollout"),
    ("time/phase1_s", "phase 1"),
    ("time/credit_s", "credit"),
    ("time/update_s", "update"),
)
# Two-sided 95% Student t quantiles for df = 1..30 (beyond: 1.96).
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)  # fmt: skip

Series = tuple[Sequence[float], Sequence[float], Sequence[float] | None, Sequence[float] | None]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "horizonrl"
    return plt


def metric_series(records: Sequence[dict[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` of ``key`` over the records that have a finite value for it."""
    xs, ys = [], []
    for rec in records:
        v = rec.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            xs.append(float(rec.get("step", len(xs))))
            ys.append(float(v))
    return np.asarray(xs), np.asarray(ys)


def _panel_key(records: Sequence[dict[str, Any]], keys: tuple[str, ...]) -> str | None:
    for k in keys:
        if metric_series(records, k)[0].size:
            return k
    return None


def ema(y: np.ndarray, alpha: float) -> np.ndarray:
    """Exponential moving average ``s_t = alpha * s_{t-1} + (1 - alpha) * y_t`` (``alpha = 0``: none)."""
    if alpha <= 0 or y.size == 0:
        return y
    out = np.empty_like(y)
    acc = y[0]
    for i, v in enumerate(y):
        acc = alpha * acc + (1 - alpha) * v
        out[i] = acc
    return out


def save_figure(fig, out_path: str | Path, formats: Sequence[str] = ("png", "svg")) -> list[Path]:
    """Save ``fig`` as ``out_path.<fmt>`` for each format (an existing suffix of ``out_path`` is replaced)."""
    base = Path(out_path)
    if base.suffix.lstrip(".") in ("png", "svg", "pdf"):
        base = base.with_suffix("")
    base.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        p = base.with_suffix(f".{fmt}")
        meta = {"Date": None} if fmt == "svg" else {"Software": None} if fmt == "png" else None
        fig.savefig(p, format=fmt, dpi=130, bbox_inches="tight", metadata=meta)
        paths.append(p)
    return paths


def draw_curves(ax, series: dict[str, Series], *, colours: dict[str, Any] | None = None) -> None:
    """Draw ``label -> (x, mean, lo, hi)`` on ``ax``: a line per label, a band where lo/hi are given."""
    for i, (label, (x, mean, lo, hi)) in enumerate(series.items()):
        x, mean = np.asarray(x, dtype=float), np.asarray(mean, dtype=float)
        c = (colours or {}).get(label, f"C{i % 10}")
        marker = "o" if x.size <= 12 else None
        ax.plot(x, mean, label=label, color=c, marker=marker, markersize=3, linewidth=1.5)
        if lo is not None and hi is not None:
            lo, hi = np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)
            ax.fill_between(x, lo, hi, color=c, alpha=0.2, linewidth=0)


def plot_curves(
    series: dict[str, Series],
    out_path: str | Path,
    *,
    title: str = "",
    xlabel: str = "step",
    ylabel: str = "",
    formats: Sequence[str] = ("png", "svg"),
    figsize: tuple[float, float] = (5.0, 3.4),
) -> list[Path]:
    """One panel of curves with confidence bands: ``series[label] = (x, mean, lo, hi)``.

    ``lo``/``hi`` may be ``None`` (no band), e.g. from :func:`seed_band`.
    Writes ``out_path.png`` and ``out_path.svg`` (``formats``); returns the paths.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=figsize)
    try:
        draw_curves(ax, series)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if len(series) > 0:
            ax.legend(fontsize=8)
        return save_figure(fig, out_path, formats)
    finally:
        plt.close(fig)


def seed_band(run_dirs: Sequence[str | Path], key: str, *, band: str = "ci95") -> Series:
    """Mean over runs (e.g. seeds) of ``key`` at the steps all of them logged, with a band.

    ``band``: ``"ci95"`` (Student t interval of the mean, ``mean ± t_{0.975,n-1} s / sqrt(n)``),
    ``"std"`` (``mean ± s``), ``"minmax"``, or ``"none"``. One run gives no band.
    """
    per_run = [dict(zip(*metric_series(read_metrics(d), key), strict=True)) for d in run_dirs]
    if not per_run:
        raise ValueError("seed_band needs at least one run directory")
    steps = sorted(set.intersection(*(set(r) for r in per_run)))
    vals = np.asarray([[r[s] for s in steps] for r in per_run])
    mean = vals.mean(axis=0) if steps else np.zeros(0)
    n = len(per_run)
    if band == "none" or n < 2 or not steps:
        return steps, mean, None, None
    if band == "minmax":
        return steps, mean, vals.min(axis=0), vals.max(axis=0)
    sd = vals.std(axis=0, ddof=1)
    if band == "std":
        half = sd
    elif band == "ci95":
        half = (_T95[n - 2] if n - 1 <= len(_T95) else 1.96) * sd / math.sqrt(n)
    else:
        raise ValueError(f"band must be 'ci95', 'std', 'minmax' or 'none', got {band!r}")
    return steps, mean, mean - half, mean + half


def _resolve(key: str) -> tuple[str, tuple[str, ...]]:
    if key in PANELS:
        return PANELS[key]
    for title, keys in PANELS.values():  # a panel's own metric key picks that panel
        if key == keys[0]:
            return title, keys
    return key, (key,)


def plot_runs(
    run_dirs: Sequence[str | Path],
    out_path: str | Path,
    *,
    keys: Sequence[str] | None = None,
    labels: Sequence[str] | None = None,
    formats: Sequence[str] = ("png", "svg"),
    smooth: float = 0.0,
    title: str | None = None,
    ncols: int = 3,
) -> list[Path]:
    """Learning curves of ``run_dirs`` overlaid, one panel per key (module docstring); returns the files.

    ``labels`` name the runs in the legend (default: the directory names);
    ``smooth`` is an EMA factor in ``[0, 1)`` for the per-step curves.
    """
    if not run_dirs:
        raise ValueError("plot_runs needs at least one run directory")
    if not 0 <= smooth < 1:
        raise ValueError(f"smooth must be in [0, 1), got {smooth}")
    runs = [read_metrics(d) for d in run_dirs]
    names = list(labels) if labels is not None else [Path(d).resolve().name for d in run_dirs]
    if len(names) != len(runs):
        raise ValueError(f"got {len(names)} labels for {len(runs)} runs")
    if len(set(names)) < len(names):  # same directory names: add the parent to tell them apart
        names = [f"{Path(d).resolve().parent.name}/{n}" for d, n in zip(run_dirs, names, strict=True)]
    colours = {n: f"C{i % 10}" for i, n in enumerate(names)}
    panels: list[tuple[str, Any]] = []
    for key in keys or DEFAULT_KEYS:
        if key == "time":
            phases = [(k, lab) for k, lab in TIME_PHASES if any(metric_series(r, k)[0].size for r in runs)]
            if phases:
                panels.append(("step time split (mean s / step)", phases))
            else:
                warnings.warn("plot: no run logged time/*_s; the time panel is left out", stacklevel=2)
            continue
        title_k, candidates = _resolve(key)
        series = {}
        for n, recs in zip(names, runs, strict=True):
            k = _panel_key(recs, candidates)
            if k is not None:
                x, y = metric_series(recs, k)
                series[n] = (x, ema(y, smooth) if k != "eval/pass@1" else y, None, None)
        if series:
            panels.append((title_k, series))
        else:
            warnings.warn(
                f"plot: no run logged {' or '.join(candidates)}; panel {key!r} left out", stacklevel=2
            )
    if not panels:
        raise ValueError(f"none of the runs logged any of {list(keys or DEFAULT_KEYS)}")
    plt = _pyplot()
    cols = min(ncols, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.2 * rows), squeeze=False)
    try:
        for ax, (ptitle, data) in zip(axes.flat, panels, strict=False):
            if isinstance(data, list):  # time split: stacked bars, one per run
                bottom = np.zeros(len(names))
                for j, (k, lab) in enumerate(data):
                    vals = [metric_series(r, k)[1] for r in runs]
                    means = np.asarray([v.mean() if v.size else 0.0 for v in vals])
                    ax.bar(range(len(names)), means, bottom=bottom, label=lab, color=f"C{(j + 4) % 10}")
                    bottom += means
                ax.set_xticks(range(len(names)), names, rotation=20, fontsize=8)
                ax.set_ylabel("s")
                ax.legend(fontsize=7)
            else:
                draw_curves(ax, data, colours=colours)
                ax.set_xlabel("step")
                ax.ticklabel_format(axis="y", useOffset=False)
            ax.set_title(ptitle, fontsize=10)
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(panels) :]:
            ax.axis("off")
        from matplotlib.lines import Line2D

        handles = [Line2D([], [], color=colours[n], linewidth=2) for n in names]
        fig.legend(handles, names, loc="upper center", ncol=min(len(names), 5), fontsize=9, frameon=False)
        if title:
            fig.suptitle(title, y=1.04)
        fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / (3.2 * rows)))
        return save_figure(fig, out_path, formats)
    finally:
        plt.close(fig)


__all__ = [
    "DEFAULT_KEYS",
    "PANELS",
    "draw_curves",
    "ema",
    "metric_series",
    "plot_curves",
    "plot_runs",
    "save_figure",
    "seed_band",
]
