"""Answer rewards: exact match, token F1, math equivalence, the LLM judge, and ``env.reward`` specs.

- :func:`normalize_text` is the package's one answer normalizer, SQuAD style (Unicode NFKC,
  lowercase, punctuation and the articles *a/an/the* removed, whitespace collapsed); it lives in
  :mod:`horizonrl.textparse` (below this module and :mod:`horizonrl.math_answer`) and is re-exported here.
- :func:`exact_match` / :func:`token_f1` score a prediction against one gold answer or a list of
  aliases (the best alias counts).
- :func:`math_equivalent` (:mod:`horizonrl.math_answer`) decides whether two math answers are the
  same value, with SymPy in a worker process under a hard time limit.

Rewards are registered by name (``@register_reward("name")``) so environments and configs can pick
one with :func:`get_reward`; every registered reward is ``fn(prediction, golds) -> float``.
:func:`make_reward` turns an ``env.reward`` spec into an :class:`AnswerReward`
(``reward(prediction, golds, question) -> float``): a registered name (``exact_match``,
``token_f1``, ``math_equivalent``), ``judge`` (:class:`horizonrl.judge.LLMJudge` against an
OpenAI-compatible endpoint, checked for reachability at construction), or ``module:function`` /
``path/to/file.py:function`` (a user function ``fn(prediction, golds, **params)``, also given
``question=`` when it accepts it).
"""

from __future__ import annotations

import inspect
import math
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from horizonrl.math_answer import DEFAULT_TIMEOUT_S, extract_math_answer, math_equivalent
from horizonrl.registry import Registry, UnknownNameError
from horizonrl.textparse import normalize_text
from horizonrl.userimport import UserImportError, load_object

__all__ = [
    "REWARDS",
    "AnswerReward",
    "RewardConfigError",
    "UnknownRewardError",
    "exact_match",
    "extract_math_answer",
    "get_reward",
    "list_rewards",
    "make_reward",
    "math_equivalent",
    "math_reward",
    "normalize_text",
    "register_reward",
    "token_f1",
]

RewardFn = Callable[[str | None, str | Sequence[str]], float]
R = TypeVar("R", bound=RewardFn)


class UnknownRewardError(UnknownNameError):
    """Raised by :func:`get_reward` for an unregistered name (a ``KeyError`` and a ``ValueError``)."""


REWARDS: Registry[RewardFn] = Registry(
    "reward", register_with="@register_reward(NAME) (horizonrl.rewards)", error=UnknownRewardError
)


def register_reward(name: str) -> Callable[[R], R]:
    """Decorator: register ``fn(prediction, golds) -> float`` under ``name`` (a non-empty string)."""
    return REWARDS.register(name)


#: The reward function registered as ``name`` (:class:`UnknownRewardError` naming the known ones).
get_reward = REWARDS.get

#: Names of all registered rewards, sorted.
list_rewards = REWARDS.names


def _golds(golds: str | Sequence[str]) -> list[str]:
    """One gold answer or a sequence of aliases -> a non-empty list of strings."""
    if isinstance(golds, str):
        return [golds]
    out = [str(g) for g in golds]
    if not out:
        raise ValueError("golds must be a string or a non-empty sequence of strings, got an empty sequence")
    return out


# -- text rewards ----------------------------------------------------------------------------------------


@register_reward("exact_match")
def exact_match(pred: str | None, golds: str | Sequence[str]) -> float:
    """1.0 if the normalized prediction equals any normalized gold alias, else 0.0 (None scores 0)."""
    if pred is None:
        return 0.0
    got = normalize_text(pred)
    return float(any(got == normalize_text(g) for g in _golds(golds)))


def _f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


@register_reward("token_f1")
def token_f1(pred: str | None, golds: str | Sequence[str]) -> float:
    """SQuAD token F1 of the normalized texts, the best over gold aliases (None scores 0)."""
    if pred is None:
        return 0.0
    tokens = normalize_text(pred).split()
    return max(_f1(tokens, normalize_text(g).split()) for g in _golds(golds))


# -- math answers ----------------------------------------------------------------------------------------


