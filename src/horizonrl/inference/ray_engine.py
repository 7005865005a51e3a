"""Engine replicas as Ray actors behind the one ``Engine`` interface (``distributed.backend: ray``).

Design (docs/scale.md): the agent programs of a step keep running in the
trainer's driver (:func:`horizonrl.agents.driver.drive`), which makes one
``generate`` call per round for *all* programs; :class:`RayEngine` splits that
call across ``N`` replicas and gathers the results in order. So every program
stays batched with every other (forked subagents, compaction sessions, RTPO
siblings included), trainers and agents do not change, and a prompt goes to the
replica that served its longest prefix (:class:`~horizonrl.inference.routing.PrefixRouter`:
a rollout's later turns follow it, RTPO sibling forks go where their trunk
sampled the boundary context ``c_k``). Assigning whole programs to replicas
would need programs (generators) to move between processes and would split
each round into per-replica batches with no gain in affinity.

- **Seeding**: one seed per prompt from the engine RNG (:mod:`.seeding`), so a
  sample does not depend on the replica that serves it; the RNG state is what
  ``rng_state`` checkpoints.
- **Replicas**: each actor builds ``inference.engine`` (``hf``, ``vllm``, ...)
  through the engine registry from the model's config and weights (shipped once
  through the object store), with ``distributed.engine_cpus`` /
  ``engine_gpus`` reserved.
- **LoRA policies**: a replica injects the same adapters into its copy (the adapter config travels
  with the weights), so the ``hf`` engine samples with them and the ``vllm`` engine serves them
  through its LoRA support; syncs carry the policy's state dict as for full fine-tuning.
- **Weight sync**: ``sync()`` puts the (CPU) state dict in the object store once and
  every replica loads it (``Engine.sync``); ``version`` counts syncs and is
  reported in ``Generation.meta["policy_version"]``. With ``shared=True``
  ``sync()`` pushes the training model's current weights (the trainers call it
  after every update); with ``shared=False`` only weights passed to ``sync``.
- **Cleanup**: :meth:`close` asks each replica to release its engine before the
  actor is killed (a killed vLLM actor leaks its shared-memory queues), then
  releases Ray (:mod:`horizonrl.cluster`).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from horizonrl.inference.base import Engine, Generation, QueuedStream, SamplingParams
from horizonrl.inference.routing import PrefixRouter
from horizonrl.inference.seeding import RequestSeeds, SeedStateMixin


def cpu_state_dict(model_or_sd) -> dict[str, torch.Tensor]:
    """Detached CPU copies of a module's (or a state dict's) tensors."""
    sd = model_or_sd.state_dict() if isinstance(model_or_sd, torch.nn.Module) else model_or_sd
    return {k: v.detach().to("cpu", copy=True) for k, v in sd.items()}


class EngineReplica:
    """One rollout engine inside a Ray actor (the class is wrapped by ``ray.remote`` at start)."""

    def __init__(
        self,
        name: str,
        blob: dict[str, Any],
        tokenizer,
        *,
        device: str,
        max_batch_size: int,
        params: dict,
        threads: int,
    ) -> None:
        from transformers import AutoModelForCausalLM

        from horizonrl.inference.registry import make_engine

        torch.set_num_threads(max(1, threads))
        config, dtype = blob["config"], blob["dtype"]
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        if blob.get("lora") is not None:  # a LoRA policy: the same adapters, synced as the policy's
            from horizonrl.models.lora import adapt_like

            adapt_like(blob["lora"], model)
        model.load_state_dict(blob["state_dict"])
        if blob.get("generation_config") is not None:  # its eos ids end generations as in the trainer
            model.generation_config = blob["generation_config"]
        model.eval().requires_grad_(False)
        self.engine = make_engine(
            name,
            model,
            tokenizer,
            device=device,
            max_batch_size=max_batch_size,
            seed=0,
            shared=True,
            params=params,
        )
        self.version = 0

    def generate(self, prompts, params: SamplingParams, seeds) -> list[Generation]:
        gens = self.engine.generate(prompts, params, seeds=seeds)
        for g in gens:
            g.meta["policy_version"] = self.version
        return gens

    def score(self, contexts, continuations):
        return self.engine.score(contexts, continuations)

    def load(self, state_dict: dict[str, torch.Tensor], version: int) -> int:
        self.engine.sync(state_dict)
        self.version = version
        return version

    def info(self) -> dict[str, Any]:
        import ray

        return {"pid": os.getpid(), "node_ip": ray.util.get_node_ip_address(), "version": self.version}

    def sleep(self) -> None:
        self.engine.sleep()

    def shutdown(self) -> bool:
        self.engine.close()
        self.engine = None
        gc.collect()
        return True


class RayEngine(SeedStateMixin, Engine):
    """``N`` engine replicas behind ``Engine`` (module docstring). Build it with :func:`make_ray_engine`."""

    def __init__(
        self, replicas: list, router: PrefixRouter, *, model=None, follow: bool, seed: int, release=None
    ) -> None:
        import ray

        self._ray = ray
        self.replicas = replicas
        self.router = router
        self.model = model
        self.follow = follow
        self.seeds = RequestSeeds(seed)
        self.version = 0
        self._release = release
        self.closed = False
        # Engine attributes the trainers read (eos ids, pad id) come from one replica's engine.

    def _split(self, assign: list[int]) -> list[list[int]]:
        parts: list[list[int]] = [[] for _ in self.replicas]
        for i, r in enumerate(assign):
            parts[r].append(i)
        return parts

    supports_seeds = True

    def draw_seeds(self, n: int) -> list[int]:
        return self.seeds.draw(n)

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, *, seeds: Sequence[int] | None = None
    ) -> list[Generation]:
        """Split ``prompts`` across the replicas by the router; each prompt is sampled with its seed
        (``seeds``, or drawn here in prompt order), so the split does not change the samples."""
        prompts = [list(p) for p in prompts]
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"RayEngine.generate: {len(seeds)} seeds for {len(prompts)} prompts")
        seeds = self.seeds.draw(len(prompts)) if seeds is None else [int(s) for s in seeds]
        if not prompts:
            return []
        parts = self._split(self.router.assign(prompts))
        refs = {
            r: self.replicas[r].generate.remote([prompts[i] for i in idx], params, [seeds[i] for i in idx])
            for r, idx in enumerate(parts)
            if idx
        }
        out: list[Generation | None] = [None] * len(prompts)
        for r, gens in zip(refs, self._ray.get(list(refs.values())), strict=True):
            for i, g in zip(parts[r], gens, strict=True):
                g.meta["replica"] = r
                out[i] = g
                self.router.record(r, prompts[i] + list(g.ids))
        return out  # type: ignore[return-value]

    def open_stream(self) -> RayStream:
        """The replicas as one stream for the asynchronous driver (:class:`RayStream`)."""
        return RayStream(self)

    def score(self, contexts, continuations) -> list[np.ndarray]:
        contexts = [list(c) for c in contexts]
        continuations = [list(c) for c in continuations]
        if len(contexts) != len(continuations):
            raise ValueError("RayEngine.score: contexts and continuations differ in length")
        if not contexts:
            return []
        parts = self._split(self.router.assign(contexts))
        refs = {
            r: self.replicas[r].score.remote([contexts[i] for i in idx], [continuations[i] for i in idx])
            for r, idx in enumerate(parts)
            if idx
        }
        out: list[np.ndarray | None] = [None] * len(contexts)
        for r, scores in zip(refs, self._ray.get(list(refs.values())), strict=True):
            for i, s in zip(parts[r], scores, strict=True):
                out[i] = s
        return out  # type: ignore[return-value]

    def sync(self, state_dict=None) -> None:
        """Load weights into every replica: ``state_dict``, or the followed training model's (module doc)."""
        if state_dict is None:
            if not self.follow:
                return
            state_dict = self.model.state_dict()
        elif not self.follow and self.model is not None:
            self.model.load_state_dict(state_dict)
        ref = self._ray.put(cpu_state_dict(state_dict))
        self.version += 1
        self._ray.get([r.load.remote(ref, self.version) for r in self.replicas])
        del ref

    def sleep(self) -> None:
        """Every replica frees its accelerator memory until the next sync / generate (colocated)."""
        self._ray.get([r.sleep.remote() for r in self.replicas])

    def state_dict(self):
        """The weights the replicas sample from (the followed model, or the copy of the last sync)."""
        return self.model.state_dict()

    def info(self) -> list[dict[str, Any]]:
        return self._ray.get([r.info.remote() for r in self.replicas])

    def close(self) -> None:
        """Release every replica's engine, kill the actors, release Ray (idempotent)."""
        if self.closed:
            return
        self.closed = True
        try:
            self._ray.get([r.shutdown.remote() for r in self.replicas], timeout=120)
        finally:
            for r in self.replicas:
                self._ray.kill(r)
            self.replicas = []
            if self._release is not None:
                self._release()


