"""Models and tokenizers: an offline BPE tokenizer with a ChatML + tools template, token-exact
incremental prompt rendering, tiny random models for CPU runs, and local loading (incl. SmolLM2)."""

from horizonrl.models.chat import ChatRenderer
from horizonrl.models.loading import (
    is_model_dir,
    load_model_and_tokenizer,
    load_smollm2,
    load_tokenizer,
    save_model_and_tokenizer,
    smollm2_gguf_path,
)
from horizonrl.models.tiny import TinyModelConfig, build_tiny_model, count_parameters, hf_config
from horizonrl.models.tokenizer import (
    CHAT_TEMPLATE,
    EOS_TOKEN,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    TAG_TOKENS,
    assistant_text,
    tool_call_text,
    tools_system_text,
    train_tokenizer,
)

__all__ = [
    "CHAT_TEMPLATE",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "SPECIAL_TOKENS",
    "TAG_TOKENS",
    "ChatRenderer",
    "TinyModelConfig",
    "assistant_text",
    "build_tiny_model",
    "count_parameters",
    "hf_config",
    "is_model_dir",
    "load_model_and_tokenizer",
    "load_smollm2",
    "load_tokenizer",
    "save_model_and_tokenizer",
    "smollm2_gguf_path",
    "tool_call_text",
    "tools_system_text",
    "train_tokenizer",
]
