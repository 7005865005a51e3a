"""One Mosaic / broadcast / IGPO training step per packaged config on a tiny model."""

from __future__ import annotations

from importlib import resources

import pytest

from horizonrl.config import load_config
from horizonrl.train.trainers.group import GroupTrainer

SMALL = [
    "rollout.group_size=2",
    "rollout.tasks_per_step=2",
    "train.steps=1",
    "train.eval_samples=1",
    "env.test_tasks=2",
    "env.train_tasks=20",
    "train.progress=false",
]


@pytest.mark.parametrize(
    "name",
    ["mosaic_compaction_lookup", "broadcast_compaction_lookup", "mosaic_fork_lookup", "igpo_lookup"],
)
def test_packaged_config_trains_one_step(name, tiny_model_dir, tmp_path):
    path = resources.files("horizonrl") / "configs" / f"{name}.yaml"
    cfg = load_config(str(path), [*SMALL, f"train.init={tiny_model_dir}", f"train.out_dir={tmp_path}"])
    trainer = GroupTrainer(cfg)
    m = trainer.train_step()
    assert m["rollout/sessions_mean"] >= 1
    assert 0.99 < m["train/ratio_geomean"] < 1.01
    if cfg.algo.estimator in ("mosaic", "igpo"):
        # two scored contexts per eligible (non-terminal) session: an even count, timed
        assert m["time/ig_score_s"] >= 0 and m["ig/scored_contexts"] % 2 == 0
    if cfg.algo.estimator == "mosaic":
        assert 0.0 <= m["ig/positive_rate"] <= 1.0
