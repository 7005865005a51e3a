"""Advantage estimators (pure NumPy; never imports torch, models or environments).

Per-rollout formulas live in small modules (:mod:`.group`), the token layout in
:mod:`.broadcast`, and named estimators for configs in the registry
(:mod:`.registry`). Importing this package registers the baselines
(``grpo``, ``drgrpo``, ``rloo``, ``broadcast``) and the method estimators, each in
its own module: ``mosaic`` and ``igpo`` (Mosaic paper), ``ccpo``, ``gigpo`` and
``hgpo`` (CCPO paper), ``echo`` and ``supo`` (ECHO paper); RTPO's
``sibling_advantage`` is called by its reverse-turn trainer directly. Each estimator that takes
``algo.estimator_params`` declares them as a frozen dataclass (``GRPOParams``, ``CCPOParams``, ...;
``EstimatorSpec.params_cls``), one documented field per key.
"""

from horizonrl.credit import ccpo, echo, gigpo, igpo, mosaic, supo  # noqa: F401  (registration)
from horizonrl.credit.baselines import GRPOParams, per_group  # importing registers the baselines
from horizonrl.credit.broadcast import (
    broadcast_to_tokens,
    broadcast_turn_values,
    check_token_advantages,
    flatten_rollouts,
)
from horizonrl.credit.ccpo import CCPOParams, ContextualCredit, contextual_credit
from horizonrl.credit.ccpo_features import StepBatch, step_batch_from_groups
from horizonrl.credit.echo import ECHOParams, provenance_mask
from horizonrl.credit.gigpo import GiGPOParams, GRPOStepsParams, HGPOParams
from horizonrl.credit.group import group_advantage, rloo_advantage
from horizonrl.credit.igpo import IGPOParams
from horizonrl.credit.mosaic import MosaicParams, session_aware_advantage, shape_session_advantages
from horizonrl.credit.registry import (
    LOSS_AGG_MODES,
    EstimatorSpec,
    UnknownEstimatorError,
    get_estimator,
    list_estimators,
    register_estimator,
)
from horizonrl.credit.rtpo import sibling_advantage
from horizonrl.credit.side_info import (
    SideInfo,
    collect_side_info,
    record_side_info,
    record_turn_columns,
)
from horizonrl.credit.supo import SUPOParams

__all__ = [
    "LOSS_AGG_MODES",
    "CCPOParams",
    "ContextualCredit",
    "ECHOParams",
    "EstimatorSpec",
    "GRPOParams",
    "GRPOStepsParams",
    "GiGPOParams",
    "HGPOParams",
    "IGPOParams",
    "MosaicParams",
    "SUPOParams",
    "SideInfo",
    "StepBatch",
    "UnknownEstimatorError",
    "broadcast_to_tokens",
    "broadcast_turn_values",
    "check_token_advantages",
    "collect_side_info",
    "contextual_credit",
    "flatten_rollouts",
    "get_estimator",
    "group_advantage",
    "list_estimators",
    "per_group",
    "provenance_mask",
    "record_side_info",
    "record_turn_columns",
    "register_estimator",
    "rloo_advantage",
    "session_aware_advantage",
    "shape_session_advantages",
    "sibling_advantage",
    "step_batch_from_groups",
]