def _check_resources(ray, settings) -> None:
    """On the private local Ray, refuse replicas that could never be placed (they would wait forever)."""
    if settings.address is not None:
        return  # a cluster may scale up
    n = settings.num_engine_replicas
    need = {"CPU": settings.engine_cpus * n, "GPU": settings.engine_gpus * n}
    total = ray.cluster_resources()
    deadline = time.monotonic() + 60.0
    while True:  # actors killed a moment ago free their resources with a delay
        free = ray.available_resources()
        short = [k for k, v in need.items() if v > free.get(k, 0.0) + 1e-9]
        if not short or any(need[k] > total.get(k, 0.0) + 1e-9 for k in short) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for key, per in (("CPU", settings.engine_cpus), ("GPU", settings.engine_gpus)):
        if key in short:
            field = "engine_cpus" if key == "CPU" else "engine_gpus"
            raise ValueError(
                f"distributed.{field}={per} x num_engine_replicas={n} needs {per * n:g} {key}s, but the "
                f"local Ray has {free.get(key, 0.0):g} free (distributed.num_cpus, or fewer/smaller replicas)"
            )


def make_ray_engine(
    name: str,
    model,
    tokenizer,
    *,
    settings,
    max_batch_size: int,
    seed: int,
    shared: bool = True,
    params: dict | None = None,
) -> RayEngine:
    """Start ``settings.num_engine_replicas`` replicas of engine ``name`` on ``model``'s current weights.

    ``settings`` is the run's ``DistributedConfig`` (address, CPUs/GPUs per replica, routing).
    """
    from horizonrl import cluster
    from horizonrl.models.lora import ADAPTER, is_lora

    ray = cluster.connect(settings.address, num_cpus=settings.num_cpus)
    try:
        _check_resources(ray, settings)
        actor = ray.remote(num_cpus=settings.engine_cpus, num_gpus=settings.engine_gpus)(EngineReplica)
        dtype = next(model.parameters()).dtype
        blob = ray.put(
            {
                "config": model.config,
                "generation_config": getattr(model, "generation_config", None),
                "dtype": dtype,
                "state_dict": cpu_state_dict(model),
                "lora": model.peft_config[ADAPTER] if is_lora(model) else None,
            }
        )
        device = "cuda" if settings.engine_gpus > 0 else "cpu"
        threads = max(1, int(settings.engine_cpus))
        replicas = [
            actor.remote(
                name,
                blob,
                tokenizer,
                device=device,
                max_batch_size=max_batch_size,
                params=dict(params or {}),
                threads=threads,
            )
            for _ in range(settings.num_engine_replicas)
        ]
        ray.get([r.info.remote() for r in replicas])  # wait until every replica is up (errors surface here)
        del blob
    except BaseException:
        cluster.release()
        raise
    router = PrefixRouter(
        settings.num_engine_replicas,
        block=settings.prefix_block,
        max_imbalance=settings.max_imbalance,
        mode=settings.routing,
    )
    local = model if shared else copy.deepcopy(model).eval().requires_grad_(False)
    return RayEngine(replicas, router, model=local, follow=shared, seed=seed, release=cluster.release)


