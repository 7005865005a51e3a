"""Closed vocabularies of the data model and of config values as string enums (bottom layer: standard
library only).

A value that several modules spell out (why a rollout ended, a segment's kind, the loss-aggregation
modes, the overflow policies) is written once here as an :class:`enum.StrEnum`, so a typo is a name
error instead of a silent mismatch. Each member *is* its string (``AggMode.TOKEN_MEAN == "token-mean"``,
it formats and serializes to JSON as ``"token-mean"``), so configs, checkpoints, rollout files and
plain-string comparisons keep working unchanged; dataclass defaults and written records hold the plain
``.value``. This module imports nothing else from the package and never torch, so the
bottom layers (``credit``, ``trajectory``, ``agents``) may all use it.

Open sets that users extend through a registry (estimators, KL estimators, environments) are not
enums: their names live in their :class:`~horizonrl.registry.Registry`.
"""

from __future__ import annotations

import enum

__all__ = [
    "AggMode",
    "DriverMode",
    "ObsKey",
    "OldLogprobs",
    "Overflow",
    "PolicyLoss",
    "Precision",
    "SegmentKind",
    "SpanLabel",
    "TISLevel",
    "TISMode",
    "Termination",
    "ThinkingHistory",
]


# --------------------------------------------------------------------------- the data model's vocabularies
# (read by horizonrl.trajectory and horizonrl.credit; config vocabularies follow below)


class Termination(enum.StrEnum):
    """Why a rollout ended (``Rollout.termination``; written by the agents, read by metrics and credit).

    ``done``: the environment ended the episode (or the agent gave its answer); ``max_turns``: the turn
    limit (``rollout.max_turns``) was reached; ``context``: the next generation did not fit the context
    budget (``rollout.overflow=fail``, or no room left); ``truncated``: the episode was cut without
    an end of its own; ``overlong``: a summary or memory agent exceeded its allowed reconstructions
    (SUPO and ECHO treat it as a failure, :mod:`horizonrl.credit.supo`, :mod:`horizonrl.credit.echo`);
    ``error``: the rollout failed (ECHO's default invalid termination). The values are what rollout
    files hold; the field is a plain string there and compares equal to these members.
    """

    DONE = "done"
    MAX_TURNS = "max_turns"
    CONTEXT = "context"
    TRUNCATED = "truncated"
    OVERLONG = "overlong"
    ERROR = "error"


class SegmentKind(enum.StrEnum):
    """What a segment (session) of a rollout is (``Segment.kind``, :mod:`horizonrl.trajectory.types`).

    ``normal``: the agent's main context; ``compaction``: a context rebuilt from a compaction summary;
    ``subagent``: a forked child context; ``selection``: an ECHO memory-selection call; ``summary``: a
    rolling-summary (SUPO) call. ``selection``, ``summary`` and ``compaction`` are generated on top of
    their parent's context (:data:`horizonrl.trajectory.rows.SIDE_SESSIONS`).
    """

    NORMAL = "normal"
    COMPACTION = "compaction"
    SUBAGENT = "subagent"
    SELECTION = "selection"
    SUMMARY = "summary"


class SpanLabel(enum.StrEnum):
    """The label of a :class:`~horizonrl.trajectory.Span` of a turn's generated tokens.

    ``action`` / ``finding`` / ``selection``: ECHO's provenance spans (:mod:`horizonrl.credit.echo`);
    ``summary``: a written summary; ``answer``: the final answer; ``think``: reasoning tokens.
    """

    ACTION = "action"
    FINDING = "finding"
    SELECTION = "selection"
    SUMMARY = "summary"
    ANSWER = "answer"
    THINK = "think"


class ObsKey(enum.StrEnum):
    """What step-level estimators match observations on (``algo.estimator_params.obs_key`` of ``ccpo``,
    ``gigpo``, ``grpo_steps``, ``hgpo``; :func:`horizonrl.credit.ccpo_features.observation_mode`).

    ``text``: the observation text the policy saw (the papers' setting); ``state``: the environment's
    full state key (``StepResult.obs_key``, a "perfect anchor" ablation); ``turn``: each turn's own
    ``Turn.obs_key``.
    """

    TEXT = "text"
    STATE = "state"
    TURN = "turn"


# --------------------------------------------------------------------------- config vocabularies


