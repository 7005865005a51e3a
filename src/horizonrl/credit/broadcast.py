"""Spreading per-rollout (or per-session) values over response tokens.

Every estimator returns :data:`~horizonrl.trajectory.TokenAdvantages`: a nested
list ``[rollout][segment][turn] -> np.ndarray`` with one float per response
token, rollouts ordered as ``[r for g in groups for r in g.rollouts]``. The
helpers here build and check that structure so estimators only compute values.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from horizonrl.trajectory import Group, Rollout, TokenAdvantages


def flatten_rollouts(groups_or_rollouts: Sequence[Group] | Sequence[Rollout]) -> list[Rollout]:
    """``[r for g in groups for r in g.rollouts]``; a sequence of rollouts passes through."""
    out: list[Rollout] = []
    for item in groups_or_rollouts:
        if isinstance(item, Group):
            out.extend(item.rollouts)
        elif isinstance(item, Rollout):
            out.append(item)
        else:
            raise TypeError(f"expected Group or Rollout items, got {type(item).__name__}")
    return out


def broadcast_to_tokens(
    groups_or_rollouts: Sequence[Group] | Sequence[Rollout],
    values: Sequence[float | Sequence[float]] | np.ndarray,
) -> TokenAdvantages:
    """Give every response token of rollout ``i`` the value ``values[i]``.

    ``values[i]`` is either a scalar (the same value on every turn of every
    segment: the multi-session broadcasting baseline of docs/spec/baselines.md,
    "Broadcasting") or a sequence with one scalar per segment of rollout ``i``
    (session-dependent advantages, e.g. Mosaic's shaped session advantages).
    Rollouts are taken in the order of :func:`flatten_rollouts`.
    """
    rollouts = flatten_rollouts(groups_or_rollouts)
    if len(values) != len(rollouts):
        raise ValueError(f"got {len(values)} values for {len(rollouts)} rollouts")
    out: list[list[list[np.ndarray]]] = []
    for i, (rollout, value) in enumerate(zip(rollouts, values, strict=True)):
        n_seg = len(rollout.segments)
        per_seg = np.asarray(value, dtype=np.float64)
        if per_seg.ndim == 0:
            per_seg = np.full(n_seg, float(per_seg))
        elif per_seg.shape != (n_seg,):
            raise ValueError(
                f"values[{i}] has shape {per_seg.shape}; expected a scalar or one value per "
                f"segment ({n_seg},)"
            )
        out.append(
            [
                [np.full(t.num_response_tokens, per_seg[s], dtype=np.float64) for t in seg.turns]
                for s, seg in enumerate(rollout.segments)
            ]
        )
    return out


def check_token_advantages(
    groups_or_rollouts: Sequence[Group] | Sequence[Rollout], advantages: TokenAdvantages
) -> None:
    """Raise ``ValueError`` unless ``advantages`` matches the rollouts' segment/turn/token layout."""
    rollouts = flatten_rollouts(groups_or_rollouts)
    if len(advantages) != len(rollouts):
        raise ValueError(f"advantages cover {len(advantages)} rollouts, expected {len(rollouts)}")
    for i, (rollout, adv_r) in enumerate(zip(rollouts, advantages, strict=True)):
        if len(adv_r) != len(rollout.segments):
            raise ValueError(
                f"rollout {i}: advantages cover {len(adv_r)} segments, expected {len(rollout.segments)}"
            )
        for s, (seg, adv_s) in enumerate(zip(rollout.segments, adv_r, strict=True)):
            if len(adv_s) != len(seg.turns):
                raise ValueError(
                    f"rollout {i} segment {s}: advantages cover {len(adv_s)} turns, expected {len(seg.turns)}"
                )
            for t, (turn, adv_t) in enumerate(zip(seg.turns, adv_s, strict=True)):
                shape = np.shape(adv_t)
                if shape != (turn.num_response_tokens,):
                    raise ValueError(
                        f"rollout {i} segment {s} turn {t}: advantages have shape {shape}, "
                        f"expected ({turn.num_response_tokens},)"
                    )


def broadcast_turn_values(
    groups_or_rollouts: Sequence[Group] | Sequence[Rollout], values: Sequence[float] | np.ndarray
) -> TokenAdvantages:
    """Every response token of a turn gets that turn's value.

    ``values`` holds one value per turn, rollouts in flattened order and each
    rollout's turns in ``rollout.turns`` order (segments, then turns).
    """
    rollouts = flatten_rollouts(groups_or_rollouts)
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    n = sum(r.num_turns for r in rollouts)
    if flat.size != n:
        raise ValueError(f"got {flat.size} turn values for {n} turns")
    out: list[list[list[np.ndarray]]] = []
    k = 0
    for rollout in rollouts:
        per_rollout = []
        for seg in rollout.segments:
            per_seg = []
            for turn in seg.turns:
                per_seg.append(np.full(turn.num_response_tokens, flat[k], dtype=np.float64))
                k += 1
            per_rollout.append(per_seg)
        out.append(per_rollout)
    return out
