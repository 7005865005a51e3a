"""A safe arithmetic evaluator: numbers, ``+ - * /``, unary minus and parentheses.

The expression is parsed with :mod:`ast` and only those node types are
evaluated (exactly, with :class:`fractions.Fraction`); names, calls, attributes,
powers and everything else are rejected, so no code is ever executed.
"""

from __future__ import annotations

import ast
import math
import re
import warnings
from fractions import Fraction

MAX_LENGTH = 200
MAX_MAGNITUDE = 10**18
MAX_NUMBER_CHARS = 100  # longest answer parse_number reads as a number
MAX_EXPONENT = 400  # largest |exponent| of a number in e-notation parse_number accepts
_EXPONENT = re.compile(r"[eE]\s*[-+]?\s*0*(\d+)")

_BINOPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


class CalcError(ValueError):
    """An expression the calculator refuses or cannot evaluate."""


def safe_eval(expression: str) -> Fraction:
    """The exact value of ``expression``; CalcError if it is not plain arithmetic."""
    if not isinstance(expression, str):
        raise CalcError("expression must be a string")
    expr = expression.strip().replace("×", "*").replace("÷", "/").rstrip("=").strip()
    if not expr:
        raise CalcError("empty expression")
    if len(expr) > MAX_LENGTH:
        raise CalcError(f"expression longer than {MAX_LENGTH} characters")
    try:
        with warnings.catch_warnings():  # model text like "35x" makes ast warn before failing
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError):
        raise CalcError("cannot parse the expression") from None
    value = _eval(tree.body)
    if abs(value) > MAX_MAGNITUDE:
        raise CalcError("result too large")
    return value


def format_number(value: Fraction) -> str:
    """Integers as ``42``; other values as decimals with at most 6 places."""
    if value.denominator == 1:
        return str(value.numerator)
    text = f"{float(value):.6f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def calculate(expression: str) -> tuple[str, bool]:
    """(result text, invalid): the formatted value, or ``Error: ...`` with invalid True."""
    try:
        return format_number(safe_eval(expression)), False
    except CalcError as e:
        return f"Error: {e}. Use only numbers, + - * / and parentheses.", True


def parse_number(text: str) -> Fraction | None:
    """A number written by a model (``42``, ``-3.5``, ``1,200``, ``7/2``, ``1e3``), or None.

    Longer than :data:`MAX_NUMBER_CHARS` characters or with a decimal exponent over
    :data:`MAX_EXPONENT` is None: ``Fraction("1e100000000")`` would build a 10^8-digit integer.
    """
    text = str(text).strip().replace(",", "").rstrip(".").strip()
    if len(text) > MAX_NUMBER_CHARS:
        return None
    exp = _EXPONENT.search(text)
    if exp is not None and int(exp.group(1)) > MAX_EXPONENT:
        return None
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise CalcError(f"{node.value!r} is not a number")
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise CalcError("number too large")
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise CalcError("division by zero")
        value = _BINOPS[type(node.op)](left, right)
        if abs(value) > MAX_MAGNITUDE**2:
            raise CalcError("result too large")
        return value
    raise CalcError(f"{type(node).__name__.lower()} is not allowed")
