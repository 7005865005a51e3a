"""The group trainer: GRPO and every estimator that reads groups of rollouts.

One step (docs/design.md, ``train/``): sample ``tasks_per_step`` tasks, collect ``G``
rollouts each with the batched agent loop, ask the configured credit estimator
for per-token advantages, build rows, run the PPO update, log, checkpoint. The
run loop itself (evaluation, logging, checkpoints) is :class:`~horizonrl.train.trainers.loop.Trainer`'s,
and everything the run is built from (policy, engines, optimizer, RNGs, logger) is the workspace's
(:mod:`horizonrl.train.trainers.workspace`), which the trainer holds as ``self.ws``.

Each turn is trained under the view ``algo.train_context`` names
(:mod:`horizonrl.train.trainers.train_context`): the context it was sampled from,
or one a method registers (e.g. a flattened history). With
``train.max_gen_tokens`` the run ends before a step predicted to overrun the
budget, and a step the budget cut short is discarded untrained
(:mod:`horizonrl.train.rollout.budget`). With ``rollout.dynamic_sampling`` a step
draws tasks until it holds ``tasks_per_step`` groups whose rewards differ
(:mod:`horizonrl.train.rollout.dynamic`); its rollout metrics, zero-advantage
group rate and budget count every group drawn, its update the groups kept.
"""

from __future__ import annotations

import copy
import dataclasses
import time
import warnings
from typing import Any

import numpy as np

from horizonrl import credit
from horizonrl.config import RunConfig
from horizonrl.errors import HorizonWarning
from horizonrl.models.chat import renderer_for
from horizonrl.train.records.rollout_log import credit_records, write_rollout_log
from horizonrl.train.rollout.collect import collect_groups, rollout_metrics
from horizonrl.train.rollout.dynamic import fill_with_signal, has_signal
from horizonrl.train.trainers.checks import check_run
from horizonrl.train.trainers.features import FeatureContext, compute_features
from horizonrl.train.trainers.registry import register_trainer
from horizonrl.train.trainers.train_context import train_context_view
from horizonrl.train.trainers.workspace import WorkspaceTrainer
from horizonrl.train.update.ppo import ppo_update
from horizonrl.trajectory import Group, build_rows

#: Prefixes of the metric keys that measure wall-clock time (everything else is bit-identical for the
#: same config and seed: tests/train/test_reliability.py, docs/reliability.md).
NONDETERMINISTIC_KEYS = ("time/", "throughput/")


