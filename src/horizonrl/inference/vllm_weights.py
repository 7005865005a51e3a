"""Weights into a running vLLM engine: the weight-sync half of
:class:`~horizonrl.inference.vllm_engine.VLLMEngine` (module docstring there, "Weight sync in place",
"LoRA").

Full weights reach vLLM's workers through one safetensors file (``weight_sync: file``, the default:
:func:`write_weights` into ``/dev/shm`` when it has room, then the worker extension's reload) or over a
gloo group of their own (``weight_sync: collective``, :mod:`horizonrl.inference.weight_bus`). A LoRA
policy sends its adapters only, in peft's format, reloaded in place. An engine with a ``source``
(the training model) skips a sync when no parameter changed since the last one (torch's in-place
version counters, :func:`weights_version`). This module imports vLLM only inside the LoRA reload.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import torch

from horizonrl.models import lora as lora_utils

__all__ = ["WEIGHT_SYNC_ROUTES", "WeightSync", "lora_engine_kwargs", "weights_version", "write_weights"]

#: The ranks vLLM's ``max_lora_rank`` accepts (vLLM 0.32).
_VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
#: Name and id of the one adapter a LoRA policy's engine serves.
_LORA_NAME, _LORA_ID = "horizonrl-policy", 1


def weights_version(model: torch.nn.Module) -> tuple[int, ...]:
    """Torch's in-place version counter of every parameter: changes whenever one is modified."""
    return tuple(int(getattr(p, "_version", -1)) for p in model.parameters())


def write_weights(state_dict: Mapping[str, torch.Tensor], path: str | Path, dtype: torch.dtype) -> int:
    """Write ``state_dict`` (HF names) as one safetensors file in ``dtype``; returns the bytes written.

    Tensors that share storage (tied embeddings) are written once, under the first name.
    """
    from safetensors.torch import save_file

    from horizonrl.inference.weight_bus import unique_tensors

    out = unique_tensors(state_dict, dtype)
    save_file(out, str(path))
    return sum(t.numel() * t.element_size() for t in out.values())


#: ``inference.params.weight_sync`` values (VLLMEngine).
WEIGHT_SYNC_ROUTES = ("file", "collective")


