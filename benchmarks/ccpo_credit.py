"""Cost of ``contextual_credit`` (vectorized) vs a straightforward per-step loop reference.

The reference, :func:`reference_contextual_credit`, is an independent, literal
implementation of docs/spec/ccpo.md: it deduplicates rows with a dict, builds the
trajectory summary with Python sets and integer floor division, removes
principal directions with an SVD, and for every step collects its peers,
bandwidth (cached per bucket), kernel weights and per-trajectory aggregates in
plain loops. The tests use it to check the vectorized version on random batches.

Default problem: the paper's batch of 16 tasks x 8 rollouts x 50 steps with
1,536-dim hidden states (Qwen2.5-1.5B width). Hidden states are anisotropic by
default (a few dominant directions plus noise, like LLM residual streams);
``--isotropic`` uses pure Gaussian noise, the worst case for the top-3 PCA::

    python benchmarks/ccpo_credit.py
    python benchmarks/ccpo_credit.py --isotropic --repeats 3
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections import defaultdict

import numpy as np

from horizonrl.credit.ccpo import ContextualCredit, contextual_credit
from horizonrl.credit.ccpo_features import StepBatch


def _nu(v: np.ndarray) -> np.ndarray:
    return v / max(float(np.linalg.norm(v)), 1e-9)


def _z(values: list[float]) -> list[float]:
    """Sample-std standardization with +1e-6; fewer than 2 values or all equal => zeros."""
    if len(values) < 2 or max(values) == min(values):
        return [0.0] * len(values)
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return [(v - mean) / (std + 1e-6) for v in values]


def reference_contextual_credit(
    steps: StepBatch,
    hidden: np.ndarray | None,
    *,
    gamma: float = 0.95,
    horizon: int = 2,
    kernel_scale: float = 0.15,
    eta: float = 0.1,
    final_standardize: bool = True,
    episode_weight: float = 0.0,
    kernel: str = "exp",
    summary_weight: float = 1.0,
    exclude_self: bool = True,
    history_weight: float = 1.0,
    future_weight: float = 1.0,
    features: np.ndarray | None = None,
) -> ContextualCredit:
    """Per-step loop implementation of docs/spec/ccpo.md (pass ``features`` to skip the feature map)."""
    n_rows = len(steps)
    keys = [
        (repr(steps.task_ids[k]), repr(steps.trajectory_ids[k]), int(steps.steps[k])) for k in range(n_rows)
    ]
    rows_of: dict[tuple, list[int]] = defaultdict(list)
    for k, key in enumerate(keys):
        rows_of[key].append(k)
    uniq = list(rows_of)
    pos = {key: u for u, key in enumerate(uniq)}
    first = [rows_of[key][0] for key in uniq]
    task = [key[0] for key in uniq]
    traj = [(key[0], key[1]) for key in uniq]
    t_of = [key[2] for key in uniq]
    obs = [steps.observations[k] for k in first]
    big_t = [int(steps.lengths[k]) for k in first]
    reward = [float(steps.rewards[k]) for k in first]
    invalid = [bool(steps.invalid[k]) for k in first]
    n = len(uniq)

    if features is not None:
        phi = np.array([np.mean(features[rows_of[key]], axis=0) for key in uniq])
    else:
        h = np.array([np.mean(np.asarray(hidden, dtype=np.float64)[rows_of[key]], axis=0) for key in uniq])
        if n >= 2:
            h = h - h.mean(axis=0)
        if n >= 4:
            _, _, vt = np.linalg.svd(h, full_matrices=False)
            h = h - (h @ vt[:3].T) @ vt[:3]
        scale = max(float(np.linalg.norm(row)) for row in np.asarray(hidden, dtype=np.float64))
        h[np.linalg.norm(h, axis=1) <= 1e-10 * scale] = 0.0  # rounding-level residuals are exact zeros
        phi_rows = []
        for u in range(n):
            prefix = [obs[v] for v in range(n) if traj[v] == traj[u] and t_of[v] <= t_of[u]]
            earlier = {obs[v] for v in range(n) if traj[v] == traj[u] and t_of[v] < t_of[u]}
            distinct, t = len(set(prefix)), t_of[u]
            counts = [min(12 * t // 30, 12), min(12 * distinct // 25, 12), min(12 * distinct // (t + 1), 12)]
            c = [1.0 if k < cnt else 0.0 for cnt in counts for k in range(12)]
            c.append(1.0 if obs[u] in earlier else 0.0)
            phi_rows.append(_nu(np.concatenate([_nu(h[u]), summary_weight * _nu(np.array(c))])))
        phi = np.array(phi_rows)

    y = [gamma ** (big_t[u] - 1 - t_of[u]) * reward[u] - eta * invalid[u] for u in range(n)]
    z = [gamma ** (big_t[u] - t_of[u]) * reward[u] for u in range(n)]
    medians: dict[tuple, float] = {}

    def bucket_median(bucket_key: tuple, members: list[int]) -> float:
        if bucket_key not in medians:
            dists: list[float] = []
            for a_pos, a in enumerate(members):
                later = members[a_pos + 1 :]
                if later:
                    dists.extend(np.linalg.norm(phi[later] - phi[a], axis=1).tolist())
            m = statistics.median(dists) if dists else 1.0
            medians[bucket_key] = m if m > 1e-9 else 1.0
        return medians[bucket_key]

    readout: list[tuple[float, float] | None] = []
    fallback = [False] * n
    for q in range(n):
        same_task = [p for p in range(n) if task[p] == task[q]]
        exact = [p for p in same_task if obs[p] == obs[q] and (traj[p] != traj[q] or not exclude_self)]
        if exact:
            peers, bucket_key = exact, (task[q], obs[q])
            bucket = [p for p in same_task if obs[p] == obs[q]]
        else:
            peers, bucket_key, bucket = [p for p in same_task if traj[p] != traj[q]], (task[q],), same_task
            fallback[q] = bool(peers)
        if not peers:
            readout.append(None)
            continue
        tau = kernel_scale * bucket_median(bucket_key, bucket)
        mass: dict[tuple, float] = defaultdict(float)
        sums: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for p in peers:
            if kernel == "exp":
                w = math.exp(-float(np.linalg.norm(phi[q] - phi[p])) / tau)
            elif kernel == "cosine":
                w = max(float(phi[q] @ phi[p]), 0.0)
            else:
                w = 1.0
            mass[traj[p]] += w
            sums[traj[p]][0] += w * y[p]
            sums[traj[p]][1] += w * z[p]
        total = max(sum(mass.values()), 1e-12)
        readout.append(
            tuple(sum(mass[j] * sums[j][k] / max(mass[j], 1e-12) for j in mass) / total for k in (0, 1))
        )

    sup = [r is not None for r in readout]
    c_hist = [y[u] - readout[u][0] if sup[u] else 0.0 for u in range(n)]
    value = [readout[u][1] if sup[u] else None for u in range(n)]
    dv: list[float | None] = []
    for u in range(n):
        t_plus = min(t_of[u] + horizon, big_t[u])
        if t_plus == big_t[u]:
            end = reward[u]
        else:
            other = pos.get((traj[u][0], traj[u][1], t_plus))
            end = value[other] if other is not None else None
        dv.append(end - value[u] if end is not None and value[u] is not None else None)
    c_fut = [0.0] * n
    for x in set(task):
        members = [u for u in range(n) if task[u] == x and dv[u] is not None]
        for u, val in zip(members, _z([dv[u] for u in members]), strict=True):
            c_fut[u] = val
    c_hist = [history_weight * v for v in c_hist]
    c_fut = [future_weight * v for v in c_fut]

    restored = [pos[key] for key in keys]  # unique index of every input row
    a_hist, a_fut, episode = [0.0] * n, [0.0] * n, [0.0] * n
    for x in set(task):
        rows = [u for u in restored if task[u] == x]
        eps_vals = _z([reward[u] - eta * invalid[u] for u in rows])
        for u, val in zip(rows, eps_vals, strict=True):
            episode[u] = val
        srows = [u for u in rows if sup[u]]
        if not final_standardize:
            for u in srows:
                a_hist[u], a_fut[u] = c_hist[u], c_fut[u]
            continue
        if len(srows) < 2 or (len({c_hist[u] for u in srows}) == 1 and len({c_fut[u] for u in srows}) == 1):
            continue
        mu_h = sum(c_hist[u] for u in srows) / len(srows)
        mu_f = sum(c_fut[u] for u in srows) / len(srows)
        tot = [c_hist[u] + c_fut[u] for u in srows]
        sigma = math.sqrt(sum((v - mu_h - mu_f) ** 2 for v in tot) / (len(srows) - 1)) + 1e-6
        for u in srows:
            a_hist[u], a_fut[u] = (c_hist[u] - mu_h) / sigma, (c_fut[u] - mu_f) / sigma

    def out(vals: list) -> np.ndarray:
        return np.array([vals[u] for u in restored])

    adv = [a_hist[u] + a_fut[u] + episode_weight * episode[u] for u in range(n)]
    return ContextualCredit(
        advantage=out(adv),
        historical=out(a_hist),
        future=out(a_fut),
        supported=out(sup).astype(bool),
        fallback=out(fallback).astype(bool),
        episode=out(episode),
    )


def make_batch(
    tasks: int,
    rollouts: int,
    steps: int,
    dim: int,
    *,
    isotropic: bool = False,
    variable_length: bool = False,
    seed: int = 0,
) -> tuple[StepBatch, np.ndarray]:
    """Random walks over 40 observations per task (revisits, shared states), R in {0, 10}, 10% invalid.

    Every rollout has ``steps`` steps, or a length drawn in ``[steps/2, steps]``
    with ``variable_length``.
    """
    rng = np.random.default_rng(seed)
    cols: dict[str, list] = defaultdict(list)
    for x in range(tasks):
        for j in range(rollouts):
            length = int(rng.integers(max(1, steps // 2), steps + 1)) if variable_length else steps
            outcome, state = float(rng.choice([0.0, 10.0])), 0
            for t in range(length):
                for k, v in zip(
                    ("task_ids", "trajectory_ids", "steps", "lengths", "observations", "rewards", "invalid"),
                    (f"task{x}", j, t, length, f"room {state}", outcome, bool(rng.random() < 0.1)),
                    strict=True,
                ):
                    cols[k].append(v)
                state = int(np.clip(state + rng.integers(-1, 3), 0, 39))
    batch = StepBatch(**cols)
    noise = rng.standard_normal((len(batch), dim))
    if isotropic:
        return batch, noise
    scales = np.array([40.0, 25.0, 15.0, 6.0, 4.0, 3.0, 2.0, 1.5])
    return batch, noise + (rng.standard_normal((len(batch), 8)) * scales) @ rng.standard_normal((8, dim))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=16)
    p.add_argument("--rollouts", type=int, default=8)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--variable-length", action="store_true", help="rollout lengths drawn in [steps/2, steps]")
    p.add_argument("--dim", type=int, default=1536)
    p.add_argument("--isotropic", action="store_true")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--reference-repeats", type=int, default=1)
    args = p.parse_args()
    batch, hidden = make_batch(
        args.tasks,
        args.rollouts,
        args.steps,
        args.dim,
        isotropic=args.isotropic,
        variable_length=args.variable_length,
    )
    contextual_credit(batch, hidden)  # warm-up (allocations, BLAS threads)

    def timed(fn, repeats: int) -> tuple[float, ContextualCredit]:
        times, result = [], None
        for _ in range(repeats):
            start = time.perf_counter()
            result = fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times), result

    fast_s, fast = timed(lambda: contextual_credit(batch, hidden), args.repeats)
    ref_s, ref = timed(lambda: reference_contextual_credit(batch, hidden), args.reference_repeats)
    diff = float(np.max(np.abs(fast.advantage - ref.advantage)))
    print(
        f"batch: {args.tasks} tasks x {args.rollouts} rollouts, {len(batch)} step rows, dim {args.dim}, "
        f"{'isotropic' if args.isotropic else 'anisotropic'} states; supported {fast.supported.mean():.1%}, "
        f"task fallback {fast.fallback.mean():.1%}"
    )
    print(f"{'implementation':<28}{'seconds':>10}{'ms/step':>10}")
    print(f"{'contextual_credit':<28}{fast_s:>10.3f}{1e3 * fast_s / len(batch):>10.3f}")
    print(f"{'per-step loop reference':<28}{ref_s:>10.3f}{1e3 * ref_s / len(batch):>10.3f}")
    print(
        f"speed-up (reference / vectorized): {ref_s / fast_s:.1f}x; max |advantage difference| = {diff:.2e}"
    )


if __name__ == "__main__":
    main()