@register_trainer("group")
class GroupTrainer(WorkspaceTrainer):
    """GRPO and every estimator over groups of rollouts, on the run's workspace (``self.ws``)."""

    collects_async = True
    samples_dynamically = True

    def __init__(self, cfg: RunConfig, *, resume: bool = False) -> None:
        check_run(cfg)  # before the estimator lookup: a bad config is named by the checks
        #: The configured credit estimator (``algo.estimator``).
        self.estimator = credit.get_estimator(cfg.algo.estimator)
        self.setup(cfg, resume=resume, loss_agg_mode=cfg.algo.loss_agg_mode or self.estimator.loss_agg_mode)
        #: Each feature provider's own state across steps (FeatureContext.state), by provider name.
        self.feature_state: dict[str, dict[str, Any]] = {}
        #: Whether the run said that dynamic sampling reached rollout.max_draws (said once a run).
        self.warned_cap = False
        #: Background collection of future batches (train.max_staleness > 0), else None.
        self.async_rollouts = None
        if cfg.train.max_staleness > 0:
            from horizonrl.train.rollout.staleness import AsyncRollouts

            ws = self.ws
            tok = copy.deepcopy(ws.tokenizer)  # one tokenizer per thread
            self.async_rollouts = AsyncRollouts(
                max_staleness=cfg.train.max_staleness,
                steps=cfg.train.steps,
                engine_factory=lambda: ws.make_engine(shared=False),
                spec=dataclasses.replace(ws.spec, renderer=renderer_for(tok, cfg)),
                agent=ws.agent,
                group_size=cfg.rollout.group_size,
                tasks=ws.task_sampler,
                budget=ws.budget,
            )
        self.resume_and_log(resume)

    # ------------------------------------------------------------------ state

    def _state(self) -> dict[str, Any]:
        st = super()._state()
        if self.async_rollouts is not None:
            st["async"] = self.async_rollouts.state()
        return st

    def _restore(self, ck) -> None:
        super()._restore(ck)
        if self.async_rollouts is not None and "async" in ck.state:
            self.async_rollouts.load(ck.state["async"])

    # ------------------------------------------------------------------ loop

    def close(self) -> None:
        """Stop the engine's processes (vllm, Ray replicas), the environment workers, the background
        collector and the torchrun group; the trainer cannot generate afterwards (idempotent)."""
        if self.async_rollouts is not None:
            self.async_rollouts.close()
        self.ws.close()

    def collect(self, tasks, draw: int = 0) -> list[Group]:
        """``G`` rollouts of every task through the configured agent program (one batched drive);
        ``draw``: the step's draw under dynamic sampling (rollout uids ``s{step}-d{draw}-...`` after the
        first)."""
        return collect_groups(
            self.rollout_engine,
            self.renderer,
            self.make_env,
            tasks,
            self.cfg.rollout.group_size,
            self.params,
            self.limits,
            tag=f"s{self.step}-" if draw == 0 else f"s{self.step}-d{draw}-",
            agent=self.agent,
            spec=self.spec,
        )

    def step_rollouts(self) -> int:
        return min(self.cfg.rollout.tasks_per_step, len(self.train_tasks)) * self.cfg.rollout.group_size

    def has_more(self) -> bool:
        b = self.budget
        return (
            self.step < self.cfg.train.steps and not b.clipped and b.affordable("step", self.step_rollouts())
        )

    def advance(self) -> dict[str, float]:
        return self.train_step()

    def draw_groups(self) -> tuple[list[Group], list[Group], dict[str, float]]:
        """This step's groups to train on, every group drawn, and the draws' metrics: one draw of
        ``tasks_per_step`` tasks, or with ``rollout.dynamic_sampling`` as many as fill the step with
        groups that carry signal (:func:`~horizonrl.train.rollout.dynamic.fill_with_signal`)."""
        r = self.cfg.rollout
        if not r.dynamic_sampling:
            groups = self.collect(self.task_sampler.sample())
            return groups, groups, {}
        want = min(r.tasks_per_step, len(self.train_tasks))
        filled = fill_with_signal(
            lambda k: self.collect(self.task_sampler.sample(), k),
            want,
            r.max_draws,
            stop=lambda: self.budget.clipped,  # the budget ran out: the step is discarded anyway
        )
        if filled.capped and not self.budget.clipped and not self.warned_cap:
            self.warned_cap = True
            warnings.warn(
                f"step {self.step + 1}: dynamic sampling reached rollout.max_draws={r.max_draws} with "
                f"{sum(map(has_signal, filled.drawn))} of {want} groups with signal; the "
                "step trains on what it has (rollout/dynamic_cap_reached counts such steps; said once)",
                HorizonWarning,
                stacklevel=2,
            )
        return filled.kept, filled.drawn, filled.metrics()

    def feature_context(self, name: str) -> FeatureContext:
        """What feature provider ``name`` may use this step (its ``state`` lasts the run)."""
        return FeatureContext(
            cfg=self.cfg,
            engine=self.engine,
            renderer=self.renderer,
            tokenizer=self.tokenizer,
            model=self.model,
            ref_model=self.ref_model,
            tasks_by_id=self.tasks_by_id,
            step=self.step,
            run_dir=self.run_dir,
            state=self.feature_state.setdefault(name, {}),
        )

    def training_rows(self, rollouts, advantages) -> list:
        """Rows of the step: each turn under its sampled context, or its flat history (algo.train_context)."""
        view = train_context_view(self.cfg.algo.train_context)
        rollouts = [view(r, self.renderer) for r in rollouts]
        return build_rows(rollouts, advantages, temperature=self.cfg.rollout.temperature)

    def train_step(self) -> dict[str, float]:
        cfg = self.cfg
        t0 = time.perf_counter()
        spent = self.budget.spent
        settings, stale, draws = self.update_settings, {}, {}
        if self.async_rollouts is not None:  # sampled in the background by the weights of step - k
            groups, stale = self.async_rollouts.take(self.step, self.model)
            settings = self.async_rollouts.update_settings(settings, stale)
            drawn = groups
        else:
            groups, drawn, draws = self.draw_groups()
        t1 = time.perf_counter()
        rollouts = credit.flatten_rollouts(groups)
        sampled = credit.flatten_rollouts(drawn) if drawn is not groups else rollouts
        self.budget.rollouts += len(sampled)
        if self.budget.clipped:  # the budget ran out inside this step: discard it untrained
            self.step += 1
            return {"budget/incomplete_phases": 1.0, "time/rollout_s": t1 - t0} | self.budget.metrics()
        self.budget.record_phase("step", len(sampled), self.budget.spent - spent)
        est_params = dict(cfg.algo.estimator_params)
        features, feature_metrics = compute_features(
            self.feature_context, self.estimator.needs, groups, est_params
        )
        with credit.collect_side_info(cfg.train.save_rollouts and cfg.train.save_credit) as side:
            advantages = self.estimator(groups, **est_params, **features)
        rows = self.training_rows(rollouts, advantages)
        self.budget.trainable_tokens += sum(r.num_trainable for r in rows)
        t2 = time.perf_counter()
        self.engine.sleep()  # colocated engines free their accelerator memory (inference.params.sleep_level)
        metrics = ppo_update(
            self.train_model,
            self.optimizer,
            self.scheduler,
            rows,
            settings,
            generator=self.shuffle_gen,
            device=self.device,
            pad_id=self.tokenizer.pad_token_id or 0,
            ref_model=self.ref_model,
            world=self.world,
        )
        self.engine.sync()  # the engine samples from the updated weights (in place for vllm)
        if self.async_rollouts is not None:
            self.async_rollouts.publish(self.step + 1, self.model)
        t3 = time.perf_counter()
        self.step += 1
        gen_tokens = sum(r.num_response_tokens for r in sampled)
        flat_adv = np.concatenate([np.asarray(t) for r in advantages for s in r for t in s] or [np.zeros(0)])
        metrics.update(rollout_metrics(sampled))
        metrics.update(draws)
        metrics.update(feature_metrics)
        metrics.update(self.budget.metrics())
        metrics.update(stale)
        metrics.update(
            {
                "train/zero_adv_token_rate": float(np.mean(flat_adv == 0.0)) if flat_adv.size else 0.0,
                "train/zero_adv_group_rate": float(np.mean([not has_signal(g) for g in drawn])),
                "time/rollout_s": t1 - t0,
                "time/credit_s": t2 - t1,
                "time/update_s": t3 - t2,
                "time/step_s": t3 - t0,
                "throughput/tokens_per_s": gen_tokens / max(t1 - t0, 1e-9),
            }
        )
        if cfg.train.save_rollouts and self.is_main:
            notes = None
            if cfg.train.save_credit:
                notes = credit_records(rollouts, advantages, rows, side, estimator=cfg.algo.estimator)
            write_rollout_log(self.run_dir / "rollouts" / f"step_{self.step}.jsonl", rollouts, notes)
        self.logger.log_rollouts(self.step, rollouts)
        return metrics
