"""Rollout/train mismatch correction: truncated (TIS) and masked (MIS) importance sampling.

With a rollout engine other than the training model (vLLM, another precision,
stale weights) the tokens were drawn from ``pi_rollout`` (the engine's
log-probs), not from PPO's ``pi_old`` (recomputed by the training model,
``algo.old_logprobs: recompute``). Decoupled PPO weights each token's PPO loss
by a detached importance weight from ``pi_rollout`` to ``pi_old``::

    token level      rho_t = pi_old(y_t) / pi_rollout(y_t)
    sequence level   rho   = prod_t rho_t over the row's trainable tokens (the same for all of them)
    truncate (TIS)   w = min(rho, C)
    mask (MIS)       w = rho if rho <= C; a token (token level) or a whole row (sequence level)
                     with rho > C is dropped: weight 0 and out of the loss normaliser

Log-ratios are clamped to ``[-20, 20]`` before ``exp`` (verl's safety bound).
A row is horizonrl's sequence: the turns trained under one context.

References (semantics, not code):

- verl, ``docs/algo/rollout_corr.md`` ("Rollout Correction", decoupled mode):
  ``rollout_is: token | sequence`` with ``rollout_is_threshold`` (upper clamp of
  ``pi_old / pi_rollout``), and rejection sampling ``rollout_rs`` whose rejected
  tokens/sequences are excluded from the loss denominator (as here).
- TRL, ``GRPOConfig.vllm_importance_sampling_mode``: ``token_truncate``,
  ``token_mask``, ``sequence_truncate``, ``sequence_mask`` with
  ``vllm_importance_sampling_cap`` (mask: ratios above the cap get weight 0).
- J. Liu, Y. Li et al., "When Speed Kills Stability: Demystifying RL Collapse from
  the Training-Inference Mismatch" (2025): TIS and MIS.
"""

from __future__ import annotations

import torch
from torch import Tensor

from horizonrl.vocab import TISLevel, TISMode

__all__ = ["CORRECTION_LEVELS", "CORRECTION_MODES", "rollout_correction"]

CORRECTION_LEVELS = tuple(m.value for m in TISLevel)
CORRECTION_MODES = tuple(m.value for m in TISMode)
LOG_RATIO_BOUND = 20.0


def rollout_correction(
    old_logp: Tensor,
    rollout_logp: Tensor,
    mask: Tensor,
    *,
    cap: float,
    level: str = TISLevel.TOKEN.value,
    mode: str = TISMode.TRUNCATE.value,
) -> tuple[Tensor, Tensor, Tensor]:
    """Importance weights ``w`` and the kept-token mask (formulas in the module docstring).

    All inputs are ``[B, T]`` (``mask``: 1 on trainable tokens). Returns ``(w, keep, rho)``:
    ``w`` (detached, 0 off ``keep``), ``keep`` (``mask`` without the tokens MIS dropped;
    equal to ``mask`` for truncation) and the raw ratio ``rho`` (per token, or the row's
    product broadcast to its tokens; 0 off ``mask``).
    """
    if level not in CORRECTION_LEVELS:
        raise ValueError(f"tis_level={level!r}: must be one of {list(CORRECTION_LEVELS)}")
    if mode not in CORRECTION_MODES:
        raise ValueError(f"tis_mode={mode!r}: must be one of {list(CORRECTION_MODES)}")
    if not cap > 1.0:
        raise ValueError(f"tis_cap={cap!r}: must be > 1")
    mask = mask.to(torch.float32)
    log_ratio = (old_logp.detach().double() - rollout_logp.detach().double()) * mask
    if level == TISLevel.SEQUENCE:
        log_ratio = log_ratio.sum(-1, keepdim=True).expand_as(log_ratio)
    rho = torch.exp(log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)) * mask
    if mode == TISMode.TRUNCATE:
        keep = mask
        w = rho.clamp(max=cap)
    else:
        keep = mask * (rho <= cap)
        w = rho * keep
    return w.to(torch.float32), keep, rho.to(torch.float32)
