"""Asynchronous rollouts with bounded staleness (train.max_staleness) on the tiny model.

The schedule (which policy version samples which batch), the version tags, the recompute of stale
``pi_old``, determinism and exact resume run in the default suite (a few seconds). The check that
``max_staleness: 0`` is bit-for-bit the trainer from before asynchronous rollouts existed compares
against that commit's sources (marker ``distributed``; needs git history).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import shaped_env  # noqa: F401  (registers arith_shaped)
from helpers.shaped_env import small_run_config
from horizonrl.inference import HFEngine
from horizonrl.models import load_model_and_tokenizer
from horizonrl.train.records.metrics import read_metrics
from horizonrl.train.trainers.group import GroupTrainer
from horizonrl.trajectory import read_jsonl

#: tests/: the fingerprint subprocess puts it on sys.path to import ``helpers.shaped_env``, under the
#: sources of either commit.
TESTS = Path(__file__).resolve().parents[1]
#: main just before distributed / asynchronous training was merged (what max_staleness=0 reproduces).
BASE_COMMIT = "5df232a"


def _deterministic(records):
    return [
        {k: v for k, v in r.items() if not k.startswith(("time/", "throughput/", "async/wait"))}
        for r in records
    ]


def test_batches_are_sampled_by_the_weights_of_step_minus_k(tiny_model_dir, tmp_path):
    run = tmp_path / "k1"
    trainer = GroupTrainer(
        small_run_config(
            tiny_model_dir,
            run,
            "train.steps=3",
            "train.max_staleness=1",
            "train.save_every=1",
            "train.keep_checkpoints=3",
        )
    )
    records = trainer.fit()
    trainer.close()
    assert [r["async/policy_version"] for r in records] == [0.0, 0.0, 1.0]
    assert [r["async/staleness_max"] for r in records] == [0.0, 1.0, 1.0]
    assert [r["async/recomputed"] for r in records] == [0.0, 1.0, 1.0]
    # Independent check of the schedule: the log-probs recorded with each batch are the teacher-forced
    # log-probs of the weights it is tagged with (version 0: the initial model; 1: checkpoint step_1),
    # and not those of the weights it is trained by.
    versions = {0: tiny_model_dir, 1: run / "checkpoints" / "step_1", 2: run / "checkpoints" / "step_2"}
    engines = {}
    for v, path in versions.items():
        model, tok = load_model_and_tokenizer(path)
        engines[v] = HFEngine(model.eval(), tok)
    for step in (1, 2, 3):
        rollouts = list(read_jsonl(run / "rollouts" / f"step_{step}.jsonl"))
        turns = [t for r in rollouts for t in r.turns if t.response_ids]
        tags = {t.info["policy_version"] for t in turns}
        assert tags == {int(records[step - 1]["async/policy_version"])}
        (v,) = tags
        ctx, cont = [t.prompt_ids for t in turns], [t.response_ids for t in turns]
        recorded = np.concatenate([t.logprobs for t in turns])
        np.testing.assert_allclose(np.concatenate(engines[v].score(ctx, cont)), recorded, atol=1e-4)
        if v != step - 1:  # stale: the trained weights give other log-probs
            trained = np.concatenate(engines[step - 1].score(ctx, cont))
            assert np.abs(trained - recorded).max() > 1e-3
    # Staleness shows in the rollout/train ratio measured by the recompute pass.
    assert records[0]["train/ratio_geomean"] == pytest.approx(1.0, abs=1e-4)
    assert abs(records[2]["train/ratio_geomean"] - 1.0) > 1e-4


def test_async_runs_are_reproducible_and_resume_exactly(tiny_model_dir, tmp_path):
    common = ("train.max_staleness=2", "train.save_every=2", "train.eval_every=2", "algo.kl_coef=0.01")
    full = GroupTrainer(small_run_config(tiny_model_dir, tmp_path / "a", "train.steps=4", *common))
    full.fit()
    full.close()
    again = GroupTrainer(small_run_config(tiny_model_dir, tmp_path / "c", "train.steps=4", *common))
    again.fit()
    again.close()
    first = GroupTrainer(small_run_config(tiny_model_dir, tmp_path / "b", "train.steps=2", *common))
    first.fit()
    first.close()
    del first
    resumed = GroupTrainer(
        small_run_config(tiny_model_dir, tmp_path / "b", "train.steps=4", *common), resume=True
    )
    assert resumed.step == 2
    resumed.fit()
    resumed.close()
    for other in (again, resumed):
        for (name, p), q in zip(full.model.named_parameters(), other.model.parameters(), strict=True):
            assert torch.equal(p, q), name
    a = _deterministic(read_metrics(tmp_path / "a"))
    assert [r["async/staleness_max"] for r in a] == [0.0, 1.0, 2.0, 2.0]
    for other in ("b", "c"):
        assert json.dumps(a, sort_keys=True) == json.dumps(
            _deterministic(read_metrics(tmp_path / other)), sort_keys=True
        )


def test_async_settings_that_cannot_work_are_refused(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match=r"train.max_staleness=1: not with a token budget"):
        GroupTrainer(
            small_run_config(
                tiny_model_dir, tmp_path / "x", "train.max_staleness=1", "train.max_gen_tokens=1000"
            )
        )
    from horizonrl.train.methods.rtpo import RTPOTrainer

    with pytest.raises(
        ValueError, match=r"train.max_staleness=1: asynchronous rollouts need train.trainer=group"
    ):
        RTPOTrainer(
            small_run_config(
                tiny_model_dir,
                tmp_path / "y",
                "train.max_staleness=1",
                "train.trainer=rtpo",
                "env.name=arithmetic",
            )
        )


_FINGERPRINT = r"""
import hashlib, json, sys
sys.path.insert(0, sys.argv[1])
from helpers import shaped_env  # noqa
import torch
from horizonrl.config import load_config
try:
    from horizonrl.train.trainers.registry import make_trainer
