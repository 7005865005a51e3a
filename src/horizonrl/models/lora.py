"""LoRA adapters on the policy (``model.lora_r > 0``), through ``peft``.

The adapters are injected into the Hugging Face model itself (``peft.inject_adapter_in_model``;
not transformers' ``add_adapter``, which wants a newer peft), so the policy stays the same
``PreTrainedModel`` object every engine, loss and feature provider already calls: ``model(...)``,
``model.base_model``, ``generate``, gradient checkpointing. Only the adapter weights require
gradients (:func:`trainable_parameters` is what the optimizer gets).

- **The frozen base** is the policy with its adapters switched off (:func:`adapters_disabled`), not
  a second copy of the weights. :class:`FrozenBase` wraps it behind the call interface of a module
  (in eval mode, no gradient needed): the KL reference (``algo.kl_coef > 0``) and CCPO's frozen
  encoder. The adapters start at zero (``B = 0``), so the base *is* the initial policy.
- **Checkpoints** hold the adapters only, in peft's format (:func:`save_adapter`:
  ``adapter_config.json`` + ``adapter_model.safetensors``, what ``PeftModel.from_pretrained`` and
  vLLM read), naming the base model directory they belong to (``base_model_name_or_path``);
  :func:`load_adapter_weights` restores them exactly.
- **Export**: :func:`merge_and_unload` folds the adapters into the base weights in place;
  :func:`horizonrl.train.records.export.export_merged` turns a checkpoint (or a run's latest) into
  a plain Hugging Face model directory (``horizonrl export``), and :func:`load_adapter_dir` loads
  such a checkpoint merged, so ``train.init``, ``horizonrl eval --model`` and ``horizonrl serve``
  take it like any model directory.
- **Engines**: the ``hf`` engine runs the training module itself, so it samples with the adapters;
  the ``vllm`` engine loads the base once and the adapters through vLLM's LoRA support
  (:func:`adapter_tensors`, :func:`plain_state_dict`; ``inference/vllm_engine.py``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from horizonrl.errors import CheckpointError, ConfigError
from horizonrl.models.loading import state_mismatch

#: The adapter's name inside the model (peft's and transformers' default).
ADAPTER = "default"
#: File names of an adapter directory (peft's format).
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: Prefix peft puts before module names in an adapter file.
FILE_PREFIX = "base_model.model."
_LORA_KEY = re.compile(r"\.(lora_[A-Za-z_]+)\.([^.]+)\.")


def is_lora(model: Any) -> bool:
    """Whether ``model`` carries LoRA adapters (injected by :func:`apply_lora`: peft leaves its
    ``peft_config`` on the model)."""
    return bool(getattr(model, "peft_config", None))


def is_adapter_dir(path: str | Path) -> bool:
    """Whether ``path`` is an adapter directory (a LoRA checkpoint) rather than a full model."""
    p = Path(path)
    return (p / ADAPTER_CONFIG).is_file() and not (p / "config.json").is_file()


# -- building --------------------------------------------------------------------------------------


def lora_config(cfg) -> Any:
    """The ``peft.LoraConfig`` of a :class:`~horizonrl.config.ModelConfig` (``lora_r > 0``)."""
    try:
        from peft import LoraConfig
    except ImportError as e:  # the optional "lora" extra
        raise ConfigError(
            f"model.lora_r={cfg.lora_r}: LoRA needs peft ({e}); "
            "install it with: pip install 'horizonrl[lora]'"
        ) from None
    targets = cfg.lora_target_modules
    if isinstance(targets, str) and targets != "all-linear":
        targets = [targets]  # peft reads any other string as a regular expression
    return LoraConfig(
        r=int(cfg.lora_r),
        lora_alpha=float(cfg.lora_alpha),
        lora_dropout=float(cfg.lora_dropout),
        target_modules=targets if isinstance(targets, str) else list(targets),
        bias="none",
    )


def _linear_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Linear layers an adapter may target (not the output head), by module name."""
    from transformers.pytorch_utils import Conv1D

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return {
        name: m
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear | Conv1D) and m is not head and name
    }


