"""One registry implementation for every name a config can give (bottom layer: imports only ``errors``).

Estimators, trainers, feature providers, agents, context managers, environments,
engines, loggers, rewards, KL estimators and paper declarations are each a
:class:`Registry`: entries are added with a decorator, a name is registered once
(registering another object under a taken name raises), and an unknown name raises
:class:`UnknownNameError` — a :class:`~horizonrl.errors.ConfigError`, so the CLI
prints it in one line — that lists the known names and says how to add one::

    ESTIMATORS: Registry[EstimatorSpec] = Registry(
        "estimator", register_with="@register_estimator(NAME)"
    )

    @ESTIMATORS.register("grpo")
    def grpo(...): ...

    ESTIMATORS.get("grpo")                          # the entry
    ESTIMATORS.get(name, field="algo.estimator")    # ... or "algo.estimator='x': unknown estimator; ..."
    ESTIMATORS.names()                              # sorted names

``plugins`` names modules imported before the first lookup: the built-ins that
register themselves on import and pull in heavy dependencies (torch, models). A
plug-in whose own module is missing (an optional extra that is not installed) is
skipped; any other import error propagates. ``lazy`` maps a name to the module
that registers it, imported only when that name is asked for (an engine whose
optional dependency may be missing): the name is known before, and an
``ImportError`` of its module reaches the caller, who can say what to install.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Generic, TypeVar, overload

from horizonrl.errors import ConfigError

T = TypeVar("T")


class UnknownNameError(ConfigError, KeyError):
    """A name no entry of a registry has (a ``ConfigError`` and a ``KeyError``).

    A registry whose callers catch an error class of their own (``UnknownEnvError``,
    ``UnknownEstimatorError``, ``UnknownRewardError``) raises that subclass instead
    (``Registry(..., error=...)``), so ``except KeyError``, ``except ValueError``,
    ``except ConfigError`` and the module's own class all keep working.
    """

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """Names to entries of one kind, filled by :meth:`register`.

    Args:
        kind: what an entry is, in messages ("estimator", "environment").
        register_with: how a user adds one, quoted in the unknown-name error.
        plugins: modules imported once before the first lookup (see the module docstring).
        lazy: names whose module is imported when that name is first asked for (module docstring).
        error: the :class:`UnknownNameError` subclass raised for an unknown name.
        sort: list names sorted (default) or in registration order (where the order means something).
    """

    def __init__(
        self,
        kind: str,
        *,
        register_with: str = "",
        plugins: tuple[str, ...] = (),
        lazy: Mapping[str, str] | None = None,
        error: type[UnknownNameError] = UnknownNameError,
        sort: bool = True,
    ) -> None:
        if not (isinstance(error, type) and issubclass(error, UnknownNameError)):
            raise TypeError(f"Registry(error=...) must be an UnknownNameError subclass, got {error!r}")
        self.kind = kind
        self.register_with = register_with
        self.plugins = tuple(plugins)
        self.lazy = dict(lazy or {})
        self.error = error
        self.sort = sort
        self._entries: dict[str, T] = {}
        self._loaded = not self.plugins

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {len(self._entries)} registered)"

    # -- registering ---------------------------------------------------------------------

    @overload
    def register(self, name: str, entry: None = None, *, replace: bool = False) -> Callable[[T], T]: ...
    @overload
    def register(self, name: str, entry: T, *, replace: bool = False) -> T: ...

    def register(self, name: str, entry: T | None = None, *, replace: bool = False) -> Callable[[T], T] | T:
        """``@reg.register(name)`` as a decorator, or ``reg.register(name, entry)`` directly.

        Registering the same object again is a no-op (a module imported twice), and so is the
        same function or class defined again by a re-executed module (same module and
        qualified name); another object under a taken name raises ``ValueError`` unless
        ``replace``. A name that is not a non-empty string raises ``ValueError`` at once.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")

        def add(obj: T) -> T:
            old = self._entries.get(name)
            if old is not None and not replace and old is not obj and not _same_definition(old, obj):
                raise ValueError(f"{self.kind} {name!r} is already registered ({_describe(old)})")
            self._entries[name] = obj
            return obj

        return add if entry is None else add(entry)

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests that register temporary entries; see also :meth:`scratch`)."""
        self._entries.pop(name, None)

    @contextmanager
    def scratch(self) -> Iterator[Registry[T]]:
        """A block whose registrations are undone on exit: entries added are removed, replaced ones restored.

        For tests: ``with ESTIMATORS.scratch(): register_estimator("unit", ...)(fn)``.
        """
        self.load()
        saved = dict(self._entries)
        try:
            yield self
        finally:
            self._entries.clear()
            self._entries.update(saved)

    # -- looking up ----------------------------------------------------------------------

    def load(self) -> None:
        """Import the plug-in modules (once; after a failed import, the next lookup tries again)."""
        if self._loaded:
            return
        self._loaded = True  # before importing: a plug-in that looks a name up does not recurse
        try:
            for mod in self.plugins:
                try:
                    importlib.import_module(mod)
                except ModuleNotFoundError as e:
                    if e.name != mod:
                        raise
        except BaseException:
            self._loaded = False
            raise

    def get(self, name: str, *, field: str = "") -> T:
        """The entry registered as ``name``, else raise :attr:`error` listing the known names.

        ``field`` is the config field the name came from; the message then starts with
        ``field='name':``. A ``lazy`` name imports its module first (its ``ImportError`` propagates).
        """
        self.load()
        try:
            return self._entries[name]
        except KeyError:
            pass
        except TypeError:  # an unhashable name
            raise self.error(self.unknown(name, field=field)) from None
        if name in self.lazy:
            importlib.import_module(self.lazy[name])
            if name in self._entries:
                return self._entries[name]
        raise self.error(self.unknown(name, field=field))

    def unknown(self, name: object, *, field: str = "") -> str:
        """The message for a name nothing is registered as (``field``: see :meth:`get`)."""
        how = f"; register one with {self.register_with}" if self.register_with else ""
        if field:
            return f"{field}={name!r}: unknown {self.kind}; known: {self.names()}{how}"
        return f"unknown {self.kind} {name!r}; known: {self.names()}{how}"

    def names(self) -> list[str]:
        """Every known name (lazy ones included), sorted unless the registry keeps registration order."""
        self.load()
        names = list(dict.fromkeys([*self._entries, *self.lazy]))
        return sorted(names) if self.sort else names

    def items(self) -> list[tuple[str, T]]:
        """``(name, entry)`` pairs in :meth:`names` order (a lazy name whose module is not imported yet
        is left out)."""
        return [(n, self._entries[n]) for n in self.names() if n in self._entries]

    def __contains__(self, name: object) -> bool:
        self.load()
        try:
            return name in self._entries or name in self.lazy
        except TypeError:  # an unhashable name
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())


def _same_definition(a: object, b: object) -> bool:
    """The same function or class defined again by a module re-executed (e.g. ``importlib.reload``).

    Only names a module defines at its top (or in its classes) count: two lambdas, or two local
    functions of one name, are different definitions even though their qualified names agree.
    """
    qa, qb = getattr(a, "__qualname__", None), getattr(b, "__qualname__", None)
    if not isinstance(qa, str) or qa != qb or "<" in qa:
        return False
    return getattr(a, "__module__", None) == getattr(b, "__module__", None)


def _describe(obj: object) -> str:
    mod, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    return f"{mod}.{name}" if mod and name else type(obj).__name__
