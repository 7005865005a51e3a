"""Run configuration: frozen dataclasses with a help string on every field.

Every field is validated when the config is built; an error names the field
and the bad value (floats must be finite: NaN and infinity never pass a range
check; sizes that allocate memory have upper bounds). Configs load from YAML
(:func:`horizonrl.safe_yaml.load_yaml`: JSON-like values only, no tags, bounded alias expansion)
and accept ``section.field=value`` overrides on the command line (values parsed
the same way). Fields marked ``resume=True`` are the only ones ``--resume`` may
change (:func:`resume_conflicts`).
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from horizonrl.errors import ConfigError
from horizonrl.safe_yaml import load_yaml

#: Experiment loggers ``train.loggers`` may name (``horizonrl.train.records.loggers`` registers each; a test
#: keeps the two equal).
LOGGERS = ("jsonl", "tensorboard", "wandb", "mlflow", "trackio")


#: Seeds are in ``[0, MAX_SEED]`` (every RNG the run seeds accepts them).
MAX_SEED = 2**32 - 1
#: Largest config file read.
MAX_CONFIG_BYTES = 1 << 20
_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


def opt(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    choices=None,
    ge=None,
    gt=None,
    le=None,
    resume: bool = False,
    **kw,
):
    """A dataclass field with a help string and simple declarative checks.

    ``resume=True``: the field may differ from the saved config when a run is resumed
    (run length and output-only settings; see :func:`resume_conflicts`).
    """
    meta = {"help": help, "choices": choices, "ge": ge, "gt": gt, "le": le, "resume": resume}
    if isinstance(default, dict | list):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)


def _check(obj: Any, prefix: str) -> None:
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        name = f"{prefix}{f.name}"
        hint = hints[f.name]
        if dataclasses.is_dataclass(v):
            continue
        origin = typing.get_origin(hint)
        allowed = typing.get_args(hint) if origin in (typing.Union, types.UnionType) else (hint,)
        if v is None and type(None) in allowed:
            continue
        base = tuple(typing.get_origin(a) or a for a in allowed if a is not type(None))
        if float in base and isinstance(v, int | str) and not isinstance(v, bool):
            # YAML reads `3e-4` (no dot) as a string; accept any float literal.
            try:
                v = float(v)
            except ValueError:
                pass
            else:
                object.__setattr__(obj, f.name, v)
        if (base and not isinstance(v, base)) or (isinstance(v, bool) and bool not in base):
            raise ConfigError(f"{name}={v!r}: expected {' or '.join(b.__name__ for b in base)}")
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"{name}={v!r}: must be a finite number")
        m = f.metadata
        if m.get("choices") is not None and v not in m["choices"]:
            raise ConfigError(f"{name}={v!r}: must be one of {list(m['choices'])}")
        if m.get("ge") is not None and v < m["ge"]:
            raise ConfigError(f"{name}={v!r}: must be >= {m['ge']}")
        if m.get("gt") is not None and not v > m["gt"]:
            raise ConfigError(f"{name}={v!r}: must be > {m['gt']}")
        if m.get("le") is not None and v > m["le"]:
            raise ConfigError(f"{name}={v!r}: must be <= {m['le']}")


class _Section:
    _prefix = ""

    def __post_init__(self) -> None:
        _check(self, self._prefix)


@dataclass(frozen=True)
class ModelConfig(_Section):
    _prefix = "model."
    path: str = opt(
        "tiny", "'tiny' (build the embedded tiny model), 'smollm2', or a local HF model directory"
    )
    dtype: str = opt("float32", "parameter dtype", choices=("float32", "bfloat16", "float16"))
    device: str = opt("auto", "'auto', 'cpu', 'cuda', 'cuda:N' or 'mps' (it must exist on this machine)")
    tiny_hidden: int = opt(128, "tiny model: hidden size", gt=0, le=8192)
    tiny_layers: int = opt(4, "tiny model: transformer layers", gt=0, le=128)
    tiny_vocab: int = opt(768, "tiny model: BPE vocabulary size of the trained tokenizer", ge=300, le=65536)
    tiny_pretrain_steps: int = opt(
        6000,
        "tiny model: at most this many steps of synthetic in-context copy pretraining after "
        "initialisation (it stops early once the copy loss has converged)",
        ge=0,
        le=10**7,
    )
    tiny_pretrain_lr: float = opt(
        1e-3,
        "tiny model: peak learning rate of the copy pretraining (3e-3 fails to converge on some CPUs)",
        gt=0.0,
        le=1.0,
    )
    tiny_pretrain_pack: int = opt(
        8,
        "tiny model: copy-pretraining problems packed into one row, so each is found by content deep in "
        "a context of others (1: one problem a row, whose copy circuit only works near the start of a "
        "context)",
        ge=1,
        le=256,
    )
    tiny_name_tokens: bool = opt(
        False,
        "tiny model: add the entity-name pool (horizonrl.envs.names, lookup's `names: pool`) to the "
        "tokenizer as whole-word tokens, so each entity is one token",
    )
    seed: int = opt(0, "seed for the tiny model's initialisation and tokenizer corpus", ge=0, le=MAX_SEED)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not _DEVICE.match(self.device):
            raise ConfigError(
                f"model.device={self.device!r}: must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'"
            )


@dataclass(frozen=True)
class EnvConfig(_Section):
    _prefix = "env."
    name: str = opt("arithmetic", "registered environment name (see `horizonrl envs`)")
    knobs: dict = opt({}, "difficulty knobs passed to the environment and its task generator")
    train_tasks: int = opt(
        2000, "size of the training task pool (a task file: at most this many rows)", gt=0, le=10**7
    )
    test_tasks: int = opt(
        100, "number of held-out evaluation tasks (a task file: at most this many)", gt=0, le=10**6
    )
    seed: int = opt(
        0,
        "seed of the task generator (a task file: of the subsample when it has more rows)",
        ge=0,
        le=MAX_SEED,
    )
    imports: list | str = opt(
        [],
        "modules imported before env.name is looked up, so that environments and rewards defined in your "
        "own code register: dotted names on sys.path (mypkg.envs) or .py file paths",
    )
    tasks: dict | None = opt(
        None,
        "tasks from a local file instead of the generator: {path: FILE.jsonl|.json|.csv|.parquet (or "
        "{train: FILE, test: FILE}), prompt: COLUMN, answer: COLUMN, id: COLUMN, split: COLUMN (train/test), "
        "aliases: COLUMN}; QA-style environments and CustomEnv subclasses (docs/custom_env.md)",
    )
    reward: str | None = opt(
        None,
        "answer reward of a QA-style environment: exact_match | token_f1 | math_equivalent | judge | "
        "module:function (also path/file.py:function); null = the environment's own check",
    )
    reward_params: dict = opt(
        {},
        "parameters of env.reward: judge {url, model, cache, api_key_env, timeout_s, max_retries, "
        "max_tokens}; math_equivalent {timeout_s}; module:function: keyword arguments",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        imports = [self.imports] if isinstance(self.imports, str) else self.imports
        for item in imports:
            if not isinstance(item, str) or not item.strip():
                raise ConfigError(
                    f"env.imports={self.imports!r}: each entry must be a module name or .py path"
                )
        if self.tasks is not None:
            from horizonrl.envs.taskfile import TaskFileError, TaskFileSpec

            try:
                TaskFileSpec.from_mapping(self.tasks)
            except TaskFileError as e:
                raise ConfigError(str(e)) from None
        if self.reward is not None and not (
            self.reward.replace("_", "a").isalnum() or (":" in self.reward and self.reward.rpartition(":")[2])
        ):
            raise ConfigError(f"env.reward={self.reward!r}: expected a reward name or module:function")
        if self.reward_params and self.reward is None:
            raise ConfigError(f"env.reward_params={self.reward_params!r}: set only together with env.reward")


@dataclass(frozen=True)
class RolloutConfig(_Section):
    _prefix = "rollout."
    group_size: int = opt(8, "rollouts per task (G)", ge=1, le=4096)
    tasks_per_step: int = opt(8, "tasks sampled per training step", ge=1, le=10**5)
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
        choices=("truncate", "fail"),
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


@dataclass(frozen=True)
class AlgoConfig(_Section):
    _prefix = "algo."
    estimator: str = opt("grpo", "registered credit estimator (see `horizonrl estimators`)")
    estimator_params: dict = opt({}, "keyword parameters of the estimator")
    loss_agg_mode: str | None = opt(
        None,
        "loss aggregation mode; default: the estimator's own",
        choices=(
            None,
            "token-mean",
            "seq-mean-token-mean",
            "seq-mean-token-sum",
            "seq-mean-token-sum-norm",
            "rollout-mean-token-mean",
        ),
    )
    policy_loss: str = opt(
        "ppo",
        "'ppo' (clipped surrogate) or 'reinforce' (unclipped -A * ratio; RLOO's sequence-level REINFORCE "
        "with loss_agg_mode seq-mean-token-sum)",
        choices=("ppo", "reinforce"),
    )
    loss_norm_tokens: int | None = opt(
        None,
        "Dr.GRPO's constant normalizer L of seq-mean-token-sum-norm (null: the generation budget of a "
        "rollout, rollout.max_new_tokens x rollout.max_turns)",
        gt=0,
    )
    clip_low: float = opt(0.2, "PPO lower clip epsilon", ge=0.0)
    clip_high: float = opt(0.2, "PPO upper clip epsilon", ge=0.0)
    dual_clip: float | None = opt(
        None, "dual-clip constant c (> 1) for negative advantages; null = off", gt=1.0
    )
    turn_level_is: bool = opt(False, "replace token ratios by their turn's geometric mean (ECHO ablation)")
    kl_coef: float = opt(0.0, "KL penalty coefficient toward the frozen initial policy", ge=0.0)
    kl_kind: str = opt("low_var_kl", "KL estimator", choices=("low_var_kl", "k1", "k2"))
    ppo_epochs: int = opt(1, "passes over each batch of rollouts", ge=1, le=1000)
    mini_batches: int = opt(1, "optimizer steps per epoch (rows split evenly)", ge=1, le=10**5)
    micro_batch_tokens: int = opt(8192, "padded tokens per forward/backward micro-batch", ge=64, le=2**26)
    old_logprobs: str = opt(
        "rollout",
        "PPO's pi_old: 'rollout' (the log-probs the rollout engine recorded) or 'recompute' (one no-grad "
        "pass of the training model over the training rows before the update, as verl does; differs "
        "from 'rollout' when rows are not the contexts the turns were sampled under, or with a second "
        "engine)",
        choices=("rollout", "recompute"),
    )
    logprob_clip: float | None = opt(
        None,
        "clamp per-token log-probs (new and old) to [-c, c] before the PPO ratio "
        "(losses.policy_loss); null = off (RTPO paper E.3: 10)",
        gt=0.0,
    )
    tis_cap: float | None = opt(
        None,
        "rollout/train mismatch correction: cap C of the importance weight pi_old/pi_rollout (pi_old "
        "recomputed by the training model, pi_rollout the engine's log-probs); each token's PPO loss is "
        "weighted by min(ratio, C) (TIS) or dropped when the ratio exceeds C (MIS, tis_mode=mask); as "
        "verl's rollout_is_threshold / TRL's vllm_importance_sampling_cap; needs "
        "old_logprobs=recompute; null = off",
        gt=1.0,
    )
    tis_level: str = opt(
        "token",
        "mismatch weight per 'token' or per 'sequence' (the product of a row's token ratios)",
        choices=("token", "sequence"),
    )
    tis_mode: str = opt(
        "truncate",
        "'truncate' (TIS: min(ratio, C)) or 'mask' (MIS: tokens/rows over C leave the loss and its "
        "normaliser)",
        choices=("truncate", "mask"),
    )
    train_context: str = opt(
        "exact",
        "what each turn is trained under: 'exact' (the context it was sampled from, Turn.prompt_ids) or "
        "'flat' (the concatenated full history, as flattened GRPO does under a conditioning map psi; RTPO "
        "paper Eq. 1-2)",
        choices=("exact", "flat"),
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tis_cap is not None and self.old_logprobs != "recompute":
            raise ConfigError(
                f"algo.tis_cap={self.tis_cap!r}: needs algo.old_logprobs=recompute (the weight is "
                "pi_old/pi_rollout with pi_old recomputed by the training model)"
            )


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
    steps: int = opt(20, "training steps (one batch of rollouts each)", ge=0, resume=True)
    seed: int = opt(0, "seed of task sampling, rollouts and shuffling", ge=0, le=MAX_SEED)
    out_dir: str = opt("runs/default", "run directory (created; must not be a file)")
    init: str | None = opt(
        None, "model directory to start from (e.g. an SFT checkpoint); overrides model.path"
    )
    eval_every: int = opt(0, "evaluate every N steps (0 = only before and after training)", ge=0)
    eval_samples: int = opt(
        4, "samples per held-out task (pass@1 averages them; pass@k uses all)", ge=1, le=4096
    )
    eval_temperature: float = opt(1.0, "sampling temperature at evaluation", gt=0.0, le=100.0)
    eval_seed: int | None = opt(
        None,
        "seed of evaluation sampling (null: train.seed + 1000003); fix it to evaluate runs of different "
        "seeds on the same draws",
        ge=0,
        le=MAX_SEED,
    )
    eval_at_start: bool = opt(True, "evaluate before the first step of a fresh run")
    save_every: int = opt(10, "checkpoint every N steps (0 = only at the end)", ge=0, resume=True)
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
    progress: bool = opt(True, "show a progress bar", resume=True)
    max_staleness: int = opt(
        0,
        "asynchronous rollouts (group trainer): the batch of step s is sampled by the weights of step "
        "max(0, s - k) on a separate engine copy while earlier steps train (train/rollout/staleness.py); "
        "0 = synchronous (every batch sampled by the weights it trains)",
        ge=0,
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


@dataclass(frozen=True)
class RTPOConfig(_Section):
    """Reverse-turn training (RTPO, paper Algorithm 1; spec/rtpo.md). Used by train.trainer=rtpo|seeupo."""

    _prefix = "rtpo."
    trunks_per_task: int = opt(
        1, "trunk rollouts per task; every realized turn boundary is a stage", ge=1, le=4096
    )
    siblings: int = opt(
        3,
        "rollouts per boundary group G: G-1 siblings are sampled at each boundary (the trunk is excluded "
        "from baselines); G = 2 is degenerate (A = 0) and refused, the paper uses G = 3",
        ge=2,
        le=4096,
    )
    off_policy: bool = opt(
        False,
        "reuse continuations sampled from the initial policy, weighted by the clamped trajectory IS weight",
    )
    weight_low: float = opt(
        0.0,
        "lower clamp rho_min of the trajectory importance weight of stale continuations (off-policy, "
        "sync_every > 1, SeeUPO's downstream correction)",
        ge=0.0,
    )
    weight_high: float = opt(
        1.0, "upper clamp rho_max of that weight (1.0 = truncated IS, never amplifies a return)", gt=0.0
    )
    sync_every: int = opt(
        1,
        "synchronize engine weights every N stages (1 = fully on-policy, omega = 1; > 1 samples from a "
        "stale engine copy and weights the continuations)",
        ge=1,
    )
    flat: bool = opt(
        False, "train under the concatenated full history instead of the context each turn saw (ablation)"
    )
    max_rollouts: int = opt(
        0,
        "generation budget: end the run before a phase would push the generated rollouts (trunks + "
        "siblings, or SeeUPO chains) past this; 0 = no cap (match a GRPO run: steps x tasks x G)",
        ge=0,
        resume=True,
    )


@dataclass(frozen=True)
class InferenceConfig(_Section):
    """The rollout engine (DESIGN.md "Engines"; :mod:`horizonrl.inference.registry`)."""

    _prefix = "inference."
    engine: str = opt("hf", "rollout engine: 'hf' (embedded, shares the training model) or 'vllm'")
    params: dict = opt({}, "keyword parameters of the engine (e.g. vLLM's gpu_memory_utilization)")


@dataclass(frozen=True)
class DistributedConfig(_Section):
    """Where rollouts and the update run (docs/scale.md; train/update/distributed.py)."""

    _prefix = "distributed."
    backend: str = opt(
        "local",
        "rollout workers: 'local' (the engine and environments in the trainer process) or 'ray' (engine "
        "replicas and environment workers as Ray actors)",
        choices=("local", "ray"),
        resume=True,
    )
    address: str | None = opt(
        None,
        "Ray cluster (backend=ray): null starts a private Ray bound to 127.0.0.1 only; 'auto' joins the "
        "cluster this machine is part of; 'ray://HOST:10001' connects through Ray Client",
        resume=True,
    )
    num_cpus: int | None = opt(
        None,
        "CPUs of the private local Ray (address=null; null: all of this machine's)",
        gt=0,
        resume=True,
    )
    num_engine_replicas: int = opt(
        1,
        "rollout engine replicas (Ray actors, each running inference.engine on its own weights)",
        ge=1,
        resume=True,
    )
    engine_cpus: float = opt(
        1.0, "CPUs reserved for each engine replica (also its torch threads)", ge=0.0, resume=True
    )
    engine_gpus: float = opt(
        0.0,
        "GPUs reserved for each engine replica (> 0 puts its model on cuda)",
        ge=0.0,
        resume=True,
    )
    num_env_workers: int = opt(
        0,
        "environment worker actors (0: every environment in the trainer process)",
        ge=0,
        resume=True,
    )
    env_actors: str = opt(
        "auto",
        "which environments run in the worker actors: 'auto' those with external state (Env.external_state: "
        "the math_python sandbox, the search index), 'all', or 'none'",
        choices=("auto", "all", "none"),
        resume=True,
    )
    env_cpus: float = opt(0.0, "CPUs reserved for each environment worker actor", ge=0.0, resume=True)
    routing: str = opt(
        "prefix",
        "how one generate call is split across replicas: 'prefix' (each prompt to the replica that served "
        "its longest prefix, within the balance bound: a rollout's later turns and RTPO siblings follow "
        "their context) or 'round_robin'",
        choices=("prefix", "round_robin"),
        resume=True,
    )
    prefix_block: int = opt(16, "tokens per hashed block of the prefix router", ge=1, resume=True)
    max_imbalance: float = opt(
        0.25,
        "a replica serves at most ceil(n / replicas * (1 + this)) of the n prompts of one call",
        ge=0.0,
        resume=True,
    )
    seeding: str | None = opt(
        None,
        "sampling randomness: 'batch' (one generator per engine, draws depend on the batch) or 'request' "
        "(one seed per prompt drawn from the engine RNG, so a sample does not depend on which replica, "
        "rank or batch serves it); null: 'batch' for a single local engine, 'request' otherwise",
        choices=(None, "batch", "request"),
    )
    update: str = opt(
        "ddp",
        "sharded update under torchrun (WORLD_SIZE > 1): 'ddp' (replicated weights, all-reduced "
        "gradients) or 'fsdp' (FSDP2 fully_shard: parameters, gradients and optimizer state sharded)",
        choices=("ddp", "fsdp"),
        resume=True,
    )
    process_group: str = opt(
        "auto",
        "torch.distributed backend under torchrun: 'auto' (nccl on cuda, gloo on cpu), 'gloo' or 'nccl'",
        choices=("auto", "gloo", "nccl"),
        resume=True,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.backend == "ray" and self.seeding == "batch":
            raise ConfigError(
                "distributed.seeding='batch': with backend=ray samples must not depend on the replica; "
                "use 'request' (or null)"
            )
        if self.backend != "ray":
            for name, value, default in (
                ("address", self.address, None),
                ("num_engine_replicas", self.num_engine_replicas, 1),
                ("num_env_workers", self.num_env_workers, 0),
            ):
                if value != default:
                    raise ConfigError(f"distributed.{name}={value!r} needs distributed.backend=ray")

    def request_seeding(self, world_size: int = 1) -> bool:
        """Whether engines draw one seed per request (see ``seeding``)."""
        if self.seeding is not None:
            return self.seeding == "request"
        return self.backend == "ray" or world_size > 1


@dataclass(frozen=True)
class SFTConfig(_Section):
    _prefix = "sft."
    data: str | None = opt(
        None, "demonstration JSONL ({messages, tools} per line); null = generate from the env"
    )
    demos: int = opt(400, "demonstrations to generate when data is null", ge=1, le=10**7)
    noise: float = opt(0.3, "expert noise of generated demonstrations", ge=0.0, le=1.0)
    labels: str = opt(
        "executed",
        "targets of a noisy step in agent-program demos: 'executed' = the noise action taken; 'clean' = "
        "the noise-free expert's action at that state (DART, Laskey et al. 2017), while the episode "
        "continues from the action taken",
        choices=("executed", "clean"),
    )
    epochs: int = opt(3, "passes over the demonstrations", ge=1, le=10**5)
    batch_size: int = opt(16, "demonstrations per optimizer step", ge=1, le=2**16)
    lr: float = opt(1e-3, "AdamW learning rate", gt=0.0, le=1.0)
    out_dir: str = opt("runs/sft", "where the fine-tuned model is written")


@dataclass(frozen=True)
class GatewayConfig(_Section):
    """The recording gateway trainer (train.trainer=gateway; docs/gateway.md)."""

    _prefix = "gateway."
    command: str | None = opt(
        None,
        "harness command run once per episode (split like a shell line, run without a shell); "
        "{base_url}, {episode_id}, {reward_url}, {task_file} are filled in and also set as HORIZONRL_* "
        "environment variables (OPENAI_BASE_URL too); a number on its last stdout line is the reward",
    )
    callable: str | None = opt(
        None,
        "'package.module:function' called once per episode in a thread with the keyword arguments it "
        "names among task, base_url, episode_id, reward_url, api_key; a returned number is the reward",
    )
    reward: str | None = opt(
        None,
        "reward of episodes whose harness posts none: a registered reward (exact_match, token_f1, math, "
        "...) or 'package.module:function' (prediction, golds) -> float, applied to the final answer "
        "and the task's answer and aliases; null = only posted rewards count",
    )
    host: str = opt("127.0.0.1", "address the gateway listens on")
    port: int = opt(0, "port of the gateway (0 = a free port)", ge=0, le=65535)
    model_name: str = opt("policy", "model name the gateway serves (what harnesses send as 'model')")
    concurrency: int = opt(0, "harness episodes run at once (0 = all episodes of a step)", ge=0)
    episode_timeout_s: float = opt(300.0, "a harness episode running longer is stopped and dropped", gt=0.0)
    reward_timeout_s: float = opt(
        10.0,
        "after a harness ends, how long to wait for its reward; an episode without one is dropped "
        "(counted in gateway/dropped_episodes), never trained with a made-up reward",
        ge=0.0,
    )
    slice_tokens: int = opt(
        32, "scheduler slice: the longest a call waits behind others, in decode steps", ge=1
    )
    max_request_tokens: int = opt(8192, "cap on n x max_tokens of one call", ge=1)


@dataclass(frozen=True)
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"help": "the policy model"})
    env: EnvConfig = field(default_factory=EnvConfig, metadata={"help": "environment and tasks"})
    rollout: RolloutConfig = field(
        default_factory=RolloutConfig, metadata={"help": "sampling and agent loop"}
    )
    algo: AlgoConfig = field(default_factory=AlgoConfig, metadata={"help": "credit and loss"})
    optim: OptimConfig = field(default_factory=OptimConfig, metadata={"help": "optimizer"})
    train: TrainConfig = field(default_factory=TrainConfig, metadata={"help": "training loop"})
    rtpo: RTPOConfig = field(default_factory=RTPOConfig, metadata={"help": "reverse-turn training"})
    inference: InferenceConfig = field(default_factory=InferenceConfig, metadata={"help": "rollout engine"})
    distributed: DistributedConfig = field(
        default_factory=DistributedConfig, metadata={"help": "rollout workers and sharded update"}
    )
    sft: SFTConfig = field(default_factory=SFTConfig, metadata={"help": "supervised warm start"})
    gateway: GatewayConfig = field(
        default_factory=GatewayConfig, metadata={"help": "recording gateway for external agent harnesses"}
    )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


SECTIONS = {f.name: f.default_factory for f in dataclasses.fields(RunConfig)}


def from_dict(d: dict[str, Any] | None) -> RunConfig:
    """Build a validated :class:`RunConfig`; unknown sections or fields raise ConfigError."""
    d = d or {}
    if not isinstance(d, dict):
        raise ConfigError(f"config must be a mapping of sections, got {type(d).__name__}")
    sections = {}
    for name, value in d.items():
        if name not in SECTIONS:
            raise ConfigError(f"unknown config section {name!r}; known: {sorted(SECTIONS)}")
        cls = SECTIONS[name]
        value = value or {}
        if not isinstance(value, dict):
            raise ConfigError(f"config section {name!r} must be a mapping, got {value!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        for k in value:
            if k not in known:
                raise ConfigError(f"unknown config field {name}.{k}; known: {sorted(known)}")
        sections[name] = cls(**value)
    return RunConfig(**sections)


def apply_overrides(d: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.field=value`` overrides (value parsed as YAML) to a config dict."""
    if not isinstance(d or {}, dict):
        raise ConfigError(f"config must be a mapping of sections, got {type(d).__name__}")
    out: dict[str, Any] = {}
    for k, v in (d or {}).items():
        if v is not None and not isinstance(v, dict):
            raise ConfigError(f"config section {k!r} must be a mapping, got {v!r}")
        out[k] = dict(v or {})
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form section.field=value")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        if len(parts) < 2 or not all(parts):
            raise ConfigError(f"override key {key!r} must be section.field")
        value = load_yaml(raw, source=f"override {item!r}") if raw.strip() else None
        target = out.setdefault(parts[0], {})
        for i, p in enumerate(parts[1:-1], 1):
            target = target.setdefault(p, {})
            if not isinstance(target, dict):
                raise ConfigError(f"override {item!r}: {'.'.join(parts[: i + 1])} is not a mapping")
        target[parts[-1]] = value
    return out


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The mapping in a YAML config file; ConfigError for anything that is not one."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file {path} does not exist")
    if not p.is_file():
        raise ConfigError(f"config file {path} is not a regular file (a directory?)")
    if p.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path} is {p.stat().st_size} bytes; at most {MAX_CONFIG_BYTES}")
    data = p.read_bytes()
    if b"\x00" in data:
        raise ConfigError(f"config file {path} is a binary file, not YAML")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {path} is not UTF-8 text (invalid byte at offset {e.start})"
        ) from None
    raw = load_yaml(text, source=f"config file {path}")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(
            f"config file {path} must be a mapping of sections (model:, env:, ...), got {type(raw).__name__}"
        )
    for name, section in raw.items():
        if section is not None and not isinstance(section, dict):
            raise ConfigError(f"config file {path}: section {name!r} must be a mapping, got {section!r:.80}")
    return raw


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    raw = read_config_file(path) if path is not None else {}
    return from_dict(apply_overrides(raw, overrides or []))


