"""A small client for OpenAI-compatible chat-completions endpoints (``horizonrl serve``, vLLM, OpenAI).

:class:`ChatClient` posts to ``{base_url}/chat/completions`` with ``httpx``. Connection errors,
timeouts, HTTP 5xx and HTTP 429 are retried with exponential backoff
(``backoff_s * 2**attempt``, capped at ``max_backoff_s``, at least a numeric ``Retry-After``); when
every attempt failed it raises :class:`EndpointUnreachable`, whose message names the URL, the number
of attempts and the last cause. Other HTTP errors (400, 401, 404, ...) are not retried and raise
:class:`ChatRequestError` with the server's message.

``base_url`` follows the OpenAI convention and includes the API prefix, e.g.
``http://127.0.0.1:8000/v1``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

try:
    import httpx
except ImportError as e:  # pragma: no cover - httpx is in the "serve" extra
    raise ImportError("the OpenAI-compatible client needs httpx: pip install 'horizonrl[serve]'") from e

__all__ = ["ChatAPIError", "ChatClient", "ChatCompletion", "ChatRequestError", "EndpointUnreachable"]

_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


class ChatAPIError(RuntimeError):
    """Base class of the errors raised by :class:`ChatClient`."""


class EndpointUnreachable(ChatAPIError):
    """Every attempt failed with a connection error, a timeout, HTTP 5xx or HTTP 429."""

    def __init__(self, url: str, attempts: int, cause: str):
        self.url, self.attempts, self.cause = url, attempts, cause
        super().__init__(
            f"OpenAI-compatible endpoint {url} is unreachable after {attempts} attempt(s); "
            f"last error: {cause}"
        )


class ChatRequestError(ChatAPIError):
    """The server rejected the request (a non-retryable HTTP status) or sent an unreadable reply."""

    def __init__(self, url: str, status: int | None, message: str):
        self.url, self.status, self.message = url, status, message
        where = f"HTTP {status} from {url}" if status is not None else f"bad response from {url}"
        super().__init__(f"{where}: {message}")


@dataclass
class ChatCompletion:
    """The first choice of a chat completion, plus the whole response in ``raw``.

    ``tool_calls`` are OpenAI-style dicts ``{"id", "type": "function", "function": {"name",
    "arguments"}}`` with ``arguments`` a JSON string, as sent by the server.
    """

    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)


def _error_message(response: httpx.Response) -> str:
    """The server's error message (OpenAI ``{"error": {"message"}}`` or FastAPI ``{"detail"}``)."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or response.reason_phrase
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if isinstance(err, str):
            return err
        if "detail" in body:
            return json.dumps(body["detail"]) if not isinstance(body["detail"], str) else body["detail"]
    return str(body)[:500]


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


class ChatClient:
    """Chat-completions client with retries, exponential backoff and timeouts.

    Args:
        base_url: API root including the prefix, e.g. ``http://127.0.0.1:8000/v1``.
        model: model name sent with every request.
        api_key: sent as ``Authorization: Bearer <api_key>`` when given (nothing is read from the
            environment).
        timeout_s: per-attempt timeout (connect, read and write) in seconds.
        max_retries: retries after the first attempt (0: one attempt only).
        backoff_s: delay before the first retry; doubles on each further retry.
        max_backoff_s: cap of one delay.
        transport: an ``httpx`` transport (tests pass ``httpx.MockTransport``).
        sleep: the function used to wait between attempts (tests record the delays).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        timeout_s: float = 60.0,
        max_retries: int = 3,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a non-empty string, got {model!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be an integer >= 0, got {max_retries!r}")
        if not backoff_s >= 0 or not max_backoff_s >= 0:
            raise ValueError(
                f"backoff_s and max_backoff_s must be >= 0, got {backoff_s!r}, {max_backoff_s!r}"
            )
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout_s = float(timeout_s)
        self.max_retries = max_retries
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        self._sleep = sleep
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(timeout=httpx.Timeout(self.timeout_s), headers=headers, transport=transport)

    # -- lifecycle -------------------------------------------------------------------------------------

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ChatClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ChatClient(base_url={self.base_url!r}, model={self.model!r}, max_retries={self.max_retries})"

    # -- requests --------------------------------------------------------------------------------------

    def backoff(self, retry: int, response: httpx.Response | None = None) -> float:
        """Delay before retry number ``retry`` (0-based); at least the server's ``Retry-After``."""
        delay = min(self.max_backoff_s, self.backoff_s * 2**retry)
        hint = _retry_after(response) if response is not None else None
        return min(self.max_backoff_s, max(delay, hint)) if hint is not None else delay

    def request(self, method: str, path: str, payload: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``method`` ``{base_url}{path}`` with retries; returns the decoded JSON object."""
        url = f"{self.base_url}/{path.lstrip('/')}"
        cause = "no attempt made"
        for attempt in range(self.max_retries + 1):
            response = None
            try:
                response = self._http.request(method, url, json=payload)
            except httpx.TimeoutException as e:
                cause = f"timed out after {self.timeout_s:g}s ({type(e).__name__})"
            except httpx.TransportError as e:
                cause = f"{type(e).__name__}: {e}"
            else:
                if response.status_code < 400:
                    try:
                        body = response.json()
                    except ValueError:
                        raise ChatRequestError(url, response.status_code, "response is not JSON") from None
                    if not isinstance(body, dict):
                        raise ChatRequestError(url, response.status_code, "response is not a JSON object")
                    return body
                message = _error_message(response)
                if response.status_code not in _RETRY_STATUS:
                    raise ChatRequestError(url, response.status_code, message)
                cause = f"HTTP {response.status_code}: {message}"
            if attempt < self.max_retries:
                self._sleep(self.backoff(attempt, response))
        raise EndpointUnreachable(url, self.max_retries + 1, cause)

    def models(self) -> list[str]:
        """Ids of the models the server lists at ``GET /models``."""
        body = self.request("GET", "/models")
        return [str(m.get("id")) for m in body.get("data", []) if isinstance(m, dict)]

    def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **sampling: Any,
    ) -> ChatCompletion:
        """One chat completion. ``sampling`` holds any request fields (``temperature``, ``top_p``,
        ``max_tokens``, ``stop``, ``seed``, ``n``, ...), sent as given; ``None`` values are dropped."""
        if not messages:
            raise ValueError("messages must be a non-empty list of chat messages")
        payload: dict[str, Any] = {"model": self.model, "messages": [dict(m) for m in messages]}
        if tools:
            payload["tools"] = [dict(t) for t in tools]
        payload.update({k: v for k, v in sampling.items() if v is not None})
        body = self.request("POST", "/chat/completions", payload)
        url = f"{self.base_url}/chat/completions"
        try:
            choice = body["choices"][0]
            message = choice["message"]
        except (KeyError, IndexError, TypeError):
            raise ChatRequestError(
                url, 200, f"no choices[0].message in response: {str(body)[:300]}"
            ) from None
        return ChatCompletion(
            content=message.get("content") or "",
            tool_calls=list(message.get("tool_calls") or []),
            finish_reason=choice.get("finish_reason"),
            usage=dict(body.get("usage") or {}),
            raw=body,
        )

    def chat(self, messages: Sequence[Mapping[str, Any]], **sampling: Any) -> str:
        """The text content of one chat completion (``complete(...).content``; tool calls: use
        :meth:`complete`)."""
        return self.complete(messages, **sampling).content
