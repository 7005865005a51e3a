"""``arithmetic``: multi-step arithmetic with a ``calculator(expression)`` tool.

A task is an expression of ``n_ops`` operations built by repeatedly combining
the expression so far with a new operand (on the left or the right), printed with
the usual precedence and minimal parentheses::

    Compute (17 + 5) * 3.

The calculator evaluates plain arithmetic safely (:mod:`.calculator`). The
expert computes one operation per call (``17 + 5`` -> ``22``, ``22 * 3`` ->
``66``), then answers. Division only appears when it is exact.
"""

from __future__ import annotations

import random
from fractions import Fraction
from typing import Any, ClassVar

from horizonrl.envs.builtin.calculator import calculate, format_number, parse_number
from horizonrl.envs.core.base import Task
from horizonrl.envs.core.common import ToolEnv, check_int, check_noise
from horizonrl.envs.core.registry import register_env
from horizonrl.envs.core.tools import Tool, ToolCall, format_answer, format_tool_call

ALL_OPS = "+-*/"
TOOL_FAILURE = "Error: the calculator timed out; call it again."
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}

CALCULATOR = Tool(
    "calculator",
    "Evaluate an arithmetic expression with + - * / and parentheses.",
    {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. 2 * (3 + 4)"}},
        "required": ["expression"],
    },
)


def _num(x: Fraction | int) -> str:
    text = format_number(Fraction(x))
    return f"({text})" if text.startswith("-") else text


def _apply(a: Fraction, op: str, b: Fraction) -> Fraction:
    return a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a / b


def step_values(start: int, steps: list[list[Any]]) -> list[Fraction]:
    """Values after each step; a step is ``[op, operand, side]`` with side ``right`` (v op x) or ``left``."""
    v, out = Fraction(start), []
    for op, x, side in steps:
        v = _apply(v, op, Fraction(x)) if side == "right" else _apply(Fraction(x), op, v)
        out.append(v)
    return out


def render(start: int, steps: list[list[Any]]) -> str:
    """The expression text with minimal parentheses (same-precedence right operands are bracketed)."""
    text, prec = _num(start), 3
    for op, x, side in steps:
        p = _PREC[op]
        if side == "right":
            text, prec = f"{text if prec >= p else f'({text})'} {op} {_num(x)}", p
        else:
            text, prec = f"{_num(x)} {op} {text if prec > p else f'({text})'}", p
    return text


