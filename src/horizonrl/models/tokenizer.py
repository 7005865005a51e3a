"""An offline byte-level BPE tokenizer with a ChatML + tools chat template.

:func:`train_tokenizer` trains a small vocabulary with the ``tokenizers`` library
(no download, deterministic for the same texts) and wraps it as a transformers
fast tokenizer. Digits are split one per token so numbers copy well; the chat
markup and agent tags are atomic tokens:

- special: ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>`` (eos, end of turn);
- added (non-special, survive ``skip_special_tokens``): :data:`TAG_TOKENS`.

The chat template (:data:`CHAT_TEMPLATE`) is ChatML and renders ``tools=`` like
Qwen2.5 but with a shorter instruction (:func:`tools_system_text`), so the same
wording can be injected by :class:`horizonrl.models.chat.ChatRenderer` into
templates that have no tool support.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from horizonrl.tool_formats import HermesFormat, canonical_call

PAD_TOKEN = "<|endoftext|>"
BOS_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)
TAG_TOKENS: tuple[str, ...] = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<answer>",
    "</answer>",
    "<think>",
    "</think>",
    "<summary>",
    "</summary>",
)

TOOLS_HEADER = "# Tools\nYou may call these functions:\n<tools>"
TOOLS_FOOTER = (
    "\n</tools>\nTo call one, reply with "
    '<tool_call>{"name": <function-name>, "arguments": <args-json>}</tool_call>'
)

# Qwen2-style split, but every digit (\p{N}) and every punctuation mark is its own pre-token, so a
# string such as ` "5` is segmented the same way in every context (merges like ` "(` made the
# segmentation context-dependent, which a tiny model cannot learn to reproduce).
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"|[^\s\p{L}\p{N}]|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def tools_system_text(tools: Sequence[Mapping[str, Any]]) -> str:
    """The tool block the chat template appends to the system message (one JSON schema per line)."""
    lines = "".join("\n" + json.dumps(dict(tool), ensure_ascii=False) for tool in tools)
    return TOOLS_HEADER + lines + TOOLS_FOOTER


def tool_call_text(call: Mapping[str, Any]) -> str:
    """``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` for one structured tool call.

    Accepts OpenAI-style ``{"function": {"name", "arguments"}}`` or flat ``{"name", "arguments"}``;
    string arguments are inserted verbatim (they are already JSON). The canonical (``hermes``) syntax of
    :mod:`horizonrl.tool_formats`; a model family's own syntax is :meth:`ChatRenderer.assistant_text`.
    """
    fn = call.get("function", call)
    return canonical_call(str(fn["name"]), fn.get("arguments", {}))


def assistant_text(message: Mapping[str, Any]) -> str:
    """The text of an assistant message in the canonical syntax (content, then its tool calls)."""
    calls = [tool_call_text(call) for call in message.get("tool_calls") or ()]
    return HermesFormat().join(message.get("content") or "", calls)


def _lit(text: str) -> str:
    """A Jinja string literal for ``text`` (JSON escapes are valid Jinja escapes)."""
    return json.dumps(text)


CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- " + _lit(TOOLS_HEADER) + " }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- " + _lit(TOOLS_FOOTER) + " + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and loop.first and tools %}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + (message['content'] or '') }}"
    "{%- for call in (message['tool_calls'] or []) %}"
    "{%- set fn = call['function'] if call['function'] is defined else call %}"
    "{%- if message['content'] or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>{\"name\": \"' + fn['name'] + '\", \"arguments\": ' }}"
    "{%- if fn['arguments'] is string %}{{- fn['arguments'] }}"
    "{%- else %}{{- fn['arguments'] | tojson }}{%- endif %}"
    "{{- '}</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Fixed template text fed to the trainer so role names and the tool instruction get merges.
_TEMPLATE_TEXTS = (
    "system\n",
    "user\n",
    "assistant\n",
    "tool\n",
    TOOLS_HEADER + TOOLS_FOOTER,
    '{"name": "search", "arguments": {"query": "x"}}',
)


def _strip_markup(texts: Iterable[str]) -> Iterator[str]:
    """Remove atomic tokens from the training texts so no merges are wasted on their pieces."""
    for text in texts:
        for tok in (*SPECIAL_TOKENS, *TAG_TOKENS):
            text = text.replace(tok, " ")
        yield text


def train_tokenizer(
    texts: Iterable[str], *, vocab_size: int = 1024, seed: int = 0, words: Sequence[str] = ()
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts`` and attach the ChatML + tools chat template.

    ``vocab_size`` is the total size including the 3 special and 10 tag tokens (it is an upper
    bound: a small corpus yields fewer merges). The result is deterministic for the same texts;
    ``seed`` is accepted for config symmetry and does not change the (deterministic) BPE merges.
    Any byte sequence is encodable (the 256-byte alphabet is always in the vocabulary).
    ``words`` are added on top of ``vocab_size`` as whole-word tokens (never matched inside a
    longer word), e.g. entity names a tiny model must copy as one token.
    """
    del seed  # BPE training has no randomness; kept so configs can pass it uniformly.
    n_base = 256 + len(SPECIAL_TOKENS)
    if vocab_size < n_base + len(TAG_TOKENS):
        raise ValueError(f"vocab_size={vocab_size} is too small: need at least {n_base + len(TAG_TOKENS)}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TAG_TOKENS),
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_strip_markup([*_TEMPLATE_TEXTS, *texts]), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    if words:
        tok.add_tokens([AddedToken(w, special=False, normalized=False, single_word=True) for w in words])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast
