"""LLM-as-judge rewards through any OpenAI-compatible endpoint (Mosaic paper, appendix C.3).

:class:`LLMJudge` asks a judge model whether a predicted answer matches the ground truth, using the
Mosaic prompt verbatim (:data:`MOSAIC_JUDGE_PROMPT`) with the paper's request settings: temperature
0.0 and at most 10 generated tokens. Several acceptable answers are formatted as a list with one
``- answer`` entry per line, as in the paper. (The paper's text gives the template as one flowing
paragraph; we put the question, ground truth and prediction on their own lines, which a multi-line
answer list needs anyway.)

The prompt asks the judge to "Reply with only a number: 1 if correct, 0 if incorrect", so the verdict
is parsed strictly (:func:`parse_verdict`): after removing every ``<think>...</think>`` block,
whitespace and decoration (quotes, ``*``, backticks, a trailing period), the reply must be ``1`` or
``0``, or begin with that digit followed by whitespace or ``,;:!)]`` (``1\\nThe answers match``).
Anything else is not a "1", so it scores 0 (incorrect) and is flagged ``parsed=False``; so is
``None`` or a non-string reply. The parser reads the first ``textparse.MAX_TEXT_CHARS`` characters
and runs in linear time.

Verdicts are cached on disk as JSON lines keyed by (question, gold answers, prediction, judge
model), so a repeated judgement never reaches the endpoint; endpoint errors are raised
(:class:`~horizonrl.inference.openai_client.EndpointUnreachable`), never cached.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from horizonrl.inference.openai_client import ChatClient
from horizonrl.jsonl import append_jsonl, read_jsonl
from horizonrl.textparse import cap_text, strip_think

__all__ = ["MOSAIC_JUDGE_PROMPT", "JudgeVerdict", "LLMJudge", "format_ground_truth", "parse_verdict"]

#: Mosaic (appendix C.3) "Prompt Template for LLM-as-Judge", word for word.
MOSAIC_JUDGE_PROMPT = (
    "You are an expert evaluator. Given a question, a ground truth answer, and a predicted answer, "
    "judge whether the predicted answer correctly and completely matches the ground truth answer for "
    "the question. Accept equivalent wording, aliases, abbreviations, and semantically identical "
    "answers. Reply with only a number: 1 if correct, 0 if incorrect.\n"
    "Question:{question}\n"
    "Ground Truth Answer:{ground_truth}\n"
    "Predicted Answer:{answer}"
)

_VERDICT = re.compile(r"([01])(?=[\s,;:!)\]])")
_DECORATION = " \t\r\n\"'`*.:"


@dataclass(frozen=True)
class JudgeVerdict:
    """One judgement. ``score`` is 1.0 if correct else 0.0; ``parsed`` says whether the reply was a
    valid verdict; ``raw`` is the judge's reply; ``cached`` whether it came from the cache."""

    correct: bool
    score: float
    raw: str
    parsed: bool
    cached: bool = False


def parse_verdict(reply: str | None) -> tuple[bool, bool]:
    """``(correct, parsed)`` for a judge reply (rules in the module docstring)."""
    text = strip_think(cap_text(reply if isinstance(reply, str) else None)).strip(_DECORATION)
    if text in ("1", "0"):
        return text == "1", True
    m = _VERDICT.match(text)
    if m is not None:
        return m.group(1) == "1", True
    return False, False


def format_ground_truth(gold: str | Sequence[str]) -> str:
    """One answer as is; several as a list with one ``- answer`` entry per line (paper, C.3)."""
    golds = [gold] if isinstance(gold, str) else [str(g) for g in gold]
    if not golds:
        raise ValueError("gold must be a string or a non-empty sequence of strings, got an empty sequence")
    if len(golds) == 1:
        return golds[0]
    return "\n" + "\n".join(f"- {g}" for g in golds)


