"""The ``optim`` and ``train`` sections: the optimizer of the update, and the training loop around it
(length, evaluation, checkpoints, rollout records, loggers, asynchronous rollouts).
"""

from __future__ import annotations

from dataclasses import dataclass

from horizonrl.config.fields import LOGGERS, MAX_SEED, _Section, opt
from horizonrl.errors import ConfigError
from horizonrl.vocab import Precision


@dataclass(frozen=True)
class OptimConfig(_Section):
    _prefix = "optim."
    lr: float = opt(1e-4, "AdamW learning rate", gt=0.0, le=1.0)
    weight_decay: float = opt(0.0, "AdamW weight decay", ge=0.0)
    beta1: float = opt(0.9, "AdamW beta1", ge=0.0, le=1.0)
    beta2: float = opt(0.999, "AdamW beta2", ge=0.0, le=1.0)
    grad_clip: float = opt(1.0, "max global gradient norm (0 = off)", ge=0.0)
    warmup_steps: int = opt(0, "linear warmup steps", ge=0)
    schedule: str = opt(
        "constant", "learning-rate schedule after warmup", choices=("constant", "cosine", "linear")
    )
    nonfinite: str = opt(
        "stop",
        "a NaN/infinite loss or gradient norm in the update: 'stop' ends the run naming the step (no "
        "checkpoint is written), 'skip' drops that mini-batch's optimizer step (counted as "
        "train/skipped_batches); non-finite parameters after a step always stop the run",
        choices=("stop", "skip"),
    )


