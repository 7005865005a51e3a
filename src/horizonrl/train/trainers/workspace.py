"""The run's workspace: everything one training run is built from, built once (:func:`build_workspace`).

What SkyRL and Tinker cookbook call the run's state: the device and torchrun
group, the environments and their tasks, the policy with its tokenizer and
renderer, the token budget, the rollout engines, the KL reference, the optimizer
and learning-rate schedule, the RNG streams, the sampling settings and loop
limits, the agent spec, the update's settings, the logger and the run
directories. Every trainer *holds* one (``trainer.ws``, through
:class:`WorkspaceTrainer`) instead of inheriting another trainer to get it, and
the parts of a checkpoint every trainer shares are the workspace's
(:meth:`RunWorkspace.state`, :meth:`RunWorkspace.restore`,
:meth:`RunWorkspace.save`); a trainer adds its own (an RTPO sweep, the
background collector).

The learning rate follows ``optim.schedule`` after ``optim.warmup_steps`` linear
warm-up steps (:func:`lr_lambda`)::

    lr(s) = lr * (s + 1) / W                                   s < W
    lr(s) = lr * 1/2 (1 + cos(pi f))      cosine,   f = (s - W) / (S - W)
    lr(s) = lr * (1 - f)                  linear
    lr(s) = lr                            constant (or S <= W)

with ``S = train.steps`` (Loshchilov & Hutter 2017, SGDR, for the cosine).
"""

from __future__ import annotations

import json
import math
import random
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from horizonrl.agents import LoopLimits
from horizonrl.agents.registry import AgentSpec
from horizonrl.config import RunConfig, save_config
from horizonrl.errors import HorizonWarning
from horizonrl.inference import SamplingParams
from horizonrl.models.chat import renderer_for
from horizonrl.models.lora import frozen_reference, trainable_parameters
from horizonrl.train.records import checkpoint as ckpt
from horizonrl.train.records import sharded_checkpoint
from horizonrl.train.records.metrics import MetricsLogger, NullLogger
from horizonrl.train.records.sharded_checkpoint import DCP_MARK
from horizonrl.train.rollout.budget import BudgetedEngine, TokenBudget
from horizonrl.train.rollout.collect import evaluate
from horizonrl.train.rollout.env_setup import env_setup
from horizonrl.train.rollout.tasks import TaskSampler
from horizonrl.train.rollout.workers import (
    close_quietly,
    driver_options,
    for_family,
    make_env_pool,
    make_rollout_engine,
)
from horizonrl.train.trainers.checks import check_resume_config, check_run, ensure_dir
from horizonrl.train.trainers.loop import Trainer
from horizonrl.train.trainers.registry import async_trainers
from horizonrl.train.update.lean import (
    enable_gradient_checkpointing,
    resolve_micro_batch_tokens,
    warn_emulated_bf16,
)
from horizonrl.train.update.ppo import UpdateSettings
from horizonrl.train.warmstart.bootstrap import load_policy, resolve_device
from horizonrl.train.warmstart.few_shot import few_shot_messages
from horizonrl.world import init_world

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from horizonrl.envs.core.base import Env, Task
    from horizonrl.envs.core.remote import EnvPool
    from horizonrl.inference import Engine
    from horizonrl.models.chat import ChatRenderer
    from horizonrl.train.rollout.env_setup import EnvSetup
    from horizonrl.world import World


def lr_lambda(warmup: int, total: int, schedule: str) -> Callable[[int], float]:
    """The learning-rate multiplier of step ``step`` (module docstring; ``torch`` ``LambdaLR``)."""

    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if schedule == "constant" or total <= warmup:
            return 1.0
        frac = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1 + math.cos(math.pi * frac)) if schedule == "cosine" else 1.0 - frac

    return f


