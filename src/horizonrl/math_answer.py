"""Math answer equivalence under a time budget (the ``math_equivalent`` reward).

:func:`math_equivalent` decides whether two math answers are the same value: it takes the last
``\\boxed{...}`` (or ``#### x``) of each side, strips LaTeX dressing (``$``, ``\\left``, ``\\text``
units, degrees), and compares numbers, fractions (``3/4``, ``\\frac{3}{4}``, ``\\frac34``), decimals,
percentages (``50%`` equals ``50`` and ``0.5``), tuples/intervals (ordered), sets and bare lists
(unordered), and, through SymPy, symbolic expressions (``\\sqrt{2}/2`` equals ``1/\\sqrt{2}``).
Identical non-empty answer texts are always equivalent. Model text is never ``eval``-ed: SymPy only
sees strings made of digits, operators, single-letter symbols and a few whitelisted function names.

Time is bounded, not hoped for:

- everything done in this process is linear in the input or capped: an extracted answer longer
  than :data:`MAX_ANSWER_CHARS` or nested deeper than :data:`MAX_DEPTH` brackets is compared as
  text only; the exact rational evaluator refuses numbers over :data:`MAX_DIGITS` digits or with
  exponents over :data:`MAX_EXPONENT`, and any intermediate value over :data:`MAX_BITS` bits;
- SymPy runs in a child process (:mod:`horizonrl.sympy_worker`) that is killed when a comparison
  takes longer than ``timeout_s`` (default :data:`DEFAULT_TIMEOUT_S`); a comparison that ran out of
  time is "not equivalent" unless the texts match (``timeout_s`` is the budget of the whole call,
  shared by the elements of a tuple or set). Strings longer than :data:`MAX_SYMPY_CHARS`, with
  exponents of four or more digits or chained powers never reach SymPy.

Cost (2-core CPU, measured by ``tests/rewards/test_rewards_fuzz.py::test_cost_per_call``): numbers and
fractions ~20-60 us per call in process; a SymPy comparison ~1-5 ms round trip to the warm child;
a killed comparison costs ``timeout_s`` and the child's restart (~0.5 s, in the background).
"""

from __future__ import annotations

import re
import time
from fractions import Fraction

from horizonrl.textparse import cap_text, normalize_text

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "MAX_ANSWER_CHARS",
    "MAX_BITS",
    "MAX_DEPTH",
    "extract_math_answer",
    "latex_to_sympy",
    "math_equivalent",
]

DEFAULT_TIMEOUT_S = 2.0
MAX_ANSWER_CHARS = 1000  # longer extracted answers compare as text only
MAX_DEPTH = 50  # deeper bracket nesting compares as text only
MAX_DIGITS = 400  # digits of one number literal the rational evaluator accepts
MAX_EXPONENT = 400  # |e| of a literal such as 1e5
MAX_BITS = 4096  # numerator/denominator size of any intermediate rational value
MAX_POWERS = 16  # ^ / ** operators per answer for the rational evaluator
MAX_SYMPY_CHARS = 300
MAX_ITEMS = 32  # larger tuples/sets compare as text only


def _braced(text: str, start: int) -> tuple[str, int] | None:
    """Content of the ``{...}`` group opening at ``text[start]`` and the index after it (None if open)."""
    if start >= len(text) or text[start] != "{":
        return None
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
    return None


def extract_math_answer(text: str | None) -> str:
    """The answer part of ``text``: the last ``\\boxed{..}``/``\\fbox{..}``, else what follows the last
    ``####`` (GSM8K style), else the whole text, stripped (of its first
    :data:`horizonrl.textparse.MAX_TEXT_CHARS` characters)."""
    if text is None:
        return ""
    text = cap_text(str(text))
    for macro in ("\\boxed", "\\fbox"):
        i = text.rfind(macro)
        if i >= 0:
            j = i + len(macro)
            while j < len(text) and text[j] == " ":
                j += 1
            group = _braced(text, j)
            if group is not None:
                return group[0].strip()
            rest = text[j:].split("$")[0].strip()  # "\boxed 5"
            if rest:
                return rest
    if "####" in text:
        return text.rsplit("####", 1)[1].strip()
    return text.strip()


_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_WRAPPERS = (("\\(", "\\)"), ("\\[", "\\]"), ("$$", "$$"), ("$", "$"))
_TEXT_MACROS = ("\\text", "\\textbf", "\\textit", "\\mathrm", "\\mathbf", "\\mbox", "\\operatorname")


