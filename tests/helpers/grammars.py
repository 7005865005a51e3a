"""A tool schema, its tools and a one-message conversation for the grammar-constrained decoding tests,
and a grammar's acceptance of a token sequence (``tests/inference/test_constrained.py``,
``tests/scale/test_vllm_constrained.py``, ``tests/serve/test_serve_families.py``)."""

from __future__ import annotations

ARGS = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 99},
        "tag": {"enum": ["x", "y"]},
        "note": {"type": "string", "maxLength": 6},
    },
    "required": ["a", "tag"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "add", "parameters": ARGS}},
    {"type": "function", "function": {"name": "ping"}},  # no parameters: arguments must be {}
]
HI = [{"role": "user", "content": "hi"}]


def accepts(vocab, grammar: str, ids: list[int]) -> bool:
    """Whether ``grammar`` accepts exactly ``ids`` (every token allowed, complete at the end)."""
    from horizonrl.inference.constrain import RowMatchers  # needs llguidance

    m = RowMatchers(vocab, grammar, 1)
    for t in ids:
        if m.stopped(0) or not m.consume(0, t):
            return False
    return m.stopped(0)
