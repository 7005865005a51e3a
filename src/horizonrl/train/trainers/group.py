"""The group trainer: GRPO and every estimator that reads groups of rollouts.

One step (DESIGN.md, ``train/``): sample ``tasks_per_step`` tasks, collect ``G``
rollouts each with the batched agent loop, ask the configured credit estimator
for per-token advantages, build rows, run the PPO update, log, checkpoint. The
run loop itself (evaluation, logging, checkpoints) is :class:`~horizonrl.train.trainers.loop.Trainer`'s.

With ``algo.train_context: flat`` each agent turn is trained under its flat
history ``S_k`` instead of the context it was sampled from (flattened GRPO, the
RTPO paper's baseline; :func:`horizonrl.agents.psi.flat_view`). With
``train.max_gen_tokens`` the run ends before a step predicted to overrun the
budget, and a step the budget cut short is discarded untrained
(:mod:`horizonrl.train.rollout.budget`).
"""

from __future__ import annotations

import json
import math
import random
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from horizonrl import credit
from horizonrl.agents import LoopLimits
from horizonrl.agents.psi import flat_view
from horizonrl.agents.registry import AgentSpec
from horizonrl.config import RunConfig, save_config
from horizonrl.errors import HorizonWarning
from horizonrl.inference import SamplingParams
from horizonrl.models.chat import renderer_for
from horizonrl.models.lora import frozen_reference, trainable_parameters
from horizonrl.train.records import checkpoint as ckpt
from horizonrl.train.records import sharded_checkpoint
from horizonrl.train.records.metrics import MetricsLogger, NullLogger
from horizonrl.train.records.rollout_log import credit_records, write_rollout_log
from horizonrl.train.records.sharded_checkpoint import DCP_MARK
from horizonrl.train.rollout.budget import BudgetedEngine, TokenBudget
from horizonrl.train.rollout.collect import collect_groups, evaluate, rollout_metrics
from horizonrl.train.rollout.env_setup import env_setup
from horizonrl.train.rollout.workers import close_quietly, for_family, make_env_pool, make_rollout_engine
from horizonrl.train.trainers.checks import check_resume_config, check_run, ensure_dir
from horizonrl.train.trainers.features import FeatureContext, compute_features
from horizonrl.train.trainers.loop import Trainer
from horizonrl.train.trainers.registry import register_trainer
from horizonrl.train.update.lean import enable_gradient_checkpointing, resolve_micro_batch_tokens
from horizonrl.train.update.ppo import UpdateSettings, ppo_update
from horizonrl.train.warmstart.bootstrap import load_policy, resolve_device
from horizonrl.train.warmstart.few_shot import few_shot_messages
from horizonrl.trajectory import Group, build_rows
from horizonrl.world import init_world

#: Prefixes of the metric keys that measure wall-clock time (everything else is bit-identical for the
#: same config and seed: tests/test_reliability.py, docs/reliability.md).
NONDETERMINISTIC_KEYS = ("time/", "throughput/")


def _lr_lambda(warmup: int, total: int, schedule: str):
    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if schedule == "constant" or total <= warmup:
            return 1.0
        frac = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1 + math.cos(math.pi * frac)) if schedule == "cosine" else 1.0 - frac

    return f


