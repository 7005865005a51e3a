"""Linear-time, never-raising extraction of tagged blocks and JSON from model text.

Every parser of model output in the package (tool calls and answers, compaction and SUPO summaries,
ECHO findings and selections, the judge verdict, thinking removal) goes through these helpers, so each
one has the same three guarantees:

- **Size cap.** A parser first cuts its input to :data:`MAX_TEXT_CHARS` characters (:func:`cap_text`);
  text beyond is ignored, not an error. The cap is far above any generation budget (a 16k-token
  generation is under 100k characters), so it only bounds adversarial or runaway text.
- **Linear time.** The tag scanners use ``str.find`` only forward: every character of the text is
  scanned a bounded number of times, whatever the tags (``<tool_call>`` repeated 100,000 times without
  a close parses in milliseconds). Regular expressions with a lazy ``.*?`` and a closing tag, which
  rescan the rest of the text from every unterminated opening tag, are not used for this.
- **No exceptions from content.** :func:`load_json` turns every problem (syntax, nesting deeper than
  :data:`MAX_JSON_DEPTH`, an integer longer than :data:`MAX_JSON_INT_DIGITS` digits, a string with an
  unpaired surrogate escape) into a :class:`JSONError` with a one-line message; it never raises
  ``RecursionError`` or the interpreter's integer-conversion ``ValueError``.

It also holds the package's one answer normalizer, :func:`normalize_text`, shared by the answer rewards
(:mod:`horizonrl.rewards`, which re-exports it), the math checker (:mod:`horizonrl.math_answer`) and the
environments that compare answers.

This module imports nothing from the package (the bottom layer, beside ``trajectory``), so ``envs``,
``agents``, ``judge``, ``math_answer`` and ``rewards`` may all use it.
"""

from __future__ import annotations

import json
import string
import unicodedata
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_JSON_INT_DIGITS",
    "MAX_TEXT_CHARS",
    "THINK_CLOSE",
    "THINK_OPEN",
    "Block",
    "JSONError",
    "cap_text",
    "find_any",
    "first_block",
    "iter_blocks",
    "load_json",
    "normalize_text",
    "strip_blocks",
    "strip_think",
]

#: Characters of model text any parser looks at; the rest is cut (not an error).
MAX_TEXT_CHARS = 1_000_000
#: Deepest nesting of JSON arrays/objects :func:`load_json` accepts (``{"a": [1]}`` has depth 2).
MAX_JSON_DEPTH = 64
#: Most digits of a JSON integer :func:`load_json` accepts: 640 is the smallest limit
#: ``sys.set_int_max_str_digits`` allows, so every accepted integer prints back under any setting.
MAX_JSON_INT_DIGITS = 640

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


class Block(NamedTuple):
    """One tagged block in a text: ``text[start:end]`` is the whole block, ``text[body_start:body_end]``
    its content; ``closed`` says whether it ended with its closing tag."""

    start: int
    body_start: int
    body_end: int
    end: int
    closed: bool


class JSONError(ValueError):
    """Text that :func:`load_json` refuses. ``msg`` is one line; ``kind`` is ``invalid_json`` (syntax,
    unpaired surrogate) or ``too_large`` (nesting or integer length over the limits)."""

    def __init__(self, msg: str, kind: str = "invalid_json"):
        super().__init__(msg)
        self.msg = msg
        self.kind = kind


def cap_text(text: str | None) -> str:
    """``text`` cut to :data:`MAX_TEXT_CHARS` characters (``None`` becomes ``""``)."""
    if text is None:
        return ""
    return text if len(text) <= MAX_TEXT_CHARS else text[:MAX_TEXT_CHARS]


def find_any(text: str, needles: Iterable[str], start: int = 0, end: int | None = None) -> int:
    """The first index ``>= start`` (and before ``end``) at which any of ``needles`` begins, or -1."""
    stop = len(text) if end is None else end
    hits = [i for i in (text.find(s, start, stop) for s in needles) if i >= 0]
    return min(hits) if hits else -1


def first_block(
    text: str, open_tag: str, close_tag: str, start: int = 0, end: int | None = None
) -> Block | None:
    """The first ``open_tag`` in ``text[start:end]`` and its content up to the first ``close_tag``
    after it (what ``re.search(open + "(.*?)" + close, text, re.DOTALL)`` finds, plus the
    unterminated case). Unterminated: ``closed=False`` and the body runs to ``end`` (default: the end
    of the text). ``None`` without an opening tag. A closing tag must lie wholly before ``end``."""
    stop = len(text) if end is None else min(end, len(text))
    i = text.find(open_tag, start, stop)
    if i < 0:
        return None
    body = i + len(open_tag)
    j = text.find(close_tag, body, stop)
    if j < 0:
        return Block(i, body, stop, stop, False)
    return Block(i, body, j, j + len(close_tag), True)


