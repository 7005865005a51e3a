"""CCPO step batches and context features (docs/spec/ccpo.md, "Context features"; paper App. C.1).

A :class:`StepBatch` holds one row per agent step (decision) ``(i, t)``: the task,
the trajectory, the step index ``t``, the trajectory length ``T_i`` (number of
actions), the observation ``o_{i,t}`` the decision was taken after, the
trajectory's terminal outcome ``R_i`` and whether the action was invalid.
:func:`step_batch_from_groups` builds one from rollouts and
:func:`broadcast_steps` spreads per-step values back over response tokens.

The context feature of a step fuses the frozen model's hidden state ``h_{i,t}``
with a 37-dim trajectory summary ``c_{i,t}``::

    phi_{i,t} = nu([ nu(P_perp3 (h_{i,t} - mean h)) ; w_c * nu(c_{i,t}) ])      (paper Eq. 9)
    nu(v) = v / max(||v||_2, 1e-9)

with ``P_perp3`` removing the 3 leading principal directions of the centered
states of the batch's unique steps (skipped with 2-3 unique steps; a single
step uses its raw state) and ``w_c = 1`` (``0`` is the paper's "w/o context
summary" ablation).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from horizonrl.credit.broadcast import broadcast_turn_values
from horizonrl.trajectory import Group, Rollout, TokenAdvantages
from horizonrl.vocab import ObsKey

THERMOMETER_DIMS = 12
STEP_BOUND = 30  # elapsed steps t
DISTINCT_BOUND = 25  # distinct-observation count n_{i,t}
SUMMARY_DIMS = 3 * THERMOMETER_DIMS + 1  # + revisit bit = 37
NORM_FLOOR = 1e-9
ROUNDING_TOL = 1e-10  # hidden-block rows below this x max state norm are rounding noise


@dataclass(frozen=True, eq=False)
class StepBatch:
    """One row per step; all fields are 1-D arrays of equal length (coerced on construction).

    ``task_ids``/``trajectory_ids``: any hashable ids (a trajectory is identified by
    the pair ``(task_id, trajectory_id)``); ``steps``: ``t`` in ``[0, lengths)``;
    ``lengths``: ``T_i``, the number of actions of the trajectory; ``observations``:
    ``o_{i,t}`` as a string (peers match it exactly); ``rewards``: the trajectory's
    terminal outcome ``R_i`` repeated on each of its rows; ``invalid``: whether
    ``a_{i,t}`` was invalid.
    """

    task_ids: Any
    trajectory_ids: Any
    steps: Any
    lengths: Any
    observations: Any
    rewards: Any
    invalid: Any

    def __post_init__(self) -> None:
        def obj(x: Any) -> np.ndarray:
            out = np.empty(len(x), dtype=object)
            out[:] = [v.item() if isinstance(v, np.generic) else v for v in x]  # numpy scalars -> Python
            return out

        fields = {
            "task_ids": obj(self.task_ids),
            "trajectory_ids": obj(self.trajectory_ids),
            "steps": np.asarray(self.steps, dtype=np.int64).reshape(-1),
            "lengths": np.asarray(self.lengths, dtype=np.int64).reshape(-1),
            "observations": obj(self.observations),
            "rewards": np.asarray(self.rewards, dtype=np.float64).reshape(-1),
            "invalid": np.asarray(self.invalid, dtype=bool).reshape(-1),
        }
        sizes = {k: len(v) for k, v in fields.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"StepBatch fields have different lengths: {sizes}")
        for k, v in fields.items():
            object.__setattr__(self, k, v)
        if not all(isinstance(o, str) for o in self.observations):
            raise TypeError("StepBatch.observations must all be strings (matched by exact equality)")
        if not np.all(np.isfinite(self.rewards)):
            raise ValueError("StepBatch.rewards must be finite")
        if np.any(self.steps < 0) or np.any(self.steps >= self.lengths):
            raise ValueError("StepBatch needs 0 <= steps < lengths on every row")

    def __len__(self) -> int:
        return len(self.steps)

    def take(self, index: np.ndarray) -> StepBatch:
        """The rows ``index`` (an integer array), in that order."""
        return StepBatch(**{k: getattr(self, k)[index] for k in STEP_FIELDS})


STEP_FIELDS = ("task_ids", "trajectory_ids", "steps", "lengths", "observations", "rewards", "invalid")


def factorize(values: Sequence[Any] | np.ndarray) -> np.ndarray:
    """Integer codes of ``values``, numbered in ``repr`` order (so independent of row order)."""
    uniques = sorted(set(values), key=repr)
    index = {v: i for i, v in enumerate(uniques)}
    return np.fromiter((index[v] for v in values), dtype=np.int64, count=len(values))


def trajectory_codes(steps: StepBatch) -> tuple[np.ndarray, np.ndarray]:
    """``(task_codes, trajectory_codes)``; trajectory codes number ``(task, trajectory)`` pairs."""
    task = factorize(steps.task_ids)
    pairs = list(zip(task.tolist(), steps.trajectory_ids.tolist(), strict=True))
    return task, factorize(pairs)


def unique_steps(steps: StepBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Identical step rows (same task, trajectory and step) merged: ``(first, inverse, counts)``.

    ``first``: one representative input row per unique step, in a canonical order
    that does not depend on the input order; ``inverse``: the unique step of every
    input row; ``counts``: copies per unique step. Copies must agree on every
    field, and a trajectory's rows on its length and reward (``ValueError``).
    """
    task, traj = trajectory_codes(steps)
    key = np.stack([task, traj, steps.steps], axis=1)
    _, first, inverse, counts = np.unique(
        key, axis=0, return_index=True, return_inverse=True, return_counts=True
    )
    inverse = inverse.reshape(-1)
    obs = factorize(steps.observations)
    for name, col in (("observations", obs), ("lengths", steps.lengths), ("rewards", steps.rewards)):
        if np.any(col != col[first][inverse]):
            raise ValueError(f"rows of the same (task, trajectory, step) disagree on {name}")
    if np.any(steps.invalid != steps.invalid[first][inverse]):
        raise ValueError("rows of the same (task, trajectory, step) disagree on invalid")
    for name, col in (("lengths", steps.lengths), ("rewards", steps.rewards)):
        ref = np.zeros(traj.max() + 1, dtype=col.dtype)
        ref[traj] = col
        if np.any(ref[traj] != col):
            raise ValueError(f"rows of one trajectory disagree on {name}")
    return first, inverse, counts


