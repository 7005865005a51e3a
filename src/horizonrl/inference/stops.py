"""End-of-generation helpers shared by the engines: eos id sets and incremental stop-string matching."""

from __future__ import annotations

import functools
from collections.abc import Sequence

__all__ = ["StopWatcher", "as_id_set", "first_stop"]


def as_id_set(value) -> set[int]:
    """``None``, one id or several ids -> a set of ids."""
    return set() if value is None else {int(value)} if isinstance(value, int) else {int(v) for v in value}


class StopWatcher:
    """Incremental detokenizer for one row: decodes only the newest tokens and looks for stop strings.

    Keeps a small window of already-decoded tokens as context (as vLLM/TGI do) so that
    byte-fallback pieces and leading-space tokens decode correctly; text ending in an
    incomplete UTF-8 sequence is checked up to that point but only committed once complete.
    """

    def __init__(self, tokenizer, stops: Sequence[str]):
        self.tok = tokenizer
        self.stops = tuple(s for s in stops if s)
        self.longest = max((len(s) for s in self.stops), default=0)
        self.text = ""
        self.prefix, self.read = 0, 0  # start of the context window; ids before ``read`` are decoded

    def push(self, ids: list[int]) -> str | None:
        """``ids`` is the row's generated ids so far (newest last); return the matched stop string, if any."""
        decode = functools.partial(self.tok.decode, skip_special_tokens=False)
        prev = decode(ids[self.prefix : self.read]) if self.read > self.prefix else ""
        full = decode(ids[self.prefix :])
        delta = full[len(prev) :]
        if delta.endswith("\ufffd"):  # incomplete character: check what is complete, commit nothing yet
            delta = delta.rstrip("\ufffd")
            text = self.text + delta
        else:
            self.prefix, self.read = self.read, len(ids)
            self.text = text = self.text + delta
        if not delta:
            return None
        window = text[-(len(delta) + self.longest - 1) :]
        self.text = self.text[-self.longest :]  # only a stop string's length of history is ever needed
        for stop in self.stops:
            if stop in window:
                return stop
        return None


def first_stop(tokenizer, ids: Sequence[int], stops: Sequence[str]) -> tuple[int, str] | None:
    """``(k, stop)`` if the stop string ``stop`` is completed by ``ids[k - 1]`` (the first such ``k``).

    Feeds ``ids`` one token at a time through a :class:`StopWatcher`, so the match is the one
    an engine checking after every sampled token would make.
    """
    watcher = StopWatcher(tokenizer, stops)
    ids = list(ids)
    for k in range(1, len(ids) + 1):
        hit = watcher.push(ids[:k])
        if hit is not None:
            return k, hit
    return None