def _scratch_dir(nbytes: int) -> Path:
    """Where weight files go: ``/dev/shm`` (RAM) when it has twice the room, else the temp dir."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 2 * nbytes:
        return shm
    return Path(tempfile.gettempdir())


def lora_engine_kwargs(model, model_dir: str) -> tuple[dict, Path | None]:
    """``vllm.LLM`` keywords for a LoRA policy (``enable_lora`` and the smallest vLLM rank >= r) and the
    adapter directory its syncs write, made under ``model_dir`` with the adapter config; ``({}, None)``
    for a plain model or a model directory."""
    if isinstance(model, str | os.PathLike) or not lora_utils.is_lora(model):
        return {}, None
    rank = int(model.peft_config[lora_utils.ADAPTER].r)
    fits = [r for r in _VLLM_LORA_RANKS if r >= rank]
    if not fits:
        raise ValueError(f"model.lora_r={rank}: vLLM serves LoRA ranks up to {_VLLM_LORA_RANKS[-1]}")
    lora_dir = Path(model_dir) / "adapter"  # not read as model weights: vLLM globs the top
    lora_dir.mkdir()
    model.peft_config[lora_utils.ADAPTER].save_pretrained(str(lora_dir))
    return {"enable_lora": True, "max_lora_rank": fits[0], "max_loras": 1}, lora_dir


class WeightSync:
    """The weight-sync methods of :class:`~horizonrl.inference.vllm_engine.VLLMEngine` (module docstring),
    on the engine's state: ``llm``, ``dtype``, ``weight_sync``, ``_source`` / ``_version`` / ``_weights``,
    ``_lora_dir`` / ``_lora_request``, ``_asleep``, ``_bus`` and the sync counters."""

    def sync(self, state_dict: Mapping | None = None) -> None:
        """Load new weights in place and reset the prefix cache.

        ``state_dict`` (HF names) is loaded as given; ``None`` pulls ``source``'s current weights,
        unless none of its parameters changed since the last sync (then nothing is sent), and is
        a no-op without a source.
        """
        if state_dict is None:
            if self._source is None:
                return
            version = weights_version(self._source)
            if version == self._version and self._asleep < 2:
                return
            state_dict = self._source.state_dict()
        else:
            version = None
        self._load(state_dict)
        if self._source is not None:
            self._version = version if version is not None else weights_version(self._source)
        else:
            self._weights = {k: v.detach().to("cpu", copy=True) for k, v in state_dict.items()}

    def _load(self, state_dict: Mapping) -> None:
        if self._lora_dir is not None:
            self._load_adapter(state_dict)
            return
        t = time.perf_counter()
        self._write_weights(state_dict)
        self.llm.reset_prefix_cache()
        self.syncs += 1
        self.last_sync_s = time.perf_counter() - t

    def _load_adapter(self, state_dict: Mapping, *, count: bool = True) -> None:
        """A LoRA policy's weights (``state_dict`` with its adapter names): the adapters written in
        peft's format and reloaded in place; the base too when a level-2 sleep discarded it."""
        from vllm.lora.request import LoRARequest

        t = time.perf_counter()
        llm = self.llm
        if self._asleep == 2:
            self._write_weights(lora_utils.plain_state_dict(state_dict))
        elif self._asleep:
            llm.wake_up()
            self._asleep = 0
        tensors = {
            k: (v.detach().to(self.dtype) if v.is_floating_point() else v.detach()).contiguous().cpu()
            for k, v in lora_utils.adapter_tensors(state_dict).items()
        }
        if not tensors:
            raise ValueError("VLLMEngine.sync: the state dict holds no LoRA adapter weights")
        from safetensors.torch import save_file

        save_file(tensors, str(self._lora_dir / lora_utils.ADAPTER_WEIGHTS), metadata={"format": "pt"})
        request = LoRARequest(_LORA_NAME, _LORA_ID, str(self._lora_dir), load_inplace=True)
        llm.llm_engine.add_lora(request)  # reads the files now: the next sync may overwrite them
        self._lora_request = LoRARequest(_LORA_NAME, _LORA_ID, str(self._lora_dir))
        llm.reset_prefix_cache()
        self.syncs += int(count)
        self.last_sync_bytes = sum(v.numel() * v.element_size() for v in tensors.values())
        self.last_sync_s = time.perf_counter() - t

    def _write_weights(self, state_dict: Mapping) -> None:
        """Send full weights (HF names) to vLLM, waking a sleeping engine: through one safetensors file,
        or over the weight group (``weight_sync: collective``)."""
        llm = self.llm
        if self._asleep:
            llm.wake_up(tags=["weights"])
        if self.weight_sync == "collective":
            if self._bus is None:
                from horizonrl.inference.weight_bus import WeightBus

                self._bus = WeightBus(llm, workers=self._workers())
            self.last_sync_bytes = self._bus.send(state_dict, self.dtype)
        else:
            nbytes = sum(v.numel() * self.dtype.itemsize for v in state_dict.values())
            fd, path = tempfile.mkstemp(
                prefix="horizonrl-weights-", suffix=".safetensors", dir=_scratch_dir(nbytes)
            )
            os.close(fd)
            try:
                self.last_sync_bytes = write_weights(state_dict, path, self.dtype)
                llm.collective_rpc("horizonrl_reload_weights", args=(path,))
            finally:
                os.remove(path)
        if self._asleep:
            llm.wake_up(tags=["kv_cache"])
            self._asleep = 0

    def _workers(self) -> int:
        """vLLM's worker processes (tensor x pipeline parallel size)."""
        par = self.llm.llm_engine.vllm_config.parallel_config
        return int(par.tensor_parallel_size) * int(par.pipeline_parallel_size)

    def state_dict(self) -> Mapping[str, torch.Tensor]:
        """The weights the engine samples from (the source's at the last sync, or the kept copy)."""
        if self._weights is not None:
            return self._weights
        if self._source is not None:
            return self._source.state_dict()
        raise RuntimeError("VLLMEngine.state_dict: built from a directory and never synced")

    def param_sum(self) -> float:
        """Sum of the engine's parameters as vLLM holds them (float64; a check that a sync arrived)."""
        self._wake()
        return float(self.llm.collective_rpc("horizonrl_param_sum")[0])
