"""The HF engine's turn reuse (``inference.params.turn_reuse``, inference/prefix_store.TurnStore): a call's
prompts that extend the previous call's rows prefill only what they add, and sample what an engine
without reuse samples from the whole prompt on the same request seeds (float32, so up to rounding)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers.tiny_decoders import prefix_prompts, tiny_decoder
from horizonrl.inference import HFEngine, SamplingParams
from horizonrl.inference.prefix_store import PrefixEntry, TurnStore

pytestmark = pytest.mark.usefixtures("one_thread")


def _engine(model, compact=0.0, **kw):
    engine = HFEngine(model, max_batch_size=2, compact_fraction=compact, **kw)
    engine.eos_ids = frozenset(range(40, 80))  # rows end at different steps, so the batch compacts
    return engine


def _same(got, want):
    for a, b in zip(want, got, strict=True):
        assert a.ids == b.ids and a.finish_reason == b.finish_reason
        torch.testing.assert_close(torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=1e-4, rtol=0)


# compact 0: finished rows leave the batch at once; 1: they stay and keep decoding (their caches hold
# positions past their end, which the kept cache must leave out).
@pytest.mark.parametrize(("shared_prefix", "compact"), [(False, 0.0), (True, 0.0), (True, 1.0)])
def test_next_turn_prefills_only_what_it_adds_and_samples_what_a_full_prefill_samples(shared_prefix, compact):
    model = tiny_decoder("qwen2")
    prompts = prefix_prompts()
    params = SamplingParams(temperature=1.0, max_new_tokens=10)
    engine = _engine(model, compact, turn_reuse=True, shared_prefix=shared_prefix)
    first = engine.generate(prompts, params, seeds=list(range(5)))
    assert len({len(g.ids) for g in first}) > 1  # rows left the batch at different steps
    # The next turn: each prompt, its generation, an observation; plus one prompt that shares only the
    # first 40 tokens (the shared prefix, or a part of row 0's kept cache).
    turn2 = [p + g.ids + [5, 6, 7 + i] for i, (p, g) in enumerate(zip(prompts, first, strict=True))]
    turn2.append([*prompts[0][:40], 9, 9, 9])
    seeds = list(range(10, 16))
    got = engine.generate(turn2, params, seeds=seeds)
    # By hand: row i's kept cache holds its prompt and all generated tokens but the last (never forwarded).
    want_cached = [len(p) + len(g.ids) - 1 for p, g in zip(prompts, first, strict=True)] + [40]
    assert [g.meta["cached_tokens"] for g in got] == want_cached
    _same(got, _engine(model).generate(turn2, params, seeds=seeds))


def test_no_reuse_after_the_weights_change_or_without_the_setting():
    model = tiny_decoder("qwen2")
    prompts = prefix_prompts()
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    engine = _engine(model, turn_reuse=True)
    first = engine.generate(prompts, params, seeds=[0] * 5)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model(torch.tensor([prompts[0]])).logits.sum().backward()
    opt.step()  # in place: the kept caches are of other weights
    turn2 = [p + g.ids + [5] for p, g in zip(prompts, first, strict=True)]
    got = engine.generate(turn2, params, seeds=[1] * 5)
    assert [g.meta["cached_tokens"] for g in got] == [0] * 5
    _same(got, _engine(model).generate(turn2, params, seeds=[1] * 5))
    # Without turn_reuse (and without a shared prefix) nothing is kept and no cached count is reported.
    plain = _engine(model)
    plain.generate(prompts, params, seeds=[0] * 5)
    assert plain._turns is None and "cached_tokens" not in plain.generate(turn2, params)[0].meta
    # A sync drops the kept caches.
    engine.sync()
    assert engine._turns is None


def test_turn_store_match_by_hand():
    kv = [(torch.zeros(1, 4, 2), torch.zeros(1, 4, 2))]
    store = TurnStore((None, 3))
    store.add(PrefixEntry(np.array([1, 2, 3, 4]), kv))
    store.add(PrefixEntry(np.array([1, 2, 5]), kv))
    store.add(None)  # a row that held too few positions is not kept
    assert len(store.entries) == 2
    entry, m = store.match([1, 2, 3, 4, 9], 0)
    assert entry is store.entries[0] and m == 4
    entry, m = store.match([1, 2, 5, 7], 0)
    assert entry is store.entries[1] and m == 3
    entry, m = store.match([1, 2, 3], 0)  # capped at len - 1: both share 2, the first wins
    assert entry is store.entries[0] and m == 2
    assert store.match([1, 2, 3], 2) == (None, 2)  # nothing beyond the floor (the shared prefix)
    assert store.match([7, 7], 0) == (None, 0)
    assert store.fits((None, 3)) and not store.fits((None, 4)) and not store.fits((object(), 3))
    # A byte limit keeps the first rows that fit (each entry: 2 x 8 float32 = 64 bytes).
    capped = TurnStore((None, 3), limit_bytes=100)
    for ids in ([1, 2], [3, 4], [5, 6]):
        capped.add(PrefixEntry(np.array(ids), kv))
    assert [e.ids.tolist() for e in capped.entries] == [[1, 2]] and capped.nbytes == 64
