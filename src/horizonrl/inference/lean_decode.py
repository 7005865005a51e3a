"""A lean decode step for Llama-shaped models: the HF engine's one-token forward in fewer, larger ops.

On a CPU a decode step of a small model is dominated by per-op overhead, not arithmetic: transformers'
forward of SmolLM2-135M runs about a hundred tensor ops per layer (separate ``q``/``k``/``v`` and
``gate``/``up`` projections, RMSNorm's float32 round trips, rotary halves, transposes and reshapes that
copy, the mask built per layer). :class:`LeanDecoder` computes the same function for one new token per
row with the projections fused (``[q; k; v]`` and ``[gate; up]`` as one weight each, pre-packed for
oneDNN like :func:`.precision.pack_linears`), ``torch.rms_norm``, rotary embedding of queries and keys
together, and one softmax over ``[shared prefix | the row's cache]`` (:mod:`.shared_prefix`'s prefix keys
kept once in float32, transposed). Per layer, with ``h`` the residual stream::

    x = rmsnorm(h);  [q; k; v] = W_qkv x (+ b);  q, k = rope(q), rope(k)   (Qwen3: rmsnorm per head first)
    a = softmax([q K_p^T | q K^T] / sqrt(d)) [V_p; V]                        (GQA: query heads share kv heads)
    h = h + W_o a;  x = rmsnorm(h);  [g; u] = W_gu x;  h = h + W_down(silu(g) * u)

then ``logits = W_head rmsnorm(h)``. The keys and values go into the engine's ``DynamicCache`` as
transformers' forward puts them, so a prefill (transformers' forward) and lean steps mix freely. The
result equals transformers' forward up to float rounding (tests/inference/test_lean_decode.py: float32
logits of Llama, Qwen2 with projection biases and Qwen3 with per-head norms; bf16 within bf16 rounding).

Used by the HF engine with ``inference.params.lean_decode`` (on in the packaged ``smollm2_*`` configs;
``benchmarks/smollm2_rollout.py`` measures it). Models whose architecture it does not cover (other model
types, sliding windows, activations other than SiLU) keep transformers' forward
(:func:`supports_lean_decode`).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from horizonrl.inference.precision import pack_weight, packed_linear
from horizonrl.inference.shared_prefix import PrefixCache, supports_shared_prefix, weights_version

__all__ = ["LeanDecoder", "supports_lean_decode"]

#: Model types whose decoder layers are Llama's (pre-norm, RoPE, GQA, SwiGLU MLP); Qwen2 adds projection
#: biases, Qwen3 per-head RMSNorm of queries and keys (checked against transformers 5's modeling files).
_SUPPORTED = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def supports_lean_decode(model: torch.nn.Module) -> bool:
    """Whether :class:`LeanDecoder` computes ``model``'s forward: a supported model type, all layers full
    attention (no sliding window), SiLU MLPs, and the module layout it reads with plain ``nn.Linear``
    projections (not LoRA-wrapped ones)."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", "") not in _SUPPORTED or not supports_shared_prefix(model):
        return False
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return False
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not layers or not all(hasattr(inner, a) for a in ("embed_tokens", "norm", "rotary_emb")):
        return False
    # Plain linear layers only: a LoRA-wrapped projection's ``weight`` is its base weight alone.
    attn, mlp = layers[0].self_attn, layers[0].mlp
    names = [(attn, a) for a in ("q_proj", "k_proj", "v_proj", "o_proj")]
    names += [(mlp, a) for a in ("gate_proj", "up_proj", "down_proj")]
    return all(type(getattr(m, a, None)) is torch.nn.Linear for layer in layers for m, a in names)


@dataclass
class _Layer:
    """One decoder layer's weights as the lean step reads them."""

    norm1: torch.Tensor
    qkv: torch.Tensor  # [q; k; v] weight, pre-packed where oneDNN packs (else the plain weight)
    qkv_bias: torch.Tensor | None
    o_proj: torch.nn.Module
    norm2: torch.Tensor
    gate_up: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down_proj: torch.nn.Module
    q_norm: torch.Tensor | None  # Qwen3's per-head RMSNorm weights
    k_norm: torch.Tensor | None


def _cat_bias(*linears: torch.nn.Linear) -> torch.Tensor | None:
    """The fused bias of ``linears`` (zeros for those without one), or None when none has one."""
    if all(lin.bias is None for lin in linears):
        return None
    w = linears[0].weight
    return torch.cat(
        [lin.bias if lin.bias is not None else w.new_zeros(lin.weight.shape[0]) for lin in linears]
    )


