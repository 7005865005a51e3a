"""Registry of trainers (``train.trainer`` in configs).

``group`` (:class:`~horizonrl.train.trainers.group.GroupTrainer`: GRPO, Mosaic,
CCPO, ECHO and every estimator over groups of rollouts) is built in; the
reverse-turn trainers register themselves in their modules (``rtpo``, ``seeupo``),
and so does the recording-gateway trainer (``gateway``, needs the serve extra).
A trainer is constructed as ``cls(cfg, resume=bool)`` and trained with ``fit()``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from horizonrl.errors import ConfigError

_REGISTRY: dict[str, Callable[..., Any]] = {}
# Modules that register trainers; imported on first use (they pull in torch and models).
_MODULES = (
    "horizonrl.train.trainers.group",
    "horizonrl.train.methods.rtpo",
    "horizonrl.train.methods.seeupo",
    "horizonrl.train.trainers.gateway",
)


def register_trainer(name: str):
    def deco(cls):
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"trainer {name!r} is already registered")
        _REGISTRY[name] = cls
        return cls

    return deco


def _load() -> None:
    for mod in _MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise


def list_trainers() -> list[str]:
    _load()
    return sorted(_REGISTRY)


def make_trainer(cfg, *, resume: bool = False):
    """The trainer named by ``cfg.train.trainer``, constructed from ``cfg``."""
    from horizonrl.train.records.loggers import check_loggers

    _load()
    name = cfg.train.trainer
    if name not in _REGISTRY:
        raise ConfigError(f"train.trainer={name!r}: unknown trainer; known: {sorted(_REGISTRY)}")
    check_loggers(cfg.train.logger_names)  # a missing logger package fails before the model loads
    return _REGISTRY[name](cfg, resume=resume)