def check_targets(model: torch.nn.Module, targets: str | list[str]) -> None:
    """ConfigError naming each entry of ``model.lora_target_modules`` that matches no linear layer
    of ``model`` (peft's matching: the module name or a dotted suffix of it)."""
    if isinstance(targets, str) and targets == "all-linear":
        if not _linear_layers(model):
            raise ConfigError(
                f"model.lora_target_modules='all-linear': {type(model).__name__} has no linear layer "
                "besides its output head"
            )
        return
    names = [targets] if isinstance(targets, str) else list(targets)
    linear = _linear_layers(model)
    known = sorted({n.rsplit(".", 1)[-1] for n in linear})
    modules = dict(model.named_modules())
    for t in names:
        if any(n == t or n.endswith("." + t) for n in linear):
            continue
        other = [n for n in modules if n and (n == t or n.endswith("." + t))]
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if not other:
            why = f"no module of {type(model).__name__} is named so"
        elif modules[other[0]] is head:
            why = f"{other[0]!r} is the output head, which keeps its weights"
        else:
            why = f"{other[0]!r} is {type(modules[other[0]]).__name__}, not a linear layer"
        raise ConfigError(f"model.lora_target_modules: {t!r} matches no linear layer ({why}); known: {known}")


def apply_lora(model, cfg, *, base_path: str | Path | None = None):
    """Inject the LoRA adapters of ``cfg`` (:class:`~horizonrl.config.ModelConfig`) into ``model`` in
    place and freeze everything else; returns ``model``.

    ``base_path``: the directory the base weights were loaded from, recorded in the adapters'
    config (``base_model_name_or_path``) so a checkpoint can be merged or loaded later. The
    adapters' ``A`` matrices are drawn from torch's global RNG (the trainer seeds it first), ``B``
    starts at zero: the adapted model equals the base until the first update.
    """
    if is_lora(model):
        raise ValueError("apply_lora: the model already carries LoRA adapters")
    from peft import inject_adapter_in_model

    check_targets(model, cfg.lora_target_modules)
    inject_adapter_in_model(lora_config(cfg), model, adapter_name=ADAPTER)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)
    model.peft_config[ADAPTER].base_model_name_or_path = (
        str(Path(base_path).resolve()) if base_path is not None else None
    )
    return model


