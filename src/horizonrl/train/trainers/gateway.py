"""The gateway trainer (``train.trainer: gateway``): train an external agent harness's episodes.

A :class:`GatewayTrainer` is a :class:`~horizonrl.train.trainers.group.GroupTrainer` whose groups come
from a user harness instead of the built-in agent loop: each step it samples tasks from the configured
environment's task pool, opens ``rollout.group_size`` episodes per task on a recording
:class:`~horizonrl.gateway.Gateway` served on ``gateway.host:port`` in front of the trainer's own engine,
runs the harness once per episode (``gateway.command`` or ``gateway.callable``), and turns the recorded
episodes into groups. The credit estimator, rows, update, logging and checkpoints are the group
trainer's, so any estimator applies (Mosaic reads the recorded compaction / subagent sessions).

While the harness runs, every call samples at ``rollout.temperature`` / ``rollout.top_p`` (what the
update recomputes; a request asking for other settings is counted in ``gateway/overridden_sampling``)
with at most ``rollout.max_new_tokens`` tokens by default and ``rollout.context_budget`` tokens of
context. Between collections the gateway's scheduler is paused, so nothing samples while the weights
change.

An episode is trained only with a real outcome: the reward its harness posted
(``POST /v1/episodes/{id}/reward``) or returned, or ``gateway.reward`` applied to its final answer.
Episodes with none ``gateway.reward_timeout_s`` after their harness ended, with no recorded call, or
whose harness timed out without a reward are dropped and counted (``gateway/dropped_episodes``).
Evaluation runs the harness on the held-out tasks (``train.eval_samples`` episodes each): ``eval/pass@1``
is the mean success, ``eval/reward_mean`` the mean reward of the rewarded episodes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from horizonrl.config import ConfigError, RunConfig
from horizonrl.envs.core.base import Task
from horizonrl.gateway import Gateway, ServerThread
from horizonrl.gateway.harness import EpisodeRun, Harness, HarnessResult, resolve_callable
from horizonrl.inference import SamplingParams
from horizonrl.train.trainers.group import GroupTrainer
from horizonrl.train.trainers.registry import register_trainer
from horizonrl.trajectory import Group

__all__ = ["GatewayTrainer", "resolve_reward"]


def resolve_reward(spec: str) -> Callable[[str, Sequence[str]], float]:
    """A registered reward name or ``'package.module:function'`` (``gateway.reward``)."""
    from horizonrl.rewards import get_reward, list_rewards

    if ":" in spec:
        try:
            return resolve_callable(spec, "gateway.reward")
        except ValueError as e:
            raise ConfigError(str(e)) from None
    try:
        return get_reward(spec)
    except KeyError:
        raise ConfigError(
            f"gateway.reward={spec!r}: unknown reward; known: {list_rewards()} or 'package.module:function'"
        ) from None


@register_trainer("gateway")
class GatewayTrainer(GroupTrainer):
    """Group trainer over episodes of an external harness, recorded by the gateway (module docstring).

    It is the group trainer with another :meth:`collect` (and evaluation): the workspace, credit
    estimator, rows, update and checkpoints are the group step's."""

    #: The harness runs in the trainer's thread: no background collection (``train.max_staleness``).
    collects_async = False
    samples_dynamically = False  # the harness runs whole episodes; no groups are drawn again

    def __init__(self, cfg: RunConfig, *, resume: bool = False) -> None:
        g = cfg.gateway
        if (g.command is None) == (g.callable is None):
            raise ConfigError(
                "train.trainer=gateway needs exactly one of gateway.command and gateway.callable "
                f"(got command={g.command!r}, callable={g.callable!r})"
            )
        try:
            function = resolve_callable(g.callable) if g.callable is not None else None
            harness = Harness(
                command=g.command,
                function=function,
                timeout_s=g.episode_timeout_s,
                concurrency=g.concurrency,
                workdir=f"{cfg.train.out_dir}/harness",
            )
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self.reward_fn = resolve_reward(g.reward) if g.reward is not None else None
        super().__init__(cfg, resume=resume)
        self.harness = harness
        self.gateway = Gateway(
            self.engine,
            self.renderer,
            g.model_name,
            auto_register=False,
            context=cfg.rollout.context_budget,
            default_max_tokens=cfg.rollout.max_new_tokens,
            max_request_tokens=g.max_request_tokens,
            slice_tokens=g.slice_tokens,
        )
        self.gateway.scheduler.pause()
        self.server = ServerThread(self.gateway.app, g.host, g.port).start()
        self.collect_metrics: dict[str, float] = {}

    @property
    def url(self) -> str:
        return self.server.url

    # ------------------------------------------------------------------ episodes

    def run_episodes(self, tasks: Sequence[Task], per_task: int, tag: str, params: SamplingParams):
        """``(groups, metrics)``: ``per_task`` harness episodes of each task, recorded and judged."""
        gw, rec = self.gateway, self.gateway.recorder
        before = dict(gw.stats), dict(rec.stats)
        runs, groups = [], []
        for i, task in enumerate(tasks):
            gid = f"{tag}{i}"
            groups.append(Group(group_id=gid, task_id=task.id))
            for k in range(per_task):
                eid = f"{gid}-{k}"
                rec.register(eid, task_id=task.id, group_id=gid, uid=eid)
                runs.append(EpisodeRun(eid, task, self.url))
        gw.sampling = params
        gw.scheduler.resume()
        try:
            results = self.harness.run_all(runs)
            for run in runs:
                res = results[run.episode_id]
                if res.reward is not None and rec.reward(run.episode_id) is None:
                    rec.post_reward(run.episode_id, res.reward)
                rec.finish(run.episode_id)
            self._await_rewards(runs, results)
        finally:
            for run in runs:
                rec.close(run.episode_id)
            gw.scheduler.pause()
            gw.sampling = None
        by_gid = {g.group_id: g for g in groups}
        counts = {"unrewarded": 0, "empty": 0, "errors": 0, "timeouts": 0}
        calls = []
        for run in runs:
            res = results[run.episode_id]
            counts["errors"] += res.error is not None and not res.timed_out
            counts["timeouts"] += res.timed_out
            rollout = rec.rollout(run.episode_id)
            calls.append(rollout.env["metrics"]["gateway_calls"])
            reward = rec.reward(run.episode_id)
            if reward is None and self.reward_fn is not None and rollout.turns:
                task = run.task
                reward = float(self.reward_fn(rollout.final_answer or "", [task.answer, *task.aliases]))
                rollout.reward, rollout.success, rollout.env["rewarded"] = reward, reward > 0, True
            rec.forget(run.episode_id)
            if not rollout.turns:
                counts["empty"] += 1
            elif reward is None:
                counts["unrewarded"] += 1
            else:
                by_gid[rollout.group_id].rollouts.append(rollout)
        kept = [g for g in groups if g.rollouts]
        n_calls = rec.stats["calls"] - before[1]["calls"]
        metrics = {
            "gateway/episodes": float(len(runs)),
            "gateway/dropped_episodes": float(len(runs) - sum(len(g.rollouts) for g in kept)),
            "gateway/unrewarded_episodes": float(counts["unrewarded"]),
            "gateway/empty_episodes": float(counts["empty"]),
            "gateway/harness_errors": float(counts["errors"]),
            "gateway/harness_timeouts": float(counts["timeouts"]),
            "gateway/calls_mean": float(np.mean(calls)) if calls else 0.0,
            "gateway/spliced_call_rate": (rec.stats["spliced"] - before[1]["spliced"]) / max(1, n_calls),
            "gateway/overridden_sampling": float(
                gw.stats["overridden_sampling"] - before[0]["overridden_sampling"]
            ),
            "gateway/groups": float(len(kept)),
        }
        return kept, metrics

    def _await_rewards(self, runs: Sequence[EpisodeRun], results: dict[str, HarnessResult]) -> None:
        """Wait up to ``gateway.reward_timeout_s`` for episodes that still have no reward."""
        if self.reward_fn is not None:
            return
        rec = self.gateway.recorder
        deadline = time.monotonic() + self.cfg.gateway.reward_timeout_s
        waiting = [r.episode_id for r in runs if not results[r.episode_id].timed_out]
        while waiting and time.monotonic() < deadline:
            waiting = [e for e in waiting if rec.reward(e) is None]
            if waiting:
                time.sleep(0.05)

    # ------------------------------------------------------------------ trainer hooks

    def collect(self, tasks) -> list[Group]:
        groups, self.collect_metrics = self.run_episodes(
            tasks, self.cfg.rollout.group_size, f"s{self.step}-", self.params
        )
        if not groups:
            raise RuntimeError(
                f"step {self.step + 1}: every gateway episode was dropped "
                f"({self.collect_metrics['gateway/episodes']:.0f} launched: "
                f"{self.collect_metrics['gateway/unrewarded_episodes']:.0f} without a reward, "
                f"{self.collect_metrics['gateway/empty_episodes']:.0f} without a call, "
                f"{self.collect_metrics['gateway/harness_errors']:.0f} harness errors); nothing to train"
            )
        return groups

    def train_step(self) -> dict[str, float]:
        metrics = super().train_step()
        metrics.update(self.collect_metrics)
        return metrics

    def evaluate(self) -> dict[str, Any]:
        """The harness on the held-out tasks at ``train.eval_temperature`` (own RNG stream)."""
        saved = self.engine.rng_state()
        self.engine.set_seed(self.cfg.train.seed + 1_000_003)
        params = SamplingParams(
            temperature=self.cfg.train.eval_temperature,
            top_p=self.cfg.rollout.top_p,
            max_new_tokens=self.cfg.rollout.max_new_tokens,
        )
        try:
            groups, metrics = self.run_episodes(self.test_tasks, self.cfg.train.eval_samples, "eval", params)
        finally:
            self.engine.set_rng_state(saved)
        rollouts = [r for g in groups for r in g.rollouts]
        launched = len(self.test_tasks) * self.cfg.train.eval_samples
        return {
            "eval/pass@1": sum(r.success for r in rollouts) / max(1, launched),
            "eval/reward_mean": float(np.mean([r.reward for r in rollouts])) if rollouts else 0.0,
            "eval/dropped_episodes": metrics["gateway/dropped_episodes"],
        }

    def fit(self, progress_cb=None) -> list[dict[str, Any]]:
        try:
            return super().fit(progress_cb)
        finally:
            self.close()

    def close(self) -> None:
        """Stop the gateway server and its scheduler."""
        self.server.stop()
        self.gateway.scheduler.close()
