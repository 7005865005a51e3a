"""The embedded HF engine (horizonrl.inference.hf) on a tiny random Qwen2: log-probs equal a full forward,
greedy equals step-wise argmax and HF generate, stops, seeds, scoring and batching."""

from __future__ import annotations

import copy
import itertools
import string

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from horizonrl.inference import Engine, HFEngine, SamplingParams
from horizonrl.inference.hf import _draw
from horizonrl.inference.stops import StopWatcher, first_stop

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 300
TOL = 1e-4


@pytest.fixture(scope="module")
def tokenizer():
    """Character-level WordLevel tokenizer plus two-letter tokens, so stop strings can span tokens."""
    chars = list(string.ascii_letters + string.digits + string.punctuation + " ")
    pairs = ["".join(p) for p in itertools.product("abcdefghijklmnop", repeat=2)]
    vocab = (["<pad>", "<eos>", *chars, *pairs])[:VOCAB]
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")


def make_model(seed: int = 0) -> Qwen2ForCausalLM:
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=1,
        pad_token_id=0,
        bos_token_id=None,
        tie_word_embeddings=False,
        initializer_range=0.2,  # peaked enough that greedy has no near-ties
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def model():
    return make_model()


def prompts_of(lengths, seed=0):
    g = np.random.default_rng(seed)
    return [g.integers(2, VOCAB, size=n).tolist() for n in lengths]


MIXED = prompts_of([3, 11, 7, 1, 20, 5])


@torch.no_grad()
def full_logprobs(model, prompt, ids, temperature=1.0):
    """Per-token log-probs of ``ids`` from one unpadded, uncached forward over prompt + ids."""
    seq = torch.tensor([prompt + ids])
    logits = model(seq).logits[0, len(prompt) - 1 : -1].float()
    return (
        torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1).numpy()
    )


