"""The HF engine's shared static prefix (inference/shared_prefix.py) and bf16 sampling copy
(inference/precision.py), checked against a second computation: attention over the concatenated cache in
float64, and the engine without the feature on the same request seeds."""

from __future__ import annotations

import copy
import math
import pickle
import warnings

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from helpers.tiny_decoders import COMMON, prefix_prompts, tiny_decoder
from horizonrl.errors import HorizonWarning
from horizonrl.inference import HFEngine, SamplingParams, make_engine
from horizonrl.inference import precision as precision_mod
from horizonrl.inference.shared_prefix import (
    TWO_PART_MAX_QUERIES,
    PrefixCache,
    common_prefix_len,
    prefix_attention,
    supports_shared_prefix,
    weights_version,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _reference(q, pk, pv, k, v, mask, scale):
    """softmax([q pk^T | q k^T (masked)] * scale) [pv | v] in float64, GQA by repeating kv heads."""
    b, hq, t, _d = q.shape
    g = hq // k.shape[1]
    kk = torch.cat([pk[None].expand(b, -1, -1, -1), k], dim=2).double().repeat_interleave(g, 1)
    vv = torch.cat([pv[None].expand(b, -1, -1, -1), v], dim=2).double().repeat_interleave(g, 1)
    full = torch.cat([torch.ones((b, 1, t, pk.shape[1]), dtype=torch.bool), mask], dim=-1)
    s = (q.double() @ kk.transpose(-1, -2)) * scale
    s = s.masked_fill(~full, float("-inf"))
    return (s.softmax(-1) @ vv).transpose(1, 2)


class _Layer(torch.nn.Module):
    """What the attention function reads of a transformers attention module."""

    def __init__(self, idx, groups=3):
        super().__init__()
        self.layer_idx, self.num_key_value_groups, self.is_causal = idx, groups, True


@pytest.mark.parametrize("t", [1, 5, TWO_PART_MAX_QUERIES + 2])  # decode, short prefill, sdpa prefill
def test_prefix_attention_equals_attention_over_the_concatenated_cache(t):
    torch.manual_seed(0)
    b, hq, hkv, d, plen, s = 3, 6, 2, 8, 7, t + 4
    q = torch.randn(b, hq, t, d)
    k, v = torch.randn(b, hkv, s, d), torch.randn(b, hkv, s, d)
    pk, pv = torch.randn(hkv, plen, d), torch.randn(hkv, plen, d)
    # Row 0 has 3 padding columns at the front of its suffix; queries are the last t suffix positions.
    causal = torch.arange(s)[None, :] <= (torch.arange(t)[:, None] + s - t)
    mask = causal[None, None].repeat(b, 1, 1, 1)
    mask[0, :, :, :3] = False
    scale = 1 / math.sqrt(d)
    out, _ = prefix_attention(_Layer(1), q, k, v, mask, scaling=scale, prefix_kv=[None, (pk, pv)])
    assert out.shape == (b, t, hq, d)
    torch.testing.assert_close(out.double(), _reference(q, pk, pv, k, v, mask, scale), atol=1e-5, rtol=1e-5)
    # No mask: causal over the suffix (the same as the mask above without row 0's padding).
    out, _ = prefix_attention(_Layer(0), q, k, v, None, scaling=scale, prefix_kv=[(pk, pv)])
    want = _reference(q, pk, pv, k, v, causal[None, None].expand(b, 1, t, s), scale)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)


def test_common_prefix_len_by_hand():
    assert common_prefix_len([[1, 2, 3, 4], [1, 2, 3], [1, 2, 9, 9]]) == 2
    assert common_prefix_len([[5, 6], [5, 6]]) == 2
    assert common_prefix_len([[1], [2]]) == 0
    cache = PrefixCache((1, 2), [], version=7)
    assert cache.fits([[1, 2, 3], [1, 2, 4]], 7)
    assert not cache.fits([[1, 2, 3], [1, 2]], 7)  # a prompt must keep a token of its own
    assert not cache.fits([[1, 2, 3]], 8)  # other weights


