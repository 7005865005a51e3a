"""Memory-lean updates (train/update/lean.py): chunked log-probs, packed rows, bf16 autocast, gradient
checkpointing and micro-batches sized from memory, each against the plain full-logits path."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from helpers.shaped_env import arith_run_overrides
from horizonrl.config import ConfigError, load_config
from horizonrl.errors import HorizonWarning
from horizonrl.models import load_model_and_tokenizer
from horizonrl.train.update.batching import collate, micro_batches, token_logprobs
from horizonrl.train.update.lean import (
    OVERHEAD_BYTES,
    ForwardOptions,
    auto_micro_batch_tokens,
    enable_gradient_checkpointing,
    warn_emulated_bf16,
)
from horizonrl.train.update.ppo import UpdateSettings, ppo_update, score_rows
from horizonrl.trajectory import Row

LENGTHS = [3, 70, 12, 41]  # very different row lengths: padding is most of the padded batch


def _random_model(kind: str, **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    common = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=320,
        **kw,
    )
    if kind == "qwen2":  # tied embeddings
        return Qwen2ForCausalLM(Qwen2Config(tie_word_embeddings=True, **common))
    return LlamaForCausalLM(LlamaConfig(tie_word_embeddings=False, **common))  # a separate lm_head


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model_and_tokenizer(tiny_model_dir)[0]


@pytest.fixture(params=["tiny", "qwen2", "llama"])
def model(request, tiny):
    if request.param == "tiny":
        m = type(tiny)(tiny.config)
        m.load_state_dict(tiny.state_dict())
        return m.train()
    return _random_model(request.param).train()


def _rows(vocab: int, lengths=LENGTHS, seed: int = 0) -> list[Row]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i, n in enumerate(lengths):
        ids = torch.randint(1, vocab, (n,), generator=g).tolist()
        trainable = [j >= 2 for j in range(n)]
        temps = [0.7 if i % 2 == 0 else 1.0] * n  # temperature != 1 on some rows
        adv = [(1.0 if i % 2 else -0.5) if t else 0.0 for t in trainable]
        old = [-5.0 if t else 0.0 for t in trainable]
        rows.append(Row(ids, trainable, old, adv, [0] * n, i, 0, temperatures=temps))
    return rows


def _value_and_grads(model, batch, opts):
    model.zero_grad(set_to_none=True)
    lp = token_logprobs(model, batch, opts)
    w = torch.linspace(-1.0, 2.0, lp.numel()).view_as(lp)  # a loss that weighs every position differently
    (lp * batch.mask * w).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return (lp * batch.mask).detach(), grads


def _assert_same_grads(got, ref, rtol=1e-4):
    assert got.keys() == ref.keys()
    for name, g in ref.items():
        scale = float(g.abs().max()) + 1e-12
        assert float((got[name] - g).abs().max()) <= rtol * scale, name


@pytest.mark.parametrize(
    "opts",
    [ForwardOptions(chunk_tokens=5), ForwardOptions(pack=True), ForwardOptions(chunk_tokens=16, pack=True)],
    ids=["chunked", "packed", "chunked+packed"],
)
def test_lean_logprobs_and_gradients_equal_the_full_logits_path(model, opts):
    batch = collate(_rows(model.config.vocab_size))
    ref, ref_grads = _value_and_grads(model, batch, None)
    got, grads = _value_and_grads(model, batch, opts)
    torch.testing.assert_close(got, ref, rtol=0, atol=2e-5)
    _assert_same_grads(grads, ref_grads)
    assert ref.abs().sum() > 0


def test_chunks_never_hold_full_batch_logits():
    """No tensor saved for the backward spans the vocabulary over more than one chunk of positions."""
    m = _random_model("llama")
    batch = collate(_rows(m.config.vocab_size))
    V, chunk = m.config.vocab_size, 8
    calls = []
    m.lm_head.register_forward_hook(lambda mod, inp, out: calls.append(tuple(out.shape)))
    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp = token_logprobs(m, batch, ForwardOptions(chunk_tokens=chunk))
    assert saved and not any(V in s and s.numel() > chunk * V for s in map(torch.Size, saved))
    n_targets = sum(n - 1 for n in LENGTHS)
    assert all(s[0] <= chunk for s in calls[-((n_targets + chunk - 1) // chunk) :])
    forward_calls = len(calls)
    (lp * batch.mask).sum().backward()
    # The backward recomputes each chunk's logits, one chunk at a time.
    assert len(calls) - forward_calls == (n_targets + chunk - 1) // chunk
    assert all(s == (chunk, V) or s[0] < chunk for s in calls[forward_calls:])


def test_micro_batches_count_real_tokens_when_packed():
    assert micro_batches(LENGTHS, 80, packed=True) == [[0, 1], [2, 3]]  # 73 and 53 tokens
    assert micro_batches(LENGTHS, 80) == [[0], [1], [2], [3]]  # padded: 2 x 70 > 80, 2 x 41 > 80
    assert micro_batches([100, 5], 80, packed=True) == [[0], [1]]  # an over-long row alone


def _step(model, rows, opt_cls=torch.optim.SGD, **kw):
    m = type(model)(model.config)
    m.load_state_dict(model.state_dict())
    s = UpdateSettings(loss_agg_mode="token-mean", grad_clip=0.0, **kw)
    opt = opt_cls(m.parameters(), lr=0.1)
    metrics = ppo_update(m, opt, None, rows, s, generator=torch.Generator().manual_seed(0), device="cpu")
    return m, opt, metrics


def _scored_rows(model, shift=-0.05):
    """Rows whose rollout log-probs are the model's own + ``shift``, so the loss depends on log pi."""
    rows = _rows(model.config.vocab_size)
    for r, lp in zip(
        rows, score_rows(model, rows, device="cpu", pad_id=0, micro_batch_tokens=4096), strict=True
    ):
        r.old_logprobs = [0.0] + [
            x + shift if t else 0.0 for x, t in zip(lp.tolist(), r.trainable[1:], strict=True)
        ]
    return rows


