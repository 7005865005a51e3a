"""Run untrusted Python in a separate, limited process: the sandbox of the ``python`` tool.

:func:`run_python` runs one program in a fresh process (nothing survives between
calls) with a private temporary working directory (removed afterwards), a scrubbed
environment, ``python -s -P -B`` (``-I`` without ``-E``, so a fixed
``PYTHONHASHSEED`` keeps output deterministic), a wall-clock limit (its whole
process group is killed on timeout and after it exits) and capped output. Before
the program runs, the child sets rlimits (CPU, memory, file size, open files, and
the process count for non-root users), enters an empty network namespace, applies
Landlock (no writes outside the working directory, no TCP, no signals out), drops
capabilities (root), installs a seccomp filter (x86-64: no fork/exec, namespaces,
mounts, ptrace, ...) and a best-effort audit hook with readable errors. Backend
``bwrap`` (bubblewrap, when installed and working) adds user/PID/IPC/UTS/network/
mount namespaces that see only the system and Python directories, read-only;
``rlimit`` is the fallback. :func:`sandbox_backend` says which is active, and each
result lists the layers actually established, since they depend on the kernel
(``docs/envs/math_python.md``). Executed as a script this file is the child launcher.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from functools import lru_cache
from typing import Any

BACKENDS = ("bwrap", "rlimit")
STATUSES = ("ok", "error", "timeout", "cpu_limit", "memory_limit", "output_limit", "file_limit", "blocked",
            "crashed", "rejected")  # fmt: skip
_MARKER = "__horizonrl_sandbox__ "
_PROGRAM = ".horizonrl_program.py"
_LAUNCHER = os.path.abspath(__file__)
_BWRAP_BASE = ("bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--proc", "/proc", "--dev",
               "/dev", "--tmpfs", "/tmp")  # fmt: skip
_LIMIT_BOUNDS = {
    "cpu_s": (1, 600), "memory_mb": (32, 1 << 20), "max_output_chars": (1, 10**7), "max_file_mb": (1, 4096),
    "max_procs": (1, 4096), "max_code_chars": (1, 10**7),
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run; the constructor raises ValueError naming any bad value."""

    timeout_s: float = 10.0
    cpu_s: int = 5
    memory_mb: int = 512
    max_output_chars: int = 4000
    max_file_mb: int = 16
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
    ``protections`` lists the layers that were active in the child (empty when it
    died before reporting); ``pid`` (the process group that was killed) and
    ``workdir`` (already removed) are recorded for inspection.
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
    ``max_file_mb``, ``max_procs``, ``max_code_chars``); ``backend`` defaults to
    :func:`sandbox_backend`. Never raises for anything the program does; when it
    returns, the process group is dead and the working directory removed. Raises
    ValueError naming a bad or unknown limit or backend, RuntimeError if ``bwrap``
    is required but unusable.
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
    start = time.monotonic()
    workdir = os.path.realpath(tempfile.mkdtemp(prefix="horizonrl-sandbox-"))
    try:
        cfg = {"workdir": workdir, "netns": backend == "rlimit", **dataclasses.asdict(limits)}
        argv = [sys.executable, "-s", "-P", "-B", _LAUNCHER, json.dumps(cfg)]
        if backend == "bwrap":
            argv = bwrap_argv(workdir, sys.executable) + argv
        with open(os.path.join(workdir, _PROGRAM), "w", encoding="utf-8", errors="replace") as f:
            f.write(code)  # the child reads and deletes it before anything else
        pipe, env = subprocess.PIPE, _child_env(workdir)
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=pipe,
            stderr=pipe,
            cwd=workdir,
            env=env,
            start_new_session=True,
        )
        deadline, reason = start + limits.timeout_s, "error"
        try:
            out, err, reason = _communicate(proc, deadline, 4 * limits.max_output_chars + 4096)
        finally:
            timed_out, cpu = _reap(proc, deadline, kill_now=reason is not None)
        protections: tuple[str, ...] = ()
        if err.startswith(_MARKER.encode()):
            line, _, err = err.partition(b"\n")
            protections = tuple(json.loads(line[len(_MARKER) :]))
        n = limits.max_output_chars
        stdout, stderr = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
        truncated = len(stdout) > n or len(stderr) > n or reason == "output"
        status, detail = _classify(proc.returncode, stdout, stderr, reason, timed_out, cpu, limits)
        stdout, stderr, wall = stdout[:n], stderr[max(0, len(stderr) - n) :], time.monotonic() - start
        rc = proc.returncode
        return SandboxResult(
            status, stdout, stderr, rc, detail, backend, protections, wall, cpu, truncated, proc.pid, workdir
        )
    finally:
        _remove_tree(workdir)


