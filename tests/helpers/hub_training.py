"""What the environment-hub adapter tests share: two training steps, the saved credit, GRPO by hand."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest

from horizonrl.config import load_config


def train_steps(tiny_model_dir, out_dir, env: str, knobs: dict, *extra: str) -> list[dict]:
    """Two group-trainer steps on ``env`` with the tiny model; the metrics records."""
    from horizonrl.train.records.metrics import read_metrics
    from horizonrl.train.trainers.group import GroupTrainer

    cfg = load_config(
        None,
        [
            f"model.path={tiny_model_dir}",
            f"env.name={env}",
            f"env.knobs={json.dumps(knobs)}",
            "rollout.group_size=4",
            "rollout.tasks_per_step=2",
            "rollout.max_new_tokens=12",
            "rollout.max_turns=3",
            "rollout.context_budget=768",
            "rollout.temperature=1.0",
            "train.steps=2",
            "train.eval_samples=1",
            "env.test_tasks=2",
            "train.progress=false",
            f"train.out_dir={out_dir}",
            *extra,
        ],
    )
    GroupTrainer(cfg).fit()
    return read_metrics(out_dir)


def train_example(config: str, tiny_model_dir, out_dir) -> tuple[list[dict], object]:
    """Two group-trainer steps of a hub example config (paths from the repository root, where the caller
    must have changed directory); ``(metrics records, config)``."""
    from horizonrl.train.trainers.group import GroupTrainer

    cfg = load_config(
        config,
        [
            f"model.path={tiny_model_dir}",
            "train.steps=2",
            "env.test_tasks=2",
            "train.eval_samples=1",
            "rollout.group_size=2",
            "train.progress=false",
            f"train.out_dir={out_dir}",
        ],
    )
    return GroupTrainer(cfg).fit(), cfg


def annotated(run_dir, step: int) -> list:
    """``[(rollout, per-token advantages [segment][turn])]`` of ``rollouts/step_N.jsonl``."""
    from horizonrl.train.records.rollout_log import token_advantages
    from horizonrl.trajectory.io import loads_rollout

    out = []
    for line in (run_dir / "rollouts" / f"step_{step}.jsonl").read_text().splitlines():
        rollout = loads_rollout(line)
        out.append((rollout, token_advantages(rollout, json.loads(line)["credit"])))
    return out


def assert_token_exact_grpo(run_dir, metrics: list[dict]) -> list:
    """Every step: ratio 1 before the update, the outcome is the sum of the environment's step
    rewards, the logged mean reward is theirs, and every trained token carries the GRPO advantage
    computed here by hand from its group's rewards. Returns all annotated rollouts."""
    seen = []
    for step in (1, 2):
        assert abs(metrics[step]["train/ratio_geomean"] - 1.0) < 1e-3
        rows = annotated(run_dir, step)
        seen += rows
        groups = defaultdict(list)
        for rollout, adv in rows:
            assert rollout.reward == pytest.approx(sum(t.reward for t in rollout.turns))
            groups[rollout.group_id].append((rollout, adv))
        assert np.mean([r.reward for r, _ in rows]) == pytest.approx(metrics[step]["reward/mean"])
        for members in groups.values():
            r = np.array([ro.reward for ro, _ in members])
            want = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
            for (_, adv), a in zip(members, want, strict=True):
                for tok in (x for seg in adv for x in seg if x is not None):
                    assert np.allclose(tok, a, atol=1e-6)
    return seen