def test_packed_update_equals_the_padded_update(tiny):
    rows = _scored_rows(tiny)
    padded, _, m_pad = _step(tiny, rows, micro_batch_tokens=128, policy_loss="reinforce")
    packed, _, m_pack = _step(tiny, rows, micro_batch_tokens=128, policy_loss="reinforce", pack_rows=True)
    lean, _, m_lean = _step(
        tiny, rows, micro_batch_tokens=64, policy_loss="reinforce", pack_rows=True, logprob_chunk_tokens=16
    )
    for m in (m_pack, m_lean):
        assert m["train/loss"] == pytest.approx(m_pad["train/loss"], rel=1e-5)
        assert m["train/grad_norm"] == pytest.approx(m_pad["train/grad_norm"], rel=1e-4)
    for other in (packed, lean):
        for (k, x), y in zip(padded.state_dict().items(), other.state_dict().values(), strict=True):
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=k)


def test_bf16_precision_keeps_float32_master_weights_and_optimizer_state(tiny):
    rows = _scored_rows(tiny)
    seen = []
    _, _, m32 = _step(tiny, rows, opt_cls=torch.optim.AdamW, policy_loss="reinforce")
    model = type(tiny)(tiny.config)
    model.load_state_dict(tiny.state_dict())
    model.model.layers[0].mlp.down_proj.register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
    s = UpdateSettings(loss_agg_mode="token-mean", grad_clip=0.0, policy_loss="reinforce", precision="bf16")
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    m16 = ppo_update(model, opt, None, rows, s, generator=torch.Generator().manual_seed(0), device="cpu")
    assert seen and set(seen) == {torch.bfloat16}  # the forward ran under autocast
    assert all(p.dtype == torch.float32 for p in model.parameters())
    state = [t for st in opt.state.values() for t in st.values() if torch.is_tensor(t) and t.numel() > 1]
    assert state and all(t.dtype == torch.float32 for t in state)
    assert m16["train/loss"] == pytest.approx(m32["train/loss"], rel=2e-2)


@pytest.mark.parametrize("has_units", [False, True])
def test_bf16_update_on_a_cpu_without_bf16_units_warns(monkeypatch, has_units):
    import horizonrl.inference.precision as precision_mod

    monkeypatch.setattr(precision_mod, "cpu_has_bf16_units", lambda: has_units)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warn_emulated_bf16("bf16", "cpu")
        warn_emulated_bf16("fp32", "cpu")  # float32 never warns
        warn_emulated_bf16("bf16", "meta")  # nor a device other than the CPU
    named = [w for w in seen if issubclass(w.category, HorizonWarning)]
    assert len(named) == (0 if has_units else 1)
    if named:
        assert "train.precision=fp32" in str(named[0].message)


def test_gradient_checkpointing_gives_the_same_gradients(tiny):
    batch = collate(_rows(tiny.config.vocab_size))
    plain = type(tiny)(tiny.config)
    plain.load_state_dict(tiny.state_dict())
    ckpt = type(tiny)(tiny.config)
    ckpt.load_state_dict(tiny.state_dict())
    enable_gradient_checkpointing(ckpt)
    assert any(getattr(m, "gradient_checkpointing", False) for m in ckpt.model.layers)
    plain.train(), ckpt.train()
    for opts in (None, ForwardOptions(chunk_tokens=16, pack=True)):
        ref, ref_grads = _value_and_grads(plain, batch, opts)
        got, grads = _value_and_grads(ckpt, batch, opts)
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)
        _assert_same_grads(grads, ref_grads, rtol=1e-5)


