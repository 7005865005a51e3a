"""Registry of trainers (``train.trainer`` in configs).

``group`` (:class:`~horizonrl.train.trainers.group.GroupTrainer`: GRPO, Mosaic,
CCPO, ECHO and every estimator over groups of rollouts) and ``gateway`` (the
recording-gateway trainer, needs the serve extra) are the generic trainers;
method trainers (``rtpo``, ``seeupo``) register from the plug-in list
:mod:`horizonrl.train.methods`. A trainer is constructed as ``cls(cfg, resume=bool)``
and trained with ``fit()``; one that takes parameters declares them as a frozen
config dataclass ``params_cls``, read from ``train.trainer_params``
(:func:`trainer_params`), as estimators, agents and context managers read theirs
from ``*_params``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from horizonrl.config import field_rows
from horizonrl.errors import ConfigError
from horizonrl.registry import Registry

#: Modules whose import registers the built-in trainers (imported on first lookup: they pull in torch).
BUILTIN_TRAINERS = ("horizonrl.train.trainers.group", "horizonrl.train.methods")

TRAINERS: Registry[Callable[..., Any]] = Registry(
    "trainer",
    register_with="@register_trainer(NAME) (horizonrl.train)",
    plugins=BUILTIN_TRAINERS,
    # needs the serve extra (fastapi): imported only when train.trainer=gateway is asked for
    lazy={"gateway": "horizonrl.train.trainers.gateway"},
)


def register_trainer(name: str):
    """Class decorator: ``cls(cfg, resume=bool)`` is the trainer ``train.trainer=name``."""
    return TRAINERS.register(name)


def list_trainers() -> list[str]:
    return TRAINERS.names()


def trainer_params(cfg) -> Any:
    """``cfg.train.trainer_params`` validated against the trainer's declared ``params_cls`` (a frozen
    ``config`` section dataclass), or ``None`` for a trainer that declares none; a
    :class:`~horizonrl.errors.ConfigError` names an unknown parameter or a bad value."""
    name = cfg.train.trainer
    cls = TRAINERS.get(name, field="train.trainer")
    params = dict(cfg.train.trainer_params)
    declared = getattr(cls, "params_cls", None)
    if declared is None:
        if params:
            raise ConfigError(
                f"train.trainer_params={params!r}: trainer {name!r} takes no parameters (clear them with "
                f"train.trainer_params={{}}; trainers with parameters: "
                f"{[n for n, c in TRAINERS.items() if c.params_cls]})"
            )
        return None
    known = [f.name for f in dataclasses.fields(declared)]
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ConfigError(
            f"train.trainer_params: unknown parameter(s) {unknown} of trainer {name!r}; known: {known}"
        )
    return declared(**params)


def resumable_params(cfg) -> list[str]:
    """The ``train.trainer_params.*`` keys ``--resume`` may change (declared ``opt(resume=True)``)."""
    declared = getattr(TRAINERS.get(cfg.train.trainer, field="train.trainer"), "params_cls", None)
    fields = dataclasses.fields(declared) if declared is not None else ()
    return [f"train.trainer_params.{f.name}" for f in fields if f.metadata.get("resume")]


def trainer_reference() -> str:
    """Markdown table of every trainer's parameters (``train.trainer_params``), for the README."""
    lines = ["| trainer | parameter | default | help |", "|---|---|---|---|"]
    for name, cls in TRAINERS.items():
        if cls.params_cls is not None:
            lines += [f"| `{name}` {row}" for row in field_rows(cls.params_cls, "")]
    return "\n".join(lines)


def make_trainer(cfg, *, resume: bool = False):
    """The trainer named by ``cfg.train.trainer``, constructed from ``cfg``."""
    from horizonrl.train.records.loggers import check_loggers

    cls = TRAINERS.get(cfg.train.trainer, field="train.trainer")
    check_loggers(cfg.train.logger_names)  # a missing logger package fails before the model loads
    return cls(cfg, resume=resume)


def trainers_with(feature: str) -> list[str]:
    """The registered trainers whose class sets the boolean attribute ``feature`` (``collects_async``,
    ``samples_dynamically``)."""
    return [n for n, cls in TRAINERS.items() if getattr(cls, feature, False)]


def async_trainers() -> list[str]:
    """The registered trainers that collect rollouts in the background (``collects_async``;
    ``train.max_staleness > 0``)."""
    return trainers_with("collects_async")
