"""Sampling in a lower precision than the training weights (``inference.params.dtype``).

The update keeps float32 master weights and optimizer state; the rollout engine samples from a copy of
the weights cast to ``bfloat16``, refreshed after every update (:meth:`HFEngine.sync` with ``follow``),
as verl and slime sample in bf16 and train in fp32. The rollout log-probs are then the bf16 model's, so
``pi_rollout`` and the training model's ``pi_train`` differ by more than float rounding: use
``algo.old_logprobs=recompute`` (PPO's ``pi_old`` from the fp32 weights) with ``algo.tis_cap`` to
correct the remaining mismatch, which ``train/ratio_geomean``, ``train/kl_rollout_train`` and
``train/tis_*`` measure (docs/models.md, "Sampling in bfloat16").

On a CPU, bfloat16 matrix products are fast only with bf16 matrix or vector units (Intel AMX, AVX512-BF16
on Intel and AMD); without them torch emulates bf16 and sampling gets slower, not faster, which
:func:`sampling_dtype` warns about. There the copy's linear layers also keep their weights in oneDNN's
blocked layout (:func:`pack_linears`), so a decode step does not reorder every weight on every call.
"""

from __future__ import annotations

import copy
import functools
import warnings

import torch

from horizonrl.errors import HorizonWarning

__all__ = [
    "contiguous_head",
    "cpu_has_bf16_units",
    "pack_linears",
    "pack_weight",
    "packed_linear",
    "sampling_copy",
    "sampling_dtype",
]

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@functools.cache
def cpu_has_bf16_units() -> bool:
    """Whether this CPU advertises bf16 matrix or vector instructions (``amx_bf16`` / ``avx512_bf16``)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return False
    return any(flag in flags.split() for flag in ("amx_bf16", "avx512_bf16"))


def sampling_dtype(model: torch.nn.Module, dtype: str | None, device) -> torch.dtype | None:
    """The dtype to sample in, or None when ``dtype`` is None or already the model's.

    Raises ``ValueError`` naming ``inference.params.dtype`` for an unknown name; warns (with what it costs)
    when bfloat16 is asked for on a CPU without bf16 units.
    """
    if dtype is None:
        return None
    if dtype not in _DTYPES:
        raise ValueError(f"inference.params.dtype={dtype!r}: expected one of {sorted(_DTYPES)}")
    want = _DTYPES[dtype]
    if want == next(model.parameters()).dtype:
        return None
    if want == torch.bfloat16 and torch.device(device or "cpu").type == "cpu" and not cpu_has_bf16_units():
        warnings.warn(
            "inference.params.dtype=bfloat16 on a CPU without bf16 units (no amx_bf16 / avx512_bf16 in "
            "/proc/cpuinfo): torch emulates bf16 matrix products there, which is usually slower than "
            "float32 and only halves the weights' memory; leave inference.params.dtype unset to sample in "
            "float32",
            HorizonWarning,
            stacklevel=3,
        )
    return want


def sampling_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A frozen copy of ``model`` in ``dtype`` for sampling (its weights follow ``model`` through sync)."""
    clone = copy.deepcopy(model).to(dtype).eval().requires_grad_(False)
    clone.config.dtype = dtype
    return clone


def _contiguous_input(module: torch.nn.Module, args: tuple) -> tuple:
    return tuple(a.contiguous() if isinstance(a, torch.Tensor) else a for a in args)


def contiguous_head(model: torch.nn.Module) -> None:
    """Hand ``model``'s LM head contiguous inputs, when its weights are not float32.

    With ``logits_to_keep`` transformers slices the last positions out of the hidden states
    (``hidden[:, -k:]``, a non-contiguous view) and projects them. On the CPU, a bfloat16 ``F.linear`` of
    such a 3-D view expands the ``[vocab, hidden]`` weight to the batch and copies it: SmolLM2's head for
    16 rows took 2.96 s instead of 12.6 ms (torch 2.13, one thread; float32 is unaffected), once per
    prefill. A forward pre-hook makes the input contiguous (a no-op for contiguous inputs). Registered
    once per model.
    """
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    weight = getattr(head, "weight", None)
    if head is None or weight is None or weight.dtype == torch.float32:
        return
    if not any(h is _contiguous_input for h in head._forward_pre_hooks.values()):
        head.register_forward_pre_hook(_contiguous_input)