def test_lean_path_through_a_peft_model():
    """LoRA adapters (also on the LM head) and checkpointing: the swapped head wraps whatever head is."""
    peft = pytest.importorskip("peft")
    m = _random_model("llama")
    pm = peft.get_peft_model(m, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "lm_head"]))
    for n, p in pm.named_parameters():
        if "lora_B" in n:  # nonzero adapters, so their gradients are not trivially zero
            torch.nn.init.normal_(p, std=0.1)
    pm.train()
    batch = collate(_rows(m.config.vocab_size))
    ref, ref_grads = _value_and_grads(pm, batch, None)
    enable_gradient_checkpointing(pm)
    got, grads = _value_and_grads(pm, batch, ForwardOptions(chunk_tokens=8, pack=True))
    torch.testing.assert_close(got, ref, rtol=0, atol=2e-5)
    assert len(grads) == 6  # lora A and B of 2 q_proj and the head
    _assert_same_grads(grads, ref_grads)


def test_auto_micro_batch_tokens_follows_the_documented_formula():
    m = _random_model("qwen2")
    P = sum(p.numel() for p in m.parameters())
    H, inter, L, V = 64, 128, 2, 320
    layer = 10 * H + 4 * inter
    fixed = 4 * P + 3 * 4 * P + OVERHEAD_BYTES
    budget = 1.25 * 2**30

    def expect(fixed, per_token):
        return int((budget - fixed) // per_token) // 64 * 64

    assert auto_micro_batch_tokens(m, 1.25) == expect(fixed, L * layer * 4 + 16 * V)
    assert auto_micro_batch_tokens(m, 1.25, chunk_tokens=256) == expect(fixed + 256 * V * 16, L * layer * 4)
    assert auto_micro_batch_tokens(m, 1.25, precision="bf16", gradient_checkpointing=True) == expect(
        fixed, L * H * 4 + 6 * H * 4 + (4 * H + 4 * inter) * 2 + 16 * V
    )
    assert auto_micro_batch_tokens(m, 1.25, frozen_copies=1) == expect(fixed + 4 * P, L * layer * 4 + 16 * V)
    with pytest.raises(ConfigError, match=r"train\.memory_gb"):
        auto_micro_batch_tokens(m, 0.5)  # below the 1 GiB process overhead


def test_config_fields_are_validated(tiny_model_dir, tmp_path):
    base = arith_run_overrides(tiny_model_dir, tmp_path / "c")
    assert load_config(None, [*base, "algo.micro_batch_tokens=0"]).algo.micro_batch_tokens == 0
    for bad in ("algo.micro_batch_tokens=32", "train.precision=fp16", "train.logprob_chunk_tokens=-1"):
        with pytest.raises(ConfigError, match=re.escape(bad.split("=")[0])):
            load_config(None, [*base, bad])


def test_models_the_lean_path_cannot_reproduce_are_refused():
    m = _random_model("qwen2")
    batch = collate(_rows(m.config.vocab_size))
    m.config.final_logit_softcapping = 30.0
    with pytest.raises(ConfigError, match="final_logit_softcapping"):
        token_logprobs(m, batch, ForwardOptions(chunk_tokens=8))

    class IgnoresPositionIds(Qwen2ForCausalLM):
        def forward(self, *args, position_ids=None, **kw):
            return super().forward(*args, **kw)

    torch.manual_seed(0)
    cfg = _random_model("qwen2", initializer_range=0.5).config
    bad = IgnoresPositionIds(cfg)
    token_logprobs(bad, batch, ForwardOptions(chunk_tokens=8))  # chunking alone is fine
    with pytest.raises(ConfigError, match="pack_rows"):
        token_logprobs(bad, batch, ForwardOptions(pack=True))


def test_trainer_wires_the_settings(tiny_model_dir, tmp_path):
    from horizonrl.train.trainers.group import GroupTrainer

    cfg = load_config(
        None,
        arith_run_overrides(
            tiny_model_dir,
            tmp_path / "run",
            "train.steps=1",
            "rollout.temperature=0.8",
            "train.gradient_checkpointing=true",
            "train.logprob_chunk_tokens=32",
            "algo.pack_rows=true",
            "algo.micro_batch_tokens=0",
            "train.memory_gb=2",
            "train.eval_at_start=false",
        ),
    )
    trainer = GroupTrainer(cfg)
    s = trainer.update_settings
    assert (s.logprob_chunk_tokens, s.pack_rows, s.precision) == (32, True, "fp32")
    assert s.micro_batch_tokens == auto_micro_batch_tokens(
        trainer.model, 2, chunk_tokens=32, gradient_checkpointing=True
    )
    assert all(layer.gradient_checkpointing for layer in trainer.model.model.layers)
    m = trainer.train_step()
    # The rollout engine's log-probs are recomputed exactly by the packed, chunked, checkpointed path.
    assert abs(m["train/ratio_geomean"] - 1.0) < 1e-3
    assert m["train/ratio_max_abs_log"] < 1e-3
