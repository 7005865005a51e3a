"""End-to-end recipes behind the CLI: SFT warm start, evaluation of a model dir, the quickstart."""

from __future__ import annotations

import dataclasses
import json
import time
from importlib import resources
from pathlib import Path
from typing import Any

from horizonrl.agents import AgentSpec, LoopLimits
from horizonrl.config import ConfigError, RunConfig, load_config
from horizonrl.inference.base import SamplingParams
from horizonrl.train.rollout.collect import evaluate
from horizonrl.train.rollout.env_setup import env_setup
from horizonrl.train.trainers.checks import check_run, ensure_dir
from horizonrl.train.warmstart.bootstrap import (
    generate_demos,
    load_policy,
    read_demos,
    resolve_device,
    write_demos,
)
from horizonrl.train.warmstart.sft import demo_rows, sft_train


def packaged_config(name: str) -> Path:
    return Path(str(resources.files("horizonrl") / "configs" / f"{name}.yaml"))


def demos_from_programs(cfg: RunConfig) -> bool:
    """Whether SFT records its demos by running the agent program with the scripted expert.

    Generated demos (``sft.data`` null) of a react agent with the append context are the env's
    message demos; every other agent, and ``sft.labels: clean`` (a noise step relabeled with the
    expert's action at that state), runs the agent program. Demos read from a file cannot be relabeled.
    """
    if cfg.sft.data is not None:
        if cfg.sft.labels == "clean":
            raise ConfigError(
                "sft.labels='clean' relabels the demos the scripted expert records; it needs sft.data=null "
                f"(got sft.data={cfg.sft.data!r})"
            )
        return False
    return cfg.sft.labels == "clean" or cfg.rollout.agent != "react" or cfg.rollout.context != "append"


def run_sft(cfg: RunConfig, *, work_dir: str | Path | None = None, log=None) -> Path:
    """Fine-tune ``model.path`` (or ``train.init``) on demonstrations; save to ``sft.out_dir``."""
    from horizonrl.models import save_model_and_tokenizer
    from horizonrl.models.chat import renderer_for
    from horizonrl.models.lora import is_lora, merge_and_unload
    from horizonrl.train.update.lean import auto_micro_batch_tokens

    check_run(cfg, trainer=False)
    programs = demos_from_programs(cfg)
    demos = read_demos(cfg.sft.data) if cfg.sft.data is not None else None  # fail before any work
    out = ensure_dir(cfg.sft.out_dir, "sft.out_dir")
    work_dir = Path(work_dir) if work_dir is not None else out.parent
    model, tok = load_policy(cfg.model, init=cfg.train.init, work_dir=work_dir)
    renderer = renderer_for(tok, cfg)
    if programs:
        rows = expert_program_rows(cfg, renderer, tok)
    else:
        if demos is None:
            demos = generate_demos(
                cfg.env.name,
                cfg.sft.demos,
                seed=cfg.train.seed,
                noise=cfg.sft.noise,
                max_turns=cfg.rollout.max_turns,
                knobs=dict(cfg.env.knobs),
                task_seed=cfg.env.seed,
                setup=env_setup(cfg.env, run_dir=out),
            )
            write_demos(out / "demos.jsonl", demos)
        rows = demo_rows(renderer, demos)
    device = resolve_device(cfg.model.device)
    model.to(device)
    sft_train(
        model,
        rows,
        epochs=cfg.sft.epochs,
        batch_size=cfg.sft.batch_size,
        lr=cfg.sft.lr,
        seed=cfg.train.seed,
        device=device,
        pad_id=tok.pad_token_id or 0,
        # 0: sized from train.memory_gb for SFT's plain forward (fp32, full logits, no checkpointing)
        micro_batch_tokens=cfg.algo.micro_batch_tokens
        or auto_micro_batch_tokens(model, cfg.train.memory_gb, device=device),
        share_prefix=cfg.algo.tree_training == "auto",
        log=log,
    )
    if is_lora(model):  # model.lora_r > 0: SFT trained adapters; the warm start is a plain model
        merge_and_unload(model)
    save_model_and_tokenizer(model, tok, out)
    return out


