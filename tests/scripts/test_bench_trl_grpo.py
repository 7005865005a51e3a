"""benchmarks/trl_grpo.py's two runs (horizonrl's group trainer, TRL's ``GRPOTrainer``) end to end on the
tiny model with the smallest settings: a CPU dry run of the pieces benchmarks/trl_grpo_smollm2.py shares."""

from __future__ import annotations

import argparse
import json

import pytest

from helpers.script_loader import load_script

pytest.importorskip("trl")

bench = load_script("benchmarks/trl_grpo.py")


def test_both_libraries_time_the_steps_after_the_warm_up(tmp_path):
    args = argparse.Namespace(steps=1, prompts=1, group=2, new_tokens=2, lr=1e-5)
    model = bench.build_model(tmp_path, 0)
    ours = bench.horizonrl_run(
        tmp_path,
        args,
        [
            f"model.path={model}",
            "env.name=arithmetic",
            f"env.knobs={json.dumps(bench.KNOBS)}",
            "env.train_tasks=2",
            "train.save_rollouts=false",
        ],
    )
    theirs = bench.trl_run(model, tmp_path, args, bench.tiny_prompts(model, args))
    for r in (ours, theirs):
        assert r["steps"] == 1
        assert 0 < r["completion_tokens"] <= args.group * args.new_tokens
        assert r["tok_s"] > 0
