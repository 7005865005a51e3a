"""Run untrusted Python in a separate, limited process: the sandbox of the ``python`` tool.

:func:`run_python` runs one program in a fresh process (nothing survives between
calls) with a scrubbed environment, ``python -s -P -B`` (``-I`` without ``-E``, so a
fixed ``PYTHONHASHSEED`` keeps output deterministic), a wall-clock limit and capped
output; the program text arrives on stdin. Two backends (:func:`sandbox_backend`):

- ``bwrap`` (bubblewrap, the default wherever it works, probed once): user, PID,
  IPC, UTS, network, cgroup and mount namespaces; the program sees read-only only
  the paths Python needs (:func:`~horizonrl.envs.sandbox.host.read_paths`), a
  read-only ``/`` and ``/dev``, and its working directory ``/tmp``: a private tmpfs
  capped at ``max_disk_mb`` and ``max_files`` that never exists on the host. Where
  Python lives under ``/tmp`` (a venv there), exactly those paths are bound
  read-only into that tmpfs at their own place; nothing else of the host's ``/tmp``.
- ``rlimit``: the fallback without bubblewrap. The same child-side layers
  (:mod:`horizonrl.envs.sandbox.child`: Landlock, seccomp, rlimits, capped tmpfs
  where a mount namespace can be made), but no mount view, no PID namespace, and a
  host working directory; :func:`fallback_gaps` says what it lacks on this machine
  and a warning names it when ``auto`` has to fall back.

Both: a pids cgroup caps threads (or ``RLIMIT_NPROC`` where it binds, else threads
are refused); the child dies with its parent (``PR_SET_PDEATHSIG``,
``--die-with-parent``); the process group and cgroup are killed when the run ends;
work dirs and cgroups of killed trainers are removed by the next process's first
run. Each result lists the layers actually established (``docs/envs/math_python.md``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from horizonrl.envs.sandbox import host
from horizonrl.envs.sandbox.child import _MARKER
from horizonrl.envs.sandbox.host import bwrap_argv, remove_stale

__all__ = ["BACKENDS", "STATUSES", "SandboxLimits", "SandboxResult", "bwrap_argv", "bwrap_problem",
           "fallback_gaps", "remove_stale", "run_python", "sandbox_backend"]  # fmt: skip

log = logging.getLogger(__name__)
BACKENDS = ("bwrap", "rlimit")
STATUSES = ("ok", "error", "timeout", "cpu_limit", "memory_limit", "output_limit", "file_limit", "disk_limit",
            "process_limit", "blocked", "crashed", "rejected")  # fmt: skip
_BWRAP_WORKDIR = host.BWRAP_WORKDIR
PRIVATE_TMPFS = True  # mount the capped tmpfs where the child can; False exercises the periodic disk check
_DISK_CHECK_S = 0.1  # period of the rlimit backend's disk check where no capped tmpfs could be mounted
_LIMIT_BOUNDS = {
    "cpu_s": (1, 600), "memory_mb": (32, 1 << 20), "max_output_chars": (1, 10**7), "max_file_mb": (1, 4096),
    "max_disk_mb": (1, 1 << 16), "max_files": (1, 10**7), "max_procs": (1, 4096),
    "max_code_chars": (1, 10**7),
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run; the constructor raises ValueError naming any bad value.

    ``timeout_s`` wall clock, ``cpu_s`` CPU seconds, ``memory_mb`` address space,
    ``max_output_chars`` of stdout and of stderr, ``max_file_mb`` per file,
    ``max_disk_mb`` and ``max_files`` for the whole working directory, ``max_procs``
    threads besides the main one, ``max_code_chars`` of program text.
    """

    timeout_s: float = 10.0
    cpu_s: int = 5
    memory_mb: int = 512
    max_output_chars: int = 4000
    max_file_mb: int = 16
    max_disk_mb: int = 64
    max_files: int = 1000
    max_procs: int = 16
    max_code_chars: int = 20000

    def __post_init__(self) -> None:
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t <= 600:
            raise ValueError(f"sandbox limit 'timeout_s' must be a number in (0, 600], got {t!r}")
        for name, (lo, hi) in _LIMIT_BOUNDS.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise ValueError(f"sandbox limit {name!r} must be an integer in [{lo}, {hi}], got {v!r}")


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """The outcome of one run. ``status`` is one of :data:`STATUSES`; ``ok`` means exit code 0, no limit hit.

    ``detail`` is a one-line description of any failure; ``truncated`` says that
    stdout (first ``max_output_chars`` kept) or stderr (last ones kept) was cut;
    ``exit_code`` is negative for a signal (bwrap's ``128 + n`` is mapped to ``-n``);
    ``protections`` lists the layers that were active (empty when the child died
    before reporting); ``pid`` (the process group that was killed) and ``workdir``
    (the working directory as the program saw it; on the host only for ``rlimit``,
    already removed) are recorded for inspection.
    """

    status: str
    stdout: str
    stderr: str
    exit_code: int | None
    detail: str
    backend: str
    protections: tuple[str, ...] = ()
    wall_s: float = 0.0
    cpu_s: float = 0.0
    truncated: bool = False
    pid: int | None = None
    workdir: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def observation(self) -> str:
        """What a model sees: stdout (or ``(no output)``) on success, else ``Error: <detail>.`` + output."""
        parts = [self.stdout.rstrip("\n") or "(no output)"] if self.ok else [f"Error: {self.detail}."]
        if self.stdout.strip() and not self.ok:
            parts.append(f"[stdout]\n{self.stdout.rstrip()}")
        if self.stderr.strip():
            parts.append(f"[stderr]\n{self.stderr.rstrip()}")
        return "\n".join(parts)


