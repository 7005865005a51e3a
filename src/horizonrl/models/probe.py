"""Construction-time proof that a chat template can be extended token by token, or a refusal that says
where it cannot.

An agent loop never re-renders a prompt: it appends the sampled ids and the rendered environment
messages (:mod:`horizonrl.models.chat`). That is exact only if the template renders every earlier turn
the same whatever follows it, up to the family's own history rule (Qwen3 drops earlier thinking, which
:meth:`~horizonrl.models.chat.ChatRenderer.history_rule` applies to the ids). A template that rewrites
earlier turns otherwise (prefixes them, keeps only the text after ``</think>`` as R1-distill templates
do, or Qwen3's template under ``model.family: qwen2``) would train every later turn on a context the
model never sees at inference; :func:`probe_history` refuses it when the renderer is built.

The probe conversation is the hard case of an agent loop: system, user, an assistant turn with thinking
and a tool call, the tool's reply, an assistant turn with thinking and text, a new user query. It is
built the loop's way (first prompt, response ids, continuations, the family's history rule) and
compared token by token with the template's rendering of the whole conversation. A refusal names the
first differing token's position, its id and decoded text on both sides, and the turn it lies in.
A template without a tool role (Gemma 3 raises on one) is probed with the reply as a user message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "TemplateCannotRender",
    "TemplateRewritesHistory",
    "describe_difference",
    "probe_history",
    "template_errors",
]


#: The assistant text of the probe conversation (a string no template writes itself).
PLACEHOLDER = "PLACEHOLDER-RESPONSE-7f3a"
#: The probe conversation the renderer is built from: a system turn, a user turn, an assistant turn.
BASE: tuple[dict[str, str], ...] = (
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U"},
    {"role": "assistant", "content": PLACEHOLDER},
)
#: A tool whose name no template knows, used to see how a template renders ``tools=``.
PROBE_TOOL = {
    "name": "probe_tool_7f3a",
    "description": "d",
    "parameters": {"type": "object", "properties": {}},
}


class TemplateRewritesHistory(ValueError):
    """A chat template renders an earlier turn differently once more messages follow it."""


class TemplateCannotRender(ValueError):
    """A chat template raises on a conversation (Gemma 3's on a tool message, or two user turns in a row)."""


#: A named part of an id sequence: ``(end, name)``; a part runs from the previous part's end.
Parts = Sequence[tuple[int, str]]


def describe_difference(
    ours: Sequence[int], theirs: Sequence[int], tokenizer: Any, parts: Parts, *, window: int = 3
) -> str | None:
    """Where ``ours`` (the incremental ids) first differ from ``theirs`` (the template's rendering of the
    whole conversation): position, id and decoded text on each side, and the name of the part of
    ``ours`` it falls in; None if they are equal."""
    ours, theirs = list(ours), list(theirs)
    if ours == theirs:
        return None
    k = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
    k = min(len(ours), len(theirs)) if k is None else k
    name = next((n for end, n in parts if k < end), parts[-1][1] if parts else "conversation")

    def side(ids: list[int]) -> str:
        if k >= len(ids):
            return "nothing (it ends there)"
        then = tokenizer.decode(ids[k + 1 : k + 1 + window])
        return f"id {ids[k]} {tokenizer.decode(ids[k : k + 1])!r} (then {then!r})"

    return (
        f"first differing token at position {k}, in the {name}: the incremental prompt has {side(ours)}, "
        f"the template renders {side(theirs)}"
    )


def base_parts(renderer: Any, before_assistant_ids: Sequence[int], tools=None) -> list[tuple[int, str]]:
    """Parts of a rendering that starts with the probe's system and user turns: ``system turn`` and
    ``first user turn`` when the system turn renders on its own as a prefix, else one part (Gemma 3
    folds the system turn into the first user turn; Llama 3.1 puts tools into it)."""
    n = len(before_assistant_ids)
    try:
        system = renderer._encode(renderer.render_text(list(BASE[:1]), tools))
    except Exception:  # a template may refuse a conversation without a user turn (Llama 3.1 with tools)
        system = []
    if system and list(before_assistant_ids[: len(system)]) == system and len(system) < n:
        return [(len(system), "system turn"), (n, "first user turn")]
    return [(n, "system and first user turns (rendered together)")]


def template_errors() -> tuple[type[BaseException], ...]:
    try:
        from jinja2 import TemplateError
    except ImportError:  # pragma: no cover - transformers depends on jinja2
        return ()
    return (TemplateError,)


def probe_history(renderer: Any) -> None:
    """Refuse (:class:`TemplateRewritesHistory`) a template that rewrites earlier turns beyond the
    family's history rule; see the module docstring."""
    if not renderer.family.tool_role:
        _probe(renderer, "user")
        return
    try:
        _probe(renderer, "tool")
    except TemplateCannotRender:  # a template without a tool role: the reply as a user message
        _probe(renderer, "user")


def _probe(r: Any, reply_role: str) -> None:
    tools = [PROBE_TOOL]
    tags = r.family.think or ("<think>", "</think>")
    # The model writes its thinking itself, unless the generation prompt already holds the (empty)
    # think block (Qwen3 with enable_thinking=False): then the turn is that block + the response.
    think = "" if r.prefill_ids else f"{tags[0]}\nweigh it\n{tags[1]}\n\n"
    prefill = r.tokenizer.decode(r.prefill_ids) if r.prefill_ids else ""
    call = {"type": "function", "function": {"name": PROBE_TOOL["name"], "arguments": {}}}
    turns = [
        {"role": "assistant", "content": think, "tool_calls": [call]},
        {"role": "assistant", "content": think + "Done."},
    ]
    reply = {"role": reply_role, "content": "R"}
    query = {"role": "user", "content": "Q"}
    start = list(BASE[:2])

    ids = r.initial_ids(start, tools)
    before = r._encode(r.render_text(start, tools))  # without the generation prompt
    before = len(before) if ids[: len(before)] == before else len(ids) - len(r.prefill_ids)
    regions: list[tuple[int, int]] = []
    for turn, follow in zip(turns, (reply, query), strict=True):
        resp = r.response_ids(turn)
        regions.append(r.assistant_region(ids, len(resp)))
        ids = ids + resp + r.continuation_ids([follow])
        ids, regions = r.history_rule(ids, regions, user_turn=follow["role"] == "user")
    messages = [
        *start,
        {"role": "assistant", "content": prefill + r.assistant_text(turns[0])},
        reply,
        {"role": "assistant", "content": prefill + r.assistant_text(turns[1])},
        query,
    ]
    theirs = r.initial_ids(messages, tools)
    parts = [
        *base_parts(r, ids[:before], tools),
        (regions[0][0], "header of the first assistant turn (the generation prompt)"),
        (regions[0][1], "first assistant turn (thinking and a tool call)"),
        (regions[1][0], f"{reply_role} reply after it"),
        (regions[1][1], "second assistant turn (thinking and text)"),
        (len(ids) + 1, "user query after them and the generation prompt"),
    ]
    diff = describe_difference(ids, theirs, r.tokenizer, parts)
    if diff is not None:
        raise TemplateRewritesHistory(
            f"chat template of model family {r.family.name!r} renders earlier turns differently once more "
            f"messages follow, beyond the family's history rule, so prompts cannot be extended token by "
            f"token and training would not be on the contexts the model sees: {diff}. Choose the family "
            "whose template this is (model.family), or a template that keeps earlier turns as they were."
        )