def expert_groups(
    cfg: RunConfig,
    renderer,
    tok,
    *,
    n_tasks: int,
    group_size: int,
    seed: int,
    run_dir=None,
    clean_labels=False,
):
    """``group_size`` rollouts of ``n_tasks`` training tasks by the configured agent program driven by
    the scripted expert at ``sft.noise`` (:class:`~horizonrl.agents.expert.ExpertEngine`): warm-start
    demonstrations of any protocol, and the regime checks of :mod:`horizonrl.reproduce.checks`."""
    from horizonrl.agents.expert import ExpertEngine
    from horizonrl.train.rollout.collect import collect_groups

    setup = env_setup(cfg.env, run_dir=run_dir)
    tasks = setup.tasks(n_tasks, seed=cfg.env.seed, split="train")
    r = cfg.rollout
    params = SamplingParams(max_new_tokens=r.max_new_tokens)
    limits = LoopLimits(max_turns=r.max_turns, context_budget=r.context_budget, overflow=r.overflow)
    spec = AgentSpec(
        renderer=renderer,
        params=params,
        limits=limits,
        context=r.context,
        context_params=dict(r.context_params),
        agent_params=dict(r.agent_params),
        make_env=setup.make,
    )
    engine = ExpertEngine(
        tok, eos_id=renderer.eos_id, seed=seed, noise=cfg.sft.noise, clean_labels=clean_labels
    )
    return collect_groups(
        engine, renderer, spec.make_env, tasks, group_size, params, limits, agent=r.agent, spec=spec
    )


def expert_program_rows(cfg: RunConfig, renderer, tok) -> list:
    """SFT rows from expert rollouts of the configured agent program (:func:`expert_groups`).

    Multi-session protocols (compaction summaries, fork calls, subagent sessions)
    are recorded exactly as the policy will see them; every generated token is
    trainable. ``sft.demos`` rollouts, one per training task. With ``sft.labels: clean`` a noise
    action's tokens are replaced by the noise-free expert's action at that state (its row then ends
    there; the next turn's own prompt, which shows the action taken, starts a new row).
    """
    from horizonrl.trajectory import build_rows

    clean = cfg.sft.labels == "clean"
    groups = expert_groups(
        cfg,
        renderer,
        tok,
        n_tasks=cfg.sft.demos,
        group_size=1,
        seed=cfg.train.seed,
        run_dir=cfg.sft.out_dir,
        clean_labels=clean,
    )
    rollouts = [ro for g in groups for ro in g.rollouts]
    if clean:
        for turn in (t for ro in rollouts for t in ro.turns):
            if "label_ids" in turn.info:
                turn.response_ids = list(turn.info["label_ids"])
                turn.logprobs = [0.0] * len(turn.response_ids)
    return build_rows(rollouts)


def evaluate_model(
    cfg: RunConfig,
    model_dir: str | Path,
    *,
    split: str = "test",
    n_tasks: int | None = None,
    samples: int | None = None,
    temperature: float | None = None,
    groups_out: list | None = None,
) -> dict[str, float]:
    """pass@1 / pass@k of ``model_dir`` on ``n_tasks`` tasks of ``split`` (default: the held-out tasks).

    ``split='train'`` measures the training distribution (the warm-start gate of
    :mod:`horizonrl.reproduce`); ``samples`` / ``temperature`` default to the
    ``train.eval_*`` settings; ``groups_out`` (a list) receives the rollout groups.
    """
    from horizonrl.inference import make_engine
    from horizonrl.models.chat import renderer_for
    from horizonrl.train.rollout.workers import for_family
    from horizonrl.train.warmstart.few_shot import few_shot_messages

    check_run(cfg, trainer=False)
    if not Path(model_dir).is_dir():
        raise FileNotFoundError(f"--model {model_dir}: no such model directory")
    setup = env_setup(cfg.env)  # the judge cache (if any) stays in memory: model_dir may be a checkpoint
    n = n_tasks if n_tasks is not None else (cfg.env.test_tasks if split == "test" else cfg.env.train_tasks)
    tasks = setup.tasks(n, seed=cfg.env.seed, split=split)
    model, tok = load_policy(cfg.model, init=str(model_dir), work_dir=Path(model_dir), lora=False)
    t = cfg.train
    engine = make_engine(
        cfg.inference.engine,
        model,
        tok,
        device=resolve_device(cfg.model.device),
        max_batch_size=cfg.rollout.max_batch_size,
        seed=t.eval_seed if t.eval_seed is not None else t.seed + 1_000_003,
        params=dict(cfg.inference.params),
    )
    renderer = renderer_for(tok, cfg)
    engine = for_family(engine, renderer)
    r = cfg.rollout
    params = SamplingParams(
        temperature=temperature if temperature is not None else t.eval_temperature,
        top_p=r.top_p,
        max_new_tokens=r.max_new_tokens,
    )
    limits = LoopLimits(r.max_turns, r.context_budget, r.overflow)

    make_env = setup.make
    spec = AgentSpec(
        renderer=renderer,
        params=params,
        limits=limits,
        context=r.context,
        context_params=dict(r.context_params),
        agent_params=dict(r.agent_params),
        make_env=make_env,
        preamble=few_shot_messages(setup, r.few_shot, seed=cfg.env.seed, max_turns=r.max_turns),
    )
    try:
        return evaluate(
            engine,
            renderer,
            make_env,
            tasks,
            samples=samples if samples is not None else t.eval_samples,
            params=params,
            limits=limits,
            agent=r.agent,
            spec=spec,
            groups_out=groups_out,
            progress=t.progress,
        )
    finally:
        engine.close()


