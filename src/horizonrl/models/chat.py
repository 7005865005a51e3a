"""Token-exact incremental prompt building for multi-turn agent loops.

An agent loop tokenizes the first prompt once (:meth:`ChatRenderer.initial_ids`)
and from then on only *appends*: the sampled response ids, an end-of-turn token
if the response was cut (:meth:`ChatRenderer.end_of_turn_ids`), and the ids of
the environment's reply plus the next assistant header
(:meth:`ChatRenderer.continuation_ids`). Every prompt therefore extends the
previous one token-for-token, which is what lets training rows merge turns and
keep the rollout/train log-prob ratio at exactly 1.

The continuation is found with the *delta trick*: render a fixed short
conversation ending in an assistant turn, render it again with the new messages
and a generation prompt, and tokenize the text after the assistant's end-of-turn
token on its own. Only the messages *before* that assistant turn must render the same
whatever follows; the assistant turn itself may be rewritten by later messages (Qwen3 drops
its think block once it is no longer the last turn) — what a family's template does to
earlier assistant turns is the family's history rule (:mod:`horizonrl.models.families`,
``rollout.thinking_history``), applied to the kept token ids, never a re-rendering.

When it is built, the renderer proves that the template can be extended this way
(:mod:`horizonrl.models.probe`: a conversation with thinking and tool calls, built incrementally and
compared token by token with the template's rendering) and refuses a template that rewrites earlier
turns beyond the family's history rule, naming the first differing token and its turn.

The renderer belongs to a model family (``family``: a name or ``auto``, detected from the
template) and passes ``template_kwargs`` (e.g. Qwen3's ``enable_thinking``) to every rendering.
Structured assistant tool calls are written in the family's tool syntax.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from horizonrl.models.families import Family, detect_family, drop_thinking, get_family
from horizonrl.models.probe import (
    BASE,
    PLACEHOLDER,
    PROBE_TOOL,
    TemplateCannotRender,
    TemplateRewritesHistory,
    base_parts,
    describe_difference,
    probe_history,
    template_errors,
)
from horizonrl.models.tokenizer import tools_system_text
from horizonrl.tool_formats import ToolFormat, get_tool_format
from horizonrl.vocab import ThinkingHistory

Message = Mapping[str, Any]

#: Episodes whose kept prompts a run checks against the template when ``rollout.check_tokens`` is unset.
CHECK_FIRST_EPISODES = 8

_LOG = logging.getLogger(__name__)


class ChatRenderer:
    """Builds prompt token ids incrementally and token-exactly from a tokenizer's chat template.

    ``eos_id`` is the end-of-turn token (``<|im_end|>`` for ChatML): the token that
    follows an assistant message in the template. Generation should stop on it.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        family: str | Family = "auto",
        template_kwargs: Mapping[str, Any] | None = None,
        thinking_history: str = ThinkingHistory.KEEP,
    ) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("ChatRenderer needs a tokenizer with a chat_template")
        if thinking_history not in tuple(ThinkingHistory):
            raise ValueError(f"thinking_history={thinking_history!r}: must be 'keep' or 'drop'")
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
        if isinstance(family, Family):
            self.family = family
        else:
            self.family = detect_family(template) if family == "auto" else get_family(family)
        if self.family.unsupported:
            raise ValueError(
                f"model family {self.family.name!r} is not supported yet: {self.family.unsupported}"
            )
        self.tool_format: ToolFormat = get_tool_format(self.family.tool_format)
        self.thinking_history = thinking_history
        self._check_tokens: bool | None = False
        self._warned_mismatch = False
        self._supports_tools: bool | None = None
        self._base_text = self._render(list(BASE), add_generation_prompt=False)
        self.end_of_turn_text = self._find_end_of_turn()
        self.eos_id: int = tokenizer.convert_tokens_to_ids(self.end_of_turn_text)
        #: The text before the first assistant turn of the probe conversation (must never change).
        self._before_assistant = self._render(list(BASE[:2]), add_generation_prompt=False)
        if not self._base_text.startswith(self._before_assistant):
            raise TemplateRewritesHistory(
                "chat template renders the turns before an assistant turn differently once it follows: "
                + str(
                    self._base_difference(self._encode(self._before_assistant), self._encode(self._base_text))
                )
            )
        gen_text = self._render(list(BASE[:2]), add_generation_prompt=True)[len(self._before_assistant) :]
        think = self.family.think
        #: Ids the generation prompt puts after the assistant header (Qwen3's empty think block when
        #: ``enable_thinking=False``); part of an assistant turn for the history rule.
        self.prefill_ids: list[int] = (
            self._encode(gen_text[gen_text.index(think[0]) :]) if think and think[0] in gen_text else []
        )
        vocab = tokenizer.get_vocab()
        #: Ids that end a generation: the end-of-turn token and the family's other stop tokens.
        self.stop_ids: frozenset[int] = frozenset(
            {self.eos_id, *(vocab[t] for t in self.family.stop_tokens if t in vocab)}
        )
        self.think_ids: tuple[int, int] | None = None
        if think and all(t in vocab for t in think):
            self.think_ids = (vocab[think[0]], vocab[think[1]])
        self._newline_ids = frozenset(ids[0] for k in range(1, 9) if len(ids := self._encode("\n" * k)) == 1)
        probe_history(self)

    @property
    def check_tokens(self) -> bool:
        """Whether episodes compare their kept prompts with fresh renderings (``rollout.check_tokens``;
        read by the context manager when an episode starts). Unset (None) reads as False here: a run's
        default is applied by the rollout layer, which gives the first :data:`CHECK_FIRST_EPISODES`
        episodes of a fresh run :meth:`checking` (``horizonrl.train.rollout.collect``)."""
        return bool(self._check_tokens)

    @check_tokens.setter
    def check_tokens(self, value: bool | None) -> None:
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"check_tokens={value!r}: must be true, false or unset (None)")
        self._check_tokens = value

    @property
    def checks_by_default(self) -> bool:
        """``rollout.check_tokens`` is unset: the run checks its first episodes only."""
        return self._check_tokens is None

    def checking(self) -> ChatRenderer:
        """A copy of this renderer that checks every episode it renders (shares the tokenizer)."""
        twin = copy.copy(self)
        twin._check_tokens = True
        return twin

    # -- rendering -----------------------------------------------------------------------------------------

    def _render(self, messages: Sequence[Message], *, tools=None, add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            [dict(m) for m in messages],
            tools=tools,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **self.template_kwargs,
        )

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _find_end_of_turn(self) -> str:
        """The special token right after the placeholder assistant content (falls back to eos_token)."""
        after = self._base_text.split(PLACEHOLDER, 1)[1]
        ids = self._encode(after)
        special = set(self.tokenizer.all_special_ids) | {
            i for i, t in self.tokenizer.added_tokens_decoder.items() if t.special
        }
        if ids and ids[0] in special:
            return self.tokenizer.convert_ids_to_tokens(ids[0])
        if self.tokenizer.eos_token is None:
            raise ValueError(
                "cannot determine the end-of-turn token: no special token after assistant content"
            )
        return self.tokenizer.eos_token

    @property
    def supports_tools(self) -> bool:
        """Whether the chat template renders ``tools=`` itself (checked by rendering with a probe tool)."""
        if self._supports_tools is None:
            msgs = [{"role": "user", "content": "U"}]
            with_tools = self._render(msgs, tools=[PROBE_TOOL], add_generation_prompt=True)
            self._supports_tools = with_tools != self._render(msgs, add_generation_prompt=True)
        return self._supports_tools

    def _with_tools(self, messages: Sequence[Message], tools) -> tuple[list[dict], Any]:
        """Messages and the ``tools`` argument to render.

        Structured ``tool_calls`` of assistant messages become content text (:func:`assistant_text`), as
        :meth:`response_ids` emits them, so every template agrees with the incremental ids. The tool block
        is injected into the system message (same wording as our template) when the template ignores
        ``tools=``.
        """
        msgs = [
            {"role": "assistant", "content": self.assistant_text(m)} if m["role"] == "assistant" else dict(m)
            for m in messages
        ]
        if not tools or self.supports_tools:
            return msgs, (list(tools) if tools else None)
        block = tools_system_text(tools)
        if msgs and msgs[0]["role"] == "system":
            msgs[0] = {**msgs[0], "content": msgs[0]["content"] + "\n\n" + block}
        else:
            msgs.insert(0, {"role": "system", "content": block})
        return msgs, None

    def render_text(
        self, messages: Sequence[Message], tools=None, *, add_generation_prompt: bool = False
    ) -> str:
        """The whole conversation as text (for debugging and SFT data inspection)."""
        msgs, tools_arg = self._with_tools(messages, tools)
        return self._render(msgs, tools=tools_arg, add_generation_prompt=add_generation_prompt)

    # -- incremental ids -----------------------------------------------------------------------------------

    def initial_ids(self, messages: Sequence[Message], tools=None) -> list[int]:
        """Ids of the first prompt (e.g. system + user), ending with the opened assistant turn."""
        return self._encode(self.render_text(messages, tools, add_generation_prompt=True))

    def continuation_text(self, messages: Sequence[Message]) -> str:
        """The text appended after an assistant turn's end-of-turn token: ``messages`` + next header.

        ``messages`` may be empty (two assistant turns in a row: just the next header).
        """
        if any(m["role"] == "assistant" for m in messages):
            raise ValueError("continuation messages must not contain assistant turns")
        if not self.family.tool_role and any(m["role"] == "tool" for m in messages):
            raise ValueError(
                f"model family {self.family.name!r}: its chat template has no tool role, so a tool result "
                "cannot be rendered as the model was trained to read it; use an environment that replies "
                "as the user (StepResult role 'user'), or another family"
            )
        try:
            full = self._render([*BASE, *messages], add_generation_prompt=True)
        except template_errors() as e:
            roles = [m["role"] for m in messages]
            raise TemplateCannotRender(
                f"the chat template of model family {self.family.name!r} cannot render the messages "
                f"{roles} after an assistant turn: {e}"
            ) from None
        head = len(self._before_assistant)
        end = PLACEHOLDER + self.end_of_turn_text
        if full[:head] != self._before_assistant or end not in full[head:]:
            raise TemplateRewritesHistory(
                "chat template re-renders earlier turns once more messages follow; incremental prompts "
                f"are impossible: {self._base_difference(self._encode(self._base_text), self._encode(full))}"
            )
        return full[full.index(end, head) + len(end) :]

    def _base_difference(self, ours: list[int], theirs: list[int]) -> str | None:
        """:func:`~horizonrl.models.probe.describe_difference` of two renderings that start with the probe
        conversation ``BASE``, its turns named (system, first user, assistant)."""
        before = self._encode(self._before_assistant)
        parts = [*base_parts(self, before), (len(ours) + 1, "assistant turn")]
        return describe_difference(ours, theirs, self.tokenizer, parts)

    def continuation_ids(self, messages: Sequence[Message]) -> list[int]:
        """Ids to append after a response ending in ``eos_id``: ``messages`` (tool/user) and the next
        assistant header. The delta is tokenized on its own, so prompts extend token-for-token."""
        return self._encode(self.continuation_text(messages))

    def end_of_turn_ids(self, response_ids: Sequence[int]) -> list[int]:
        """``[eos_id]`` if the response was cut short (an env token, masked), else ``[]``.

        A response that ended on any of :attr:`stop_ids` is complete: Llama 3.1 ends a tool call with
        ``<|eom_id|>`` instead of ``<|eot_id|>``, and its template renders one or the other, never both.
        """
        return [] if len(response_ids) and int(response_ids[-1]) in self.stop_ids else [self.eos_id]

    def response_ids(self, message: Message) -> list[int]:
        """Ids of one assistant message as the policy would emit it: its text + ``eos_id``."""
        return [*self._encode(self.assistant_text(message)), self.eos_id]

    def assistant_text(self, message: Message) -> str:
        """An assistant message's text as the family's model writes it: its thinking (:meth:`thinking`),
        its visible content, then its ``tool_calls`` in the family's syntax (OpenAI ``{"function": {...}}``
        or flat ``{"name", "arguments"}``), joined to the *visible* content as the template joins them
        (Qwen3 puts a newline before the first call only when text follows ``</think>``)."""
        calls = []
        for call in message.get("tool_calls") or ():
            fn = call.get("function", call)
            calls.append(self.tool_format.format_call(str(fn["name"]), fn.get("arguments", {})))
        think, content = self.thinking(message)
        return think + self.tool_format.join(content, calls)

    def thinking(self, message: Message) -> tuple[str, str]:
        """``(think block, visible content)`` of an assistant message, as the family's template writes it.

        The thinking comes from ``reasoning_content`` (OpenAI-style servers, most SFT traces) or from a
        think block at the start of ``content``; a family with thinking (Qwen3) writes it as its template
        does, ``<think>\\n`` + thinking stripped of newlines + ``\\n</think>\\n\\n``, and the visible content
        with its leading newlines removed. An empty ``reasoning_content`` is no thinking (the template
        renders none for a turn that is followed by another message). A family without thinking refuses
        a non-empty ``reasoning_content``: its template would drop it, and silently training without it
        is what it must not do.
        """
        content = message.get("content") or ""
        reasoning = message.get("reasoning_content")
        if not isinstance(content, str):
            raise ValueError(f"assistant message content must be a string, got {type(content).__name__}")
        if reasoning is not None and not isinstance(reasoning, str):
            raise ValueError(
                f"assistant message reasoning_content must be a string, got {type(reasoning).__name__}"
            )
        tags = self.family.think
        if tags is None:
            if reasoning and reasoning.strip():
                raise ValueError(
                    f"an assistant message has reasoning_content, but model family {self.family.name!r} has "
                    "no thinking convention (its template drops the field); put the thinking into content "
                    "or choose a family with thinking (model.family)"
                )
            return "", content
        open_, close = tags
        if reasoning is None:
            if close not in content:
                return "", content
            # Qwen3's template: the text before the first </think>, after the last <think> before it.
            reasoning = content.split(close)[0].rstrip("\n").split(open_)[-1].lstrip("\n")
            content = content.split(close)[-1].lstrip("\n")
        elif close in content:
            raise ValueError(
                f"an assistant message has both reasoning_content and a {close} block in its content; "
                "give the thinking once"
            )
        elif not reasoning.strip("\n"):
            return "", content
        body = reasoning.strip("\n")
        return f"{open_}\n{body}\n{close}\n\n", content.lstrip("\n")

    def canonical_text(self, text: str) -> str:
        """A generation's text with its tool calls in the canonical form the environments parse."""
        return self.tool_format.to_canonical(text)

    # -- the family's history rule ---------------------------------------------------------------------------

    def assistant_region(self, prompt: Sequence[int], n_response: int) -> tuple[int, int]:
        """Where an assistant turn's text lies in ``prompt + response + end-of-turn``: from the end of its
        header (before any :attr:`prefill_ids`) to after its end-of-turn token."""
        k = len(self.prefill_ids)
        start = len(prompt) - k if k and list(prompt[-k:]) == self.prefill_ids else len(prompt)
        return start, len(prompt) + n_response

    @property
    def drops_history(self) -> bool:
        """Whether later prompts drop earlier thinking (``thinking_history: drop`` on such a family)."""
        return (
            self.thinking_history == ThinkingHistory.DROP
            and self.family.drops_thinking
            and self.think_ids is not None
        )

    def apply_history(
        self, ids: Sequence[int], regions: Sequence[tuple[int, int]], *, user_turn: bool
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """``ids`` as the family's template shows them once a new message follows the last of ``regions``.

        Qwen3's rule (:func:`~horizonrl.models.families.drop_thinking`): after a user message that is a
        new query every earlier turn loses its think block; after tool messages only, the turn just
        finished loses an *empty* think block. ``user_turn`` says a user message followed; whether it is
        a query is read from the rendered ids after the last region (:meth:`opens_query`), because Qwen3's
        template takes a user message holding one ``<tool_response>`` block for a tool reply. Without
        :attr:`drops_history` nothing changes.
        """
        if not self.drops_history:
            return list(ids), list(regions)
        return self.history_rule(ids, regions, user_turn=user_turn)

    def history_rule(
        self, ids: Sequence[int], regions: Sequence[tuple[int, int]], *, user_turn: bool
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """The family's history rule (:meth:`apply_history`) whatever ``rollout.thinking_history`` says:
        what the template does to earlier turns (the construction-time probe checks it does no more)."""
        if not (self.family.drops_thinking and self.think_ids) or not regions:
            return list(ids), list(regions)
        last = len(regions) - 1
        user_turn = user_turn and self.opens_query(ids[regions[last][1] :])
        which = [user_turn or (k == last and self._empty_think(ids, regions[k])) for k in range(len(regions))]
        return drop_thinking(
            ids, regions, which=which, think_ids=self.think_ids, newline_ids=self._newline_ids
        )

    def opens_query(self, continuation: Sequence[int]) -> bool:
        """Whether the rendered environment messages ``continuation`` (the ids after an assistant turn's
        end-of-turn token) hold a user message that opens a new query by the family's template.

        A family with ``tool_reply_tags`` (Qwen3) takes a user message whose content starts with the first
        tag and ends with the second for a tool reply, as its template does; tool messages render as
        such a user message, so one rule covers both. The user messages are found with the template's own
        user-turn framing (:attr:`_user_frame`, from a probe rendering); a template whose framing cannot
        be found treats every user message as a query.
        """
        tags = self.family.tool_reply_tags
        frame = self._user_frame
        if tags is None or frame is None:
            return True
        head, tail = frame
        text = self.tokenizer.decode(list(continuation), skip_special_tokens=False)
        contents = [part.split(tail, 1)[0] for part in text.split(head)[1:]]
        return not contents or any(not (c.startswith(tags[0]) and c.endswith(tags[1])) for c in contents)

    @functools.cached_property
    def _user_frame(self) -> tuple[str, str] | None:
        """``(head, tail)``: the text the template writes before and after a user message's content in a
        continuation (``<|im_start|>user\\n`` and ``<|im_end|>`` for ChatML), or None if not found."""
        mark = "USER-PROBE-7f3a"
        before, found, after = self.continuation_text([{"role": "user", "content": mark}]).partition(mark)
        head, eot = before.lstrip("\n"), self.end_of_turn_text
        tail = after[: after.index(eot) + len(eot)] if eot in after else ""
        return (head, tail) if found and head and tail else None

    def _empty_think(self, ids: Sequence[int], region: tuple[int, int]) -> bool:
        span = list(ids[region[0] : region[1]])
        try:
            a = span.index(self.think_ids[0])
            b = span.index(self.think_ids[1], a + 1)
        except ValueError:
            return False
        return all(t in self._newline_ids for t in span[a + 1 : b])

    def first_mismatch(self, ids: Sequence[int], messages: Sequence[Message], tools=None) -> dict | None:
        """Where ``ids`` (a kept, incremental context ending in a generation prompt) differ from a fresh
        rendering of ``messages``: ``{"position", "kept", "rendered", "same_text"}`` (token strings), or
        None.

        ``same_text`` is true when both sides decode to the same text from that token on: the model
        sampled a tokenization of its text other than the one the tokenizer would choose (``'}', '}}'``
        for ``'}}', '}'``). That difference is benign — the sampled ids are kept and trained on, exactly
        as they were scored — whereas a text difference is the template rendering the conversation
        otherwise than the kept context does (a gap worth a report)."""
        fresh = self.initial_ids(messages, tools)
        if list(ids) == fresh:
            return None
        k = next(
            (i for i, (a, b) in enumerate(zip(ids, fresh, strict=False)) if a != b), min(len(ids), len(fresh))
        )
        show = self.tokenizer.convert_ids_to_tokens
        text = functools.partial(self.tokenizer.decode, skip_special_tokens=False)
        same = text(list(ids[k:])) == text(list(fresh[k:]))
        miss = {
            "position": k,
            "kept": show(list(ids[k : k + 4])),
            "rendered": show(list(fresh[k : k + 4])),
            "same_text": same,
        }
        if not self._warned_mismatch:  # once per renderer: the metric carries the rest
            self._warned_mismatch = True
            why = (
                "the same text tokenized otherwise (the model sampled a non-canonical tokenization; "
                "training uses the sampled ids, so this is benign)"
                if same
                else "the text differs: the template renders this conversation otherwise"
            )
            _LOG.warning(
                "token check: a kept prompt differs from the template's rendering of its conversation at "
                "token %d (kept %s, template %s): %s; rollout/token_mismatch counts such rollouts "
                "(docs/models.md, 'Checking')",
                k,
                miss["kept"],
                miss["rendered"],
                why,
            )
        return miss

    def sft_example(self, messages: Sequence[Message], tools=None) -> tuple[list[int], list[int]]:
        """``(input_ids, labels_mask)`` of a conversation, tokenized exactly as an RL rollout would be.

        Messages before the first assistant message form the initial prompt; each assistant message
        contributes its content ids + ``eos_id`` (mask 1); the tool/user messages after it contribute
        :meth:`continuation_ids` (mask 0). Messages after the last assistant message are dropped.
        """
        roles = [m["role"] for m in messages]
        if "assistant" not in roles:
            raise ValueError("sft_example needs at least one assistant message")
        first = roles.index("assistant")
        last = len(roles) - 1 - roles[::-1].index("assistant")
        ids = self.initial_ids(messages[:first], tools)
        mask = [0] * len(ids)
        pending: list[Message] = []
        for k, msg in enumerate(messages[first : last + 1]):
            if msg["role"] != "assistant":
                pending.append(msg)
                continue
            if k > 0:  # every assistant message but the first follows a continuation
                cont = self.continuation_ids(pending)
                ids += cont
                mask += [0] * len(cont)
                pending = []
            resp = self.response_ids(msg)
            ids += resp
            mask += [1] * len(resp)
        return ids, mask

    def __repr__(self) -> str:
        return (
            f"ChatRenderer(family={self.family.name}, eos={json.dumps(self.end_of_turn_text)}, "
            f"supports_tools={self.supports_tools})"
        )


def renderer_for(tokenizer: PreTrainedTokenizerBase, cfg: Any) -> ChatRenderer:
    """The renderer of a run (a :class:`~horizonrl.config.RunConfig`): ``model.family``,
    ``model.chat_template_kwargs``, ``rollout.thinking_history`` and ``rollout.check_tokens`` (unset: the
    rollout layer checks the first :data:`CHECK_FIRST_EPISODES` episodes of a fresh run)."""
    renderer = ChatRenderer(
        tokenizer,
        family=cfg.model.family,
        template_kwargs=cfg.model.chat_template_kwargs,
        thinking_history=cfg.rollout.thinking_history,
    )
    renderer.check_tokens = cfg.rollout.check_tokens
    return renderer
