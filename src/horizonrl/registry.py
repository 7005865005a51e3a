"""One registry implementation for every name a config can give (bottom layer: imports only ``errors``).

Estimators, trainers, feature providers, agents, context managers, environments,
engines, loggers, rewards, KL estimators and paper declarations are each a
:class:`Registry`: entries are added with a decorator, a name is registered once
(registering another object under a taken name raises), and an unknown name raises
:class:`UnknownNameError` — a :class:`~horizonrl.errors.ConfigError`, so the CLI
prints it in one line — that lists the known names and says how to add one::

    ESTIMATORS: Registry[EstimatorSpec] = Registry(
        "credit estimator", register_with="@register_estimator(NAME)"
    )

    @ESTIMATORS.register("grpo")
    def grpo(...): ...

    ESTIMATORS.get("grpo")        # the entry
    ESTIMATORS.names()            # sorted names

``plugins`` names modules imported before the first lookup: the built-ins that
register themselves on import and pull in heavy dependencies (torch, models). A
plug-in whose own module is missing (an optional extra that is not installed) is
skipped; any other import error propagates.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from horizonrl.errors import ConfigError

T = TypeVar("T")


class UnknownNameError(ConfigError, KeyError):
    """A name no entry of a registry has (a ``ConfigError`` and a ``KeyError``)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """Names to entries of one kind, filled by :meth:`register`.

    Args:
        kind: what an entry is, in messages ("credit estimator", "environment").
        register_with: how a user adds one, quoted in the unknown-name error.
        plugins: modules imported once before the first lookup (see the module docstring).
    """

    def __init__(self, kind: str, *, register_with: str = "", plugins: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self.register_with = register_with
        self.plugins = plugins
        self._entries: dict[str, T] = {}
        self._loaded = not plugins

    def register(self, name: str, entry: T | None = None) -> Callable[[T], T] | T:
        """``@reg.register(name)`` as a decorator, or ``reg.register(name, entry)`` directly.

        Registering the same object again is a no-op (a module imported twice); another object
        under a taken name raises ``ValueError``.
        """

        def add(obj: T) -> T:
            old = self._entries.get(name)
            if old is not None and old is not obj and not _same_definition(old, obj):
                raise ValueError(f"{self.kind} {name!r} is already registered ({_describe(old)})")
            self._entries[name] = obj
            return obj

        return add if entry is None else add(entry)

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests that register temporary entries)."""
        self._entries.pop(name, None)

    def load(self) -> None:
        """Import the plug-in modules (once)."""
        if self._loaded:
            return
        self._loaded = True
        for mod in self.plugins:
            try:
                importlib.import_module(mod)
            except ModuleNotFoundError as e:
                if e.name != mod:
                    raise

    def get(self, name: str) -> T:
        """The entry registered as ``name``; :class:`UnknownNameError` naming the known ones."""
        self.load()
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise UnknownNameError(self.unknown(name)) from None

    def unknown(self, name: object) -> str:
        """The message for a name nothing is registered as."""
        how = f"; register one with {self.register_with}" if self.register_with else ""
        return f"unknown {self.kind} {name!r}; known: {self.names()}{how}"

    def names(self) -> list[str]:
        self.load()
        return sorted(self._entries)

    def items(self) -> list[tuple[str, T]]:
        self.load()
        return sorted(self._entries.items())

    def __contains__(self, name: object) -> bool:
        self.load()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        self.load()
        return len(self._entries)


def _same_definition(a: object, b: object) -> bool:
    """The same function or class defined again by a module re-executed (e.g. ``importlib.reload``)."""
    qa, qb = getattr(a, "__qualname__", None), getattr(b, "__qualname__", None)
    return qa is not None and qa == qb and getattr(a, "__module__", None) == getattr(b, "__module__", None)


def _describe(obj: object) -> str:
    mod, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    return f"{mod}.{name}" if mod and name else type(obj).__name__
