"""Dynamic sampling (DAPO, Yu et al. 2025, Sec. 3.2): a step trains only on groups that carry signal.

A group whose rollouts all got the same reward has zero group-relative advantage, so its tokens add
nothing to a GRPO-style update and only dilute the batch. With ``rollout.dynamic_sampling`` the group
trainer draws ``rollout.tasks_per_step`` tasks, keeps the groups whose rewards differ, and draws again
until it holds ``rollout.tasks_per_step`` such groups or has made ``rollout.max_draws`` draws::

    kept = first tasks_per_step of [g for draw in draws for g in draw if len(set(g.rewards)) > 1]

Groups with signal beyond ``tasks_per_step`` are dropped too (as DAPO trims its batch). Every draw's
tokens count in ``train.max_gen_tokens`` (the budgeted engine generates them). A step that reaches the
cap trains on the groups with signal it has; one that found none trains on its last draw as a step
without dynamic sampling would (advantages 0: the update changes nothing through them).

Only the outcome rewards decide: an estimator that adds step-level or shaped credit (GiGPO, Mosaic's
information gain) can find signal in a group whose outcomes tie, which this filter drops.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from horizonrl.trajectory import Group

__all__ = ["Filled", "fill_with_signal", "has_signal"]


def has_signal(group: Group) -> bool:
    """Whether the group's rollouts got at least two different rewards."""
    return len(set(group.rewards)) > 1


@dataclass(frozen=True)
class Filled:
    """What one dynamically sampled step drew and keeps."""

    #: The groups the step trains on.
    kept: list[Group]
    #: Every group drawn, in draw order (the step's rollout metrics and budget read these).
    drawn: list[Group]
    #: Draws made (1 .. max_draws).
    draws: int
    #: Whether the step ended at ``max_draws`` with fewer groups with signal than it wanted.
    capped: bool

    def metrics(self) -> dict[str, float]:
        """``rollout/groups_drawn``, ``rollout/zero_adv_dropped`` (drawn groups without signal),
        ``rollout/groups_kept``, ``rollout/draws`` and ``rollout/dynamic_cap_reached`` (0 or 1)."""
        return {
            "rollout/groups_drawn": float(len(self.drawn)),
            "rollout/zero_adv_dropped": float(sum(not has_signal(g) for g in self.drawn)),
            "rollout/groups_kept": float(len(self.kept)),
            "rollout/draws": float(self.draws),
            "rollout/dynamic_cap_reached": float(self.capped),
        }


def fill_with_signal(
    draw: Callable[[int], Sequence[Group]],
    want: int,
    max_draws: int,
    stop: Callable[[], bool] = lambda: False,
) -> Filled:
    """Call ``draw(k)`` for draws ``k = 0, 1, ...`` until ``want`` groups with signal are held,
    ``max_draws`` draws are made, or ``stop()`` (e.g. the token budget ran out) is true after a draw
    (module docstring); ``want`` and ``max_draws`` are at least 1."""
    if want < 1 or max_draws < 1:
        raise ValueError(f"want={want!r}, max_draws={max_draws!r}: both must be >= 1")
    drawn: list[Group] = []
    signal: list[Group] = []
    last: Sequence[Group] = ()
    draws = 0
    while draws < max_draws and len(signal) < want and not (draws and stop()):
        last = draw(draws)
        draws += 1
        drawn.extend(last)
        signal.extend(g for g in last if has_signal(g))
    kept = signal[:want] if signal else list(last)
    return Filled(kept=kept, drawn=drawn, draws=draws, capped=len(signal) < want)
