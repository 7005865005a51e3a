"""The ``rollout`` section: sampling, the agent loop and its context manager."""

from __future__ import annotations

from dataclasses import dataclass

from horizonrl.config.fields import _Section, opt
from horizonrl.vocab import DriverMode, Overflow, ThinkingHistory


@dataclass(frozen=True)
class RolloutConfig(_Section):
    _prefix = "rollout."
    group_size: int = opt(8, "rollouts per task (G)", ge=1, le=4096)
    tasks_per_step: int = opt(8, "tasks sampled per training step", ge=1, le=10**5)
    dynamic_sampling: bool = opt(
        False,
        "DAPO dynamic sampling (group trainer): drop groups whose rollouts all got the same reward (zero "
        "group-relative advantage) and draw more tasks until the step holds rollout.tasks_per_step groups "
        "with signal or has made rollout.max_draws draws; every draw counts in train.max_gen_tokens; "
        "logged as rollout/groups_drawn, rollout/zero_adv_dropped, rollout/draws, "
        "rollout/dynamic_cap_reached (train/rollout/dynamic.py)",
    )
    max_draws: int = opt(
        4,
        "dynamic sampling: the most draws of rollout.tasks_per_step tasks one step makes (DAPO's "
        "max_num_gen_batches); a step that reaches it trains on the groups with signal it has",
        ge=1,
        le=1000,
    )
    temperature: float = opt(
        1.0, "sampling temperature (also applied to training log-probs)", gt=0.0, le=100.0
    )
    top_p: float = opt(1.0, "nucleus sampling threshold", gt=0.0, le=1.0)
    max_new_tokens: int = opt(48, "tokens per generation (turn)", ge=1, le=2**20)
    max_turns: int = opt(6, "turns per rollout before it ends as max_turns", ge=1, le=10**5)
    context_budget: int = opt(1024, "maximum prompt + generation tokens of one context", ge=16, le=2**22)
    overflow: str = opt(
        "truncate",
        "when a turn would overrun the context budget: 'truncate' shortens the generation to fit "
        "(ending the rollout when nothing fits); 'fail' ends the rollout as failed at once",
        choices=tuple(m.value for m in Overflow),
    )
    max_batch_size: int = opt(128, "engine batch size for generation", ge=1, le=2**16)
    agent: str = opt(
        "react",
        "agent kind: 'react' (tool loop), 'fork' (Mosaic subagent forking), 'stepwise' (one rebuilt "
        "prompt per step, CCPO/verl-agent style); see `horizonrl agents`",
    )
    agent_params: dict = opt({}, "keyword parameters of the agent kind (e.g. fork limits, history length)")
    context: str = opt(
        "append",
        "context manager: 'append', 'compaction' (Mosaic), 'summary' (SUPO rolling summary), 'memory' "
        "(ECHO turn memory), 'window' / 'strip_think' / 'turn_summary' (RTPO conditioning maps)",
    )
    context_params: dict = opt({}, "keyword parameters of the context manager")
    thinking_history: str = opt(
        "keep",
        "for families whose template drops earlier thinking (Qwen3): 'keep' the sampled thinking in later "
        "prompts (one merged row per episode; later prompts then differ from the template's rendering), "
        "or 'drop' it as the template does (append context only; each turn is then trained on its own "
        "exact context)",
        choices=tuple(m.value for m in ThinkingHistory),
    )
    few_shot: int = opt(
        0,
        "expert episodes shown before every task as earlier chat turns (successful expert runs on "
        "training tasks, tool calls in the model family's own syntax; react and fork agents): gives a small "
        "pretrained model a starting reward (docs/models.md)",
        ge=0,
        le=16,
    )
    check_tokens: bool | None = opt(
        None,
        "compare kept prompts with a fresh rendering of the conversation and report the first token "
        "where they differ (rollout/token_mismatch; rollout/token_mismatch_text counts only text "
        "differences, not a non-canonical tokenization of the same text; a warning; costs one rendering "
        "per turn): true every episode, false none; unset (the default) the first 8 episodes of a fresh "
        "run's first step (group trainer), so a template that rewrites earlier turns never trains unreported",
    )
    driver: str = opt(
        "sync",
        "how agent programs run: 'sync' (round by round: every turn of every episode generates in one "
        "batch and waits for the slowest), or 'async' (episode by episode: each request goes to the engine "
        "as soon as it is made, environment steps of different episodes run concurrently in env_threads "
        "threads; every request is sampled from its path seed, so the samples do not depend on timing, up "
        "to float rounding of batch shapes: the same tokens on CPU float32 (log-probs to ~5e-7), not "
        "promised on a GPU; docs/scale.md). "
        "'sync' stays the default because it reproduces the recorded results",
        choices=tuple(m.value for m in DriverMode),
    )
    env_threads: int = opt(
        8, "threads that resume agent programs (environment steps) under driver 'async'", ge=1, le=1024
    )
    sync_env_threads: int = opt(
        1,
        "threads that resume agent programs (environment steps, e.g. sandboxed tool calls) between the "
        "rounds of driver 'sync': one rollout per thread at a time, requests collected in the order one "
        "thread would, so the batches and samples are those of 1 (agents/driver.py)",
        ge=1,
        le=1024,
    )
