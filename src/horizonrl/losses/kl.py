"""KL penalty estimators toward a frozen reference policy (docs/spec/baselines.md, "KL penalty").

Per-token values; weight and aggregate them like any other loss. Schulman's
estimators ("Approximating KL Divergence", 2020): k1, k2, k3 (``low_var_kl``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from horizonrl.registry import Registry

KLFn = Callable[[Tensor, Tensor], Tensor]

KL_KINDS: Registry[KLFn] = Registry("KL kind", register_with="@register_kl(NAME) (horizonrl.losses)")


def register_kl(name: str) -> Callable[[KLFn], KLFn]:
    """Decorator registering a per-token KL estimator ``fn(logp, ref_logp) -> Tensor``."""
    return KL_KINDS.register(name)


#: Names of the registered KL estimators, sorted.
list_kl_kinds = KL_KINDS.names


@register_kl("low_var_kl")
def _low_var_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3: ``k = clamp(ref - logp, -20, 20)``; ``clamp(exp(k) - k - 1, -10, 10)``."""
    k = (ref_logp - logp).clamp(-20.0, 20.0)
    return (torch.exp(k) - k - 1.0).clamp(-10.0, 10.0)


@register_kl("k1")
def _k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1: ``logp - ref``."""
    return logp - ref_logp


@register_kl("k2")
def _k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k2: ``0.5 (logp - ref)^2``."""
    return 0.5 * (logp - ref_logp).square()


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str = "low_var_kl") -> Tensor:
    """Per-token KL estimate of kind ``low_var_kl`` (k3), ``k1`` or ``k2``.

    ``ref_logp`` is detached (the reference policy is frozen). Unknown kinds raise
    :class:`~horizonrl.registry.UnknownNameError` (a ``ValueError``) listing the known ones.
    """
    fn = KL_KINDS.get(kind)
    if ref_logp.shape != logp.shape:
        raise ValueError(f"ref_logp has shape {tuple(ref_logp.shape)}, expected {tuple(logp.shape)}")
    return fn(logp, ref_logp.detach())