@dataclass(eq=False)
class RunWorkspace:
    """One run's parts, built by :func:`build_workspace` and not reassigned afterwards (``logger`` is
    opened by :meth:`open_logger` once a resumed run knows its step)."""

    cfg: RunConfig
    """The run's validated config."""
    run_dir: Path
    """``train.out_dir``: config, metrics, rollouts, evaluations and checkpoints of the run."""
    ckpt_dir: Path
    """``run_dir / "checkpoints"``."""
    device: torch.device
    """Where the policy trains (``model.device``, or this rank's device under torchrun)."""
    world: World | None
    """The torchrun group (``None`` in one process): :mod:`horizonrl.world`."""
    env_setup: EnvSetup
    """The configured environment class, knobs and task source (``env``)."""
    train_tasks: list[Task]
    """``env.train_tasks`` tasks, drawn with ``env.seed``."""
    test_tasks: list[Task]
    """``env.test_tasks`` held-out tasks, drawn with ``env.seed``."""
    tasks_by_id: dict[str, Task]
    """Every train and test task by id (gold answers for feature providers)."""
    preamble: list[dict[str, Any]]
    """``rollout.few_shot`` expert episodes shown before every task (train and evaluation alike)."""
    model: torch.nn.Module
    """The policy being trained (``model``, ``train.init``)."""
    tokenizer: PreTrainedTokenizerBase
    """The policy's tokenizer."""
    renderer: ChatRenderer
    """Messages to token ids and back (``model.family``, ``rollout.thinking_history``)."""
    budget: TokenBudget
    """Generated tokens and rollouts so far against ``train.max_gen_tokens``."""
    env_pool: EnvPool | None
    """Environment workers (``distributed.env_actors``), or ``None``: environments in this process."""
    engine: Engine
    """The rollout engine over the policy (``inference.engine``); evaluation samples from it uncharged."""
    rollout_engine: BudgetedEngine
    """What rollouts are generated with: ``engine`` behind the token budget."""
    ref_model: torch.nn.Module | None
    """The frozen KL reference (``algo.kl_coef > 0``: the policy with its LoRA adapters off, else a
    frozen copy), else ``None``."""
    train_model: torch.nn.Module
    """What the update runs through: the model, DDP around it, or the model sharded in place (FSDP2)."""
    optimizer: torch.optim.Optimizer
    """AdamW over the trainable parameters (``optim``)."""
    scheduler: torch.optim.lr_scheduler.LambdaLR
    """The learning-rate schedule (:func:`lr_lambda`)."""
    task_rng: random.Random
    """Which training tasks each step draws (seeded with ``train.seed``)."""
    shuffle_gen: torch.Generator
    """The order of rows in the update's mini-batches (seeded with ``train.seed``)."""
    params: SamplingParams
    """Training rollouts' sampling settings (``rollout.temperature``, ``top_p``, ``max_new_tokens``)."""
    limits: LoopLimits
    """Turns, context budget and overflow policy of an episode (``rollout``)."""
    agent: str
    """The registered agent program (``rollout.agent``)."""
    update_settings: UpdateSettings
    """The PPO update's settings (:meth:`UpdateSettings.from_config`)."""
    logger: MetricsLogger | NullLogger | None = None
    """The metrics logger (:class:`MetricsLogger` on the main rank, a no-op on the others)."""

    @cached_property
    def spec(self) -> AgentSpec:
        """What the agent program of a training rollout is built from (:meth:`agent_spec` of ``params``)."""
        return self.agent_spec(self.params)

    @cached_property
    def task_sampler(self) -> TaskSampler:
        """Draws each step's ``rollout.tasks_per_step`` training tasks with ``task_rng``."""
        return TaskSampler(self.train_tasks, self.cfg.rollout.tasks_per_step, self.task_rng)

    @property
    def is_main(self) -> bool:
        """Whether this process writes files (one process, or rank 0 under torchrun)."""
        return self.world is None or self.world.is_main

    # ------------------------------------------------------------------ engines and environments

    def make_engine(self, *, shared: bool) -> Engine:
        """Another configured rollout engine over the policy (``shared=False``: its own weights)."""
        return _make_engine(
            self.cfg, self.model, self.tokenizer, self.device, self.world, self.renderer, shared
        )

    def make_env(self) -> Env:
        """A fresh environment (from the worker pool when there is one)."""
        if self.env_pool is not None:
            return self.env_pool.make()
        return self.env_setup.make()

    def agent_spec(self, params: SamplingParams) -> AgentSpec:
        """What an agent program sampling with ``params`` is built from (``rollout``)."""
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
            driver=driver_options(self.cfg),
        )

    def close(self) -> None:
        """Stop the engine's processes, the environment workers and the torchrun group (idempotent)."""
        close_quietly(self.engine)
        if self.env_pool is not None:
            self.env_pool.close()
        if self.world is not None:
            self.world.close()

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, step: int) -> dict[str, float]:
        """Held-out pass@1 / pass@k with its own RNG stream (training randomness is untouched), and with
        ``train.eval_greedy`` one greedy episode per task as ``eval_greedy/*``.

        Per-task success counts go to ``eval/step_N.json`` (with the run's generated tokens so far and
        the mean tool calls of an episode; ``greedy_correct`` beside ``correct``).
        """
        t = self.cfg.train
        sampled = SamplingParams(
            temperature=t.eval_temperature,
            top_p=self.cfg.rollout.top_p,
            max_new_tokens=self.cfg.rollout.max_new_tokens,
        )
        per_task: list[int] = []
        out = self._held_out(sampled, t.eval_samples, per_task)
        record = {
            "step": step,
            "gen_tokens": self.budget.spent,
            "samples": t.eval_samples,
            "tasks": [task.id for task in self.test_tasks],
            "correct": per_task,
            "tool_calls_mean": out.get("eval/rollout/tool_calls_mean"),
        }
        if t.eval_greedy:
            greedy: list[int] = []
            params = replace(sampled, greedy=True, temperature=1.0, top_p=1.0)
            g = self._held_out(params, 1, greedy)
            out.update({"eval_greedy/" + k.removeprefix("eval/"): v for k, v in g.items()})
            record |= {
                "greedy_correct": greedy,
                "greedy_tool_calls_mean": g.get("eval/rollout/tool_calls_mean"),
            }
        if self.is_main:
            (self.run_dir / "eval").mkdir(exist_ok=True)
            (self.run_dir / "eval" / f"step_{step}.json").write_text(json.dumps(record) + "\n")
        return out

    def _held_out(self, params: SamplingParams, samples: int, per_task: list[int]) -> dict[str, float]:
        """:func:`evaluate` on the held-out tasks from the evaluation seed, the training RNG restored."""
        t = self.cfg.train
        saved = self.engine.rng_state()
        self.engine.set_seed(t.eval_seed if t.eval_seed is not None else t.seed + 1_000_003)
        try:
            return evaluate(
                self.engine,
                self.renderer,
                self.make_env,
                self.test_tasks,
                samples=samples,
                params=params,
                limits=self.limits,
                agent=self.agent,
                spec=self.agent_spec(params),
                per_task=per_task,
            )
        finally:
            self.engine.set_rng_state(saved)

    # ------------------------------------------------------------------ checkpoints

    def state(self, *, evals_done: list[float], signal: dict[str, Any]) -> dict[str, Any]:
        """The checkpoint state every trainer shares: optimizer, schedule, RNG streams, budget, the
        evaluations done and the no-signal streak (``signal``); a trainer adds its own keys."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "task_rng": self.task_rng.getstate(),
            "shuffle_gen": self.shuffle_gen.get_state(),
            "engine_rng": self.engine.rng_state(),
            "global_rng": ckpt.rng_state(),
            "budget": self.budget.state(),
            "evals_done": list(evals_done),
            "threads": torch.get_num_threads(),
            "signal": signal,
        }

    def save(self, step: int, state: dict[str, Any]) -> Path:
        """Write the checkpoint of ``step`` (the weights and ``state``; sharded under torchrun)."""
        if self.world is not None:
            state["optimizer"] = DCP_MARK  # sharded: in the DCP files with the model
            return sharded_checkpoint.save_checkpoint(
                self.world,
                self.ckpt_dir,
                step,
                model=self.model,
                optimizer=self.optimizer,
                tokenizer=self.tokenizer,
                state=state,
                keep=self.cfg.train.keep_checkpoints,
            )
        return ckpt.save_checkpoint(
            self.ckpt_dir,
            step,
            model=self.model,
            tokenizer=self.tokenizer,
            state=state,
            keep=self.cfg.train.keep_checkpoints,
        )

    def restore(self, ck: ckpt.Checkpoint) -> dict[str, Any]:
        """Restore the shared part of a checkpoint read by :func:`~horizonrl.train.records.checkpoint.
        load_latest` (weights, optimizer, schedule, RNG streams, budget); returns its state for the
        trainer's own keys (``step``, ``evals_done``, ``signal``, ...)."""
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
        self.budget.load(st.get("budget", {}))
        threads = st.get("threads")
        if threads is not None and threads != torch.get_num_threads():
            warnings.warn(
                f"--resume: {ck.path} was written with {threads} torch thread(s), this process uses "
                f"{torch.get_num_threads()}; the resumed run may differ from an uninterrupted one in the "
                "last bits (set OMP_NUM_THREADS to match; docs/reliability.md)",
                HorizonWarning,
                stacklevel=4,
            )
        return st

    def open_logger(self, resume_step: int | None) -> None:
        """Save the config and open the metrics logger (a no-op logger off the main rank)."""
        if self.is_main:
            save_config(self.cfg, self.run_dir / "config.yaml")
            self.logger = MetricsLogger.from_config(self.run_dir, self.cfg, resume_step=resume_step)
        else:
            self.logger = NullLogger()


