"""Advantage estimators (pure NumPy; never imports torch, models or environments).

Per-rollout formulas live in small modules (:mod:`.group`), the token layout in
:mod:`.broadcast`, and named estimators for configs in the registry
(:mod:`.registry`). Importing this package registers the baselines
(``grpo``, ``drgrpo``, ``rloo``, ``broadcast``); other methods register in their
own modules, imported here.
"""

from horizonrl.credit.baselines import per_group  # importing registers the baselines
from horizonrl.credit.broadcast import broadcast_to_tokens, check_token_advantages, flatten_rollouts
from horizonrl.credit.group import group_advantage, rloo_advantage
from horizonrl.credit.registry import (
    LOSS_AGG_MODES,
    EstimatorSpec,
    UnknownEstimatorError,
    get_estimator,
    list_estimators,
    register_estimator,
)

__all__ = [
    "LOSS_AGG_MODES",
    "EstimatorSpec",
    "UnknownEstimatorError",
    "broadcast_to_tokens",
    "check_token_advantages",
    "flatten_rollouts",
    "get_estimator",
    "group_advantage",
    "list_estimators",
    "per_group",
    "register_estimator",
    "rloo_advantage",
]
