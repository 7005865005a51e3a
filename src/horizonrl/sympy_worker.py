"""SymPy equality checks in a separate process under a hard time limit.

SymPy can take unbounded time (or memory) on adversarial input: ``simplify`` of a large
expansion, a numeric evaluation that needs huge precision. :class:`SympyWorker` runs the checks
in a long-lived child process (``python -I`` this file; only the standard library and SymPy are
imported there) and talks to it over pipes, one JSON object per line::

    parent -> child   {"id": 7, "a": "sqrt(2)/2", "b": "1/sqrt(2)"}
    child -> parent   {"id": 7, "eq": true}          # true / false / null (not comparable)

The child first writes ``{"ready": true}`` once SymPy is imported. :meth:`SympyWorker.equal`
returns within ``timeout_s``: when the time is up it kills the child (``SIGKILL``: the limit is
hard, it does not rely on SymPy checking for interrupts), returns None and starts a fresh child in
the background (start-up is about 0.5 s, the import of SymPy); a call that finds the replacement
still starting waits for it only within its own budget. Only the first child of a process is
waited for longer (``startup_timeout_s``), so that early comparisons are not lost to start-up;
:meth:`SympyWorker.start` starts it ahead of time. The child limits its own address space
(``memory_mb``), dies with its parent (``PR_SET_PDEATHSIG`` on Linux, and on end of input) and
ignores SIGINT.

Only strings already reduced to SymPy syntax over a whitelist (see
:func:`horizonrl.math_answer.latex_to_sympy`) are sent; the child parses them with
``parse_expr`` under the same whitelist of names.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import threading
import time

__all__ = ["SympyWorker", "default_worker"]


# -- the child ---------------------------------------------------------------------------------------


def _child_setup(memory_mb: int) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import resource

        limit = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):
        pass
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def _child_equal(sympy, parse, a: str, b: str) -> bool | None:
    """The comparison itself: exact difference 0, numeric closeness, or ``simplify(a - b) == 0``."""
    try:
        ea, eb = parse(a), parse(b)
        diff = ea - eb
        if diff == 0:
            return True
        if not (ea.free_symbols or eb.free_symbols):
            value = complex(sympy.N(diff, 30))
            scale = max(1.0, abs(complex(sympy.N(eb, 30))))
            return abs(value) <= 1e-9 * scale
        return bool(sympy.simplify(diff) == 0)
    except Exception:  # any parse/eval failure (and RecursionError, MemoryError) means "not comparable"
        return None


def _child_main(memory_mb: int) -> None:
    _child_setup(memory_mb)
    import sympy
    from sympy.parsing.sympy_parser import (
        convert_xor,
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )

    transforms = (*standard_transformations, implicit_multiplication_application, convert_xor)
    names = {"ln": sympy.log, "abs": sympy.Abs, "pi": sympy.pi, "oo": sympy.oo, "e": sympy.E}

    def parse(text: str):
        return parse_expr(text, local_dict=dict(names), transformations=transforms, evaluate=True)

    out = sys.stdout
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        try:
            req = json.loads(line)
            verdict = _child_equal(sympy, parse, str(req["a"]), str(req["b"]))
            out.write(json.dumps({"id": req["id"], "eq": verdict}) + "\n")
            out.flush()
        except (ValueError, KeyError, TypeError):
            continue
        except BrokenPipeError:
            return


# -- the parent --------------------------------------------------------------------------------------


class SympyWorker:
    """A child process answering SymPy equality requests, killed and replaced on timeout.

    Thread-safe (requests are serialized). ``stats`` counts ``calls``, ``timeouts`` (child killed),
    ``starts`` and ``failures`` (child could not be started or died; the call returned None).
    """

    def __init__(self, *, memory_mb: int = 2048, startup_timeout_s: float = 30.0) -> None:
        self.memory_mb = memory_mb
        self.startup_timeout_s = startup_timeout_s
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._pid_owner = os.getpid()
        self._ready = False
        self._ever_ready = False
        self._broken = False
        self._buf = b""
        self._next_id = 0
        self.stats = {"calls": 0, "timeouts": 0, "starts": 0, "failures": 0}

    # -- process management --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the child if none is running (returns at once; the child imports SymPy meanwhile)."""
        with self._lock:
            self._ensure()

    def _ensure(self) -> bool:
        if self._pid_owner != os.getpid():  # we are a forked copy: the pipes belong to the parent
            self._proc, self._pid_owner = None, os.getpid()
        if self._proc is not None and self._proc.poll() is None:
            return True
        self._proc, self._ready, self._buf = None, False, b""
        try:  # -I: isolated mode, the script's directory is not put on sys.path
            self._proc = subprocess.Popen(
                [sys.executable, "-I", os.path.abspath(__file__), str(int(self.memory_mb))],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                close_fds=True,
            )
        except OSError:
            self.stats["failures"] += 1
            return False
        self.stats["starts"] += 1
        return True

    def _kill(self) -> None:
        proc, self._proc, self._ready, self._buf = self._proc, None, False, b""
        if proc is not None:
            try:
                proc.kill()
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
            for pipe in (proc.stdin, proc.stdout):
                with contextlib.suppress(OSError):
                    pipe.close()  # type: ignore[union-attr]

    def close(self) -> None:
        """Stop the child."""
        with self._lock:
            self._kill()

    def _read_line(self, deadline: float) -> dict | None:
        """The next JSON line from the child before ``deadline``; None on timeout or a dead child."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:  # the child died (e.g. out of memory)
                return {"dead": True}
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            msg = json.loads(line)
        except ValueError:
            return {}
        return msg if isinstance(msg, dict) else {}

    # -- requests ------------------------------------------------------------------------------------

    def equal(self, a: str, b: str, timeout_s: float) -> bool | None:
        """``a == b`` by SymPy (see :func:`_child_equal`); None when not comparable or out of time.

        Returns within ``timeout_s`` (waiting for a restarting child counts), except while the very
        first child of this process starts (bounded by ``startup_timeout_s``).
        """
        with self._lock:
            deadline = time.monotonic() + timeout_s
            self.stats["calls"] += 1
            if self._broken or not self._ensure():
                return None
            if not self._ready:
                first = not self._ever_ready
                msg = self._read_line(time.monotonic() + self.startup_timeout_s if first else deadline)
                if msg is None and not first:
                    return None  # a replacement child is still importing SymPy: leave it be
                if not msg or not msg.get("ready"):
                    self.stats["failures"] += 1
                    self._broken = first  # e.g. SymPy is not installed: do not retry every call
                    self._kill()
                    return None
                self._ready = self._ever_ready = True
                if first:
                    deadline = time.monotonic() + timeout_s
            self._next_id += 1
            rid = self._next_id
            try:
                self._proc.stdin.write((json.dumps({"id": rid, "a": a, "b": b}) + "\n").encode())  # type: ignore[union-attr]
                self._proc.stdin.flush()  # type: ignore[union-attr]
            except (BrokenPipeError, OSError):
                self.stats["failures"] += 1
                self._kill()
                return None
            while True:
                msg = self._read_line(deadline)
                if msg is None:  # out of time: kill hard, start a replacement in the background
                    self.stats["timeouts"] += 1
                    self._kill()
                    self._ensure()
                    return None
                if msg.get("dead"):
                    self.stats["failures"] += 1
                    self._kill()
                    return None
                if msg.get("id") == rid:
                    eq = msg.get("eq")
                    return eq if isinstance(eq, bool) else None


_default: SympyWorker | None = None
_default_lock = threading.Lock()


def default_worker() -> SympyWorker:
    """The process-wide worker (created on first use, stopped at exit)."""
    global _default
    with _default_lock:
        if _default is None:
            import atexit

            _default = SympyWorker()
            atexit.register(_default.close)
        return _default


if __name__ == "__main__":
    _child_main(int(sys.argv[1]) if len(sys.argv) > 1 else 2048)