class LLMJudge:
    """Judge answers with an LLM (Mosaic prompt), caching verdicts on disk.

    Args:
        client: the endpoint to ask (its ``model`` is part of the cache key).
        cache_path: a JSON-lines file (created if missing, appended to); None keeps the cache in
            memory only.
        max_tokens: generated-token budget of a verdict (paper: 10).
        temperature: sampling temperature (paper: 0.0, i.e. greedy).
        disable_thinking: send ``chat_template_kwargs={"enable_thinking": false}`` (vLLM/SGLang
            convention) for reasoning models; off by default because strict servers reject unknown
            fields. ``<think>`` blocks in the reply are ignored either way.
    """

    def __init__(
        self,
        client: ChatClient,
        cache_path: str | Path | None = None,
        *,
        max_tokens: int = 10,
        temperature: float = 0.0,
        disable_thinking: bool = False,
    ):
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
        if not temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {temperature!r}")
        self.client = client
        self.max_tokens = max_tokens
        self.temperature = float(temperature)
        self.disable_thinking = disable_thinking
        self.cache_path = Path(cache_path) if cache_path is not None else None
        self._cache: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.requests = 0  # judge requests sent to the endpoint by this instance
        if self.cache_path is not None and self.cache_path.exists():
            self._load_cache(self.cache_path)

    def _load_cache(self, path: Path) -> None:
        """Entries of a cache file (:func:`horizonrl.jsonl.read_jsonl`: a torn last line, as a killed
        writer leaves it, is skipped with a warning; any other bad line is a DataError naming it)."""
        for rec in read_jsonl(path, what="judge cache entries"):
            key = rec.get("key", str)
            rec.get("correct", bool)
            rec.get("raw", str)
            rec.get("parsed", bool)
            self._cache[key] = rec.value

    @staticmethod
    def cache_key(question: str, gold: str | Sequence[str], prediction: str, model: str) -> str:
        """SHA-256 of the JSON of ``[question, golds, prediction, model]``."""
        golds = [gold] if isinstance(gold, str) else [str(g) for g in gold]
        blob = json.dumps([question, golds, prediction, model], ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def prompt(self, question: str, gold: str | Sequence[str], prediction: str) -> str:
        """The judge prompt for one case."""
        return MOSAIC_JUDGE_PROMPT.format(
            question=question, ground_truth=format_ground_truth(gold), answer=prediction
        )

    def judge(self, question: str, gold: str | Sequence[str], prediction: str | None) -> JudgeVerdict:
        """Whether ``prediction`` answers ``question`` like ``gold`` (one answer or several aliases).

        A missing prediction (None) is incorrect without a request.
        """
        if prediction is None:
            return JudgeVerdict(correct=False, score=0.0, raw="", parsed=False)
        key = self.cache_key(question, gold, prediction, self.client.model)
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None:
            return JudgeVerdict(hit["correct"], float(hit["correct"]), hit["raw"], hit["parsed"], cached=True)
        extra = {"chat_template_kwargs": {"enable_thinking": False}} if self.disable_thinking else {}
        reply = self.client.chat(
            [{"role": "user", "content": self.prompt(question, gold, prediction)}],
            temperature=self.temperature,
            max_tokens=self.max_tokens,
            **extra,
        )
        correct, parsed = parse_verdict(reply)
        verdict = JudgeVerdict(correct=correct, score=float(correct), raw=reply, parsed=parsed)
        entry = {
            "key": key,
            "model": self.client.model,
            "question": question,
            "gold": gold if isinstance(gold, str) else list(gold),
            "prediction": prediction,
            **{k: v for k, v in asdict(verdict).items() if k in ("correct", "raw", "parsed")},
        }
        with self._lock:
            self.requests += 1
            self._cache[key] = entry
            if self.cache_path is not None:
                self.cache_path.parent.mkdir(parents=True, exist_ok=True)
                append_jsonl(self.cache_path, entry)
        return verdict

    def reward(self, question: str, gold: str | Sequence[str], prediction: str | None) -> float:
        """``judge(...).score``: 1.0 if the judge says correct, else 0.0."""
        return self.judge(question, gold, prediction).score
