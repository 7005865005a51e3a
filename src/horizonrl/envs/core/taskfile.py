"""Tasks from local files (``env.tasks``), loaded with the ``datasets`` library.

::

    env:
      name: search
      tasks: {path: data/questions.jsonl, prompt: question, answer: answer, id: qid, split: split}

``path`` is a ``.jsonl``/``.json``/``.csv``/``.parquet`` file, or ``{train: FILE, test: FILE}``.
The other keys name columns: ``prompt`` (default ``prompt``) and ``answer`` (default ``answer``)
are required in every row; ``id`` (default: a hash of the row's content), ``aliases`` (a list of
other accepted answers) and ``split`` (a column whose values are ``train`` or ``test``;
``validation`` counts as test) are optional. Without a split column (and with a single file) a
row's split is the hash bucket of its content (:func:`horizonrl.envs.core.common.split_of`, 20% test),
the same rule generated tasks follow. An answer may be a string, a number or a non-empty list
(the first item is the answer, the rest aliases). Every other column is kept in
``Task.meta["fields"]`` for the environment (e.g. ``facts`` for ``lookup``). A row identical to an
earlier one (prompt, answers and other columns) is dropped.

Files are read with ``datasets.Dataset.from_json`` / ``from_csv`` / ``from_parquet`` from local
paths only (``HF_DATASETS_OFFLINE=1`` is set; the hub is never contacted), into memory, with a
throw-away cache directory; CSV cells are read as text. A JSON-lines file whose column types vary
between rows (which pyarrow cannot hold) is read line by line instead. A bad file or row raises
:class:`TaskFileError`, one line that names the file, the line (``.jsonl``, ``.csv``) or row
(``.json``, ``.parquet``) and the field.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from horizonrl.envs.core.base import Task
from horizonrl.envs.core.common import split_of
from horizonrl.textparse import JSONError, load_json

__all__ = ["FORMATS", "TaskFileError", "TaskFileSpec", "load_task_file"]

FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
SPLIT_VALUES = {"train": "train", "test": "test", "validation": "test"}
_KEYS = ("path", "prompt", "answer", "id", "split", "aliases")


class TaskFileError(ValueError):
    """A task file or ``env.tasks`` entry that cannot be used (one line, names file/line/field)."""


@dataclass(frozen=True)
class TaskFileSpec:
    """Where the tasks are and which columns hold what (see the module docstring)."""

    paths: tuple[tuple[str | None, str], ...]  # (fixed split or None, path)
    prompt: str = "prompt"
    answer: str = "answer"
    id: str | None = None
    split: str | None = None
    aliases: str | None = None

    @classmethod
    def from_mapping(cls, spec: Mapping[str, Any], what: str = "env.tasks") -> TaskFileSpec:
        if not isinstance(spec, Mapping):
            raise TaskFileError(f"{what}={spec!r}: expected a mapping with at least 'path'")
        unknown = sorted(set(spec) - set(_KEYS))
        if unknown:
            raise TaskFileError(f"{what}: unknown key(s) {unknown}; known: {list(_KEYS)}")
        raw = spec.get("path")
        if isinstance(raw, str) and raw:
            paths: list[tuple[str | None, str]] = [(None, raw)]
        elif isinstance(raw, Mapping) and raw and set(raw) <= {"train", "test"}:
            paths = [(str(k), v) for k, v in raw.items()]
        else:
            raise TaskFileError(f"{what}.path={raw!r}: expected a file path or {{train: FILE, test: FILE}}")
        for _, p in paths:
            if not isinstance(p, str) or Path(p).suffix.lower() not in FORMATS:
                raise TaskFileError(f"{what}.path={p!r}: the file must end in {', '.join(FORMATS)}")
        cols = {}
        for key in ("prompt", "answer", "id", "split", "aliases"):
            value = spec.get(key, getattr(cls, key))
            if value is not None and (not isinstance(value, str) or not value):
                raise TaskFileError(f"{what}.{key}={value!r}: expected a column name")
            cols[key] = value
        if cols["split"] is not None and any(s is not None for s, _ in paths):
            raise TaskFileError(
                f"{what}: give either a split column or {{train: FILE, test: FILE}}, not both"
            )
        return cls(paths=tuple(paths), **cols)


def _read(path: Path) -> tuple[list[dict[str, Any]], list[str] | None]:
    """Rows of ``path`` through ``datasets`` (in memory, offline), and their locations when known.

    pyarrow infers one type per JSON column, so a column that is a number in one row and a list in
    the next cannot be read by ``datasets``; such a file, once every line is checked to be a JSON
    object, is taken from that line-by-line check instead (its values unchanged).
    """
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        import datasets
    except ImportError:
        raise TaskFileError("env.tasks needs the 'datasets' package: pip install 'horizonrl[data]'") from None
    datasets.disable_progress_bars()
    fmt = FORMATS[path.suffix.lower()]
    reader = {"json": datasets.Dataset.from_json, "csv": datasets.Dataset.from_csv}.get(
        fmt, datasets.Dataset.from_parquet
    )
    kwargs: dict[str, Any] = {}
    if fmt == "csv":  # every cell as text: "007" stays "007", "NA" stays "NA"
        with open(path, encoding="utf-8-sig", errors="replace", newline="") as f:
            header = next(csv.reader(f), [])
        kwargs = {
            "features": datasets.Features({c: datasets.Value("string") for c in header}),
            "keep_default_na": False,
            "na_filter": False,
            "encoding": "utf-8-sig",
        }
    level = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(logging.CRITICAL + 1)  # its "Failed to load JSON" log: we say it better
    with tempfile.TemporaryDirectory(prefix="horizonrl-tasks-") as cache:
        try:
            return reader(str(path), keep_in_memory=True, cache_dir=cache, **kwargs).to_list(), None
        except Exception as e:  # datasets/pyarrow errors: find the line ourselves
            problem, rows = _scan(path, fmt)
            if problem is not None or rows is None:
                cause = e.__cause__ or e.__context__ or e
                first = str(cause).splitlines()[0][:200] if str(cause) else ""
                raise TaskFileError(
                    problem or f"{path}: cannot be read as {fmt}: {type(cause).__name__}: {first}"
                ) from None
            return [r for _, r in rows], [w for w, _ in rows]
        finally:
            datasets.logging.set_verbosity(level)


def _scan(path: Path, fmt: str) -> tuple[str | None, list[tuple[str, dict[str, Any]]] | None]:
    """Check a file ``datasets`` could not read: ``(problem, None)`` naming the first bad line, or
    for JSON lines that are all objects ``(None, [(location, row), ...])``."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        return f"{path}:{line}: not valid UTF-8 (byte {raw[e.start]:#04x})", None
    if fmt != "json" or path.suffix.lower() != ".jsonl":
        return None, None
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = load_json(line)
        except JSONError as e:
            return f"{path}:{lineno}: not valid JSON ({str(e)[:80]})", None
        if not isinstance(row, dict):
            return f"{path}:{lineno}: expected a JSON object per line, got {type(row).__name__}", None
        rows.append((f"{path}:{lineno}", row))
    return None, rows


def _locations(path: Path, n: int) -> list[str]:
    """``file:line`` (jsonl: non-blank lines; csv: the record's first line) or ``file row N``."""
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        text = path.read_bytes().decode("utf-8-sig", errors="replace")
        lines = [i for i, line in enumerate(text.splitlines(), 1) if line.strip()]
    elif suffix == ".csv":
        text = path.read_bytes().decode("utf-8-sig", errors="replace")
        reader = csv.reader(io.StringIO(text, newline=""))
        lines, start = [], 1
        for i, _ in enumerate(reader):
            if i > 0:
                lines.append(start)
            start = reader.line_num + 1
    else:
        return [f"{path} row {i}" for i in range(1, n + 1)]
    if len(lines) != n:  # the reader skipped or merged lines differently: fall back to row numbers
        return [f"{path} row {i}" for i in range(1, n + 1)]
    return [f"{path}:{i}" for i in lines]


def _jsonable(value: Any) -> Any:
    """``value`` with anything JSON cannot hold (dates, bytes, NaN) turned into text / None."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, Sequence | set | tuple) and not isinstance(value, bytes | bytearray):
        return [_jsonable(v) for v in value]
    return str(value)


def _text(value: Any, where: str, field: str, role: str) -> str:
    if isinstance(value, bool) or value is None:
        problem = "missing" if value is None else f"{value!r}, not text"
        raise TaskFileError(f"{where}: field {field!r} ({role}) is {problem}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, str | int | float) or (isinstance(value, float) and not math.isfinite(value)):
        raise TaskFileError(f"{where}: field {field!r} ({role}) must be text or a number, got {value!r:.80}")
    text = str(value).strip()
    if not text:
        raise TaskFileError(f"{where}: field {field!r} ({role}) is empty")
    return text


def _answers(value: Any, where: str, field: str) -> list[str]:
    if isinstance(value, list | tuple):
        if not value:
            raise TaskFileError(f"{where}: field {field!r} (answer) is an empty list")
        return [_text(v, where, field, "answer") for v in value]
    return [_text(value, where, field, "answer")]


def load_task_file(
    spec: TaskFileSpec, env: str, *, required_fields: Sequence[str] = ()
) -> dict[str, list[Task]]:
    """``{"train": [...], "test": [...]}`` tasks for environment ``env`` from ``spec``'s file(s).

    ``required_fields`` are extra columns every row must have (an environment's ``task_fields``).
    """
    out: dict[str, list[Task]] = {"train": [], "test": []}
    seen_ids: dict[str, str] = {}
    seen_rows: set[str] = set()
    mapped = {spec.prompt, spec.answer, spec.id, spec.split, spec.aliases} - {None}
    for fixed_split, raw_path in spec.paths:
        path = Path(raw_path).expanduser()
        if not path.is_file():
            raise TaskFileError(f"env.tasks.path: file {raw_path!r} does not exist (cwd {os.getcwd()})")
        rows, where_known = _read(path)
        if not rows:
            raise TaskFileError(f"{path}: has no rows")
        columns = set(rows[0])
        for col, key in (
            (spec.prompt, "prompt"),
            (spec.answer, "answer"),
            (spec.id, "id"),
            (spec.split, "split"),
        ):
            if col is not None and col not in columns:
                raise TaskFileError(
                    f"{path}: no column {col!r} (env.tasks.{key}); columns: {', '.join(sorted(columns))}"
                )
        for col in required_fields:
            if col not in columns:
                raise TaskFileError(
                    f"{path}: environment {env!r} needs a column {col!r}; "
                    f"columns: {', '.join(sorted(columns))}"
                )
        for where, row in zip(where_known or _locations(path, len(rows)), rows, strict=True):
            prompt = _text(row.get(spec.prompt), where, spec.prompt, "prompt")
            answers = _answers(row.get(spec.answer), where, spec.answer)
            if spec.aliases is not None and row.get(spec.aliases) is not None:
                extra = row[spec.aliases]
                answers += _answers(extra if isinstance(extra, list) else [extra], where, spec.aliases)
            for col in required_fields:
                if row.get(col) is None:
                    raise TaskFileError(f"{where}: field {col!r} is missing (environment {env!r} needs it)")
            if spec.split is not None:
                value = row.get(spec.split)
                split = SPLIT_VALUES.get(str(value).strip().lower()) if value is not None else None
                if split is None:
                    raise TaskFileError(
                        f"{where}: field {spec.split!r} (split) must be train, test or validation, "
                        f"got {value!r}"
                    )
            else:
                split = None
            fields = {k: _jsonable(v) for k, v in row.items() if k not in mapped}
            content = json.dumps([prompt, answers, fields], sort_keys=True)
            split = split or fixed_split or split_of(content)
            if content in seen_rows:
                continue
            seen_rows.add(content)
            if spec.id is not None:
                task_id = _text(row.get(spec.id), where, spec.id, "id")
            else:
                task_id = f"{env}-{hashlib.sha256(content.encode()).hexdigest()[:12]}"
            if task_id in seen_ids:
                raise TaskFileError(f"{where}: id {task_id!r} repeats the id of {seen_ids[task_id]}")
            seen_ids[task_id] = where
            meta = {
                "env": env,
                "split": split,
                "source": "file",
                "file": str(path),
                "row": where,
                "fields": fields,
            }
            out[split].append(Task(task_id, prompt, answers[0], tuple(answers[1:]), meta))
    return out