@functools.cache
def _mkldnn_packing() -> bool:
    """Whether torch was built with oneDNN's linear-weight packing (``torch.ops.mkldnn``) and this CPU runs
    its bfloat16 path (``_is_mkldnn_bf16_supported``: avx512bw/vl/dq or avx_ne_convert; an AVX2-only CPU
    raises "bf16 path needs the cpu support" when packing, so its weights stay unpacked)."""
    try:
        return (
            torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        )
    except (AttributeError, RuntimeError):
        return False


#: Rows oneDNN's packed layout is chosen for (its hint): a decode step's batch; prefills of hundreds of rows
#: run about as fast as unpacked (SmolLM2's layers, one thread: 1.4-1.7x at 1 row, 1.0-2.0x at 6 or 16,
#: 0.7-1.06x at 512, single noisy timings; ``benchmarks/packed_linear.py``).
PACK_ROWS_HINT = 16


def _packs(weight: torch.Tensor) -> bool:
    return weight.dtype == torch.bfloat16 and weight.device.type == "cpu" and _mkldnn_packing()


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` reordered once into oneDNN's blocked layout for :func:`packed_linear`, where that pays (a
    bfloat16 weight on the CPU, torch with oneDNN); else ``weight`` itself."""
    if _packs(weight):
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PACK_ROWS_HINT)
    return weight.detach()


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x W^T + b`` for a weight from :func:`pack_weight` (``F.linear`` where it was left unpacked: the
    weight itself says which)."""
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, bias, "none", [], "")
    return torch.nn.functional.linear(x, weight, bias)


class _PackedLinear:
    """The forward of one ``nn.Linear`` through its weight pre-reordered into oneDNN's blocked layout.

    ``F.linear`` in bfloat16 on the CPU hands the weight to oneDNN, which reorders it into its blocked
    layout on every call: for the few rows of a decode step that reorder costs as much as the product.
    Here it is done once (:func:`pack_weight`, ``torch.ops.mkldnn._reorder_linear_weight``: what inductor's
    weight freezing does), and redone whenever the weight changes (its storage, or its autograd version
    counter, which every in-place write moves: :meth:`HFEngine.sync`'s ``load_state_dict``). The product is
    oneDNN's same kernel, so outputs equal ``F.linear``'s for layers without a bias
    (tests/inference/test_shared_prefix.py checks it, and that the engine samples the same tokens with and
    without);
    a bias oneDNN adds inside the kernel, which can differ from ``F.linear`` by one bf16 rounding.
    """

    def __init__(self, module: torch.nn.Linear) -> None:
        self.module = module
        self.packed: torch.Tensor | None = None
        self.key: tuple[int, int] | None = None  # (storage address, version) of the weight it was packed from

    def __getstate__(self) -> dict:  # the packed tensor (oneDNN's opaque layout) is rebuilt, never copied
        return {"module": self.module, "packed": None, "key": None}

    def __deepcopy__(self, memo: dict) -> _PackedLinear:
        return _PackedLinear(copy.deepcopy(self.module, memo))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        w = self.module.weight
        key = (w.data_ptr(), w._version)
        if self.packed is None or self.key != key:
            self.packed = pack_weight(w)
            self.key = key
        return packed_linear(x, self.packed, self.module.bias)


def pack_linears(model: torch.nn.Module) -> int:
    """Run ``model``'s bfloat16 CPU ``nn.Linear`` layers through pre-packed weights (:class:`_PackedLinear`).

    Only for a model that is never trained through (the engine's sampling copy): the packed forward is
    not differentiable. Returns how many layers were packed (0 where torch lacks oneDNN, or the weights
    are float32 or not on the CPU). The state dict is unchanged; a tied LM head gets its own packed copy.
    """
    if not _mkldnn_packing():
        return 0
    n = 0
    for module in model.modules():
        w = getattr(module, "weight", None)
        if (
            type(module) is torch.nn.Linear
            and w is not None
            and w.dtype == torch.bfloat16
            and w.device.type == "cpu"
            and not isinstance(module.__dict__.get("forward"), _PackedLinear)
        ):
            module.forward = _PackedLinear(module)
            n += 1
    return n
