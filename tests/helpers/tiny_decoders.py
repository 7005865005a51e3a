"""Tiny Llama-shaped decoders and shared-prefix prompts for the HF engine's tests (shared prefix, turn
reuse, lean decode): random weights from a config, a 120-token vocabulary, eos 1, pad 0."""

from __future__ import annotations

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

#: The shape every tiny decoder shares: 2 layers, 6 query and 2 key/value heads (grouped-query attention).
COMMON = dict(
    vocab_size=120,
    hidden_size=48,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,
    max_position_embeddings=512,
    eos_token_id=1,
    pad_token_id=0,
    initializer_range=0.1,
)


def tiny_decoder(family: str = "qwen2", seed: int = 0):
    """``qwen2`` (tied embeddings, qkv biases at transformers' zero init), ``qwen3`` (per-head norms,
    head_dim 16 apart from hidden / heads), ``llama`` (attention and MLP biases, drawn so that they count;
    untied head) or ``mistral`` (no sliding window), in eval mode."""
    torch.manual_seed(seed)
    if family == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**COMMON, tie_word_embeddings=True))
    elif family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**COMMON, head_dim=16, tie_word_embeddings=True))
    elif family == "mistral":
        model = MistralForCausalLM(MistralConfig(**COMMON, sliding_window=None, tie_word_embeddings=False))
    else:
        cfg = LlamaConfig(**COMMON, attention_bias=True, mlp_bias=True, tie_word_embeddings=False)
        model = LlamaForCausalLM(cfg)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.normal_(0, 0.1)
    return model.eval()


def prefix_prompts(n: int = 5, shared: int = 40, seed: int = 1, grow: int = 2) -> list[list[int]]:
    """``n`` prompts of random ids: the same ``shared`` ids, then ``3 + grow * i`` ids of prompt ``i``'s
    own."""
    g = torch.Generator().manual_seed(seed)
    head = torch.randint(2, 120, (shared,), generator=g).tolist()
    return [head + torch.randint(2, 120, (3 + grow * i,), generator=g).tolist() for i in range(n)]