def _table(rows: list[tuple[str, dict[str, Any]]], k: int) -> str:
    keys = [
        ("pass@1", "eval/pass@1"),
        (f"pass@{k}", f"eval/pass@{k}"),
        ("turns", "eval/rollout/turns_mean"),
        ("tool calls", "eval/rollout/tool_calls_mean"),
        ("invalid turns", "eval/rollout/invalid_turn_rate"),
    ]
    head = f"{'model':<22}" + "".join(f"{name:>14}" for name, _ in keys)
    lines = [head, "-" * len(head)]
    for label, m in rows:
        lines.append(f"{label:<22}" + "".join(f"{m.get(key, float('nan')):>14.3f}" for _, key in keys))
    return "\n".join(lines)


def quickstart(out_dir: str | Path = "runs/quickstart", overrides: list[str] | None = None) -> dict[str, Any]:
    """Tiny model → SFT on noisy expert demos → GRPO → before/after held-out table."""
    from horizonrl.train.trainers.group import GroupTrainer

    out = Path(out_dir)
    t0 = time.perf_counter()
    base = load_config(packaged_config("quickstart"), overrides)
    cfg = dataclasses.replace(
        base,
        sft=dataclasses.replace(base.sft, out_dir=str(out / "sft")),
        train=dataclasses.replace(base.train, out_dir=str(out / "grpo"), init=str(out / "sft")),
    )
    print(f"[1/3] the tiny base model and SFT on {cfg.sft.demos} noisy expert demos (noise={cfg.sft.noise})")

    def log(i, n, loss):
        if i == 1 or i % max(1, n // 5) == 0 or i == n:
            print(f"      sft step {i}/{n} loss {loss:.3f}", flush=True)

    run_sft(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, init=None)), work_dir=out, log=log)
    source = json.loads((out / "base_model" / "pretrain.json").read_text()).get("source", "built here")
    print(f"      base model: {source}")
    t1 = time.perf_counter()
    print(f"      done in {t1 - t0:.0f}s")
    print(
        f"[2/3] GRPO: {cfg.train.steps} steps x {cfg.rollout.tasks_per_step} tasks"
        f" x G={cfg.rollout.group_size}"
    )
    trainer = GroupTrainer(cfg)
    try:
        records = trainer.fit()
    finally:
        trainer.close()
    t2 = time.perf_counter()
    print(f"      done in {t2 - t1:.0f}s")
    before, after = records[0], records[-1]
    k = cfg.train.eval_samples
    print(f"[3/3] held-out {cfg.env.name} tasks ({cfg.env.test_tasks} tasks x {k} samples)\n")
    print(_table([("SFT start", before), ("after GRPO", after)], k))
    gain = 100 * (after["eval/pass@1"] - before["eval/pass@1"])
    print(f"\npass@1 change: {gain:+.1f} points; total time {t2 - t0:.0f}s; run dir {out}")
    return {"before": before, "after": after, "seconds": t2 - t0}