@register_trainer("group")
class GroupTrainer(Trainer):
    """Owns the policy, engine, optimizer and run directory of one training run."""

    def __init__(self, cfg: RunConfig, *, resume: bool = False) -> None:
        check_run(cfg)
        self.cfg = cfg
        self.run_dir = ensure_dir(cfg.train.out_dir, "train.out_dir")
        self.ckpt_dir = self.run_dir / "checkpoints"
        if resume:
            if not ckpt.list_checkpoints(self.ckpt_dir):
                raise FileNotFoundError(f"--resume: no checkpoint under {self.ckpt_dir}")
            check_resume_config(cfg, self.run_dir / "config.yaml")
        ckpt.clean_stale(self.ckpt_dir)
        torch.manual_seed(cfg.train.seed)
        self.device = resolve_device(cfg.model.device)
        #: The torchrun group (None in one process): see horizonrl/world.py.
        self.world = init_world(cfg.distributed, self.device)
        self.is_main = self.world is None or self.world.is_main
        if self.world is not None:
            self.device = self.world.device

        self.estimator = credit.get_estimator(cfg.algo.estimator)
        self.loss_agg_mode = cfg.algo.loss_agg_mode or self.estimator.loss_agg_mode
        self.env_setup = env_setup(cfg.env, run_dir=self.run_dir)
        self.env_cls, self.env_knobs = self.env_setup.cls, self.env_setup.knobs
        self.train_tasks = self.env_setup.tasks(cfg.env.train_tasks, seed=cfg.env.seed, split="train")
        self.test_tasks = self.env_setup.tasks(cfg.env.test_tasks, seed=cfg.env.seed, split="test")
        self.tasks_by_id = {t.id: t for t in [*self.train_tasks, *self.test_tasks]}
        #: ``rollout.few_shot`` expert episodes shown before every task (train and evaluation alike).
        self.preamble = few_shot_messages(
            self.env_setup, cfg.rollout.few_shot, seed=cfg.env.seed, max_turns=cfg.rollout.max_turns
        )

        self.model, self.tokenizer = load_policy(cfg.model, init=cfg.train.init, work_dir=self.run_dir)
        self.model.to(self.device)
        self.renderer = renderer_for(self.tokenizer, cfg)
        self.budget = TokenBudget(limit=cfg.train.max_gen_tokens)
        self.evals_done: list[float] = []
        self.env_pool = make_env_pool(cfg, self.env_setup)  # None: environments in this process
        self.engine = self.make_engine(shared=self.shares_engine())
        #: What rollouts are generated with: the engine behind the token budget (evaluation is not charged).
        self.rollout_engine = BudgetedEngine(self.engine, self.budget)
        self.ref_model = None
        if cfg.algo.kl_coef > 0:
            # LoRA: the policy with its adapters off (no copy of the weights); else a frozen copy.
            self.ref_model = frozen_reference(self.model)
        if cfg.train.gradient_checkpointing:  # the policy only; the frozen reference never runs a backward
            enable_gradient_checkpointing(self.model)
        #: What the update runs through: the model, DDP around it, or the model sharded in place (FSDP2).
        self.train_model = self.world.wrap(self.model) if self.world is not None else self.model
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(
            trainable_parameters(self.model), lr=o.lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, _lr_lambda(o.warmup_steps, cfg.train.steps, o.schedule)
        )
        self.task_rng = random.Random(cfg.train.seed)
        self.shuffle_gen = torch.Generator().manual_seed(cfg.train.seed)
        self.step = 0
        self.params = SamplingParams(
            temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p,
            max_new_tokens=cfg.rollout.max_new_tokens,
        )
        self.limits = LoopLimits(
            max_turns=cfg.rollout.max_turns,
            context_budget=cfg.rollout.context_budget,
            overflow=cfg.rollout.overflow,
        )
        self.agent = cfg.rollout.agent
        self.spec = self.agent_spec(self.params)
        #: Each feature provider's own state across steps (FeatureContext.state), by provider name.
        self.feature_state: dict[str, dict[str, Any]] = {}
        self.update_settings = UpdateSettings.from_config(
            cfg,
            loss_agg_mode=self.loss_agg_mode,
            micro_batch_tokens=resolve_micro_batch_tokens(  # a LoRA reference shares the policy's weights
                cfg, self.model, self.device, frozen_copies=int(isinstance(self.ref_model, torch.nn.Module))
            ),
        )
        #: Background collection of future batches (train.max_staleness > 0), else None.
        self.async_rollouts = None
        if cfg.train.max_staleness > 0:
            from horizonrl.train.rollout.staleness import AsyncRollouts, check_async

            check_async(cfg, self.world)
            self.async_rollouts = AsyncRollouts(self)
        resume_step = None
        if resume:
            self._restore(ckpt.load_latest(self.ckpt_dir))
            self.engine.sync()  # an engine with its own weights (vllm) loads the restored ones
            resume_step = self.step
        if self.is_main:
            save_config(cfg, self.run_dir / "config.yaml")
            self.logger = MetricsLogger.from_config(self.run_dir, cfg, resume_step=resume_step)
        else:
            self.logger = NullLogger()

    # ------------------------------------------------------------------ state

    def _state(self) -> dict[str, Any]:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "task_rng": self.task_rng.getstate(),
            "shuffle_gen": self.shuffle_gen.get_state(),
            "engine_rng": self.engine.rng_state(),
            "global_rng": ckpt.rng_state(),
            "budget": self.budget.state(),
            "evals_done": list(self.evals_done),
            "threads": torch.get_num_threads(),
            "signal": self.signal_watch().state(),
            **({"async": self.async_rollouts.state()} if self.async_rollouts is not None else {}),
        }

    def save(self) -> Path:
        if self.world is not None:
            state = self._state()
            state["optimizer"] = DCP_MARK  # sharded: in the DCP files with the model
            return sharded_checkpoint.save_checkpoint(
                self.world,
                self.ckpt_dir,
                self.step,
                model=self.model,
                optimizer=self.optimizer,
                tokenizer=self.tokenizer,
                state=state,
                keep=self.cfg.train.keep_checkpoints,
            )
        return ckpt.save_checkpoint(
            self.ckpt_dir,
            self.step,
            model=self.model,
            tokenizer=self.tokenizer,
            state=self._state(),
            keep=self.cfg.train.keep_checkpoints,
        )

    def _restore(self, ck: ckpt.Checkpoint) -> None:
        """Restore a checkpoint read whole by :func:`~horizonrl.train.records.checkpoint.load_latest`."""
        st = ck.state
        if self.world is not None or st["optimizer"] == DCP_MARK:  # torch distributed checkpointing
            sharded_checkpoint.load_checkpoint(ck.path, self.model, self.optimizer)
        else:
            ckpt.load_weights_into(self.model, ck.weights)
            self.optimizer.load_state_dict(st["optimizer"])
        self.scheduler.load_state_dict(st["scheduler"])
        self.task_rng.setstate(st["task_rng"])
        self.shuffle_gen.set_state(st["shuffle_gen"])
        self.engine.set_rng_state(st["engine_rng"])
        ckpt.set_rng_state(st["global_rng"])
        self.step = int(st["step"])
        self.budget.load(st.get("budget", {}))
        self.evals_done = list(st.get("evals_done", []))
        self.signal_watch().load(st.get("signal", {}))
        threads = st.get("threads")
        if threads is not None and threads != torch.get_num_threads():
            warnings.warn(
                f"--resume: {ck.path} was written with {threads} torch thread(s), this process uses "
                f"{torch.get_num_threads()}; the resumed run may differ from an uninterrupted one in the "
                "last bits (set OMP_NUM_THREADS to match; docs/reliability.md)",
                HorizonWarning,
                stacklevel=3,
            )
        if self.async_rollouts is not None and "async" in st:
            self.async_rollouts.load(st["async"])

    # ------------------------------------------------------------------ loop

    def shares_engine(self) -> bool:
        """Whether the engine follows the training weights (synced after every update)."""
        return True

    def make_engine(self, *, shared: bool):
        """The configured rollout engine over the training model (``inference.engine``, ``distributed``)."""
        engine = make_rollout_engine(
            self.cfg, self.model, self.tokenizer, device=self.device, shared=shared, world=self.world
        )
        return for_family(engine, self.renderer)

    def make_env(self):
        if self.env_pool is not None:
            return self.env_pool.make()
        return self.env_setup.make()

    def close(self) -> None:
        """Stop the engine's processes (vllm, Ray replicas), the environment workers, the background
        collector and the torchrun group; the trainer cannot generate afterwards (idempotent)."""
        if self.async_rollouts is not None:
            self.async_rollouts.close()
        close_quietly(self.engine)
        if self.env_pool is not None:
            self.env_pool.close()
        if self.world is not None:
            self.world.close()

    def agent_spec(self, params: SamplingParams) -> AgentSpec:
        r = self.cfg.rollout
        return AgentSpec(
            renderer=self.renderer,
            params=params,
            limits=self.limits,
            context=r.context,
            context_params=dict(r.context_params),
            agent_params=dict(r.agent_params),
            make_env=self.make_env,
            preamble=self.preamble,
        )

    def evaluate(self) -> dict[str, float]:
        """Held-out pass@1 / pass@k with its own RNG stream (training randomness is untouched).

        Per-task success counts go to ``eval/step_N.json`` (with the run's generated tokens so far).
        """
        saved = self.engine.rng_state()
        t = self.cfg.train
        self.engine.set_seed(t.eval_seed if t.eval_seed is not None else t.seed + 1_000_003)
        per_task: list[int] = []
        params = SamplingParams(
            temperature=self.cfg.train.eval_temperature,
            top_p=self.cfg.rollout.top_p,
            max_new_tokens=self.cfg.rollout.max_new_tokens,
        )
        try:
            out = evaluate(
                self.engine,
                self.renderer,
                self.make_env,
                self.test_tasks,
                samples=self.cfg.train.eval_samples,
                params=params,
                limits=self.limits,
                agent=self.agent,
                spec=self.agent_spec(params),
                per_task=per_task,
            )
        finally:
            self.engine.set_rng_state(saved)
        if not self.is_main:
            return out
        (self.run_dir / "eval").mkdir(exist_ok=True)
        record = {
            "step": self.step,
            "gen_tokens": self.budget.spent,
            "samples": t.eval_samples,
            "tasks": [task.id for task in self.test_tasks],
            "correct": per_task,
        }
        (self.run_dir / "eval" / f"step_{self.step}.json").write_text(json.dumps(record) + "\n")
        return out

    def collect(self, tasks) -> list[Group]:
        """``G`` rollouts of every task through the configured agent program (one batched drive)."""
        return collect_groups(
            self.rollout_engine,
            self.renderer,
            self.make_env,
            tasks,
            self.cfg.rollout.group_size,
            self.params,
            self.limits,
            tag=f"s{self.step}-",
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
        if self.cfg.algo.train_context == "flat":
            rollouts = [flat_view(r, self.renderer) for r in rollouts]
        return build_rows(rollouts, advantages, temperature=self.cfg.rollout.temperature)

    def train_step(self) -> dict[str, float]:
        cfg = self.cfg
        t0 = time.perf_counter()
        spent = self.budget.spent
        settings, stale = self.update_settings, {}
        if self.async_rollouts is not None:  # sampled in the background by the weights of step - k
            groups, stale = self.async_rollouts.take(self.step)
            settings = self.async_rollouts.update_settings(settings, stale)
        else:
            tasks = self.task_rng.sample(
                self.train_tasks, min(cfg.rollout.tasks_per_step, len(self.train_tasks))
            )
            groups = self.collect(tasks)
        t1 = time.perf_counter()
        rollouts = credit.flatten_rollouts(groups)
        self.budget.rollouts += len(rollouts)
        if self.budget.clipped:  # the budget ran out inside this step: discard it untrained
            self.step += 1
            return {"budget/incomplete_phases": 1.0, "time/rollout_s": t1 - t0} | self.budget.metrics()
        self.budget.record_phase("step", len(rollouts), self.budget.spent - spent)
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
        gen_tokens = sum(r.num_response_tokens for r in rollouts)
        flat_adv = np.concatenate([np.asarray(t) for r in advantages for s in r for t in s] or [np.zeros(0)])
        metrics.update(rollout_metrics(rollouts))
        metrics.update(feature_metrics)
        metrics.update(self.budget.metrics())
        metrics.update(stale)
        metrics.update(
            {
                "train/zero_adv_token_rate": float(np.mean(flat_adv == 0.0)) if flat_adv.size else 0.0,
                "train/zero_adv_group_rate": float(np.mean([len(set(g.rewards)) <= 1 for g in groups])),
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
