"""The renderer seam: what agents and context managers ask of a chat renderer.

Agents never call a chat template themselves. They keep a token context and extend it through a
:class:`Renderer`: the first prompt from messages (:meth:`~Renderer.initial_ids`), then after each
generation the end-of-turn token when the generation was cut (:meth:`~Renderer.end_of_turn_ids`) and
the rendered reply with the next assistant header (:meth:`~Renderer.continuation_ids`). A prompt then
extends the previous prompt token for token, so one episode trains as one row (docs/design.md, "Prompts").

The implementation is :class:`horizonrl.models.chat.ChatRenderer` (built from the run's tokenizer by
:func:`horizonrl.models.chat.renderer_for`); this protocol names only the methods the agent layer calls,
so ``agents`` does not import ``models`` (which imports ``transformers``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

#: One chat message: ``{"role": ..., "content": ...}`` (and a tool call's fields).
Message = Mapping[str, Any]


class Renderer(Protocol):
    """A chat renderer as the agents and context managers use it (module docstring)."""

    #: The run's tokenizer (agents decode and encode summaries and memory entries with it).
    tokenizer: Any
    #: The end-of-turn token id (``<|im_end|>`` for ChatML): what a complete assistant turn ends with.
    eos_id: int

    def initial_ids(self, messages: Sequence[Message], tools: Any = None) -> list[int]:
        """Ids of the first prompt (e.g. system + user), ending with the opened assistant turn."""
        ...

    def continuation_ids(self, messages: Sequence[Message]) -> list[int]:
        """Ids to append after a complete assistant turn: ``messages`` (tool/user) and the next header."""
        ...

    def end_of_turn_ids(self, response_ids: Sequence[int]) -> list[int]:
        """``[eos_id]`` if the response was cut short (the token is then masked), else ``[]``."""
        ...

    @property
    def check_tokens(self) -> bool:
        """Whether episodes compare their kept prompts with fresh renderings (``rollout.check_tokens``)."""
        ...

    @property
    def checks_by_default(self) -> bool:
        """``rollout.check_tokens`` is unset: the run checks its first episodes only."""
        ...

    def checking(self) -> Renderer:
        """A copy of this renderer that checks every episode it renders."""
        ...

    def first_mismatch(
        self, ids: Sequence[int], messages: Sequence[Message], tools: Any = None
    ) -> dict | None:
        """Where ``ids`` (a kept context) differ from a fresh rendering of ``messages``, or None."""
        ...

    def assistant_region(self, prompt: Sequence[int], n_response: int) -> tuple[int, int]:
        """Where an assistant turn's text lies in ``prompt + response + end-of-turn`` (``[start, end)``)."""
        ...

    @property
    def drops_history(self) -> bool:
        """Whether later prompts drop earlier thinking (``rollout.thinking_history: drop`` on Qwen3)."""
        ...

    def apply_history(
        self, ids: Sequence[int], regions: Sequence[tuple[int, int]], *, user_turn: bool
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """``ids`` (and the assistant ``regions`` in them) as the family's template shows them once a new
        message follows; unchanged without :attr:`drops_history`."""
        ...


__all__ = ["Message", "Renderer"]