class PolicyLoss(enum.StrEnum):
    """The policy-gradient loss (``algo.policy_loss``, :mod:`horizonrl.train.update.ppo`): ``ppo``, the
    clipped surrogate, or ``reinforce``, the unclipped ``-A * ratio`` (with ``loss_agg_mode``
    ``seq-mean-token-sum``, RLOO's sequence-level REINFORCE)."""

    PPO = "ppo"
    REINFORCE = "reinforce"


class Precision(enum.StrEnum):
    """Compute precision of the update's forward passes (``train.precision``,
    :mod:`horizonrl.train.update.lean`): ``fp32``, or ``bf16`` under ``torch.autocast`` with parameters,
    gradients and optimizer state kept in ``model.dtype``."""

    FP32 = "fp32"
    BF16 = "bf16"


class AggMode(enum.StrEnum):
    """How per-token losses reduce to one number (``algo.loss_agg_mode``, :mod:`horizonrl.losses.aggregate`).

    ``token-mean`` averages over every token of the batch; ``seq-mean-token-mean`` averages each
    row's token mean over rows; ``seq-mean-token-sum`` averages row sums; ``seq-mean-token-sum-norm``
    divides the sum by rows times a constant length (Dr.GRPO); ``rollout-mean-token-mean`` averages
    each rollout's token mean (all its rows together) over rollouts. Estimators declare the mode
    their method is defined with (``register_estimator(..., loss_agg_mode=...)``).
    """

    TOKEN_MEAN = "token-mean"
    SEQ_MEAN_TOKEN_MEAN = "seq-mean-token-mean"
    SEQ_MEAN_TOKEN_SUM = "seq-mean-token-sum"
    SEQ_MEAN_TOKEN_SUM_NORM = "seq-mean-token-sum-norm"
    ROLLOUT_MEAN_TOKEN_MEAN = "rollout-mean-token-mean"


class Overflow(enum.StrEnum):
    """What a rollout does when its next generation would overrun the context budget (``rollout.overflow``).

    ``truncate`` shortens the generation to the room left (and ends the rollout when no room is
    left); ``fail`` ends the rollout with termination ``context``. Read by the context managers
    (:mod:`horizonrl.agents.context`) and the step-wise agent (:mod:`horizonrl.agents.stepwise`).
    """

    TRUNCATE = "truncate"
    FAIL = "fail"


class OldLogprobs(enum.StrEnum):
    """Where PPO's ``pi_old`` comes from (``algo.old_logprobs``, :mod:`horizonrl.train.update.ppo`).

    ``rollout``: the log-probs the rollout engine recorded; ``recompute``: one no-grad pass of the
    training model over the training rows before the update (verl's choice; stale batches use it).
    """

    ROLLOUT = "rollout"
    RECOMPUTE = "recompute"


class TISLevel(enum.StrEnum):
    """Granularity of the rollout correction ``pi_old / pi_rollout`` (``algo.tis_level``,
    :mod:`horizonrl.losses.mismatch`): one ratio per ``token``, or the row's product (``sequence``)."""

    TOKEN = "token"
    SEQUENCE = "sequence"


class TISMode(enum.StrEnum):
    """What the rollout correction does with a ratio above the cap (``algo.tis_mode``): ``truncate``
    it to the cap (TIS) or ``mask`` the token out (MIS)."""

    TRUNCATE = "truncate"
    MASK = "mask"


# --- rollout options (issue 43 item 3) ---------------------------------------------------------------


class DriverMode(enum.StrEnum):
    """How agent programs run against the engine (``rollout.driver``, :func:`horizonrl.agents.driver.drive`).

    ``sync``: round by round, every pending request of every program in one batched engine call per
    round (the default: it reproduces the recorded results); ``async``: episode by episode, each
    request goes to the engine as soon as it is made (:mod:`horizonrl.agents.scheduler`; needs an
    engine with ``supports_seeds``).
    """

    SYNC = "sync"
    ASYNC = "async"


class ThinkingHistory(enum.StrEnum):
    """What later prompts keep of earlier sampled thinking (``rollout.thinking_history``,
    :class:`horizonrl.models.chat.ChatRenderer`), for families whose template drops it (Qwen3).

    ``keep``: the sampled thinking stays in later prompts (one merged row per episode); ``drop``: it
    is removed as the template does (append context only; each turn trains on its own context).
    """

    KEEP = "keep"
    DROP = "drop"