class RayStream(QueuedStream):
    """The replicas of a :class:`RayEngine` as one stream (the asynchronous driver's engine side).

    Requests wait here until a replica is free. Each :meth:`step` routes what waits by prefix
    (:class:`~horizonrl.inference.routing.PrefixRouter`, as ``generate`` does) and hands every *free*
    replica the requests routed to it as one call per ``SamplingParams`` (each request with its own
    seed); a request routed to a busy replica goes to a free one that got nothing, else waits. It then
    returns the generations of the calls that have finished. So a replica starts its next call as soon
    as it is free while the others still run theirs; each replica batches whole calls.
    """

    #: How long a step waits for a replica's call to finish before returning (seconds).
    POLL_S = 0.01

    def __init__(self, engine: RayEngine) -> None:
        super().__init__()
        self.engine = engine
        self._waiting: list[tuple] = []
        self._calls: dict[Any, tuple[int, list[tuple]]] = {}  # object ref -> (replica, its requests)

    @property
    def pending(self) -> bool:
        return bool(self._queue) or bool(self._waiting) or bool(self._calls)

    def _dispatch(self) -> None:
        e = self.engine
        busy = {r for r, _ in self._calls.values()}
        free = [r for r in range(len(e.replicas)) if r not in busy]
        if not free or not self._waiting:
            return
        groups: dict[int, list[tuple]] = {r: [] for r in free}
        later = []
        for item, r in zip(self._waiting, e.router.assign([it[1] for it in self._waiting]), strict=True):
            groups.get(r, later).append(item)
        self._waiting = []
        for item in later:  # its replica is busy: a free one that got nothing takes it, else it waits
            idle = [r for r in free if not groups[r]]
            (groups[idle[0]] if idle else self._waiting).append(item)
        for r, items in groups.items():
            by_params: dict[SamplingParams, list[tuple]] = {}
            for item in items:
                by_params.setdefault(item[2], []).append(item)
            for params, part in by_params.items():
                ref = e.replicas[r].generate.remote([it[1] for it in part], params, [it[3] for it in part])
                self._calls[ref] = (r, part)

    def step(self) -> list[tuple[Any, Generation]]:
        e, ray = self.engine, self.engine._ray
        self._waiting += self._take()
        self._dispatch()
        if not self._calls:
            return []
        ready, rest = ray.wait(list(self._calls), num_returns=1, timeout=self.POLL_S)
        if ready and rest:
            ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        done = []
        for ref in ready:
            r, part = self._calls.pop(ref)
            for (key, prompt, *_), g in zip(part, ray.get(ref), strict=True):
                g.meta["replica"] = r
                e.router.record(r, prompt + list(g.ids))
                done.append((key, g))
        return done

    def close(self) -> None:
        """Drop waiting requests and cancel running calls (best effort: a call a replica started ends)."""
        self._take()
        self._waiting = []
        for ref in self._calls:
            with contextlib.suppress(Exception):
                self.engine._ray.cancel(ref)
        self._calls = {}
