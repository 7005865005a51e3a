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
token on its own. This works for any chat template whose rendering of earlier
turns does not depend on later ones (ChatML, Qwen2.5, SmolLM2, ...).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from horizonrl.models.tokenizer import assistant_text, tools_system_text

Message = Mapping[str, Any]

_PLACEHOLDER = "PLACEHOLDER-RESPONSE-7f3a"
_BASE: tuple[dict[str, str], ...] = (
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U"},
    {"role": "assistant", "content": _PLACEHOLDER},
)
_PROBE_TOOL = {
    "name": "probe_tool_7f3a",
    "description": "d",
    "parameters": {"type": "object", "properties": {}},
}


class ChatRenderer:
    """Builds prompt token ids incrementally and token-exactly from a tokenizer's chat template.

    ``eos_id`` is the end-of-turn token (``<|im_end|>`` for ChatML): the token that
    follows an assistant message in the template. Generation should stop on it.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("ChatRenderer needs a tokenizer with a chat_template")
        self.tokenizer = tokenizer
        self._supports_tools: bool | None = None
        self._base_text = self._render(list(_BASE), add_generation_prompt=False)
        self.end_of_turn_text = self._find_end_of_turn()
        self.eos_id: int = tokenizer.convert_tokens_to_ids(self.end_of_turn_text)
        self._after_eos = self._base_text.index(_PLACEHOLDER + self.end_of_turn_text) + len(
            _PLACEHOLDER + self.end_of_turn_text
        )

    # -- rendering -----------------------------------------------------------------------------------------

    def _render(self, messages: Sequence[Message], *, tools=None, add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            [dict(m) for m in messages],
            tools=tools,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _find_end_of_turn(self) -> str:
        """The special token right after the placeholder assistant content (falls back to eos_token)."""
        after = self._base_text.split(_PLACEHOLDER, 1)[1]
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
            with_tools = self._render(msgs, tools=[_PROBE_TOOL], add_generation_prompt=True)
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
            {"role": "assistant", "content": assistant_text(m)} if m["role"] == "assistant" else dict(m)
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
        full = self._render([*_BASE, *messages], add_generation_prompt=True)
        if full[: self._after_eos] != self._base_text[: self._after_eos]:
            raise ValueError("chat template re-renders earlier turns; incremental prompts are impossible")
        return full[self._after_eos :]

    def continuation_ids(self, messages: Sequence[Message]) -> list[int]:
        """Ids to append after a response ending in ``eos_id``: ``messages`` (tool/user) and the next
        assistant header. The delta is tokenized on its own, so prompts extend token-for-token."""
        return self._encode(self.continuation_text(messages))

    def end_of_turn_ids(self, response_ids: Sequence[int]) -> list[int]:
        """``[eos_id]`` if the response was cut short (an env token, masked), else ``[]``."""
        return [] if len(response_ids) and int(response_ids[-1]) == self.eos_id else [self.eos_id]

    def response_ids(self, message: Message) -> list[int]:
        """Ids of one assistant message as the policy would emit it: its text + ``eos_id``."""
        return [*self._encode(assistant_text(message)), self.eos_id]

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
        return f"ChatRenderer(eos={json.dumps(self.end_of_turn_text)}, supports_tools={self.supports_tools})"