def adapt_like(model: torch.nn.Module | Any, other: torch.nn.Module) -> torch.nn.Module:
    """Inject ``model``'s adapters (same config, zero update; ``model`` may be the adapter's peft config
    itself) into ``other``, a plain model of the same architecture, frozen; returns ``other``. Its state
    dict then has ``model``'s names (a full copy of a sharded adapted policy or a Ray replica loads the
    policy's weights)."""
    from peft import inject_adapter_in_model

    config = model.peft_config[ADAPTER] if isinstance(model, torch.nn.Module) else model
    inject_adapter_in_model(copy.deepcopy(config), other, adapter_name=ADAPTER)
    return other.requires_grad_(False)


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters an optimizer should get: those that require gradients (all of them without
    LoRA, in the model's order, so full fine-tuning builds the same optimizer as before)."""
    return [p for p in model.parameters() if p.requires_grad]


def parameter_counts(model: torch.nn.Module) -> tuple[int, int]:
    """``(trainable, total)`` parameter counts (tied weights counted once)."""
    params = list({id(p): p for p in model.parameters()}.values())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


# -- the frozen base ------------------------------------------------------------------------------


def _tuner_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Run ``model`` as its frozen base: every adapter off inside the block, restored after (each
    adapter parameter's ``requires_grad`` too). Nests; a model without adapters is unchanged."""
    if not is_lora(model):
        yield model
        return
    layers = [m for m in _tuner_layers(model) if not m.disable_adapters]
    flags = [(p, p.requires_grad) for m in layers for p in m.parameters()]
    for m in layers:
        m.enable_adapters(False)
    try:
        yield model
    finally:
        for m in layers:
            m.enable_adapters(True)
        for p, flag in flags:
            p.requires_grad_(flag)


class FrozenBase:
    """The frozen base of an adapted policy, called like a module: ``ref(input_ids=...)`` runs
    the policy with its adapters off, in eval mode (no dropout), sharing its weights.

    Attributes are the policy's; a submodule comes back wrapped too (``ref.base_model(...)``, the
    decoder stack CCPO's encoder calls, also runs without adapters). ``eval``, ``train`` and
    ``requires_grad_`` leave the policy alone: the base is always frozen and in eval mode, while
    the adapters keep training.
    """

    def __init__(self, module: torch.nn.Module, root: torch.nn.Module | None = None) -> None:
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_root", root if root is not None else module)

    def __call__(self, *args, **kwargs):
        root = self._root
        was_training = root.training
        root.eval()
        try:
            with adapters_disabled(root):
                return self._module(*args, **kwargs)
        finally:
            if was_training:
                root.train()

    def forward(self, *args, **kwargs):
        return self(*args, **kwargs)

    @property
    def training(self) -> bool:
        return False

    def eval(self) -> FrozenBase:
        return self

    def train(self, mode: bool = True) -> FrozenBase:
        del mode
        return self

    def requires_grad_(self, requires_grad: bool = True) -> FrozenBase:
        del requires_grad
        return self

    def __getattr__(self, name: str):
        if name in ("_module", "_root"):  # not set yet (copying, unpickling): no recursion
            raise AttributeError(name)
        value = getattr(self._module, name)
        if isinstance(value, torch.nn.Module):
            return FrozenBase(value, self._root)
        return value

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"FrozenBase is read-only (setting {name!r})")

    def __repr__(self) -> str:
        return f"FrozenBase({type(self._module).__name__})"


def frozen_reference(model: torch.nn.Module):
    """A frozen reference of the policy's current weights: :class:`FrozenBase` for an adapted
    policy (no copy), else a deep copy in eval mode without gradients."""
    if is_lora(model):
        return FrozenBase(model)
    return copy.deepcopy(model).eval().requires_grad_(False)


# -- state dicts ----------------------------------------------------------------------------------


def _module_key(key: str) -> str:
    """An in-model adapter key (``...q_proj.lora_A.default.weight``) as peft writes it to a file."""
    return FILE_PREFIX + _LORA_KEY.sub(lambda m: f".{m.group(1)}.", key, count=1)


def _model_key(key: str) -> str:
    """An adapter file key back to the in-model name (inverse of :func:`_module_key`)."""
    key = key.removeprefix(FILE_PREFIX)
    return re.sub(r"\.(lora_[A-Za-z_]+)\.", lambda m: f".{m.group(1)}.{ADAPTER}.", key, count=1)


def adapter_tensors(source: torch.nn.Module | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter weights of a model (or of its ``state_dict()``) under the names of peft's adapter
    file (``base_model.model.<module>.lora_A.weight``)."""
    sd = source.state_dict() if isinstance(source, torch.nn.Module) else source
    return {_module_key(k): v for k, v in sd.items() if _LORA_KEY.search(k)}


@torch.no_grad()
def plain_state_dict(
    source: torch.nn.Module | Mapping[str, torch.Tensor], *, merge: bool = False
) -> dict[str, torch.Tensor]:
    """The weights of an adapted model (or of its ``state_dict()``) under the plain model's names
    (``...q_proj.weight``): the base weights, plus each adapter's update when ``merge`` (which needs
    the model: its layers know their scale)."""
    if isinstance(source, torch.nn.Module):
        sd, modules = source.state_dict(), dict(source.named_modules())
    elif merge:
        raise TypeError("plain_state_dict(merge=True) needs the model, not a state dict")
    else:
        sd, modules = source, {}
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        if _LORA_KEY.search(k):
            continue
        if ".base_layer." not in k:
            out[k] = v
            continue
        prefix, rest = k.split(".base_layer.", 1)
        if merge and rest == "weight" and not modules[prefix].disable_adapters:
            v = v + modules[prefix].get_delta_weight(ADAPTER).to(v.dtype)
        out[f"{prefix}.{rest}"] = v
    return out


def load_adapter_weights(
    model: torch.nn.Module, weights: Mapping[str, torch.Tensor], *, where: str = "the checkpoint"
) -> None:
    """Load adapter weights (an adapter file's tensors) into an adapted ``model`` exactly;
    CheckpointError when names or shapes do not match its adapters."""
    own = {k: v for k, v in model.state_dict().items() if _LORA_KEY.search(k)}
    state = {_model_key(k): v for k, v in weights.items()}
    detail = state_mismatch(own, state)
    if detail:
        hint = (
            " (a full-model checkpoint: model.lora_r differs from the run's)"
            if not any(_LORA_KEY.search(k) for k in state)
            else ""
        )
        raise CheckpointError(f"{where} does not match the model's LoRA adapters ({detail}){hint}")
    model.load_state_dict(state, strict=False)


def save_adapter(
    model: torch.nn.Module,
    out_dir: str | Path,
    *,
    dtype: torch.dtype | None = None,
    state_dict: Mapping[str, torch.Tensor] | None = None,
) -> Path:
    """Write the adapters of ``model`` in peft's format: ``adapter_config.json`` (rank, scale, target
    modules, base model directory) and ``adapter_model.safetensors``; returns ``out_dir``.
    ``state_dict``: the model's weights to take them from (a sharded model's gathered ones)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {
        k: (v.detach().to(dtype) if dtype is not None else v.detach()).contiguous().cpu()
        for k, v in adapter_tensors(model if state_dict is None else state_dict).items()
    }
    save_file(tensors, str(out / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    model.peft_config[ADAPTER].save_pretrained(str(out))
    return out


def save_base(model: torch.nn.Module, out_dir: str | Path, *, dtype: torch.dtype | None = None) -> Path:
    """Write the base weights of an adapted ``model`` (adapters left out) as a plain Hugging Face
    model directory: config, generation config and ``model.safetensors`` (tied tensors once)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    seen: set[int] = set()
    tensors: dict[str, torch.Tensor] = {}
    for name, t in plain_state_dict(model).items():
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        t = t.detach()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        tensors[name] = t.contiguous().cpu()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    model.config.save_pretrained(out)
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        gen.save_pretrained(out)
    return out


# -- merging and export ---------------------------------------------------------------------------


def merge_and_unload(model: torch.nn.Module) -> torch.nn.Module:
    """Fold every adapter into its base weight and put the plain layers back, in place: ``model``
    becomes an ordinary model (saved as one by ``save_pretrained``); returns it."""
    if not is_lora(model):
        return model
    from peft.tuners.tuners_utils import BaseTunerLayer

    named = [(n, m) for n, m in model.named_modules() if isinstance(m, BaseTunerLayer)]
    for name, layer in named:
        if not layer.disable_adapters:
            layer.merge(adapter_names=[ADAPTER])
        parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        setattr(parent, name.rsplit(".", 1)[-1], layer.get_base_layer())
    if hasattr(model, "peft_config"):
        del model.peft_config
    for p in model.parameters():
        p.requires_grad_(True)
    return model


def _adapter_base(path: Path, base: str | Path | None) -> Path:
    if base is not None:
        return Path(base)
    cfg = json.loads((path / ADAPTER_CONFIG).read_text())
    named = cfg.get("base_model_name_or_path")
    if not named:
        raise FileNotFoundError(
            f"{path}/{ADAPTER_CONFIG} names no base model (base_model_name_or_path); pass the base "
            "model directory (--base)"
        )
    if not Path(named).is_dir():
        raise FileNotFoundError(
            f"{path}: its base model {named!r} (base_model_name_or_path) does not exist here; pass the "
            "base model directory (--base)"
        )
    return Path(named)


def load_adapter_dir(
    path: str | Path,
    *,
    base: str | Path | None = None,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
):
    """``(model, tokenizer)`` of an adapter directory (a LoRA checkpoint) with its adapters merged
    into the base model it names (or ``base``): a plain model. The tokenizer is the checkpoint's
    when it holds one, else the base's."""
    from peft import LoraConfig, inject_adapter_in_model
    from safetensors.torch import load_file

    from horizonrl.models.loading import is_model_dir, load_model_and_tokenizer, load_tokenizer

    p = Path(path)
    base_dir = _adapter_base(p, base)
    model, tok = load_model_and_tokenizer(base_dir, dtype=dtype, device="cpu")
    if any((p / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")) and not is_model_dir(p):
        tok = load_tokenizer(p)
    lcfg = LoraConfig.from_pretrained(str(p))
    lcfg.inference_mode = False
    inject_adapter_in_model(lcfg, model, adapter_name=ADAPTER)
    weights = p / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise FileNotFoundError(f"{p}: no {ADAPTER_WEIGHTS}")
    load_adapter_weights(model, load_file(str(weights)), where=str(p))
    merge_and_unload(model)
    return model.to(device).eval(), tok
