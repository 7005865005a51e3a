"""Clipped policy-gradient loss (docs/spec/baselines.md, "Policy loss").

Works on tensors of any shape (typically ``[rows, T]``) and returns the loss per
token; masking and normalization happen in :func:`horizonrl.losses.aggregate`.
"""

from __future__ import annotations

import torch
from torch import Tensor

LOG_RATIO_CLAMP = 20.0


def turn_mean_log_ratio(log_ratio: Tensor, turn_ids: Tensor) -> Tensor:
    """Replace each token's log-ratio by the mean log-ratio of its turn.

    ``exp`` of the result is the geometric mean of the token ratios of the turn
    (ECHO's turn-level importance sampling). A turn is the set of positions of one
    row (last dimension) sharing a turn id >= 0 — a turn never spans rows, so ids
    may repeat across rows (``Row.turn_ids`` restarts for every rollout). Positions
    with id < 0 are masked and keep their own token log-ratio. Vectorized with
    ``index_add``; differentiable.
    """
    if turn_ids.shape != log_ratio.shape:
        raise ValueError(f"turn_ids has shape {tuple(turn_ids.shape)}, expected {tuple(log_ratio.shape)}")
    if log_ratio.numel() == 0:
        return log_ratio
    flat = log_ratio.reshape(-1, log_ratio.shape[-1]) if log_ratio.dim() > 0 else log_ratio.reshape(1, 1)
    ids = turn_ids.reshape(flat.shape).long()
    valid = ids >= 0
    if not bool(valid.any()):
        return log_ratio
    row = torch.arange(flat.shape[0], device=flat.device).unsqueeze(1).expand_as(ids)
    key = row * (ids.max() + 1) + ids  # unique per (row, turn id)
    _, group = torch.unique(key[valid], return_inverse=True)
    n = int(group.max()) + 1
    src = flat[valid]
    sums = torch.zeros(n, dtype=flat.dtype, device=flat.device).index_add(0, group, src)
    counts = torch.zeros(n, dtype=flat.dtype, device=flat.device).index_add(0, group, torch.ones_like(src))
    out = flat.masked_scatter(valid, (sums / counts)[group])
    return out.reshape(log_ratio.shape)


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    turn_ids: Tensor | None = None,
    logprob_clip: float | None = None,
    clip: bool = True,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO-clip loss per token (``clip=False``: the unclipped REINFORCE loss ``-A r``).

    ``logprob_clip=c`` first clamps both log-probs to ``[-c, c]`` (RTPO uses 10).
    Then::

        r = exp(clamp(logp - old_logp, -20, 20))
        l = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))          (PPO; ECHO: clip_high=0.28)
        l = min(l, -c A)   where A < 0, if dual_clip=c (c > 1)           (dual clip; CCPO/ECHO c=3)

    With ``turn_ids`` (same shape as ``logp``; ids < 0 are masked positions) each
    token's ratio is the geometric mean of the ratios of its turn's tokens
    (turn-level IS, :func:`turn_mean_log_ratio`).

    Returns ``(loss, stats)``; ``loss`` has ``logp``'s shape. ``stats`` holds
    detached per-token tensors of the same shape:

    - ``ratio``: the ratio used (after turn-level averaging),
    - ``clipped``: bool, the clipped term was selected (no gradient from the ratio),
    - ``dual_clipped``: bool, the dual-clip bound ``-c A`` was selected.

    Reduce them with the same weights as the loss (e.g. ``aggregate``) for metrics.
    """
    if not 0.0 <= clip_low < 1.0 or clip_high < 0.0:
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {clip_low}, {clip_high}")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    if logprob_clip is not None and not logprob_clip > 0.0:
        raise ValueError(f"logprob_clip must be > 0, got {logprob_clip}")
    if old_logp.shape != logp.shape:
        raise ValueError(f"old_logp has shape {tuple(old_logp.shape)}, expected {tuple(logp.shape)}")
    advantages = torch.as_tensor(advantages, dtype=logp.dtype, device=logp.device)
    old_logp = old_logp.detach()
    if logprob_clip is not None:
        logp = logp.clamp(-logprob_clip, logprob_clip)
        old_logp = old_logp.clamp(-logprob_clip, logprob_clip)
    log_ratio = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if turn_ids is not None:
        log_ratio = turn_mean_log_ratio(log_ratio, turn_ids)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    if not clip:  # REINFORCE with an importance ratio (1 on-policy): grad = -A grad log pi
        none = torch.zeros_like(unclipped, dtype=torch.bool)
        return unclipped, {"ratio": ratio.detach(), "clipped": none, "dual_clipped": none}
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    clip_mask = clipped > unclipped
    dual_mask = torch.zeros_like(clip_mask)
    if dual_clip is not None:
        bound = -dual_clip * advantages
        dual_mask = (advantages < 0) & (loss > bound)
        loss = torch.where(dual_mask, bound, loss)
    stats = {"ratio": ratio.detach(), "clipped": clip_mask.detach(), "dual_clipped": dual_mask.detach()}
    return loss, stats
