"""Reverse-turn training: RTPO (paper Algorithm 1, App. E.1; spec/rtpo.md) and its shared base.

One *iteration* (``train.steps`` counts them) samples ``rollout.tasks_per_step``
tasks and runs

- Phase 1 — trunks (Alg. 1 line 4): ``rtpo.trunks_per_task`` complete rollouts per
  task under the current policy. At every realized turn boundary ``k`` the exact
  context ``c_k = psi(S_k)`` (the conditioning map is ``rollout.context``, see
  :mod:`horizonrl.agents.psi`), an environment snapshot ``snap_k`` and the context
  manager's state are recorded (:class:`Boundary`). Trunks get no gradient and
  enter no baseline.
- Phase 2 — one *stage* per turn, ``k = K-1, ..., 0`` (``K``: the longest trunk):
  synchronize the engine (every ``rtpo.sync_every`` stages; the weights at the
  sync are ``theta_old``), restore each boundary of turn ``k`` and sample ``G-1``
  siblings (``G = rtpo.siblings``) that answer turn ``k`` afresh from ``c_k`` and
  continue to the end (line 8); ``V_k = mean_j R_j``, ``A_j = R_j - V_k`` over the
  siblings only (line 9, :func:`horizonrl.credit.sibling_advantage`); ``E =
  algo.ppo_epochs`` PPO epochs on the siblings' turn-``k`` tokens only (lines 10-16):
  one row per sibling, ``c_k + l_{j,k}``, aggregated ``seq-mean-token-mean``::

      J_k = 1/(G-1) sum_j 1/T_{j,k} sum_t min(rho A_j, clip(rho, 1-eps, 1+eps) A_j)

  Prefix (``c_k``) and downstream tokens are not in the rows, so they get no gradient.

Siblings sampled by the current weights have trajectory IS weight ``omega = 1``
exactly (Eq. 108) and ``Q_j = R_j``. When the engine is stale (``sync_every > 1``)
or with ``rtpo.off_policy`` (siblings of every boundary sampled once by ``theta_0``
right after the trunks, §4.4 / F.3), ``Q_j = r_{j,k} + w_j F_j`` with ``w_j`` the
clamped trajectory weight over all downstream tokens (Eqs. 105/110, log space,
``[rtpo.weight_low, rtpo.weight_high]``). ``rtpo.flat`` trains each turn under the
concatenated full history ``S_k`` instead of ``c_k`` (what flattened GRPO does),
which shows the rollout/train mismatch RTPO removes in ``train/ratio_geomean``.

Budget: every generated rollout (trunk or sibling) and token is counted
(``budget/*``); ``rtpo.max_rollouts`` / ``rtpo.max_gen_tokens`` end the run before
a phase would exceed them, so a run can be matched to a GRPO run's budget.

Logging: one record (and one optimizer update) per stage; ``step`` counts stages.
``save_every`` counts stages too, and a checkpoint taken between stages holds the
sweep in progress (trunks, boundaries, snapshots), so ``--resume`` continues it.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from horizonrl.agents.context import AppendContext, make_context
from horizonrl.agents.driver import drive
from horizonrl.agents.psi import Boundary, BoundaryRecorder, PsiContext, flat_prompts, resume_episode
from horizonrl.agents.react import LoopLimits, episode_program, start_episode
from horizonrl.credit.rtpo import (
    clamped_trajectory_weight,
    off_policy_q_values,
    sibling_advantage,
    zero_advantage_rate,
)
from horizonrl.inference import HFEngine
from horizonrl.train import checkpoint as ckpt
from horizonrl.train.batching import collate, micro_batches, token_logprobs
from horizonrl.train.collect import rollout_metrics
from horizonrl.train.group_trainer import GroupTrainer
from horizonrl.train.rollout_log import reverse_stage_records, write_rollout_log
from horizonrl.train.trainers import register_trainer
from horizonrl.train.update import ppo_update
from horizonrl.trajectory import Rollout, Row, Segment, Turn, build_rows, write_jsonl


@dataclass
class Sweep:
    """One iteration in progress: the stages left and the data they need (checkpointed between stages)."""

    iteration: int
    stages: list[int]
    data: dict[str, Any]
    metrics: dict[str, float] = field(default_factory=dict)
    done: int = 0


def agent_turns(rollout: Rollout) -> list[Turn]:
    """The agent's own turns (the first session); summaries and other sessions are excluded."""
    return rollout.segments[0].turns if rollout.segments else []