class LeanDecoder:
    """The lean decode step of one model (module docstring); its fused weights follow the model's
    (rebuilt when :func:`.shared_prefix.weights_version` moves: an engine sync). The version is read at
    the first step on each cache, not every step: a cache is decoded under the weights that filled it."""

    def __init__(self, model: torch.nn.Module) -> None:
        if not supports_lean_decode(model):
            raise ValueError(
                f"LeanDecoder: model type {getattr(model.config, 'model_type', None)!r} is not supported"
            )
        self.model = model
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.eps = cfg.rms_norm_eps
        self.scale = self.head_dim**-0.5
        self._layers: list[_Layer] = []
        self._version: tuple[int, ...] | None = None
        self._cache = lambda: None  # a weak reference to the cache the weights were last checked for
        self._prefix: tuple[PrefixCache, list[tuple[torch.Tensor, torch.Tensor]]] | None = None

    def _refresh(self) -> None:
        version = weights_version(self.model)
        if version == self._version:
            return
        self._layers = []
        for layer in self.model.model.layers:
            a, m = layer.self_attn, layer.mlp
            qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
            gate_up = torch.cat([m.gate_proj.weight, m.up_proj.weight])
            self._layers.append(
                _Layer(
                    norm1=layer.input_layernorm.weight,
                    qkv=pack_weight(qkv),
                    qkv_bias=_cat_bias(a.q_proj, a.k_proj, a.v_proj),
                    o_proj=a.o_proj,
                    norm2=layer.post_attention_layernorm.weight,
                    gate_up=pack_weight(gate_up),
                    gate_up_bias=_cat_bias(m.gate_proj, m.up_proj),
                    down_proj=m.down_proj,
                    q_norm=a.q_norm.weight if hasattr(a, "q_norm") else None,
                    k_norm=a.k_norm.weight if hasattr(a, "k_norm") else None,
                )
            )
        self._version = version

    def release(self) -> None:
        """Drop the float32 copy of the shared prefix (the engine dropped the prefix: a sync, a sleep)."""
        self._prefix = None

    def _prefix_kv(self, prefix: PrefixCache | None) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """The prefix's keys ``[Hkv, D, L]`` (transposed) and values ``[Hkv, L, D]`` in float32, once."""
        if prefix is None:
            self._prefix = None
            return None
        if self._prefix is None or self._prefix[0] is not prefix:
            kv = [(k.float().transpose(1, 2).contiguous(), v.float().contiguous()) for k, v in prefix.kv]
            self._prefix = (prefix, kv)
        return self._prefix[1]

    def step(
        self,
        tokens: torch.Tensor,
        mask: torch.Tensor,
        pos: torch.Tensor,
        cache,
        prefix: PrefixCache | None = None,
    ) -> torch.Tensor:
        """Logits ``[B, vocab]`` of one new token per row: ``tokens`` ``[B]`` at positions ``pos``
        ``[B, 1]``, ``mask`` ``[B, S]`` the row's cache after this token (nonzero = attend), ``cache`` the
        engine's ``DynamicCache`` (this token's keys and values are appended to it), ``prefix`` the
        shared prefix every row attends to first."""
        if self._cache() is not cache:
            self._refresh()
            self._cache = weakref.ref(cache)
        pre = self._prefix_kv(prefix)
        inner = self.model.model
        b, hq, hkv, d = tokens.shape[0], self.heads, self.kv_heads, self.head_dim
        h = inner.embed_tokens(tokens)
        cos, sin = inner.rotary_emb(h[:, None], pos)  # [B, 1, D]: broadcast over heads
        valid = mask.bool()[:, None, None, :]
        half = d // 2
        for i, lay in enumerate(self._layers):
            x = F.rms_norm(h, (h.shape[-1],), lay.norm1, self.eps)
            y = packed_linear(x, lay.qkv, lay.qkv_bias).view(b, hq + 2 * hkv, d)
            qk, v = y[:, : hq + hkv], y[:, hq + hkv :]
            if lay.q_norm is not None:
                qk = torch.cat(
                    [
                        F.rms_norm(qk[:, :hq], (d,), lay.q_norm, self.eps),
                        F.rms_norm(qk[:, hq:], (d,), lay.k_norm, self.eps),
                    ],
                    dim=1,
                )
            qk = qk * cos + torch.cat([-qk[..., half:], qk[..., :half]], dim=-1) * sin
            keys, values = cache.update(qk[:, hq:, None], v[:, :, None], i)  # [B, Hkv, S, D]
            att = self._attend(qk[:, :hq], keys, values, valid, None if pre is None else pre[i])
            h = h + lay.o_proj(att.to(h.dtype).reshape(b, hq * d))
            x = F.rms_norm(h, (h.shape[-1],), lay.norm2, self.eps)
            gu = packed_linear(x, lay.gate_up, lay.gate_up_bias)
            inter = gu.shape[-1] // 2
            h = h + lay.down_proj(F.silu(gu[:, :inter]) * gu[:, inter:])
        h = inner.norm(h)
        return self.model.lm_head(h)

    def _attend(self, q, keys, values, valid, pre) -> torch.Tensor:
        """``softmax([q K_p^T | q K^T] * scale) [V_p; V]`` for one query per row, ``[B, Hkv, G, D]``
        (float32 with a prefix): ``q`` ``[B, Hq, D]``, ``keys``/``values`` ``[B, Hkv, S, D]``, ``valid``
        ``[B, 1, 1, S]``, ``pre`` the layer's float32 prefix ``(K_p^T [Hkv, D, L], V_p [Hkv, L, D])``."""
        b, hq, d = q.shape
        hkv = keys.shape[1]
        g = hq // hkv
        qg = q.reshape(b, hkv, g, d)
        s = torch.matmul(qg, keys.transpose(-1, -2)).float().masked_fill_(~valid, float("-inf"))
        if pre is None:
            p = s.mul_(self.scale).softmax(-1)
            return torch.matmul(p.to(values.dtype), values)
        pk_t, pv = pre
        n = pv.shape[1]
        rows = qg.float().transpose(0, 1).reshape(hkv, b * g, d)  # every row's queries, per kv head
        s_pre = torch.bmm(rows, pk_t).view(hkv, b, g, n).transpose(0, 1)
        p = torch.cat([s_pre, s], dim=-1).mul_(self.scale).softmax(-1)
        out = torch.bmm(p[..., :n].transpose(0, 1).reshape(hkv, b * g, n), pv).view(hkv, b, g, d)
        return out.transpose(0, 1) + torch.matmul(p[..., n:].to(values.dtype), values).float()
