"""The one JSONL reader every data file goes through (bottom layer: imports only :mod:`horizonrl.errors`).

:func:`read_jsonl` yields one :class:`Record` (file, line number, JSON object)
per non-blank line, and turns every way a line can be bad into a
:class:`~horizonrl.errors.DataError` naming the file and line:

- bytes that are not UTF-8 (a UTF-8 byte-order mark at the start is skipped; a
  UTF-16/32 one is refused by name);
- a line that is not JSON, or is JSON but not an object;
- nesting deeper than the decoder's recursion limit, integers of more than
  :data:`MAX_INT_DIGITS` digits (Python refuses over 4,300 anyway, with a
  misleading hint), and ``NaN``/``Infinity`` unless ``allow_nan`` (rollout
  files hold non-finite log-probs legitimately).

A *torn last line* — the file does not end in a newline and its last line does
not parse, as a killed writer or a full disk leaves it — is the one case where
skipping is safe: it is dropped with a :class:`~horizonrl.errors.HorizonWarning`
and the rest is used (``torn_tail="error"`` refuses instead).

:meth:`Record.get` reads a field with a type check whose error names the file,
line and field (``bool`` is never accepted for ``int``/``float``; floats must be
finite unless ``allow_nan``).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from horizonrl.errors import DataError, HorizonWarning

#: Longest integer literal accepted (token ids, counts and ids are far shorter).
MAX_INT_DIGITS = 100

_BOMS = {
    b"\xff\xfe\x00\x00": "UTF-32",
    b"\x00\x00\xfe\xff": "UTF-32",
    b"\xff\xfe": "UTF-16",
    b"\xfe\xff": "UTF-16",
}
_UTF8_BOM = b"\xef\xbb\xbf"
_REQUIRED = object()


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise ValueError(f"integer with {digits} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not allowed here")


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"number {text} is out of the float range")
    return v


def loads(text: str, *, allow_nan: bool = False) -> Any:
    """``json.loads`` with the limits of this module; ValueError (never RecursionError) otherwise."""
    try:
        if allow_nan:
            return json.loads(text, parse_int=_parse_int)
        return json.loads(
            text, parse_int=_parse_int, parse_constant=_reject_constant, parse_float=_finite_float
        )
    except RecursionError:
        raise ValueError("nested too deeply") from None


def type_name(types: tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in types)


def check_type(value: Any, types: type | tuple[type, ...], *, allow_nan: bool = False) -> str | None:
    """Why ``value`` is not of ``types`` (None when it is). ``bool`` only passes for ``bool``;
    an ``int`` passes for ``float``; floats must be finite unless ``allow_nan``."""
    types = types if isinstance(types, tuple) else (types,)
    if isinstance(value, bool):
        ok = bool in types
    elif isinstance(value, int):
        ok = int in types or float in types
    else:
        ok = isinstance(value, types)
    if not ok:
        return f"must be {type_name(types)}, got {_short(value)}"
    if isinstance(value, float) and not allow_nan and not math.isfinite(value):
        return f"must be finite, got {value!r}"
    return None


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Record:
    """One JSON object of a JSONL file and where it came from."""

    path: str
    line: int
    value: dict[str, Any]

    def where(self, field: str | None = None) -> str:
        return f"{self.path}:{self.line}" + (f": field {field!r}" if field else "")

    def error(self, message: str, field: str | None = None) -> DataError:
        return DataError(f"{self.where(field)}: {message}")

    def get(self, key: str, types: type | tuple[type, ...], default: Any = _REQUIRED, *, allow_nan=False):
        """Field ``key`` checked against ``types`` (None passes when ``default`` is None)."""
        if key not in self.value and default is not _REQUIRED:
            return default
        value = self.value.get(key)
        if value is None and default is None:
            return None
        why = check_type(value, types, allow_nan=allow_nan)
        if why is not None:
            raise DataError(f"{self.where()}: field {key!r} {why}")
        return value


def read_jsonl(
    path: str | Path,
    *,
    allow_nan: bool = False,
    torn_tail: str = "warn",
    what: str = "records",
    on_bad: Callable[[str], None] | None = None,
) -> Iterator[Record]:
    """Every non-blank line of ``path`` as a :class:`Record` (module docstring for the rules).

    ``what`` names the contents in messages (e.g. ``"demonstrations"``). With ``on_bad``
    (a viewer that shows what it can), a bad line is reported to it and skipped instead
    of raising, and so is a torn last line instead of warning.
    """
    if torn_tail not in ("warn", "error"):
        raise ValueError(f"torn_tail={torn_tail!r}: must be 'warn' or 'error'")
    name = str(path)
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            if n == 1:
                for bom, enc in _BOMS.items():
                    if raw.startswith(bom):
                        raise DataError(f"{name}: the file is {enc} encoded; {what} must be UTF-8")
                raw = raw.removeprefix(_UTF8_BOM)
            torn = not raw.endswith(b"\n")
            try:
                text = raw.decode("utf-8")
                if not text.strip():
                    continue
                value = loads(text, allow_nan=allow_nan)
            except ValueError as e:  # UnicodeDecodeError is a ValueError too
                if torn and torn_tail == "warn":
                    _warn_torn(name, n, what, on_bad)
                    return
                if isinstance(e, UnicodeDecodeError):
                    bad = f"{name}:{n}: invalid UTF-8 at byte {e.start} of the line"
                else:
                    bad = (
                        f"{name}:{n}: not valid JSON ({e.msg if isinstance(e, json.JSONDecodeError) else e})"
                    )
                if on_bad is None:
                    raise DataError(bad) from None
                on_bad(bad + "; skipped")
                continue
            if not isinstance(value, dict):
                bad = f"{name}:{n}: expected a JSON object, got {type(value).__name__}"
                if on_bad is None:
                    raise DataError(bad)
                on_bad(bad + "; skipped")
                continue
            yield Record(name, n, value)


def append_jsonl(path: str | Path, obj: Any) -> None:
    """Append ``obj`` as one line. A torn last line (no newline: an interrupted write, which
    :func:`read_jsonl` skips) is cut off first, with a warning, so the file stays readable."""
    with open(path, "a+b") as f:
        size = f.seek(0, 2)
        if size:
            f.seek(size - 1)
            if f.read(1) != b"\n":
                end = _last_newline(f, size) + 1
                f.truncate(end)
                warnings.warn(
                    f"{path}: removed an incomplete last line ({size - end} bytes) before appending",
                    HorizonWarning,
                    stacklevel=2,
                )
        f.write((json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8"))


def _last_newline(f, size: int, chunk: int = 1 << 16) -> int:
    """Offset of the last ``\\n`` in the file (-1 if none)."""
    pos = size
    while pos > 0:
        start = max(0, pos - chunk)
        f.seek(start)
        k = f.read(pos - start).rfind(b"\n")
        if k >= 0:
            return start + k
        pos = start
    return -1


def _warn_torn(path: str, n: int, what: str, on_bad: Callable[[str], None] | None = None) -> None:
    msg = (
        f"{path}:{n}: the last line is incomplete (no newline, not valid JSON: an interrupted write); "
        f"skipped it and used the {what} before it"
    )
    if on_bad is not None:
        on_bad(msg)
    else:
        warnings.warn(msg, HorizonWarning, stacklevel=3)
