"""Closed vocabularies of config values as string enums (bottom layer: standard library only).

A value that several modules spell out (the loss-aggregation modes, the overflow policies) is
written once here as an :class:`enum.StrEnum`, so a typo is a name error instead of a silent
mismatch. Each member *is* its string (``AggMode.TOKEN_MEAN == "token-mean"``, it formats and
serializes to JSON as ``"token-mean"``), so configs, checkpoints and plain-string comparisons keep
working unchanged. This module imports nothing else from the package and never torch, so the
bottom layers (``credit``, ``trajectory``, ``agents``) may all use it.

Open sets that users extend through a registry (estimators, KL estimators, environments) are not
enums: their names live in their :class:`~horizonrl.registry.Registry`.
"""

from __future__ import annotations

import enum

__all__ = ["AggMode", "DriverMode", "OldLogprobs", "Overflow", "TISLevel", "TISMode", "ThinkingHistory"]


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
