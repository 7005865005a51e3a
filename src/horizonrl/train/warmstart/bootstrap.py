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

from horizonrl.config import ConfigError, ModelConfig
from horizonrl.envs import get_env
from horizonrl.envs.core.base import Env, Task
from horizonrl.errors import DataError
from horizonrl.jsonl import read_jsonl
from horizonrl.train.warmstart.pretrain import copy_accuracy, copy_converged, copy_pretrain


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

    ``setup`` (a :class:`horizonrl.train.rollout.env_setup.EnvSetup`) takes the tasks and environments from
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


#: Message roles a demonstration may hold (the chat template renders these).
DEMO_ROLES = ("system", "user", "assistant", "tool")


def read_demos(path: str | Path) -> list[dict[str, Any]]:
    """Demonstrations of a JSONL file (``{"messages": [...], "tools": [...]}`` per line).

    Read with :func:`horizonrl.jsonl.read_jsonl` (a torn last line is skipped with a warning);
    every other defect is a :class:`~horizonrl.errors.DataError` naming the file, line and field:
    a message that is not ``{"role", "content"}`` with a known role and string content, a
    demonstration without an assistant message (nothing to train on), an empty file.
    """
    out = []
    for rec in read_jsonl(path, what="demonstrations"):
        messages = rec.get("messages", list)
        for j, m in enumerate(messages):
            where = f"messages[{j}]"
            if not isinstance(m, dict):
                raise rec.error(f"must be an object with 'role' and 'content', got {type(m).__name__}", where)
            if m.get("role") not in DEMO_ROLES:
                raise rec.error(f"unknown role {m.get('role')!r}; known: {list(DEMO_ROLES)}", f"{where}.role")
            if not isinstance(m.get("content"), str):
                raise rec.error(
                    f"must be a string, got {type(m.get('content')).__name__}", f"{where}.content"
                )
        if not any(m["role"] == "assistant" for m in messages):
            raise rec.error("has no assistant message (nothing to train on)", "messages")
        tools = rec.get("tools", list, None)
        if tools is not None and not all(isinstance(t, dict) for t in tools):
            raise rec.error("must be a list of tool schemas (objects)", "tools")
        out.append(rec.value)
    if not out:
        raise DataError(f"{path}: no demonstrations (the file has no records)")
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
    in-context copy pretraining (:mod:`horizonrl.train.warmstart.pretrain`), save both to ``out_dir``."""
    from horizonrl.envs.builtin.names import ENTITY_NAMES
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
            model,
            vocab_size=len(tok),
            steps=cfg.tiny_pretrain_steps,
            lr=cfg.tiny_pretrain_lr,
            seed=cfg.seed,
            pack=cfg.tiny_pretrain_pack,
        )
        tail = losses[-100:]
        report = {
            "steps": len(losses),
            "max_steps": cfg.tiny_pretrain_steps,
            "lr": cfg.tiny_pretrain_lr,
            "pack": cfg.tiny_pretrain_pack,
            "final_loss": sum(tail) / len(tail),
            "converged": copy_converged(losses),
            # Greedy copy accuracy 256+ tokens into a context (about where a quickstart tool result sits).
            "accuracy_256_deep": copy_accuracy(model, vocab_size=len(tok), depth=256),
        }
        acc = report["accuracy_256_deep"]
        # Span copy deep in a context is the skill copying a tool result needs; recall may lag behind it
        # (one seed in three measured: span 0.99, recall 0.21 after 6000 steps) and is only reported.
        if acc["span"] < 0.9 and cfg.tiny_pretrain_steps >= 1000:
            warnings.warn(
                f"tiny model: after {len(losses)} steps of copy pretraining the model copies only "
                f"{acc['span']:.0%} of a span 256 tokens into a context (recall {acc['recall']:.0%}); it "
                "cannot copy tool results and SFT/RL will learn little. Raise model.tiny_pretrain_steps "
                "or lower model.tiny_pretrain_lr.",
                stacklevel=2,
            )
    save_model_and_tokenizer(model, tok, out_dir)
    (Path(out_dir) / "pretrain.json").write_text(json.dumps(report, indent=2) + "\n")
    return model, tok


def tiny_base(cfg: ModelConfig, target: str | Path) -> str:
    """Put the tiny base model of ``cfg`` at ``target``: a shipped build when ``cfg`` builds exactly it
    (:mod:`horizonrl.models.shipped`), else :func:`build_tiny`. Returns how it got there, which
    ``pretrain.json`` beside it also records (``"source"``)."""
    from horizonrl.models.shipped import SHIPPED_DIR, copy_shipped, shipped_dir, shipped_mismatch

    build = shipped_dir(cfg)
    if build is not None:
        copy_shipped(target, build)
        source = "shipped" if build == SHIPPED_DIR else f"shipped ({build.name})"
    else:
        why = shipped_mismatch(cfg)
        build_tiny(cfg, target)
        source = f"built here ({why})"
    report = Path(target) / "pretrain.json"
    data = json.loads(report.read_text()) if report.is_file() else {}
    report.write_text(json.dumps({**data, "source": source}, indent=2) + "\n")
    return source


def resolve_device(name: str, field: str = "model.device") -> torch.device:
    """``auto`` (CUDA when available, else CPU) or the named device; ConfigError naming ``field``
    when it is not a device or does not exist on this machine."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError):
        raise ConfigError(
            f"{field}={name!r}: not a device; use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'"
        ) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"{field}={name!r}: CUDA is not available on this machine (use 'cpu' or 'auto')"
            )
        n = torch.cuda.device_count()
        if dev.index is not None and dev.index >= n:
            raise ConfigError(f"{field}={name!r}: this machine has {n} CUDA device(s) (cuda:0..cuda:{n - 1})")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{field}={name!r}: MPS is not available on this machine")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"{field}={name!r}: unsupported device type {dev.type!r}")
    return dev


