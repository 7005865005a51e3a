"""Shared-prefix attention for the HF engine: one KV cache of the prompt prefix every row shares.

Every episode of a step starts with the same tokens: the system prompt, the tool block and the
``rollout.few_shot`` examples (most of a small pretrained model's prompt). :class:`PrefixCache` keeps
their keys and values once, ``[kv_heads, L, head_dim]`` per layer, computed by a batch-1 forward of
exactly those ``L`` tokens, and every row of a generation attends to them through
:func:`prefix_attention` while its own cache holds only what follows (its suffix). For a query ``q``
of a row, with prefix scores ``s_p = q K_p^T / sqrt(d)`` and suffix scores ``s_s = q K_s^T / sqrt(d)``
(masked: causal and padding), attention is the softmax over both parts::

    m = max(max s_p, max s_s)
    out = (exp(s_p - m) V_p + exp(s_s - m) V_s) / (sum exp(s_p - m) + sum exp(s_s - m))

which equals attention over the concatenated ``[prefix | suffix]`` cache, up to float rounding. The
prefix part is one matrix product per key/value head over all rows and query positions (the prefix is
read once per step, not once per row), so the prefill of the prefix happens once per policy version
and its decode-time cost no longer grows with the batch (the idea of vLLM's cascade attention and
SGLang's shared-prefix kernels; here in plain torch).

Which prefix: the longest common prefix of all prompts of one ``generate`` call (a kept prefix is
reused while it is a prefix of every prompt and the weights are unchanged). In the round-by-round
driver the calls and their prompts are fixed by the config and seeds, so the cached values are too:
seeded runs stay reproducible (unlike a cache shared by whichever request finished first).

The attention function is registered with transformers' ``AttentionInterface`` under
:data:`ATTENTION`; without a ``prefix_kv`` keyword it is exactly ``sdpa``. Models whose layers are
not all full attention (sliding windows) are not supported (:func:`supports_shared_prefix`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from horizonrl.inference.prefix_store import common_prefix

__all__ = ["ATTENTION", "PrefixCache", "common_prefix_len", "prefix_attention", "supports_shared_prefix"]

#: The name the attention function is registered under (``config._attn_implementation``).
ATTENTION = "horizonrl_shared_prefix"

_SCORE_ELEMENTS = 2**25  # at most this many float32 prefix scores (128 MiB) per matrix product
#: Queries per row up to which a call runs the two-part softmax; above, ``sdpa`` over the prefix
#: expanded to the batch (which copies the prefix's keys and values once per row, and for grouped-query
#: attention once per query head). At SmolLM2's shapes (16 rows, 9 query / 3 key-value heads, a
#: 600-token prefix, bf16, one thread) the two-part softmax took 0.5x sdpa's time at 16 queries, 0.8x
#: at 48 and 1.1x at 64 (a decode step: equal).
TWO_PART_MAX_QUERIES = 48


def prefix_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    prefix_kv: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention over ``[shared prefix | the row's own cache]`` (module docstring).

    A decode step and a short prefill (up to :data:`TWO_PART_MAX_QUERIES` queries per row) run the
    two-part softmax, reading the prefix once for all rows; a longer prefill runs ``sdpa`` over the
    prefix expanded to the batch and the suffix, whose fused kernel is faster there than materializing
    the scores.

    ``query`` ``[B, Hq, T, D]``; ``key``/``value`` ``[B, Hkv, S, D]`` (the suffix cache);
    ``attention_mask`` the boolean ``[B, 1, T, S]`` mask of the suffix (True = attend) or None (causal);
    ``prefix_kv[layer]`` the prefix's ``(keys, values)``, each ``[Hkv, L, D]``. Returns
    ``([B, T, Hq, D], None)`` as transformers' attention functions do.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if prefix_kv is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    pk, pv = prefix_kv[module.layer_idx]
    b, hq, t, d = query.shape
    hkv, s = key.shape[1], key.shape[2]
    g = hq // hkv
    scale = float(scaling) if scaling is not None else d**-0.5
    if attention_mask is None:  # causal over the suffix: query i sits at suffix position s - t + i
        rows = torch.arange(t, device=query.device)[:, None] + (s - t)
        attention_mask = (torch.arange(s, device=query.device)[None, :] <= rows)[None, None]
    if attention_mask.dtype != torch.bool:  # an additive float mask: 0 = attend
        attention_mask = attention_mask == 0
    if t > TWO_PART_MAX_QUERIES:  # a long prefill, where sdpa's fused kernel beats the two-part softmax
        ones = torch.ones((*attention_mask.shape[:-1], pk.shape[1]), dtype=torch.bool, device=query.device)
        return sdpa_attention_forward(
            module,
            query,
            torch.cat([pk[None].expand(b, -1, -1, -1), key], dim=2),
            torch.cat([pv[None].expand(b, -1, -1, -1), value], dim=2),
            torch.cat([ones, attention_mask], dim=-1).expand(b, -1, -1, -1),
            dropout=dropout,
            scaling=scaling,
            **kwargs,
        )
    mask = attention_mask.expand(b, 1, t, s)[:, :, None].expand(b, 1, g, t, s).reshape(b, 1, g * t, s)
    q = query.reshape(b, hkv, g * t, d)
    s_suf = torch.matmul(q, key.transpose(-1, -2)).float().mul_(scale).masked_fill_(~mask, float("-inf"))
    # Prefix scores: rows x query positions stacked, one product per key/value head, in slices of rows.
    out = torch.empty((b, hkv, g * t, d), dtype=torch.float32, device=query.device)
    step = max(1, _SCORE_ELEMENTS // max(1, hkv * g * t * pk.shape[1]))
    for lo in range(0, b, step):
        hi = min(b, lo + step)
        qh = q[lo:hi].transpose(0, 1).reshape(hkv, (hi - lo) * g * t, d)
        s_pre = torch.bmm(qh, pk.transpose(1, 2)).float().mul_(scale)  # [Hkv, rows*g*t, L]
        s_pre = s_pre.view(hkv, hi - lo, g * t, -1).transpose(0, 1)  # [rows, Hkv, g*t, L]
        part = s_suf[lo:hi]
        peak = torch.maximum(s_pre.amax(-1, keepdim=True), part.amax(-1, keepdim=True))
        p_pre = (s_pre - peak).exp_()
        p_suf = (part - peak).exp_()
        den = p_pre.sum(-1, keepdim=True) + p_suf.sum(-1, keepdim=True)
        num_pre = torch.bmm(
            p_pre.transpose(0, 1).reshape(hkv, -1, p_pre.shape[-1]).to(pv.dtype), pv
        ).float()  # [Hkv, rows*g*t, D]
        num_pre = num_pre.view(hkv, hi - lo, g * t, d).transpose(0, 1)
        num_suf = torch.matmul(p_suf.to(value.dtype), value[lo:hi]).float()
        out[lo:hi] = (num_pre + num_suf) / den
    out = out.to(query.dtype).view(b, hq, t, d).transpose(1, 2).contiguous()
    return out, None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    if ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTENTION, prefix_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)


def supports_shared_prefix(model: torch.nn.Module) -> bool:
    """Whether ``model``'s attention can run :func:`prefix_attention`: a decoder whose attention modules
    dispatch through transformers' attention interface, all layers full attention (no sliding window)."""
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "_attn_implementation"):
        return False
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    types = getattr(text, "layer_types", None)
    if types is not None and any(t != "full_attention" for t in types):
        return False
    window = getattr(text, "sliding_window", None)
    if window and getattr(text, "use_sliding_window", True):  # Qwen2 sets the flag; Mistral windows by size
        return False
    return getattr(cfg, "model_type", "") in _SUPPORTED


