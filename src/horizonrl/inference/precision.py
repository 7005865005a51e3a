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
:func:`sampling_dtype` warns about.
"""

from __future__ import annotations

import copy
import functools
import warnings

import torch

from horizonrl.errors import HorizonWarning

__all__ = ["cpu_has_bf16_units", "sampling_copy", "sampling_dtype"]

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
