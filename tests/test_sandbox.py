"""The python sandbox: limits, containment of hostile programs, cleanup, backends."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading

import pytest

from horizonrl.envs.sandbox import (
    SandboxLimits,
    bwrap_argv,
    bwrap_problem,
    run_python,
    sandbox_backend,
)

BACKENDS = ["rlimit"] + ([] if bwrap_problem() else ["bwrap"])


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture(autouse=True)
def sandbox_root(tmp_path, monkeypatch):
    """Route the sandbox's temporary directories into a private folder that must be empty afterwards."""
    root = tmp_path / "sandbox-root"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    before = children()
    yield root
    assert list(root.iterdir()) == [], "a sandbox working directory was left behind"
    assert children() <= before, "a sandboxed process was left running"


def children() -> set[int]:
    """Pids whose parent is this test process (read from /proc, independent of the sandbox)."""
    me, out = str(os.getpid()), set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[1] == me:
            out.add(int(pid))
    return out


def kernel_offers(layer: str) -> bool:
    """Probe, outside the sandbox code, whether this kernel lets an unprivileged-ish process use ``layer``."""
    probes = {
        "landlock": "print(libc.syscall(c_long(444), None, c_long(0), c_long(1)) >= 1)",  # Landlock ABI
        "netns": "print(libc.unshare(0x40000000) == 0 or libc.unshare(0x50000000) == 0)",  # NEWNET, +NEWUSER
    }
    head = "from ctypes import CDLL, c_long\nlibc = CDLL(None)\nlibc.syscall.restype = c_long\n"
    out = subprocess.run(
        [sys.executable, "-c", head + probes[layer]], capture_output=True, text=True, check=True
    )
    return out.stdout.strip() == "True"


def group_is_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


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
    assert not os.path.exists(res.workdir) and group_is_gone(res.pid)
    assert {
        "process",
        "rlimit:cpu",
        "rlimit:as",
        "rlimit:fsize",
        "proc:audit",
        "net:audit",
        "fs:audit",
    } <= set(res.protections)
    empty = run_python("x = 1", backend=backend)
    assert empty.ok and empty.observation() == "(no output)"


def test_writing_inside_the_working_directory_works(backend):
    code = (
        "import os\nos.mkdir('d')\nwith open('d/a.txt', 'w') as f:\n    f.write('hi')\n"
        "os.rename('d/a.txt', 'b.txt')\nprint(open('b.txt').read(), sorted(os.listdir('.')))"
    )
    res = run_python(code, backend=backend)
    assert res.ok, res.observation()
    assert res.stdout == "hi ['b.txt', 'd']\n"


def test_exception_is_an_error_with_the_programs_traceback(backend):
    res = run_python("print('partial')\nx = 1\n1 / 0", backend=backend)
    assert res.status == "error" and res.exit_code == 1 and not res.ok
    assert res.stdout == "partial\n"
    assert 'File "<python>", line 3' in res.stderr and res.stderr.rstrip().endswith("division by zero")
    assert "sandbox.py" not in res.stderr  # the launcher's own frames are hidden
    obs = res.observation()
    assert obs.startswith("Error: the program exited with code 1 (ZeroDivisionError") and "partial" in obs
    syntax = run_python("def (:", backend=backend)
    assert syntax.status == "error" and "SyntaxError" in syntax.stderr


def test_hash_order_is_deterministic_with_pythonhashseed_zero(backend):
    code = "print(list({str(i) for i in range(60)}))"
    expected = subprocess.run(
        [sys.executable, "-c", code], env={"PYTHONHASHSEED": "0"}, capture_output=True, text=True, check=True
    ).stdout
    assert run_python(code, backend=backend).stdout == expected
    assert run_python(code, backend=backend).stdout == expected


def test_numpy_runs_under_the_default_limits(backend):
    res = run_python("import numpy as np\nprint(int(np.arange(10).sum()))", backend=backend)
    assert res.ok and res.stdout == "45\n", res.observation()


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


# ---------------------------------------------------------------- hostile programs


def test_infinite_loop_hits_the_cpu_limit(backend):
    res = run_python("while True:\n    pass", cpu_s=1, timeout_s=30, backend=backend)
    assert res.status == "cpu_limit" and not res.ok
    assert res.cpu_s >= 0.9 and res.wall_s < 25
    assert res.observation().startswith("Error: the program exceeded the 1 s CPU time limit")
    assert group_is_gone(res.pid)


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


FORK_BOMBS = {
    "os.fork": "import os\nwhile True:\n    os.fork()",
    "subprocess": "import subprocess\nsubprocess.run(['true'])",
    "os.system": "import os\nos.system('true')",
    "multiprocessing": "import multiprocessing as mp\nmp.Process(target=print).start()",
    "ctypes": "import ctypes\nctypes.CDLL(None).fork()",
}


