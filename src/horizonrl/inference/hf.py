"""Embedded Hugging Face engine (docs/design.md, "Engines").

``HFEngine`` samples from any ``transformers`` causal LM with a KV cache:
prompts are left-padded into a batch with an attention mask and explicit
position ids (so every row computes what an unpadded forward would), the
batch is prefilled once, then decoded one token per step. Finished rows are
dropped from the batch (and its cache) once enough of them have finished.

Log-probs are ``log_softmax(logits / temperature)`` in float32 over the full
vocabulary (top-p only restricts which tokens can be drawn), which is what
the trainer recomputes; greedy decoding reports temperature-1 log-probs.

With ``SamplingParams.grammar`` (constrained decoding, :mod:`horizonrl.inference.constrain`) every row
has an llguidance matcher: before each draw the logits of the tokens the grammar does not allow are set
to ``-inf``, so a row samples from ``softmax(masked logits / temperature)`` (top-p within that) and its
log-probs are those of this *masked* distribution, ``log_softmax`` over the allowed tokens (``top_logprobs``
list allowed tokens only); a token forced by the grammar has log-prob 0. The matcher consumes the sampled
token and the row ends when the grammar is complete. Without a grammar nothing of this runs.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
from transformers import DynamicCache

from horizonrl.inference.base import Engine, Generation, SamplingParams
from horizonrl.inference.batching import eval_mode, left_pad
from horizonrl.inference.hf_stream import HFStream, open_hf_stream
from horizonrl.inference.lean_decode import LeanDecoder, supports_lean_decode
from horizonrl.inference.precision import contiguous_head, pack_linears, sampling_copy, sampling_dtype
from horizonrl.inference.prefix_store import TurnStore, cached_prefill
from horizonrl.inference.seeding import draw_seeds, seeded_uniforms
from horizonrl.inference.shared_prefix import (
    ATTENTION,
    PrefixCache,
    attention_as,
    common_prefix_len,
    supports_shared_prefix,
    weights_version,
)
from horizonrl.inference.stops import StopWatcher, as_id_set

__all__ = ["HFEngine"]

_SCORE_LOGITS = 2**28  # at most this many logits (1 GiB in float32) per score() forward, beyond one row


def _draw(
    weights: torch.Tensor,
    generator: torch.Generator | None,
    block: int = 1024,
    uniforms: torch.Tensor | None = None,
) -> torch.Tensor:
    """One index per row with probability proportional to ``weights`` (non-negative, positive row sums).

    Two-level inverse-CDF sampling: pick a block of ``block`` columns from the block sums, then a
    column inside it. Needs one uniform per row (``uniforms`` ``[rows, 1]`` in ``[0, 1)``, else
    drawn from ``generator``) and one pass over the weights, which on CPU is ~30x faster than
    ``torch.multinomial``; the cumulative sums are in float64 so rare tokens keep their probability.
    """
    rows, vocab = weights.shape
    dtype = torch.float32 if weights.device.type == "mps" else torch.float64
    full = (vocab // block) * block
    sums = weights[:, :full].reshape(rows, -1, block).sum(-1)
    if full < vocab:
        sums = torch.cat([sums, weights[:, full:].sum(-1, keepdim=True)], dim=-1)
    cdf = sums.to(dtype).cumsum(-1)
    if uniforms is None:
        uniforms = torch.rand((rows, 1), generator=generator, dtype=dtype, device=weights.device)
    u = uniforms.to(dtype) * cdf[:, -1:]
    # side="right" never lands on a zero-weight entry; the clamp guards rounding at the very end.
    blk = torch.searchsorted(cdf, u, right=True)
    blk = torch.minimum(blk, (cdf < cdf[:, -1:]).sum(-1, keepdim=True))
    u = u - torch.where(blk > 0, cdf.gather(-1, (blk - 1).clamp(min=0)), 0.0)
    cols = blk * block + torch.arange(block, device=weights.device)
    inner = weights.gather(-1, cols.clamp(max=vocab - 1)).masked_fill_(cols >= vocab, 0.0)
    cdf = inner.to(dtype).cumsum(-1)
    pick = torch.minimum(torch.searchsorted(cdf, u, right=True), (cdf < cdf[:, -1:]).sum(-1, keepdim=True))
    return cols.gather(-1, pick).squeeze(-1)


class HFEngine(Engine):
    """Batched KV-cache sampler over a Hugging Face causal LM.

    Honours ``SamplingParams.top_logprobs`` and ``ignore_eos``; ``generate(..., interrupt=f)`` stops early
    when ``f(steps)`` says so (the serving scheduler's preemption point).

    Args:
        model: any ``transformers`` causal LM (``model(input_ids, attention_mask, position_ids, ...)``).
        tokenizer: its tokenizer (used for eos/pad ids, stop strings and ``Generation.text``); may be None.
        device: where to run; the model is moved there if given (default: the model's device).
        max_batch_size: prompts are processed in chunks of at most this many rows.
        seed: seed of the engine's ``torch.Generator`` (see ``set_seed``/``rng_state``).
        compact_fraction: finished rows are dropped from the batch and cache once at least this
            fraction of the running rows has finished (0 drops them at once; 1 never drops them).
        prefix_reuse: under the asynchronous driver (continuous batching, :mod:`.hf_stream`), keep each
            rollout's latest KV cache for its next prompt, which then prefills only what it adds
            (:mod:`.prefix_store`).
        shared_prefix: in :meth:`generate`, prefill the longest common prefix of the call's prompts once
            (kept across calls while it still fits and the weights are unchanged) and let every row attend
            to that one copy (:mod:`.shared_prefix`); used when it is at least ``shared_prefix_min``
            tokens and the model supports it.
        shared_prefix_min: the shortest common prefix worth sharing.
        turn_reuse: in :meth:`generate`, keep every row's KV cache of the call, and prefill a prompt of the
            next call only past the kept cache it extends the furthest (the round-by-round driver's next
            turn: prompt, generation and observation; :class:`.prefix_store.TurnStore`). Kept until the
            next call, a sync or a sleep, at most ``turn_reuse_mb`` MB of them (rows past it prefill whole;
            while a call runs, the previous call's are held too).
        lean_decode: run decode steps through :class:`.lean_decode.LeanDecoder` (fused projections, fewer
            ops; the same function up to float rounding) where the model's architecture is covered, else
            transformers' forward.
        dtype: sample from a copy of ``model`` in this dtype (``"bfloat16"``; :mod:`.precision`) that
            :meth:`sync` refreshes from ``model``; None samples from ``model`` itself.
    """

    supports_top_logprobs = True
    supports_ignore_eos = True
    supports_interrupt = True
    supports_grammar = True
    supports_grammar_resume = True
    supports_seeds = True

    def __init__(
        self,
        model,
        tokenizer=None,
        *,
        device: str | torch.device | None = None,
        max_batch_size: int = 64,
        seed: int = 0,
        compact_fraction: float = 0.25,
        prefix_reuse: bool = True,
        shared_prefix: bool = False,
        shared_prefix_min: int = 32,
        turn_reuse: bool = False,
        turn_reuse_mb: float = 2048.0,
        lean_decode: bool = False,
        dtype: str | None = None,
    ):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if device is not None:
            model.to(device)
        #: The model whose weights ``sync()`` copies into ``self.model`` (None: they are the same).
        self.follow = None
        cast = sampling_dtype(model, dtype, device)
        if cast is not None:
            self.follow, model = model, sampling_copy(model, cast)
            pack_linears(model)
        contiguous_head(model)
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.max_batch_size = max_batch_size
        self.compact_fraction = compact_fraction
        self.prefix_reuse = bool(prefix_reuse)
        self.shared_prefix = bool(shared_prefix) and supports_shared_prefix(model)
        self.shared_prefix_min = max(1, int(shared_prefix_min))
        self._prefix: PrefixCache | None = None
        self.turn_reuse = bool(turn_reuse)
        self.turn_reuse_bytes = float(turn_reuse_mb) * 2**20
        self._turns: TurnStore | None = None  # the last generate call's row caches (turn_reuse)
        self._lean = LeanDecoder(model) if lean_decode and supports_lean_decode(model) else None
        eos = as_id_set(getattr(tokenizer, "eos_token_id", None))
        eos |= as_id_set(getattr(getattr(model, "generation_config", None), "eos_token_id", None))
        #: Token ids that end a generation (tokenizer + generation config); public, may be replaced.
        self.eos_ids = frozenset(eos or as_id_set(getattr(model.config, "eos_token_id", None)))
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = int(pad if pad is not None else min(self.eos_ids, default=0))
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_kw = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)
        self._generator = torch.Generator(device=self.device)
        self.set_seed(seed)
        self._grammar_vocab = None  # built on the first constrained call (needs llguidance)

    def set_seed(self, seed: int) -> None:
        """Reseed the sampling generator."""
        self._generator.manual_seed(int(seed))

    def rng_state(self) -> torch.Tensor:
        """Sampling-generator state (a CPU byte tensor) for checkpoints."""
        return self._generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Restore a state returned by ``rng_state``."""
        self._generator.set_state(state)

    def draw_seeds(self, n: int) -> list[int]:
        """``n`` request seeds from the sampling generator (:mod:`horizonrl.inference.seeding`)."""
        return draw_seeds(self._generator, n)

    def open_stream(self) -> HFStream | None:
        """Continuous batching over this engine (:mod:`horizonrl.inference.hf_stream`)."""
        return open_hf_stream(self)

    def _forward(self, ids, mask, pos, cache=None, keep: int = 0, prefix: PrefixCache | None = None):
        """Logits of the last ``keep`` positions (all if 0); with ``prefix``, every row attends to that
        shared prefix before its own cache (``pos`` then counts from the prefix's length)."""
        kwargs = dict(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=cache is not None)
        if cache is not None:
            kwargs[self._cache_kw] = cache
        if keep and self._keep_kw:
            kwargs[self._keep_kw] = keep
        if prefix is None:
            logits = self.model(**kwargs).logits
        else:
            with attention_as(self.model, ATTENTION):
                logits = self.model(**kwargs, prefix_kv=prefix.kv).logits
        return logits[:, -keep:] if keep else logits

    def _decode(self, tokens, mask, pos, cache, prefix: PrefixCache | None = None) -> torch.Tensor:
        """Logits ``[B, vocab]`` of one new token per row (``tokens`` ``[B]``, ``mask`` the rows' cache
        after it), through the lean step where the engine has one, else transformers' forward."""
        if self._lean is not None:
            return self._lean.step(tokens, mask, pos, cache, prefix)
        return self._forward(tokens[:, None], mask, pos, cache, keep=1, prefix=prefix)[:, -1]

    def _shared_prefix(self, prompts: Sequence[Sequence[int]]) -> PrefixCache | None:
        """The shared prefix of ``prompts`` (module docstring of :mod:`.shared_prefix`), or None."""
        if not self.shared_prefix:
            return None
        version = weights_version(self.model)
        if self._prefix is not None and self._prefix.fits(prompts, version):
            return self._prefix
        n = min(common_prefix_len(prompts), min(len(p) for p in prompts) - 1)
        if n < self.shared_prefix_min:
            return None
        ids = tuple(int(t) for t in prompts[0][:n])
        cache = self._new_cache()
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        pos = torch.arange(n, device=self.device)[None]
        self._forward(x, torch.ones_like(x), pos, cache, keep=1)
        kv = [(layer.keys[0], layer.values[0]) for layer in cache.layers]
        self._prefix = PrefixCache(ids, kv, version)
        return self._prefix

    def _new_cache(self) -> DynamicCache:
        try:
            return DynamicCache(config=self.model.config)
        except TypeError:  # older transformers
            return DynamicCache()

    def _sample(self, logits: torch.Tensor, params: SamplingParams, uniforms: torch.Tensor | None = None):
        """Draw one token per row; return ``(tokens, logprobs, top)`` under the temperature-scaled
        distribution; ``top`` is ``(logprobs, ids)`` of the ``params.top_logprobs`` best tokens, or None.

        ``uniforms`` (``[rows, 1]``) are the rows' draws under request seeding; None draws from the
        engine's generator.
        """
        x = logits.float()
        if params.greedy:
            tokens = x.argmax(dim=-1)
            lse = torch.logsumexp(x, -1)
            lp = x.gather(-1, tokens[:, None]).squeeze(-1) - lse
            lse = lse[:, None]
        else:
            if params.temperature != 1:
                x = x / params.temperature
            peak = x.amax(dim=-1, keepdim=True)
            weights = (x - peak).exp_()  # unnormalised probabilities, max 1
            total = weights.sum(dim=-1, keepdim=True)
            if params.top_p < 1:
                tokens = self._draw_nucleus(weights, total, params.top_p, uniforms)
            else:
                tokens = _draw(weights, self._generator, uniforms=uniforms)
            lp = (x.gather(-1, tokens[:, None]) - peak - total.log()).squeeze(-1)
            lse = peak + total.log() if params.top_logprobs else None
        top = None
        if params.top_logprobs:
            best = x.topk(min(params.top_logprobs, x.shape[-1]), dim=-1)
            top = (best.values - lse, best.indices)
        return tokens, lp, top

    def _draw_nucleus(
        self, weights: torch.Tensor, total: torch.Tensor, top_p: float, uniforms: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Sample within the nucleus: tokens whose higher-ranked mass is < top_p (the first always)."""

        def pick(vals, idx, budget, u):  # vals sorted descending, idx their token ids
            before = vals.double().cumsum(-1) - vals
            choice = _draw(vals.masked_fill(before >= budget, 0.0), self._generator, uniforms=u)
            return idx.gather(-1, choice[:, None]).squeeze(-1), before[:, -1] + vals[:, -1] >= budget[:, 0]

        # A partial top-k is much cheaper than a sort; only rows whose nucleus is wider get sorted.
        budget = top_p * total.double()
        tokens, covered = pick(*weights.topk(min(weights.shape[-1], 256), dim=-1), budget, uniforms)
        if not bool(covered.all()):
            rest = None if uniforms is None else uniforms[~covered]
            tokens[~covered] = pick(*weights[~covered].sort(dim=-1, descending=True), budget[~covered], rest)[
                0
            ]
        return tokens

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        interrupt: Callable[[int, list[int]], bool] | None = None,
        seeds: Sequence[int] | None = None,
        generated: Sequence[int] | None = None,
    ) -> list[Generation]:
        """Sample one continuation per prompt (log-probs as in the module docstring).

        A generation ends after an eos id (kept in ``ids``; not with ``params.ignore_eos``), after the
        token that completes a stop string (kept; ``text`` is the decode of ``ids`` without special
        tokens), or after ``max_new_tokens`` (``finish_reason="length"``); ``meta["stop"]`` is the eos
        id or stop string. With ``params.top_logprobs = k``, ``meta["top_logprobs"]`` holds the ``k``
        most likely ``(id, logprob)`` pairs of every step.

        ``interrupt(steps, live)`` is asked after every decode step of a batch chunk (``live``: the
        indices into ``prompts`` of its rows still generating); when it returns True the chunk stops
        there and its unfinished rows end with ``finish_reason="length"`` and ``meta["interrupted"] =
        True`` (a scheduler continues them later from ``prompt + ids``).

        With ``seeds`` (one int per prompt) token ``t`` of prompt ``i`` is drawn with
        ``request_uniforms(seeds[i], t)`` instead of the engine generator, so the result does not
        depend on the batch (:mod:`horizonrl.inference.seeding`).

        With ``params.grammar`` every row samples only tokens the grammar allows and ends (``"stop"``,
        ``meta["stop"]`` the last token) once the grammar is complete; ``generated[i]`` (default 0) is how
        many of prompt ``i``'s last tokens the row already generated under the grammar (a continued row:
        the matcher consumes them first). A row whose grammar allows no token ends with ``"stop"`` and
        ``meta["grammar_error"]``.
        """
        prompts = [list(p) for p in prompts]
        if generated is not None and len(generated) != len(prompts):
            raise ValueError(
                f"HFEngine.generate: {len(generated)} generated counts for {len(prompts)} prompts"
            )
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"HFEngine.generate: {len(seeds)} seeds for {len(prompts)} prompts")
        if any(not p for p in prompts):
            raise ValueError("HFEngine.generate: every prompt needs at least one token")
        if params.stop and self.tokenizer is None:
            raise ValueError("HFEngine.generate: stop strings need a tokenizer")
        # Group prompts of similar length into the same chunk to reduce padding.
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        results: dict[int, Generation] = {}
        with eval_mode(self.model):
            prefix = self._shared_prefix(prompts)
            turns = None
            if self.turn_reuse:  # the last call's caches, matched under the same prefix and weights
                tag = (prefix, prefix.version if prefix is not None else weights_version(self.model))
                turns, self._turns = self._turns, TurnStore(tag, self.turn_reuse_bytes)
                turns = turns if turns is not None and turns.fits(tag) else TurnStore(tag)
            for start in range(0, len(order), self.max_batch_size):
                chunk = order[start : start + self.max_batch_size]
                stop_early = None
                if interrupt is not None:
                    stop_early = functools.partial(
                        lambda c, steps, local: interrupt(steps, [c[i] for i in local]), chunk
                    )
                chunk_seeds = None if seeds is None else [int(seeds[i]) for i in chunk]
                chunk_done = None if generated is None else [int(generated[i]) for i in chunk]
                gens = self._generate_chunk(
                    [prompts[i] for i in chunk], params, stop_early, chunk_seeds, chunk_done, prefix, turns
                )
                results.update(zip(chunk, gens, strict=True))
        return [results[i] for i in range(len(prompts))]

    def _generate_chunk(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        interrupt: Callable[[int, list[int]], bool] | None = None,
        seeds: list[int] | None = None,
        generated: list[int] | None = None,
        prefix: PrefixCache | None = None,
        turns: TurnStore | None = None,
    ) -> list[Generation]:
        n = len(prompts)
        matchers = None if params.grammar is None else self._matchers(params.grammar, prompts, generated)
        seed_arr = None if seeds is None else np.asarray(seeds, dtype=np.int64)
        skip = len(prefix.ids) if prefix is not None else 0
        found = [(None, skip)] * n if turns is None else [turns.match(p, skip) for p in prompts]
        cache = self._new_cache()
        ids, mask, pos = cached_prefill(prompts, found, skip, self.pad_id, self.device, cache)
        logits = self._forward(ids, mask, pos, cache, keep=1, prefix=prefix)[:, -1]
        next_pos = pos[:, -1:] + 1
        out_ids: list[list[int]] = [[] for _ in range(n)]
        reasons = ["length"] * n
        meta: list[dict] = [{} for _ in range(n)]
        if prefix is not None or turns is not None:  # prompt tokens not prefilled by this call
            for i, (_, m) in enumerate(found):
                meta[i]["cached_tokens"] = m

        def keep_caches(batch_rows) -> None:  # the rows' caches, for the next call's prompts (turn_reuse)
            if self._turns is not None and turns is not None:
                for r in batch_rows:
                    i = rows[r]
                    self._turns.keep(cache, mask, r, prompts[i] + out_ids[i][:-1], skip)

        watchers = [StopWatcher(self.tokenizer, params.stop) for _ in range(n)] if params.stop else None
        eos = frozenset() if params.ignore_eos else self.eos_ids
        rows = list(range(n))  # batch row -> prompt index
        live = [True] * n  # per batch row: still generating
        steps: list[tuple[list[int], torch.Tensor]] = []  # (rows, logprobs) per step, fetched at the end
        tops: list[tuple[torch.Tensor, torch.Tensor]] = []  # (logprobs, ids) of the best tokens per step
        ones = torch.ones((n, 1), dtype=mask.dtype, device=self.device)
        for step in range(params.max_new_tokens):
            u = None
            if seed_arr is not None and not params.greedy:
                u = seeded_uniforms(seed_arr[rows], step, self.device)
            dead = None
            if matchers is not None:
                logits, dead = self._constrain(logits, matchers, rows, live)
            tokens, logprobs, top = self._sample(logits, params, u)
            steps.append((rows, logprobs))
            if top is not None:
                tops.append(top)
            for r, tok in enumerate(tokens.tolist()):
                if not live[r]:
                    continue
                i = rows[r]
                if dead is not None and dead[r]:  # the grammar allows nothing: end the row, keep no token
                    reasons[i], live[r] = "stop", False
                    meta[i]["grammar_error"] = matchers.error(i) or "the grammar allows no token here"
                    continue
                out_ids[i].append(tok)
                hit = tok if tok in eos else watchers[i].push(out_ids[i]) if watchers else None
                if matchers is not None:
                    if not matchers.consume(i, tok):
                        meta[i]["grammar_error"] = matchers.error(i) or f"token {tok} rejected"
                        hit = tok if hit is None else hit
                    elif hit is None and matchers.stopped(i):
                        hit = tok
                if hit is not None:
                    reasons[i], live[r], meta[i]["stop"] = "stop", False, hit
            n_live = sum(live)
            if n_live == 0 or step == params.max_new_tokens - 1:
                break
            if interrupt is not None and interrupt(step + 1, [rows[r] for r in range(len(rows)) if live[r]]):
                for r in range(len(rows)):
                    if live[r]:
                        meta[rows[r]]["interrupted"] = True
                break
            if n_live < len(rows) and (len(rows) - n_live) >= self.compact_fraction * len(rows):
                keep = [r for r in range(len(rows)) if live[r]]
                keep_caches(r for r in range(len(rows)) if not live[r])
                index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                tokens, mask, next_pos = tokens[index], mask[index], next_pos[index]
                rows, live = [rows[r] for r in keep], [True] * len(keep)
            mask = torch.cat([mask, ones[: len(rows)]], dim=1)
            logits = self._decode(tokens, mask, next_pos, cache, prefix)
            next_pos = next_pos + 1
        keep_caches(range(len(rows)))
        flat = torch.cat([lp for _, lp in steps]).tolist() if steps else []
        top_lp = torch.cat([t[0] for t in tops]).tolist() if tops else []
        top_ids = torch.cat([t[1] for t in tops]).tolist() if tops else []
        out_lp: list[list[float]] = [[] for _ in range(n)]
        k = 0
        for step_rows, _ in steps:
            for i in step_rows:
                if len(out_lp[i]) < len(out_ids[i]):
                    out_lp[i].append(flat[k])
                    if tops:
                        pairs = list(zip(top_ids[k], top_lp[k], strict=True))
                        if matchers is not None:  # tokens the grammar forbids are not alternatives
                            pairs = [(t, v) for t, v in pairs if v != float("-inf")]
                        meta[i].setdefault("top_logprobs", []).append(pairs)
                k += 1
        tok = self.tokenizer
        texts = tok.batch_decode(out_ids, skip_special_tokens=True) if tok is not None else [""] * n
        return [Generation(*fields) for fields in zip(out_ids, out_lp, texts, reasons, meta, strict=True)]

    def _matchers(self, grammar: str, prompts: list[list[int]], generated: list[int] | None):
        """One grammar matcher per row; a continued row's matcher replays its earlier tokens."""
        from horizonrl.inference.constrain import GrammarVocab, RowMatchers

        if self.tokenizer is None:
            raise ValueError("HFEngine.generate: a grammar needs a tokenizer")
        if self._grammar_vocab is None:
            self._grammar_vocab = GrammarVocab(self.tokenizer)
        matchers = RowMatchers(self._grammar_vocab, grammar, len(prompts))
        for i, k in enumerate(generated or ()):
            if k > 0 and not matchers.replay(i, prompts[i][-k:]):
                raise ValueError(f"HFEngine.generate: row {i}'s earlier tokens do not fit the grammar")
        return matchers

    def _constrain(self, logits: torch.Tensor, matchers, rows: list[int], live: list[bool]):
        """``(masked float32 logits, dead)``: each live row's disallowed tokens at ``-inf``; ``dead[r]``
        marks a live row whose grammar allows no token (left unmasked; its draw is dropped)."""
        todo = [r for r in range(len(rows)) if live[r]]
        allowed = np.ones((len(rows), logits.shape[-1]), dtype=bool)
        if todo:
            allowed[todo] = matchers.allowed([rows[r] for r in todo], logits.shape[-1])
        dead = ~allowed.any(-1)
        allowed[dead] = True
        mask = torch.from_numpy(allowed).to(logits.device)
        return logits.float().masked_fill(~mask, float("-inf")), dead.tolist()

    def score(
        self, contexts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]
    ) -> list[np.ndarray]:
        """Teacher-forced float32 log-probs (temperature 1) of each continuation token given its context."""
        if len(contexts) != len(continuations):
            raise ValueError("HFEngine.score: contexts and continuations differ in length")
        ctxs = [list(c) for c in contexts]
        conts = [list(c) for c in continuations]
        if any(not c for c, k in zip(ctxs, conts, strict=True) if k):
            raise ValueError("HFEngine.score: a non-empty continuation needs a non-empty context")
        results = [np.zeros(0, dtype=np.float32) for _ in ctxs]
        # Longest continuations first, so a chunk's first row bounds its logits (rows x positions x vocab).
        todo = sorted(
            (i for i in range(len(ctxs)) if conts[i]), key=lambda i: (-len(conts[i]), -len(ctxs[i]))
        )
        vocab = self.model.config.get_text_config().vocab_size
        start = 0
        with eval_mode(self.model):
            while start < len(todo):
                rows = max(
                    1, min(self.max_batch_size, _SCORE_LOGITS // ((len(conts[todo[start]]) + 1) * vocab))
                )
                chunk, start = todo[start : start + rows], start + rows
                scored = self._score_chunk([ctxs[i] for i in chunk], [conts[i] for i in chunk])
                for i, lp in zip(chunk, scored, strict=True):
                    results[i] = lp
        return results

    def _score_chunk(self, ctxs: list[list[int]], conts: list[list[int]]) -> list[np.ndarray]:
        # Left padding aligns every sequence's end, so only the last max_k + 1 positions need logits.
        seqs = [c + k for c, k in zip(ctxs, conts, strict=True)]
        ids, mask, pos = left_pad(seqs, self.pad_id, self.device)
        max_k = max(len(k) for k in conts)
        logits = self._forward(ids, mask, pos, keep=max_k + 1)[:, :-1]
        out = []
        for row, cont in enumerate(conts):
            k = len(cont)
            row_logits = logits[row, max_k - k :].float()
            target = torch.as_tensor(cont, device=row_logits.device)[:, None]
            lp = row_logits.gather(-1, target).squeeze(-1) - torch.logsumexp(row_logits, dim=-1)
            out.append(lp.cpu().numpy().astype(np.float32))
        return out

    def sync(self, state_dict: Mapping | None = None) -> None:
        """Load ``state_dict`` into the engine's model (a separate copy); with None, copy the weights of
        the model it follows (``dtype``: the float32 model, cast), or nothing (shared model)."""
        with torch.no_grad():
            if state_dict is not None and self.follow is not None:
                self.follow.load_state_dict(state_dict)
            if state_dict is None and self.follow is not None:
                state_dict = self.follow.state_dict()
            if state_dict is not None:
                self.model.load_state_dict(state_dict)
        self._release()

    def sleep(self) -> None:
        """Drop what the engine keeps between calls (the shared prefix, the last call's row caches): an
        update follows, after which none of it fits the weights."""
        self._release()

    def _release(self) -> None:
        self._prefix = self._turns = None
        if self._lean is not None:
            self._lean.release()

    def state_dict(self) -> Mapping[str, torch.Tensor]:
        """The weights the engine samples from."""
        return self.model.state_dict()