def iter_blocks(text: str, open_tag: str, close_tag: str) -> Iterator[Block]:
    """Every ``open_tag`` block in order, where a block ends at its ``close_tag`` or, unterminated,
    where the next ``open_tag`` begins (or at the end of the text) — the Hermes tool-call convention.

    Linear: the next opening and the next closing tag are each searched only forward of the last one
    found, so ``open_tag * n`` takes ``O(n)``, not ``O(n^2)``.
    """
    n = len(text)
    nxt_open = text.find(open_tag)
    nxt_close = -2  # -2: not searched yet; -1: none left in the text
    while nxt_open >= 0:
        start = nxt_open
        body = start + len(open_tag)
        nxt_open = text.find(open_tag, body)
        if nxt_close != -1 and nxt_close < body:
            nxt_close = text.find(close_tag, body)
        if nxt_close >= 0 and (nxt_open < 0 or nxt_close < nxt_open):
            end = nxt_close + len(close_tag)
            yield Block(start, body, nxt_close, end, True)
            if 0 <= nxt_open < end:  # an opening tag overlapping the closing one (only odd tag pairs)
                nxt_open = text.find(open_tag, end)
        else:
            end = nxt_open if nxt_open >= 0 else n
            yield Block(start, body, end, end, False)


def strip_blocks(text: str, open_tag: str, close_tag: str, *, blank: bool = False) -> str:
    """``text`` without its ``open_tag ... close_tag`` blocks (each to the first closing tag after it;
    an unterminated one to the end), i.e. ``re.sub(open + ".*?(?:" + close + r"|\\Z)", "", text,
    flags=re.DOTALL)``. ``blank=True`` replaces each block by as many spaces, so offsets into the result
    are offsets into ``text``."""
    out: list[str] = []
    pos = 0
    while (i := text.find(open_tag, pos)) >= 0:
        j = text.find(close_tag, i + len(open_tag))
        end = len(text) if j < 0 else j + len(close_tag)
        out.append(text[pos:i])
        if blank:
            out.append(" " * (end - i))
        pos = end
        if j < 0:
            break
    if pos == 0:
        return text
    out.append(text[pos:])
    return "".join(out)


def strip_think(text: str, *, blank: bool = False) -> str:
    """``text`` without ``<think>...</think>`` blocks (an unterminated one runs to the end); not
    stripped of whitespace. ``blank=True`` keeps offsets (see :func:`strip_blocks`)."""
    return strip_blocks(text, THINK_OPEN, THINK_CLOSE, blank=blank)


# -- answer normalization -------------------------------------------------------------------------------

_PUNCT = set(string.punctuation) | {"‘", "’", "“", "”", "–", "—", "…", "«", "»"}


def normalize_text(text: str | None) -> str:
    """NFKC, lowercase, punctuation and the articles a/an/the removed, whitespace collapsed.

    The package's one answer normalizer (SQuAD style): exact match and token F1 compare normalized
    texts, and the math checker falls back to it; ``None`` normalizes to ``""``.
    """
    if text is None:
        return ""
    text = unicodedata.normalize("NFKC", str(text)).lower()
    text = "".join(" " if ch in _PUNCT else ch for ch in text)
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


def _parse_int(digits: str) -> int:
    if len(digits) - digits.startswith("-") > MAX_JSON_INT_DIGITS:
        raise JSONError(f"an integer has more than {MAX_JSON_INT_DIGITS} digits", "too_large")
    return int(digits)


def load_json(text: str) -> Any:
    """``json.loads(text)`` within the limits of this module, raising only :class:`JSONError`.

    ``NaN`` and ``Infinity`` are accepted as Python's ``json`` does; floats of any length are parsed by
    ``float`` (linear; out-of-range ones become ``inf``).
    """
    try:
        obj = json.loads(text, parse_int=_parse_int)
    except JSONError:
        raise
    except json.JSONDecodeError as e:
        raise JSONError(f"{e.msg} at char {e.pos}") from None
    except RecursionError:
        raise JSONError(f"nested deeper than {MAX_JSON_DEPTH} levels", "too_large") from None
    except ValueError as e:  # an integer over a lowered interpreter limit (sys.set_int_max_str_digits)
        raise JSONError(str(e).split(";")[0][:120], "too_large") from None
    _check_tree(obj)
    return obj


def _check_tree(obj: Any) -> None:
    """Depth and string checks over a decoded value, iteratively (no recursion on deep values)."""
    stack: list[tuple[Any, int]] = [(obj, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            _check_str(value)
            continue
        if not isinstance(value, dict | list):
            continue
        if depth >= MAX_JSON_DEPTH:
            raise JSONError(f"nested deeper than {MAX_JSON_DEPTH} levels", "too_large")
        if isinstance(value, dict):
            for key, item in value.items():
                _check_str(key)
                stack.append((item, depth + 1))
        else:
            stack.extend((item, depth + 1) for item in value)


def _check_str(s: str) -> None:
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            raise JSONError("a string has an unpaired surrogate \\u escape") from None
