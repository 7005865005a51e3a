"""Reverse-turn training: RTPO (paper Algorithm 1, App. E.1; docs/spec/rtpo.md) and its shared base.

Parameters are ``train.trainer_params``
(:class:`~horizonrl.train.methods.reverse_turn.ReverseTurnParams`). One *iteration*
(``train.steps`` counts them) samples ``rollout.tasks_per_step``
tasks and runs

- Phase 1 — trunks (Alg. 1 line 4): ``trunks_per_task`` complete rollouts per
  task under the current policy. At every realized turn boundary ``k`` the exact
  context ``c_k = psi(S_k)`` (the conditioning map is ``rollout.context``, see
  :mod:`horizonrl.agents.psi`), an environment snapshot ``snap_k`` and the context
  manager's state are recorded (:class:`Boundary`). Trunks get no gradient and
  enter no baseline.
- Phase 2 — one *stage* per turn, ``k = K-1, ..., 0`` (``K``: the longest trunk):
  synchronize the engine (every ``sync_every`` stages; the weights at the
  sync are ``theta_old``), restore each boundary of turn ``k`` and sample ``G-1``
  siblings (``G = train.trainer_params.siblings``) that answer turn ``k`` afresh from ``c_k`` and
  continue to the end (line 8); ``V_k = mean_j R_j``, ``A_j = R_j - V_k`` over the
  siblings only (line 9, :func:`horizonrl.credit.sibling_advantage`); ``E =
  algo.ppo_epochs`` PPO epochs on the siblings' turn-``k`` tokens only (lines 10-16):
  one row per sibling, ``c_k + l_{j,k}``, aggregated ``seq-mean-token-mean``::

      J_k = 1/(G-1) sum_j 1/T_{j,k} sum_t min(rho A_j, clip(rho, 1-eps, 1+eps) A_j)

  Prefix (``c_k``) and downstream tokens are not in the rows, so they get no gradient.

Siblings sampled by the current weights have trajectory IS weight ``omega = 1``
exactly (Eq. 108) and ``Q_j = R_j``. When the engine is stale (``sync_every > 1``)
or with ``off_policy`` (siblings of every boundary sampled once by ``theta_0``
right after the trunks, §4.4 / F.3), ``Q_j = r_{j,k} + w_j F_j`` with ``w_j`` the
clamped trajectory weight over all downstream tokens (Eqs. 105/110, log space,
``[train.trainer_params.weight_low, train.trainer_params.weight_high]``). ``flat`` trains each turn under the
concatenated full history ``S_k`` instead of ``c_k`` (what flattened GRPO does),
which shows the rollout/train mismatch RTPO removes in ``train/ratio_geomean``.

The same flattening is the group trainer's ``algo.train_context: flat`` (flattened
GRPO, the paper's baseline), registered here as a training-context view
(:mod:`horizonrl.train.trainers.train_context`).

Budget, logging and checkpoints are the shared reverse-turn machinery's
(:mod:`horizonrl.train.methods.reverse_turn`): every generated rollout and token is
counted, ``max_rollouts`` / ``train.max_gen_tokens`` end the run before a
phase would exceed them, so a run can be matched to a GRPO run's budget.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from horizonrl.agents.psi import Boundary, flat_prompts, flat_view, resume_episode
from horizonrl.agents.react import episode_program
from horizonrl.config import ConfigError
from horizonrl.credit.rtpo import off_policy_q_values, sibling_advantage
from horizonrl.train.methods.reverse_turn import (
    ReverseTurnTrainer,
    Sweep,
    agent_turns,
    downstream_turns,
    trunk_metrics,
)
from horizonrl.train.trainers.registry import register_trainer, trainer_params
from horizonrl.train.trainers.train_context import TRAIN_CONTEXTS
from horizonrl.trajectory import Rollout

# The RTPO paper's flattened-GRPO baseline (Eq. 1-2) for the group trainer: ``algo.train_context: flat``
# trains each agent turn under its concatenated history ``S_k`` instead of the context ``c_k`` it was
# sampled from (:func:`horizonrl.agents.psi.flat_view`).
TRAIN_CONTEXTS.register("flat", flat_view)


@register_trainer("rtpo")
class RTPOTrainer(ReverseTurnTrainer):
    """RTPO (module docstring): trunks, then reverse stages of on-policy siblings at each boundary."""

    def __init__(self, cfg, *, resume: bool = False) -> None:
        siblings = trainer_params(cfg).siblings
        if siblings < 3:  # a ConfigError: the CLI reports it in one line
            raise ConfigError(
                f"train.trainer_params.siblings={siblings} is degenerate: with G-1 = 1 sibling per boundary "
                "A = R - mean(R) = 0 always and no turn is trained; use train.trainer_params.siblings >= 3 "
                "(paper: G-1 = 2)"
            )
        super().__init__(cfg, resume=resume)

    def sibling(self, b: Boundary, uid: str):
        """``(program, env)`` of one sibling: env restored from ``snap_k``, context ``c_k``, turns ``k..``."""
        env = self.make_env()
        ep = resume_episode(b, env, self.train_tasks[b.task_index], self.renderer, uid=uid)
        manager = self.manager(None, task_index=b.task_index, resume=True)
        return episode_program(ep, manager, self.params), env

    def siblings_of(self, bs: list[Boundary], tag: str, kind: str) -> list[list[Rollout]]:
        """``G-1`` siblings for each boundary, generated in one batch (a budget phase of ``kind``)."""
        g1 = self.tparams.siblings - 1
        made = [self.sibling(b, f"{b.trunk}/k{b.turn}{tag}-{j}") for b in bs for j in range(g1)]
        sibs = self.run_programs(made, kind)
        return [sibs[i * g1 : (i + 1) * g1] for i in range(len(bs))]

    def begin_sweep(self, tasks: list[int]) -> Sweep:
        boundaries: list[Boundary] = []
        n = self.tparams.trunks_per_task
        made = [
            self.fresh_episode(i, f"it{self.iteration}-{i}-t{t}", boundaries) for i in tasks for t in range(n)
        ]
        trunks = self.run_programs(made, "phase1")
        if self.tparams.flat:
            flats = {r.uid: flat_prompts(agent_turns(r), self.renderer) for r in trunks}
            for b in boundaries:
                b.flat = flats[b.trunk][b.turn]
        stages = sorted({b.turn for b in boundaries}, reverse=True)
        data: dict[str, Any] = {"boundaries": boundaries, "trunks": [r.uid for r in trunks]}
        if self.tparams.off_policy:  # every boundary's siblings under theta_0, reused at its stage
            keep, cost = [], 0
            for k in stages:
                n = sum(b.turn == k for b in boundaries) * (self.tparams.siblings - 1)
                if not self.affordable(cost + n, "phase1"):
                    break
                keep.append(k)
                cost += n
            stages = keep
            idx = [i for i, b in enumerate(boundaries) if b.turn in keep]
            pooled = self.siblings_of([boundaries[i] for i in idx], "off", "offpool") if idx else []
            data["pool"] = dict(zip(idx, pooled, strict=True))
        self.save_phase1("trunks", trunks)
        metrics = trunk_metrics(trunks) | {"trunk/boundaries": float(len(boundaries))}
        return Sweep(iteration=self.iteration, stages=stages, data=data, metrics=metrics)

    def stage_cost(self, k: int) -> int:
        if self.tparams.off_policy:
            return 0
        return sum(b.turn == k for b in self.sweep.data["boundaries"]) * (self.tparams.siblings - 1)

    def stage_groups(self, k: int) -> list[tuple[Boundary, list[Rollout]]]:
        """The boundaries of turn ``k`` with their siblings (fresh on-policy, or from the off-policy pool)."""
        data = self.sweep.data
        idx = [i for i, b in enumerate(data["boundaries"]) if b.turn == k]
        bs = [data["boundaries"][i] for i in idx]
        if self.tparams.off_policy:
            sibs = [data["pool"][i] for i in idx]
        else:
            sibs = self.siblings_of(bs, "", f"stage{k}")
        return [(b, [s for s in group if agent_turns(s)]) for b, group in zip(bs, sibs, strict=True)]

    def stage_batch(self, k: int) -> dict[str, Any]:
        groups = self.stage_groups(k)
        fresh = self.engine_fresh and not self.tparams.off_policy
        items, reward_sets, weights, rollouts = [], [], [], []
        for b, sibs in groups:
            returns = np.array([s.reward for s in sibs], dtype=np.float64)
            if fresh:  # Eq. 108: sampled by the current weights, omega = 1 exactly and Q = R
                w, q = np.ones(len(sibs)), returns
            else:  # Eqs. 105/110: Q = r_k + w F with the clamped downstream weight
                w = np.array(self.trajectory_weights([downstream_turns(s, b.turn, b.turn) for s in sibs]))
                r_k = np.array([agent_turns(s)[0].reward for s in sibs])
                q = off_policy_q_values(r_k, returns - r_k, w)
            adv = sibling_advantage(q)
            for s, a in zip(sibs, adv, strict=True):
                turn = agent_turns(s)[0]
                items.append((turn, b.flat if self.tparams.flat else turn.prompt_ids, float(a)))
            reward_sets.append(q)
            weights.extend(w.tolist())
            rollouts.extend(sibs)
        return {
            "rows": self.turn_rows(items),
            "reward_sets": reward_sets,
            "weights": weights,
            "rollouts": rollouts,
            "fresh": fresh,
            "groups": groups,
        }