def run_python(
    code: str, limits: SandboxLimits | None = None, *, backend: str | None = None, **overrides: Any
) -> SandboxResult:
    """Run ``code`` in a fresh sandboxed process and return what happened.

    ``limits`` (default :class:`SandboxLimits()`) with any field replaced by a
    keyword (``timeout_s``, ``cpu_s``, ``memory_mb``, ``max_output_chars``,
    ``max_file_mb``, ``max_disk_mb``, ``max_files``, ``max_procs``,
    ``max_code_chars``); ``backend`` defaults to :func:`sandbox_backend`. Never
    raises for anything the program does; when it returns, the process group and
    cgroup are dead and the working directory removed. Raises ValueError naming a
    bad or unknown limit or backend, RuntimeError if ``bwrap`` is required but unusable.
    """
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(SandboxLimits)})
    if unknown:
        raise ValueError(f"unknown sandbox limit {unknown[0]!r}")
    limits = dataclasses.replace(limits or SandboxLimits(), **overrides)
    if not isinstance(code, str):
        raise TypeError(f"code must be a string, got {type(code).__name__}")
    backend = sandbox_backend(backend)
    if len(code) > limits.max_code_chars:
        detail = f"the code is {len(code)} characters long; the limit is {limits.max_code_chars}"
        return SandboxResult("rejected", "", "", None, detail, backend)
    host.remove_stale_once(tempfile.gettempdir(), os.getpid())
    return _run(code, limits, backend)