@torch.no_grad()
def greedy_reference(model, prompt, n):
    """Greedy decoding by repeated full forwards (no cache, no padding)."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def no_eos(engine):
    engine.eos_ids = frozenset()
    return engine


def test_is_engine_and_collects_eos(model, tokenizer):
    engine = HFEngine(model, tokenizer)
    assert isinstance(engine, Engine)
    assert engine.eos_ids == {1}
    assert engine.pad_id == 0


@pytest.mark.parametrize("compact", [0.0, 0.25, 1.0])
@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_logprobs_match_full_forward(model, tokenizer, compact, temperature, top_p):
    engine = HFEngine(model, tokenizer, seed=1, compact_fraction=compact)
    # A frequent "eos" makes rows finish at different steps, exercising row dropping.
    engine.eos_ids = frozenset(range(2, 12))
    params = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=24)
    gens = engine.generate(MIXED, params)
    assert len({len(g.ids) for g in gens}) > 1
    for prompt, gen in zip(MIXED, gens, strict=True):
        assert len(gen.ids) == len(gen.logprobs) >= 1
        ref = full_logprobs(model, prompt, gen.ids, temperature)
        np.testing.assert_allclose(gen.logprobs, ref, atol=TOL, rtol=0)


def until_eos(ids, eos=1):
    return ids[: ids.index(eos) + 1] if eos in ids else ids


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_logprobs_match_cpu_full_forward(model, tokenizer):
    engine = HFEngine(copy.deepcopy(model), tokenizer, device="cuda", seed=1)
    gens = engine.generate(MIXED, SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=16))
    for prompt, gen in zip(MIXED, gens, strict=True):
        np.testing.assert_allclose(gen.logprobs, full_logprobs(model, prompt, gen.ids, 0.8), atol=TOL, rtol=0)
    state = engine.rng_state()
    again = engine.generate(MIXED, SamplingParams(max_new_tokens=8))
    engine.set_rng_state(state)
    assert [g.ids for g in engine.generate(MIXED, SamplingParams(max_new_tokens=8))] == [g.ids for g in again]


def test_greedy_matches_stepwise_argmax_and_hf_generate(model, tokenizer):
    engine = HFEngine(model, tokenizer)
    gens = engine.generate(MIXED, SamplingParams(greedy=True, max_new_tokens=12))
    hit_eos = False
    for prompt, gen in zip(MIXED, gens, strict=True):
        assert gen.ids == until_eos(greedy_reference(model, prompt, 12))
        np.testing.assert_allclose(gen.logprobs, full_logprobs(model, prompt, gen.ids), atol=TOL, rtol=0)
        hf = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12, pad_token_id=0)
        assert gen.ids == until_eos(hf[0, len(prompt) :].tolist())
        assert gen.finish_reason == ("stop" if gen.ids[-1] == 1 else "length")
        hit_eos |= gen.finish_reason == "stop"
    assert hit_eos  # one of these prompts does hit eos under greedy decoding


def test_seeded_reproducibility_and_rng_state(model, tokenizer):
    params = SamplingParams(temperature=1.0, max_new_tokens=16)
    a = HFEngine(model, tokenizer, seed=7).generate(MIXED, params)
    b = HFEngine(model, tokenizer, seed=7).generate(MIXED, params)
    assert [g.ids for g in a] == [g.ids for g in b]
    assert [g.logprobs for g in a] == [g.logprobs for g in b]
    engine = HFEngine(model, tokenizer, seed=8)
    assert [g.ids for g in engine.generate(MIXED, params)] != [g.ids for g in a]
    engine.set_seed(7)
    assert [g.ids for g in engine.generate(MIXED, params)] == [g.ids for g in a]
    state = engine.rng_state()
    first = engine.generate(MIXED, params)
    engine.set_rng_state(state)
    assert [g.ids for g in engine.generate(MIXED, params)] == [g.ids for g in first]


def test_max_new_tokens_gives_length(model, tokenizer):
    gens = no_eos(HFEngine(model, tokenizer)).generate(MIXED, SamplingParams(max_new_tokens=5))
    assert all(len(g.ids) == 5 and g.finish_reason == "length" for g in gens)


def test_eos_stops_and_is_included(model, tokenizer):
    prompt = MIXED[1]
    ref = greedy_reference(model, prompt, 10)
    eos = ref[4]
    cut = ref.index(eos) + 1
    engine = HFEngine(model, tokenizer)
    engine.eos_ids = frozenset({eos})
    (gen,) = engine.generate([prompt], SamplingParams(greedy=True, max_new_tokens=10))
    assert gen.ids == ref[:cut] and gen.ids[-1] == eos
    assert gen.finish_reason == "stop" and gen.meta["stop"] == eos
    assert len(gen.logprobs) == cut


def test_stop_string_stops_right_after_completing_token(model, tokenizer):
    engine = no_eos(HFEngine(model, tokenizer))
    params = SamplingParams(greedy=True, max_new_tokens=20)
    (full,) = engine.generate([MIXED[2]], params)
    # A stop string spanning the boundary between two ordinary tokens in the middle of the output.
    k = next(k for k in range(6, 20) if 1 not in full.ids[k - 1 : k + 1])
    pair = tokenizer.decode(full.ids[k - 1 : k + 1])
    stop = pair[1:] if len(pair) > 2 else pair
    cut = next(k for k in range(1, 21) if stop in tokenizer.decode(full.ids[:k], skip_special_tokens=False))
    (gen,) = engine.generate([MIXED[2]], SamplingParams(greedy=True, max_new_tokens=20, stop=("zzzz", stop)))
    assert gen.ids == full.ids[:cut]
    assert gen.finish_reason == "stop" and gen.meta["stop"] == stop
    assert gen.text.endswith(stop)
    assert gen.logprobs == full.logprobs[:cut]


def test_tiny_top_p_is_greedy(model, tokenizer):
    engine = no_eos(HFEngine(model, tokenizer, seed=3))
    greedy = engine.generate(MIXED, SamplingParams(greedy=True, max_new_tokens=10))
    nucleus = engine.generate(MIXED, SamplingParams(temperature=0.7, top_p=1e-6, max_new_tokens=10))
    for prompt, g, s in zip(MIXED, greedy, nucleus, strict=True):
        assert g.ids == s.ids
        # Log-probs are under the full tempered distribution, not renormalised to the nucleus (0).
        ref = full_logprobs(model, prompt, s.ids, temperature=0.7)
        np.testing.assert_allclose(s.logprobs, ref, atol=TOL, rtol=0)
        assert max(s.logprobs) < 0


def test_temperature_scales_logprobs(model, tokenizer):
    engine = HFEngine(model, tokenizer, seed=5)
    for temperature in (0.5, 2.0):
        gens = engine.generate(MIXED[:3], SamplingParams(temperature=temperature, max_new_tokens=8))
        for prompt, gen in zip(MIXED[:3], gens, strict=True):
            ref = full_logprobs(model, prompt, gen.ids, temperature)
            np.testing.assert_allclose(gen.logprobs, ref, atol=TOL, rtol=0)
            assert not np.allclose(gen.logprobs, full_logprobs(model, prompt, gen.ids), atol=1e-3)


def test_score_matches_manual_gather(model, tokenizer):
    contexts = prompts_of([4, 9, 1, 6, 13], seed=1)
    conts = prompts_of([3, 1, 7, 0, 5], seed=2)
    engine = HFEngine(model, tokenizer, max_batch_size=2)
    scores = engine.score(contexts, conts)
    assert len(scores) == 5
    for ctx, cont, got in zip(contexts, conts, scores, strict=True):
        assert got.dtype == np.float32 and got.shape == (len(cont),)
        if cont:
            np.testing.assert_allclose(got, full_logprobs(model, ctx, cont), atol=TOL, rtol=0)


def test_score_logit_budget_chunks_rows(model, tokenizer, monkeypatch):
    import horizonrl.inference.hf as hf_module

    contexts, conts = prompts_of([4, 9, 2, 6], seed=5), prompts_of([3, 8, 1, 5], seed=6)
    engine = HFEngine(model, tokenizer)
    whole = engine.score(contexts, conts)
    monkeypatch.setattr(hf_module, "_SCORE_LOGITS", 1)  # forces one row per forward
    for a, b in zip(whole, engine.score(contexts, conts), strict=True):
        np.testing.assert_allclose(a, b, atol=TOL, rtol=0)


def test_score_agrees_with_generate(model, tokenizer):
    engine = HFEngine(model, tokenizer, seed=2)
    gens = engine.generate(MIXED, SamplingParams(max_new_tokens=10))
    scores = engine.score(MIXED, [g.ids for g in gens])
    for gen, got in zip(gens, scores, strict=True):
        np.testing.assert_allclose(got, gen.logprobs, atol=TOL, rtol=0)


def test_batches_larger_than_max_batch_size(model, tokenizer):
    prompts = prompts_of([2, 9, 4, 15, 1, 6, 3], seed=4)
    engine = no_eos(HFEngine(model, tokenizer, max_batch_size=3))
    gens = engine.generate(prompts, SamplingParams(greedy=True, max_new_tokens=6))
    assert len(gens) == 7
    for prompt, gen in zip(prompts, gens, strict=True):
        assert gen.ids == greedy_reference(model, prompt, 6)
    sampled = engine.generate(prompts, SamplingParams(temperature=0.9, top_p=0.8, max_new_tokens=6))
    for prompt, gen in zip(prompts, sampled, strict=True):
        np.testing.assert_allclose(gen.logprobs, full_logprobs(model, prompt, gen.ids, 0.9), atol=TOL, rtol=0)


def test_restores_train_mode_and_no_grad(model, tokenizer):
    m = copy.deepcopy(model).train()
    engine = HFEngine(m, tokenizer)
    engine.generate(MIXED[:2], SamplingParams(max_new_tokens=3))
    engine.score(MIXED[:2], MIXED[2:4])
    assert m.training
    assert all(p.grad is None for p in m.parameters())


def test_sync_loads_weights(tokenizer):
    source, target = make_model(0), make_model(1)
    engine = no_eos(HFEngine(target, tokenizer))
    params = SamplingParams(greedy=True, max_new_tokens=6)
    engine.sync()  # no-op
    engine.sync(source.state_dict())
    gens = engine.generate(MIXED[:3], params)
    for prompt, gen in zip(MIXED[:3], gens, strict=True):
        assert gen.ids == greedy_reference(source, prompt, 6)


def test_rejects_empty_prompt(model, tokenizer):
    with pytest.raises(ValueError):
        HFEngine(model, tokenizer).generate([[]], SamplingParams())


def test_stop_watcher_incremental_utf8():
    """Byte-level BPE: multi-byte characters split over tokens are matched as soon as they complete."""
    text = "héllo wörld → 日本語 done <tool>x</tool> ✓✓ end"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["hello world done", "tool tool"], trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    ids = hf.encode(text)
    assert hf.decode(ids) == text
    for stop in ["日本", "ö", "</tool>", "✓✓", "→ 日", "end", "missing"]:
        watcher = StopWatcher(hf, ("zzz", stop))
        got = next((k for k in range(1, len(ids) + 1) if watcher.push(ids[:k]) == stop), None)
        want = next((k for k in range(1, len(ids) + 1) if stop in hf.decode(ids[:k])), None)
        assert got == want, stop
        assert first_stop(hf, ids, ("zzz", stop)) == (None if want is None else (want, stop))


@pytest.mark.parametrize(("scale", "top_p"), [(2.0, 0.6), (0.3, 0.97)])
def test_sampler_frequencies(model, tokenizer, scale, top_p):
    """The inverse-CDF sampler and the nucleus filter (top-k and full-sort paths) draw as intended."""
    n, vocab = 20000, 300
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(0)) * scale
    engine = HFEngine(model, tokenizer, seed=0)
    probs = torch.softmax(logits[0], -1)
    sorted_p, order = probs.sort(descending=True)
    nucleus = order[: int((sorted_p.cumsum(0) - sorted_p < top_p).sum())]
    assert (len(nucleus) > 256) == (scale < 1)  # the second case needs the full sort
    cases = [(SamplingParams(), probs), (SamplingParams(top_p=top_p), torch.zeros(vocab))]
    cases[1][1][nucleus] = probs[nucleus] / probs[nucleus].sum()
    for params, want in cases:
        tokens, logprobs, _ = engine._sample(logits.expand(n, vocab), params)
        freq = torch.bincount(tokens, minlength=vocab).double() / n
        assert (freq - want).abs().max() < 0.015
        assert freq[want == 0].sum() == 0
        np.testing.assert_allclose(logprobs, torch.log(probs)[tokens], atol=1e-5)
    # Several blocks plus a ragged tail block, with zero weights that must never be drawn.
    weights = probs.clone()
    weights[::7] = 0
    tokens = _draw(weights.expand(n, vocab), torch.Generator().manual_seed(1), block=64)
    freq = torch.bincount(tokens, minlength=vocab).double() / n
    assert (freq - weights / weights.sum()).abs().max() < 0.015 and freq[::7].sum() == 0
