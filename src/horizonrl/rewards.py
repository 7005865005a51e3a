"""Answer rewards: exact match, token F1 and math answer equivalence (pure functions, no model).

- :func:`normalize_text` is SQuAD-style normalization (Unicode NFKC, lowercase, punctuation and
  the articles *a/an/the* removed, whitespace collapsed).
- :func:`exact_match` / :func:`token_f1` score a prediction against one gold answer or a list of
  aliases (the best alias counts).
- :func:`math_equivalent` decides whether two math answers are the same value: it takes the last
  ``\\boxed{...}`` (or ``#### x``) of each side, strips LaTeX dressing (``$``, ``\\left``, ``\\text``
  units, degrees), and compares numbers, fractions (``3/4``, ``\\frac{3}{4}``, ``\\frac34``),
  decimals, percentages (``50%`` equals ``50`` and ``0.5``), tuples/intervals (ordered), sets and bare
  lists (unordered), and, through SymPy when it is importable, symbolic expressions
  (``\\sqrt{2}/2`` equals ``1/\\sqrt{2}``). Without SymPy a small exact rational parser is used.
  Model text is never ``eval``-ed: SymPy only sees strings made of digits, operators, single-letter
  symbols and a few whitelisted function names.

Rewards are registered by name (``@register_reward("name")``) so environments and configs can pick
one with :func:`get_reward`; every registered reward is ``fn(prediction, golds) -> float in [0, 1]``.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import TypeVar

__all__ = [
    "UnknownRewardError",
    "exact_match",
    "extract_math_answer",
    "get_reward",
    "list_rewards",
    "math_equivalent",
    "math_reward",
    "normalize_text",
    "register_reward",
    "token_f1",
]

RewardFn = Callable[[str | None, str | Sequence[str]], float]
R = TypeVar("R", bound=RewardFn)

_REGISTRY: dict[str, RewardFn] = {}


class UnknownRewardError(KeyError, ValueError):
    """Raised by :func:`get_reward` for a name that is not registered."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


def register_reward(name: str) -> Callable[[R], R]:
    """Decorator: register ``fn(prediction, golds) -> float`` under ``name``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"reward name must be a non-empty string, got {name!r}")

    def deco(fn: R) -> R:
        old = _REGISTRY.get(name)
        if old is not None and (old.__module__, old.__qualname__) != (fn.__module__, fn.__qualname__):
            raise ValueError(f"reward {name!r} is already registered by {old.__module__}.{old.__qualname__}")
        _REGISTRY[name] = fn
        return fn

    return deco


def get_reward(name: str) -> RewardFn:
    """The reward function registered as ``name``."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise UnknownRewardError(f"unknown reward {name!r}; known: {', '.join(list_rewards())}") from None


def list_rewards() -> list[str]:
    """Names of all registered rewards, sorted."""
    return sorted(_REGISTRY)


def _golds(golds: str | Sequence[str]) -> list[str]:
    """One gold answer or a sequence of aliases -> a non-empty list of strings."""
    if isinstance(golds, str):
        return [golds]
    out = [str(g) for g in golds]
    if not out:
        raise ValueError("golds must be a string or a non-empty sequence of strings, got an empty sequence")
    return out


# -- text rewards ----------------------------------------------------------------------------------------

_PUNCT = set(string.punctuation) | {"‘", "’", "“", "”", "–", "—", "…", "«", "»"}


def normalize_text(text: str | None) -> str:
    """NFKC, lowercase, punctuation and the articles a/an/the removed, whitespace collapsed."""
    if text is None:
        return ""
    text = unicodedata.normalize("NFKC", str(text)).lower()
    text = "".join(" " if ch in _PUNCT else ch for ch in text)
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


@register_reward("exact_match")
def exact_match(pred: str | None, golds: str | Sequence[str]) -> float:
    """1.0 if the normalized prediction equals any normalized gold alias, else 0.0 (None scores 0)."""
    if pred is None:
        return 0.0
    got = normalize_text(pred)
    return float(any(got == normalize_text(g) for g in _golds(golds)))


def _f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


@register_reward("token_f1")
def token_f1(pred: str | None, golds: str | Sequence[str]) -> float:
    """SQuAD token F1 of the normalized texts, the best over gold aliases (None scores 0)."""
    if pred is None:
        return 0.0
    tokens = normalize_text(pred).split()
    return max(_f1(tokens, normalize_text(g).split()) for g in _golds(golds))


# -- math answers ----------------------------------------------------------------------------------------


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
    ``####`` (GSM8K style), else the whole text, stripped."""
    if text is None:
        return ""
    text = str(text)
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


