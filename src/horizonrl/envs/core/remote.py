"""Environments in Ray actors: a pool of workers and a local proxy (``distributed.num_env_workers``).

Environments whose state lives outside the Python object (``Env.external_state``:
the math_python sandbox's processes, the search index) run in
:class:`EnvWorker` actors; the agent programs keep talking to an :class:`Env`,
a :class:`RemoteEnv` whose every method is one actor call (~1.7 ms round trip
for a reset + step on a 2-core machine, vs 0.07 ms in-process). A worker holds
many environments (one per rollout; a search worker loads its index once for
all of them); :class:`EnvPool` puts each new environment on the worker with the
fewest live ones.

Methods with a ``random.Random`` argument (``expert_action(rng, noise)`` and
the subagent experts) send the generator's state and set the state it ends in
back on the caller's generator, so the expert draws exactly what it would draw
in-process. Attributes other than the ``Env`` methods (``admissible_commands``,
``subagent_expert``, ...) are looked up on the remote object: values are copied
back, callables become remote calls.
"""

from __future__ import annotations

import random
import threading
from typing import Any

from horizonrl.envs.core.base import Env, StepResult, Task

_MISSING = ("missing", None)


class EnvWorker:
    """Holds environments by id inside an actor (wrapped by ``ray.remote`` in :class:`EnvPool`)."""

    def __init__(self, env_cls: type[Env], knobs: dict[str, Any], reward=None) -> None:
        self.env_cls = env_cls
        self.knobs = dict(knobs)
        self.reward = reward
        self.envs: dict[int, Env] = {}
        self.next_id = 0

    def create(self) -> tuple[int, dict[str, Any]]:
        env = self.env_cls(**self.knobs)
        if self.reward is not None:
            env.set_reward(self.reward)
        i, self.next_id = self.next_id, self.next_id + 1
        self.envs[i] = env
        meta = {
            "tools": env.tools,
            "system_prompt": env.system_prompt,
            "name": env.name,
            "knobs": env.knobs,
            "can_fork": env.can_fork,
        }
        return i, meta

    def call(self, i: int, method: str, args: tuple, kwargs: dict) -> tuple[Any, list]:
        """``env.method(*args, **kwargs)``; also returns the end states of ``random.Random`` arguments."""
        rngs = []
        args = list(args)
        for j, a in enumerate(args):
            if isinstance(a, tuple) and len(a) == 2 and a[0] == "__rng__":
                r = random.Random()
                r.setstate(a[1])
                args[j] = r
                rngs.append((j, r))
        result = getattr(self.envs[i], method)(*args, **kwargs)
        return result, [(j, r.getstate()) for j, r in rngs]

    def describe(self, i: int, name: str) -> tuple[str, Any]:
        """``('callable', None)``, ``('value', v)`` or ``('missing', None)`` for attribute ``name``."""
        try:
            v = getattr(self.envs[i], name)
        except AttributeError:
            return _MISSING
        return ("callable", None) if callable(v) else ("value", v)

    def close(self, i: int) -> None:
        env = self.envs.pop(i, None)
        if env is not None:
            env.close()

    def live(self) -> int:
        return len(self.envs)

    def shutdown(self) -> bool:
        for i in list(self.envs):
            self.close(i)
        return True


class RemoteEnv(Env):
    """An :class:`Env` whose methods run on an :class:`EnvWorker` actor (module docstring)."""

    def __init__(self, pool: EnvPool, worker, env_id: int, meta: dict[str, Any]) -> None:
        self._pool, self._worker, self._id = pool, worker, env_id
        self._tools = meta["tools"]
        self.system_prompt = meta["system_prompt"]
        self.name = meta["name"]
        self.knobs = meta["knobs"]
        self._can_fork = meta["can_fork"]
        self._closed = False

    def _call(self, method: str, *args, **kwargs):
        sent = [("__rng__", a.getstate()) if isinstance(a, random.Random) else a for a in args]
        ray = self._pool.ray
        result, states = ray.get(self._worker.call.remote(self._id, method, tuple(sent), kwargs))
        for j, state in states:
            args[j].setstate(state)
        return result

    @property
    def tools(self) -> list[Any]:
        return self._tools

    @property
    def can_fork(self) -> bool:
        return self._can_fork

    @classmethod
    def make_tasks(cls, n: int, *, seed: int, split: str = "train", **knobs: Any) -> list[Task]:
        raise TypeError("RemoteEnv.make_tasks: make tasks with the environment class itself")

    def reset(self, task: Task) -> str:
        return self._call("reset", task)

    def step(self, action: str) -> StepResult:
        return self._call("step", action)

    def expert_action(self, rng: random.Random, noise: float = 0.0) -> str:
        return self._call("expert_action", rng, noise)

    def state_key(self) -> str | None:
        return self._call("state_key")

    def snapshot(self) -> Any:
        return self._call("snapshot")

    def restore(self, state: Any) -> None:
        self._call("restore", state)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pool.closed(self)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        kind, value = self._pool.ray.get(self._worker.describe.remote(self._id, name))
        if kind == "missing":
            raise AttributeError(f"{self.name} environment has no attribute {name!r}")
        if kind == "value":
            return value
        return lambda *args, **kwargs: self._call(name, *args, **kwargs)


class EnvPool:
    """``workers`` environment-worker actors for one environment class (module docstring); ``reward``:
    the run's configured answer reward (``env.reward``), set on every environment."""

    def __init__(
        self, env_cls: type[Env], knobs: dict[str, Any], *, workers: int, settings, reward=None
    ) -> None:
        from horizonrl import cluster

        if workers < 1:
            raise ValueError(f"EnvPool: workers={workers} must be >= 1")
        self.ray = cluster.connect(settings.address, num_cpus=settings.num_cpus)
        self._release = cluster.release
        actor = self.ray.remote(num_cpus=settings.env_cpus)(EnvWorker)
        self.workers = [actor.remote(env_cls, dict(knobs), reward) for _ in range(workers)]
        self.live = [0] * workers
        self._slot: dict[int, int] = {}
        self.ray.get([w.live.remote() for w in self.workers])
        self.closed_pool = False
        self._lock = threading.Lock()  # environments are made and closed from several threads

    def make(self) -> RemoteEnv:
        """A new environment on the worker with the fewest live environments."""
        with self._lock:
            k = min(range(len(self.workers)), key=lambda j: (self.live[j], j))
            self.live[k] += 1
        env_id, meta = self.ray.get(self.workers[k].create.remote())
        env = RemoteEnv(self, self.workers[k], env_id, meta)
        with self._lock:
            self._slot[id(env)] = k
        return env

    def closed(self, env: RemoteEnv) -> None:
        with self._lock:
            k = self._slot.pop(id(env), None)
            if k is None or self.closed_pool:
                return
            self.live[k] -= 1
        self.workers[k].close.remote(env._id)  # fire and forget; ordered before later calls to the worker

    def close(self) -> None:
        """Close every environment, kill the workers, release Ray (idempotent)."""
        if self.closed_pool:
            return
        self.closed_pool = True
        try:
            self.ray.get([w.shutdown.remote() for w in self.workers], timeout=60)
        finally:
            for w in self.workers:
                self.ray.kill(w)
            self.workers = []
            self._release()


def runs_remotely(env_cls: type[Env], placement: str) -> bool:
    """Whether ``env_cls`` runs in a worker under ``distributed.env_actors=placement``."""
    return placement == "all" or (placement == "auto" and bool(getattr(env_cls, "external_state", False)))