def save_config(cfg: RunConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def describe() -> str:
    """Markdown table of every field with its default and help (the config reference)."""
    lines = ["| field | default | help |", "|---|---|---|"]
    for sec, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            note = " *(may change on `--resume`)*" if f.metadata.get("resume") else ""
            lines.append(f"| `{sec}.{f.name}` | `{default!r}` | {f.metadata.get('help', '')}{note} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- resume


def resumable_fields() -> list[str]:
    """Fields ``--resume`` may change: the run length and output-only settings (``opt(resume=True)``)."""
    return [
        f"{s}.{f.name}"
        for s, cls in SECTIONS.items()
        for f in dataclasses.fields(cls)
        if f.metadata["resume"]
    ]


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


_UNSET = _Unset()


def _leaves(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_leaves(v, f"{prefix}.{k}"))
        return out
    return {prefix: value}


def resume_conflicts(saved: RunConfig, new: RunConfig) -> list[str]:
    """``field: saved -> new`` for every field that differs and may not change on resume.

    Mapping fields (``env.knobs``, ``*_params``) are compared key by key; a key present on
    one side only shows as ``<unset>`` on the other.
    """
    allowed = {*resumable_fields(), "train.out_dir"}  # the run directory resumed is the one named
    lines = []
    a, b = saved.to_dict(), new.to_dict()
    for sec in SECTIONS:
        for name in a[sec]:
            if f"{sec}.{name}" in allowed or a[sec][name] == b[sec][name]:
                continue
            la, lb = _leaves(a[sec][name], f"{sec}.{name}"), _leaves(b[sec][name], f"{sec}.{name}")
            for key in sorted(set(la) | set(lb)):
                va, vb = la.get(key, _UNSET), lb.get(key, _UNSET)
                if va != vb:
                    lines.append(f"{key}: {va!r} -> {vb!r}")
    return lines
