"""Host side of the python sandbox: what the program may read, bubblewrap, pids cgroups, work dirs.

Everything here runs in the trainer's process (the child side is
:mod:`horizonrl.envs.sandbox.child`):

- :func:`read_paths`: the directories and files Python needs (system libraries, the
  interpreter prefix, its stdlib and site-packages, the child launcher). bubblewrap
  binds exactly these read-only; the ``rlimit`` backend gives them to Landlock.
- :func:`bwrap_argv`: the bubblewrap command line (all namespaces, read-only root
  and ``/dev``, a private ``/tmp``). Read paths below ``/tmp`` (a venv or an
  interpreter installed there) are bound read-only on top of that private ``/tmp``
  (:func:`tmp_read_paths`), and bound again by the child over its capped tmpfs;
  nothing else of the host's ``/tmp`` is shown.
- pids cgroups (:func:`new_cgroup`): a per-run cgroup whose ``pids.max`` caps the
  run's threads and processes, where a writable cgroup v1 ``pids`` hierarchy or a
  v2 cgroup with the ``pids`` controller delegated exists (usually: root).
- working directories (:func:`make_workdir`) and cgroups are named after their
  owner's pid and start time, so :func:`remove_stale` can delete those of trainers
  that were killed (called once per process and temporary directory).
- :func:`disk_usage`: bytes and files under a directory, stopping at a cap; the
  ``rlimit`` backend's periodic disk check where no private tmpfs could be mounted.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from functools import lru_cache

PREFIX = "horizonrl-sandbox-"
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.py")  # the launcher (sandbox.child)
BWRAP_CHILD = "/.horizonrl/sandbox_child.py"  # where bwrap shows the launcher (wherever the package lives)
BWRAP_WORKDIR = "/tmp"  # the program's working directory under bwrap: a private tmpfs
_SYSTEM = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc/ld.so.cache",
    "/etc/localtime",
)
_counter = itertools.count()


# ---------------------------------------------------------------- what the program may read


@lru_cache(maxsize=4)
def read_paths(python: str = sys.executable) -> tuple[str, ...]:
    """System library dirs, the interpreter's prefixes and site-packages; outermost only."""
    extra = [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(python))]
    packages = ("site-packages", "dist-packages")
    extra += [p for p in sys.path if p and os.path.isdir(p) and os.path.basename(p) in packages]
    paths = [p for p in _SYSTEM if os.path.lexists(p)] + [os.path.realpath(p) for p in extra]
    out: list[str] = []
    for p in sorted(set(paths), key=len):
        if not any(p == b or p.startswith(b.rstrip("/") + "/") for b in out):
            out.append(p)
    return tuple(out)


def tmp_read_paths(paths: tuple[str, ...]) -> tuple[str, ...]:
    """Those of ``paths`` strictly below ``BWRAP_WORKDIR``: bound read-only over the sandbox's tmpfs."""
    return tuple(p for p in paths if p.startswith(BWRAP_WORKDIR + "/"))


# ---------------------------------------------------------------- bubblewrap


