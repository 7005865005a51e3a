"""Memory-lean forward passes of the update: chunked log-probs, bf16 autocast, packed rows, and
micro-batches sized from a memory budget (docs/scale.md, "Memory-lean updates").

- **Chunked log-probs** (``train.logprob_chunk_tokens``): the model's LM head is swapped, for the
  duration of one forward, for :class:`LogprobHead`, which projects the final hidden states of the
  target positions through the real head a chunk of positions at a time and returns only each
  target's log-prob. Every chunk runs under ``torch.utils.checkpoint`` (non-reentrant), so neither the
  forward nor the backward ever holds more than one chunk's ``[chunk, V]`` logits; the full
  ``[B, T, V]`` float32 logits never exist. The swap goes through the model's own forward, so DDP,
  FSDP2 and PEFT wrappers see an ordinary forward.
- **Precision** (``train.precision``): ``bf16`` runs the forward under ``torch.autocast`` (bfloat16
  matmuls) while parameters, gradients and AdamW state stay in ``model.dtype``; everything after the
  head (temperature, log-softmax) is float32.
- **Packing** (``algo.pack_rows``): the rows of a micro-batch are concatenated into one sequence
  with position ids restarting at 0 for every row and no attention mask; transformers (>= 4.53,
  ``masking_utils.find_packed_sequence_indices``) turns restarting position ids into a
  block-diagonal causal mask for the sdpa, eager and flex implementations, and into varlen kernels
  for flash-attention.

Both rewritten paths are compared once per model against the plain full-logits path on a short
prefix of the first batch (:func:`verify_once`), so a model whose forward does something else (logit
soft-capping, scaling, an attention implementation that ignores packed position ids) is refused with a
:class:`~horizonrl.errors.ConfigError` instead of trained on silently.
"""

from __future__ import annotations

import contextlib
import os
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from horizonrl.errors import ConfigError, HorizonWarning
from horizonrl.inference import precision as inference_precision

PRECISIONS = ("fp32", "bf16")

#: Config attributes of models whose causal-LM forward transforms the head's output (soft-capping,
#: scaling): the chunked head would skip that, so such models are refused.
LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


@dataclass(frozen=True)
class ForwardOptions:
    """How the update computes per-token log-probs (``UpdateSettings.forward``).

    ``chunk_tokens``: positions per LM-head chunk (0 = the plain full-logits path); ``pack``: one
    packed sequence per micro-batch; ``precision``: ``'fp32'`` or ``'bf16'`` (autocast); ``tree``:
    rows that share a token prefix forward it once (``train/update/prefix.py``) where that pays.
    """

    chunk_tokens: int = 0
    pack: bool = False
    precision: str = "fp32"
    tree: bool = False

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision={self.precision!r}: must be one of {list(PRECISIONS)}")
        if self.chunk_tokens < 0:
            raise ValueError(f"chunk_tokens={self.chunk_tokens!r}: must be >= 0")

    @property
    def rewritten(self) -> bool:
        """Whether the forward goes through :func:`lean_logprobs` (chunked or packed)."""
        return self.chunk_tokens > 0 or self.pack