def _replace_macro_groups(text: str, macro: str, keep: bool) -> str:
    """Replace ``\\macro{x}`` by ``x`` (keep) or by a space."""
    out, pos = [], 0
    while (i := text.find(macro + "{", pos)) >= 0:
        group = _braced(text, i + len(macro))
        if group is None:
            break
        out.append(text[pos:i])
        out.append(group[0] if keep else " ")
        pos = group[1]
    out.append(text[pos:])
    return "".join(out)


def _fix_fracs(text: str) -> str:
    """``\\dfrac``/``\\tfrac`` -> ``\\frac`` and the shorthand ``\\frac12`` / ``\\frac1{x}`` -> braced."""
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", text)
    text = re.sub(r"\\frac\s*(\d)\s*\{", r"\\frac{\1}{", text)
    return re.sub(r"\\frac\s*\{([^{}]*)\}\s*(\d)", r"\\frac{\1}{\2}", text)


def _canonical(answer: str) -> tuple[str, bool]:
    """Strip LaTeX dressing from an extracted answer; returns ``(text, had_percent_sign)``."""
    s = answer.strip()
    for left, right in _WRAPPERS:
        if s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
            s = s[len(left) : len(s) - len(right)].strip()
    for tok in ("\\left", "\\right", "\\displaystyle", "\\!", "\\,", "\\;", "\\:", "\\ ", "~", "\\$"):
        s = s.replace(tok, " " if tok in ("\\ ", "~") else "")
    s = s.replace("$", "")
    for pat in (r"\^\s*\{\s*\\circ\s*\}", r"\^\s*\\circ", "°", r"\\circ", r"\\degree"):
        s = re.sub(pat, "", s)
    percent = bool(re.search(r"\\?%|\\percent", s))
    s = re.sub(r"\\?%|\\percent", "", s)
    stripped = s
    for macro in _TEXT_MACROS:  # units such as "5\text{ cm}": drop them unless nothing else is left
        stripped = _replace_macro_groups(stripped, macro, keep=False)
    if stripped.strip():
        s = stripped
    else:
        for macro in _TEXT_MACROS:
            s = _replace_macro_groups(s, macro, keep=True)
    s = _fix_fracs(s)
    # A mixed number "2\frac{1}{2}" is 5/2 (integer literal directly before a numeric fraction).
    s = re.sub(r"(?<![\d.)}^])(\d+)\s*\\frac\{(\d+)\}\{(\d+)\}", r"(\1+\\frac{\2}{\3})", s)
    s = s.replace("{,}", "")
    s = re.sub(r"(?<![\d.])\d{1,3}(?:,\d{3})+(?![\d.])", lambda m: m.group(0).replace(",", ""), s)
    s = s.strip().rstrip(".").strip()
    if s.count("=") == 1 and re.match(r"^\s*[A-Za-z]\w*\s*=", s):  # "x = 5" -> "5"
        s = s.split("=", 1)[1].strip()
    return s, percent


def _depth(text: str) -> int:
    """Maximum nesting depth of ``([{`` brackets (linear scan)."""
    depth = best = 0
    for ch in text:
        if ch in "([{":
            depth += 1
            best = max(best, depth)
        elif ch in ")]}":
            depth = max(0, depth - 1)
    return best


def _number(token: str) -> Fraction:
    """A decimal literal as an exact Fraction, refusing huge digit counts and exponents."""
    mantissa, _, exp = token.lower().partition("e")
    if len(mantissa) > MAX_DIGITS or (exp and abs(int(exp)) > MAX_EXPONENT):
        raise ValueError(f"number too large: {token[:20]}...")
    return Fraction(token)


def _checked(value: Fraction) -> Fraction:
    if value.numerator.bit_length() > MAX_BITS or value.denominator.bit_length() > MAX_BITS:
        raise ValueError("intermediate value too large")
    return value


