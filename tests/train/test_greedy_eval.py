"""Greedy evaluation beside the sampled one (``train.eval_greedy``): what the policy learned, apart
from what sampling at ``train.eval_temperature`` adds or loses."""

from __future__ import annotations

import json

import torch

from helpers.shaped_env import two_op_run_config


def test_greedy_evaluation_beside_the_sampled_one(tiny_model_dir, tmp_path):
    """train.eval_greedy: one greedy episode per held-out task as eval_greedy/*, its per-task successes in
    eval/step_N.json; greedy decoding does not depend on the evaluation seed, and the sampled evaluation
    is the one a run without it gets (its own RNG stream, restored)."""
    from horizonrl.train.trainers.group import GroupTrainer

    torch.set_num_threads(1)
    out = {}
    for name, extra in {"plain": (), "greedy": ("train.eval_greedy=true",),
                        "greedy_seed": ("train.eval_greedy=true", "train.eval_seed=7")}.items():  # fmt: skip
        t = GroupTrainer(
            two_op_run_config(
                tiny_model_dir,
                tmp_path / name,
                "train.steps=0",
                "train.eval_at_start=true",
                "env.test_tasks=6",
                "train.eval_samples=2",
                *extra,
            )
        )
        try:
            (m,) = t.fit()
        finally:
            t.close()
        out[name] = (m, json.loads((tmp_path / name / "eval" / "step_0.json").read_text()))
    (plain, p_rec), (greedy, g_rec), (_, s_rec) = out["plain"], out["greedy"], out["greedy_seed"]
    assert "eval_greedy/pass@1" not in plain and "greedy_correct" not in p_rec
    assert greedy["eval/pass@1"] == plain["eval/pass@1"] and g_rec["correct"] == p_rec["correct"]
    assert len(g_rec["greedy_correct"]) == 6 and set(g_rec["greedy_correct"]) <= {0, 1}
    assert greedy["eval_greedy/pass@1"] == sum(g_rec["greedy_correct"]) / 6
    assert s_rec["greedy_correct"] == g_rec["greedy_correct"]  # another seed, the same greedy episodes
    assert g_rec["greedy_tool_calls_mean"] == greedy["eval_greedy/rollout/tool_calls_mean"]
    assert p_rec["tool_calls_mean"] == plain["eval/rollout/tool_calls_mean"]