def _make_engine(cfg, model, tokenizer, device, world, renderer, shared: bool) -> Engine:
    engine = make_rollout_engine(cfg, model, tokenizer, device=device, shared=shared, world=world)
    return for_family(engine, renderer)


def build_workspace(cfg: RunConfig, *, resume: bool, shared_engine: bool, loss_agg_mode: str) -> RunWorkspace:
    """Build the run ``cfg`` describes (checked by ``check_run``), in one order that a fixed seed makes
    reproducible. ``shared_engine``: the engine follows the training weights (synced after every update);
    else it is a copy that only sees the weights at a sync. ``loss_agg_mode``: the update's, the config's
    or the trainer's default. The logger opens later (:meth:`RunWorkspace.open_logger`), after a resume."""
    check_run(cfg)
    run_dir = ensure_dir(cfg.train.out_dir, "train.out_dir")
    ckpt_dir = run_dir / "checkpoints"
    if resume:
        if not ckpt.list_checkpoints(ckpt_dir):
            raise FileNotFoundError(f"--resume: no checkpoint under {ckpt_dir}")
        check_resume_config(cfg, run_dir / "config.yaml")
    ckpt.clean_stale(ckpt_dir)
    torch.manual_seed(cfg.train.seed)
    device = resolve_device(cfg.model.device)
    world = init_world(cfg.distributed, device)
    if world is not None:
        device = world.device
    warn_emulated_bf16(cfg.train.precision, device)
    setup = env_setup(cfg.env, run_dir=run_dir)
    train_tasks = setup.tasks(cfg.env.train_tasks, seed=cfg.env.seed, split="train")
    test_tasks = setup.tasks(cfg.env.test_tasks, seed=cfg.env.seed, split="test")
    preamble = few_shot_messages(
        setup, cfg.rollout.few_shot, seed=cfg.env.seed, max_turns=cfg.rollout.max_turns
    )
    model, tokenizer = load_policy(cfg.model, init=cfg.train.init, work_dir=run_dir)
    model.to(device)
    renderer = renderer_for(tokenizer, cfg)
    budget = TokenBudget(limit=cfg.train.max_gen_tokens)
    env_pool = make_env_pool(cfg, setup)
    engine = _make_engine(cfg, model, tokenizer, device, world, renderer, shared_engine)
    ref_model = frozen_reference(model) if cfg.algo.kl_coef > 0 else None
    if cfg.train.gradient_checkpointing:  # the policy only; the frozen reference never runs a backward
        enable_gradient_checkpointing(model)
    # before the optimizer: FSDP2 shards the model's parameters in place
    train_model = world.wrap(model) if world is not None else model
    o = cfg.optim
    optimizer = torch.optim.AdamW(
        trainable_parameters(model), lr=o.lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay
    )
    r = cfg.rollout
    ws = RunWorkspace(
        cfg=cfg,
        run_dir=run_dir,
        ckpt_dir=ckpt_dir,
        device=device,
        world=world,
        env_setup=setup,
        train_tasks=train_tasks,
        test_tasks=test_tasks,
        tasks_by_id={t.id: t for t in [*train_tasks, *test_tasks]},
        preamble=preamble,
        model=model,
        tokenizer=tokenizer,
        renderer=renderer,
        budget=budget,
        env_pool=env_pool,
        engine=engine,
        rollout_engine=BudgetedEngine(engine, budget),
        ref_model=ref_model,
        train_model=train_model,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(
            optimizer, lr_lambda(o.warmup_steps, cfg.train.steps, o.schedule)
        ),
        task_rng=random.Random(cfg.train.seed),
        shuffle_gen=torch.Generator().manual_seed(cfg.train.seed),
        params=SamplingParams(temperature=r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens),
        limits=LoopLimits(max_turns=r.max_turns, context_budget=r.context_budget, overflow=r.overflow),
        agent=r.agent,
        update_settings=UpdateSettings.from_config(
            cfg,
            loss_agg_mode=loss_agg_mode,
            micro_batch_tokens=resolve_micro_batch_tokens(  # a LoRA reference shares the policy's weights
                cfg, model, device, frozen_copies=int(isinstance(ref_model, torch.nn.Module))
            ),
        ),
    )
    return ws