@register_env("arithmetic")
class ArithmeticEnv(ToolEnv):
    """Multi-step arithmetic with a calculator (see module docstring).

    Knobs: ``n_ops`` (1-10, default 2) operations; ``min_operand``/``max_operand``
    (default 1/20) operand range; ``ops`` (default ``"+-*"``) the operators used,
    any non-empty subset of ``"+-*/"``; ``tool_noise`` (default 0) the probability
    that a call fails transiently ("timed out; call it again") and costs a turn —
    randomness *after* a decision, drawn from the instance's own RNG (not part of
    the snapshot, so siblings restored from one boundary draw it afresh). The
    expert retries a failed call.
    """

    KNOBS: ClassVar[dict[str, Any]] = {
        "n_ops": 2,
        "min_operand": 1,
        "max_operand": 20,
        "ops": "+-*",
        "tool_noise": 0.0,
    }
    system_prompt: ClassVar[str] = (
        f"Compute the result one operation at a time with {CALCULATOR.example_call()}, "
        "then give the final answer as <answer>...</answer>."
    )

    @property
    def tools(self) -> list[Tool]:
        return [CALCULATOR]

    @classmethod
    def _check_knobs(cls, knobs: dict[str, Any]) -> None:
        check_int(cls.name, "n_ops", knobs["n_ops"], 1, 10)
        check_int(cls.name, "min_operand", knobs["min_operand"], -(10**6), 10**6)
        check_int(cls.name, "max_operand", knobs["max_operand"], knobs["min_operand"], 10**6)
        p = knobs["tool_noise"]
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= p <= 1.0:
            raise ValueError(f"{cls.name}: knob 'tool_noise' must be a number in [0, 1], got {p!r}")
        ops = knobs["ops"]
        if (
            not isinstance(ops, str)
            or not ops
            or any(o not in ALL_OPS for o in ops)
            or len(set(ops)) != len(ops)
        ):
            raise ValueError(
                f"{cls.name}: knob 'ops' must be a non-empty string of distinct operators from {ALL_OPS!r}, "
                f"got {ops!r}"
            )

    @classmethod
    def _generate(cls, rng: random.Random, knobs: dict[str, Any]) -> dict[str, Any] | None:
        lo, hi = knobs["min_operand"], knobs["max_operand"]
        start = rng.randint(lo, hi)
        steps: list[list[Any]] = []
        value = Fraction(start)
        for _ in range(knobs["n_ops"]):
            op = rng.choice(knobs["ops"])
            if op == "/":
                tries = [rng.randint(lo, hi) for _ in range(20)]
                pool = range(lo, hi + 1) if hi - lo <= 10_000 else tries
                divisors = [d for d in pool if d != 0 and value % d == 0]
                if not divisors:
                    return None
                step = ["/", rng.choice(divisors), "right"]
            else:
                step = [op, rng.randint(lo, hi), rng.choice(("left", "right"))]
            steps.append(step)
            value = step_values(start, steps)[-1]
        answer = format_number(value)
        meta = {"start": start, "steps": steps}
        prompt = f"Compute {render(start, steps)}."
        return {"prompt": prompt, "answer": answer, "meta": meta, "key": prompt}

    def _init_state(self, task: Task) -> dict[str, Any]:
        return {"start": task.meta["start"], "steps": [list(s) for s in task.meta["steps"]], "results": []}

    def _call_tool(self, call: ToolCall) -> tuple[str, bool]:
        p = float(self.knobs.get("tool_noise", 0.0))
        if p > 0 and self._noise_rng().random() < p:  # a transient tool failure: retry to get the value
            return TOOL_FAILURE, False
        text, invalid = calculate(call.arguments["expression"])
        if not invalid and text not in self.state["results"]:
            self.state["results"].append(text)
        return text, invalid

    def _noise_rng(self) -> random.Random:
        """The instance's own RNG (seeded from Python's global RNG), not part of the snapshot."""
        rng = getattr(self, "_rng", None)
        if rng is None:
            rng = self._rng = random.Random(random.getrandbits(64))
        return rng

    def check_answer(self, answer: str) -> bool:
        got, want = parse_number(answer), Fraction(self.state["answer"])
        return got is not None and abs(got - want) <= Fraction(1, 10**6) * max(1, abs(want))

    def state_key(self) -> str | None:
        if not self.state:
            return None
        return f"{self.state['task_id']}|results={','.join(sorted(self.state['results']))}"

    def expert_action(self, rng: random.Random, noise: float = 0.0) -> str:
        """Compute the first step whose result has not been obtained yet, one op per call; then answer.

        With probability ``noise`` per call the expert instead answers a guess
        (the correct result plus a non-zero offset in [-10, 10]) or computes a
        wrong pair (its previous value replaced by a neighbouring number), 50/50;
        at the answer it answers the previous intermediate value (or a guess).
        """
        noise = check_noise(noise)
        st = self.state
        values = step_values(st["start"], st["steps"])
        k = 0
        while k < len(values) and format_number(values[k]) in st["results"]:
            k += 1
        final = values[-1]
        if rng.random() < noise:
            guess = final + rng.choice([d for d in range(-10, 11) if d])
            if k == len(values):
                wrong = values[-2] if len(values) > 1 and values[-2] != final else guess
                return format_answer(format_number(wrong))
            if rng.random() < 0.5:
                return format_answer(format_number(guess))
            prev = Fraction(st["start"]) if k == 0 else values[k - 1]
            return self._calc_call(prev + rng.choice((-2, -1, 1, 2)), st["steps"][k])
        if k == len(values):
            return format_answer(format_number(final))
        return self._calc_call(Fraction(st["start"]) if k == 0 else values[k - 1], st["steps"][k])

    @staticmethod
    def _calc_call(prev: Fraction, step: list[Any]) -> str:
        op, x, side = step
        expr = f"{_num(prev)} {op} {_num(x)}" if side == "right" else f"{_num(x)} {op} {_num(prev)}"
        return format_tool_call("calculator", {"expression": expr})
