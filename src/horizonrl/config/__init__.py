"""Run configuration: frozen dataclasses with a help string on every field.

This package owns the run's configuration: one frozen dataclass per section (``model``, ``env``,
``rollout``, ``algo``, ``optim``, ``train``, ``inference``, ``distributed``, ``sft``,
``gateway``; one module each, :mod:`~horizonrl.config.run` joins them into :class:`RunConfig`), every
field declared with its help string and checks (:mod:`~horizonrl.config.fields`) and validated when
the config is built, an error naming the field and the bad value; loading from YAML with
``section.field=value`` overrides, saving, and the config reference (:mod:`~horizonrl.config.io`); and
which fields ``--resume`` may change (:mod:`~horizonrl.config.resume`). Import from here: every name
below is re-exported.
"""

from __future__ import annotations

from horizonrl.config.algo import AlgoConfig
from horizonrl.config.distributed import DistributedConfig
from horizonrl.config.env import EnvConfig
from horizonrl.config.fields import _DEVICE as _DEVICE
from horizonrl.config.fields import LOGGERS, MAX_CONFIG_BYTES, MAX_SEED, opt
from horizonrl.config.fields import _check as _check
from horizonrl.config.fields import _Section as _Section
from horizonrl.config.gateway import GatewayConfig
from horizonrl.config.inference import InferenceConfig
from horizonrl.config.io import (
    apply_overrides,
    describe,
    field_rows,
    from_dict,
    load_config,
    read_config_file,
    save_config,
)
from horizonrl.config.model import ModelConfig
from horizonrl.config.resume import _UNSET as _UNSET
from horizonrl.config.resume import _leaves as _leaves
from horizonrl.config.resume import _Unset as _Unset
from horizonrl.config.resume import resumable_fields, resume_conflicts
from horizonrl.config.rollout import RolloutConfig
from horizonrl.config.run import SECTIONS, RunConfig
from horizonrl.config.sft import SFTConfig
from horizonrl.config.train import OptimConfig, TrainConfig
from horizonrl.errors import ConfigError

__all__ = [
    "LOGGERS",
    "MAX_CONFIG_BYTES",
    "MAX_SEED",
    "SECTIONS",
    "AlgoConfig",
    "ConfigError",
    "DistributedConfig",
    "EnvConfig",
    "GatewayConfig",
    "InferenceConfig",
    "ModelConfig",
    "OptimConfig",
    "RolloutConfig",
    "RunConfig",
    "SFTConfig",
    "TrainConfig",
    "apply_overrides",
    "describe",
    "field_rows",
    "from_dict",
    "load_config",
    "opt",
    "read_config_file",
    "resumable_fields",
    "resume_conflicts",
    "save_config",
]
