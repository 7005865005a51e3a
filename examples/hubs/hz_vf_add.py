"""A small ``verifiers`` tool environment (classic API, verifiers 0.3.1): add two numbers with a tool.

``load_environment(n=...)`` is what ``env.knobs.id: hz_vf_add`` loads (the module must be importable:
installed, or on ``PYTHONPATH``). The rubric rewards the right sum (weight 1) and, a little, an
answer that is a number at all (weight 0.2), so that a small policy gets a signal.
"""

from __future__ import annotations

import random
import re

import verifiers as vf
from datasets import Dataset

SYSTEM = "Add the two numbers. You may call the tool add. Reply with the sum alone when you know it."


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return int(a) + int(b)


def _last_number(text: str | None) -> int | None:
    found = re.findall(r"-?\d+", text or "")
    return int(found[-1]) if found else None


def load_environment(n: int = 32, max_operand: int = 20, seed: int = 0) -> vf.Environment:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        rows.append({"question": f"What is {a} + {b}?", "answer": str(a + b)})
    parser = vf.Parser()

    def correct(completion, answer, **kwargs) -> float:
        return float(_last_number(parser.parse_answer(completion)) == int(answer))

    def numeric(completion, **kwargs) -> float:
        return float(_last_number(parser.parse_answer(completion)) is not None)

    rubric = vf.Rubric(funcs=[correct, numeric], weights=[1.0, 0.2], parser=parser)
    return vf.ToolEnv(
        dataset=Dataset.from_list(rows),
        tools=[add],
        system_prompt=SYSTEM,
        parser=parser,
        rubric=rubric,
        max_turns=3,
    )
