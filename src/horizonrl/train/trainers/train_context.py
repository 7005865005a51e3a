"""What each turn is trained under (``algo.train_context``): the trainer-to-method seam for views.

A *training-context view* maps a sampled rollout to the rollout its rows are
built from. ``exact`` (registered here) is the identity: every turn is trained
under the context it was sampled from (``Turn.prompt_ids``), so the update's
``pi_old`` and the rollout's log-probs condition on the same tokens. A method
that trains under another context registers a view from the plug-in list
:mod:`horizonrl.train.methods`::

    @register_train_context("flat")
    def flat(rollout: Rollout, renderer) -> Rollout: ...

e.g. the RTPO paper's flattened-GRPO baseline, which trains each agent turn
under its concatenated history ``S_k`` (Eq. 1-2; :mod:`horizonrl.train.methods.rtpo`).
The group trainer looks the configured name up and applies the view to every
rollout before :func:`~horizonrl.trajectory.build_rows`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from horizonrl.registry import Registry
from horizonrl.trajectory import Rollout

#: ``view(rollout, renderer) -> rollout`` (the renderer re-renders histories where a view needs it).
ViewFn = Callable[[Rollout, Any], Rollout]

TRAIN_CONTEXTS: Registry[ViewFn] = Registry(
    "training context (algo.train_context)",
    register_with="@register_train_context(NAME) (horizonrl.train.trainers.train_context)",
    plugins=("horizonrl.train.methods",),
)


def register_train_context(name: str) -> Callable[[ViewFn], ViewFn]:
    """Register ``view(rollout, renderer) -> rollout`` as ``algo.train_context=name``."""
    return TRAIN_CONTEXTS.register(name)


@register_train_context("exact")
def exact(rollout: Rollout, renderer: Any) -> Rollout:
    """The rollout as sampled: each turn under its own ``prompt_ids``."""
    return rollout


def train_context_view(name: str) -> ViewFn:
    """The view registered as ``name`` (``algo.train_context``)."""
    return TRAIN_CONTEXTS.get(name, field="algo.train_context")