except ModuleNotFoundError:  # the base commit's layout (train/trainers.py)
    from horizonrl.train.trainers import make_trainer
torch.set_num_threads(1)
out = {}
for name, extra in (("group", ["algo.kl_coef=0.01", "algo.mini_batches=2", "algo.micro_batch_tokens=300"]),
                    ("rtpo", ["train.trainer=rtpo", "env.name=arithmetic", "rollout.max_turns=2"])):
    cfg = load_config(None, json.loads(sys.argv[3]) + [f"train.out_dir={sys.argv[2]}/{name}"] + extra)
    t = make_trainer(cfg)
    t.fit()
    h = hashlib.sha256()
    for k, v in sorted(t.model.state_dict().items()):
        h.update(k.encode()); h.update(v.detach().cpu().contiguous().numpy().tobytes())
    metrics = [{k: v for k, v in json.loads(l).items() if not k.startswith(("time/", "throughput/"))}
               for l in open(f"{sys.argv[2]}/{name}/metrics.jsonl")]
    rollouts = [json.loads(l) for p in sorted(__import__("pathlib").Path(f"{sys.argv[2]}/{name}/rollouts")
                .glob("*.jsonl")) for l in p.read_text().splitlines()]
    out[name] = {"weights": h.hexdigest(), "metrics": metrics, "rollouts": rollouts}
print("FINGERPRINT", json.dumps(out, sort_keys=True))
"""


def _restrict(now, base):
    """``now`` cut down to the keys ``base`` has, recursively (dicts by key, lists item by item)."""
    if isinstance(base, dict) and isinstance(now, dict):
        return {k: _restrict(now.get(k), v) for k, v in base.items()}
    if isinstance(base, list) and isinstance(now, list) and len(base) == len(now):
        return [_restrict(n, b) for n, b in zip(now, base, strict=True)]
    return now


@pytest.mark.distributed
def test_max_staleness_zero_is_bit_for_bit_the_synchronous_trainer(tiny_model_dir, tmp_path):
    root = TESTS.parent
    archive = tmp_path / "base.tar"
    try:
        subprocess.run(
            ["git", "-C", str(root), "archive", "-o", str(archive), BASE_COMMIT, "src"],
            check=True,
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"needs the git history with commit {BASE_COMMIT}")
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "base", filter="data")
    args = [
        f"model.path={tiny_model_dir}",
        "env.name=arith_shaped",
        "env.knobs={n_ops: 1, max_operand: 9}",
        "env.train_tasks=40",
        "env.test_tasks=2",
        "rollout.group_size=4",
        "rollout.tasks_per_step=2",
        "rollout.max_new_tokens=16",
        "rollout.context_budget=512",
        "optim.lr=1e-2",
        "train.eval_samples=1",
        "train.progress=false",
        "train.steps=2",
    ]
    # shared-prefix (tree) training came after the base commit: it changes float rounding (not the
    # math), so this head runs with it off to be compared bit for bit
    # the token check of a fresh run's first episodes (rollout.check_tokens unset) came later too: it adds
    # token_mismatch to those rollouts' env metrics, so it is off here
    now_args = [*args, "algo.tree_training=off", "rollout.check_tokens=false"]
    prints = {}
    for label, src, argv in (
        ("base", tmp_path / "base" / "src", args),
        ("now", root / "src", now_args),
    ):
        env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1")
        proc = subprocess.run(
            [sys.executable, "-c", _FINGERPRINT, str(TESTS), str(tmp_path / label), json.dumps(argv)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("FINGERPRINT "))
        prints[label] = json.loads(line.removeprefix("FINGERPRINT "))
    for name in ("group", "rtpo"):
        now, base = prints["now"][name]["metrics"], prints["base"][name]["metrics"]
        # metrics added since the base commit (e.g. rollout/env_error_rate) are not compared; every
        # metric the base logged must be logged again with the same value
        assert len(now) == len(base), name
        assert [{k: m.get(k) for k in b} for m, b in zip(now, base, strict=True)] == base, name
        assert prints["now"][name]["weights"] == prints["base"][name]["weights"], name
        # the rollout files: every field the base wrote is written again with the same value; fields
        # added since (e.g. a turn's obs_messages) are not compared
        now_r, base_r = prints["now"][name]["rollouts"], prints["base"][name]["rollouts"]
        assert len(now_r) == len(base_r), name
        assert _restrict(now_r, base_r) == base_r, name
