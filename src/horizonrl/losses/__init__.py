"""Policy losses, KL penalties and the one loss aggregation function (torch).

Knows nothing of rollouts: inputs are per-token tensors (``[rows, T]``) and
per-token weights.
"""

from horizonrl.losses.aggregate import AGG_MODES, aggregate, token_coefficients
from horizonrl.losses.kl import kl_penalty, list_kl_kinds, register_kl
from horizonrl.losses.mismatch import rollout_correction
from horizonrl.losses.policy import policy_loss, turn_mean_log_ratio

__all__ = [
    "AGG_MODES",
    "aggregate",
    "kl_penalty",
    "list_kl_kinds",
    "policy_loss",
    "register_kl",
    "rollout_correction",
    "token_coefficients",
    "turn_mean_log_ratio",
]
