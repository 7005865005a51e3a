"""Asynchronous rollouts with bounded staleness (``train.max_staleness: k``; docs/scale.md).

With ``k > 0`` a background thread collects the batches of future steps on its own
engine (``make_engine(shared=False)``: a copy of the weights for the ``hf`` engine,
separate replicas for ``distributed.backend=ray``) while the trainer trains:

- the trainer *publishes* policy version ``v`` (a CPU copy of the weights after
  ``v`` updates) before step ``v`` — version 0 at the start, ``s + 1`` after the
  update of step ``s``;
- the batch of step ``b`` is sampled by version ``w(b) = max(v0, b - k)`` (``v0``:
  the first published version), so it can be generated as soon as that version
  exists: while step ``b - 1`` trains when ``k = 1``; up to ``k`` steps ahead in
  general. Staleness ``b - w(b)`` is never above ``k``.

Every turn is tagged ``Turn.info["policy_version"] = w(b)``; the step logs
``async/staleness_mean`` / ``_max`` (``step - version`` over the batch's turns),
``async/policy_version`` and ``async/wait_s`` (how long the trainer waited for the
batch: 0 when generation kept ahead). A stale batch is trained with
``algo.old_logprobs=recompute`` (PPO's ``pi_old`` is the current weights'
log-probs of the sampled tokens, the rollout log-probs stay the behaviour
policy's, and any mismatch correction applies on top), logged as
``async/recomputed``.

The schedule does not depend on timing: which version samples which batch,
the task draws (``task_rng``, only the collector draws), and the collector
engine's RNG are fixed, so a run is reproducible and resumes exactly — a
checkpoint waits until the collector is idle and stores the batches it holds,
its RNG states and the weights of the (at most ``k``) versions that batches not
yet generated will be sampled by. ``k = 0`` does not construct this class: the trainer runs
exactly as before.

Not combined with torchrun (the thread's collectives would interleave with the
update's) or with a token budget (``train.max_gen_tokens``), and only for a
trainer that declares ``collects_async`` (the group trainer). The collector is
given what it uses explicitly: an engine factory, the agent spec, the task
sampler (:class:`~horizonrl.train.rollout.tasks.TaskSampler`) and the token
budget it charges.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from horizonrl.inference.ray_engine import cpu_state_dict
from horizonrl.train.rollout.budget import BudgetedEngine, TokenBudget
from horizonrl.train.rollout.collect import collect_groups
from horizonrl.train.rollout.workers import close_quietly

if TYPE_CHECKING:
    from horizonrl.agents.registry import AgentSpec
    from horizonrl.inference import Engine
    from horizonrl.train.rollout.tasks import TaskSampler


def check_async(cfg, world, *, supported: bool, trainers: Sequence[str]) -> None:
    """Raise ValueError naming the setting that async rollouts cannot run with (``supported``: whether the
    configured trainer collects in the background; ``trainers``: those that do, for the message)."""
    k = cfg.train.max_staleness
    if not supported:
        raise ValueError(
            f"train.max_staleness={k}: asynchronous rollouts need train.trainer={'|'.join(trainers)}"
        )
    if cfg.train.max_gen_tokens:
        raise ValueError(f"train.max_staleness={k}: not with a token budget (train.max_gen_tokens)")
    if world is not None:
        raise ValueError(f"train.max_staleness={k}: not under torchrun (WORLD_SIZE > 1)")


def staleness_metrics(groups, step: int) -> dict[str, float]:
    """``async/staleness_mean`` / ``_max`` over the tagged turns of ``groups`` (step - policy version)."""
    ages = [
        step - t.info["policy_version"]
        for g in groups
        for r in g.rollouts
        for t in r.turns
        if "policy_version" in t.info
    ]
    if not ages:
        return {}
    return {"async/staleness_mean": sum(ages) / len(ages), "async/staleness_max": float(max(ages))}


class AsyncRollouts:
    """The collector thread and its hand-over with the trainer (module docstring)."""

    def __init__(
        self,
        *,
        max_staleness: int,
        steps: int,
        engine_factory: Callable[[], Engine],
        spec: AgentSpec,
        agent: str,
        group_size: int,
        tasks: TaskSampler,
        budget: TokenBudget,
    ) -> None:
        """``engine_factory()``: the collector's own engine (called once, here); ``spec``: the agent spec
        the collector builds its programs from (with a renderer of its own: one tokenizer per thread);
        ``tasks``: the run's task sampler (only the collector draws); ``budget``: charged with a batch's
        generated tokens when the trainer takes it."""
        self.k = max_staleness
        self.steps = steps
        self.engine = engine_factory()
        self.spec = spec
        self.agent = agent
        self.group_size = group_size
        self.tasks = tasks
        self.budget = budget
        self.cond = threading.Condition()
        self.versions: dict[int, dict] = {}
        self.first_version: int | None = None
        self.batches: dict[int, tuple[list, int, int]] = {}  # step -> (groups, version, generated tokens)
        self.next_batch = 0
        self.engine_version: int | None = None
        self.idle = True
        self.error: BaseException | None = None
        self.stop = False
        self.thread: threading.Thread | None = None

    # ------------------------------------------------------------------ trainer side

    def version_of(self, b: int) -> int:
        return max(self.first_version or 0, b - self.k)

    def publish(self, version: int, model) -> None:
        """Make the weights after ``version`` updates available to the collector."""
        sd = cpu_state_dict(model)
        with self.cond:
            if self.first_version is None:
                self.first_version = version
            self.versions[version] = sd
            needed = self.version_of(self.next_batch)
            for v in [v for v in self.versions if v < needed]:
                del self.versions[v]
            self.cond.notify_all()

    def take(self, step: int, model) -> tuple[list, dict[str, float]]:
        """The batch of ``step`` (waiting for it if needed) and its staleness metrics; the first call
        publishes ``model``'s weights as version ``step`` and starts the collector."""
        if self.thread is None:
            self.publish(step, model)
            self.next_batch = max(self.next_batch, step)
            self.thread = threading.Thread(target=self._run, name="horizonrl-async-rollouts", daemon=True)
            self.thread.start()
        t0 = time.perf_counter()
        with self.cond:
            while step not in self.batches and self.error is None:
                if self.idle and self.next_batch <= step and not self._can_generate():
                    raise RuntimeError(
                        f"async rollouts: batch {self.next_batch} needs policy version "
                        f"{self.version_of(self.next_batch)}, which was not kept "
                        f"(published: {sorted(self.versions)})"
                    )
                self.cond.wait()
            self._raise()
            groups, version, tokens = self.batches.pop(step)
            self.cond.notify_all()
        self.budget.spent += tokens  # charged when trained, so the count does not depend on timing
        m = staleness_metrics(groups, step)
        m.update({"async/policy_version": float(version), "async/wait_s": time.perf_counter() - t0})
        return groups, m

    def update_settings(self, settings, metrics: dict[str, float]):
        """``settings`` with ``old_logprobs='recompute'`` when the batch is stale."""
        stale = metrics.get("async/staleness_max", 0.0) > 0
        recompute = stale and settings.old_logprobs == "rollout"
        metrics["async/recomputed"] = float(recompute)
        return dataclasses.replace(settings, old_logprobs="recompute") if recompute else settings

    def drain(self) -> None:
        """Wait until the collector has generated every batch the published versions allow."""
        if self.thread is None:
            return
        with self.cond:
            while not (self.idle and not self._can_generate()) and self.error is None:
                self.cond.wait()
            self._raise()

    def state(self) -> dict[str, Any]:
        """Everything the collector needs to continue exactly: batches held, RNGs, and the weights of
        the versions that batches not yet generated will be sampled by (at most ``k`` copies)."""
        self.drain()
        needed = self.version_of(self.next_batch)
        return {
            "versions": {v: sd for v, sd in self.versions.items() if v >= needed},
            "batches": dict(self.batches),
            "next_batch": self.next_batch,
            "first_version": self.first_version,
            "task_rng": self.tasks.state(),
            "engine_rng": self.engine.rng_state(),
        }

    def load(self, st: dict[str, Any]) -> None:
        self.versions = dict(st["versions"])
        self.batches = dict(st["batches"])
        self.next_batch = st["next_batch"]
        self.first_version = st["first_version"]
        self.tasks.load(st["task_rng"])
        self.engine.set_rng_state(st["engine_rng"])

    def close(self) -> None:
        with self.cond:
            self.stop = True
            self.cond.notify_all()
        if self.thread is not None:
            self.thread.join(timeout=600)
        close_quietly(self.engine)

    # ------------------------------------------------------------------ collector side

    def _raise(self) -> None:
        if self.error is not None:
            raise RuntimeError("the asynchronous rollout thread failed") from self.error

    def _can_generate(self) -> bool:
        b = self.next_batch
        return b < self.steps and self.version_of(b) in self.versions

    def _run(self) -> None:
        try:
            while True:
                with self.cond:
                    self.idle = True
                    self.cond.notify_all()
                    while not self.stop and not self._can_generate():
                        self.cond.wait()
                    if self.stop:
                        return
                    self.idle = False
                    b = self.next_batch
                    version = self.version_of(b)
                    weights = self.versions[version]
                if self.engine_version != version:
                    self.engine.sync(weights)
                    self.engine_version = version
                groups, tokens = self._collect(b)
                for g in groups:
                    for r in g.rollouts:
                        for t in r.turns:
                            t.info["policy_version"] = version
                with self.cond:
                    self.batches[b] = (groups, version, tokens)
                    self.next_batch = b + 1
                    self.cond.notify_all()
        except BaseException as e:  # surfaced by take()/drain() in the trainer thread
            with self.cond:
                self.error = e
                self.idle = True
                self.cond.notify_all()

    def _collect(self, b: int) -> tuple[list, int]:
        tasks = self.tasks.sample()
        counter = TokenBudget()
        spec = self.spec
        groups = collect_groups(
            BudgetedEngine(self.engine, counter),
            spec.renderer,
            spec.make_env,
            tasks,
            self.group_size,
            spec.params,
            spec.limits,
            tag=f"s{b}-",
            agent=self.agent,
            spec=spec,
        )
        return groups, counter.spent