def load_policy(cfg: ModelConfig, *, init: str | None, work_dir: str | Path, lora: bool = True):
    """Model and tokenizer for a run.

    ``init`` if given, else ``cfg.path``: 'tiny', 'smollm2' or a local directory (a LoRA checkpoint
    loads with its adapters merged into the base it names). With ``cfg.lora_r > 0`` (and ``lora``)
    fresh LoRA adapters are put on it and only they train (:mod:`horizonrl.models.lora`).
    """
    model, tok, base_dir = _load_base(cfg, init=init, work_dir=work_dir)
    if lora and cfg.lora_r > 0:
        from horizonrl.models.lora import apply_lora

        apply_lora(model, cfg, base_path=base_dir)
    return model, tok


SMOLLM2_CACHE = Path.home() / ".cache" / "horizonrl" / "smollm2-135m-instruct"


def base_model_dir(cfg: ModelConfig, work_dir: str | Path) -> Path:
    """The directory holding ``cfg.path``'s weights, built on first use: the tiny model's
    ``work_dir/base_model``, SmolLM2's converted GGUF cache, or ``cfg.path`` itself."""
    if cfg.path == "tiny":
        target = Path(work_dir) / "base_model"
        if not (target / "config.json").exists():
            tiny_base(cfg, target)
        return target
    if cfg.path == "smollm2":
        from horizonrl.models import load_smollm2

        if not (SMOLLM2_CACHE / "config.json").exists():
            load_smollm2(SMOLLM2_CACHE)
        return SMOLLM2_CACHE
    return Path(cfg.path)


def _load_base(cfg: ModelConfig, *, init: str | None, work_dir: str | Path):
    """``(model, tokenizer, directory the weights came from)`` for :func:`load_policy`."""
    from horizonrl.models import load_model_and_tokenizer, load_smollm2

    device = resolve_device(cfg.device)

    def load_dir(path):
        from horizonrl.models.lora import is_adapter_dir, load_adapter_dir

        if is_adapter_dir(path):
            return (*load_adapter_dir(path, dtype=cfg.dtype, device=str(device)), None)
        return (*load_model_and_tokenizer(path, dtype=cfg.dtype, device=str(device)), path)

    if init is not None:
        return load_dir(init)
    if cfg.path == "smollm2":
        model, tok = load_smollm2(SMOLLM2_CACHE)
        return model.to(device=device, dtype=getattr(torch, cfg.dtype)), tok, SMOLLM2_CACHE
    return load_dir(base_model_dir(cfg, work_dir))
