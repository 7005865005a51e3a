"""Tiny randomly initialised causal LMs for CPU experiments and tests.

:func:`build_tiny_model` turns a :class:`TinyModelConfig` into a Hugging Face
``Qwen2ForCausalLM`` or ``LlamaForCausalLM`` (float32, seeded, vocabulary and
eos/pad ids from the tokenizer). With the default config and the default
1024-token vocabulary the model has about 0.92M parameters (embeddings tied):
4 layers x ~197k + 131k embedding. Scale ``hidden_size``/``num_layers`` for a
few million (e.g. hidden 256, 6 layers, intermediate 768: ~5.0M).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)

ARCHS = ("qwen2", "llama")


@dataclass(frozen=True)
class TinyModelConfig:
    """Shape of a tiny decoder-only model (head_dim = hidden_size / num_heads)."""

    arch: str = field(default="qwen2", metadata={"help": "architecture: 'qwen2' (qkv bias) or 'llama'"})
    hidden_size: int = field(default=128, metadata={"help": "model width; divisible by num_heads"})
    num_layers: int = field(default=4, metadata={"help": "number of transformer blocks"})
    num_heads: int = field(default=4, metadata={"help": "attention heads"})
    num_kv_heads: int = field(default=2, metadata={"help": "key/value heads (GQA); divides num_heads"})
    intermediate_size: int = field(default=384, metadata={"help": "SwiGLU MLP width"})
    max_position_embeddings: int = field(default=1024, metadata={"help": "longest context (RoPE positions)"})
    tie_embeddings: bool = field(default=True, metadata={"help": "share input embedding and LM head"})
    seed: int = field(default=0, metadata={"help": "torch seed for the random initialisation"})

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"TinyModelConfig.arch must be one of {ARCHS}, got {self.arch!r}")
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"TinyModelConfig.{name} must be a positive int, got {value!r}")
        if not isinstance(self.max_position_embeddings, int) or self.max_position_embeddings < 16:
            raise ValueError(
                "TinyModelConfig.max_position_embeddings must be an int >= 16, "
                f"got {self.max_position_embeddings!r}"
            )
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"TinyModelConfig.hidden_size={self.hidden_size} is not divisible by "
                f"num_heads={self.num_heads}"
            )
        if (self.hidden_size // self.num_heads) % 2:
            raise ValueError(
                f"TinyModelConfig.hidden_size={self.hidden_size} gives an odd head_dim with "
                f"num_heads={self.num_heads} (RoPE needs an even head_dim)"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"TinyModelConfig.num_kv_heads={self.num_kv_heads} does not divide num_heads={self.num_heads}"
            )
        if not isinstance(self.tie_embeddings, bool):
            raise ValueError(f"TinyModelConfig.tie_embeddings must be a bool, got {self.tie_embeddings!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"TinyModelConfig.seed must be an int, got {self.seed!r}")

    @classmethod
    def help(cls) -> dict[str, str]:
        """Field name -> help string (for CLIs and docs)."""
        return {f.name: f.metadata.get("help", "") for f in fields(cls)}


def hf_config(tokenizer: PreTrainedTokenizerBase, cfg: TinyModelConfig) -> Qwen2Config | LlamaConfig:
    """The Hugging Face config for ``cfg`` with vocabulary size and special ids from ``tokenizer``."""
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos,
        pad_token_id=pad,
        rms_norm_eps=1e-6,
        initializer_range=0.02,
        use_cache=True,
    )
    if cfg.arch == "qwen2":
        return Qwen2Config(**common, use_sliding_window=False)
    return LlamaConfig(**common, attention_bias=False, mlp_bias=False)


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase, cfg: TinyModelConfig | None = None
) -> PreTrainedModel:
    """A randomly initialised float32 causal LM for ``tokenizer`` (deterministic for ``cfg.seed``).

    The global torch RNG is left untouched. The model carries a ``generation_config`` with the
    tokenizer's eos/pad ids, and is returned in train mode on CPU.
    """
    cfg = cfg or TinyModelConfig()
    config = hf_config(tokenizer, cfg)
    model_cls = Qwen2ForCausalLM if cfg.arch == "qwen2" else LlamaForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = model_cls(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    model.train()
    return model


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())