def _run(code: str, limits: SandboxLimits, backend: str) -> SandboxResult:
    start = time.monotonic()
    bwrap = backend == "bwrap"
    hostdir = None if bwrap else host.make_workdir()
    workdir = _BWRAP_WORKDIR if bwrap else hostdir
    cgroup = host.new_cgroup(limits.max_procs + (2 if bwrap else 1))  # + bwrap's monitor, the main thread
    try:
        cfg = {"workdir": workdir, "parent": None if bwrap else os.getpid(), "host_root": os.geteuid() == 0,
               "netns": not bwrap, "tmpfs": PRIVATE_TMPFS or bwrap, "read_paths": list(host.read_paths()),
               "rebind": list(host.tmp_read_paths(host.read_paths())) if bwrap else [],
               "thread_limit": "cgroup" if cgroup else None, **dataclasses.asdict(limits)}  # fmt: skip
        child = host.BWRAP_CHILD if bwrap else host.CHILD
        argv = [sys.executable, "-s", "-P", "-B", child, json.dumps(cfg)]
        if bwrap:
            size_ok = "--size" in host.bwrap_options()[1]
            argv = bwrap_argv(host.read_paths(), limits.max_disk_mb << 20, root=os.geteuid() == 0,
                              size_option=size_ok) + argv  # fmt: skip
        if cgroup:  # the shell joins the cgroup, then becomes the sandbox: nothing starts outside it
            argv = [
                "/bin/sh",
                "-c",
                'echo $$ > "$0" && exec "$@"',
                os.path.join(cgroup, "cgroup.procs"),
                *argv,
            ]
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=hostdir or "/",
            env=_child_env(workdir),
            start_new_session=True,
        )
        deadline = start + limits.timeout_s
        max_bytes, max_files = limits.max_disk_mb << 20, limits.max_files

        def over_disk() -> bool:
            used, files = host.disk_usage(hostdir, max_bytes, max_files)
            return used > max_bytes or files > max_files

        try:
            cap = 4 * limits.max_output_chars + 4096
            out, err, reason = _communicate(proc, code.encode("utf-8", "replace"), deadline, cap,
                                            over_disk if hostdir else None)  # fmt: skip
        finally:
            timed_out, cpu = _reap(proc, deadline, kill_now=reason is not None)
            if cgroup:
                host.remove_cgroup(cgroup)
        if reason is None and hostdir and over_disk():  # a burst between two checks, then exit
            reason = "disk"
        protections: tuple[str, ...] = ()
        if err.startswith(_MARKER.encode()):
            line, _, err = err.partition(b"\n")
            layers = json.loads(line[len(_MARKER) :])
            layers += ["bwrap:namespaces", "fs:read-only-view"] if bwrap else []
            layers += ["proc:cgroup"] if cgroup else []
            layers += ["disk:periodic-check"] if hostdir and "fs:tmpfs" not in layers else []
            protections = tuple(layers)
        n = limits.max_output_chars
        stdout, stderr = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
        truncated = len(stdout) > n or len(stderr) > n or reason == "output"
        rc = proc.returncode
        if bwrap and rc is not None and 128 < rc < 160:  # bwrap reports a signal n as exit code 128 + n
            rc = -(rc - 128)
        status, detail = _classify(rc, stdout, stderr, reason, timed_out, cpu, limits, pid1=bwrap)
        stdout, stderr, wall = stdout[:n], stderr[max(0, len(stderr) - n) :], time.monotonic() - start
        return SandboxResult(
            status, stdout, stderr, rc, detail, backend, protections, wall, cpu, truncated, proc.pid, workdir
        )
    finally:
        if cgroup:
            host.remove_cgroup(cgroup)
        if hostdir:
            host.remove_tree(hostdir)


# ---------------------------------------------------------------- backends


def sandbox_backend(prefer: str | None = None) -> str:
    """The backend a run uses: ``bwrap`` when bubblewrap is installed and works, else ``rlimit``.

    ``prefer`` may be ``auto`` (or None: then ``HORIZONRL_SANDBOX`` decides, default
    ``auto``), ``bwrap`` or ``rlimit``; ValueError names any other value,
    RuntimeError says why ``bwrap`` is unusable when it is required. Falling back
    under ``auto`` logs (once) a warning naming what the fallback lacks.
    """
    choice = prefer if prefer not in (None, "auto") else os.environ.get("HORIZONRL_SANDBOX") or "auto"
    if choice not in ("auto", *BACKENDS):
        raise ValueError(f"sandbox backend must be one of 'auto', 'bwrap', 'rlimit', got {choice!r}")
    if choice == "rlimit":
        return "rlimit"
    problem = bwrap_problem()
    if problem is None:
        return "bwrap"
    if choice == "bwrap":
        raise RuntimeError(f"sandbox backend 'bwrap' was requested but {problem}")
    _warn_fallback(problem)
    return "rlimit"


@lru_cache(maxsize=1)
def bwrap_problem() -> str | None:
    """None when the bubblewrap backend works here, else why not (probed once per process with a real run)."""
    exe, options = host.bwrap_options()
    if exe is None:
        return "bwrap is not installed (install the 'bubblewrap' package, e.g. `make system-deps`)"
    missing = [o for o in ("--unshare-all", "--die-with-parent", "--as-pid-1", "--cap-add", "--remount-ro")
               if o not in options]  # fmt: skip
    if missing:
        return f"the installed bwrap lacks {', '.join(missing)} (bubblewrap >= 0.4 is needed)"
    if _BWRAP_WORKDIR in host.read_paths():  # below it is fine: bound read-only into the private tmpfs
        return (f"bwrap cannot show Python's files without all of the host's {_BWRAP_WORKDIR}: the "
                f"interpreter's directory or a prefix of it is {_BWRAP_WORKDIR} itself")  # fmt: skip
    try:
        res = _run("print('ok')", SandboxLimits(timeout_s=30), "bwrap")
    except OSError as e:
        return f"bwrap could not be started ({e})"
    if res.stdout != "ok\n":
        return f"bwrap failed here: {(res.stderr.strip() or res.detail)[-300:]}"
    return None