def downstream_turns(rollout: Rollout, k: int, offset: int = 0) -> list[Turn]:
    """Every turn generated after agent turn ``k``: later agent turns and summaries of turns ``>= k``.

    ``offset`` is the absolute index of the rollout's first agent turn (a sibling forked at ``k``).
    """
    later = [t for j, t in enumerate(agent_turns(rollout)) if offset + j > k]
    for seg in rollout.segments[1:]:
        if seg.fork_index is None or seg.fork_index >= k:
            later.extend(seg.turns)
    return later


def trunk_metrics(rollouts: list[Rollout], prefix: str = "trunk/") -> dict[str, float]:
    """Tool calls, generated tokens and turns per trunk; outcome counts (spec/rtpo.md "Metrics")."""
    n = max(len(rollouts), 1)
    first_fail = sum(r.num_turns > 0 and len(agent_turns(r)) == 1 and not r.success for r in rollouts)
    return {
        f"{prefix}count": float(len(rollouts)),
        f"{prefix}tool_calls_mean": sum(t.tool_calls for r in rollouts for t in r.turns) / n,
        f"{prefix}gen_tokens_mean": sum(r.num_response_tokens for r in rollouts) / n,
        f"{prefix}turns_mean": sum(len(agent_turns(r)) for r in rollouts) / n,
        f"{prefix}success": float(sum(r.success for r in rollouts)),
        f"{prefix}fail_first_turn": float(first_fail),
        f"{prefix}no_terminal": float(sum(r.termination != "done" for r in rollouts)),
        f"{prefix}wrong_answer": float(sum(r.termination == "done" and not r.success for r in rollouts)),
    }


