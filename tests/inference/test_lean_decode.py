"""The lean decode step (inference/lean_decode.py) against transformers' own forward: the logits of one
new token after a cache, for Llama (with projection and MLP biases), Qwen2 (qkv biases) and Qwen3
(per-head norms, a head_dim apart from hidden/heads), with and without the shared prefix; and the engine
sampling the same tokens with it as without."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    DynamicCache,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from helpers.tiny_decoders import COMMON, prefix_prompts, tiny_decoder
from horizonrl.inference import HFEngine, SamplingParams
from horizonrl.inference.lean_decode import LeanDecoder, supports_lean_decode
from horizonrl.inference.precision import pack_linears, sampling_copy

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
def test_lean_step_equals_the_full_forward(family):
    """Prefill a left-padded batch with transformers, take one lean step, and compare with transformers'
    forward over each row's whole unpadded sequence (a second computation)."""
    model = tiny_decoder(family)
    assert supports_lean_decode(model)
    seqs = [[5, 9, 17, 3, 44], [8, 2, 61], [7, 7, 30, 31]]
    nxt = torch.tensor([11, 12, 13])
    width = max(len(s) for s in seqs)
    ids = torch.tensor([[0] * (width - len(s)) + s for s in seqs])
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
        mask = torch.cat([mask, torch.ones(3, 1, dtype=mask.dtype)], dim=1)
        got = LeanDecoder(model).step(nxt, mask, pos[:, -1:] + 1, cache)
        for r, s in enumerate(seqs):
            want = model(torch.tensor([[*s, int(nxt[r])]])).logits[0, -1]
            torch.testing.assert_close(got[r], want, atol=2e-5, rtol=1e-5)
    assert cache.layers[0].keys.shape[2] == width + 1  # the step's keys and values went into the cache


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("shared_prefix", [False, True])
def test_engine_samples_the_same_tokens_with_the_lean_step(family, shared_prefix):
    model = tiny_decoder(family)
    prompts = prefix_prompts(4, grow=3)
    params = SamplingParams(temperature=1.0, max_new_tokens=8, ignore_eos=True)
    plain = HFEngine(model, max_batch_size=3, shared_prefix=shared_prefix)
    lean = HFEngine(model, max_batch_size=3, shared_prefix=shared_prefix, lean_decode=True)
    assert lean._lean is not None and plain._lean is None
    want = plain.generate(prompts, params, seeds=[3, 4, 5, 6])
    got = lean.generate(prompts, params, seeds=[3, 4, 5, 6])
    for a, b in zip(want, got, strict=True):
        assert a.ids == b.ids
        torch.testing.assert_close(torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=1e-4, rtol=0)


def test_lean_steps_while_rows_leave_the_batch():
    """Rows end at different steps and leave the batch at once (their cache rows dropped); the tokens and
    log-probs of the lean steps stay transformers'."""
    model = tiny_decoder("llama")
    prompts = prefix_prompts(4, grow=3)
    params = SamplingParams(temperature=1.0, max_new_tokens=20)
    runs = []
    for on in (False, True):
        engine = HFEngine(model, max_batch_size=4, compact_fraction=0.0, shared_prefix=True, lean_decode=on)
        engine.eos_ids = frozenset(range(40, 55))  # rows end at different steps
        runs.append(engine.generate(prompts, params, seeds=[1, 2, 3, 4]))
    want, got = runs
    assert len({len(g.ids) for g in want}) > 2 and max(len(g.ids) for g in want) > 8
    for a, b in zip(want, got, strict=True):
        assert a.ids == b.ids
        torch.testing.assert_close(torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=1e-4, rtol=0)


def test_bf16_lean_step_within_bf16_rounding_and_following_the_weights():
    """On the engine's bf16 copy with packed weights: the lean step's logits are the copy's own bf16
    forward's up to bf16 rounding; after the weights change in place its fused weights are rebuilt (it
    equals a lean step built afresh on the new weights, bit for bit)."""
    master = tiny_decoder("llama")
    copy = sampling_copy(master, torch.bfloat16)
    pack_linears(copy)
    lean = LeanDecoder(copy)
    seq = [5, 9, 17, 3, 44, 8]

    def step(decoder):
        cache = DynamicCache(config=copy.config)
        with torch.no_grad():
            copy(input_ids=torch.tensor([seq[:-1]]), cache=cache, use_cache=True)
            pos = torch.tensor([[len(seq) - 1]])
            return decoder.step(torch.tensor(seq[-1:]), torch.ones(1, len(seq)), pos, cache)[0].float()

    with torch.no_grad():
        want = copy(torch.tensor([seq])).logits[0, -1].float()
    got = step(lean)
    assert (got - want).abs().max() < 0.02 * want.abs().max()
    with torch.no_grad():  # the fused projections change: [q; k; v] and [gate; up] of every layer
        for layer in master.model.layers:
            layer.self_attn.k_proj.weight.mul_(-1.5)
            layer.mlp.up_proj.weight.mul_(0.5)
        copy.load_state_dict(master.state_dict())  # in place, as the engine's sync
    again = step(lean)
    assert (again - got).abs().max() > 0.05 * got.abs().max()
    torch.testing.assert_close(again, step(LeanDecoder(copy)), atol=0, rtol=0)


def test_lora_wrapped_projections_keep_transformers_forward():
    from peft import LoraConfig, inject_adapter_in_model

    model = tiny_decoder("llama")
    assert supports_lean_decode(model)
    inject_adapter_in_model(LoraConfig(r=2, target_modules=["q_proj"]), model)
    assert not supports_lean_decode(model)  # the fused weight would leave the adapter out
    assert HFEngine(model, lean_decode=True)._lean is None


def test_unsupported_models_keep_transformers_forward():
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50)).eval()
    assert not supports_lean_decode(gpt2)
    assert HFEngine(gpt2, lean_decode=True)._lean is None
    windowed = Qwen2ForCausalLM(
        Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=16, max_window_layers=0)
    )
    assert not supports_lean_decode(windowed)
    gelu = LlamaForCausalLM(LlamaConfig(**COMMON, hidden_act="gelu"))
    assert not supports_lean_decode(gelu)
    with pytest.raises(ValueError, match="gpt2"):
        LeanDecoder(gpt2)
