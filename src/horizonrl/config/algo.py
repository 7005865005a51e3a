"""The ``algo`` section: the credit estimator and the policy loss (clipping, KL, mismatch correction)."""

from __future__ import annotations

from dataclasses import dataclass

from horizonrl.config.fields import _Section, opt
from horizonrl.errors import ConfigError
from horizonrl.vocab import AggMode, OldLogprobs, PolicyLoss, TISLevel, TISMode


@dataclass(frozen=True)
class AlgoConfig(_Section):
    _prefix = "algo."
    estimator: str = opt("grpo", "registered credit estimator (see `horizonrl estimators`)")
    estimator_params: dict = opt({}, "keyword parameters of the estimator")
    loss_agg_mode: str | None = opt(
        None,
        "loss aggregation mode; default: the estimator's own",
        choices=(None, *(m.value for m in AggMode)),
    )
    policy_loss: str = opt(
        "ppo",
        "'ppo' (clipped surrogate) or 'reinforce' (unclipped -A * ratio; RLOO's sequence-level REINFORCE "
        "with loss_agg_mode seq-mean-token-sum)",
        choices=tuple(m.value for m in PolicyLoss),
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
    micro_batch_tokens: int = opt(
        8192,
        "padded tokens per forward/backward micro-batch (real tokens with algo.pack_rows), >= 64; 0 = "
        "sized from train.memory_gb by the update's memory estimate (docs/scale.md)",
        ge=0,
        le=2**26,
    )
    pack_rows: bool = opt(
        False,
        "padding-free micro-batches: the rows of a micro-batch are concatenated into one sequence with "
        "position ids restarting at 0 per row (a block-diagonal causal mask); the loss equals the padded "
        "one to float rounding. With sdpa/eager attention (CPU) the masked attention spans the whole packed "
        "sequence (quadratic in algo.micro_batch_tokens); flash-attention's varlen kernels skip it",
    )
    tree_training: str | bool = opt(
        "auto",
        "shared-prefix training: 'auto' forwards a token prefix that rows share (the few-shot/system "
        "prefix, a group's prompt, RTPO's trunk and siblings; the SFT warm start's system and tool prompt) "
        "once and runs each row's own tokens against "
        "its keys and values, so each shared token is forwarded and back-propagated once (exact to float "
        "rounding; a prefix is shared where a FLOP model of the model's shape says it pays; one process, "
        "sdpa/eager full attention, no gradient checkpointing, else every row on its own with a warning); "
        "'off' (YAML's bare off / false read as 'off', true as 'auto'): every row on its own",
        choices=("auto", "off", True, False),
    )
    old_logprobs: str = opt(
        "rollout",
        "PPO's pi_old: 'rollout' (the log-probs the rollout engine recorded) or 'recompute' (one no-grad "
        "pass of the training model over the training rows before the update, as verl does; differs "
        "from 'rollout' when rows are not the contexts the turns were sampled under, or with a second "
        "engine)",
        choices=tuple(m.value for m in OldLogprobs),
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
        choices=tuple(m.value for m in TISLevel),
    )
    tis_mode: str = opt(
        "truncate",
        "'truncate' (TIS: min(ratio, C)) or 'mask' (MIS: tokens/rows over C leave the loss and its "
        "normaliser)",
        choices=tuple(m.value for m in TISMode),
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
        if isinstance(self.tree_training, bool):  # YAML 1.1 reads a bare `off` as false
            object.__setattr__(self, "tree_training", "auto" if self.tree_training else "off")
        if 0 < self.micro_batch_tokens < 64:
            raise ConfigError(
                f"algo.micro_batch_tokens={self.micro_batch_tokens!r}: must be >= 64, or 0 (sized from "
                "train.memory_gb)"
            )
        if self.tis_cap is not None and self.old_logprobs != "recompute":
            raise ConfigError(
                f"algo.tis_cap={self.tis_cap!r}: needs algo.old_logprobs=recompute (the weight is "
                "pi_old/pi_rollout with pi_old recomputed by the training model)"
            )
