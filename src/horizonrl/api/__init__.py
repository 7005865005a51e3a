"""The OpenAI chat-completions dialect shared by ``horizonrl serve`` and ``horizonrl gateway``.

``schema`` (requests, 4xx errors naming the field), ``chat`` (ChatService: preparation, responses,
streaming, forced tool calls and ``response_format`` by constrained decoding, log-probs),
``scheduler`` (fair slice batching over one engine), ``routes`` (model routes and engine setup).
"""