# ---------------------------------------------------------------- backends


def sandbox_backend(prefer: str | None = None) -> str:
    """The backend a run uses: ``bwrap`` when bubblewrap is installed and works, else ``rlimit``.

    ``prefer`` may be ``auto`` (or None: then ``HORIZONRL_SANDBOX`` decides, default
    ``auto``), ``bwrap`` or ``rlimit``; ValueError names any other value,
    RuntimeError says why ``bwrap`` is unusable when it is required.
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
    return "rlimit"


@lru_cache(maxsize=1)
def bwrap_problem() -> str | None:
    """None when bubblewrap runs here, else why not (probed once per process)."""
    exe = shutil.which("bwrap")
    if exe is None:
        return "bwrap is not installed (install the 'bubblewrap' package)"
    probe = [exe, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"]
    try:
        res = subprocess.run(probe, capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bwrap could not be started ({e})"
    if res.returncode != 0:
        return f"bwrap failed here: {res.stderr.decode(errors='replace').strip()[:200]}"
    return None


def bwrap_argv(workdir: str, python: str) -> list[str]:
    """The bubblewrap prefix: namespaces unshared, system and Python dirs read-only, ``workdir`` writable."""
    argv = [*_BWRAP_BASE, "--cap-drop", "ALL"] if os.geteuid() == 0 else list(_BWRAP_BASE)
    roots = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc/ld.so.cache", "/etc/alternatives"]
    extra = [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(python))]
    extra += [_LAUNCHER] + [p for p in sys.path if p and os.path.isdir(p) and "site-packages" in p]
    bound: list[str] = []
    for p in roots + [os.path.realpath(p) for p in extra]:
        if not os.path.lexists(p) or any(p == b or p.startswith(b.rstrip("/") + "/") for b in bound):
            continue
        bound.append(p)
        argv += ["--symlink", os.readlink(p), p] if os.path.islink(p) else ["--ro-bind", p, p]
    return [*argv, "--bind", workdir, workdir, "--chdir", workdir, "--"]


def _child_env(workdir: str) -> dict[str, str]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}
    env.update(LC_ALL="C.UTF-8", PYTHONHASHSEED="0", PYTHONIOENCODING="utf-8", PYTHONUNBUFFERED="1")
    env.update(PYTHONDONTWRITEBYTECODE="1", MALLOC_ARENA_MAX="2", MPLBACKEND="Agg", MPLCONFIGDIR=workdir)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        env[var] = "1"
    return env


# ---------------------------------------------------------------- parent side


def _communicate(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[bytes, bytes, str | None]:
    """Read stdout/stderr until both end, the deadline passes (``timeout``) or one exceeds ``cap`` bytes."""
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    sel = selectors.DefaultSelector()
    for f in bufs:
        sel.register(f, selectors.EVENT_READ)
    reason = None
    try:
        while sel.get_map() and reason is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                reason = "timeout"
                break
            for key, _ in sel.select(remaining):
                f = key.fileobj
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
        for f in bufs:
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
              lim: SandboxLimits) -> tuple[str, str]:  # fmt: skip
    """(status, detail) of a finished run."""
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    if reason == "output" or len(stdout) > lim.max_output_chars:
        stopped = "; the program was stopped" if reason == "output" else ""
        return "output_limit", f"the output exceeded {lim.max_output_chars} characters and was cut{stopped}"
    if timed_out or reason == "timeout":
        return "timeout", f"the program exceeded the {lim.timeout_s:g} s wall-clock limit and was stopped"
    if rc == -signal.SIGXCPU or (rc == -signal.SIGKILL and cpu >= lim.cpu_s):  # soft, hard RLIMIT_CPU
        return "cpu_limit", f"the program exceeded the {lim.cpu_s} s CPU time limit and was stopped"
    if rc == -signal.SIGXFSZ or (rc and "File too large" in last):
        return "file_limit", f"a file grew past the {lim.max_file_mb} MB size limit"
    if rc is not None and rc < 0:
        name = {int(s): s.name for s in signal.Signals}.get(-rc, str(-rc))
        return "crashed", f"the program was killed by signal {name}"
    if rc and last.startswith("MemoryError"):
        return "memory_limit", f"the program ran out of memory (limit {lim.memory_mb} MB)"
    if rc and (
        last.startswith("PermissionError") or "Operation not permitted" in last or "sandbox: " in last
    ):
        return "blocked", f"the sandbox refused an operation ({last})"
    if rc:
        return "error", f"the program exited with code {rc}" + (f" ({last})" if last else "")
    return "ok", ""


def _remove_tree(path: str) -> None:
    """Remove ``path`` even where the program made directories read-only."""

    def retry(func, p, _exc):
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o700)
            func(p)

    shutil.rmtree(path, onerror=retry)


# ---------------------------------------------------------------- child side (runs in the sandboxed process)

_CLONE_NEWNET, _CLONE_NEWUSER, _CLONE_THREAD = 0x40000000, 0x10000000, 0x00010000
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
# x86-64 syscalls a sandboxed program never needs: process creation, namespaces and mounts, tracing and other
# processes' memory, kernel modules/bpf/perf/keyrings, io_uring (bypasses seccomp), host clock and name, ...
_DENY_X86_64 = (
    57, 58, 59, 322,  # fork vfork execve execveat
    101, 310, 311, 312, 424, 438,  # ptrace process_vm_readv/writev kcmp pidfd_send_signal pidfd_getfd
    165, 166, 155, 161, 272, 308, 428, 429, 430, 431, 432, 433, 442,  # mount ... chroot unshare setns
    175, 313, 176, 246, 320, 169, 167, 168, 163, 103,  # modules, kexec, reboot, swap, acct, syslog
    164, 227, 159, 305, 170, 171, 172, 173, 179,  # clocks, host/domain name, iopl/ioperm, quotactl
    321, 298, 323, 250, 248, 249, 303, 304, 135, 212,  # bpf perf userfaultfd keys handles personality
    425, 426, 427, 133, 259, 200,  # io_uring mknod mknodat tkill
)  # fmt: skip
_SELF_SIGNAL_X86_64 = (62, 234, 129, 297)  # kill tgkill rt_sigqueueinfo rt_tgsigqueueinfo: own pid only
# Audit events refused outright, and events whose path arguments must stay inside the working directory:
# event -> ((path argument index, dir_fd argument index or None), ...)
_AUDIT_DENY = frozenset((
    "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen",
    "os.killpg", "pty.spawn", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.call_function", "ctypes.cdata",
    "resource.setrlimit", "resource.prlimit",
))  # fmt: skip
_AUDIT_PATHS = {
    "os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),), "os.rename": ((0, 2), (1, 3)),
    "os.link": ((0, 2), (1, 3)), "os.symlink": ((1, 2),), "os.chmod": ((0, 2),), "os.chown": ((0, 3),),
    "os.truncate": ((0, None),), "os.utime": ((0, 3),), "os.setxattr": ((0, None),),
    "os.removexattr": ((0, None),), "shutil.rmtree": ((0, 1),), "sqlite3.connect": ((0, None),),
}  # fmt: skip


def _child_main(cfg_json: str) -> None:
    """Set up every protection that this kernel allows, report them on stderr, then run the program."""
    import ctypes

    cfg = json.loads(cfg_json)
    with open(_PROGRAM, encoding="utf-8") as f:
        code = f.read()
    os.unlink(_PROGRAM)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    active = ["process"]
    if cfg["netns"] and _unshare_net(libc):
        active.append("net:namespace")
    active += _set_rlimits(cfg)
    _ccall(libc.prctl, 38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: required by Landlock and seccomp
    active += _landlock(libc, cfg["workdir"])
    active += ["caps:dropped"] if os.geteuid() == 0 and _drop_capabilities(libc) else []
    active += ["proc:seccomp"] if _seccomp(libc) else []
    _install_audit_hook(cfg["workdir"])
    active += ["proc:audit", "net:audit", "fs:audit"]
    sys.stderr.write(_MARKER + json.dumps(active) + "\n")
    sys.stderr.flush()
    _exec_program(code)


def _ccall(fn, *args):
    """Call a variadic C function (syscall, prctl) with its integer arguments widened to ``long``."""
    import ctypes

    return fn(*(ctypes.c_long(a) if isinstance(a, int) else a for a in args))


def _unshare_net(libc) -> bool:
    """Move into a new (empty) network namespace; as non-root inside a new user namespace."""
    if libc.unshare(_CLONE_NEWNET) == 0:
        return True
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
        return False
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with contextlib.suppress(OSError), open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    return True


def _set_rlimits(cfg: dict) -> list[str]:
    """Lower the soft and hard limits (never above the current hard ones); return the names of those set."""
    import resource as r

    mem, fsize = cfg["memory_mb"] << 20, cfg["max_file_mb"] << 20
    wanted = {
        "cpu": (r.RLIMIT_CPU, cfg["cpu_s"], cfg["cpu_s"] + 1), "as": (r.RLIMIT_AS, mem, mem),
        "fsize": (r.RLIMIT_FSIZE, fsize, fsize), "core": (r.RLIMIT_CORE, 0, 0),
        "nofile": (r.RLIMIT_NOFILE, 256, 256),
    }  # fmt: skip
    if os.geteuid() != 0:  # root is exempt from RLIMIT_NPROC; it counts every task of the user
        tasks = 0
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.stat(f"/proc/{pid}").st_uid == os.getuid():
                    tasks += len(os.listdir(f"/proc/{pid}/task"))
            except OSError:
                continue
        wanted["nproc"] = (r.RLIMIT_NPROC, tasks + cfg["max_procs"], tasks + cfg["max_procs"])
    active = []
    for name, (res, soft, hard) in wanted.items():
        cur_hard = r.getrlimit(res)[1]
        if cur_hard != r.RLIM_INFINITY:
            hard = min(hard, cur_hard)
            soft = min(soft, hard)
        with contextlib.suppress(ValueError, OSError):
            r.setrlimit(res, (soft, hard))
            active.append(f"rlimit:{name}")
    return active


def _landlock(libc, workdir: str) -> list[str]:
    """Deny writes outside ``workdir`` (and TCP, signals to others on newer kernels) with Landlock."""
    import struct

    # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) returns the ABI version
    abi = _ccall(libc.syscall, 444, None, 0, 1)
    if abi < 1:
        return []
    write_fs = 0b1_1111_1111_0010  # WRITE_FILE REMOVE_DIR REMOVE_FILE MAKE_{CHAR,DIR,REG,SOCK,FIFO,BLOCK,SYM}
    write_fs |= (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0)  # REFER TRUNCATE
    net = 0b11 if abi >= 4 else 0  # BIND_TCP CONNECT_TCP
    scoped = 0b11 if abi >= 6 else 0  # ABSTRACT_UNIX_SOCKET SIGNAL
    attr = struct.pack("<QQQ", write_fs, net, scoped)[: 8 if abi < 4 else 16 if abi < 6 else 24]
    ruleset = _ccall(libc.syscall, 444, attr, len(attr), 0)
    if ruleset < 0:
        return []
    try:
        for path, access in ((workdir, write_fs), (os.devnull, write_fs & (1 << 1 | 1 << 14))):
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = struct.pack("<Qi", access, fd)  # struct landlock_path_beneath_attr
                _ccall(libc.syscall, 445, ruleset, 1, rule, 0)  # LANDLOCK_RULE_PATH_BENEATH
            finally:
                os.close(fd)
        if _ccall(libc.syscall, 446, ruleset, 0) != 0:
            return []
    finally:
        os.close(ruleset)
    return ["fs:landlock"] + (["net:landlock"] if net else []) + (["signal:landlock"] if scoped else [])


def _drop_capabilities(libc) -> bool:
    """Clear the effective, permitted and inheritable capabilities (root keeps its uid, loses its powers)."""
    import ctypes

    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()
    return libc.capset(header, data) == 0


def _seccomp(libc) -> bool:
    """Install the x86-64 seccomp filter (see ``_DENY_X86_64``); False on other architectures or failure."""
    import ctypes
    import struct

    if os.uname().machine != "x86_64":
        return False
    ld, jeq, jset, jge, ret = 0x20, 0x15, 0x45, 0x35, 0x06
    allow, eperm, enosys = 0x7FFF0000, 0x00050001, 0x00050026

    def ins(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
        return struct.pack("<HBBI", code, jt, jf, k)

    prog = [ins(ld, 4), ins(jeq, 0xC000003E, 1, 0), ins(ret, 0x80000000), ins(ld, 0)]  # arch check, nr
    prog += [ins(jge, 0x40000000, 0, 1), ins(ret, eperm)]  # the x32 ABI
    for nr in _DENY_X86_64:
        prog += [ins(jeq, nr, 0, 1), ins(ret, eperm)]
    prog += [ins(jeq, 435, 0, 1), ins(ret, enosys)]  # clone3: glibc falls back to clone for threads
    # clone: only threads (CLONE_THREAD in the flags, the low word of argument 0 at offset 16)
    prog += [
        ins(jeq, 56, 0, 4),
        ins(ld, 16),
        ins(jset, _CLONE_THREAD, 0, 1),
        ins(ret, allow),
        ins(ret, eperm),
    ]
    for nr in _SELF_SIGNAL_X86_64:  # signals only to this process
        prog += [
            ins(jeq, nr, 0, 4),
            ins(ld, 16),
            ins(jeq, os.getpid(), 0, 1),
            ins(ret, allow),
            ins(ret, eperm),
        ]
    prog.append(ins(ret, allow))

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    fprog = Fprog(len(prog), b"".join(prog))
    return _ccall(libc.prctl, 22, 2, ctypes.byref(fprog), 0, 0) == 0  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER


def _install_audit_hook(workdir: str) -> None:
    """Refuse process creation, sockets (except local pairs), ctypes calls and writes outside ``workdir``."""
    root, me = os.path.realpath(workdir), os.getpid()

    def inside(path, dir_fd=None) -> bool:
        try:
            if isinstance(path, int):
                full = os.readlink(f"/proc/self/fd/{path}")
            else:
                p = os.fsdecode(path)
                rel = isinstance(dir_fd, int) and dir_fd >= 0 and not os.path.isabs(p)
                base = os.readlink(f"/proc/self/fd/{dir_fd}") if rel else os.getcwd()
                full = os.path.realpath(os.path.join(base, p))
        except (OSError, TypeError, ValueError):
            return False
        return full == root or full.startswith(root + os.sep)

    def hook(event: str, args: tuple) -> None:
        if event in _AUDIT_DENY:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event.startswith("socket."):
            if event != "socket.__new__" or args[1] != 1:  # AF_UNIX sockets exist only as connected pairs
                raise PermissionError("sandbox: network access is disabled")
        elif event == "os.kill" and args[0] != me:
            raise PermissionError("sandbox: signals to other processes are not allowed")
        elif event == "open":
            path, mode, flags = args
            writes = any(c in mode for c in "wax+") if isinstance(mode, str) else (flags or 0) & _WRITE_FLAGS
            if writes and path is not None and not isinstance(path, int) and not inside(path):
                raise PermissionError(f"sandbox: writing {path!r} outside the working directory is refused")
        elif event in _AUDIT_PATHS:
            for i, d in _AUDIT_PATHS[event]:
                if not inside(args[i], args[d] if d is not None else None):
                    raise PermissionError(f"sandbox: {event} on {args[i]!r} outside the working directory")

    sys.addaudithook(hook)


def _exec_program(code: str) -> None:
    """Run ``code`` as ``__main__``; on an exception print its traceback (minus sandbox frames) and exit 1."""
    import linecache
    import traceback
    import types

    linecache.cache["<python>"] = (len(code), None, code.splitlines(True), "<python>")
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    sys.argv = ["<python>"]
    try:
        exec(compile(code, "<python>", "exec"), main.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:
        main.__dict__.clear()  # release what the program allocated before formatting the traceback
        te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
        te.stack = traceback.StackSummary.from_list([f for f in te.stack if f.filename != _LAUNCHER])
        sys.stderr.write("".join(te.format()))
        sys.exit(1)


if __name__ == "__main__":
    _child_main(sys.argv[1])