def merge_duplicates(x: np.ndarray, first: np.ndarray, inverse: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per unique step, its copies' rows of ``x`` (their mean; copies must be close)."""
    x = np.asarray(x, dtype=np.float64)
    if len(x) != len(inverse):
        raise ValueError(f"hidden states/features must have {len(inverse)} rows, got shape {x.shape}")
    if counts.max(initial=1) == 1 or np.array_equal(x, x[first][inverse]):
        return x[first]
    order = np.argsort(inverse, kind="stable")
    merged = np.add.reduceat(x[order], np.r_[0, np.cumsum(counts)[:-1]], axis=0) / counts[:, None]
    if not np.allclose(x, merged[inverse], rtol=1e-5, atol=1e-6):
        raise ValueError("duplicated step rows have different hidden states/features")
    return merged


# ----------------------------------------------------------------- rollouts <-> step rows


def _prompt_key(turn: Any) -> str:
    return "prompt:" + hashlib.sha1(np.asarray(turn.prompt_ids, dtype=np.int64).tobytes()).hexdigest()


#: :class:`~horizonrl.vocab.ObsKey` (an estimator's ``obs_key``) -> :func:`prompt_observations` mode
OBS_KEYS = {ObsKey.TEXT.value: "text", ObsKey.STATE.value: "prompt", ObsKey.TURN.value: "turn"}


def observation_mode(obs_key: str) -> str:
    """The :func:`prompt_observations` mode of an estimator's ``obs_key`` (text | state | turn)."""
    if obs_key not in OBS_KEYS:
        raise ValueError(f"obs_key must be one of {sorted(OBS_KEYS)}, got {obs_key!r}")
    return OBS_KEYS[obs_key]


def prompt_observations(rollout: Rollout, *, mode: str = "prompt") -> list[str]:
    """The observation each turn of ``rollout`` was decided on, in rollout order.

    ``mode="text"``: the observation *text* the policy saw (the paper's setting: Eq. 2
    matches ``o_{j,s} = o_{i,t}`` by exact string equality, so identical text with
    different hidden progress shares a key): turn ``t > 0`` takes the previous turn's
    observation text, the first turn ``rollout.env["initial_obs_text"]`` (recorded by the
    step-wise agent) or a digest of its prompt ids.

    ``mode="prompt"`` (the ``state`` key): the state shown at the end of the turn's prompt,
    i.e. ``o_{i,t}`` of docs/spec/ccpo.md. The agent loop stores on each turn the key
    of the state *after* its action (``Turn.obs_key`` is the environment's reply),
    so turn ``t > 0`` takes the previous turn's ``obs_key`` (or, without one, its
    observation text); the first turn takes ``rollout.env["initial_obs_key"]`` when the
    agent recorded it (the environment's key of the reset state, so a later return to
    that state matches it), else a digest of its prompt ids (identical prompts give
    identical keys).
    ``mode="turn"``: each turn's own ``obs_key`` (for data whose keys already
    describe the prompt-side state); turns without one fall back to the above.
    """
    turns = rollout.turns
    if mode not in ("prompt", "turn", "text"):
        raise ValueError(f"observation mode must be 'prompt', 'turn' or 'text', got {mode!r}")
    out: list[str] = []
    for k, turn in enumerate(turns):
        prev = turns[k - 1] if k else None
        if mode == "text":
            if prev is not None:
                out.append("text:" + (prev.observation or "").strip())
            elif rollout.env.get("initial_obs_text") is not None:
                out.append("text:" + rollout.env["initial_obs_text"].strip())
            else:
                out.append(_prompt_key(turn))
        elif mode == "turn" and turn.obs_key is not None:
            out.append(turn.obs_key)
        elif prev is not None and prev.obs_key is not None:
            out.append(prev.obs_key)
        elif prev is not None and prev.observation is not None:
            out.append("text:" + prev.observation)
        elif prev is None and rollout.env.get("initial_obs_key") is not None:
            out.append(rollout.env["initial_obs_key"])  # the env's key of the reset state (stepwise agent)
        else:
            out.append(_prompt_key(turn))
    return out


def step_batch_from_groups(groups: Sequence[Group], *, observation: str = "prompt") -> StepBatch:
    """One row per turn, rollouts in ``[r for g in groups for r in g.rollouts]`` order, turns in order.

    ``task_ids`` = the group's position in ``groups`` (peers never cross groups),
    ``trajectory_ids`` = the rollout's position in the flattened list, ``steps`` =
    turn index over all segments, ``lengths`` = ``rollout.num_turns``,
    ``observations`` = :func:`prompt_observations` (``observation`` is its mode),
    ``rewards`` = ``rollout.reward``, ``invalid`` = ``turn.invalid``.
    """
    cols: dict[str, list[Any]] = {k: [] for k in STEP_FIELDS}
    traj = 0
    for g_index, group in enumerate(groups):
        for rollout in group.rollouts:
            turns = rollout.turns
            obs = prompt_observations(rollout, mode=observation)
            for t, turn in enumerate(turns):
                cols["task_ids"].append(g_index)
                cols["trajectory_ids"].append(traj)
                cols["steps"].append(t)
                cols["lengths"].append(len(turns))
                cols["observations"].append(obs[t])
                cols["rewards"].append(float(rollout.reward))
                cols["invalid"].append(bool(turn.invalid))
            traj += 1
    return StepBatch(**cols)


def broadcast_steps(groups: Sequence[Group] | Sequence[Rollout], values: np.ndarray) -> TokenAdvantages:
    """Every response token of turn ``k`` gets ``values[k]`` (rows of :func:`step_batch_from_groups`)."""
    return broadcast_turn_values(groups, values)


# ----------------------------------------------------------------- trajectory summary


def thermometer(
    numerator: np.ndarray, denominator: np.ndarray | float, dims: int = THERMOMETER_DIMS
) -> np.ndarray:
    """Thermometer code of ``v/b = numerator/denominator``: the first ``floor(dims*clip(v/b, 0, 1))`` are 1.

    Computed as ``floor(dims * clip(num, 0, den) / den)`` so integer ratios such
    as ``1/3`` do not lose a unit to rounding (App. C.1).
    """
    num = np.asarray(numerator, dtype=np.float64)
    den = np.broadcast_to(np.asarray(denominator, dtype=np.float64), num.shape)
    count = np.floor(dims * np.clip(num, 0.0, den) / den)
    return (np.arange(dims) < count[..., None]).astype(np.float64)


def trajectory_summary(steps: StepBatch) -> np.ndarray:
    """``c_{i,t}`` [N, 37]: thermometers of ``t``, ``n_{i,t}``, ``n_{i,t}/(t+1)`` (bounds 30, 25, 1), revisit.

    ``n_{i,t} = |{o_{i,0..t}}|`` counts the distinct observations among the
    trajectory's rows with step ``<= t``; the revisit bit says ``o_{i,t}``
    appeared at an earlier step of the same trajectory. Rows must be unique
    steps (:func:`~horizonrl.credit.ccpo.contextual_credit` deduplicates first).
    """
    n_rows = len(steps)
    _, traj = trajectory_codes(steps)
    obs = factorize(steps.observations)
    order = np.lexsort((steps.steps, traj))  # by trajectory, then step
    traj_s, obs_s = traj[order], obs[order]
    first = np.zeros(n_rows, dtype=bool)
    _, first_idx = np.unique(np.stack([traj_s, obs_s], axis=1), axis=0, return_index=True)
    first[first_idx] = True  # earliest step of each (trajectory, observation)
    cum = np.cumsum(first)
    starts = np.r_[0, np.flatnonzero(np.diff(traj_s)) + 1] if n_rows else np.zeros(0, np.int64)
    before = np.repeat(cum[starts] - first[starts], np.diff(np.r_[starts, n_rows]))
    distinct = np.empty(n_rows, dtype=np.float64)
    revisit = np.empty(n_rows, dtype=np.float64)
    distinct[order] = cum - before
    revisit[order] = ~first
    t = steps.steps.astype(np.float64)
    return np.concatenate(
        [
            thermometer(t, STEP_BOUND),
            thermometer(distinct, DISTINCT_BOUND),
            thermometer(distinct, t + 1.0),
            revisit[:, None],
        ],
        axis=1,
    )


# ----------------------------------------------------------------- hidden-state block


def row_norms(v: np.ndarray) -> np.ndarray:
    """Euclidean norm of each row of a 2-D array."""
    return np.sqrt(np.einsum("ij,ij->i", v, v))


def l2_normalize(v: np.ndarray) -> np.ndarray:
    """``nu(v) = v / max(||v||_2, 1e-9)`` row-wise (2-D)."""
    return v / np.maximum(row_norms(v), NORM_FLOOR)[:, None]


def _top_directions_exact(x: np.ndarray, k: int) -> np.ndarray:
    """Top-``k`` right singular vectors of ``x`` from an eigendecomposition of the smaller Gram matrix."""
    if x.shape[0] >= x.shape[1]:
        vals, vecs = np.linalg.eigh(x.T @ x)
        keep = vals[::-1][:k] > vals[-1] * 1e-12
        return vecs[:, ::-1][:, :k][:, keep]
    vals, vecs = np.linalg.eigh(x @ x.T)
    vals, vecs = vals[::-1][:k], vecs[:, ::-1][:, :k]
    keep = vals > vals[0] * 1e-12 if vals.size and vals[0] > 0 else np.zeros(len(vals), bool)
    return (x.T @ vecs[:, keep]) / np.sqrt(vals[keep])


def top_principal_directions(
    x: np.ndarray, k: int = 3, *, tol: float = 1e-11, max_iter: int = 60
) -> np.ndarray:
    """Orthonormal [D, <=k] basis of the ``k`` leading principal directions of the (centered) rows ``x``.

    Small problems use an exact eigendecomposition. Large ones run block subspace
    iteration on ``x^T x`` (never formed) with Rayleigh-Ritz until every Ritz
    residual is below ``tol * theta_1``, and fall back to the exact solver when it
    does not converge in ``max_iter`` iterations (nearly flat spectra). Either way
    the result agrees with an SVD to eigensolver accuracy; the projection does not
    depend on singular-vector signs.
    """
    n, d = x.shape
    if min(n, d) <= max(256, 4 * k):
        return _top_directions_exact(x, k)
    b = min(d, n, 4 * k + 8)
    q, _ = np.linalg.qr(x.T @ np.random.default_rng(0).standard_normal((n, b)))
    prev = np.inf
    for it in range(max_iter):
        y = x @ q
        theta, s = np.linalg.eigh(y.T @ y)
        theta, s = theta[::-1], s[:, ::-1]
        if theta[0] <= 0:
            return np.zeros((d, 0))
        ritz = q @ s[:, :k]
        resid = x.T @ (y @ s[:, :k]) - ritz * theta[:k]
        err = float(np.max(np.linalg.norm(resid, axis=0))) / theta[0]
        if err <= tol:
            return ritz[:, theta[:k] > theta[0] * 1e-12]
        # Flat spectrum: the predicted number of further iterations exceeds the budget.
        if it >= 4 and (err >= prev or np.log(tol / err) / np.log(err / prev) > max_iter - it):
            break
        prev = err
        q, _ = np.linalg.qr(x.T @ y)
    return _top_directions_exact(x, k)


def hidden_block(hidden: np.ndarray, n_remove: int = 3) -> np.ndarray:
    """``P_perp3(h - mean h)`` over the given (unique) rows, with the small-batch rules of App. C.1.

    4 or more rows: center and remove the ``n_remove`` leading principal
    directions; 2-3 rows: center only; 1 row: the raw state. Numerical safeguard:
    rows left with a norm at rounding level (``<= 1e-10 x`` the largest state
    norm) are set to exactly 0, so a rank-deficient batch (e.g. 4 unique steps,
    whose centered states span at most 3 directions) gives a zero block instead
    of normalized rounding noise.
    """
    h = np.asarray(hidden, dtype=np.float64)
    if h.shape[0] <= 1:
        return h.copy()
    out = h - h.mean(axis=0)
    if h.shape[0] > 3 and n_remove > 0:
        v = top_principal_directions(out, n_remove)
        out = out - (out @ v) @ v.T
    out[row_norms(out) <= ROUNDING_TOL * float(np.max(row_norms(h)))] = 0.0
    return out


def context_features(steps: StepBatch, hidden: np.ndarray, *, summary_weight: float = 1.0) -> np.ndarray:
    """``phi`` [N, D + 37] of paper Eq. 9 for the rows of ``steps`` (assumed unique steps).

    ``phi = nu([nu(P_perp3(h - mean h)); summary_weight * nu(c)])``; with the
    default weight 1 both blocks count equally. ``summary_weight=0`` is the
    "w/o context summary" ablation (App. B, Table S3).
    """
    h = np.asarray(hidden, dtype=np.float64)
    if h.ndim != 2 or h.shape[0] != len(steps):
        raise ValueError(f"hidden must have shape [{len(steps)}, D], got {h.shape}")
    if not np.all(np.isfinite(h)):
        raise ValueError("hidden states must be finite")
    a = l2_normalize(hidden_block(h))
    c = summary_weight * l2_normalize(trajectory_summary(steps))
    return l2_normalize(np.concatenate([a, c], axis=1))
