"""vLLM's engine processes for :class:`~horizonrl.inference.vllm_engine.VLLMEngine`: finding them, the
reaper that outlives a killed trainer, and the shutdown that stops them and unlinks their queues.

``vllm.LLM`` starts engine-core and worker processes that talk through shared-memory queues
(``/dev/shm/psm_*``). The engine records which processes and queues appeared while it started
(:func:`descendants`, :func:`shm_segments`), starts :mod:`~horizonrl.inference.vllm_reaper` for them
(:func:`start_reaper`), and :func:`shutdown` stops them on ``close()``, garbage collection or exit.
This module imports no vLLM.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from horizonrl.inference.vllm_reaper import mapped_shm, start_time

__all__ = ["descendants", "engine_processes", "shm_segments", "shutdown", "start_reaper"]

_SHM = Path("/dev/shm")
_SHUTDOWN_TIMEOUT_S = 30.0


def shm_segments() -> set[str]:
    """Names of vLLM's shared-memory message queues (``psm_*``) in ``/dev/shm``."""
    try:
        return {n for n in os.listdir(_SHM) if n.startswith("psm_")}
    except OSError:
        return set()


def descendants(pid: int) -> set[int]:
    """Pids of every live descendant of ``pid`` (from ``/proc/*/stat``)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, frontier = set(), {pid}
    while frontier:
        frontier = {c for c, p in parent.items() if p in frontier} - out
        out |= frontier
    return out


def engine_processes(pids: set[int]) -> set[int]:
    """``pids`` less multiprocessing's resource tracker (it exits, unlinking what it tracks, once
    the processes it serves are gone)."""
    out = set()
    for pid in pids:
        try:
            if b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.add(pid)
        except OSError:
            continue
    return out


def start_reaper(pids: set[int], segments: set[str]) -> subprocess.Popen | None:
    """Start :mod:`vllm_reaper` for the engine processes ``pids`` (None where /proc is missing)."""
    procs = [f"{pid}:{start}" for pid in sorted(pids) if (start := start_time(pid)) is not None]
    if not procs:
        return None
    script = Path(__file__).with_name("vllm_reaper.py")
    return subprocess.Popen(
        [sys.executable, "-I", str(script), ",".join(procs), ",".join(sorted(segments))],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C in the terminal must not stop it before it has cleaned up
        text=True,
    )


def shutdown(llm, model_dir: str, segments: set[str], reaper: subprocess.Popen | None = None) -> None:
    """Stop vLLM's engine processes, unlink the queues they left, delete the model directory.

    ``segments`` are the ``/dev/shm`` names that appeared while the engine started; any of
    them that no live process maps any more is an orphan (a process force-killed before its
    own cleanup) and is unlinked. The reaper is told to exit. Idempotent.
    """
    try:
        if llm is not None:
            llm.llm_engine.engine_core.shutdown(timeout=_SHUTDOWN_TIMEOUT_S)
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)
        if reaper is not None and reaper.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                reaper.stdin.write("exit\n")
                reaper.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                reaper.wait(timeout=5)
        if segments:
            for name in segments - mapped_shm():
                with contextlib.suppress(OSError):
                    (_SHM / name).unlink()
            segments.clear()
