"""The python sandbox: run untrusted Python in a separate, limited process (the ``python`` tool).

- :mod:`.runner`: :func:`run_python` (one program, one fresh process, limits, result), the two
  backends (``bwrap``, ``rlimit``) and :func:`sandbox_backend`; what a caller uses;
- :mod:`.host`: the trainer's side: the paths Python may read, the bubblewrap command line,
  pids cgroups, work dirs and the removal of a killed trainer's leftovers;
- :mod:`.child`: the child's side, executed as a script (``python -s -P -B child.py CONFIG``),
  standard library only: it sets up every kernel protection, then runs the program.

Nothing here knows about environments; :mod:`horizonrl.envs.builtin.math_tool` uses it, and
``horizonrl.envs.sandbox.run_python(code, **limits)`` is usable on its own
(``docs/envs/math_python.md``).
"""

from horizonrl.envs.sandbox.runner import (
    BACKENDS,
    STATUSES,
    SandboxLimits,
    SandboxResult,
    bwrap_argv,
    bwrap_problem,
    fallback_gaps,
    remove_stale,
    run_python,
    sandbox_backend,
)

__all__ = [
    "BACKENDS",
    "STATUSES",
    "SandboxLimits",
    "SandboxResult",
    "bwrap_argv",
    "bwrap_problem",
    "fallback_gaps",
    "remove_stale",
    "run_python",
    "sandbox_backend",
]