def autocast(precision: str, device: torch.device | str):
    """``torch.autocast`` to bfloat16 for ``precision='bf16'``; a null context for ``'fp32'``."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


def warn_emulated_bf16(precision: str, device: torch.device | str) -> None:
    """Warn when ``train.precision=bf16`` runs on a CPU without bf16 units (``amx_bf16`` /
    ``avx512_bf16``): torch emulates bf16 matrix products there, and the update's forward and backward
    under autocast ran 25x slower than in float32 on such a CPU (SmolLM2's shape, 2 AVX2 cores)."""
    if precision != "bf16" or torch.device(device).type != "cpu" or inference_precision.cpu_has_bf16_units():
        return
    warnings.warn(
        "train.precision=bf16 on a CPU without bf16 units (no amx_bf16 / avx512_bf16 in /proc/cpuinfo): "
        "torch emulates bf16 matrix products there, and the update runs many times slower than in float32 "
        "(25x measured for SmolLM2 on AVX2 cores); set train.precision=fp32 (and "
        "inference.params.dtype=float32) on this machine",
        HorizonWarning,
        stacklevel=2,
    )


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module that owns the LM head: ``DDP(model).module``; FSDP2 and PEFT models are themselves."""
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


def _fields(opts: ForwardOptions) -> str:
    parts = []
    if opts.chunk_tokens:
        parts.append(f"train.logprob_chunk_tokens={opts.chunk_tokens}")
    if opts.pack:
        parts.append("algo.pack_rows=true")
    return " / ".join(parts)


def output_head(model: torch.nn.Module, opts: ForwardOptions) -> torch.nn.Module:
    """The LM head of ``model`` (tied or not), or a ConfigError naming the settings that need it."""
    inner = unwrap(model)
    get = getattr(inner, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if head is None or not callable(getattr(inner, "set_output_embeddings", None)):
        raise ConfigError(
            f"{_fields(opts)}: {type(inner).__name__} has no output embeddings (get_output_embeddings / "
            "lm_head) to project hidden states through; set train.logprob_chunk_tokens=0 and "
            "algo.pack_rows=false"
        )
    cfg = getattr(inner, "config", None)
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    for name in LOGIT_POSTPROCESSING:
        v = getattr(text, name, None)
        if v is not None and not (name != "final_logit_softcapping" and v == 1):
            raise ConfigError(
                f"{_fields(opts)}: {type(inner).__name__} transforms its logits after the head "
                f"({name}={v!r}), which the chunked head does not reproduce; set "
                "train.logprob_chunk_tokens=0 and algo.pack_rows=false"
            )
    return head


class LogprobHead(torch.nn.Module):
    """Stands in for the LM head during one forward: ``hidden [.., H]`` -> ``[M]`` target log-probs.

    ``index`` picks the ``M`` target positions out of the flattened hidden states; ``targets`` and
    ``temps`` (or None: all 1) are per picked position. ``chunk`` positions at a time go through the
    real ``head``, each under non-reentrant checkpointing when gradients are on.
    """

    def __init__(self, head, index, targets, temps, chunk: int) -> None:
        super().__init__()
        self.head = head
        self.index, self.targets, self.temps, self.chunk = index, targets, temps, chunk

    @classmethod
    def of_batch(cls, head, batch, where: torch.Tensor, chunk: int, read: torch.Tensor | None = None):
        """The head reading a right-padded ``RowBatch``'s targets: row ``b``'s target ``j`` from the
        flattened hidden state ``where[b, j]`` (``where``: ``[B, T]``, ``T`` the longest row), at every
        target or, with ``read``, at those it marks. :meth:`scatter` puts the result back in place."""
        T = where.shape[1]
        valid = batch.attention_mask[:, 1:T].bool()  # target j exists iff token j + 1 does
        if read is not None:
            valid = valid & read[:, : T - 1]
        temps = batch.temperatures[:, : T - 1][valid]
        temps = temps if bool((temps != 1.0).any()) else None
        out = cls(head, where[:, : T - 1][valid], batch.targets[:, : T - 1][valid], temps, chunk)
        out.valid = valid
        return out

    def scatter(self, lp: torch.Tensor, width: int) -> torch.Tensor:
        """``lp`` (one log-prob per read target, from :meth:`of_batch`'s head) as ``[B, width]``, 0 at
        the positions not read."""
        B, n = self.valid.shape
        flat = torch.nonzero(self.valid.reshape(-1), as_tuple=True)[0]
        out = lp.new_zeros(B * n).index_put((flat,), lp).reshape(B, n)
        return F.pad(out, (0, width - n)) if width > n else out

    def _chunk(self, h: torch.Tensor, tgt: torch.Tensor, temp: torch.Tensor | None) -> torch.Tensor:
        logits = self.head(h).float()
        if temp is not None:
            logits = logits / temp.unsqueeze(-1)
        picked = torch.gather(logits, -1, tgt.unsqueeze(-1)).squeeze(-1)
        return picked - torch.logsumexp(logits, dim=-1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        h = hidden.reshape(-1, hidden.shape[-1]).index_select(0, self.index)
        m = h.shape[0]
        step = self.chunk or max(m, 1)
        grad = torch.is_grad_enabled()
        out = []
        for s in range(0, m, step):
            args = (
                h[s : s + step],
                self.targets[s : s + step],
                None if self.temps is None else self.temps[s : s + step],
            )
            if grad and self.chunk:
                out.append(checkpoint(self._chunk, *args, use_reentrant=False))
            else:
                out.append(self._chunk(*args))
        return torch.cat(out) if out else h.new_zeros(0, dtype=torch.float32)


def lean_logprobs(
    model: torch.nn.Module, batch, opts: ForwardOptions, *, read: torch.Tensor | None = None
) -> torch.Tensor:
    """``token_logprobs`` of a right-padded ``RowBatch`` through the chunked head and/or packed rows.

    Positions without a target (padding), and outside ``read`` when it is given, are 0; the rest equal
    the plain path to float rounding.
    """
    B, W = batch.targets.shape
    T = int(batch.attention_mask.sum(1).max())
    att = batch.attention_mask[:, :T].bool()
    if opts.pack:
        where = torch.cumsum(att.reshape(-1).long(), 0).reshape(B, T) - 1  # token's place in the packed row
        kwargs = {
            "input_ids": batch.input_ids[:, :T][att].unsqueeze(0),
            "position_ids": (torch.cumsum(att.long(), 1) - 1)[att].unsqueeze(0),
        }
    else:
        where = torch.arange(B * T, device=att.device).reshape(B, T)
        kwargs = {"input_ids": batch.input_ids[:, :T], "attention_mask": batch.attention_mask[:, :T]}
    inner = unwrap(model)
    head = output_head(model, opts)
    reader = LogprobHead.of_batch(head, batch, where, opts.chunk_tokens, read)
    inner.set_output_embeddings(reader)
    try:
        lp = model(**kwargs, use_cache=False).logits
    finally:
        inner.set_output_embeddings(head)
    return reader.scatter(lp, W)


#: Models (by object) and the option kinds already checked against the plain path.
_VERIFIED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def verify_once(
    model: torch.nn.Module,
    batch,
    opts: ForwardOptions,
    plain: Callable,
    *,
    tokens: int = 24,
    shared: Callable | None = None,
) -> None:
    """Compare :func:`lean_logprobs` with ``plain`` on the first two rows' first ``tokens`` tokens, once
    per model and option kind; a ConfigError when they differ by more than float rounding.

    ``shared`` (``shared(model, batch, opts)``: log-probs with the rows' common prefix forwarded once,
    ``prefix.shared_logprobs``): check that path instead, on the first row and a copy of it whose second
    half is reversed (two rows that share a prefix and then diverge).

    Runs without autocast and without gradients. The tolerance is 2e-3 nats for float32 parameters and
    5e-2 for 16-bit ones: a structural difference (logit post-processing, packed position ids ignored)
    on a real model is larger, but on a near-uniform random model it may stay under it.
    """
    key = (opts.chunk_tokens > 0, opts.pack and shared is None, shared is not None)
    try:
        done = _VERIFIED.setdefault(model, set())
    except TypeError:  # not weak-referenceable: check every call
        done = set()
    if key in done:
        return
    n = 1 if shared is not None else min(2, len(batch))
    L = min(tokens, int(batch.attention_mask[:n].sum(1).max()))
    if L < 2 or (opts.pack and n < 2 and shared is None):  # nothing to compare: check a later batch
        return
    W = batch.input_ids.shape[1]
    small = type(batch)(
        **{
            k: (v[:n, : (L if v.shape[1] == W else L - 1)] if v.dim() == 2 else v[:n])
            for k in batch.__dataclass_fields__
            for v in [getattr(batch, k)]
        }
    )
    if shared is not None:
        if L < 4:
            return
        small = type(small)(**{k: torch.cat([v, v]) for k, v in vars(small).items()})
        small.input_ids[1, L // 2 : L] = small.input_ids[1, L // 2 : L].flip(0)
        small.targets[1] = small.input_ids[1, 1:L]
    training = model.training
    try:
        with torch.no_grad(), torch.autocast(small.input_ids.device.type, enabled=False):
            model.eval()  # no dropout: both paths must see the same function
            ref = plain(model, small)
            small_opts = ForwardOptions(min(opts.chunk_tokens, 5), opts.pack and shared is None)
            got = (shared or lean_logprobs)(model, small, small_opts)
    finally:
        model.train(training)
    valid = small.attention_mask[:, 1:L].bool()
    diff = float((ref[:, : L - 1] - got[:, : L - 1])[valid].abs().max()) if bool(valid.any()) else 0.0
    dtype = next(unwrap(model).parameters()).dtype
    tol = 2e-3 if dtype in (torch.float32, torch.float64) else 5e-2
    if not diff <= tol:
        impl = getattr(getattr(unwrap(model), "config", None), "_attn_implementation", "?")
        what = "shared-prefix " if shared is not None else "packed " if opts.pack else ""
        fields = "algo.tree_training=auto" if shared is not None else _fields(opts)
        fix = (
            "algo.tree_training=off"
            if shared is not None
            else "train.logprob_chunk_tokens=0 and algo.pack_rows=false"
        )
        raise ConfigError(
            f"{fields}: the log-probs of {type(unwrap(model)).__name__} through the "
            f"{what}{'chunked ' if opts.chunk_tokens else ''}path differ from "
            f"its plain forward by {diff:.3g} nats (tolerance {tol:g}); the model's forward or attention "
            f"implementation ({impl}) does not support it: set {fix}"
        )
    done.add(key)


# ---------------------------------------------------------------------------------- micro-batch sizing

#: Bytes per token and vocabulary entry of the full-logits path in the backward: the float32 logits
#: (saved for logsumexp), logsumexp's ``exp`` term, gather's scattered gradient and their sum.
LOGIT_BYTES = 16
#: Process overhead (Python, torch, allocator slack) assumed by the estimate, in bytes.
OVERHEAD_BYTES = 1 << 30


def device_memory_bytes(device: torch.device | str) -> int:
    """Total memory of ``device``: the GPU's on CUDA, physical RAM otherwise."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.get_device_properties(dev).total_memory)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def update_memory_model(
    model: torch.nn.Module,
    *,
    precision: str = "fp32",
    chunk_tokens: int = 0,
    gradient_checkpointing: bool = False,
    frozen_copies: int = 0,
) -> tuple[int, int]:
    """``(fixed_bytes, bytes_per_token)`` of one update step (docs/scale.md gives the formula).

    fixed = P * b_p * (1 + frozen_copies) + P_train * 3 * b_p (gradients, AdamW m and v)
            + chunk * V * LOGIT_BYTES + OVERHEAD_BYTES
    layer     = 6H * b_p + (4H + 4I) * b_a       (saved activations of one decoder layer: its two norms,
                                                 the attention's and the MLP's tensors)
    per token = L * layer                        (every layer's activations)
             or L * H * b_p + layer              (gradient checkpointing: layer inputs + one layer)
             + V * LOGIT_BYTES                   (full logits; 0 with chunked log-probs)

    ``P`` parameters (``P_train`` trainable) of ``b_p`` bytes, ``b_a`` = 2 under bf16 autocast else
    ``b_p``; ``H``, ``I``, ``L``, ``V`` the hidden size, MLP width (4H if unknown), layers and vocabulary.
    Attention scores are not counted (sdpa / flash kernels keep them O(T) per token).
    """
    inner = unwrap(model)
    cfg = inner.config.get_text_config() if hasattr(inner.config, "get_text_config") else inner.config
    H, L, V = int(cfg.hidden_size), int(cfg.num_hidden_layers), int(cfg.vocab_size)
    width = getattr(cfg, "intermediate_size", None)
    I = int(width) if width else 4 * H  # noqa: E741 (the MLP width, as in the docs' formula)
    params = list(inner.parameters())
    b_p = params[0].element_size() if params else 4
    n_all = sum(p.numel() for p in params)
    n_train = sum(p.numel() for p in params if p.requires_grad)
    b_a = 2 if precision == "bf16" else b_p
    layer = 6 * H * b_p + (4 * H + 4 * I) * b_a
    fixed = n_all * b_p * (1 + frozen_copies) + n_train * 3 * b_p + OVERHEAD_BYTES
    per_token = (L * H * b_p + layer) if gradient_checkpointing else L * layer
    if chunk_tokens:
        fixed += chunk_tokens * V * LOGIT_BYTES
    else:
        per_token += V * LOGIT_BYTES
    return fixed, per_token


def auto_micro_batch_tokens(model: torch.nn.Module, memory_gb: float | None, *, device="cpu", **kw) -> int:
    """``algo.micro_batch_tokens`` for ``algo.micro_batch_tokens: 0``: the largest multiple of 64 with
    ``fixed + tokens * per_token <= memory`` (:func:`update_memory_model`); ``memory`` is
    ``train.memory_gb`` GiB, or 80 % of the device's memory when it is null."""
    fixed, per_token = update_memory_model(model, **kw)
    budget = memory_gb * 2**30 if memory_gb is not None else 0.8 * device_memory_bytes(device)
    tokens = int((budget - fixed) // per_token) // 64 * 64
    if tokens < 64:
        raise ConfigError(
            f"algo.micro_batch_tokens=0: the memory budget ({budget / 2**30:.1f} GiB, train.memory_gb) does "
            f"not fit 64 tokens: weights, gradients and optimizer state take {fixed / 2**30:.1f} GiB and "
            f"each token ~{per_token / 2**20:.2f} MiB; raise train.memory_gb, or set "
            "train.logprob_chunk_tokens, train.precision=bf16 or train.gradient_checkpointing"
        )
    return min(tokens, 2**26)


def resolve_micro_batch_tokens(cfg, model: torch.nn.Module, device, *, frozen_copies: int = 0) -> int:
    """``cfg.algo.micro_batch_tokens``, or for 0 the estimate of :func:`auto_micro_batch_tokens` under
    the run's ``train.precision``, ``train.logprob_chunk_tokens`` and ``train.gradient_checkpointing``."""
    if cfg.algo.micro_batch_tokens:
        return cfg.algo.micro_batch_tokens
    t = cfg.train
    return auto_micro_batch_tokens(
        model,
        t.memory_gb,
        device=device,
        precision=t.precision,
        chunk_tokens=t.logprob_chunk_tokens,
        gradient_checkpointing=t.gradient_checkpointing,
        frozen_copies=frozen_copies,
    )


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """transformers' (non-reentrant) activation checkpointing of every decoder layer of ``model``."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x; the old name warns
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise ConfigError(
            f"train.gradient_checkpointing=true: {type(model).__name__} has no gradient_checkpointing_enable"
        )
