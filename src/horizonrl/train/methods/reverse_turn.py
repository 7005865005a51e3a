"""Shared machinery of the reverse-turn trainers (RTPO and the SeeUPO baseline).

A reverse-turn trainer runs *iterations* (``train.steps`` counts them): phase 1
generates rollouts of the iteration's tasks (RTPO trunks, SeeUPO chains), then
one *stage* per turn index ``k = K-1, ..., 0`` trains the turn-``k`` tokens
(:meth:`ReverseTurnTrainer.stage_batch`, implemented by the subclass). One
record (and one optimizer update) per stage; ``step`` counts stages, and
``save_every`` too; a checkpoint taken between stages holds the sweep in
progress (rollouts, boundaries, snapshots), so ``--resume`` continues it.

Engine: with ``train.trainer_params.sync_every = 1`` the engine shares the training model, so
every stage samples from the current weights; otherwise it is a separate copy
that only sees the weights at a sync (``theta_old`` of what it samples).

Budget: every generated token is counted (:mod:`horizonrl.train.rollout.budget`,
``train.max_gen_tokens``) and every generated rollout (trunk, sibling or chain)
too (``max_rollouts``, the paper's E.3 rule); a phase or stage predicted to
overrun either does not start, and one the token budget cut short is discarded.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from horizonrl.agents.context import AppendContext, make_context
from horizonrl.agents.driver import drive
from horizonrl.agents.psi import Boundary, BoundaryRecorder, PsiContext
from horizonrl.agents.react import LoopLimits, episode_program, start_episode
from horizonrl.config import ConfigError
from horizonrl.config.fields import _Section, opt
from horizonrl.credit.rtpo import clamped_trajectory_weight, zero_advantage_rate
from horizonrl.errors import CheckpointError
from horizonrl.train.records.rollout_log import (
    Encoded,
    credit_annotation,
    encode_advantages,
    jsonable,
    write_rollout_log,
)
from horizonrl.train.rollout.collect import rollout_metrics
from horizonrl.train.trainers.checks import check_run
from horizonrl.train.trainers.registry import trainer_params
from horizonrl.train.trainers.workspace import WorkspaceTrainer
from horizonrl.train.update.ppo import consistency_metrics, ppo_update, score_rows
from horizonrl.trajectory import Rollout, Row, Segment, Turn, build_rows, write_jsonl
from horizonrl.vocab import Termination

#: This module was ``horizonrl.train.trainers.reverse_turn`` before issue 43: reverse-turn checkpoints written
#: then pickle :class:`Sweep` under that name, so the old name resolves here and ``--resume`` still reads
#: them (an alias in ``sys.modules``, not a module file: ``trainers/`` names no method).
sys.modules.setdefault("horizonrl.train.trainers.reverse_turn", sys.modules[__name__])


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
    """Tool calls, generated tokens and turns per trunk; outcome counts (docs/spec/rtpo.md "Metrics")."""
    n = max(len(rollouts), 1)
    first_fail = sum(r.num_turns > 0 and len(agent_turns(r)) == 1 and not r.success for r in rollouts)
    return {
        f"{prefix}count": float(len(rollouts)),
        f"{prefix}tool_calls_mean": sum(t.tool_calls for r in rollouts for t in r.turns) / n,
        f"{prefix}gen_tokens_mean": sum(r.num_response_tokens for r in rollouts) / n,
        f"{prefix}turns_mean": sum(len(agent_turns(r)) for r in rollouts) / n,
        f"{prefix}success": float(sum(r.success for r in rollouts)),
        f"{prefix}fail_first_turn": float(first_fail),
        f"{prefix}no_terminal": float(sum(r.termination != Termination.DONE for r in rollouts)),
        f"{prefix}wrong_answer": float(
            sum(r.termination == Termination.DONE and not r.success for r in rollouts)
        ),
    }


def reverse_stage_records(batch: dict[str, Any], k: int, *, estimator: str, iteration: int) -> list[dict]:
    """``credit`` annotations of one reverse-turn stage (RTPO, SeeUPO; the format of
    :mod:`horizonrl.train.records.rollout_log`).

    ``batch["rows"][i]`` trains turn ``k`` of ``batch["rollouts"][i]`` (its local
    index is ``k - branch.turn`` for a sibling forked at ``k``); no other turn is
    trained. Side information per rollout: ``trunk`` id and boundary ``k``,
    ``sibling`` index within its boundary group (RTPO), the value ``Q`` the
    advantage was computed from, the trajectory weight ``w``, the ``iteration``.
    """
    rollouts, rows = batch["rollouts"], batch["rows"]
    if len(rows) != len(rollouts):
        raise ValueError(f"stage has {len(rows)} rows for {len(rollouts)} rollouts")
    weights = list(batch.get("weights") or [1.0] * len(rollouts))
    q_values = [float(q) for qs in batch.get("reward_sets", []) for q in qs]
    sibling: dict[int, tuple[int, int]] = {}
    for g, (_, sibs) in enumerate(batch.get("groups") or []):
        for j, s in enumerate(sibs):
            sibling[id(s)] = (g, j)
    out = []
    for i, (r, row) in enumerate(zip(rollouts, rows, strict=True)):
        local = k - (r.branch.turn if r.branch is not None else 0)
        adv = np.asarray(row.advantages, dtype=np.float64)[np.asarray(row.trainable, dtype=bool)]
        advantages: list[list[Encoded]] = [[None] * len(s.turns) for s in r.segments]
        row_ids: list[list[int | None]] = [[None] * len(s.turns) for s in r.segments]
        turns = r.segments[0].turns if r.segments else []
        if 0 <= local < len(turns) and len(turns[local].response_ids) == adv.size:
            advantages[0][local] = encode_advantages(adv)
            row_ids[0][local] = i
        info: dict[str, Any] = {"k": k, "iteration": iteration, "w": weights[i] if i < len(weights) else None}
        if r.branch is not None:
            info["trunk"] = r.branch.trunk_id
        if id(r) in sibling:
            info["group"], info["sibling"] = sibling[id(r)]
        if len(q_values) == len(rollouts):
            info["Q"] = q_values[i]
        out.append(credit_annotation(estimator, advantages, row_ids, jsonable(info)))
    return out


@dataclass(frozen=True)
class ReverseTurnParams(_Section):
    """``train.trainer_params`` of the reverse-turn trainers (RTPO, paper Algorithm 1; docs/spec/rtpo.md; and
    SeeUPO, which reads the clamp and the budget)."""

    _prefix = "train.trainer_params."
    trunks_per_task: int = opt(
        1, "trunk rollouts per task; every realized turn boundary is a stage", ge=1, le=4096
    )
    siblings: int = opt(
        3,
        "rollouts per boundary group G: G-1 siblings are sampled at each boundary (the trunk is excluded "
        "from baselines); G = 2 is degenerate (A = 0) and refused, the paper uses G = 3",
        ge=2,
        le=4096,
    )
    off_policy: bool = opt(
        False,
        "reuse continuations sampled from the initial policy, weighted by the clamped trajectory IS weight",
    )
    weight_low: float = opt(
        0.0,
        "lower clamp rho_min of the trajectory importance weight of stale continuations (off-policy, "
        "sync_every > 1, SeeUPO's downstream correction)",
        ge=0.0,
    )
    weight_high: float = opt(
        1.0, "upper clamp rho_max of that weight (1.0 = truncated IS, never amplifies a return)", gt=0.0
    )
    sync_every: int = opt(
        1,
        "synchronize engine weights every N stages (1 = fully on-policy, omega = 1; > 1 samples from a "
        "stale engine copy and weights the continuations)",
        ge=1,
    )
    flat: bool = opt(
        False, "train under the concatenated full history instead of the context each turn saw (ablation)"
    )
    max_rollouts: int = opt(
        0,
        "generation budget: end the run before a phase would push the generated rollouts (trunks + "
        "siblings, or SeeUPO chains) past this; 0 = no cap (match a GRPO run: steps x tasks x G)",
        ge=0,
        resume=True,
    )


class ReverseTurnTrainer(WorkspaceTrainer):
    """Shared machinery of the reverse-turn trainers (``rtpo``, ``seeupo``).

    Holds the run's workspace (``self.ws``: model, engine, optimizer, evaluation
    and the shared checkpoint state); a subclass implements :meth:`begin_sweep` (phase 1: rollouts of
    the iteration's tasks, returning the :class:`Sweep`) and :meth:`stage_batch`
    (the rows, reward sets and rollouts of one stage).
    """

    params_cls = ReverseTurnParams

    def __init__(self, cfg, *, resume: bool = False) -> None:
        check_run(cfg)
        #: ``train.trainer_params``, validated (:class:`ReverseTurnParams`).
        self.tparams: ReverseTurnParams = trainer_params(cfg)
        r = cfg.rollout
        if r.agent != "react":
            raise ConfigError(f"rollout.agent={r.agent!r}: reverse-turn training needs the 'react' agent")
        probe = make_context(
            r.context, LoopLimits(r.max_turns, r.context_budget, r.overflow), r.context_params
        )
        if not (isinstance(probe, PsiContext) or type(probe) is AppendContext):
            raise ConfigError(
                f"rollout.context={r.context!r}: reverse-turn training needs a conditioning map that keeps "
                "one agent session (append, identity, window, strip_think, turn_summary)"
            )
        self.sweep: Sweep | None = None
        self.iteration = 0
        self._versions = [0, 0]  # [weights, engine]
        self._pending: dict[str, Any] | None = None
        self.setup(cfg, resume=resume, loss_agg_mode=cfg.algo.loss_agg_mode or "seq-mean-token-mean")
        self.resume_and_log(resume)
        env = self.make_env()
        try:
            if not env.can_fork:
                raise ConfigError(f"env.name={cfg.env.name!r} cannot fork (snapshot/restore); RTPO needs it")
        finally:
            env.close()
        self.shared_engine = self.shares_engine()
        if self._pending is not None:
            p = self._pending
            self.sweep, self.iteration = p["sweep"], p["iteration"]
            self._versions = list(p["versions"])
            if p.get("engine_weights") is not None and not self.shared_engine:
                self.engine.sync(p["engine_weights"])

    # ------------------------------------------------------------------ state

    def _state(self) -> dict[str, Any]:
        st = super()._state()
        st["reverse"] = {
            "sweep": self.sweep,
            "iteration": self.iteration,
            "versions": list(self._versions),
            "engine_weights": None if self.shared_engine else self.engine.state_dict(),
        }
        return st

    def _restore(self, ck) -> None:
        super()._restore(ck)
        self._pending = ck.state.get("reverse")
        if self._pending is None:
            raise CheckpointError(f"checkpoint {ck.path} was not written by a reverse-turn trainer")

    # ------------------------------------------------------------------ engine and budget

    def shares_engine(self) -> bool:
        """``train.trainer_params.sync_every > 1``: a separate copy that only sees the weights at a sync."""
        return self.tparams.sync_every == 1

    def sync_engine(self) -> None:
        """Push the current weights to the engine (they become ``theta_old`` of what it samples)."""
        if self.shared_engine:
            self.engine.sync()  # no-op for hf; vllm pulls the weights if they changed
        else:
            self.engine.sync(self.model.state_dict())
        self._versions[1] = self._versions[0]

    @property
    def engine_fresh(self) -> bool:
        """Whether the engine samples from the current weights (``omega = 1`` exactly)."""
        return self.shared_engine or self._versions[1] == self._versions[0]

    def affordable(self, rollouts: int, kind: str = "stage") -> bool:
        """Whether a ``kind`` phase of ``rollouts`` rollouts fits ``max_rollouts`` and the token budget."""
        c, b = self.tparams, self.budget
        if b.clipped or not b.affordable(kind, rollouts):
            return False
        return not c.max_rollouts or b.rollouts + rollouts <= c.max_rollouts

    def run_programs(self, made: list[tuple[Any, Any]], kind: str = "stage") -> list[Rollout]:
        """Drive ``(program, env)`` pairs in one batch; close the envs; charge the budget."""
        spent = self.budget.spent
        try:
            rollouts = drive(self.rollout_engine, [p for p, _ in made], self.spec.driver)
        finally:
            for _, env in made:
                env.close()
        self.budget.rollouts += len(rollouts)
        self.budget.record_phase(kind, len(rollouts), self.budget.spent - spent)
        return rollouts

    def manager(self, boundaries: list[Boundary] | None, *, task_index: int = 0, resume: bool = False):
        r = self.cfg.rollout
        inner = make_context(r.context, self.limits, r.context_params)
        return BoundaryRecorder(inner, boundaries, task_index=task_index, resume=resume)

    def fresh_episode(self, i: int, uid: str, boundaries: list[Boundary] | None = None):
        """``(program, env)`` of a new episode on training task ``i`` (recording its boundaries if given)."""
        env = self.make_env()
        ep = start_episode(
            env, self.train_tasks[i], self.renderer, uid=uid, group_id=str(i), preamble=self.preamble
        )
        return episode_program(ep, self.manager(boundaries, task_index=i), self.params), env

    def save_phase1(self, name: str, rollouts: list[Rollout]) -> None:
        if self.cfg.train.save_rollouts and self.is_main:
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

    def scored(self, rows: list[Row]):
        """Training-model log-probs of every row's trainable positions (no grad; :func:`score_rows`)."""
        return score_rows(
            self.model,
            rows,
            device=self.device,
            pad_id=self.tokenizer.pad_token_id or 0,
            micro_batch_tokens=self.update_settings.micro_batch_tokens,
            forward=self.update_settings.forward,
        )

    def trainable_logprobs(self, rows: list[Row]) -> list[np.ndarray]:
        """Training-side log-probs of every row's trainable tokens, in order."""
        out = []
        for r, lp in zip(rows, self.scored(rows), strict=True):
            out.append(lp[torch.tensor(r.trainable[1:], dtype=torch.bool)].double().numpy())
        return out

    def trajectory_weights(self, downstream: list[list[Turn]]) -> list[float]:
        """``w = clamp(prod pi_theta / pi_behavior)`` over each list of downstream turns (Eq. 110)."""
        flat = [t for turns in downstream for t in turns]
        new = iter(self.trainable_logprobs(self.turn_rows([(t, t.prompt_ids, 0.0) for t in flat])))
        c = self.tparams
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

    def update(self, rows: list[Row]) -> dict[str, float]:
        """Consistency metrics over all rows, then ``algo.ppo_epochs`` PPO epochs (no scheduler step).

        ``train/ratio_geomean``, ``ratio_max_abs_log`` and ``kl_rollout_train`` (k3 estimate of
        ``KL(pi_rollout || pi_train)``) are measured on every row before the update.
        """
        if not rows:
            return {}
        self.budget.trainable_tokens += sum(r.num_trainable for r in rows)
        before = consistency_metrics(rows, self.scored(rows))
        self.engine.sleep()
        m = ppo_update(
            self.train_model,
            self.optimizer,
            None,
            rows,
            self.update_settings,
            generator=self.shuffle_gen,
            device=self.device,
            pad_id=self.tokenizer.pad_token_id or 0,
            ref_model=self.ref_model,
            world=self.world,
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
        return min(self.cfg.rollout.tasks_per_step, len(self.train_tasks)) * self.tparams.trunks_per_task

    def stage_cost(self, k: int) -> int:
        """Rollouts stage ``k`` of the current sweep generates (0 when they were generated in phase 1)."""
        return 0

    def has_more(self) -> bool:
        """Whether another stage runs: iterations left and the budget allows its rollouts."""
        if self.sweep is not None and self.sweep.stages:
            k = self.sweep.stages[0]
            return self.affordable(self.stage_cost(k), f"stage{k}")
        return self.iteration < self.cfg.train.steps and self.affordable(self.sweep_cost(), "phase1")

    unit = "stage"

    def progress(self) -> float:
        steps = self.cfg.train.steps
        frac = self.iteration / steps if steps else 1.0
        if self.budget.limit:
            frac = max(frac, self.budget.spent / self.budget.limit)
        return min(1.0, frac)

    def eval_due(self) -> bool:
        every = self.cfg.train.eval_every
        return self.sweep is None and bool(every) and self.iteration % every == 0

    def evaluate(self) -> dict[str, float]:
        self.sync_engine()  # evaluate the current weights
        return super().evaluate()

    def postfix(self, m: dict[str, Any]) -> dict[str, str]:
        return {"turn": str(m.get("rtpo/turn")), "ratio": f"{m.get('train/ratio_geomean', 1.0):.4f}"}

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
        if self.budget.clipped:  # the token budget ran out inside phase 1: nothing is trained
            self.step += 1
            return m | {"budget/incomplete_phases": 1.0} | self.budget.metrics()
        if not sweep.stages or not self.affordable(
            self.stage_cost(sweep.stages[0]), f"stage{sweep.stages[0]}"
        ):
            # Phase 1 spent the budget (or left nothing to train): a record without an update.
            if not sweep.stages:
                self.sweep, self.iteration = None, self.iteration + 1
            self.step += 1
            return m | self.budget.metrics()
        k = sweep.stages[0]
        if sweep.done % self.tparams.sync_every == 0:
            self.sync_engine()
        t1 = time.perf_counter()
        before = (self.budget.rollouts, self.budget.spent)
        batch = self.stage_batch(k)
        t2 = time.perf_counter()
        if self.budget.clipped:  # the token budget ran out inside this stage: discard it untrained
            self.step += 1
            return m | {"budget/incomplete_phases": 1.0} | self.budget.metrics()
        m.update(self.update(batch["rows"]))
        t3 = time.perf_counter()
        sweep.stages.pop(0)
        sweep.done += 1
        self.step += 1
        if not sweep.stages:
            self.sweep = None
            self.iteration += 1
            self.scheduler.step()
        m.update(rollout_metrics(batch["rollouts"]) | self.budget.metrics())
        m.update(batch.get("metrics", {}))
        weights = batch.get("weights") or [1.0]
        m.update(
            {
                "rtpo/iteration": float(sweep.iteration),
                "rtpo/turn": float(k),
                "rtpo/groups": float(len(batch["reward_sets"])),
                "rtpo/zero_adv_rate": zero_advantage_rate(batch["reward_sets"]),
                # the common key too (sibling sets are RTPO's groups): the zero-signal watch reads it
                "train/zero_adv_group_rate": zero_advantage_rate(batch["reward_sets"]),
                "rtpo/is_weight_mean": float(np.mean(weights)),
                "rtpo/is_weight_min": float(np.min(weights)),
                "rtpo/engine_fresh": float(batch.get("fresh", True)),
                "budget/stage_rollouts": float(self.budget.rollouts - before[0]),
                "budget/stage_gen_tokens": float(self.budget.spent - before[1]),
                "time/rollout_s": t2 - t1,
                "time/update_s": t3 - t2,
                "time/stage_s": t3 - t0,
                "time/step_s": t3 - t0,
                "throughput/tokens_per_s": (self.budget.spent - before[1]) / max(t2 - t1, 1e-9),
            }
        )
        if self.cfg.train.save_rollouts and batch["rollouts"] and self.is_main:
            t, notes = self.cfg.train, None
            if t.save_credit:
                notes = reverse_stage_records(batch, k, estimator=t.trainer, iteration=sweep.iteration)
            write_rollout_log(self.run_dir / "rollouts" / f"step_{self.step}.jsonl", batch["rollouts"], notes)
        self.logger.log_rollouts(self.step, batch["rollouts"])
        return m
