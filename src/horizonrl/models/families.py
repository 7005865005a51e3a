"""Model families: what a chat model was trained to read and write beyond its chat template's text.

A :class:`Family` owns, for the models of one family:

- the **tool-call syntax** it was trained on (:mod:`horizonrl.tool_formats`): how a structured call
  is written into an assistant message and how its text is read back;
- its **thinking convention** (``<think>`` … ``</think>``) and the template's **history rule** for it:
  Qwen3's template drops the thinking of assistant turns before the last user query, and an *empty*
  think block from every turn that is not the last one (``enable_thinking=False`` prefills one in the
  generation prompt). :func:`drop_thinking` applies that rule to token ids;
- **stop tokens** besides the end-of-turn token the renderer finds in the template (Llama 3.1's
  ``<|eom_id|>``).

The family is named by ``model.family`` or detected from the template text (``auto``). Families register
with ``@register_family``; an unknown name is a config error listing the known ones. A template no rule
recognises is the ``chatml`` family (Hermes tool calls, no thinking) — what horizonrl did before families.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from horizonrl.registry import Registry

__all__ = [
    "FAMILIES",
    "Family",
    "detect_family",
    "drop_thinking",
    "get_family",
    "list_families",
    "register_family",
]


@dataclass(frozen=True)
class Family:
    """One family's conventions (see the module docstring)."""

    name: str
    tool_format: str = field(metadata={"help": "registered tool format (horizonrl.tool_formats)"})
    detect: Callable[[str], bool] = field(
        default=lambda template: False, metadata={"help": "whether a chat template is this family's"}
    )
    think: tuple[str, str] | None = field(
        default=None, metadata={"help": "the (open, close) thinking tags, None without thinking"}
    )
    drops_thinking: bool = field(
        default=False,
        metadata={"help": "the template drops earlier thinking (Qwen3's rule, see drop_thinking)"},
    )
    stop_tokens: tuple[str, ...] = field(
        default=(), metadata={"help": "stop tokens besides the end-of-turn token"}
    )
    tool_role: bool = field(
        default=True,
        metadata={
            "help": "the template renders tool messages (Gemma 3's has no tool role: they are refused)"
        },
    )
    unsupported: str = field(
        default="",
        metadata={"help": "why the family cannot be rendered token-exactly yet (non-empty: refused by name)"},
    )
    tool_reply_tags: tuple[str, str] | None = field(
        default=None,
        metadata={
            "help": "(open, close): the template takes a user message whose content starts with open and "
            "ends with close for a tool reply, not a new query (Qwen3's <tool_response>; history rule)"
        },
    )
    about: str = ""


FAMILIES: Registry[Family] = Registry(
    "model family", register_with="register_family(Family(...)) (horizonrl.models.families)", sort=False
)


def register_family(family: Family) -> Family:
    """Register ``family`` under its name; detection tries families in registration order."""
    return FAMILIES.register(family.name, family)


def get_family(name: str) -> Family:
    return FAMILIES.get(name, field="model.family")


def list_families() -> list[str]:
    return FAMILIES.names()


def detect_family(template: str) -> Family:
    """The first registered family whose rule matches ``template``, else ``chatml``."""
    for _, fam in FAMILIES.items():
        if fam.detect(template):
            return fam
    return get_family("chatml")


register_family(
    Family(
        "llama3",
        tool_format="llama3_json",
        detect=lambda t: "<|start_header_id|>" in t,
        stop_tokens=("<|eom_id|>",),
        about="Llama 3.x instruct: header tokens, <|eot_id|>, JSON tool calls ({'name', 'parameters'}) "
        "after an optional <|python_tag|>, tool results as the ipython role",
    )
)
register_family(
    Family(
        "qwen3",
        tool_format="qwen",
        detect=lambda t: "<|im_start|>" in t and "<think>" in t,
        think=("<think>", "</think>"),
        drops_thinking=True,
        tool_reply_tags=("<tool_response>", "</tool_response>"),
        about="Qwen3 / QwQ: ChatML, Hermes tool calls with newlines, <think> blocks the template drops "
        "from earlier turns; enable_thinking through model.chat_template_kwargs",
    )
)
register_family(
    Family(
        "qwen2",
        tool_format="qwen",
        detect=lambda t: "<|im_start|>" in t and ("<tool_call>\\n{" in t or "<tool_call>\n{" in t),
        about="Qwen2 / Qwen2.5 instruct: ChatML, Hermes tool calls with newlines",
    )
)
register_family(
    Family(
        "gemma3",
        tool_format="hermes",
        detect=lambda t: "<start_of_turn>" in t,
        stop_tokens=("<eos>",),
        tool_role=False,
        about="Gemma 3 instruct: <start_of_turn>user/model turns ending in <end_of_turn>; the template folds "
        "the system message into the first user turn, trims every message, and has no tool role (tool "
        "messages are refused; replies as the user work) and no tool rendering (Hermes tool calls as "
        "horizonrl's tool prompt teaches them)",
    )
)
register_family(
    Family(
        "mistral",
        tool_format="mistral",
        detect=lambda t: "[INST]" in t,
        unsupported="no Mistral vocabulary and chat template can be checked offline here, its tool calls "
        "carry 9-character ids that structured calls do not have, and Mistral 7B v0.3's template moves the "
        "system message to the last user turn (it rewrites earlier turns). The tool format 'mistral' reads "
        "its [TOOL_CALLS] output; to train it with horizonrl's Hermes tool prompt instead, set "
        "model.family: chatml (the template is still checked when the renderer is built)",
        about="Mistral instruct ([INST] ... [/INST]): not supported yet, the renderer refuses it and says "
        "why; the tool format 'mistral' reads its [TOOL_CALLS] output",
    )
)
register_family(
    Family(
        "smollm",
        tool_format="hermes",
        about="SmolLM2 instruct: ChatML without tool rendering (the renderer injects the tool block); "
        "Hermes tool calls as horizonrl's prompt teaches them",
    )
)
register_family(
    Family(
        "chatml",
        tool_format="hermes",
        about="ChatML templates, horizonrl's tiny model, and any template no other rule recognises: "
        "compact Hermes tool calls, no thinking",
    )
)


def drop_thinking(
    ids: Sequence[int],
    regions: Sequence[tuple[int, int]],
    *,
    which: Sequence[bool],
    think_ids: tuple[int, int],
    newline_ids: frozenset[int],
) -> tuple[list[int], list[tuple[int, int]]]:
    """Remove the think block of each assistant region ``regions[k]`` with ``which[k]`` from ``ids``.

    A region ``(start, end)`` spans an assistant turn's text in ``ids`` (after its header, up to and
    including its end-of-turn token). Its think block is the ids from the first ``think_ids[0]`` to the
    first ``think_ids[1]`` after it, plus the newline-only tokens that follow (the template renders the
    turn as ``content.lstrip('\\n')``). A region without a complete block is left as it is. Returns the
    new ids and the regions moved to them.
    """
    out = list(ids)
    moved = list(regions)
    for k in range(len(regions) - 1, -1, -1):  # from the end: earlier positions stay valid
        if not which[k]:
            continue
        start, end = moved[k]
        span = out[start:end]
        try:
            a = span.index(think_ids[0])
            b = span.index(think_ids[1], a + 1) + 1
        except ValueError:
            continue
        while b < len(span) and span[b] in newline_ids:
            b += 1
        cut = b - a
        del out[start + a : start + b]
        moved[k] = (start, end - cut)
        for j in range(k + 1, len(moved)):
            moved[j] = (moved[j][0] - cut, moved[j][1] - cut)
    return out, moved