class ReverseTurnTrainer(GroupTrainer):
    """Shared machinery of the reverse-turn trainers (``rtpo``, ``seeupo``).

    Reuses the group trainer's model, engine, optimizer, evaluation and
    checkpoints; a subclass implements :meth:`begin_sweep` (phase 1: rollouts of
    the iteration's tasks, returning the :class:`Sweep`) and :meth:`stage_batch`
    (the rows, reward sets and rollouts of one stage).
    """

    def __init__(self, cfg, *, resume: bool = False) -> None:
        r = cfg.rollout
        if r.agent != "react":
            raise ValueError(f"rollout.agent={r.agent!r}: reverse-turn training needs the 'react' agent")
        probe = make_context(
            r.context, LoopLimits(r.max_turns, r.context_budget, r.overflow), r.context_params
        )
        if not (isinstance(probe, PsiContext) or type(probe) is AppendContext):
            raise ValueError(
                f"rollout.context={r.context!r}: reverse-turn training needs a conditioning map that keeps "
                "one agent session (append, identity, window, strip_think, turn_summary)"
            )
        self.sweep: Sweep | None = None
        self.iteration = 0
        self.budget = {"rollouts": 0, "tokens": 0}
        self._versions = [0, 0]  # [weights, engine]
        self._pending: dict[str, Any] | None = None
        super().__init__(cfg, resume=resume)
        env = self.make_env()
        try:
            if not env.can_fork:
                raise ValueError(f"env.name={cfg.env.name!r} cannot fork (snapshot/restore); RTPO needs it")
        finally:
            env.close()
        mode = cfg.algo.loss_agg_mode or "seq-mean-token-mean"
        self.loss_agg_mode = mode
        self.update_settings = dataclasses.replace(self.update_settings, loss_agg_mode=mode)
        self.shared_engine = cfg.rtpo.sync_every == 1
        if not self.shared_engine:  # a separate copy that only sees the weights at a sync
            rng = self.engine.rng_state()
            self.engine = HFEngine(
                copy.deepcopy(self.model).eval().requires_grad_(False),
                self.tokenizer,
                device=self.device,
                max_batch_size=r.max_batch_size,
                seed=cfg.train.seed,
            )
            self.engine.set_rng_state(rng)
        if self._pending is not None:
            p = self._pending
            self.sweep, self.iteration, self.budget = p["sweep"], p["iteration"], dict(p["budget"])
            self._versions = list(p["versions"])
            if p.get("engine_weights") is not None and not self.shared_engine:
                self.engine.sync(p["engine_weights"])

    # ------------------------------------------------------------------ state

    def _state(self) -> dict[str, Any]:
        st = super()._state()
        st["reverse"] = {
            "sweep": self.sweep,
            "iteration": self.iteration,
            "budget": dict(self.budget),
            "versions": list(self._versions),
            "engine_weights": None if self.shared_engine else self.engine.model.state_dict(),
        }
        return st

    def _restore(self, path) -> None:
        super()._restore(path)
        self._pending = ckpt.load_trainer_state(path).get("reverse")
        if self._pending is None:
            raise ValueError(f"checkpoint {path} was not written by a reverse-turn trainer")

    # ------------------------------------------------------------------ engine and budget

    def sync_engine(self) -> None:
        """Push the current weights to the engine (they become ``theta_old`` of what it samples)."""
        if not self.shared_engine:
            self.engine.sync(self.model.state_dict())
        self._versions[1] = self._versions[0]

    @property
    def engine_fresh(self) -> bool:
        """Whether the engine samples from the current weights (``omega = 1`` exactly)."""
        return self.shared_engine or self._versions[1] == self._versions[0]

    def affordable(self, rollouts: int) -> bool:
        """Whether ``rollouts`` more rollouts fit ``rtpo.max_rollouts`` (and tokens ``max_gen_tokens``)."""
        c = self.cfg.rtpo
        if c.max_gen_tokens and self.budget["tokens"] >= c.max_gen_tokens:
            return False
        return not c.max_rollouts or self.budget["rollouts"] + rollouts <= c.max_rollouts

    def budget_metrics(self) -> dict[str, float]:
        return {
            "budget/rollouts": float(self.budget["rollouts"]),
            "budget/gen_tokens": float(self.budget["tokens"]),
        }

    def charge(self, rollouts: list[Rollout]) -> None:
        self.budget["rollouts"] += len(rollouts)
        self.budget["tokens"] += sum(r.num_response_tokens for r in rollouts)

    def run_programs(self, made: list[tuple[Any, Any]]) -> list[Rollout]:
        """Drive ``(program, env)`` pairs in one batch; close the envs; charge the budget."""
        try:
            rollouts = drive(self.engine, [p for p, _ in made])
        finally:
            for _, env in made:
                env.close()
        self.charge(rollouts)
        return rollouts

    def manager(self, boundaries: list[Boundary] | None, *, task_index: int = 0, resume: bool = False):
        r = self.cfg.rollout
        inner = make_context(r.context, self.limits, r.context_params)
        return BoundaryRecorder(inner, boundaries, task_index=task_index, resume=resume)

    def fresh_episode(self, i: int, uid: str, boundaries: list[Boundary] | None = None):
        """``(program, env)`` of a new episode on training task ``i`` (recording its boundaries if given)."""
        env = self.make_env()
        ep = start_episode(env, self.train_tasks[i], self.renderer, uid=uid, group_id=str(i))
        return episode_program(ep, self.manager(boundaries, task_index=i), self.params), env

    def save_phase1(self, name: str, rollouts: list[Rollout]) -> None:
        if self.cfg.train.save_rollouts:
            (self.run_dir / "rollouts").mkdir(exist_ok=True)
            write_jsonl(self.run_dir / "rollouts" / f"{name}_{self.iteration}.jsonl", rollouts)

    # ------------------------------------------------------------------ rows and scores

    def turn_rows(self, items: list[tuple[Turn, list[int], float]]) -> list[Row]:
        """One row per ``(turn, context, advantage)``: ``context + response``, only the response trainable."""
        views = [
            Rollout(
                uid=str(i),
                task_id="",
                group_id="",
                segments=[Segment(turns=[dataclasses.replace(t, prompt_ids=list(c))])],
            )
            for i, (t, c, _) in enumerate(items)
        ]
        adv = [[[np.full(len(t.response_ids), float(a))]] for t, _, a in items]
        return build_rows(views, adv)

    @torch.no_grad()
    def score_rows(self, rows: list[Row]) -> list[np.ndarray]:
        """Training-side log-probs (rollout temperature) of every row's trainable tokens, in order."""
        out: list[np.ndarray] = [np.zeros(0)] * len(rows)
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
        pad = self.tokenizer.pad_token_id or 0
        training = self.model.training
        self.model.eval()
        try:
            for chunk in micro_batches(
                [len(rows[i]) for i in order], self.update_settings.micro_batch_tokens
            ):
                idx = [order[c] for c in chunk]
                batch = collate([rows[i] for i in idx], pad_id=pad).to(self.device)
                lp = token_logprobs(self.model, batch, temperature=self.update_settings.temperature)
                for b, i in enumerate(idx):
                    out[i] = lp[b][batch.mask[b].bool()].double().cpu().numpy()
        finally:
            self.model.train(training)
        return out

    def trajectory_weights(self, downstream: list[list[Turn]]) -> list[float]:
        """``w = clamp(prod pi_theta / pi_behavior)`` over each list of downstream turns (Eq. 110)."""
        flat = [t for turns in downstream for t in turns]
        new = iter(self.score_rows(self.turn_rows([(t, t.prompt_ids, 0.0) for t in flat])))
        c = self.cfg.rtpo
        out = []
        for turns in downstream:
            lp_new = [next(new) for _ in turns]
            lp_old = [np.asarray(t.logprobs, dtype=np.float64) for t in turns]
            out.append(
                clamped_trajectory_weight(
                    lp_new or [np.zeros(0)],
                    lp_old or [np.zeros(0)],
                    rho_min=c.weight_low,
                    rho_max=c.weight_high,
                )
            )
        return out

    def consistency(self, rows: list[Row]) -> dict[str, float]:
        """Rollout/train consistency before the update: ``exp(mean(d))`` and ``KL = mean(e^d - 1 - d)``.

        ``d = logp_train - logp_rollout`` over all trainable tokens; the KL is the k3
        estimate of ``KL(pi_rollout || pi_train)`` from the rollout's samples.
        """
        new = self.score_rows(rows)
        old = [
            np.asarray(r.old_logprobs, dtype=np.float64)[np.asarray(r.trainable, dtype=bool)] for r in rows
        ]
        d = np.concatenate([n - o for n, o in zip(new, old, strict=True)] or [np.zeros(0)])
        if d.size == 0:
            return {}
        return {
            "train/ratio_geomean": float(np.exp(d.mean())),
            "train/ratio_max_abs_log": float(np.abs(d).max()),
            "train/kl_rollout_train": float(np.mean(np.expm1(d) - d)),
        }

    def update(self, rows: list[Row]) -> dict[str, float]:
        """Consistency metrics, then ``algo.ppo_epochs`` PPO epochs on ``rows`` (no scheduler step)."""
        if not rows:
            return {}
        before = self.consistency(rows)
        m = ppo_update(
            self.model,
            self.optimizer,
            None,
            rows,
            self.update_settings,
            generator=self.shuffle_gen,
            device=self.device,
            pad_id=self.tokenizer.pad_token_id or 0,
            ref_model=self.ref_model,
        )
        self._versions[0] += 1
        return m | before

    # ------------------------------------------------------------------ loop

    def begin_sweep(self, tasks: list[int]) -> Sweep:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must implement begin_sweep")

    def stage_batch(self, k: int) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must implement stage_batch")

    def sweep_cost(self) -> int:
        """Rollouts phase 1 of the next iteration generates."""
        return min(self.cfg.rollout.tasks_per_step, len(self.train_tasks)) * self.cfg.rtpo.trunks_per_task

    def stage_cost(self, k: int) -> int:
        """Rollouts stage ``k`` of the current sweep generates (0 when they were generated in phase 1)."""
        return 0

    def has_more(self) -> bool:
        """Whether another stage runs: iterations left and the budget allows its rollouts."""
        if self.sweep is not None and self.sweep.stages:
            return self.affordable(self.stage_cost(self.sweep.stages[0]))
        return self.iteration < self.cfg.train.steps and self.affordable(self.sweep_cost())

    def advance(self) -> dict[str, float]:
        """Run one stage (starting a new iteration's phase 1 first if none is in progress)."""
        t0 = time.perf_counter()
        m: dict[str, float] = {}
        if self.sweep is None or not self.sweep.stages:
            self.sync_engine()
            n = min(self.cfg.rollout.tasks_per_step, len(self.train_tasks))
            picked = self.task_rng.sample(range(len(self.train_tasks)), n)
            self.sweep = self.begin_sweep(picked)
            m.update(self.sweep.metrics)
            m["time/phase1_s"] = time.perf_counter() - t0
        sweep = self.sweep
        if not sweep.stages or not self.affordable(self.stage_cost(sweep.stages[0])):
            # Phase 1 spent the budget (or left nothing to train): a record without an update.
            if not sweep.stages:
                self.sweep, self.iteration = None, self.iteration + 1
            self.step += 1
            return m | self.budget_metrics()
        k = sweep.stages[0]
        if sweep.done % self.cfg.rtpo.sync_every == 0:
            self.sync_engine()
        t1 = time.perf_counter()
        before = dict(self.budget)
        batch = self.stage_batch(k)
        t2 = time.perf_counter()
        m.update(self.update(batch["rows"]))
        t3 = time.perf_counter()
        sweep.stages.pop(0)
        sweep.done += 1
        self.step += 1
        if not sweep.stages:
            self.sweep = None
            self.iteration += 1
            self.scheduler.step()
        m.update(rollout_metrics(batch["rollouts"]) | self.budget_metrics())
        m.update(batch.get("metrics", {}))
        weights = batch.get("weights") or [1.0]
        m.update(
            {
                "rtpo/iteration": float(sweep.iteration),
                "rtpo/turn": float(k),
                "rtpo/groups": float(len(batch["reward_sets"])),
                "rtpo/zero_adv_rate": zero_advantage_rate(batch["reward_sets"]),
                "rtpo/is_weight_mean": float(np.mean(weights)),
                "rtpo/is_weight_min": float(np.min(weights)),
                "rtpo/engine_fresh": float(batch.get("fresh", True)),
                "budget/stage_rollouts": float(self.budget["rollouts"] - before["rollouts"]),
                "budget/stage_gen_tokens": float(self.budget["tokens"] - before["tokens"]),
                "time/rollout_s": t2 - t1,
                "time/update_s": t3 - t2,
                "time/stage_s": t3 - t0,
                "time/step_s": t3 - t0,
                "throughput/tokens_per_s": (self.budget["tokens"] - before["tokens"]) / max(t2 - t1, 1e-9),
            }
        )
        if self.cfg.train.save_rollouts and batch["rollouts"]:
            t, notes = self.cfg.train, None
            if t.save_credit:
                notes = reverse_stage_records(batch, k, estimator=t.trainer, iteration=sweep.iteration)
            write_rollout_log(self.run_dir / "rollouts" / f"step_{self.step}.jsonl", batch["rollouts"], notes)
        self.logger.log_rollouts(self.step, batch["rollouts"])
        return m

    def fit(self, progress_cb=None) -> list[dict[str, Any]]:
        """Run stages until ``train.steps`` iterations are done or the budget is spent.

        Evaluates before a fresh run, after every ``eval_every`` iterations and at the
        end; checkpoints every ``save_every`` stages and at the end.
        """
        cfg = self.cfg.train
        records = []
        if self.step == 0:
            records.append(self.logger.log(0, self.evaluate()))
        bar = None
        if cfg.progress:
            from tqdm import tqdm

            bar = tqdm(initial=self.step, desc=f"{self.cfg.train.trainer} stages", unit="stage")
        while self.has_more():
            m = self.advance()
            last = not self.has_more()
            if last or (self.sweep is None and cfg.eval_every and self.iteration % cfg.eval_every == 0):
                self.sync_engine()
                m.update(self.evaluate())
            records.append(self.logger.log(self.step, m))
            if bar is not None:
                bar.update(1)
                bar.set_postfix(turn=m.get("rtpo/turn"), ratio=f"{m.get('train/ratio_geomean', 1.0):.4f}")
            if progress_cb is not None:
                progress_cb(self.step, m)
            if last or (cfg.save_every and self.step % cfg.save_every == 0):
                self.save()
        if bar is not None:
            bar.close()
        self.logger.close()
        return records


