"""Statistics of paired comparisons between arms (pure NumPy/SciPy in, floats out).

Every arm runs the same seeds from one warm start with the same task order, and
is evaluated on the same held-out tasks with the same evaluation seed, so arms
are compared *paired*: per seed ``d_s = p_A(s) - p_B(s)``.

- :func:`t_interval` — mean of ``d`` with the two-sided 95 % Student-t interval
  over seeds: ``mean(d) +- t_{0.975, S-1} * sd(d) / sqrt(S)`` (sample sd, ddof=1).
- :func:`wilson_interval` — the 95 % Wilson score interval of one proportion ``k / n`` (a pass@1 on ``n``
  held-out tasks).
- :func:`paired_bootstrap` — percentile interval of the mean paired difference
  when the *tasks* are resampled with replacement (the same resample for every
  seed, since every seed saw the same tasks), which captures the uncertainty of a
  finite held-out set that the seed interval does not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as _st


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided interval and the number of units it is over."""

    mean: float
    lo: float
    hi: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2

    def excludes_zero(self) -> bool:
        return self.lo > 0 or self.hi < 0

    def fmt(self, digits: int = 3) -> str:
        if self.n < 2:
            return f"{self.mean:+.{digits}f} (n={self.n})"
        return f"{self.mean:+.{digits}f} [{self.lo:+.{digits}f}, {self.hi:+.{digits}f}]"


def t_interval(values: Sequence[float], *, level: float = 0.95) -> Interval:
    """Mean of ``values`` with the Student-t interval over them (a single value: the value, no width)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("t_interval needs at least one value")
    m = float(x.mean())
    if x.size < 2:
        return Interval(m, m, m, int(x.size))
    half = float(_st.t.ppf(0.5 + level / 2, df=x.size - 1) * x.std(ddof=1) / np.sqrt(x.size))
    return Interval(m, m - half, m + half, int(x.size))


def paired_bootstrap(
    a: np.ndarray, b: np.ndarray, *, n_boot: int = 2000, level: float = 0.95, seed: int = 0
) -> Interval:
    """Bootstrap interval of ``mean_s mean_t (a[s, t] - b[s, t])`` over tasks ``t``.

    ``a``, ``b``: ``[seeds, tasks]`` per-task success rates of two arms on the same
    tasks. Each bootstrap draw resamples the task columns (the same draw for every
    seed and both arms) and recomputes the mean difference.
    """
    a = np.atleast_2d(np.asarray(a, dtype=np.float64))
    b = np.atleast_2d(np.asarray(b, dtype=np.float64))
    if a.shape != b.shape or a.size == 0:
        raise ValueError(
            f"paired_bootstrap needs equal non-empty [seeds, tasks] arrays, got {a.shape}, {b.shape}"
        )
    d = (a - b).mean(axis=0)  # per task, mean over seeds
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, d.size, size=(n_boot, d.size))
    boots = d[idx].mean(axis=1)
    lo, hi = np.quantile(boots, [0.5 - level / 2, 0.5 + level / 2])
    return Interval(float(d.mean()), float(lo), float(hi), int(d.size))


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample sd (sd 0 for fewer than two values)."""
    x = np.asarray(values, dtype=np.float64)
    return float(x.mean()), float(x.std(ddof=1)) if x.size > 1 else 0.0


def wilson_interval(k: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion ``p = k / n``: ``(centre -+ half)`` with
    ``centre = (p + z^2 / 2n) / (1 + z^2 / n)`` and
    ``half = z sqrt(p (1 - p) / n + z^2 / 4n^2) / (1 + z^2 / n)``, clipped to [0, 1]."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, float(centre - half)), min(1.0, float(centre + half))