@register_reward("math")
@register_reward("math_equivalent")
def math_reward(
    pred: str | None, golds: str | Sequence[str], *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> float:
    """1.0 if :func:`math_equivalent` holds for any gold alias, else 0.0 (``timeout_s``: SymPy budget)."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not 0 < timeout_s <= 600:
        raise ValueError(f"math_equivalent: timeout_s must be a number in (0, 600], got {timeout_s!r}")
    return float(any(math_equivalent(pred, g, timeout_s=timeout_s) for g in _golds(golds)))


# -- env.reward specs ------------------------------------------------------------------------------------


class RewardConfigError(ValueError):
    """An ``env.reward`` / ``env.reward_params`` value that cannot be turned into a reward."""


@dataclass(frozen=True)
class AnswerReward:
    """A configured answer reward: ``reward(prediction, golds, question) -> float``.

    ``fn(prediction, golds, **params)`` is called (with ``question=`` too when ``pass_question``);
    a result that is not a finite number raises :class:`RewardConfigError` naming the reward.
    ``judge`` is the :class:`~horizonrl.judge.LLMJudge` of a ``judge`` reward, else None.
    """

    name: str
    fn: Callable[..., Any]
    params: Mapping[str, Any] = field(default_factory=dict)
    pass_question: bool = False
    judge: Any = None

    def __call__(self, prediction: str | None, golds: str | Sequence[str], question: str = "") -> float:
        kwargs = dict(self.params)
        if self.pass_question:
            kwargs["question"] = question
        value = self.fn(prediction, _golds(golds), **kwargs)
        if isinstance(value, bool):
            return float(value)
        if not isinstance(value, int | float) or not math.isfinite(value):
            raise RewardConfigError(
                f"reward {self.name!r} returned {value!r}; a reward must be a finite number"
            )
        return float(value)


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _check_params(spec: str, fn: Callable[..., Any], params: Mapping[str, Any]) -> None:
    extra = {"question": ""} if ":" in spec and _accepts(fn, "question") else {}
    try:
        inspect.signature(fn).bind("", [""], **params, **extra)
    except TypeError as e:
        raise RewardConfigError(
            f"env.reward={spec!r}: {getattr(fn, '__name__', 'the function')} cannot be called as "
            f"fn(prediction, golds{''.join(f', {k}=...' for k in params)}): {e}"
        ) from None
    except ValueError:  # no signature (builtins): call and see
        pass


_JUDGE_PARAMS = (
    "url",
    "model",
    "api_key_env",
    "cache",
    "timeout_s",
    "max_retries",
    "max_tokens",
    "temperature",
    "disable_thinking",
)


def _judge_reward(params: Mapping[str, Any], default_cache: str | Path | None) -> AnswerReward:
    """``judge``: :class:`~horizonrl.judge.LLMJudge` against ``params['url']`` (reachability checked now)."""
    from horizonrl.inference.openai_client import ChatClient, ChatRequestError, EndpointUnreachable
    from horizonrl.judge import LLMJudge

    unknown = sorted(set(params) - set(_JUDGE_PARAMS))
    if unknown:
        raise RewardConfigError(
            f"env.reward_params: unknown judge parameter(s) {unknown}; known: {list(_JUDGE_PARAMS)}"
        )
    url = params.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise RewardConfigError(
            f"env.reward_params.url={url!r}: the judge needs the endpoint's base URL, e.g. http://127.0.0.1:8000/v1"
        )
    key = None
    if params.get("api_key_env") is not None:
        key = os.environ.get(str(params["api_key_env"]))
        if not key:
            raise RewardConfigError(
                f"env.reward_params.api_key_env={params['api_key_env']!r}: that environment variable is unset"
            )
    model = params.get("model")
    try:
        client_kw = {
            "timeout_s": float(params.get("timeout_s", 60.0)),
            "max_retries": params.get("max_retries", 3),
        }
        probe = ChatClient(
            url, str(model or "probe"), key, timeout_s=min(10.0, client_kw["timeout_s"]), max_retries=1
        )
    except ValueError as e:
        raise RewardConfigError(f"env.reward_params: {e}") from None
    try:
        served = probe.models()
    except EndpointUnreachable as e:
        raise RewardConfigError(
            f"env.reward=judge: the judge endpoint {url} is unreachable ({e.cause})"
        ) from None
    except ChatRequestError:
        served = []  # the server answered (no model listing): reachable
    finally:
        probe.close()
    if not model:
        if not served:
            raise RewardConfigError(f"env.reward_params.model: {url} lists no models; name the judge model")
        model = served[0]
    try:
        client = ChatClient(url, str(model), key, **client_kw)
        judge = LLMJudge(
            client,
            params.get("cache", default_cache),
            max_tokens=params.get("max_tokens", 10),
            temperature=params.get("temperature", 0.0),
            disable_thinking=bool(params.get("disable_thinking", False)),
        )
    except (TypeError, ValueError) as e:
        raise RewardConfigError(f"env.reward_params: {e}") from None

    def judged(prediction: str | None, golds: list[str], *, question: str = "") -> float:
        return judge.reward(question, golds if len(golds) > 1 else golds[0], prediction)

    return AnswerReward("judge", judged, {}, pass_question=True, judge=judge)


def make_reward(
    spec: str, params: Mapping[str, Any] | None = None, *, judge_cache: str | Path | None = None
) -> AnswerReward:
    """The :class:`AnswerReward` of an ``env.reward`` spec (see the module docstring).

    ``params`` (``env.reward_params``) are keyword arguments of the reward function (``judge``: the
    endpoint settings ``url``, ``model``, ``api_key_env``, ``cache``, ``timeout_s``, ``max_retries``,
    ``max_tokens``, ``temperature``, ``disable_thinking``); ``judge_cache`` is the judge's cache file
    when ``params`` gives none.
    """
    params = dict(params or {})
    if not isinstance(spec, str) or not spec:
        raise RewardConfigError(f"env.reward={spec!r}: expected a reward name or module:function")
    if spec == "judge":
        return _judge_reward(params, judge_cache)
    if ":" in spec:
        try:
            fn = load_object(spec, "env.reward")
        except UserImportError as e:
            raise RewardConfigError(str(e)) from None
        if not callable(fn):
            raise RewardConfigError(f"env.reward={spec!r}: {type(fn).__name__} object is not callable")
    else:
        try:
            fn = get_reward(spec)
        except UnknownRewardError as e:
            raise RewardConfigError(
                f"env.reward: {e}; env.reward may also be judge or module:function"
            ) from None
    _check_params(spec, fn, params)
    if spec in ("math", "math_equivalent"):
        math_reward("", ["0"], **params)  # validate timeout_s now
        from horizonrl.sympy_worker import default_worker

        default_worker().start()  # SymPy imports in the worker while the run sets up
    return AnswerReward(spec, fn, params, pass_question=":" in spec and _accepts(fn, "question"))
