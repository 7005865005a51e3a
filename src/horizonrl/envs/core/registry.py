"""Registry of environment classes by name (used by configs: ``env.name: lookup``).

Environments defined outside horizonrl register themselves with :func:`register_env` when their
module is imported; a config names that module in ``env.imports`` (a dotted name on
``sys.path`` or a ``.py`` path) and :func:`import_env_modules` imports it before the lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, TypeVar

from horizonrl.envs.core.base import Env
from horizonrl.registry import Registry, UnknownNameError
from horizonrl.userimport import import_user_module

E = TypeVar("E", bound=type[Env])


class UnknownEnvError(UnknownNameError):
    """Raised by :func:`get_env` for an unregistered name (a ``KeyError`` and a ``ValueError``)."""


ENVS: Registry[type[Env]] = Registry(
    "environment",
    register_with="@register_env(NAME) in a module that env.imports names",
    error=UnknownEnvError,
)


def register_env(name: str) -> Callable[[E], E]:
    """Class decorator: register an :class:`Env` subclass under ``name`` and set its ``name``.

    The same class defined again by a re-imported module replaces the entry; another class
    under a taken name raises ``ValueError``.
    """

    def deco(cls: E) -> E:
        if not (isinstance(cls, type) and issubclass(cls, Env)):
            raise TypeError(f"register_env({name!r}) expects an Env subclass, got {cls!r}")
        ENVS.register(name, cls)
        cls.name = name
        return cls

    return deco


#: The environment class registered as ``name`` (:class:`UnknownEnvError` naming the known ones).
get_env = ENVS.get


def make_env(name: str, **knobs: Any) -> Env:
    """``get_env(name)(**knobs)``."""
    return get_env(name)(**knobs)


#: Names of all registered environments, sorted.
list_envs = ENVS.names


def import_env_modules(targets: str | Sequence[str]) -> list[ModuleType]:
    """Import each module of ``env.imports`` (registering the environments and rewards it defines).

    Raises :class:`horizonrl.userimport.UserImportError` (one line) when one cannot be imported.
    """
    items = [targets] if isinstance(targets, str) else list(targets)
    return [import_user_module(t, "env.imports") for t in items]
