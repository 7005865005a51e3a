"""Ray connection for the rollout workers (``distributed.backend: ray``; docs/scale.md).

:func:`connect` starts or joins Ray once per process and counts its users;
:func:`release` shuts Ray down when the last user that needed a private
cluster is done. ``address``:

- ``None``: a private local Ray bound to **127.0.0.1 only** — raylet, GCS,
  object manager and workers. Ray replaces a requested loopback node address by
  the machine's interface address unless "clusters" are disabled
  (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read when Ray is imported, and
  patched here in case it already was); no dashboard, no usage statistics,
  no log forwarding.
- ``"auto"``: the cluster this machine already belongs to (``ray start``).
- ``"ray://HOST:PORT"``: Ray Client to a remote cluster's head.

Workers get ``PYTHONPATH`` (so a source checkout imports the same package) and
the offline settings below. Imports nothing from horizonrl.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

#: Environment of this process and of every Ray worker: loopback only, offline, no statistics.
SAFE_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DISABLE_DOCKER_CPU_WARNING": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}

_lock = threading.Lock()
_users = 0
_owned = False


def _import_ray():
    for k, v in SAFE_ENV.items():
        os.environ.setdefault(k, v)
    try:
        import ray
    except ImportError as e:
        raise RuntimeError("distributed.backend=ray needs Ray: pip install 'horizonrl[ray]'") from e
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False  # loopback stays loopback (see the module docstring)
    return ray


def connect(address: str | None = None, *, num_cpus: int | None = None) -> Any:
    """Start or join Ray (see the module docstring); returns the ``ray`` module. Pair with :func:`release`."""
    global _users, _owned
    ray = _import_ray()
    with _lock:
        if not ray.is_initialized():
            env_vars = {k: os.environ[k] for k in SAFE_ENV if k in os.environ}
            if os.environ.get("PYTHONPATH"):
                env_vars["PYTHONPATH"] = os.environ["PYTHONPATH"]
            kw: dict[str, Any] = {
                "runtime_env": {"env_vars": env_vars},
                "log_to_driver": False,
                "logging_level": "warning",
            }
            if address is None:
                kw.update(num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1")
            elif not (address == "auto" or address.startswith("ray://")):
                raise ValueError(
                    f"distributed.address={address!r}: expected null (private local Ray), 'auto' or "
                    "'ray://HOST:PORT'"
                )
            else:
                kw["address"] = address
            ray.init(**kw)
            _owned = address is None
        _users += 1
    return ray


def release() -> None:
    """Drop one :func:`connect` user; shut a private Ray down when none is left."""
    global _users, _owned
    import ray

    with _lock:
        _users = max(0, _users - 1)
        if _users == 0 and _owned and ray.is_initialized():
            ray.shutdown()
            _owned = False


def shm_files() -> set[str]:
    """Names in ``/dev/shm`` (to check that actors left no shared memory behind)."""
    p = Path("/dev/shm")
    return {f.name for f in p.iterdir()} if p.is_dir() else set()


def orphaned_shm(names: set[str]) -> set[str]:
    """Those of ``names`` still in ``/dev/shm`` that no process maps or holds open (leaked segments).

    Segments another live process uses are not leaks, so this is safe on a shared machine.
    """
    present = names & shm_files()
    if not present:
        return set()
    used: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for line in (proc / "maps").read_text().splitlines():
                if "/dev/shm/" in line:
                    used.add(line.rsplit("/dev/shm/", 1)[1].split(" ")[0])
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("/dev/shm/"):
                    used.add(target[len("/dev/shm/") :].split(" ")[0])
        except OSError:
            continue
    return present - used