@register_trainer("rtpo")
class RTPOTrainer(ReverseTurnTrainer):
    """RTPO (module docstring): trunks, then reverse stages of on-policy siblings at each boundary."""

    def __init__(self, cfg, *, resume: bool = False) -> None:
        if cfg.rtpo.siblings < 3:
            raise ValueError(
                f"rtpo.siblings={cfg.rtpo.siblings} is degenerate: with G-1 = 1 sibling per boundary "
                "A = R - mean(R) = 0 always and no turn is trained; use rtpo.siblings >= 3 (paper: G-1 = 2)"
            )
        super().__init__(cfg, resume=resume)

    def sibling(self, b: Boundary, uid: str):
        """``(program, env)`` of one sibling: env restored from ``snap_k``, context ``c_k``, turns ``k..``."""
        env = self.make_env()
        ep = resume_episode(b, env, self.train_tasks[b.task_index], self.renderer, uid=uid)
        manager = self.manager(None, task_index=b.task_index, resume=True)
        return episode_program(ep, manager, self.params), env

    def siblings_of(self, bs: list[Boundary], tag: str) -> list[list[Rollout]]:
        """``G-1`` siblings for each boundary, generated in one batch."""
        g1 = self.cfg.rtpo.siblings - 1
        made = [self.sibling(b, f"{b.trunk}/k{b.turn}{tag}-{j}") for b in bs for j in range(g1)]
        sibs = self.run_programs(made)
        return [sibs[i * g1 : (i + 1) * g1] for i in range(len(bs))]

    def begin_sweep(self, tasks: list[int]) -> Sweep:
        boundaries: list[Boundary] = []
        n = self.cfg.rtpo.trunks_per_task
        made = [
            self.fresh_episode(i, f"it{self.iteration}-{i}-t{t}", boundaries) for i in tasks for t in range(n)
        ]
        trunks = self.run_programs(made)
        if self.cfg.rtpo.flat:
            flats = {r.uid: flat_prompts(agent_turns(r), self.renderer) for r in trunks}
            for b in boundaries:
                b.flat = flats[b.trunk][b.turn]
        stages = sorted({b.turn for b in boundaries}, reverse=True)
        data: dict[str, Any] = {"boundaries": boundaries, "trunks": [r.uid for r in trunks]}
        if self.cfg.rtpo.off_policy:  # every boundary's siblings under theta_0, reused at its stage
            keep, cost = [], 0
            for k in stages:
                n = sum(b.turn == k for b in boundaries) * (self.cfg.rtpo.siblings - 1)
                if not self.affordable(cost + n):
                    break
                keep.append(k)
                cost += n
            stages = keep
            idx = [i for i, b in enumerate(boundaries) if b.turn in keep]
            pooled = self.siblings_of([boundaries[i] for i in idx], "off") if idx else []
            data["pool"] = dict(zip(idx, pooled, strict=True))
        self.save_phase1("trunks", trunks)
        metrics = trunk_metrics(trunks) | {"trunk/boundaries": float(len(boundaries))}
        return Sweep(iteration=self.iteration, stages=stages, data=data, metrics=metrics)

    def stage_cost(self, k: int) -> int:
        if self.cfg.rtpo.off_policy:
            return 0
        return sum(b.turn == k for b in self.sweep.data["boundaries"]) * (self.cfg.rtpo.siblings - 1)

    def stage_groups(self, k: int) -> list[tuple[Boundary, list[Rollout]]]:
        """The boundaries of turn ``k`` with their siblings (fresh on-policy, or from the off-policy pool)."""
        data = self.sweep.data
        idx = [i for i, b in enumerate(data["boundaries"]) if b.turn == k]
        bs = [data["boundaries"][i] for i in idx]
        sibs = [data["pool"][i] for i in idx] if self.cfg.rtpo.off_policy else self.siblings_of(bs, "")
        return [(b, [s for s in group if agent_turns(s)]) for b, group in zip(bs, sibs, strict=True)]

    def stage_batch(self, k: int) -> dict[str, Any]:
        groups = self.stage_groups(k)
        fresh = self.engine_fresh and not self.cfg.rtpo.off_policy
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
                items.append((turn, b.flat if self.cfg.rtpo.flat else turn.prompt_ids, float(a)))
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


# The SeeUPO baseline shares this base; importing it here registers "seeupo" with the trainer registry.
from horizonrl.train import seeupo as _seeupo  # noqa: E402, F401  isort: skip