def fallback_gaps(protections: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """What the ``rlimit`` backend does not contain on this machine (``protections`` of one of its runs)."""
    have = set(protections if protections is not None else _rlimit_protections())
    gaps = ["no mount view: the host's directory tree stays visible (names and metadata)",
            "no PID namespace: host processes keep their pids (their /proc files are unreadable only under "
            "Landlock)"]  # fmt: skip
    if "fs:landlock-read" not in have:
        gaps.append("reads are not confined: the program can read every file the trainer's user can read")
    if "fs:landlock" not in have:
        gaps.append("writes outside the working directory are refused only by the audit hook, which a "
                    "program can disable")  # fmt: skip
    if "fs:tmpfs" not in have:
        gaps.append(f"disk bytes and files are checked every {_DISK_CHECK_S:g} s, not kernel-enforced, "
                    "and the host work dir outlives a killed trainer until the next start")  # fmt: skip
    if "net:namespace" not in have:
        gaps.append("no network namespace (sockets are still refused by seccomp where it is active)")
    if "proc:seccomp" not in have:
        gaps.append("no seccomp filter (not x86-64): process creation, chmod and sockets are refused only by "
                    "the audit hook")  # fmt: skip
    if "proc:no-threads" in have:
        gaps.append("no thread counter (root without a writable pids cgroup): threads are refused altogether")
    return tuple(gaps)


@lru_cache(maxsize=1)
def _rlimit_protections() -> tuple[str, ...]:
    return _run("pass", SandboxLimits(timeout_s=30), "rlimit").protections


@lru_cache(maxsize=1)
def _warn_fallback(problem: str) -> None:
    log.warning(
        "python sandbox: %s; using the rlimit fallback, which lacks: %s", problem, "; ".join(fallback_gaps())
    )


def _child_env(workdir: str) -> dict[str, str]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}
    env.update(LC_ALL="C.UTF-8", PYTHONHASHSEED="0", PYTHONIOENCODING="utf-8", PYTHONUNBUFFERED="1")
    env.update(PYTHONDONTWRITEBYTECODE="1", MALLOC_ARENA_MAX="2", MPLBACKEND="Agg", MPLCONFIGDIR=workdir)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        env[var] = "1"
    return env


# ---------------------------------------------------------------- parent side


def _communicate(
    proc: subprocess.Popen, data: bytes, deadline: float, cap: int, over_disk: Callable[[], bool] | None
) -> tuple[bytes, bytes, str | None]:
    """Feed ``data`` to stdin and read stdout/stderr until both end; or stop early with a reason.

    Reasons: ``timeout`` (past ``deadline``), ``output`` (one stream over ``cap``
    bytes), ``disk`` (``over_disk()``, checked every ``_DISK_CHECK_S``).
    """
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    sel = selectors.DefaultSelector()
    for f in bufs:
        sel.register(f, selectors.EVENT_READ)
    pending = memoryview(data)
    os.set_blocking(proc.stdin.fileno(), False)
    sel.register(proc.stdin, selectors.EVENT_WRITE)
    reason, next_check = None, time.monotonic() + _DISK_CHECK_S
    try:
        while reason is None and any(f in bufs for f in (k.fileobj for k in sel.get_map().values())):
            now = time.monotonic()
            if now >= deadline:
                reason = "timeout"
                break
            if over_disk is not None and now >= next_check:
                next_check = now + _DISK_CHECK_S
                if over_disk():
                    reason = "disk"
                    break
            wait = min(deadline, next_check) - now if over_disk is not None else deadline - now
            for key, _ in sel.select(max(wait, 0.0)):
                f = key.fileobj
                if f is proc.stdin:
                    try:
                        pending = pending[os.write(f.fileno(), pending[:65536]) :]
                    except BlockingIOError:
                        continue
                    except OSError:  # the child is gone or closed stdin
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(f)
                        f.close()
                    continue
                chunk = os.read(f.fileno(), 65536)
                if not chunk:
                    sel.unregister(f)
                    continue
                bufs[f] += chunk
                if len(bufs[f]) > cap:
                    reason = "output"
                    break
    finally:
        sel.close()
        for f in (proc.stdin, *bufs):
            with contextlib.suppress(OSError):
                f.close()
    return bytes(bufs[proc.stdout]), bytes(bufs[proc.stderr]), reason


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _reap(proc: subprocess.Popen, deadline: float, *, kill_now: bool) -> tuple[bool, float]:
    """Kill the process group (when ``kill_now`` or past the deadline), wait, reap; return (timed out, CPU s).

    The group is killed while the leader is still an unreaped zombie, so its id
    cannot have been reused by an unrelated process.
    """
    timed_out = False
    if kill_now and proc.returncode is None and _alive(proc.pid):
        _killpg(proc.pid)
    delay = 0.001
    while _alive(proc.pid):
        if time.monotonic() >= deadline and not timed_out:
            timed_out = True
            _killpg(proc.pid)
        time.sleep(delay)
        delay = min(0.02, delay * 2)
    _killpg(proc.pid)  # stragglers that left stdout open or were started in the background
    try:
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        return timed_out, usage.ru_utime + usage.ru_stime
    except ChildProcessError:  # reaped elsewhere
        proc.wait()
        return timed_out, 0.0


