"""Import user code named in a config: ``env.imports`` modules and ``module:function`` rewards.

A target is a dotted module name importable from ``sys.path`` (``mypkg.envs``) or a path to a
``.py`` file (``examples/custom_env/warehouse.py``, relative to the working directory). A file is
imported once per resolved path under a stable module name (``_horizonrl_user_<stem>_<hash>``), so
naming it again returns the same module and the classes it registers keep one identity. Every
failure is one :class:`UserImportError` line naming the config field, the target and the cause; for
an exception raised inside the user's module, the file and line where it was raised.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["UserImportError", "import_user_module", "load_object"]


class UserImportError(ValueError):
    """A module or object named in a config could not be imported."""


def _is_path(target: str) -> bool:
    return target.endswith(".py") or "/" in target or os.sep in target


def import_user_module(target: str, what: str = "env.imports") -> ModuleType:
    """Import ``target`` (module name or ``.py`` path); ``what`` names the config field in errors."""
    if not isinstance(target, str) or not target.strip():
        raise UserImportError(f"{what}={target!r}: expected a module name or a .py file path")
    target = target.strip()
    try:
        if _is_path(target):
            return _import_file(target, what)
        return importlib.import_module(target)
    except UserImportError:
        raise
    except ModuleNotFoundError as e:
        raise UserImportError(f"{what}: cannot import {target!r}: {e}") from None
    except Exception as e:
        tb = e.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        where = f" ({tb.tb_frame.f_code.co_filename}:{tb.tb_lineno})" if tb is not None else ""
        raise UserImportError(
            f"{what}: importing {target!r} failed: {type(e).__name__}: {e}{where}"
        ) from None


def _import_file(target: str, what: str) -> ModuleType:
    path = Path(target).expanduser().resolve()
    if not path.is_file():
        raise UserImportError(
            f"{what}: file {target!r} does not exist (relative paths start at {os.getcwd()})"
        )
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:10]
    name = f"_horizonrl_user_{''.join(c if c.isalnum() else '_' for c in path.stem)}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserImportError(f"{what}: cannot import {target!r} as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def load_object(spec: str, what: str) -> Any:
    """The object named by ``module:attr`` or ``path/to/file.py:attr``."""
    target, _, attr = str(spec).rpartition(":")
    if not target or not attr.isidentifier():
        raise UserImportError(f"{what}={spec!r}: expected module:function or path/file.py:function")
    module = import_user_module(target, what)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise UserImportError(f"{what}={spec!r}: {target!r} has no attribute {attr!r}") from None