#: Model types whose attention modules have a ``layer_idx`` and call the attention interface with the
#: post-RoPE query and the cache's key/value (checked against transformers 5's modeling files).
_SUPPORTED = frozenset({"llama", "qwen2", "qwen3", "mistral", "smollm3"})


@contextlib.contextmanager
def attention_as(model: torch.nn.Module, name: str) -> Iterator[None]:
    """Run ``model`` with ``config._attn_implementation = name`` inside the block, restored after."""
    cfg = model.config
    old = cfg._attn_implementation
    if old == name:
        yield
        return
    _register()
    cfg._attn_implementation = name
    try:
        yield
    finally:
        cfg._attn_implementation = old


def common_prefix_len(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the longest common prefix of ``prompts`` (:func:`.prefix_store.common_prefix`, folded)."""
    first = np.asarray(prompts[0], dtype=np.int64)
    n = len(first)
    for p in prompts[1:]:
        n = common_prefix(first[:n], np.asarray(p[:n], dtype=np.int64))
    return n


@dataclass
class PrefixCache:
    """The kept prefix: its token ids, per-layer ``(keys, values)`` ``[Hkv, L, D]``, and the weights'
    version it was computed under (:func:`weights_version`)."""

    ids: tuple[int, ...]
    kv: list[tuple[torch.Tensor, torch.Tensor]]
    version: tuple[int, ...]

    def fits(self, prompts: Sequence[Sequence[int]], version: tuple[int, ...]) -> bool:
        """Whether it is a proper prefix of every prompt (each keeps at least one token of its own) and
        the weights are those it was computed with."""
        n = len(self.ids)
        return version == self.version and all(len(p) > n and tuple(p[:n]) == self.ids for p in prompts)


def weights_version(model: torch.nn.Module) -> tuple[int, ...]:
    """What changes whenever a parameter of ``model`` is modified in place (optimizer steps,
    ``load_state_dict``, weight syncs: its autograd version counter) or replaced (its storage): both, for
    every parameter."""
    return tuple(x for p in model.parameters() for x in (p.data_ptr(), p._version))
