"""Import a script or benchmark (a file outside the package) as a module, for the tests of its functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_script(relpath: str) -> ModuleType:
    """The module in ``ROOT / relpath`` (e.g. ``"benchmarks/smollm2_rollout.py"``), executed afresh, with its
    folder on ``sys.path`` as when it runs as a script (benchmarks import their siblings)."""
    path = ROOT / relpath
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