class _RationalParser:
    """Exact evaluator of ``+ - * / ^``, parentheses, ``\\frac{a}{b}``, ``\\cdot``/``\\times``/``\\div``
    and implicit products over decimal numbers; ``ValueError`` for anything else (symbols, roots, ...)
    and for values beyond the size limits of the module docstring."""

    _TOKEN = re.compile(r"\s*(?:(" + _NUMBER + r")|(\\frac|\\cdot|\\times|\\div|\*\*|[-+*/^(){}]))")

    def __init__(self, text: str):
        self.tokens: list[str] = []
        pos, end = 0, len(text.rstrip())
        while pos < end:
            m = self._TOKEN.match(text, pos)
            if m is None:
                raise ValueError(f"unexpected character {text[pos:].strip()[:1]!r}")
            self.tokens.append(m.group(1) or m.group(2))
            pos = m.end()
        if sum(t in ("^", "**") for t in self.tokens) > MAX_POWERS:
            raise ValueError("too many powers")
        self.i = 0

    def _peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def _take(self, expected: str | None = None) -> str:
        tok = self._peek()
        if tok is None or (expected is not None and tok != expected):
            raise ValueError(f"expected {expected or 'a token'}, got {tok!r}")
        self.i += 1
        return tok

    def parse(self) -> Fraction:
        value = self._sum()
        if self._peek() is not None:
            raise ValueError(f"unexpected {self._peek()!r}")
        return value

    def _sum(self) -> Fraction:
        value = self._product()
        while self._peek() in ("+", "-"):
            op = self._take()
            rhs = self._product()
            value = _checked(value + rhs if op == "+" else value - rhs)
        return value

    def _product(self) -> Fraction:
        value = self._unary()
        while True:
            tok = self._peek()
            if tok in ("*", "/", "\\cdot", "\\times", "\\div"):
                self._take()
                rhs = self._unary()
                value = _checked(value / rhs if tok in ("/", "\\div") else value * rhs)
            elif tok is not None and (tok in ("(", "{", "\\frac") or tok[0].isdigit() or tok[0] == "."):
                value = _checked(value * self._unary())  # implicit product: 2(3), 2\frac{1}{2}
            else:
                return value

    def _unary(self) -> Fraction:
        negative = False
        while self._peek() in ("+", "-"):  # iterative: a run of signs cannot exhaust the stack
            negative ^= self._take() == "-"
        value = self._power()
        return -value if negative else value

    def _power(self) -> Fraction:
        base = self._atom()
        if self._peek() in ("^", "**"):
            self._take()
            exp = self._unary()
            if exp.denominator != 1 or abs(exp) > 1000 or (base == 0 and exp < 0):
                raise ValueError(f"unsupported exponent {exp}")
            size = max(base.numerator.bit_length(), base.denominator.bit_length())
            if abs(base) not in (0, 1) and size * abs(exp.numerator) > MAX_BITS:
                raise ValueError("power too large")
            return _checked(base**exp.numerator)
        return base

    def _atom(self) -> Fraction:
        tok = self._take()
        if tok in ("(", "{"):
            value = self._sum()
            self._take(")" if tok == "(" else "}")
            return value
        if tok == "\\frac":
            self._take("{")
            num = self._sum()
            self._take("}")
            self._take("{")
            den = self._sum()
            self._take("}")
            return _checked(num / den)
        if tok[0].isdigit() or tok[0] == ".":
            return _number(tok)
        raise ValueError(f"unexpected {tok!r}")


def _rational(text: str) -> Fraction | None:
    try:
        return _RationalParser(text).parse()
    except (ValueError, ZeroDivisionError, OverflowError, RecursionError):
        return None


_SYMPY_FUNCS = ("sqrt", "log", "ln", "exp", "sin", "cos", "tan", "pi", "oo", "abs")
_LATEX_TO_SYMPY = (
    (r"\\(cdot|times)", "*"),
    (r"\\div", "/"),
    (r"\\pi", " pi "),
    (r"\\infty", " oo "),
    (r"\\(ln|log|exp|sin|cos|tan)\b", r" \1"),
)


def latex_to_sympy(text: str) -> str | None:
    """A SymPy-parsable string for ``text``, or None when it holds anything outside the whitelist or
    could be expensive (too long, 4+ digit exponents, chained powers)."""
    if len(text) > MAX_SYMPY_CHARS:
        return None
    s = text
    # \frac{a}{b} -> ((a)/(b)), innermost first
    for _ in range(20):
        i = s.find("\\frac{")
        if i < 0:
            break
        num = _braced(s, i + 5)
        den = _braced(s, num[1]) if num else None
        if num is None or den is None:
            return None
        s = s[:i] + f"(({num[0]})/({den[0]}))" + s[den[1] :]
    for _ in range(20):  # \sqrt[n]{x} -> ((x)**(1/(n))), \sqrt{x} -> sqrt(x)
        m = re.search(r"\\sqrt\s*(?:\[([^\]]*)\])?\s*\{", s)
        if m is None:
            break
        arg = _braced(s, m.end() - 1)
        if arg is None:
            return None
        repl = f"(({arg[0]})**(1/({m.group(1)})))" if m.group(1) else f"sqrt({arg[0]})"
        s = s[: m.start()] + repl + s[arg[1] :]
    s = re.sub(r"\\sqrt\s*(\d+|[A-Za-z])", r"sqrt(\1)", s)
    for pat, repl in _LATEX_TO_SYMPY:
        s = re.sub(pat, repl, s)
    s = s.replace("{", "(").replace("}", ")").replace("^", "**")
    if not re.fullmatch(r"[A-Za-z0-9\s+\-*/().]*", s) or len(s) > MAX_SYMPY_CHARS:
        return None
    if any(len(w) > 1 and w not in _SYMPY_FUNCS for w in re.findall(r"[A-Za-z]+", s)):
        return None  # only single-letter symbols and whitelisted functions reach parse_expr
    if re.search(r"\.(?!\d)", s):  # no attribute access: a dot must start decimals
        return None
    if re.search(rf"\d{{{MAX_DIGITS},}}", s) or _depth(s) > MAX_DEPTH:
        return None
    # Giant or chained powers (9**99**99, 1e999999) would hang the comparison; with symbols, even a
    # three-digit power is an expansion SymPy's simplify may not finish.
    big = r"\*\*\s*\(*\s*\d{3,}" if re.search(r"[A-Za-z]", s) else r"\*\*\s*\(*\s*\d{4,}"
    if re.search(big, s) or re.search(r"\*\*[^+\-*/]*\*\*", s) or re.search(r"\d[eE][-+]?\d{3,}", s):
        return None
    return s


