"""Stop a vLLM engine's processes when the process that owns the engine dies (run as a script).

vLLM's engine-core and worker processes outlive an owner that is killed
(``SIGTERM`` with Python's default handler, ``SIGKILL``, a Ray actor kill, a CI
timeout): they keep polling their queues and hold their shared-memory message
queues (``/dev/shm/psm_*``, 160-250 MB each on SmolLM2). :class:`VLLMEngine`
starts this script after the engine is up, with the engine's processes and
queue names as arguments and a pipe as stdin. The script blocks on the pipe
(no CPU): ``exit`` (a clean ``close()``) ends it quietly; end-of-file (the owner
died) makes it terminate the processes (``SIGTERM``, ``SIGKILL`` after 5 s) and
unlink the queues no live process still maps. It needs only the standard library
and is run by path, so the horizonrl package (and torch) is not imported.

    python vllm_reaper.py PID:START,PID:START,... NAME,NAME,...
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time


def start_time(pid: int) -> str | None:
    """Field 22 of ``/proc/PID/stat`` (start time in clock ticks): tells a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def mapped_shm() -> set[str]:
    """``/dev/shm`` names that a live process maps or holds open."""
    used: set[str] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/maps") as f:
                for line in f:
                    if "/dev/shm/" in line:
                        used.add(line.rsplit("/dev/shm/", 1)[1].split()[0])
            for fd in os.listdir(f"/proc/{entry}/fd"):
                target = os.readlink(f"/proc/{entry}/fd/{fd}")
                if target.startswith("/dev/shm/"):
                    used.add(target[len("/dev/shm/") :].split()[0])
        except OSError:
            continue
    return used


def reap(procs: list[tuple[int, str]], names: list[str], grace: float = 5.0) -> None:
    """Terminate ``procs`` (pid, start time) that still run, then unlink the orphaned ``names``."""
    alive = [pid for pid, start in procs if start_time(pid) == start]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in alive:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = [pid for pid in alive if start_time(pid) is not None and not _zombie(pid)]
        if not alive:
            break
    time.sleep(1.0)  # let multiprocessing's resource tracker unlink what it registered
    used = mapped_shm()
    for name in names:
        if name not in used:
            with contextlib.suppress(OSError):
                os.unlink(f"/dev/shm/{name}")


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def main(argv: list[str]) -> int:
    procs = [(int(p), s) for p, s in (item.split(":") for item in argv[1].split(",") if item)]
    names = [n for n in argv[2].split(",") if n] if len(argv) > 2 else []
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    line = sys.stdin.readline()  # blocks until the owner says "exit" or dies (end of file)
    if line.strip() != "exit":
        reap(procs, names)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