def _alive(pid: int) -> bool:
    """Whether child ``pid`` has not exited yet (does not reap it)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None
    except ChildProcessError:
        return False


def _classify(rc: int | None, stdout: str, stderr: str, reason: str | None, timed_out: bool, cpu: float,
              lim: SandboxLimits, pid1: bool = False) -> tuple[str, str]:  # fmt: skip
    """(status, detail) of a finished run.

    A CPU limit is SIGXCPU (the soft limit), or SIGKILL that the parent did not
    send: under bwrap (``pid1``) the program is pid 1 of its PID namespace, which
    ignores SIGXCPU and cannot be sent SIGKILL from inside, so that is the hard
    limit (soft = hard there); under ``rlimit`` a program that ignored SIGXCPU is
    killed at ``cpu_s + 1``, recognised by at least half of ``cpu_s`` of CPU (the
    kernel's rlimit clock runs up to ~30 % ahead of the one ``wait4`` reports).
    """
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    if reason == "output" or len(stdout) > lim.max_output_chars:
        stopped = "; the program was stopped" if reason == "output" else ""
        return "output_limit", f"the output exceeded {lim.max_output_chars} characters and was cut{stopped}"
    if timed_out or reason == "timeout":
        return "timeout", f"the program exceeded the {lim.timeout_s:g} s wall-clock limit and was stopped"
    disk = f"the working directory is limited to {lim.max_disk_mb} MB and {lim.max_files} files"
    if reason == "disk":
        return "disk_limit", f"{disk}; the program was stopped"
    if rc == -signal.SIGXCPU or (rc == -signal.SIGKILL and (pid1 or cpu >= 0.5 * lim.cpu_s)):
        return "cpu_limit", f"the program exceeded the {lim.cpu_s} s CPU time limit and was stopped"
    if rc == -signal.SIGXFSZ or (rc and "File too large" in last):
        return "file_limit", f"a file grew past the {lim.max_file_mb} MB size limit"
    if rc and ("No space left on device" in last or "Disk quota exceeded" in last):
        return "disk_limit", disk
    if rc is not None and rc < 0:
        name = {int(s): s.name for s in signal.Signals}.get(-rc, str(-rc))
        return "crashed", f"the program was killed by signal {name}"
    if rc and last.startswith("MemoryError"):
        return "memory_limit", f"the program ran out of memory (limit {lim.memory_mb} MB)"
    if rc and "can't start new thread" in last:
        return "process_limit", f"the program may run at most {lim.max_procs} threads besides the main one"
    if rc and (
        last.startswith("PermissionError") or "Operation not permitted" in last or "sandbox: " in last
    ):
        return "blocked", f"the sandbox refused an operation ({last})"
    if rc:
        return "error", f"the program exited with code {rc}" + (f" ({last})" if last else "")
    return "ok", ""
