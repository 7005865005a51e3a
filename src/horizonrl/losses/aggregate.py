"""The one loss aggregation point (docs/spec/baselines.md, "Loss aggregation").

``loss`` and ``weights`` are ``[rows, T]`` (a 1-D tensor is one row). Weights are
non-negative reals, 0 on masked and padded tokens; any real-valued per-token
credit (ECHO's mask, soft weights) enters here.

The modes are the members of :class:`horizonrl.vocab.AggMode` (each equal to its string):

=========================== ==================================================================
mode                        value
=========================== ==================================================================
``token-mean``              ``sum(w l) / sum(w)`` over the whole batch
``seq-mean-token-mean``     mean over rows of ``sum_row(w l) / sum_row(w)``
``seq-mean-token-sum``      mean over rows of ``sum_row(w l)``
``seq-mean-token-sum-norm`` ``sum(w l) / (num_rows * L)``, ``L`` = a constant, the generation
                            budget (``norm_tokens``; Dr.GRPO); without one, the padded width
``rollout-mean-token-mean`` mean over rollouts of ``sum_rollout(w l) / sum_rollout(w)``,
                            summing over every row of the rollout (``rollout_ids``)
=========================== ==================================================================

Empty rows and rollouts: a row (rollout) whose total weight is 0 contributes 0
and is *not counted* in ``num_rows`` (the number of rollouts); a batch with no
weight at all gives 0, never NaN. So padding rows added for batching change
nothing.

Micro-batch invariance: every mode is linear in ``l`` — ``aggregate == sum(c * l)``
for the coefficients of :func:`token_coefficients`. Compute them once on the
whole mini-batch, slice their rows together with the loss, and pass each slice as
``coefficients=``; the micro-batch results then sum to the mini-batch value::

    coef = token_coefficients(weights, mode, rollout_ids=rollout_ids)
    for rows in micro_batches:
        aggregate(loss_fn(rows), weights[rows], mode, coefficients=coef[rows]).backward()
"""

from __future__ import annotations

import torch
from torch import Tensor

from horizonrl.vocab import AggMode

#: The modes :func:`aggregate` accepts: every :class:`~horizonrl.vocab.AggMode` (plain strings compare equal).
AGG_MODES: tuple[AggMode, ...] = tuple(AggMode)


def _check_mode(mode: str) -> None:
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; known modes: {[m.value for m in AggMode]}")


def _as_2d(x: Tensor) -> Tensor:
    if x.dim() == 1:
        return x.unsqueeze(0)
    if x.dim() != 2:
        raise ValueError(f"expected a [rows, T] tensor, got shape {tuple(x.shape)}")
    return x


def _safe_inverse(x: Tensor) -> Tensor:
    """``1 / x`` where ``x > 0``, else 0."""
    return torch.where(x > 0, 1.0 / torch.where(x > 0, x, torch.ones_like(x)), torch.zeros_like(x))


def token_coefficients(
    weights: Tensor, mode: str, *, rollout_ids: Tensor | None = None, norm_tokens: int | None = None
) -> Tensor:
    """Per-token coefficients ``c`` with ``aggregate(l, weights, mode) == (c * l).sum()``.

    Same shape as ``weights``, detached, floating point (float32 for integer/bool
    weights). ``rollout_ids`` (``[rows]``, any integers) is required for
    ``rollout-mean-token-mean``. ``norm_tokens`` is Dr.GRPO's constant ``L`` for
    ``seq-mean-token-sum-norm`` (the generation budget: a constant, so the scale of
    a token's gradient does not depend on what else is in the batch); without it
    the padded width of ``weights`` is used.
    """
    _check_mode(mode)
    shape = weights.shape
    w = _as_2d(weights.detach())
    dtype = w.dtype if w.is_floating_point() else torch.float32
    w = w.to(torch.float64)
    if bool((w < 0).any()):
        raise ValueError("weights must be non-negative (put signed credit in the advantages)")
    row_w = w.sum(dim=1)  # [rows]
    n_rows = (row_w > 0).sum().to(torch.float64)
    if mode == AggMode.TOKEN_MEAN:
        coef = w * _safe_inverse(w.sum())
    elif mode == AggMode.SEQ_MEAN_TOKEN_MEAN:
        coef = w * (_safe_inverse(row_w) * _safe_inverse(n_rows)).unsqueeze(1)
    elif mode == AggMode.SEQ_MEAN_TOKEN_SUM:
        coef = w * _safe_inverse(n_rows)
    elif mode == AggMode.SEQ_MEAN_TOKEN_SUM_NORM:
        if norm_tokens is not None and not norm_tokens > 0:
            raise ValueError(f"norm_tokens must be > 0, got {norm_tokens}")
        coef = w * _safe_inverse(n_rows * (norm_tokens if norm_tokens is not None else w.shape[1]))
    else:  # AggMode.ROLLOUT_MEAN_TOKEN_MEAN
        if rollout_ids is None:
            raise ValueError("mode 'rollout-mean-token-mean' needs rollout_ids ([rows] tensor)")
        ids = torch.as_tensor(rollout_ids, device=w.device).reshape(-1)
        if ids.shape[0] != w.shape[0]:
            raise ValueError(f"rollout_ids has {ids.shape[0]} entries for {w.shape[0]} rows")
        _, inv = torch.unique(ids, return_inverse=True)
        roll_w = torch.zeros(int(inv.max()) + 1 if inv.numel() else 0, dtype=w.dtype, device=w.device)
        roll_w = roll_w.index_add(0, inv, row_w)
        n_roll = (roll_w > 0).sum().to(torch.float64)
        coef = w * (_safe_inverse(roll_w)[inv] * _safe_inverse(n_roll)).unsqueeze(1)
    return coef.to(dtype).reshape(shape)


def aggregate(
    loss: Tensor,
    weights: Tensor,
    mode: str,
    *,
    rollout_ids: Tensor | None = None,
    coefficients: Tensor | None = None,
    norm_tokens: int | None = None,
) -> Tensor:
    """Reduce a per-token ``loss`` ``[rows, T]`` to a scalar according to ``mode``.

    See the module docstring for the modes and how empty rows count. With
    ``coefficients`` (a row slice of :func:`token_coefficients` computed on the whole
    mini-batch) the result is ``sum(coefficients * loss)`` and ``weights`` /
    ``rollout_ids`` are not used — this is the micro-batch path. Positions with a
    zero coefficient contribute exactly 0 even if the loss there is inf/NaN.
    Unknown modes raise ``ValueError`` listing the modes.
    """
    _check_mode(mode)
    if coefficients is None:
        if weights.shape != loss.shape:
            raise ValueError(f"weights have shape {tuple(weights.shape)}, loss {tuple(loss.shape)}")
        coefficients = token_coefficients(weights, mode, rollout_ids=rollout_ids, norm_tokens=norm_tokens)
    elif coefficients.shape != loss.shape:
        raise ValueError(f"coefficients have shape {tuple(coefficients.shape)}, loss {tuple(loss.shape)}")
    coefficients = coefficients.to(device=loss.device, dtype=loss.dtype)
    terms = torch.where(coefficients != 0, coefficients * loss, torch.zeros_like(loss))
    return terms.sum()