def _delegate(name: str) -> property:
    return property(
        lambda self: getattr(self.ws, name), doc=f"The workspace's ``{name}`` (:class:`RunWorkspace`)."
    )


class WorkspaceTrainer(Trainer):
    """A trainer over a :class:`RunWorkspace` (``self.ws``): evaluation, checkpoints and ``close`` of the
    workspace, the run counters (``step``, ``evals_done``) and read-only views of the workspace's parts
    (``trainer.model``, ``trainer.engine``, ...). A subclass builds the workspace with :meth:`setup`."""

    ws: RunWorkspace
    #: Whether the trainer can collect rollouts in the background (``train.max_staleness > 0``).
    collects_async = False
    #: Whether the trainer reads ``rollout.dynamic_sampling`` (train/rollout/dynamic.py).
    samples_dynamically = False

    cfg = _delegate("cfg")  # type: ignore[assignment]
    run_dir = _delegate("run_dir")
    ckpt_dir = _delegate("ckpt_dir")
    device = _delegate("device")
    world = _delegate("world")
    is_main = _delegate("is_main")
    env_setup = _delegate("env_setup")
    env_pool = _delegate("env_pool")
    train_tasks = _delegate("train_tasks")
    test_tasks = _delegate("test_tasks")
    tasks_by_id = _delegate("tasks_by_id")
    preamble = _delegate("preamble")
    model = _delegate("model")
    tokenizer = _delegate("tokenizer")
    renderer = _delegate("renderer")
    budget = _delegate("budget")
    engine = _delegate("engine")
    rollout_engine = _delegate("rollout_engine")
    ref_model = _delegate("ref_model")
    train_model = _delegate("train_model")
    optimizer = _delegate("optimizer")
    scheduler = _delegate("scheduler")
    task_rng = _delegate("task_rng")
    shuffle_gen = _delegate("shuffle_gen")
    params = _delegate("params")
    limits = _delegate("limits")
    agent = _delegate("agent")
    spec = _delegate("spec")
    task_sampler = _delegate("task_sampler")
    update_settings = _delegate("update_settings")
    logger = _delegate("logger")  # type: ignore[assignment]

    @property
    def loss_agg_mode(self) -> str:
        """How the update reduces per-token losses (``update_settings.loss_agg_mode``)."""
        return self.ws.update_settings.loss_agg_mode

    @property
    def env_cls(self) -> type:
        """The configured environment class (``env_setup.cls``)."""
        return self.ws.env_setup.cls

    @property
    def env_knobs(self) -> dict[str, Any]:
        """The configured environment's knobs (``env_setup.knobs``)."""
        return self.ws.env_setup.knobs

    def setup(self, cfg: RunConfig, *, resume: bool, loss_agg_mode: str) -> None:
        """Build the workspace (:func:`build_workspace`) and start the run's counters."""
        self.ws = build_workspace(
            cfg, resume=resume, shared_engine=self.shares_engine(), loss_agg_mode=loss_agg_mode
        )
        self.step = 0
        self.evals_done: list[float] = []
        if cfg.train.max_staleness > 0:
            from horizonrl.train.rollout.staleness import check_async

            check_async(cfg, self.ws.world, supported=self.collects_async, trainers=async_trainers())

    def resume_and_log(self, resume: bool) -> None:
        """Restore the latest checkpoint when resuming, then open the logger at the run's step."""
        resume_step = None
        if resume:
            self._restore(ckpt.load_latest(self.ws.ckpt_dir))
            self.engine.sync()  # an engine with its own weights (vllm) loads the restored ones
            resume_step = self.step
        self.ws.open_logger(resume_step)

    def shares_engine(self) -> bool:
        """Whether the engine follows the training weights (synced after every update)."""
        return True

    def make_engine(self, *, shared: bool) -> Engine:
        """Another configured rollout engine over the policy (:meth:`RunWorkspace.make_engine`)."""
        return self.ws.make_engine(shared=shared)

    def make_env(self) -> Env:
        return self.ws.make_env()

    def agent_spec(self, params: SamplingParams) -> AgentSpec:
        return self.ws.agent_spec(params)

    def evaluate(self) -> dict[str, float]:
        """Held-out evaluation of the current weights (:meth:`RunWorkspace.evaluate`)."""
        return self.ws.evaluate(self.step)

    def close(self) -> None:
        """Stop the workspace's engine, environment workers and torchrun group (idempotent)."""
        self.ws.close()

    def _state(self) -> dict[str, Any]:
        return self.ws.state(evals_done=self.evals_done, signal=self.signal_watch().state())

    def save(self) -> Path:
        return self.ws.save(self.step, self._state())

    def _restore(self, ck: ckpt.Checkpoint) -> None:
        st = self.ws.restore(ck)
        self.step = int(st["step"])
        self.evals_done = list(st.get("evals_done", []))
        self.signal_watch().load(st.get("signal", {}))