class _RationalParser:
    """Exact evaluator of ``+ - * / ^``, parentheses, ``\\frac{a}{b}``, ``\\cdot``/``\\times``/``\\div``
    and implicit products over decimal numbers; ``None`` for anything else (symbols, roots, ...)."""

    _TOKEN = re.compile(r"\s*(?:(" + _NUMBER + r")|(\\frac|\\cdot|\\times|\\div|\*\*|[-+*/^(){}]))")

    def __init__(self, text: str):
        self.tokens: list[str] = []
        pos = 0
        while pos < len(text.rstrip()):
            m = self._TOKEN.match(text, pos)
            if m is None:
                raise ValueError(f"unexpected character {text[pos:].strip()[:1]!r}")
            self.tokens.append(m.group(1) or m.group(2))
            pos = m.end()
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
            value = value + self._product() if self._take() == "+" else value - self._product()
        return value

    def _product(self) -> Fraction:
        value = self._unary()
        while True:
            tok = self._peek()
            if tok in ("*", "/", "\\cdot", "\\times", "\\div"):
                self._take()
                rhs = self._unary()
                value = value / rhs if tok in ("/", "\\div") else value * rhs
            elif tok is not None and (tok in ("(", "{", "\\frac") or tok[0].isdigit() or tok[0] == "."):
                value = value * self._unary()  # implicit product: 2(3), 2\cdot... written as 2 3
            else:
                return value

    def _unary(self) -> Fraction:
        if self._peek() in ("+", "-"):
            return -self._unary() if self._take() == "-" else self._unary()
        return self._power()

    def _power(self) -> Fraction:
        base = self._atom()
        if self._peek() in ("^", "**"):
            self._take()
            exp = self._unary()
            if exp.denominator != 1 or abs(exp) > 1000 or (base == 0 and exp < 0):
                raise ValueError(f"unsupported exponent {exp}")
            return base**exp.numerator
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
            return num / den
        if tok[0].isdigit() or tok[0] == ".":
            return Fraction(tok)
        raise ValueError(f"unexpected {tok!r}")


def _rational(text: str) -> Fraction | None:
    try:
        return _RationalParser(text).parse()
    except (ValueError, ZeroDivisionError, OverflowError):
        return None


_SYMPY_FUNCS = ("sqrt", "log", "ln", "exp", "sin", "cos", "tan", "pi", "oo", "abs")
_LATEX_TO_SYMPY = (
    (r"\\(cdot|times)", "*"),
    (r"\\div", "/"),
    (r"\\pi", " pi "),
    (r"\\infty", " oo "),
    (r"\\(ln|log|exp|sin|cos|tan)\b", r" \1"),
)


def _latex_to_sympy(text: str) -> str | None:
    """A SymPy-parsable string for ``text``, or None when it holds anything outside the whitelist."""
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
    if not re.fullmatch(r"[A-Za-z0-9\s+\-*/().]*", s) or len(s) > 300:
        return None
    if any(len(w) > 1 and w not in _SYMPY_FUNCS for w in re.findall(r"[A-Za-z]+", s)):
        return None  # only single-letter symbols and whitelisted functions reach parse_expr
    if re.search(r"\.(?!\d)", s):  # no attribute access: a dot must start decimals
        return None
    # Giant or chained powers (9**99**99) would hang the comparison.
    if re.search(r"\*\*\s*\(*\s*\d{4,}", s) or re.search(r"\*\*[^+\-*/]*\*\*", s):
        return None
    return s


def _sympy_equal(a: str, b: str) -> bool | None:
    """Symbolic/numeric equality through SymPy; None when SymPy is missing or cannot parse either side."""
    try:
        import sympy
        from sympy.parsing.sympy_parser import (
            convert_xor,
            implicit_multiplication_application,
            parse_expr,
            standard_transformations,
        )
    except ImportError:
        return None
    sa, sb = _latex_to_sympy(a), _latex_to_sympy(b)
    if sa is None or sb is None:
        return None
    transforms = (*standard_transformations, implicit_multiplication_application, convert_xor)
    local = {"ln": sympy.log, "abs": sympy.Abs, "pi": sympy.pi, "oo": sympy.oo, "e": sympy.E}
    try:
        ea = parse_expr(sa, local_dict=local, transformations=transforms, evaluate=True)
        eb = parse_expr(sb, local_dict=local, transformations=transforms, evaluate=True)
        diff = ea - eb
        if diff == 0:
            return True
        if not (ea.free_symbols or eb.free_symbols):
            value = complex(sympy.N(diff, 30))
            scale = max(1.0, abs(complex(sympy.N(eb, 30))))
            return abs(value) <= 1e-9 * scale
        return sympy.simplify(diff) == 0
    except Exception:  # any parse/eval failure means "not comparable"
        return None


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


def _scalar_equal(a: str, a_pct: bool, b: str, b_pct: bool) -> bool:
    va, vb = _rational(a), _rational(b)
    if va is not None and vb is not None:
        cands_a = {va, va / 100} if a_pct else {va}
        cands_b = {vb, vb / 100} if b_pct else {vb}
        return bool(cands_a & cands_b)
    if re.sub(r"\s+", "", a).lower() == re.sub(r"\s+", "", b).lower():
        return True
    verdict = _sympy_equal(a, b)
    if verdict is not None:
        return verdict
    return normalize_text(a) != "" and normalize_text(a) == normalize_text(b)


def math_equivalent(pred: str | None, gold: str) -> bool:
    """Whether ``pred`` states the same math answer as ``gold`` (see the module docstring)."""
    if pred is None:
        return False
    a, a_pct = _canonical(extract_math_answer(pred))
    b, b_pct = _canonical(extract_math_answer(gold))
    if not a or not b:
        return False
    ca, cb = _collection(a), _collection(b)
    if ca is not None or cb is not None:
        if ca is None or cb is None or ca[0] != cb[0] or len(ca[1]) != len(cb[1]):
            return False
        if ca[0] != "set":
            return all(_scalar_equal(x, a_pct, y, b_pct) for x, y in zip(ca[1], cb[1], strict=True))
        remaining = list(cb[1])
        for x in ca[1]:
            match = next((y for y in remaining if _scalar_equal(x, a_pct, y, b_pct)), None)
            if match is None:
                return False
            remaining.remove(match)
        return True
    return _scalar_equal(a, a_pct, b, b_pct)


@register_reward("math")
def math_reward(pred: str | None, golds: str | Sequence[str]) -> float:
    """1.0 if :func:`math_equivalent` holds for any gold alias, else 0.0."""
    return float(any(math_equivalent(pred, g) for g in _golds(golds)))
