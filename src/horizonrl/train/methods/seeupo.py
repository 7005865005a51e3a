"""SeeUPO-style baseline (docs/spec/rtpo.md "Baseline"; RTPO paper App. A, D, E.3): sequential per-turn
updates.

Each iteration samples ``rollout.group_size`` *independent chains* per task
(no trunks, no siblings), then runs one stage per turn index in reverse order,
``k = K-1, ..., 0``. Stage ``k`` trains the turn-``k`` tokens of every chain that
reached turn ``k``, with a per-turn group-relative (GRPO) advantage over the
task's chains that reached it::

    A_{i,k} = w_{i,k} * (R_i - mean_{i' in G_k} R_{i'}) / (std_{G_k} R + eps)

where ``w_{i,k} = clamp(prod_{h>k} prod_t pi_theta / pi_old, train.trainer_params.weight_low,
train.trainer_params.weight_high)`` corrects for the turns after ``k`` already updated in this
sweep (HAPPO-style sequential correction; ``w = 1`` at the first stage). The
chains are never re-sampled during the sweep, and each turn is trained under the
*flat* history (the concatenated full history ``S_k``,
:func:`horizonrl.agents.psi.flat_prompts`), not the context ``c_k`` it was
sampled from — the rollout/train mismatch RTPO removes, visible in
``train/ratio_geomean`` whenever ``rollout.context`` is not ``append``/``identity``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from horizonrl import credit
from horizonrl.agents.psi import flat_prompts
from horizonrl.train.methods.reverse_turn import (
    ReverseTurnTrainer,
    Sweep,
    agent_turns,
    downstream_turns,
    trunk_metrics,
)
from horizonrl.train.trainers.registry import register_trainer


@register_trainer("seeupo")
class SeeUPOTrainer(ReverseTurnTrainer):
    """Independent chains, per-turn group-relative advantages, reverse per-turn updates (flat histories)."""

    def sweep_cost(self) -> int:
        return min(self.cfg.rollout.tasks_per_step, len(self.train_tasks)) * self.cfg.rollout.group_size

    def begin_sweep(self, tasks: list[int]) -> Sweep:
        n = self.cfg.rollout.group_size
        made = [self.fresh_episode(i, f"it{self.iteration}-{i}-{j}") for i in tasks for j in range(n)]
        chains = self.run_programs(made, "phase1")
        groups = [chains[g * n : (g + 1) * n] for g in range(len(tasks))]
        flats = [flat_prompts(agent_turns(c), self.renderer) for c in chains]
        horizon = max((len(agent_turns(c)) for c in chains), default=0)
        data: dict[str, Any] = {
            "groups": groups,
            "flats": [flats[g * n : (g + 1) * n] for g in range(len(tasks))],
        }
        self.save_phase1("chains", chains)
        return Sweep(
            iteration=self.iteration,
            stages=list(range(horizon - 1, -1, -1)),
            data=data,
            metrics=trunk_metrics(chains, prefix="chain/"),
        )

    def stage_batch(self, k: int) -> dict[str, Any]:
        first = self.sweep.done == 0
        items, reward_sets, weights, rollouts = [], [], [], []
        for chains, flats in zip(self.sweep.data["groups"], self.sweep.data["flats"], strict=True):
            members = [i for i, c in enumerate(chains) if len(agent_turns(c)) > k]
            if not members:
                continue
            rewards = np.array([chains[i].reward for i in members], dtype=np.float64)
            adv = credit.group_advantage(rewards)
            w = np.ones(len(members))
            if not first and np.any(adv):  # downstream turns already updated in this sweep
                w = np.array(self.trajectory_weights([downstream_turns(chains[i], k) for i in members]))
            adv = w * adv
            for i, a in zip(members, adv, strict=True):
                items.append((agent_turns(chains[i])[k], flats[i][k], float(a)))
            reward_sets.append(rewards)
            weights.extend(w.tolist())
            rollouts.extend(chains[i] for i in members)
        return {
            "rows": self.turn_rows(items),
            "reward_sets": reward_sets,
            "weights": weights,
            "rollouts": rollouts,
            "fresh": first,
        }