@pytest.mark.parametrize("name", sorted(FORK_BOMBS))
def test_fork_bomb_is_refused(backend, name):
    res = run_python(FORK_BOMBS[name], timeout_s=10, backend=backend)
    assert res.status == "blocked", res.observation()
    assert res.observation().startswith("Error: the sandbox refused an operation")
    assert group_is_gone(res.pid)


def test_fork_below_the_audit_hook_is_refused_by_seccomp(backend):
    # _posixsubprocess.fork_exec raises no audit event; only the kernel filter stops it
    code = (
        "import _posixsubprocess, os\nr, w = os.pipe()\n"
        "args = [[b'/bin/true'], [b'/bin/true'], True, (), None, None, -1, -1, -1, -1, -1, -1, r, w, True,"
        " False, -1, None, None, None, -1, None, False]\n"
        "try:\n    pid = _posixsubprocess.fork_exec(*args)\nexcept TypeError:\n    print('other signature')\n"
        "else:\n    print('forked', pid)"
    )
    res = run_python(code, backend=backend)
    assert ("proc:seccomp" in res.protections) == (os.uname().machine == "x86_64")
    if "proc:seccomp" not in res.protections or res.stdout == "other signature\n":
        pytest.skip("no seccomp filter on this architecture, or another fork_exec signature")
    assert res.status == "blocked" and "Operation not permitted" in res.stderr and "forked" not in res.stdout


def test_network_is_unreachable(backend):
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5):  # reachable from outside the sandbox
            server.accept()[0].close()
        tcp = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')"
        udp = f"import socket as s\ns.socket(s.AF_INET, s.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', {port}))"
        for code in (
            tcp,
            udp,
            "import urllib.request\nurllib.request.urlopen('http://example.com', timeout=2)",
        ):
            res = run_python(code, backend=backend)
            assert res.status == "blocked" and "connected" not in res.stdout, res.observation()
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()
    if backend == "rlimit":
        assert ("net:namespace" in res.protections) == kernel_offers("netns")
    if "net:namespace" in res.protections:
        res = run_python("import socket\nprint([name for _, name in socket.if_nameindex()])", backend=backend)
        assert res.stdout == "['lo']\n"


def test_writes_outside_the_working_directory_are_refused(backend, tmp_path):
    target, keep = tmp_path / "outside.txt", tmp_path / "keep.txt"
    keep.write_text("keep")
    mode = keep.stat().st_mode
    attempts = [
        f"open({str(target)!r}, 'w').write('x')",
        f"import os\nos.open({str(target)!r}, os.O_WRONLY | os.O_CREAT)",
        f"import pathlib\npathlib.Path({str(target)!r}).write_text('x')",
        f"open({str(keep)!r}, 'a').write('x')",
        f"import os\nos.remove({str(keep)!r})",
        f"import os\nos.rename({str(keep)!r}, 'stolen.txt')",
        f"import os\nos.chmod({str(keep)!r}, 0o777)",
        f"import os\nos.symlink({str(target)!r}, 'link')\nopen('link', 'w').write('x')",
        "import os\nos.chdir('..')\nopen('escaped.txt', 'w').write('x')",
    ]
    for code in attempts:
        res = run_python(code, backend=backend)
        assert res.status == "blocked", (code, res.observation())
    assert ("fs:landlock" in res.protections) == kernel_offers("landlock")
    if "fs:landlock" in res.protections:  # a dir_fd-relative open is invisible to the audit hook
        code = f"import os\nfd = os.open({str(tmp_path)!r}, os.O_RDONLY)\n"
        code += "os.open('outside.txt', os.O_WRONLY | os.O_CREAT, dir_fd=fd)"
        assert run_python(code, backend=backend).status == "blocked"
    assert not target.exists() and keep.read_text() == "keep" and keep.stat().st_mode == mode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt", "sandbox-root"]


def test_signals_to_other_processes_are_refused(backend):
    res = run_python(f"import os\nos.kill({os.getpid()}, 0)\nprint('signalled')", backend=backend)
    assert res.status == "blocked" and "signalled" not in res.stdout
    own = run_python(
        "import os, signal\nsignal.signal(signal.SIGUSR1, lambda *a: print('got it'))\n"
        "os.kill(os.getpid(), signal.SIGUSR1)",
        backend=backend,
    )
    assert own.ok and own.stdout == "got it\n"


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


def test_bwrap_command_line_isolates_and_binds_only_what_python_needs():
    work = "/tmp/horizonrl-sandbox-test"
    argv = bwrap_argv(work, sys.executable)
    assert argv[0] == "bwrap" and argv[-1] == "--"
    for flag in ("--unshare-all", "--die-with-parent", "--new-session"):
        assert flag in argv
    pairs = list(zip(argv, argv[1:], argv[2:], strict=False))
    assert ("--bind", work, work) in pairs and argv[argv.index("--chdir") + 1] == work
    ro = [b for a, b, c in pairs if a == "--ro-bind" and b == c]
    prefix = os.path.realpath(sys.prefix)
    assert any(prefix == p or prefix.startswith(p + "/") for p in ro)
    assert "/" not in ro and not any(p in ("/home", "/root", "/work") for p in ro)