@dataclass(frozen=True)
class TrainConfig(_Section):
    _prefix = "train."
    trainer: str = opt(
        "group",
        "'group' (GRPO, Mosaic, CCPO, ECHO, ... over groups of rollouts), 'rtpo' (reverse-turn), "
        "'seeupo' (sequential per-turn baseline), 'gateway' (episodes of an external agent harness "
        "recorded by the gateway; see the gateway section)",
    )
    trainer_params: dict = opt(
        {},
        "keyword parameters of the trainer, checked against the parameters it declares (RTPO's and "
        "SeeUPO's: the trainer-parameter reference; `horizonrl trainers`)",
    )
    steps: int = opt(20, "training steps (one batch of rollouts each)", ge=0, resume=True)
    seed: int = opt(0, "seed of task sampling, rollouts and shuffling", ge=0, le=MAX_SEED)
    out_dir: str = opt("runs/default", "run directory (created; must not be a file)")
    init: str | None = opt(
        None, "model directory to start from (e.g. an SFT checkpoint); overrides model.path"
    )
    eval_every: int = opt(
        0,
        "evaluate every N steps (0 = only before and after training); each evaluation runs "
        "env.test_tasks x train.eval_samples episodes",
        ge=0,
    )
    eval_samples: int = opt(
        4,
        "samples per held-out task (pass@1 averages them; pass@k uses all): an evaluation runs "
        "env.test_tasks x eval_samples episodes",
        ge=1,
        le=4096,
    )
    eval_temperature: float = opt(1.0, "sampling temperature at evaluation", gt=0.0, le=100.0)
    eval_greedy: bool = opt(
        False,
        "also decode each held-out task once greedily at every evaluation (eval_greedy/pass@1 and the "
        "other eval_greedy/* keys; per-task successes in eval/step_N.json as greedy_correct), so a result "
        "tells what the policy learned from what sampling at eval_temperature adds or loses",
    )
    eval_seed: int | None = opt(
        None,
        "seed of evaluation sampling (null: train.seed + 1000003); fix it to evaluate runs of different "
        "seeds on the same draws",
        ge=0,
        le=MAX_SEED,
    )
    eval_at_start: bool = opt(
        True,
        "evaluate before the first step of a fresh run; like every evaluation it runs env.test_tasks x "
        "train.eval_samples episodes",
    )
    save_every: int = opt(10, "checkpoint every N steps (0 = only at the end)", ge=0, resume=True)
    no_signal_steps: int = opt(
        3,
        "warn (progress line and log) once this many steps in a row had >= 95% of their groups with zero "
        "advantage (train/zero_adv_group_rate; train/no_signal_steps counts the streak); 0 = off",
        ge=0,
        resume=True,
    )
    keep_checkpoints: int = opt(2, "checkpoints kept on disk", ge=1, resume=True)
    save_rollouts: bool = opt(True, "write each step's rollouts to rollouts/step_N.jsonl", resume=True)
    max_gen_tokens: int = opt(
        0,
        "generation budget in generated tokens (all engine calls; 0 = none): a phase predicted to overrun "
        "it does not start, and generation is clipped so the budget is never exceeded "
        "(train/rollout/budget.py)",
        ge=0,
        resume=True,
    )
    eval_fractions: list = opt(
        [],
        "also evaluate once each of these fractions of the run is done (of train.max_gen_tokens when set, "
        "else of train.steps), e.g. [0.5]",
    )
    save_credit: bool = opt(
        True,
        "with save_rollouts: also record per turn the estimator's per-token advantages, the training row "
        "and the estimator's side information (what `horizonrl view` shows; docs/viewer.md)",
    )
    loggers: list = opt(
        ["jsonl"],
        f"experiment loggers, any of {list(LOGGERS)}: jsonl (metrics.jsonl; always on), tensorboard, "
        "wandb (offline mode), mlflow (local file store), trackio (local); scalars every step, the config "
        "once, a rollout sample as a table where the backend has one",
    )
    log_rollouts: int = opt(
        4,
        "rollouts per step sent as a table to the loggers (wandb, mlflow, trackio; text in tensorboard)",
        ge=0,
    )
    project: str = opt("horizonrl", "project / experiment name used by wandb, mlflow and trackio")
    tensorboard: bool = opt(False, "alias: adds 'tensorboard' to train.loggers", resume=True)
    progress: bool = opt(
        True,
        "show progress bars on stderr: training steps, and each evaluation's tasks done and generated "
        "tokens/s",
        resume=True,
    )
    max_staleness: int = opt(
        0,
        "asynchronous rollouts (group trainer): the batch of step s is sampled by the weights of step "
        "max(0, s - k) on a separate engine copy while earlier steps train (train/rollout/staleness.py); "
        "0 = synchronous (every batch sampled by the weights it trains)",
        ge=0,
    )
    precision: str = opt(
        "fp32",
        "compute precision of the update's forward passes (and of algo.old_logprobs=recompute): 'bf16' runs "
        "them under torch.autocast to bfloat16 while parameters, gradients and AdamW state stay in "
        "model.dtype (use model.dtype float32 with it: fp32 master weights; model.dtype bfloat16 keeps the "
        "optimizer state in bf16 too); log-probs after the LM head are float32 either way",
        choices=tuple(m.value for m in Precision),
    )
    logprob_chunk_tokens: int = opt(
        0,
        "compute the update's per-token log-probs by projecting hidden states through the LM head this "
        "many positions at a time (each chunk checkpointed), so the [B, T, vocab] float32 logits never "
        "exist; e.g. 1024 (a chunk's logits take ~16 x chunk x vocab bytes); 0 = off (one full-logits "
        "forward)",
        ge=0,
        le=2**20,
    )
    gradient_checkpointing: bool = opt(
        False,
        "recompute each decoder layer's activations in the backward (transformers' activation "
        "checkpointing, non-reentrant): the update keeps one layer input per token and layer instead of "
        "every activation, at the cost of a second forward pass of every layer",
    )
    memory_gb: float | None = opt(
        None,
        "memory budget in GiB of one update step, used by algo.micro_batch_tokens=0 to size micro-batches "
        "(docs/scale.md gives the formula); null = 80 % of the device's memory (physical RAM on CPU, the "
        "GPU's on CUDA), not counting other processes (a vLLM engine, environment workers)",
        gt=0.0,
        le=1e6,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        for x in self.eval_fractions:
            if isinstance(x, bool) or not isinstance(x, int | float) or not 0.0 < x <= 1.0:
                raise ConfigError(
                    f"train.eval_fractions={self.eval_fractions!r}: {x!r} is not a number in (0, 1]"
                )
        bad = [x for x in self.loggers if x not in LOGGERS]
        if bad:
            raise ConfigError(
                f"train.loggers={self.loggers!r}: unknown logger(s) {bad}; known: {list(LOGGERS)}"
            )

    @property
    def logger_names(self) -> list[str]:
        """``jsonl`` (always on), ``loggers``, and ``tensorboard`` when the alias is on; in order, unique."""
        names = ["jsonl", *self.loggers, *(["tensorboard"] if self.tensorboard else [])]
        return list(dict.fromkeys(names))
