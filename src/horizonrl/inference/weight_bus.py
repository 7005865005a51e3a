"""Weight sync to vLLM without a file: a process group between the trainer and vLLM's workers.

``inference.params.weight_sync: collective`` (:class:`~horizonrl.inference.vllm_engine.VLLMEngine`)
sends each update's weights as tensors over a gloo process group instead of writing one safetensors
file per step (the ``file`` route, the default). The group is set up once, at the first sync, the way
verl, OpenRLHF and slime connect a trainer to its rollout workers:

- the trainer hosts a ``TCPStore`` on 127.0.0.1 (a free port) and is rank 0; each vLLM worker joins as
  rank ``1 + its rank`` (``horizonrl_bus_join``, a worker-extension method called through
  ``LLM.collective_rpc``) — a group of its own, apart from vLLM's;
- a sync sends the *manifest* (names, shapes, dtypes: small, so it travels inside the RPC) and then
  broadcasts every tensor from rank 0 in that order, while the workers receive each one into a fresh
  buffer and feed it to ``model_runner.reload_weights`` as the file route does
  (``horizonrl_reload_from_bus``), so both routes load identical weights (tests compare them).

The RPC blocks until the workers finish, so it runs on a helper thread while this thread broadcasts.
Tensors that share storage (tied embeddings) are sent once, as the file route writes them once. gloo
stages GPU tensors through host memory: on a GPU the transfer avoids the file and its page cache, not
the host copy (an NCCL group would avoid that too; it is not built here). A worker that fails mid-way
makes the broadcast time out after ``timeout_s`` and the error is raised here.
"""

from __future__ import annotations

import datetime
import socket
import threading
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["WeightBus", "manifest_of", "unique_tensors"]

#: How long a broadcast or the group's setup waits for the other side.
DEFAULT_TIMEOUT_S = 300.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def unique_tensors(state_dict: Mapping[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """``state_dict`` as sent to vLLM (either route): CPU, contiguous, floating point in ``dtype``; a
    tensor that shares storage with an earlier one (tied embeddings) is left out."""
    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for name, t in state_dict.items():
        ptr = t.data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        t = t.detach()
        out[name] = (t.to(dtype) if t.is_floating_point() else t).contiguous().cpu()
    return out


def manifest_of(
    state_dict: Mapping[str, torch.Tensor], dtype: torch.dtype
) -> tuple[list[list[Any]], list[torch.Tensor]]:
    """``([name, shape, dtype name], ...)`` and the tensors to send (CPU, contiguous, floating point
    in ``dtype``), in the order of their names; a tensor that shares storage with an earlier one is left
    out (sent once). This is the file route's content and order (``write_weights`` drops shared tensors
    the same way, and a safetensors file lists its tensors by name), so that even a state dict that
    gives a tied model's two names different values loads the same way by both routes."""
    kept = unique_tensors(state_dict, dtype)
    names = sorted(kept)
    manifest = [[n, list(kept[n].shape), str(kept[n].dtype).removeprefix("torch.")] for n in names]
    return manifest, [kept[n] for n in names]


class WeightBus:
    """The trainer's end of the group (see the module docstring); ``llm`` is a ``vllm.LLM`` whose
    workers carry :class:`~horizonrl.inference.vllm_worker.WeightSyncExtension`."""

    def __init__(self, llm, *, workers: int = 1, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.llm = llm
        self.world = 1 + int(workers)
        self.timeout = datetime.timedelta(seconds=float(timeout_s))
        self._store = None
        self._group = None

    def _rpc_in_thread(self, method: str, args: tuple) -> tuple[threading.Thread, dict[str, Any]]:
        box: dict[str, Any] = {}

        def call():
            try:
                box["result"] = self.llm.collective_rpc(method, args=args)
            except BaseException as e:  # re-raised on the caller's thread
                box["error"] = e

        thread = threading.Thread(target=call, name=f"horizonrl-{method}", daemon=True)
        thread.start()
        return thread, box

    def _finish(self, thread: threading.Thread, box: dict[str, Any], what: str) -> Any:
        thread.join(self.timeout.total_seconds())
        if thread.is_alive():
            raise TimeoutError(f"weight sync: vLLM's workers did not finish {what} in {self.timeout}")
        if "error" in box:
            raise RuntimeError(f"weight sync: {what} failed in vLLM's worker: {box['error']}") from box[
                "error"
            ]
        return box.get("result")

    def open(self) -> None:
        """Create the group (once): host the store, let the workers join, join as rank 0."""
        if self._group is not None:
            return
        import torch.distributed as dist

        port = _free_port()
        thread, box = self._rpc_in_thread(
            "horizonrl_bus_join", ("127.0.0.1", port, self.world, self.timeout.total_seconds())
        )
        try:
            self._store = dist.TCPStore("127.0.0.1", port, self.world, True, timeout=self.timeout)
            self._group = dist.ProcessGroupGloo(self._store, 0, self.world, self.timeout)
        finally:
            self._finish(thread, box, "joining the weight group")

    def send(self, state_dict: Mapping[str, torch.Tensor], dtype: torch.dtype) -> int:
        """Load ``state_dict`` (HF names) into the workers; returns the bytes sent."""
        self.open()
        manifest, tensors = manifest_of(state_dict, dtype)
        thread, box = self._rpc_in_thread("horizonrl_reload_from_bus", (manifest,))
        try:
            for t in tensors:
                self._group.broadcast(t, 0).wait()
        finally:
            self._finish(thread, box, "loading the weights")
        return sum(t.numel() * t.element_size() for t in tensors)

    def close(self) -> None:
        self._group = None
        self._store = None
