"""Per-request seeds: samples that do not depend on which engine, replica or batch serves a request.

With one generator per engine (the ``batch`` default of a local run) the
uniforms a prompt's tokens are drawn with depend on its row in the batch and on
every other prompt of the call, so splitting a call across replicas (Ray) or
ranks (torchrun) would change the samples. With *request seeding*:

- the engine's RNG (a ``torch.Generator``, checkpointed like the local one)
  draws one seed in ``[0, 2**62)`` (vLLM's range) per prompt of each ``generate`` call, in prompt order
  (:class:`RequestSeeds`);
- the uniform that draws token ``t`` of a request with seed ``s`` is a pure
  function of ``(s, t)`` (:func:`request_uniforms`: SplitMix64 of
  ``s + (t + 1) * 0x9E3779B97F4A7C15``, top 53 bits), so it is the same on any
  replica, in any batch, in any order.

An agent driver can also fix every request's seed itself (:func:`path_seed`): a
rollout draws one seed from the engine RNG, and each of its requests gets the
seed of its place in the rollout (which subagent, which call), so the samples do
not depend on the order requests reach the engine either (the asynchronous
driver, :mod:`horizonrl.agents.scheduler`).

Given the same logits a request therefore gets the same tokens wherever it
runs; only floating-point differences between batch shapes (~1e-7 in
float32) remain, which change a token only when a uniform lands within that
distance of a CDF boundary.

:class:`SeededEngine` adds request seeding to one engine whose ``generate``
takes ``seeds=`` (the HF engine does; so must any engine that is replicated).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from horizonrl.inference.base import Engine, EngineWrapper, Generation, SamplingParams

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def request_uniforms(seeds: Sequence[int] | np.ndarray, step: int | np.ndarray) -> np.ndarray:
    """Uniforms in ``[0, 1)`` (float64) for token ``step`` of requests with ``seeds`` (SplitMix64);
    ``step`` is one int, or one per request (rows of a continuous batch are at different tokens)."""
    with np.errstate(over="ignore"):
        t = np.asarray(step, dtype=np.int64).astype(np.uint64) + np.uint64(1)
        x = np.asarray(seeds, dtype=np.int64).astype(np.uint64) + t * _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)


def seeded_uniforms(seeds: np.ndarray, step: int | np.ndarray, device: torch.device) -> torch.Tensor:
    """:func:`request_uniforms` as a ``[rows, 1]`` tensor on ``device`` (float64; float32 on MPS)."""
    dtype = torch.float32 if device.type == "mps" else torch.float64
    return torch.from_numpy(request_uniforms(seeds, step)[:, None]).to(device=device, dtype=dtype)


def draw_seeds(generator: torch.Generator, n: int) -> list[int]:
    """``n`` request seeds in ``[0, 2**62)`` (vLLM's range) from ``generator``."""
    if n == 0:
        return []
    draw = torch.randint(0, 2**62, (n,), generator=generator, device=generator.device, dtype=torch.int64)
    return draw.tolist()


_MASK64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """SplitMix64's finaliser on a Python int (64-bit wrap-around)."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
    return x ^ (x >> 31)


def path_seed(seed: int, path: Sequence[int]) -> int:
    """The request seed (in ``[0, 2**62)``) at ``path`` under a rollout seed: a SplitMix64 chain,
    ``x <- mix(x + (e + 1) * golden)`` over the path's entries, starting from ``mix(seed)``."""
    x = _mix64(int(seed) & _MASK64)
    for e in path:
        x = _mix64((x + (int(e) + 1) * 0x9E3779B97F4A7C15) & _MASK64)
    return x >> 2


class RequestSeeds:
    """The engine RNG of request seeding: draws one seed per request (state checkpointable)."""

    def __init__(self, seed: int = 0) -> None:
        self.generator = torch.Generator()
        self.set_seed(seed)

    def draw(self, n: int) -> list[int]:
        return draw_seeds(self.generator, n)

    def set_seed(self, seed: int) -> None:
        self.generator.manual_seed(int(seed))

    def rng_state(self) -> torch.Tensor:
        return self.generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)


class SeedStateMixin:
    """``set_seed`` / ``rng_state`` / ``set_rng_state`` of an engine that draws request seeds from
    ``self.seeds`` (a :class:`RequestSeeds`)."""

    seeds: RequestSeeds

    def set_seed(self, seed: int) -> None:
        self.seeds.set_seed(seed)

    def rng_state(self) -> torch.Tensor:
        return self.seeds.rng_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self.seeds.set_rng_state(state)


class SeededEngine(SeedStateMixin, EngineWrapper):
    """One engine with request seeding: ``generate`` draws the seeds and passes them as ``seeds=``.

    ``set_seed`` / ``rng_state`` / ``set_rng_state`` act on the seed RNG; other
    attributes (``model``, ``eos_ids``, ...) are the wrapped engine's.
    """

    def __init__(self, engine: Engine, seed: int = 0) -> None:
        super().__init__(engine)
        self.seeds = RequestSeeds(seed)
        self.supports_top_logprobs = engine.supports_top_logprobs
        self.supports_ignore_eos = engine.supports_ignore_eos
        self.supports_grammar = engine.supports_grammar

    supports_seeds = True

    def draw_seeds(self, n: int) -> list[int]:
        return self.seeds.draw(n)

    def open_stream(self):
        return self.inner.open_stream()  # a stream request carries its own seed

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, *, seeds: Sequence[int] | None = None
    ) -> list[Generation]:
        """Sample with ``seeds`` (one per prompt) when given, else with seeds drawn here in prompt order."""
        seeds = self.seeds.draw(len(prompts)) if seeds is None else seeds
        return self.inner.generate(prompts, params, seeds=seeds)
