"""Environment knobs that need objects a YAML config cannot hold.

Environments sit below the inference layer, so an environment that talks to a
model (the airline LLM customer) takes a plain ``chat(messages) -> str``
callable. A config gives it as a mapping, resolved here (train layer)::

    env:
      name: airline
      knobs:
        user: llm
        user_chat: {chat_endpoint: http://localhost:8000/v1, model: tiny, temperature: 0.7}

Any knob value that is a mapping with a ``chat_endpoint`` key becomes
``ChatClient(base_url, model, ...).chat`` bound to the remaining sampling
arguments (``temperature``, ``max_tokens``, ``top_p``); client settings
``api_key``, ``timeout_s``, ``max_retries`` pass to the client.
"""

from __future__ import annotations

import functools
from typing import Any

_CLIENT_KEYS = ("api_key", "timeout_s", "max_retries", "backoff_s")
_SAMPLING_KEYS = ("temperature", "max_tokens", "top_p", "seed")


def resolve_knob(name: str, value: Any) -> Any:
    if not (isinstance(value, dict) and "chat_endpoint" in value):
        return value
    from horizonrl.inference.openai_client import ChatClient

    unknown = sorted(set(value) - {"chat_endpoint", "model", *_CLIENT_KEYS, *_SAMPLING_KEYS})
    if unknown:
        raise ValueError(f"env knob {name!r}: unknown chat endpoint settings {unknown}")
    if not value.get("model"):
        raise ValueError(f"env knob {name!r}: a chat endpoint needs 'model'")
    client = ChatClient(
        value["chat_endpoint"], value["model"], **{k: value[k] for k in _CLIENT_KEYS if k in value}
    )
    return functools.partial(client.chat, **{k: value[k] for k in _SAMPLING_KEYS if k in value})


def resolve_knobs(knobs: dict[str, Any]) -> dict[str, Any]:
    """``knobs`` with every chat-endpoint mapping replaced by a ``chat(messages)`` callable."""
    return {k: resolve_knob(k, v) for k, v in knobs.items()}