def test_engine_with_shared_prefix_samples_what_it_samples_without():
    model = tiny_decoder("qwen2")
    prompts = prefix_prompts()
    params = SamplingParams(temperature=1.0, max_new_tokens=12)
    plain = HFEngine(model, max_batch_size=2).generate(prompts, params, seeds=list(range(5)))
    engine = HFEngine(model, max_batch_size=2, shared_prefix=True)
    shared = engine.generate(prompts, params, seeds=list(range(5)))
    assert engine._prefix is not None and len(engine._prefix.ids) == 40
    for a, b in zip(plain, shared, strict=True):
        assert a.ids == b.ids
        torch.testing.assert_close(torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=1e-4, rtol=0)
    # A second call whose prompts extend the kept prefix reuses it (the same object).
    kept = engine._prefix
    engine.generate([[*p, 7, 8] for p in prompts], params, seeds=list(range(5)))
    assert engine._prefix is kept
    # Too short a common prefix: no sharing, same result as without.
    assert HFEngine(model, shared_prefix=True, shared_prefix_min=64)._shared_prefix(prompts) is None


def test_kept_prefix_is_recomputed_after_the_weights_change():
    model = tiny_decoder("qwen2")
    prompts = prefix_prompts()
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    engine = HFEngine(model, shared_prefix=True)
    engine.generate(prompts, params, seeds=[0] * 5)
    before = engine._prefix
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model(torch.tensor([prompts[0]])).logits.sum().backward()
    opt.step()  # in place: the version counters move
    assert weights_version(model) != before.version
    got = engine.generate(prompts, params, seeds=[0] * 5)
    assert engine._prefix is not before
    fresh = HFEngine(model).generate(prompts, params, seeds=[0] * 5)
    for a, b in zip(fresh, got, strict=True):
        assert a.ids == b.ids


def test_supported_models():
    assert supports_shared_prefix(tiny_decoder("qwen2"))
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
        )
    )
    assert supports_shared_prefix(llama)
    sliding = Qwen2Config(
        vocab_size=50,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        use_sliding_window=True,
        sliding_window=8,
        max_window_layers=0,
    )
    assert not supports_shared_prefix(Qwen2ForCausalLM(sliding))
    # Mistral has no switch: a window size is a window (transformers' default 4096), None is none.
    assert supports_shared_prefix(tiny_decoder("mistral"))
    windowed = MistralForCausalLM(MistralConfig(**COMMON))
    assert windowed.config.sliding_window and not supports_shared_prefix(windowed)
    # Asked for on an unsupported model, the engine quietly runs without it.
    assert not HFEngine(Qwen2ForCausalLM(sliding), shared_prefix=True).shared_prefix


def test_bf16_sampling_copy_follows_the_float32_weights():
    model = tiny_decoder("qwen2")
    engine = make_engine(
        "hf", model, None, device="cpu", max_batch_size=4, seed=0, params={"dtype": "bfloat16"}
    )
    assert engine.follow is model and engine.model is not model
    assert all(p.dtype == torch.bfloat16 for p in engine.model.parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters())
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    engine.sync()
    for (name, p), q in zip(model.named_parameters(), engine.model.parameters(), strict=True):
        assert torch.equal(q, p.detach().to(torch.bfloat16)), name
    # Samples come from the bf16 copy: its log-probs are the bf16 model's, not the fp32 model's.
    prompts = prefix_prompts(n=2)
    g = engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=8), seeds=[3, 4])
    got = torch.tensor([lp for x in g for lp in x.logprobs])
    by_bf16 = torch.cat(
        [torch.from_numpy(lp) for lp in HFEngine(engine.model).score(prompts, [x.ids for x in g])]
    )
    by_fp32 = torch.cat([torch.from_numpy(lp) for lp in HFEngine(model).score(prompts, [x.ids for x in g])])
    torch.testing.assert_close(got, by_bf16, atol=5e-2, rtol=0)  # bf16 rounding of another batch shape
    assert (got - by_bf16).abs().mean() < (got - by_fp32).abs().mean()


def _bf16_engine():
    return make_engine(
        "hf",
        tiny_decoder("qwen2"),
        None,
        device="cpu",
        max_batch_size=2,
        seed=0,
        params={"dtype": "bfloat16"},
    )


