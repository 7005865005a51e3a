"""Engine interface (docs/design.md, "Engines").

An engine samples continuations of token-id prompts and scores given
continuations by teacher forcing. Log-probs are those of the sampling
distribution after temperature scaling (top-p only filters which tokens can be
drawn), which is what the trainer recomputes, so the rollout/train ratio is 1
before an update.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()
    greedy: bool = False
    #: Also report the ``top_logprobs`` most likely tokens at each step (``Generation.meta["top_logprobs"]``:
    #: one list of ``(token_id, logprob)`` pairs per generated token, under the same distribution as
    #: ``logprobs``); 0 = off. Engines that cannot report them set ``supports_top_logprobs = False``.
    top_logprobs: int = 0
    #: Keep generating after an end-of-sequence token (benchmarks; the token stays in the output).
    ignore_eos: bool = False
    #: Constrain every sampled token to this grammar (an llguidance Lark grammar, see
    #: :mod:`horizonrl.inference.constrain`): a row samples only tokens the grammar allows and ends when
    #: the grammar is complete. None (the default) leaves sampling untouched. Engines that cannot
    #: constrain set ``supports_grammar = False``.
    grammar: str | None = None

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"SamplingParams.temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not 0 <= self.top_logprobs <= 20:
            raise ValueError(f"SamplingParams.top_logprobs must be in [0, 20], got {self.top_logprobs}")
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar.strip()):
            raise ValueError("SamplingParams.grammar must be a non-empty string or None")


@dataclass
class Generation:
    """One sampled continuation. ``finish_reason`` is ``stop`` (EOS or stop string) or ``length``."""

    ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    meta: dict = field(default_factory=dict)


class GenerationStream(ABC):
    """Continuous batching: requests join a running batch and leave it as soon as they end.

    ``add`` queues a request (from any thread); ``step`` (one thread) admits the queued ones, runs one
    decode step of the running batch and returns ``(key, Generation)`` for every request that ended;
    ``pending`` says whether a ``step`` has anything to do. Every request is sampled from its ``seed``
    (:mod:`horizonrl.inference.seeding`); ``lineage`` names the agent program it comes from (requests of
    one lineage may reuse each other's caches, :mod:`horizonrl.inference.prefix_store`).
    """

    @abstractmethod
    def add(
        self,
        key: Hashable,
        prompt: Sequence[int],
        params: SamplingParams,
        seed: int,
        lineage: Hashable = None,
    ) -> None: ...

    def forget(self, lineage: Hashable) -> None:  # noqa: B027
        """``lineage`` (an agent program) makes no more requests: a stream may drop what it kept for it."""

    def close(self) -> None:  # noqa: B027
        """Drop every request still queued or running (the driver stopped: a program or the engine failed)."""

    @abstractmethod
    def step(self) -> list[tuple[Hashable, Generation]]: ...

    @property
    @abstractmethod
    def pending(self) -> bool: ...


class QueuedStream(GenerationStream):
    """A stream whose ``add`` only queues ``(key, prompt, params, seed, lineage)`` (from any thread) and
    whose ``step`` takes the queue (:meth:`_take`, on the stepping thread)."""

    def __init__(self) -> None:
        self._queue: list[tuple] = []
        self._lock = threading.Lock()

    def add(self, key, prompt, params, seed, lineage=None) -> None:
        with self._lock:
            self._queue.append((key, [int(t) for t in prompt], params, int(seed), lineage))

    def _take(self) -> list[tuple]:
        with self._lock:
            queued, self._queue = self._queue, []
        return queued

    def close(self) -> None:
        self._take()


class MappedStream(GenerationStream):
    """A stream in front of another (what an :class:`EngineWrapper` returns from ``open_stream``):
    ``before(params)`` may change a request's params or answer it at once (return a Generation);
    ``after(gen, params)`` post-processes each generation that ends; ``drop(params)`` is told of each
    request still running when the stream is closed. They run inside :meth:`step` / :meth:`close`, on
    the thread that steps the stream, so a wrapper's bookkeeping (the token budget) needs no lock."""

    def __init__(self, inner: GenerationStream, before=None, after=None, drop=None) -> None:
        self.inner, self.before, self.after, self.drop = inner, before, after, drop
        self._params: dict[Hashable, SamplingParams] = {}
        self._queue: list[tuple] = []
        self._lock = threading.Lock()

    def add(self, key, prompt, params, seed, lineage=None) -> None:
        with self._lock:
            self._queue.append((key, prompt, params, seed, lineage))

    def step(self) -> list[tuple[Hashable, Generation]]:
        with self._lock:
            queued, self._queue = self._queue, []
        done = []
        for key, prompt, params, seed, lineage in queued:
            got = self.before(params) if self.before is not None else params
            if isinstance(got, Generation):
                done.append((key, got))
                continue
            self._params[key] = got
            self.inner.add(key, prompt, got, seed, lineage)
        for key, gen in self.inner.step() if self.inner.pending else []:
            params = self._params.pop(key)
            done.append((key, self.after(gen, params) if self.after is not None else gen))
        return done

    @property
    def pending(self) -> bool:
        return bool(self._queue) or self.inner.pending

    def forget(self, lineage) -> None:
        self.inner.forget(lineage)

    def close(self) -> None:
        self.inner.close()
        with self._lock:
            self._queue = []
        if self.drop is not None:
            for params in self._params.values():
                self.drop(params)
        self._params = {}


class Engine(ABC):
    """A sampler and scorer of token ids (module docstring).

    **Capabilities.** What an engine can do beyond :meth:`generate` and :meth:`score` is declared here,
    as class attributes and methods with defaults that every engine inherits, and read as plain
    attributes (``engine.supports_seeds``), never probed with ``getattr``/``hasattr``: an engine that
    can do more overrides the attribute (``HFEngine.supports_grammar = True``). The capabilities:
    ``supports_top_logprobs``, ``supports_ignore_eos``, ``supports_interrupt``, ``supports_grammar``,
    ``supports_grammar_resume``, ``supports_seeds`` (with :meth:`draw_seeds`), ``answers_requests``
    (with :meth:`generate_requests`), and :meth:`open_stream` (None: no continuous batching).
    """

    #: Whether ``generate`` honours ``SamplingParams.top_logprobs`` / ``SamplingParams.ignore_eos``.
    supports_top_logprobs: bool = False
    supports_ignore_eos: bool = False
    #: Whether ``generate`` accepts ``interrupt=`` (see :meth:`HFEngine.generate`): serving preemption.
    supports_interrupt: bool = False
    #: Whether ``generate`` honours ``SamplingParams.grammar``, and whether it also takes ``generated=``
    #: (per prompt, how many of its last tokens the row already generated under the grammar: a row
    #: continued in a later call, whose matcher replays them first).
    supports_grammar: bool = False
    supports_grammar_resume: bool = False
    #: Whether ``generate`` takes ``seeds=`` (one per prompt; the sample then depends on its seed only,
    #: :mod:`horizonrl.inference.seeding`) and ``draw_seeds`` gives fresh ones: what the asynchronous
    #: driver needs (:mod:`horizonrl.agents.scheduler`).
    supports_seeds: bool = False
    #: Whether the engine answers the agents' ``Generate`` requests itself (:meth:`generate_requests`,
    #: the scripted expert of :mod:`horizonrl.agents.expert`) instead of sampling prompts with
    #: :meth:`generate`; the drivers then hand it whole requests and never run it asynchronously.
    answers_requests: bool = False

    @abstractmethod
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Sample one continuation per prompt.

        An engine that can serve as a Ray replica or a torchrun rank also takes ``seeds=`` (one int
        per prompt) and then draws each prompt's tokens from its own seed only, so the sample does not
        depend on the batch it is in (:mod:`horizonrl.inference.seeding`).
        """

    @abstractmethod
    def score(
        self, contexts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]
    ) -> list[np.ndarray]:
        """Log-prob of every continuation token given its context (teacher forcing, no grad)."""

    def open_stream(self) -> GenerationStream | None:
        """A continuous batcher over this engine (:class:`GenerationStream`), or None when the engine only
        generates whole batches (the asynchronous driver then batches whole calls)."""
        return None

    def draw_seeds(self, n: int) -> list[int]:
        """``n`` request seeds in ``[0, 2**62)`` from the engine's checkpointed RNG (``supports_seeds``)."""
        raise NotImplementedError(f"{type(self).__name__} does not draw request seeds")

    def generate_requests(self, requests: Sequence) -> list[Generation]:
        """One generation per agent ``Generate`` request, answered by the engine (``answers_requests``)."""
        raise NotImplementedError(f"{type(self).__name__} does not answer requests itself")

    def sync(self, state_dict: Mapping | None = None) -> None:  # noqa: B027
        """Load new policy weights: ``state_dict`` if given; ``None`` means "the training model
        changed" (a no-op for engines that run it, a pull for engines that keep their own copy)."""

    def sleep(self) -> None:  # noqa: B027
        """Free accelerator memory until the next ``sync``/``generate`` (colocated training)."""

    def close(self) -> None:  # noqa: B027
        """Release processes and files (the engine cannot be used afterwards)."""


class EngineWrapper(Engine):
    """An engine in front of another: ``score``, ``sync``, ``sleep``, ``close`` and every other attribute
    (``model``, ``eos_ids``, ...) are the wrapped engine's; a subclass changes ``generate``."""

    def __init__(self, engine: Engine) -> None:
        self.inner = engine

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @property
    def supports_seeds(self) -> bool:  # a subclass whose generate drops ``seeds=`` sets False
        return bool(self.inner.supports_seeds)

    def draw_seeds(self, n: int) -> list[int]:
        return self.inner.draw_seeds(n)

    @property
    def answers_requests(self) -> bool:
        return bool(self.inner.answers_requests)

    def generate_requests(self, requests: Sequence) -> list[Generation]:
        return self.inner.generate_requests(requests)

    def open_stream(self) -> GenerationStream | None:
        """None: a wrapper whose ``generate`` changes requests or results must say how its stream does
        (override); a stream straight from the wrapped engine would skip it."""
        return None

    def score(self, contexts, continuations) -> list[np.ndarray]:
        return self.inner.score(contexts, continuations)

    def sync(self, state_dict: Mapping | None = None) -> None:
        self.inner.sync(state_dict)

    def sleep(self) -> None:
        self.inner.sleep()

    def close(self) -> None:
        self.inner.close()