def bwrap_argv(paths: tuple[str, ...], tmp_bytes: int, *, root: bool, size_option: bool = True) -> list[str]:
    """The bubblewrap prefix: every namespace unshared, ``paths`` read-only, a private ``/tmp``, cwd ``/tmp``.

    ``paths`` below ``/tmp`` (:func:`tmp_read_paths`: a venv or interpreter installed
    there) are bound after the private ``/tmp`` is mounted, so they sit read-only on
    top of it (bwrap makes their parent directories in the tmpfs; nothing else of the
    host's ``/tmp`` is shown); ``/tmp`` itself raises ValueError, as binding it would
    show all of the host's ``/tmp``. The launcher is shown at ``BWRAP_CHILD``.
    The program runs as pid 1 of its PID namespace (``--as-pid-1``, so its CPU time
    reaches the parent's ``wait4``), dies with bwrap and with bwrap's parent
    (``--die-with-parent``), and keeps CAP_SYS_ADMIN *of its own user namespace* only
    until the child launcher has mounted its capped tmpfs (and bound ``paths`` below
    ``/tmp`` read-only again on top of it); root additionally drops every other
    capability. ``/`` and ``/dev`` are remounted read-only, so the only writable place
    is ``/tmp`` (``--size tmp_bytes`` where supported) outside those read-only binds.
    """
    if BWRAP_WORKDIR in paths:
        raise ValueError(f"{BWRAP_WORKDIR} itself cannot be bound read-only: it is the private tmpfs")
    over_tmp = tmp_read_paths(paths)
    argv = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--as-pid-1"]
    argv += (["--cap-drop", "ALL"] if root else []) + ["--cap-add", "CAP_SYS_ADMIN"]

    def show(p: str) -> list[str]:
        return ["--symlink", os.readlink(p), p] if os.path.islink(p) else ["--ro-bind", p, p]

    for p in paths:
        argv += [] if p in over_tmp else show(p)
    argv += ["--ro-bind", CHILD, BWRAP_CHILD]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += (["--size", str(tmp_bytes)] if size_option else []) + ["--tmpfs", BWRAP_WORKDIR]
    for p in over_tmp:
        argv += show(p)
    return [*argv, "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", BWRAP_WORKDIR, "--"]


@lru_cache(maxsize=1)
def bwrap_options() -> tuple[str | None, frozenset[str]]:
    """(path of ``bwrap`` or None, the options its ``--help`` lists)."""
    exe = shutil.which("bwrap")
    if exe is None:
        return None, frozenset()
    try:
        res = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=20)
    except (OSError, ValueError) as e:
        return None, frozenset([f"error: {e}"])
    words = (res.stdout + res.stderr).split()
    return exe, frozenset(w for w in words if w.startswith("--"))


# ---------------------------------------------------------------- owners, work dirs, stale leftovers


def owner_tag(pid: int | None = None) -> str | None:
    """``<pid>.<start time in clock ticks>`` of a live process (default: this one), None if it is gone."""
    pid = os.getpid() if pid is None else pid
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f"{pid}.{f.read().rsplit(')', 1)[1].split()[19]}"
    except (OSError, IndexError):
        return None


def make_workdir() -> str:
    """A fresh private (0700) directory in the temporary directory, named after this process."""
    return os.path.realpath(tempfile.mkdtemp(prefix=f"{PREFIX}{owner_tag()}-"))


def remove_tree(path: str) -> None:
    """Remove ``path`` even where the program made directories read-only."""

    def retry(func, p, _exc):
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o700)
            func(p)

    shutil.rmtree(path, onerror=retry)


def _dead_owner(name: str) -> bool:
    """Whether ``name`` (``PREFIX<pid>.<start>-...``) belongs to a process that no longer runs."""
    tag = name[len(PREFIX) :].split("-", 1)[0]
    pid, _, start = tag.partition(".")
    if not (pid.isdigit() and start.isdigit()):
        return False
    return owner_tag(int(pid)) != tag


def remove_stale(tmp: str | None = None) -> list[str]:
    """Delete work dirs (in ``tmp``, default the temporary directory) and pids cgroups of dead trainers.

    Returns the paths removed. Only entries owned by this uid and named after a process
    that is gone (pid and start time) are touched.
    """
    removed = []
    tmp = tmp or tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for entry in os.scandir(tmp):
            if entry.name.startswith(PREFIX) and _dead_owner(entry.name):
                with contextlib.suppress(OSError):
                    if (
                        entry.is_dir(follow_symlinks=False)
                        and entry.stat(follow_symlinks=False).st_uid == os.geteuid()
                    ):
                        remove_tree(entry.path)
                        removed.append(entry.path)
    parent = cgroup_parent()
    if parent is not None:
        with contextlib.suppress(OSError):
            for entry in os.scandir(parent):
                if entry.name.startswith(PREFIX) and _dead_owner(entry.name) and remove_cgroup(entry.path):
                    removed.append(entry.path)
    return removed


