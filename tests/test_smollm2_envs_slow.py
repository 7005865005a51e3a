"""Two GRPO steps of SmolLM2-135M-Instruct on the math_python environment (slow; `make test-slow`)."""

from __future__ import annotations

from importlib import resources

import pytest

from horizonrl.config import load_config


@pytest.mark.slow
def test_smollm2_math_python_two_steps(tmp_path):
    pytest.importorskip("gguf")
    from horizonrl.train.trainers.group import GroupTrainer

    path = resources.files("horizonrl") / "configs" / "smollm2_math_python.yaml"
    cfg = load_config(
        str(path),
        [
            "model.device=cpu",
            "rollout.group_size=2",
            "rollout.tasks_per_step=2",
            "rollout.max_new_tokens=96",
            "rollout.max_turns=2",
            "rollout.context_budget=2048",
            "env.train_tasks=8",
            "env.test_tasks=2",
            "train.steps=2",
            "train.eval_samples=1",
            "train.progress=false",
            f"train.out_dir={tmp_path}",
        ],
    )
    records = GroupTrainer(cfg).fit()
    assert [r["step"] for r in records] == [0, 1, 2]
    assert all(0.9 < r["train/ratio_geomean"] < 1.1 for r in records[1:])
    assert (tmp_path / "checkpoints").is_dir()
