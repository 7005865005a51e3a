"""The python sandbox: normal runs, limits, settings, backends (hostile programs: test_sandbox.py)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import threading

import pytest

from helpers.sandbox_probes import (  # noqa: F401 (fixtures)
    BWRAP_ONLY,
    backend_fixture,
    bound_under_tmp,
    group_is_gone,
    sandbox_root_fixture,
)
from horizonrl.envs.sandbox import (
    STATUSES,
    SandboxLimits,
    bwrap_argv,
    bwrap_problem,
    fallback_gaps,
    run_python,
    sandbox_backend,
)
from horizonrl.envs.sandbox import host as sandbox_host
from horizonrl.envs.sandbox import runner as sandbox

INSTALL_PROBLEMS = ("bwrap is not installed", "the installed bwrap lacks")

# ---------------------------------------------------------------- normal runs


def test_runs_a_program_in_a_private_scrubbed_directory(backend, monkeypatch):
    monkeypatch.setenv("HORIZONRL_TEST_SECRET", "s3cret")
    code = (
        "import os\nprint(sum(range(10)))\nprint(os.getcwd())\nprint(os.environ.get('HORIZONRL_TEST_SECRET'))"
    )
    res = run_python(code, backend=backend)
    assert res.ok and res.status == "ok" and res.exit_code == 0 and res.backend == backend
    total, cwd, secret = res.stdout.splitlines()
    assert total == "45" and secret == "None" and cwd == res.workdir
    assert res.observation() == res.stdout.rstrip("\n")
    assert group_is_gone(res.pid)
    if backend == "rlimit":
        assert os.path.dirname(res.workdir) == tempfile.gettempdir() and not os.path.exists(res.workdir)
    else:
        assert res.workdir == "/tmp"  # the sandbox's own tmpfs: it never existed on the host
    assert {"process", "rlimit:cpu", "rlimit:as", "rlimit:fsize", "proc:pdeathsig", "proc:audit"} <= set(
        res.protections
    )
    empty = run_python("x = 1", backend=backend)
    assert empty.ok and empty.observation() == "(no output)"


def test_writing_inside_the_working_directory_works(backend):
    code = (
        "import os, tempfile\nos.mkdir('d')\nwith open('d/a.txt', 'w') as f:\n    f.write('hi')\n"
        "os.rename('d/a.txt', 'b.txt')\nwith tempfile.NamedTemporaryFile() as t:\n    t.write(b'x')\n"
        "print(open('b.txt').read(), sorted(os.listdir('.')))"
    )
    res = run_python(code, backend=backend)
    assert res.ok, res.observation()
    # under bwrap, a Python that lives below /tmp shows (read-only) the directories down to it there
    shown = {p for p in bound_under_tmp() if "/" not in p} if backend == "bwrap" else set()
    assert res.stdout == f"hi {sorted({'b.txt', 'd'} | shown)}\n"


def test_large_programs_arrive_whole_on_stdin(backend):
    code = "x = [\n" + "    1,\n" * 30000 + "]\nprint(len(x))"  # ~200 kB: more than a pipe buffer
    res = run_python(code, backend=backend, max_code_chars=len(code))
    assert res.ok and res.stdout == "30000\n", res.observation()


def test_exception_is_an_error_with_the_programs_traceback(backend):
    res = run_python("print('partial')\nx = 1\n1 / 0", backend=backend)
    assert res.status == "error" and res.exit_code == 1 and not res.ok
    assert res.stdout == "partial\n"
    assert 'File "<python>", line 3' in res.stderr and res.stderr.rstrip().endswith("division by zero")
    assert "sandbox" not in res.stderr  # the launcher's own frames are hidden
    obs = res.observation()
    assert obs.startswith("Error: the program exited with code 1 (ZeroDivisionError") and "partial" in obs
    syntax = run_python("def (:", backend=backend)
    assert syntax.status == "error" and "SyntaxError" in syntax.stderr
    assert run_python("import sys\nsys.exit(3)", backend=backend).exit_code == 3


def test_hash_order_is_deterministic_with_pythonhashseed_zero(backend):
    code = "print(list({str(i) for i in range(60)}))"
    expected = subprocess.run(
        [sys.executable, "-c", code], env={"PYTHONHASHSEED": "0"}, capture_output=True, text=True, check=True
    ).stdout
    assert run_python(code, backend=backend).stdout == expected
    assert run_python(code, backend=backend).stdout == expected


def test_numpy_and_sympy_run_under_the_default_limits(backend):
    res = run_python(
        "import numpy as np, sympy\nprint(int(np.arange(10).sum()), sympy.sqrt(8))", backend=backend
    )
    assert res.ok and res.stdout == "45 2*sqrt(2)\n", res.observation()


def test_a_few_threads_are_allowed_where_they_can_be_counted(backend):
    code = "import threading\nout = []\n"
    code += "ts = [threading.Thread(target=out.append, args=(i,)) for i in range(4)]\n"
    code += "[t.start() for t in ts]\n[t.join() for t in ts]\nprint(sorted(out))"
    res = run_python(code, backend=backend)
    if "proc:no-threads" in res.protections:
        assert res.status == "process_limit"
    else:
        assert res.ok and res.stdout == "[0, 1, 2, 3]\n", res.observation()


def test_concurrent_runs_do_not_interfere():
    out: dict[int, str] = {}
    threads = [
        threading.Thread(target=lambda i=i: out.update({i: run_python(f"print({i} * {i})").stdout}))
        for i in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == {i: f"{i * i}\n" for i in range(4)}


# ---------------------------------------------------------------- limits


def test_sleeping_program_hits_the_wall_clock_limit_and_keeps_its_output(backend):
    res = run_python("import time\nprint('before', flush=True)\ntime.sleep(60)", timeout_s=1, backend=backend)
    assert res.status == "timeout" and res.stdout == "before\n"
    assert 1.0 <= res.wall_s < 10
    assert "1 s wall-clock limit" in res.observation() and group_is_gone(res.pid)


def test_program_that_closes_its_pipes_is_still_stopped(backend):
    res = run_python(
        "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(60)", timeout_s=1, backend=backend
    )
    assert res.status == "timeout" and res.wall_s < 10 and group_is_gone(res.pid)


@pytest.mark.parametrize(
    "code", ["x = bytearray(1 << 34)", "chunks = []\nwhile True:\n    chunks.append(bytearray(1 << 20))"]
)
def test_memory_bomb_hits_the_memory_limit(backend, code):
    res = run_python(code, memory_mb=128, backend=backend)
    assert res.status == "memory_limit" and "MemoryError" in res.stderr
    assert res.observation().startswith("Error: the program ran out of memory (limit 128 MB)")


def test_memory_limit_is_the_configured_size(backend):
    res = run_python(
        "import resource\nprint(resource.getrlimit(resource.RLIMIT_AS))", memory_mb=128, backend=backend
    )
    assert res.stdout == f"({128 << 20}, {128 << 20})\n"
    assert run_python("x = bytearray(32 << 20)\nprint(len(x))", memory_mb=128, backend=backend).ok


def test_huge_output_is_capped_and_the_program_stopped(backend):
    res = run_python(
        "while True:\n    print('x' * 1000)", max_output_chars=1000, timeout_s=30, backend=backend
    )
    assert res.status == "output_limit" and res.truncated and res.stdout == "x" * 1000
    assert res.wall_s < 20 and group_is_gone(res.pid)
    assert res.observation().startswith("Error: the output exceeded 1000 characters and was cut; the program")
    done = run_python("print('y' * 1500)", max_output_chars=1000, backend=backend)
    assert done.status == "output_limit" and done.stdout == "y" * 1000 and done.exit_code == 0
    err = run_python(
        "import sys\nsys.stderr.write('a' * 3000 + 'END')\nsys.exit(2)",
        max_output_chars=1000,
        backend=backend,
    )
    assert err.status == "error" and err.truncated and err.stderr == ("a" * 3000 + "END")[-1000:]


def test_file_size_limit(backend):
    code = "with open('big', 'wb') as f:\n    f.write(b'0' * (3 << 20))\nprint('wrote')"
    res = run_python(code, max_file_mb=1, backend=backend)
    assert res.status == "file_limit" and "wrote" not in res.stdout
    assert run_python(code, max_file_mb=4, backend=backend).stdout == "wrote\n"


# ---------------------------------------------------------------- settings and backends


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("timeout_s", 0),
        ("timeout_s", -1.0),
        ("timeout_s", True),
        ("timeout_s", "5"),
        ("cpu_s", 0),
        ("cpu_s", 1.5),
        ("memory_mb", 16),
        ("max_output_chars", 0),
        ("max_file_mb", 0),
        ("max_disk_mb", 0),
        ("max_files", 0),
        ("max_files", float("inf")),
        ("max_procs", 0),
        ("max_code_chars", 0),
    ],
)
def test_limits_name_the_bad_value(field, value):
    with pytest.raises(ValueError, match=f"'{field}'") as e:
        SandboxLimits(**{field: value})
    assert repr(value) in str(e.value)
    with pytest.raises(ValueError, match=f"'{field}'"):
        run_python("print(1)", **{field: value})


def test_unknown_limit_and_bad_code_type():
    with pytest.raises(ValueError, match="'memory_gb'"):
        run_python("print(1)", memory_gb=1)
    with pytest.raises(TypeError, match="bytes"):
        run_python(b"print(1)")  # type: ignore[arg-type]


def test_code_over_the_size_limit_is_rejected_without_running():
    res = run_python("print(1)  # " + "x" * 100, max_code_chars=50)
    assert res.status == "rejected" and res.pid is None and res.workdir is None
    assert res.observation() == "Error: the code is 112 characters long; the limit is 50."


def test_backend_selection(monkeypatch):
    problem = bwrap_problem()
    assert sandbox_backend() == ("bwrap" if problem is None else "rlimit")
    assert sandbox_backend("rlimit") == "rlimit"
    monkeypatch.setenv("HORIZONRL_SANDBOX", "rlimit")
    assert (
        sandbox_backend() == sandbox_backend("auto") == "rlimit"
        and run_python("print(2)").backend == "rlimit"
    )
    with pytest.raises(ValueError, match="'docker'"):
        sandbox_backend("docker")
    if problem is not None:
        assert "bwrap" in problem
        with pytest.raises(RuntimeError, match="'bwrap' was requested"):
            run_python("print(1)", backend="bwrap")
        if "/tmp" not in sandbox_host.read_paths():
            # where Python lives (a clone or venv under /tmp too) is never the reason: bwrap itself is
            assert problem.startswith((*INSTALL_PROBLEMS, "bwrap could not be started", "bwrap failed here"))


def test_python_at_tmp_itself_is_the_one_location_bwrap_refuses(monkeypatch):
    below = ("/usr", "/tmp", "/tmpfoo/lib", "/tmp/ci-runner/.venv", "/root/tmp/x")
    assert sandbox_host.tmp_read_paths(below) == ("/tmp/ci-runner/.venv",)
    monkeypatch.setattr(sandbox_host, "read_paths", lambda python=sys.executable: ("/usr", "/tmp"))
    problem = bwrap_problem.__wrapped__()  # uncached: returns before any probe run
    assert problem is not None and "bwrap" in problem
    if not problem.startswith(INSTALL_PROBLEMS):
        assert "all of the host's /tmp" in problem and "/tmp itself" in problem


def test_falling_back_warns_once_naming_what_the_fallback_lacks(monkeypatch, caplog):
    monkeypatch.setattr(sandbox, "bwrap_problem", lambda: "bwrap is not installed")
    sandbox._warn_fallback.cache_clear()
    with caplog.at_level(logging.WARNING, logger="horizonrl.envs.sandbox"):
        assert sandbox_backend() == sandbox_backend("auto") == "rlimit"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "bwrap is not installed" in warnings[0]
    assert "rlimit fallback, which lacks: no mount view" in warnings[0] and "no PID namespace" in warnings[0]
    sandbox._warn_fallback.cache_clear()


def test_fallback_gaps_follow_the_layers_that_are_missing():
    full = ("fs:landlock", "fs:landlock-read", "fs:tmpfs", "net:namespace", "proc:seccomp")
    assert len(fallback_gaps(full)) == 2  # mount view and PID namespace are never there
    bare = fallback_gaps(())
    for words in ("reads are not confined", "writes outside the working", "checked every 0.1 s",
                  "no network namespace", "no seccomp filter"):  # fmt: skip
        assert sum(words in g for g in bare) == 1, words
    assert any("refused altogether" in g for g in fallback_gaps((*full, "proc:no-threads")))


def test_statuses_are_the_documented_ones():
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "envs", "math_python.md")) as f:
        doc = f.read()
    for status in STATUSES:
        assert f"`{status}`" in doc, status


def test_bwrap_command_line_isolates_and_binds_only_what_python_needs():
    paths = sandbox_host.read_paths()
    argv = bwrap_argv(paths, 8 << 20, root=True)
    assert argv[0] == "bwrap" and argv[-1] == "--"
    for flag in ("--unshare-all", "--die-with-parent", "--new-session", "--as-pid-1"):
        assert flag in argv
    assert "--share-net" not in argv
    triples = list(zip(argv, argv[1:], argv[2:], strict=False))
    ro = {b for a, b, c in triples if a == "--ro-bind" and b == c}
    links = {c for a, b, c in triples if a == "--symlink"}
    assert ro | links == set(paths) and ro.isdisjoint(links)
    assert ("--ro-bind", sandbox_host.CHILD, sandbox_host.BWRAP_CHILD) in triples
    assert not {"/", "/etc", "/home", "/root", "/work", "/run", "/var", "/tmp", "/sys"} & ro
    prefix = os.path.realpath(sys.base_prefix)
    assert any(prefix == p or prefix.startswith(p + "/") for p in ro)
    assert ("--size", str(8 << 20), "--tmpfs") in triples and ("--remount-ro", "/", "--chdir") in triples
    assert ("--cap-drop", "ALL", "--cap-add") in triples
    assert "--cap-drop" not in bwrap_argv(paths, 1 << 20, root=False)


def test_bwrap_binds_paths_below_tmp_read_only_on_top_of_its_private_tmp():
    venv, base = "/tmp/clone/.venv", "/tmp/python-build/prefix"
    paths = (*sandbox_host.read_paths(), base, venv)
    argv = bwrap_argv(paths, 8 << 20, root=False)
    tmpfs = argv.index("--tmpfs")
    assert argv[tmpfs + 1] == "/tmp" and argv[tmpfs - 2 : tmpfs] == ["--size", str(8 << 20)]
    binds = {argv[i + 2]: i for i, a in enumerate(argv[:-2]) if a in ("--ro-bind", "--symlink")}  # by target
    for p in (venv, base):  # after the tmpfs, so they sit on it; exactly these paths, read-only
        assert binds[p] > tmpfs and argv[binds[p] : binds[p] + 3] == ["--ro-bind", p, p]
    assert all(i < tmpfs for p, i in binds.items() if not p.startswith("/tmp/"))
    assert not any(a == "/tmp" for i, a in enumerate(argv) if argv[i - 1] == "--ro-bind")
    with pytest.raises(ValueError, match="/tmp itself"):
        bwrap_argv((*paths, "/tmp"), 8 << 20, root=False)


@BWRAP_ONLY
def test_bwrap_view_holds_only_python_and_a_private_tmpfs():
    host_names = [*sorted(os.listdir("/")), "etc/passwd", "etc/shadow", "etc/hostname", "run", "var/run"]
    code = (
        f"import os\nprint([n for n in {host_names!r} if os.path.lexists('/' + n)])\n"
        "print([l.split()[1:4] for l in open('/proc/mounts') if l.split()[1] in ('/', '/tmp', '/dev')])"
    )
    res = run_python(code, backend="bwrap", max_disk_mb=8, max_files=300)
    assert res.ok, res.observation()
    seen, mounts = res.stdout.splitlines()
    expected = {p.split("/")[1] for p in sandbox_host.read_paths()} | {"proc", "dev", "tmp", "etc"}
    assert set(eval(seen)) == expected & set(host_names)  # /etc holds only ld.so.cache and localtime
    by_point: dict[str, list[str]] = {}
    for point, fstype, opts in eval(mounts):
        by_point.setdefault(point, []).append(f"{fstype} {opts}")
    assert by_point["/"][-1].startswith("tmpfs ro,") and by_point["/dev"][-1].startswith("tmpfs ro,")
    tmp = by_point["/tmp"][-1]
    inodes = 300 + 1 + len(bound_under_tmp())  # + the root, + mount points of a Python below /tmp
    assert tmp.startswith("tmpfs rw,nosuid,nodev,noexec") and "size=8192k" in tmp
    assert f"nr_inodes={inodes}," in tmp