def _sympy_equal(a: str, b: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool | None:
    """Symbolic/numeric equality through SymPy in the worker process (:mod:`horizonrl.sympy_worker`);
    None when either side is not convertible, SymPy is missing, or the comparison ran out of time."""
    sa, sb = latex_to_sympy(a), latex_to_sympy(b)
    if sa is None or sb is None:
        return None
    from horizonrl.sympy_worker import default_worker

    return default_worker().equal(sa, sb, timeout_s)


def _split_top_level(text: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts]


def _collection(text: str) -> tuple[str, list[str]] | None:
    """``(kind, items)`` for ``(a, b)``/``[a, b)`` (kind = the brackets, ordered), ``\\{a, b\\}``/bare
    ``a, b`` (kind ``set``, unordered); None for a single value."""
    s = text.strip()
    if s.startswith("\\{") and s.endswith("\\}"):
        return "set", _split_top_level(s[2:-2])
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]":
        inner = s[1:-1]
        depth = 0
        for ch in inner:  # "(1+2)*(3)" is not a tuple: the outer brackets must enclose everything
            depth += ch in "([{"
            depth -= ch in ")]}"
            if depth < 0:
                return None
        items = _split_top_level(inner)
        return (s[0] + s[-1], items) if len(items) > 1 else None
    items = _split_top_level(s)
    return ("set", items) if len(items) > 1 else None


def _text_equal(a: str, b: str) -> bool:
    return re.sub(r"\s+", "", a).lower() == re.sub(r"\s+", "", b).lower()


def _scalar_equal(a: str, a_pct: bool, b: str, b_pct: bool, deadline: float) -> bool:
    va, vb = _rational(a), _rational(b)
    if va is not None and vb is not None:
        cands_a = {va, va / 100} if a_pct else {va}
        cands_b = {vb, vb / 100} if b_pct else {vb}
        return bool(cands_a & cands_b)
    if _text_equal(a, b):
        return True
    left = deadline - time.monotonic()
    verdict = _sympy_equal(a, b, left) if left > 0 else None
    if verdict is not None:
        return verdict
    return normalize_text(a) != "" and normalize_text(a) == normalize_text(b)


def math_equivalent(pred: str | None, gold: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Whether ``pred`` states the same math answer as ``gold`` (see the module docstring).

    ``timeout_s`` is the SymPy budget of the whole call (shared by the elements of a tuple or set);
    a comparison it cuts short counts as "not equivalent" unless the texts match.
    """
    if pred is None:
        return False
    deadline = time.monotonic() + timeout_s
    ea, eb = extract_math_answer(pred), extract_math_answer(gold)
    if not ea or not eb:
        return False
    if ea == eb:
        return True
    if max(len(ea), len(eb)) > MAX_ANSWER_CHARS or max(_depth(ea), _depth(eb)) > MAX_DEPTH:
        return _text_equal(ea, eb)
    a, a_pct = _canonical(ea)
    b, b_pct = _canonical(eb)
    if not a or not b:
        return False
    ca, cb = _collection(a), _collection(b)
    if ca is not None or cb is not None:
        if ca is None or cb is None or ca[0] != cb[0] or len(ca[1]) != len(cb[1]):
            return False
        if len(ca[1]) > MAX_ITEMS:
            return _text_equal(a, b)
        if ca[0] != "set":
            return all(_scalar_equal(x, a_pct, y, b_pct, deadline) for x, y in zip(ca[1], cb[1], strict=True))
        remaining = list(cb[1])
        for x in ca[1]:
            match = next((y for y in remaining if _scalar_equal(x, a_pct, y, b_pct, deadline)), None)
            if match is None:
                return False
            remaining.remove(match)
        return True
    return _scalar_equal(a, a_pct, b, b_pct, deadline)