@lru_cache(maxsize=64)
def remove_stale_once(tmp: str, pid: int) -> None:
    """:func:`remove_stale` once per process (``pid``) and temporary directory."""
    remove_stale(tmp)


# ---------------------------------------------------------------- pids cgroups


def _cgroup_candidates() -> list[str]:
    """Directories of this process's cgroup in a v1 ``pids`` hierarchy and in the v2 hierarchy."""
    try:
        with open("/proc/self/cgroup") as f:
            own = [line.rstrip("\n").split(":", 2) for line in f]
        with open("/proc/self/mountinfo") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return []
    out = []
    for fields in mounts:
        sep = fields.index("-")
        root, point, fstype, opts = fields[3], fields[4], fields[sep + 1], fields[-1].split(",")
        if fstype == "cgroup" and "pids" in opts:
            paths = [p for _, ctl, p in own if "pids" in ctl.split(",")]
        elif fstype == "cgroup2":
            paths = [p for hid, ctl, p in own if hid == "0" and ctl == ""]
        else:
            continue
        for p in paths:
            if p == root or p.startswith(root.rstrip("/") + "/") or root == "/":
                rel = p[len(root) :] if root != "/" else p
                out.append(os.path.join(point, rel.lstrip("/")).rstrip("/") or "/")
    return out


@lru_cache(maxsize=1)
def cgroup_parent() -> str | None:
    """Where this process may create pids cgroups (probed once: create, limit, remove), or None."""
    for base in _cgroup_candidates():
        if not os.path.exists(os.path.join(base, "cgroup.procs")):
            continue
        if os.path.exists(os.path.join(base, "cgroup.subtree_control")):  # v2: pids must be delegated
            with contextlib.suppress(OSError), open(os.path.join(base, "cgroup.subtree_control")) as f:
                if "pids" not in f.read().split():
                    continue
        probe = os.path.join(base, f"{PREFIX}{owner_tag()}-probe")
        try:
            os.mkdir(probe)
        except OSError:
            continue
        try:
            with open(os.path.join(probe, "pids.max"), "w") as f:
                f.write("4")
            return base
        except OSError:
            continue
        finally:
            with contextlib.suppress(OSError):
                os.rmdir(probe)
    return None


def new_cgroup(max_tasks: int) -> str | None:
    """A fresh pids cgroup with ``pids.max = max_tasks``, or None where none can be made."""
    parent = cgroup_parent()
    if parent is None:
        return None
    path = os.path.join(parent, f"{PREFIX}{owner_tag()}-{next(_counter)}")
    try:
        os.mkdir(path)
        with open(os.path.join(path, "pids.max"), "w") as f:
            f.write(str(max_tasks))
    except OSError:
        remove_cgroup(path)
        return None
    return path


def remove_cgroup(path: str, wait_s: float = 2.0) -> bool:
    """SIGKILL every process in cgroup ``path`` until it is empty, then remove it; False if it stays."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                pids = [int(x) for x in f.read().split()]
        except FileNotFoundError:
            return True
        except OSError:
            pids = []
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if not pids:
            try:
                os.rmdir(path)
                return True
            except FileNotFoundError:
                return True
            except OSError:
                pass  # its last tasks are still exiting
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)


# ---------------------------------------------------------------- disk usage


def disk_usage(path: str, max_bytes: int, max_files: int) -> tuple[int, int]:
    """(allocated bytes, entries) below ``path``, not following links; stops once either cap is exceeded."""
    total, files, stack = 0, 0, [path]
    while stack:
        try:
            it = os.scandir(stack.pop())
        except OSError:
            continue
        with it:
            for entry in it:
                files += 1
                with contextlib.suppress(OSError):
                    st = entry.stat(follow_symlinks=False)
                    total += st.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                if total > max_bytes or files > max_files:
                    return total, files
    return total, files
