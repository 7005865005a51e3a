"""Training: the glue that turns rollouts into updates (docs/design.md ``train/``).

Subpackages, in the order imports may point (each imports only those after it)::

    recipes      sft / eval / quickstart recipes behind the CLI (top floor)
    methods/     one module per method for all it needs beyond its NumPy math, and the plug-in list
    trainers/    the one fit loop, the run's workspace, the trainer registry, start-of-run checks,
                 the feature and training-context seams, the generic trainers (group, gateway)
    rollout/     collection, token budget, bounded staleness, workers, environment setup
    warmstart/   tiny-model bootstrap, copy pretraining, SFT on demonstrations
    update/      rows to tensors and log-probs, PPO epochs, torchrun (DDP / FSDP2)
    records/     checkpoints, metrics and experiment loggers, rollout files

The names most users need are importable from here (``from horizonrl.train import
GroupTrainer``); they load lazily, so ``import horizonrl.train`` pulls in no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Public name -> module that defines it.
_EXPORTS = {
    "Trainer": "horizonrl.train.trainers.loop",
    "GroupTrainer": "horizonrl.train.trainers.group",
    "ReverseTurnTrainer": "horizonrl.train.methods.reverse_turn",
    "GatewayTrainer": "horizonrl.train.trainers.gateway",
    "RTPOTrainer": "horizonrl.train.methods.rtpo",
    "SeeUPOTrainer": "horizonrl.train.methods.seeupo",
    "make_trainer": "horizonrl.train.trainers.registry",
    "register_trainer": "horizonrl.train.trainers.registry",
    "list_trainers": "horizonrl.train.trainers.registry",
    "register_feature": "horizonrl.train.trainers.features",
    "FeatureContext": "horizonrl.train.trainers.features",
    "Feature": "horizonrl.train.trainers.features",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'horizonrl.train' has no attribute {name!r}")
