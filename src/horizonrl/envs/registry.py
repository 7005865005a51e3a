"""Registry of environment classes by name (used by configs: ``env.name: lookup``).

Environments defined outside horizonrl register themselves with :func:`register_env` when their
module is imported; a config names that module in ``env.imports`` (a dotted name on
``sys.path`` or a ``.py`` path) and :func:`import_env_modules` imports it before the lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, TypeVar

from horizonrl.envs.base import Env
from horizonrl.userimport import import_user_module

E = TypeVar("E", bound=type[Env])

_REGISTRY: dict[str, type[Env]] = {}


class UnknownEnvError(KeyError, ValueError):
    """Raised by :func:`get_env` for a name that is not registered."""

    def __str__(self) -> str:
        return str(self.args[0])


def register_env(name: str) -> Callable[[E], E]:
    """Class decorator: register an :class:`Env` subclass under ``name`` and set its ``name``."""

    def deco(cls: E) -> E:
        if not (isinstance(cls, type) and issubclass(cls, Env)):
            raise TypeError(f"register_env({name!r}) expects an Env subclass, got {cls!r}")
        old = _REGISTRY.get(name)
        if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(
                f"environment {name!r} is already registered by {old.__module__}.{old.__qualname__}"
            )
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def get_env(name: str) -> type[Env]:
    """The environment class registered as ``name``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownEnvError(
            f"unknown environment {name!r}; known: {', '.join(list_envs()) or 'none'} (an environment "
            "from your own code registers when env.imports names its module)"
        ) from None


def make_env(name: str, **knobs: Any) -> Env:
    """``get_env(name)(**knobs)``."""
    return get_env(name)(**knobs)


def list_envs() -> list[str]:
    """Names of all registered environments, sorted."""
    return sorted(_REGISTRY)


def import_env_modules(targets: str | Sequence[str]) -> list[ModuleType]:
    """Import each module of ``env.imports`` (registering the environments and rewards it defines).

    Raises :class:`horizonrl.userimport.UserImportError` (one line) when one cannot be imported.
    """
    items = [targets] if isinstance(targets, str) else list(targets)
    return [import_user_module(t, "env.imports") for t in items]
