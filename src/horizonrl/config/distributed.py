"""The ``distributed`` section: where rollouts run (local or Ray actors) and how the update is sharded."""

from __future__ import annotations

from dataclasses import dataclass

from horizonrl.config.fields import _Section, opt
from horizonrl.errors import ConfigError


@dataclass(frozen=True)
class DistributedConfig(_Section):
    """Where rollouts and the update run (docs/scale.md; horizonrl/world.py)."""

    _prefix = "distributed."
    backend: str = opt(
        "local",
        "rollout workers: 'local' (the engine and environments in the trainer process) or 'ray' (engine "
        "replicas and environment workers as Ray actors)",
        choices=("local", "ray"),
        resume=True,
    )
    address: str | None = opt(
        None,
        "Ray cluster (backend=ray): null starts a private Ray bound to 127.0.0.1 only; 'auto' joins the "
        "cluster this machine is part of; 'ray://HOST:10001' connects through Ray Client",
        resume=True,
    )
    num_cpus: int | None = opt(
        None,
        "CPUs of the private local Ray (address=null; null: all of this machine's)",
        gt=0,
        resume=True,
    )
    num_engine_replicas: int = opt(
        1,
        "rollout engine replicas (Ray actors, each running inference.engine on its own weights)",
        ge=1,
        resume=True,
    )
    engine_cpus: float = opt(
        1.0, "CPUs reserved for each engine replica (also its torch threads)", ge=0.0, resume=True
    )
    engine_gpus: float = opt(
        0.0,
        "GPUs reserved for each engine replica (> 0 puts its model on cuda)",
        ge=0.0,
        resume=True,
    )
    num_env_workers: int = opt(
        0,
        "environment worker actors (0: every environment in the trainer process)",
        ge=0,
        resume=True,
    )
    env_actors: str = opt(
        "auto",
        "which environments run in the worker actors: 'auto' those with external state (Env.external_state: "
        "the math_python sandbox, the search index), 'all', or 'none'",
        choices=("auto", "all", "none"),
        resume=True,
    )
    env_cpus: float = opt(0.0, "CPUs reserved for each environment worker actor", ge=0.0, resume=True)
    routing: str = opt(
        "prefix",
        "how one generate call is split across replicas: 'prefix' (each prompt to the replica that served "
        "its longest prefix, within the balance bound: a rollout's later turns and RTPO siblings follow "
        "their context) or 'round_robin'",
        choices=("prefix", "round_robin"),
        resume=True,
    )
    prefix_block: int = opt(16, "tokens per hashed block of the prefix router", ge=1, resume=True)
    max_imbalance: float = opt(
        0.25,
        "a replica serves at most ceil(n / replicas * (1 + this)) of the n prompts of one call",
        ge=0.0,
        resume=True,
    )
    seeding: str | None = opt(
        None,
        "sampling randomness: 'batch' (one generator per engine, draws depend on the batch) or 'request' "
        "(one seed per prompt drawn from the engine RNG, so a sample does not depend on which replica, "
        "rank or batch serves it); null: 'batch' for a single local engine, 'request' otherwise",
        choices=(None, "batch", "request"),
    )
    update: str = opt(
        "ddp",
        "sharded update under torchrun (WORLD_SIZE > 1): 'ddp' (replicated weights, all-reduced "
        "gradients) or 'fsdp' (FSDP2 fully_shard: parameters, gradients and optimizer state sharded)",
        choices=("ddp", "fsdp"),
        resume=True,
    )
    process_group: str = opt(
        "auto",
        "torch.distributed backend under torchrun: 'auto' (nccl on cuda, gloo on cpu), 'gloo' or 'nccl'",
        choices=("auto", "gloo", "nccl"),
        resume=True,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.backend == "ray" and self.seeding == "batch":
            raise ConfigError(
                "distributed.seeding='batch': with backend=ray samples must not depend on the replica; "
                "use 'request' (or null)"
            )
        if self.backend != "ray":
            for name, value, default in (
                ("address", self.address, None),
                ("num_engine_replicas", self.num_engine_replicas, 1),
                ("num_env_workers", self.num_env_workers, 0),
            ):
                if value != default:
                    raise ConfigError(f"distributed.{name}={value!r} needs distributed.backend=ray")

    def request_seeding(self, world_size: int = 1) -> bool:
        """Whether engines draw one seed per request (see ``seeding``)."""
        if self.seeding is not None:
            return self.seeding == "request"
        return self.backend == "ray" or world_size > 1