def test_a_bf16_head_gets_contiguous_inputs_once_and_a_float32_head_none():
    engine = _bf16_engine()
    head = engine.model.get_output_embeddings()
    precision_mod.contiguous_head(engine.model)  # a second call registers nothing more
    assert len(head._forward_pre_hooks) == 1
    seen = []
    head.register_forward_hook(lambda m, args, out: seen.append(args[0].is_contiguous()))
    hidden = torch.randn(3, 5, 48, dtype=torch.bfloat16)
    sliced = hidden[:, -1:]  # what transformers hands the head with logits_to_keep=1
    assert not sliced.is_contiguous()
    torch.testing.assert_close(head(sliced), head(sliced.contiguous()), atol=0, rtol=0)
    assert seen == [True, True]
    fp32 = tiny_decoder("qwen2")
    HFEngine(fp32)
    assert not fp32.get_output_embeddings()._forward_pre_hooks  # float32: the user's model is not touched


def test_dtype_errors_and_warning(monkeypatch):
    model = tiny_decoder("qwen2")
    with pytest.raises(ValueError, match=r"inference.params.dtype='bf16'"):
        HFEngine(model, dtype="bf16")
    assert HFEngine(model, dtype="float32").follow is None  # already the model's dtype: no copy
    monkeypatch.setattr(precision_mod, "cpu_has_bf16_units", lambda: False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        HFEngine(model, dtype="bfloat16")
    assert any(
        issubclass(w.category, HorizonWarning) and "slower than float32" in str(w.message) for w in seen
    )


def _packed(model):
    return {
        m: m.__dict__["forward"]
        for m in model.modules()
        if isinstance(m.__dict__.get("forward"), precision_mod._PackedLinear)
    }


@pytest.mark.skipif(
    not precision_mod._mkldnn_packing(), reason="torch without oneDNN or a CPU without its bf16 path"
)
def test_packed_linears_equal_f_linear_and_follow_the_weights():
    model = tiny_decoder("qwen2")
    engine = make_engine(
        "hf", model, None, device="cpu", max_batch_size=4, seed=0, params={"dtype": "bfloat16"}
    )
    packed = _packed(engine.model)
    linears = [m for m in engine.model.modules() if isinstance(m, torch.nn.Linear)]
    assert set(packed) == set(linears) and len(linears) == 2 * 7 + 1  # 7 per layer, and the head
    assert precision_mod.pack_linears(engine.model) == 0  # packed once
    assert not _packed(model)  # the float32 model the update trains is untouched
    names = set(engine.model.state_dict())
    g = torch.Generator().manual_seed(0)

    def check():
        for m in linears:
            x = torch.randn(3, 7, m.in_features, generator=g).to(torch.bfloat16)
            for inp in (x[:, -1:], x[:1, :1], x):  # a sliced (non-contiguous) view, one row, a prefill
                want = torch.nn.functional.linear(inp, m.weight, m.bias)
                torch.testing.assert_close(m(inp), want, atol=0, rtol=0)  # the same oneDNN kernel

    check()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(-0.5)
    engine.sync()  # load_state_dict moves the weights' version: the next call repacks
    check()
    assert set(engine.model.state_dict()) == names
    # A copy (deepcopy, pickle) repacks from its own weights; oneDNN's packed tensor is never copied.
    x = torch.randn(2, 48, dtype=torch.bfloat16)
    for clone in (copy.deepcopy(engine.model), pickle.loads(pickle.dumps(engine.model))):
        q, q0 = clone.model.layers[0].self_attn.q_proj, engine.model.model.layers[0].self_attn.q_proj
        assert q.forward.module is q and q.forward.packed is None
        torch.testing.assert_close(q(x), q0(x), atol=0, rtol=0)


@pytest.mark.skipif(
    not precision_mod._mkldnn_packing(), reason="torch without oneDNN or a CPU without its bf16 path"
)
def test_engine_samples_the_same_tokens_with_and_without_packed_linears(monkeypatch):
    prompts = prefix_prompts()
    params = SamplingParams(temperature=1.0, max_new_tokens=12)
    packed = _bf16_engine()
    a = packed.generate(prompts, params, seeds=list(range(5)))  # packs on first use, so before the patch
    monkeypatch.setattr(precision_mod, "_mkldnn_packing", lambda: False)
    plain = _bf16_engine()
    b = plain.generate(prompts, params, seeds=list(range(5)))

    assert _packed(packed.model) and not _packed(plain.model)
    # The packed engine ran oneDNN's reordered weights (the patch came after: it changes nothing there).
    assert all(f.packed is not None and f.packed.is_mkldnn for f in _packed(packed.model).values())
    assert [(x.ids, x.logprobs) for x in a] == [(y.ids, y.logprobs) for y in b]  # bit for bit
