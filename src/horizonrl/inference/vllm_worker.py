"""vLLM worker extension: in-place weight reloads (``worker_extension_cls`` of :mod:`vllm_engine`).

vLLM mixes this class into its worker (in the worker process, so it must be
importable there: a package module is). The engine calls its methods by name
through ``LLM.collective_rpc``, which needs no pickled callables::

    llm.collective_rpc("horizonrl_reload_weights", args=(path,))

``horizonrl_bus_join`` / ``horizonrl_reload_from_bus`` are the file-free route
(``weight_sync: collective``, :mod:`horizonrl.inference.weight_bus`): the same load, fed
from a gloo broadcast instead of a file.

``horizonrl_reload_weights`` streams a safetensors file (Hugging Face
parameter names) through ``model_runner.reload_weights`` (vLLM's layer-wise
in-place reload, which re-runs each layer's kernel repacking), then refreshes a
tied output head. Why these routes (vLLM 0.32, measured on CPU):

- tensors passed inside ``collective_rpc`` kwargs go through msgpack and arrive
  as lists, so the weights travel as a file or over a process group of their own;
- a plain ``model.load_weights`` fails on CPU: the CPU backend repacks linear
  weights (oneDNN) and drops the original parameters;
- with tied embeddings (the tiny model, SmolLM2, Qwen2.5-0.5B/1.5B) the CPU
  ``ParallelLMHead`` keeps its own packed copy of the embedding that the reload
  does not refresh (``lm_head.weight`` is skipped as tied), so the logits kept
  using the old head (max |Δlogp| 0.78 on SmolLM2); re-running the head's
  ``process_weights_after_loading`` fixes it (3e-5).
"""

from __future__ import annotations

__all__ = ["WeightSyncExtension"]


class WeightSyncExtension:
    """Methods added to vLLM's worker (``self`` is the worker; ``self.model_runner`` its runner)."""

    def _horizonrl_refresh_tied_head(self) -> bool:
        """Re-pack a tied output head on CPU; returns whether the model ties its head."""
        from vllm.platforms import current_platform

        model = self.model_runner.get_model()
        head = getattr(model, "lm_head", None)
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)
        weight = getattr(head, "weight", None)
        if weight is None or embed is None or weight is not getattr(embed, "weight", None):
            return False
        method = getattr(head, "quant_method", None)
        if current_platform.is_cpu() and method is not None:
            method.process_weights_after_loading(head)
        return True

    def horizonrl_reload_weights(self, path: str) -> dict:
        """Load every tensor of the safetensors file ``path`` in place; returns what was done."""
        from safetensors import safe_open

        names: list[str] = []

        def tensors():
            with safe_open(path, framework="pt", device="cpu") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    names.append(name)
                    yield name, f.get_tensor(name)

        self.model_runner.reload_weights(weights_iterator=tensors(), is_checkpoint_format=True)
        return {"tensors": len(names), "tied_head": self._horizonrl_refresh_tied_head()}

    def horizonrl_bus_join(self, host: str, port: int, world: int, timeout_s: float) -> int:
        """Join the trainer's weight group (:mod:`horizonrl.inference.weight_bus`) as ``1 + rank``."""
        import datetime

        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=timeout_s)
        rank = 1 + int(getattr(self, "rank", 0) or 0)
        store = dist.TCPStore(host, int(port), int(world), False, timeout=timeout)
        self._horizonrl_group = dist.ProcessGroupGloo(store, rank, int(world), timeout)
        self._horizonrl_store = store
        return rank

    def horizonrl_reload_from_bus(self, manifest: list) -> dict:
        """Receive every tensor of ``manifest`` (``[name, shape, dtype]``, in the trainer's order) from
        the weight group and load it in place, as :meth:`horizonrl_reload_weights` loads a file."""
        import torch

        group = self._horizonrl_group

        def tensors():
            for name, shape, dtype in manifest:
                buf = torch.empty([int(n) for n in shape], dtype=getattr(torch, dtype))
                group.broadcast(buf, 0).wait()
                yield name, buf

        stream = tensors()
        try:
            self.model_runner.reload_weights(weights_iterator=stream, is_checkpoint_format=True)
        finally:
            for _ in stream:  # the trainer sends every tensor: receive what the loader did not ask for
                pass
        return {"tensors": len(manifest), "tied_head": self._horizonrl_refresh_tied_head()}

    def horizonrl_param_sum(self) -> float:
        """Sum of all parameters in float64 (a cheap check that an update arrived)."""
        model = self.model_runner.get_model()
        return float(sum(p.detach().double().sum().item() for p in model.parameters() if p.numel()))
