"""A GRPO step: horizonrl's group trainer vs TRL's ``GRPOTrainer``, completion tokens/s side by side.

Both train the same tiny model (the embedded default's shape, 4 layers x 128, built here with a short
copy pretraining) on the same prompts (the ``arithmetic`` environment's tasks, rendered by horizonrl's
chat renderer with the calculator tool, handed to TRL as the same text) with the same batch
(``--prompts`` prompts x ``--group`` completions of at most ``--new-tokens`` tokens, temperature 1),
one optimizer step per batch, no KL term, the same learning rate, float32 on the CPU, ``--threads``
torch threads. The reward is the same exact-match check of ``<answer>``. Measured: completion tokens
generated per second of training wall time over ``--steps`` steps after one warm-up step (generation,
scoring, the update; horizonrl's per-step bookkeeping and TRL's logging included), and the ratio.
TRL runs with its gradient checkpointing off (``--trl-checkpointing`` turns it on) and without vLLM
(its ``model.generate`` path). ``trl_grpo_smollm2.py`` runs the same comparison on SmolLM2-135M-Instruct
with these pieces. Needs ``trl`` (``pip install -c requirements/lock.txt trl``: 1.16.0)::

    .venv/bin/python benchmarks/trl_grpo.py [--steps 6] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from horizonrl.envs.core.tools import parse_answer

KNOBS = {"n_ops": 1, "max_operand": 99, "ops": "+-"}


def build_model(work: Path, pretrain: int) -> Path:
    from horizonrl.config import ModelConfig
    from horizonrl.train.warmstart.bootstrap import build_tiny

    path = work / "tiny"
    build_tiny(ModelConfig(tiny_hidden=128, tiny_layers=4, tiny_pretrain_steps=pretrain), path)
    return path


def horizonrl_run(work: Path, args, overrides: list[str], config: str | None = None) -> dict:
    """Train ``args.steps + 1`` GRPO steps with horizonrl's group trainer (``config`` and ``overrides`` on
    top of the settings both benchmarks share); tokens/s over the steps after the first."""
    from horizonrl.config import load_config
    from horizonrl.train.trainers.group import GroupTrainer

    cfg = load_config(
        config,
        [
            "model.device=cpu",
            "env.test_tasks=1",
            f"rollout.group_size={args.group}",
            f"rollout.tasks_per_step={args.prompts}",
            f"rollout.max_new_tokens={args.new_tokens}",
            "rollout.max_turns=1",
            "rollout.temperature=1.0",
            "algo.estimator=grpo",
            "algo.kl_coef=0.0",
            f"optim.lr={args.lr}",
            "optim.warmup_steps=0",
            f"train.steps={args.steps + 1}",
            "train.eval_at_start=false",
            f"train.eval_every={10**6}",
            "train.eval_samples=1",
            "train.save_every=0",
            "train.progress=false",
            f"train.out_dir={work / 'horizonrl'}",
            *overrides,
        ],
    )
    trainer = GroupTrainer(cfg)
    ends, tokens = [], []
    advance = trainer.advance

    def timed() -> dict:  # a step ends when its update does: the run's closing evaluation is not counted
        m = advance()
        ends.append(time.perf_counter())
        tokens.append(m["rollout/response_tokens_mean"] * args.group * args.prompts)
        return m

    trainer.advance = timed
    start = time.perf_counter()
    trainer.fit()
    trainer.close()
    return _summary(start, ends, tokens)


def tiny_prompts(model: Path, args) -> list[dict]:
    """The ``arithmetic`` tasks as horizonrl renders them (system prompt, calculator tool), as text."""
    from transformers import AutoTokenizer

    from horizonrl.envs import get_env
    from horizonrl.models.chat import ChatRenderer

    tok = AutoTokenizer.from_pretrained(model)
    env = get_env("arithmetic")(**KNOBS)
    renderer = ChatRenderer(tok)
    tools = [t.to_schema() for t in env.tools]
    rows = []
    for task in env.tasks(args.prompts * (args.steps + 1), seed=0):
        messages = [
            {"role": "system", "content": env.system_prompt},
            {"role": "user", "content": task.prompt},
        ]
        rows.append(
            {"prompt": tok.decode(renderer.initial_ids(messages, tools=tools)), "answer": task.answer}
        )
    return rows


def trl_run(
    model: Path, work: Path, args, rows: list[dict], *, dtype=torch.float32, bf16=False, checkpointing=False
) -> dict:
    """``args.steps + 1`` steps of TRL's ``GRPOTrainer`` on ``rows`` (``prompt`` text, ``answer``), one
    optimizer step per batch of ``args.prompts`` x ``args.group`` completions; ``dtype``: the weights',
    ``bf16``: TRL's bf16 mixed precision; ``checkpointing``: its gradient checkpointing."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(model)

    def exact(completions, answer, **kwargs) -> list[float]:
        return [float(parse_answer(c) == a) for c, a in zip(completions, answer, strict=True)]

    config = GRPOConfig(
        output_dir=str(work / "trl"),
        use_cpu=True,
        per_device_train_batch_size=args.prompts * args.group,
        num_generations=args.group,
        max_completion_length=args.new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        num_iterations=1,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        max_steps=args.steps + 1,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        gradient_checkpointing=checkpointing,
        bf16=bf16,
        seed=0,
        dataloader_num_workers=0,
        shuffle_dataset=False,
        disable_dropout=True,
    )
    ends, tokens = [], []

    class Clock(TrainerCallback):
        def on_log(self, _args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                tokens.append(logs["completions/mean_length"] * args.group * args.prompts)
                ends.append(time.perf_counter())

    policy = AutoModelForCausalLM.from_pretrained(model, dtype=dtype)
    trainer = GRPOTrainer(
        model=policy,
        reward_funcs=[exact],
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        callbacks=[Clock()],
    )
    start = time.perf_counter()
    trainer.train()
    return _summary(start, ends, tokens)


def _summary(start: float, ends: list[float], tokens: list[float]) -> dict:
    """Tokens/s over the steps after the first (warm-up) one."""
    if len(ends) < 2:
        raise RuntimeError(f"expected at least 2 steps, got {len(ends)}")
    seconds = ends[-1] - ends[0]
    return {
        "steps": len(ends) - 1,
        "seconds": round(seconds, 2),
        "completion_tokens": round(sum(tokens[1:])),
        "tok_s": round(sum(tokens[1:]) / seconds, 1),
        "first_step_s": round(ends[0] - start, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6, help="timed steps (after one warm-up step)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--pretrain", type=int, default=300, help="copy-pretraining steps of the tiny model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--trl-checkpointing", action="store_true", help="TRL with gradient checkpointing")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="horizonrl-bench-trl-"))
    model = build_model(work, args.pretrain)
    tasks = f"env.train_tasks={args.prompts * (args.steps + 1)}"
    ours = horizonrl_run(
        work, args, [f"model.path={model}", "env.name=arithmetic", f"env.knobs={json.dumps(KNOBS)}", tasks]
    )
    theirs = trl_run(model, work, args, tiny_prompts(model, args), checkpointing=args.trl_checkpointing)
    out = {
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "horizonrl": ours,
        "trl": theirs,
        "ratio": round(ours["tok_s"] / theirs["tok_s"], 2),
    }
    print(json.dumps(out, indent=1))
    print(f"horizonrl / TRL GRPOTrainer, completion tokens/s: {out['ratio']}x")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
