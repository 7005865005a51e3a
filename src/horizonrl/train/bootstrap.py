"""Models and demonstrations to start from: the embedded tiny model, SmolLM2, local directories.

The tiny model's tokenizer is trained offline on text drawn from every
registered environment (system prompts, tool schemas, user messages, expert
actions and observations), so it speaks the environments' language with a
vocabulary of a few hundred tokens.
"""

from __future__ import annotations

import json
import random
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from horizonrl.config import ModelConfig
from horizonrl.envs import get_env
from horizonrl.envs.base import Env, Task
from horizonrl.train.pretrain import copy_converged, copy_pretrain


def expert_demo(env: Env, task: Task, rng: random.Random, *, noise: float, max_turns: int) -> dict[str, Any]:
    """One expert episode as chat messages ``{"messages", "tools", "success", "task_id"}``."""
    first = env.reset(task)
    messages = [{"role": "system", "content": env.system_prompt}, {"role": "user", "content": first}]
    success = False
    for _ in range(max_turns):
        action = env.expert_action(rng, noise=noise)
        messages.append({"role": "assistant", "content": action})
        res = env.step(action)
        if res.done:
            success = bool(res.success)
            break
        messages.append({"role": res.role, "content": res.observation})
    return {
        "task_id": task.id,
        "messages": messages,
        "tools": [t.to_schema() for t in env.tools],
        "success": success,
    }


def generate_demos(
    env_name: str,
    n: int,
    *,
    seed: int,
    noise: float,
    max_turns: int,
    knobs: dict[str, Any] | None = None,
    task_seed: int = 0,
    setup: Any = None,
) -> list[dict[str, Any]]:
    """``n`` expert demonstrations on training tasks of ``env_name``.

    ``setup`` (a :class:`horizonrl.train.env_setup.EnvSetup`) takes the tasks and environments from
    the run's ``env.*`` (task files, rewards, user environments) instead of ``env_name``/``knobs``.
    """
    knobs = knobs or {}
    cls = get_env(env_name) if setup is None else setup.cls
    if setup is None:
        tasks = cls.make_tasks(n, seed=task_seed, split="train", **knobs)
    else:
        tasks = setup.tasks(n, seed=task_seed, split="train")
    rng = random.Random(seed)
    demos = []
    for task in tasks:
        env = cls(**knobs) if setup is None else setup.make()
        try:
            demos.append(expert_demo(env, task, rng, noise=noise, max_turns=max_turns))
        finally:
            env.close()
    return demos


def write_demos(path: str | Path, demos: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for d in demos:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")


def read_demos(path: str | Path) -> list[dict[str, Any]]:
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            d = json.loads(line)
            if not isinstance(d.get("messages"), list):
                raise ValueError(f"{path}:{i}: a demonstration needs a 'messages' list")
            out.append(d)
    return out


# The embedded tokenizer is trained on these (fast, offline, synthetic) environments only, so
# registering another environment never changes the default model or its numbers.
TOKENIZER_ENVS = ("arithmetic", "lookup", "rooms")


def tokenizer_corpus(*, seed: int, per_env: int = 150) -> Iterator[str]:
    """Text of expert episodes (noisy, so mistakes are covered) from the synthetic environments."""
    for name in TOKENIZER_ENVS:
        for d in generate_demos(name, per_env, seed=seed, noise=0.3, max_turns=8, task_seed=seed):
            yield json.dumps(d["tools"])
            for m in d["messages"]:
                yield f"{m['role']}\n{m['content']}"


def build_tiny(cfg: ModelConfig, out_dir: str | Path):
    """Train the tokenizer, build the randomly initialised tiny model, give it a brief
    in-context copy pretraining (:mod:`horizonrl.train.pretrain`), save both to ``out_dir``."""
    from horizonrl.envs.names import ENTITY_NAMES
    from horizonrl.models import TinyModelConfig, build_tiny_model, save_model_and_tokenizer, train_tokenizer

    words = ENTITY_NAMES if cfg.tiny_name_tokens else ()
    tok = train_tokenizer(
        tokenizer_corpus(seed=cfg.seed), vocab_size=cfg.tiny_vocab, seed=cfg.seed, words=words
    )
    tcfg = TinyModelConfig(
        hidden_size=cfg.tiny_hidden,
        num_layers=cfg.tiny_layers,
        intermediate_size=3 * cfg.tiny_hidden,
        seed=cfg.seed,
    )
    model = build_tiny_model(tok, tcfg)
    report: dict[str, Any] = {"steps": 0}
    if cfg.tiny_pretrain_steps:
        losses = copy_pretrain(
            model, vocab_size=len(tok), steps=cfg.tiny_pretrain_steps, lr=cfg.tiny_pretrain_lr, seed=cfg.seed
        )
        tail = losses[-50:]
        report = {
            "steps": len(losses),
            "max_steps": cfg.tiny_pretrain_steps,
            "lr": cfg.tiny_pretrain_lr,
            "final_loss": sum(tail) / len(tail),
            "converged": copy_converged(losses),
        }
        if not report["converged"] and cfg.tiny_pretrain_steps >= 1000:
            warnings.warn(
                f"tiny model: copy pretraining did not converge in {len(losses)} steps (final loss "
                f"{report['final_loss']:.2f}); the model cannot copy from its context and SFT/RL will "
                "learn little. Raise model.tiny_pretrain_steps or lower model.tiny_pretrain_lr.",
                stacklevel=2,
            )
    save_model_and_tokenizer(model, tok, out_dir)
    (Path(out_dir) / "pretrain.json").write_text(json.dumps(report, indent=2) + "\n")
    return model, tok


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def load_policy(cfg: ModelConfig, *, init: str | None, work_dir: str | Path):
    """Model and tokenizer for a run.

    ``init`` if given, else ``cfg.path``: 'tiny', 'smollm2' or a local directory.
    """
    from horizonrl.models import load_model_and_tokenizer, load_smollm2

    device = resolve_device(cfg.device)
    if init is not None:
        return load_model_and_tokenizer(init, dtype=cfg.dtype, device=str(device))
    if cfg.path == "tiny":
        target = Path(work_dir) / "base_model"
        if not (target / "config.json").exists():
            build_tiny(cfg, target)
        return load_model_and_tokenizer(target, dtype=cfg.dtype, device=str(device))
    if cfg.path == "smollm2":
        model, tok = load_smollm2(Path.home() / ".cache" / "horizonrl" / "smollm2-135m-instruct")
        return model.to(device=device, dtype=getattr(torch, cfg.dtype)), tok
    return load_model_and_tokenizer(cfg.path, dtype=cfg.dtype, device=str(device))
