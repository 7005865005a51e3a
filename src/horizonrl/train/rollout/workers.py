"""Where a trainer's rollout engine and environments run (``distributed`` config; docs/scale.md).

- ``backend: local``: the registered ``inference.engine`` in the trainer process
  (request-seeded when ``distributed.seeding`` asks for it, and sharded across
  ranks under torchrun: :class:`horizonrl.inference.sharded.ShardedEngine`).
- ``backend: ray``: ``num_engine_replicas`` replicas of ``inference.engine`` as Ray
  actors behind one :class:`~horizonrl.inference.ray_engine.RayEngine`, and, with
  ``num_env_workers > 0``, the environments chosen by ``env_actors`` in
  environment-worker actors (:class:`~horizonrl.envs.core.remote.EnvPool`); the driver
  then resumes agent programs in ``num_env_workers`` threads so their environment
  steps overlap.
"""

from __future__ import annotations

from horizonrl.agents.driver import DriverOptions
from horizonrl.agents.scheduler import supports_async
from horizonrl.envs import get_env
from horizonrl.envs.core.remote import EnvPool, runs_remotely
from horizonrl.errors import ConfigError
from horizonrl.inference import make_engine
from horizonrl.inference.base import EngineWrapper, Generation, MappedStream
from horizonrl.inference.seeding import SeededEngine
from horizonrl.tool_formats import ToolFormat
from horizonrl.vocab import DriverMode


def remote_envs(cfg) -> bool:
    """Whether the run's environments live in environment-worker actors."""
    d = cfg.distributed
    return d.backend == "ray" and d.num_env_workers > 0 and runs_remotely(get_env(cfg.env.name), d.env_actors)


def make_rollout_engine(cfg, model, tokenizer, *, device, shared: bool, world=None):
    """The configured rollout engine over ``model`` (module docstring); ``world``: the torchrun group."""
    d = cfg.distributed
    world_size = world.size if world is not None else 1
    if d.seeding == "batch" and world_size > 1:
        raise ValueError("distributed.seeding='batch': ranks share generation only with 'request' seeding")
    kw = dict(
        max_batch_size=cfg.rollout.max_batch_size,
        seed=cfg.train.seed,
        shared=shared,
        params=dict(cfg.inference.params),
    )
    if d.backend == "ray":
        if world_size > 1:
            raise ValueError(
                "distributed.backend=ray runs the rollouts from one trainer process, not torchrun"
            )
        from horizonrl.inference.ray_engine import make_ray_engine

        engine = make_ray_engine(cfg.inference.engine, model, tokenizer, settings=d, **kw)
        return check_driver(engine, cfg)
    if world_size > 1:
        from horizonrl.inference.sharded import ShardedEngine, full_model_copy

        follow = None
        if world.strategy == "fsdp":  # sharded weights: the engine samples from a full copy
            follow, model, kw["shared"] = (model if shared else None), full_model_copy(model, world), True
        inner = make_engine(cfg.inference.engine, model, tokenizer, device=device, **kw)
        return check_driver(ShardedEngine(inner, world, seed=cfg.train.seed, follow=follow), cfg)
    engine = make_engine(cfg.inference.engine, model, tokenizer, device=device, **kw)
    if d.request_seeding(world_size):
        engine = SeededEngine(engine, cfg.train.seed)
    return check_driver(engine, cfg)


def check_driver(engine, cfg):
    """``engine``, after checking that it can serve ``rollout.driver`` (ConfigError when 'async' meets an
    engine that cannot sample from request seeds)."""
    if cfg.rollout.driver == DriverMode.ASYNC and not supports_async(engine):
        raise ConfigError(
            f"rollout.driver='async' needs an engine that samples from request seeds; "
            f"{type(engine).__name__} does not (torchrun ranks generate in lockstep: use 'sync')"
        )
    return engine


def driver_options(cfg) -> DriverOptions:
    """How the run's agent programs are driven (:attr:`AgentSpec.driver
    <horizonrl.agents.registry.AgentSpec.driver>`): ``rollout.driver``, in ``rollout.env_threads`` threads
    under 'async' and ``rollout.sync_env_threads`` under 'sync', and in at least ``num_env_workers``
    threads when the environments live in environment-worker actors (their steps then overlap)."""
    r, d = cfg.rollout, cfg.distributed
    base = d.num_env_workers if remote_envs(cfg) else 1
    threads = r.env_threads if r.driver == DriverMode.ASYNC else r.sync_env_threads
    return DriverOptions(mode=DriverMode(r.driver), threads=max(base, threads))


class FamilyTextEngine(EngineWrapper):
    """Generations whose text holds the model family's tool calls in the canonical syntax the environments
    and agents parse (:meth:`ChatRenderer.canonical_text`); the model's own text is ``meta["raw_text"]``.
    The ids and log-probs are untouched: only what the agent layer reads changes."""

    def __init__(self, engine, renderer) -> None:
        super().__init__(engine)
        self.renderer = renderer

    def _canonical(self, gens: list[Generation]) -> list[Generation]:
        for g in gens:
            text = self.renderer.canonical_text(g.text)
            if text != g.text:
                g.meta["raw_text"], g.text = g.text, text
        return gens

    def generate(self, prompts, params, **kw) -> list[Generation]:
        return self._canonical(self.inner.generate(prompts, params, **kw))

    def open_stream(self):
        inner = self.inner.open_stream()
        return None if inner is None else MappedStream(inner, after=lambda g, _: self._canonical([g])[0])


def for_family(engine, renderer):
    """``engine`` made to stop on the family's stop tokens and, for a family whose tool syntax is not the
    canonical one (Llama 3's JSON, pythonic), to hand its calls to the agents canonically."""
    base = engine
    while isinstance(base, EngineWrapper) and "eos_ids" not in vars(base):
        base = base.inner
    if "eos_ids" in vars(base):  # the local engines; Ray replicas keep their generation config's
        base.eos_ids = frozenset(base.eos_ids) | renderer.stop_ids
    if type(renderer.tool_format).to_canonical is ToolFormat.to_canonical:
        return engine
    return FamilyTextEngine(engine, renderer)


def make_env_pool(cfg, setup) -> EnvPool | None:
    """The environment-worker pool of the run (``setup``: its :class:`EnvSetup`), or None when
    environments run in the trainer process."""
    if not remote_envs(cfg):
        return None
    return EnvPool(
        setup.cls,
        setup.knobs,
        workers=cfg.distributed.num_env_workers,
        settings=cfg.distributed,
        reward=setup.reward,
    )


def close_quietly(obj) -> None:
    """``obj.close()`` if it has one (engines, pools; wrappers forward to what they wrap)."""
    close = getattr(obj, "close", None)
    if callable(close):
        close()
