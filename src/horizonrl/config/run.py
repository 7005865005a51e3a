"""The whole run's configuration: :class:`RunConfig`, one field per section, and :data:`SECTIONS`.

There is no validation across sections here: every check runs inside its section (field by field in
:func:`~horizonrl.config.fields._check`, across the fields of one section in that section's
``__post_init__``), and :class:`RunConfig` adds none. Checks against the registries, the machine or the
chosen trainer run at the start of a run (:mod:`horizonrl.train.trainers.checks` and the trainers).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from horizonrl.config.algo import AlgoConfig
from horizonrl.config.distributed import DistributedConfig
from horizonrl.config.env import EnvConfig
from horizonrl.config.gateway import GatewayConfig
from horizonrl.config.inference import InferenceConfig
from horizonrl.config.model import ModelConfig
from horizonrl.config.rollout import RolloutConfig
from horizonrl.config.sft import SFTConfig
from horizonrl.config.train import OptimConfig, TrainConfig


@dataclass(frozen=True)
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"help": "the policy model"})
    env: EnvConfig = field(default_factory=EnvConfig, metadata={"help": "environment and tasks"})
    rollout: RolloutConfig = field(
        default_factory=RolloutConfig, metadata={"help": "sampling and agent loop"}
    )
    algo: AlgoConfig = field(default_factory=AlgoConfig, metadata={"help": "credit and loss"})
    optim: OptimConfig = field(default_factory=OptimConfig, metadata={"help": "optimizer"})
    train: TrainConfig = field(default_factory=TrainConfig, metadata={"help": "training loop"})
    inference: InferenceConfig = field(default_factory=InferenceConfig, metadata={"help": "rollout engine"})
    distributed: DistributedConfig = field(
        default_factory=DistributedConfig, metadata={"help": "rollout workers and sharded update"}
    )
    sft: SFTConfig = field(default_factory=SFTConfig, metadata={"help": "supervised warm start"})
    gateway: GatewayConfig = field(
        default_factory=GatewayConfig, metadata={"help": "recording gateway for external agent harnesses"}
    )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


SECTIONS = {f.name: f.default_factory for f in dataclasses.fields(RunConfig)}

#: Sections that moved: ``old -> (new place, the old section's defaults)``. ``from_dict`` reads an old
#: section's non-default values into the new place with a warning. Defaults are dropped: a saved
#: ``config.yaml`` of an earlier run lists every field of the section, whatever its trainer, and the
#: trainer's own defaults are the same values.
MOVED_SECTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "rtpo": (
        "train.trainer_params",
        {
            "trunks_per_task": 1,
            "siblings": 3,
            "off_policy": False,
            "weight_low": 0.0,
            "weight_high": 1.0,
            "sync_every": 1,
            "flat": False,
            "max_rollouts": 0,
        },
    )
}
