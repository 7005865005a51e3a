"""Fixtures and probes shared by the sandbox tests (read from /proc, independent of the sandbox code)."""

from __future__ import annotations

import os
import tempfile

import pytest

from horizonrl.envs.sandbox import bwrap_problem
from horizonrl.envs.sandbox import host as sandbox_host

BACKENDS = ["rlimit"] + ([] if bwrap_problem() else ["bwrap"])
BWRAP_ONLY = pytest.mark.skipif(
    bool(bwrap_problem()), reason=f"bubblewrap is not usable here: {bwrap_problem()}"
)


@pytest.fixture(name="backend", params=BACKENDS)
def backend_fixture(request) -> str:
    """Each usable backend in turn (import this into a test module to use the ``backend`` fixture)."""
    return request.param


@pytest.fixture(name="sandbox_root", autouse=True)
def sandbox_root_fixture(tmp_path, monkeypatch):
    """Route the sandbox's temporary directories into a private folder that must be empty afterwards."""
    root = tmp_path / "sandbox-root"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    before, cgroups = children(), leftover_cgroups()
    yield root
    assert list(root.iterdir()) == [], "a sandbox working directory was left behind"
    assert children() <= before, "a sandboxed process was left running"
    assert leftover_cgroups() <= cgroups, "a sandbox cgroup was left behind"


def bound_under_tmp(paths: tuple[str, ...] | None = None) -> set[str]:
    """What a bwrap sandbox's /tmp holds besides the program's files, relative to /tmp.

    The directories down to each read path below /tmp (a venv or an interpreter that lives there) and the
    path itself; ``paths`` defaults to this interpreter's read paths.
    """
    out = set()
    for p in sandbox_host.read_paths() if paths is None else paths:
        if p.startswith("/tmp/"):
            parts = p[len("/tmp/") :].split("/")
            out |= {"/".join(parts[: i + 1]) for i in range(len(parts))}
    return out


def children(parent: int | None = None) -> set[int]:
    """Pids whose parent is ``parent`` (default: this test process)."""
    me, out = str(os.getpid() if parent is None else parent), set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[1] == me:
            out.add(int(pid))
    return out


def descendants(pid: int) -> set[int]:
    out, todo = set(), [pid]
    while todo:
        kids = children(todo.pop())
        out |= kids
        todo += kids
    return out


def running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def group_is_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def leftover_cgroups() -> set[str]:
    """This process's sandbox cgroups (another pytest-xdist worker's are its own business)."""
    parent = sandbox_host.cgroup_parent()
    if parent is None:
        return set()
    mine = sandbox_host.PREFIX + sandbox_host.owner_tag()
    return {e for e in os.listdir(parent) if e.startswith(mine)}
