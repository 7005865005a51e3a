"""vLLM rollout engine (``inference.engine: vllm``; docs/design.md, "Engines").

:class:`VLLMEngine` runs a ``vllm.LLM`` over its own copy of the policy, in
vLLM's engine processes, and implements :class:`~horizonrl.inference.base.Engine`
with the semantics of the embedded :class:`~horizonrl.inference.hf.HFEngine`:

- **Token ids only.** Prompts go in as ``TokensPrompt`` and vLLM never sees text
  (``skip_tokenizer_init``): vLLM's ``AutoTokenizer`` encodes the tiny model's
  text differently from horizonrl's tokenizer.
- **Log-probs** are those of the sampled token under ``log_softmax(logits / T)``
  over the full vocabulary (``logprobs_mode="processed_logprobs"``; the default
  ``raw_logprobs`` ignores the temperature); greedy reports temperature-1
  log-probs. *Difference from HFEngine:* with ``top_p < 1`` vLLM renormalises
  over the nucleus, so each log-prob is HFEngine's minus ``log(nucleus mass)``
  (the sampling distribution's own log-prob, ``>=`` the full-vocabulary one);
  the training model recomputes full-vocabulary log-probs, so use
  ``algo.old_logprobs: recompute`` with ``top_p < 1`` (a warning says so once).
- **score()** uses prompt log-probs (``prompt_logprobs=0``, temperature 1).
- **Stops:** eos ids (the tokenizer's, generation config's and model config's, as
  HFEngine; public ``eos_ids``) are vLLM ``stop_token_ids`` and kept in ``ids``.
  Stop strings are matched on horizonrl's tokenizer after generation (the
  request runs to eos or ``max_new_tokens``, then is cut after the token that
  completes the string, exactly where HFEngine stops).
- **Seeds:** every sampled request gets a seed drawn from the engine's
  ``torch.Generator`` (``set_seed`` / ``rng_state`` / ``set_rng_state``), so a
  run resumed from a checkpoint draws the same seeds. vLLM's CPU sampler
  (Gumbel-max, SplitMix64) and its GPU sampler draw different tokens for a seed.
- **Constrained decoding** (``SamplingParams.grammar``, an llguidance Lark grammar) goes through
  vLLM's structured outputs (``StructuredOutputsParams(grammar=...)``, backend ``guidance``, i.e.
  llguidance, the library the HF engine uses) when the engine is built with
  ``structured_outputs=True``: vLLM then loads the tokenizer (saved next to the weights) instead of
  ``skip_tokenizer_init``, which structured outputs need. Off by default, so training engines start
  exactly as before. The grammar cannot be resumed in a later call (``supports_grammar_resume`` is
  False): the serving scheduler runs constrained rows whole.
- **Prefix caching** is on (RTPO siblings and repeated contexts reuse KV blocks);
  the cache is reset after every weight sync.
- **LoRA** (a policy with adapters, ``model.lora_r > 0``): vLLM loads the frozen base once
  and the adapters through its LoRA support (``enable_lora``, ``max_lora_rank`` the smallest
  vLLM rank >= r); every request runs with that adapter (``LoRARequest``), and a sync writes the
  adapters only (peft's ``adapter_model.safetensors``, a few MB) and reloads them in place
  (``load_inplace``) instead of the whole state dict.
- **Weight sync in place** (:meth:`VLLMEngine.sync`): the state dict is written as
  one safetensors file (``/dev/shm`` when it has room) and loaded by the worker
  extension :class:`~horizonrl.inference.vllm_worker.WeightSyncExtension`
  (``model_runner.reload_weights`` plus the tied-head refresh); with
  ``weight_sync="collective"`` the tensors are broadcast to the workers over a gloo
  group of their own instead (:mod:`~horizonrl.inference.weight_bus`), no file. An engine built
  with ``source=model`` (``make_engine(..., shared=True)``) pulls the training
  model's current weights on ``sync()`` and skips the transfer when no parameter
  was modified since the last one (torch's in-place version counters).
- **Sleep/wake** (``sleep_level`` 1 or 2): :meth:`sleep` before the update frees
  the engine's GPU memory for a colocated trainer, the next ``sync``/``generate``
  wakes it (level 2 discards the weights, so waking re-sends them). On CPU vLLM
  refuses ``enable_sleep_mode`` but accepts the calls and frees nothing.
- **Processes:** :meth:`close` (also on garbage collection and at exit) stops
  vLLM's engine-core and worker processes and unlinks their ``/dev/shm`` queues;
  if this process is killed first, :mod:`~horizonrl.inference.vllm_reaper` (a
  small process blocked on a pipe from this one) stops them and unlinks the queues.
- **GPU:** CUDA graphs unless ``enforce_eager`` (default: eager on CPU only),
  ``dtype`` (default: the model's; ``bfloat16`` on GPU is the usual choice, but
  bf16 log-probs differ from a float32 trainer's by ~5e-3 per token, so a
  1e-3 ratio check only holds in float32), ``gpu_memory_utilization`` (default
  0.4, leaving room for a colocated trainer). On CPU the KV cache size is
  ``kv_cache_memory_bytes`` (default 1 GiB; vLLM's ``gpu_memory_utilization``
  means host RAM there).

Every keyword of ``inference.params`` not listed in :class:`VLLMEngine` goes to
``vllm.LLM``. Call :meth:`close` (or let the trainer do it) to stop the engine
processes; an idle engine's worker still polls its queue (8-26 % of a core).
"""

from __future__ import annotations

import logging
import os

# Before vLLM is imported (its spawned processes inherit these): nothing leaves the machine.
for _key, _value in {
    "VLLM_HOST_IP": "127.0.0.1",  # else vLLM finds its address by connecting a UDP socket to 8.8.8.8
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_DO_NOT_TRACK": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_LOGGING_LEVEL": "ERROR",
}.items():
    os.environ.setdefault(_key, _value)

import functools  # noqa: E402
import gc  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import weakref  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from horizonrl.inference.base import Engine, Generation, SamplingParams  # noqa: E402
from horizonrl.inference.registry import register_engine  # noqa: E402
from horizonrl.inference.seeding import draw_seeds  # noqa: E402
from horizonrl.inference.stops import as_id_set, first_stop  # noqa: E402
from horizonrl.inference.vllm_procs import (  # noqa: E402
    descendants,
    engine_processes,
    shm_segments,
    shutdown,
    start_reaper,
)
from horizonrl.inference.vllm_stream import VLLMStream  # noqa: E402
from horizonrl.inference.vllm_weights import (  # noqa: E402
    WEIGHT_SYNC_ROUTES,
    WeightSync,
    lora_engine_kwargs,
    weights_version,
    write_weights,
)
from horizonrl.models import lora as lora_utils  # noqa: E402

try:  # the registry turns an ImportError into "install horizonrl[vllm]"
    import vllm
    from vllm.inputs import TokensPrompt
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(f"vllm is not installed ({e})") from e

__all__ = ["VLLMEngine", "write_weights"]

log = logging.getLogger(__name__)

WORKER_EXTENSION = "horizonrl.inference.vllm_worker.WeightSyncExtension"
_CPU_KV_BYTES = 2**30
_GPU_MEMORY_UTILIZATION = 0.4


def _dtype_name(dtype: torch.dtype | str) -> str:
    return str(dtype).removeprefix("torch.")


def _stage_model(model, model_dir: str):
    """Put ``model`` where vLLM loads it (``model_dir``): a model directory's files copied, a LoRA
    policy's frozen base as a plain model (the adapters come later), any other model saved; returns
    ``(config, dtype, generation config)`` of what was staged."""
    if isinstance(model, str | os.PathLike):
        src = Path(model)
        for f in src.iterdir():
            if f.is_file():
                shutil.copy2(f, model_dir)
        from transformers import AutoConfig, GenerationConfig

        config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
        try:
            gen_config = GenerationConfig.from_pretrained(model_dir, local_files_only=True)
        except OSError:
            gen_config = None
        model_dtype = getattr(config, "torch_dtype", None) or getattr(config, "dtype", None)
        return config, model_dtype, gen_config
    if lora_utils.is_lora(model):  # the frozen base as a plain model; the adapters come later
        lora_utils.save_base(model, model_dir)
    else:
        model.save_pretrained(model_dir, safe_serialization=True)
    return model.config, model.dtype, getattr(model, "generation_config", None)


def _memory_kwargs(
    cpu: bool, kv_cache_memory_bytes: int | None, gpu_memory_utilization: float | None
) -> dict:
    """``vllm.LLM``'s memory keywords: on CPU the KV cache size (default 1 GiB); on GPU the fraction of
    memory vLLM may use (default 0.4) and the KV cache size when given."""
    if cpu:
        return {"kv_cache_memory_bytes": int(kv_cache_memory_bytes or _CPU_KV_BYTES)}
    out = {}
    if kv_cache_memory_bytes is not None:
        out["kv_cache_memory_bytes"] = int(kv_cache_memory_bytes)
    out["gpu_memory_utilization"] = float(gpu_memory_utilization or _GPU_MEMORY_UTILIZATION)
    return out


class VLLMEngine(WeightSync, Engine):
    """A ``vllm.LLM`` behind the Engine interface (behaviour: the module docstring).

    Args:
        model: a ``transformers`` causal LM (saved to a temporary directory for vLLM to load)
            or the path of a Hugging Face model directory.
        tokenizer: its tokenizer (eos ids, stop strings, ``Generation.text``); may be None.
        seed: seed of the engine RNG that draws each request's sampling seed.
        max_batch_size: vLLM's ``max_num_seqs`` (sequences decoded together).
        source: the training model: ``sync()`` without arguments pulls its current weights.
        dtype: vLLM's parameter dtype (default: the model's).
        enforce_eager: no CUDA graphs / torch.compile (default: True on CPU, False on GPU).
        kv_cache_memory_bytes: KV cache size (default 1 GiB on CPU; on GPU vLLM's profile).
        gpu_memory_utilization: fraction of GPU memory vLLM may use (GPU only; default 0.4).
        max_model_len: longest prompt + generation (default: the model's position limit).
        sleep_level: 0 (never sleep), 1 (``sleep`` offloads weights, drops the KV cache) or 2
            (drops both; the next sync re-sends the weights). Needs vLLM's sleep mode (GPU).
        enable_prefix_caching: reuse KV blocks of shared prefixes (default True).
        structured_outputs: honour ``SamplingParams.grammar`` through vLLM's structured outputs
            (backend ``guidance``; needs ``tokenizer``; default False).
        **llm_kwargs: passed to ``vllm.LLM``.
    """

    supports_grammar_resume = False
    supports_seeds = True

    def __init__(
        self,
        model,
        tokenizer=None,
        *,
        seed: int = 0,
        max_batch_size: int = 64,
        source: torch.nn.Module | None = None,
        dtype: str | None = None,
        enforce_eager: bool | None = None,
        kv_cache_memory_bytes: int | None = None,
        gpu_memory_utilization: float | None = None,
        max_model_len: int | None = None,
        sleep_level: int = 0,
        enable_prefix_caching: bool = True,
        structured_outputs: bool = False,
        weight_sync: str = "file",
        **llm_kwargs,
    ):
        from vllm.platforms import current_platform

        if weight_sync not in WEIGHT_SYNC_ROUTES:
            raise ValueError(
                f"inference.params.weight_sync={weight_sync!r}: must be one of {list(WEIGHT_SYNC_ROUTES)}"
            )
        #: How full weights reach vLLM: ``file`` (one safetensors file per sync) or ``collective``
        #: (a gloo broadcast to the workers, :mod:`horizonrl.inference.weight_bus`).
        self.weight_sync = weight_sync
        self._bus = None

        if structured_outputs and tokenizer is None:
            raise ValueError("VLLMEngine(structured_outputs=True) needs the tokenizer")
        #: Whether ``generate`` honours ``SamplingParams.grammar`` (``structured_outputs=True``).
        self.supports_grammar = bool(structured_outputs)
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if sleep_level not in (0, 1, 2):
            raise ValueError(f"inference.params.sleep_level={sleep_level!r}: must be 0, 1 or 2")
        self.tokenizer = tokenizer
        self.cpu = current_platform.is_cpu()
        self._dir = tempfile.mkdtemp(prefix="horizonrl-vllm-")
        config, model_dtype, gen_config = _stage_model(model, self._dir)
        if structured_outputs:  # vLLM's guidance backend builds its token masks from this tokenizer
            tokenizer.save_pretrained(self._dir)
        self.dtype = getattr(torch, _dtype_name(dtype or model_dtype or "float32"))
        eos = as_id_set(getattr(tokenizer, "eos_token_id", None))
        eos |= as_id_set(getattr(gen_config, "eos_token_id", None))
        #: Token ids that end a generation (as HFEngine's); public, may be replaced.
        self.eos_ids = frozenset(eos or as_id_set(getattr(config, "eos_token_id", None)))
        self.max_model_len = int(max_model_len or getattr(config, "max_position_embeddings", 2048))
        self.sleep_level = sleep_level
        self._asleep = 0
        self._source = source
        self._version = weights_version(source) if source is not None else None
        #: A CPU copy of the weights the engine samples from, kept when there is no ``source``.
        self._weights = None
        if source is None and not isinstance(model, str | os.PathLike):
            self._weights = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        self._generator = torch.Generator()
        self.set_seed(seed)
        self.syncs, self.last_sync_s = 0, 0.0
        #: Bytes the last sync wrote (the adapters only for a LoRA policy).
        self.last_sync_bytes = 0
        self._warned_top_p = False
        lora_kwargs, lora_dir = lora_engine_kwargs(model, self._dir)
        #: The adapter directory of a LoRA policy (None: full weights); ``_lora_request`` serves it.
        self._lora_dir: Path | None = lora_dir
        self._lora_request = None

        kwargs = dict(
            model=self._dir,
            dtype=_dtype_name(self.dtype),
            seed=int(seed),
            max_model_len=self.max_model_len,
            max_num_seqs=max_batch_size,
            enable_prefix_caching=enable_prefix_caching,
            logprobs_mode="processed_logprobs",
            skip_tokenizer_init=True,
            enforce_eager=self.cpu if enforce_eager is None else bool(enforce_eager),
            worker_extension_cls=WORKER_EXTENSION,
        )
        if structured_outputs:
            kwargs["skip_tokenizer_init"] = False
            kwargs["structured_outputs_config"] = {"backend": "guidance"}
        kwargs.update(_memory_kwargs(self.cpu, kv_cache_memory_bytes, gpu_memory_utilization))
        if sleep_level and not self.cpu:  # CPU: vLLM refuses sleep mode but accepts sleep() as a no-op
            kwargs["enable_sleep_mode"] = True
        kwargs.update(lora_kwargs)
        kwargs.update(llm_kwargs)
        self._start(kwargs)
        if self._lora_dir is not None:  # the adapters the engine starts with
            self._load_adapter(self.state_dict(), count=False)

    def _start(self, kwargs: dict) -> None:
        """Start ``vllm.LLM(**kwargs)``, recording the processes and ``/dev/shm`` queues it made, the
        reaper that stops them if this process dies, and the finalizer that stops them on close."""
        t = time.perf_counter()
        before, kids = shm_segments(), descendants(os.getpid())
        try:
            self._llm = vllm.LLM(**kwargs)
        except Exception:
            shutdown(None, self._dir, shm_segments() - before)
            raise
        self.startup_s = time.perf_counter() - t
        #: vLLM's processes and shared-memory queues (``/dev/shm`` names) of this engine.
        self.pids = engine_processes(descendants(os.getpid()) - kids)
        self.shm_segments = frozenset(shm_segments() - before)
        segments = set(self.shm_segments)
        #: Stops the engine's processes if this process dies without closing it (vllm_reaper.py).
        self._reaper = start_reaper(self.pids, segments)
        #: ``close()``, garbage collection or interpreter exit stop the engine (once).
        self._finalizer = weakref.finalize(self, shutdown, self._llm, self._dir, segments, self._reaper)

    # ------------------------------------------------------------------ RNG

    def set_seed(self, seed: int) -> None:
        """Reseed the generator that draws per-request seeds."""
        self._generator.manual_seed(int(seed))

    def rng_state(self) -> torch.Tensor:
        return self._generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self._generator.set_state(state)

    def draw_seeds(self, n: int) -> list[int]:
        return draw_seeds(self._generator, n)

    # ------------------------------------------------------------------ sampling

    @property
    def llm(self):
        if self._llm is None:
            raise RuntimeError("VLLMEngine: the engine was closed")
        return self._llm

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, *, seeds: Sequence[int] | None = None
    ) -> list[Generation]:
        """Sample one continuation per prompt (see the module docstring for what differs from HFEngine).

        ``seeds`` (one per prompt) replace the engine RNG's draws: a replica of a Ray engine or a
        torchrun rank samples with the seeds of the call it serves a share of
        (:mod:`horizonrl.inference.seeding`)."""
        prompts = [[int(t) for t in p] for p in prompts]
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"VLLMEngine.generate: {len(seeds)} seeds for {len(prompts)} prompts")
        sps = self.request_params(prompts, params, seeds)
        if not prompts:
            return []
        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts],
            sps,
            use_tqdm=False,
            lora_request=self._lora_request,
        )
        return self.generations(outs, params)

    def request_params(self, prompts: list[list[int]], params: SamplingParams, seeds: Sequence[int] | None):
        """Check ``prompts`` and return one vLLM ``SamplingParams`` per prompt (``seeds``: one each, or
        None to draw them); wakes a sleeping engine."""
        from vllm import SamplingParams as VSP

        if any(not p for p in prompts):
            raise ValueError("VLLMEngine.generate: every prompt needs at least one token")
        if params.stop and self.tokenizer is None:
            raise ValueError("VLLMEngine.generate: stop strings need a tokenizer")
        structured = None  # one StructuredOutputsParams per request: vLLM records its backend in it
        if params.grammar is not None:
            if not self.supports_grammar:
                raise ValueError(
                    "VLLMEngine.generate: SamplingParams.grammar needs an engine built with "
                    "structured_outputs=True (inference.params.structured_outputs)"
                )
            from vllm.sampling_params import StructuredOutputsParams

            structured = functools.partial(StructuredOutputsParams, grammar=params.grammar)
        too_long = [len(p) for p in prompts if len(p) >= self.max_model_len]
        if too_long:
            raise ValueError(
                f"VLLMEngine.generate: a prompt of {too_long[0]} tokens leaves no room under "
                f"max_model_len={self.max_model_len} (inference.params.max_model_len)"
            )
        if not prompts:
            return []
        self._wake()
        if params.top_p < 1 and not params.greedy and not self._warned_top_p:
            self._warned_top_p = True
            log.warning(
                "vLLM renormalises log-probs over the top-p nucleus (rollout.top_p=%s); the trainer "
                "recomputes full-vocabulary ones: use algo.old_logprobs=recompute",
                params.top_p,
            )
        if params.greedy:
            seeds = [None] * len(prompts)
        elif seeds is None:
            seeds = self.draw_seeds(len(prompts))
        stop_ids = sorted(self.eos_ids)
        return [
            VSP(
                n=1,
                temperature=0.0 if params.greedy else params.temperature,
                top_p=1.0 if params.greedy else params.top_p,
                max_tokens=min(params.max_new_tokens, self.max_model_len - len(p)),
                logprobs=0,
                stop_token_ids=stop_ids,
                ignore_eos=True,  # only ``eos_ids`` stop: vLLM would add the generation config's
                seed=s,
                detokenize=False,
                skip_special_tokens=False,
                **({} if structured is None else {"structured_outputs": structured()}),
            )
            for p, s in zip(prompts, seeds, strict=True)
        ]

    def generations(self, outs, params: SamplingParams) -> list[Generation]:
        """vLLM ``RequestOutput`` s -> generations (eos and stop strings as the HF engine ends them)."""
        gens = []
        for out in outs:
            c = out.outputs[0]
            ids = [int(t) for t in c.token_ids]
            lps = [float(c.logprobs[i][t].logprob) for i, t in enumerate(ids)]
            reason, meta = "length", {"cached_tokens": int(out.num_cached_tokens or 0)}
            if ids and ids[-1] in self.eos_ids and c.finish_reason == "stop":
                reason, meta["stop"] = "stop", ids[-1]
            if params.stop:
                hit = first_stop(self.tokenizer, ids, params.stop)
                if hit is not None:
                    k, stop = hit
                    ids, lps, reason, meta["stop"] = ids[:k], lps[:k], "stop", stop
            gens.append(Generation(ids=ids, logprobs=lps, text="", finish_reason=reason, meta=meta))
        if self.tokenizer is not None:
            texts = self.tokenizer.batch_decode([g.ids for g in gens], skip_special_tokens=True)
            for g, text in zip(gens, texts, strict=True):
                g.text = text
        return gens

    def open_stream(self) -> VLLMStream:
        """Continuous batching through vLLM's engine loop (:mod:`horizonrl.inference.vllm_stream`)."""
        return VLLMStream(self)

    def score(
        self, contexts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]
    ) -> list[np.ndarray]:
        """Teacher-forced log-probs (temperature 1) of each continuation token, from prompt log-probs."""
        from vllm import SamplingParams as VSP

        if len(contexts) != len(continuations):
            raise ValueError("VLLMEngine.score: contexts and continuations differ in length")
        ctxs = [[int(t) for t in c] for c in contexts]
        conts = [[int(t) for t in c] for c in continuations]
        if any(not c for c, k in zip(ctxs, conts, strict=True) if k):
            raise ValueError("VLLMEngine.score: a non-empty continuation needs a non-empty context")
        results = [np.zeros(0, dtype=np.float32) for _ in ctxs]
        todo = [i for i in range(len(ctxs)) if conts[i]]
        too_long = [i for i in todo if len(ctxs[i]) + len(conts[i]) >= self.max_model_len]
        if too_long:
            i = too_long[0]
            raise ValueError(
                f"VLLMEngine.score: {len(ctxs[i]) + len(conts[i])} tokens exceed "
                f"max_model_len={self.max_model_len} (inference.params.max_model_len)"
            )
        if not todo:
            return results
        self._wake()
        sp = VSP(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=ctxs[i] + conts[i]) for i in todo],
            sp,
            use_tqdm=False,
            lora_request=self._lora_request,
        )
        for i, out in zip(todo, outs, strict=True):
            full, pl = ctxs[i] + conts[i], out.prompt_logprobs
            results[i] = np.array(
                [pl[j][full[j]].logprob for j in range(len(ctxs[i]), len(full))], dtype=np.float32
            )
        return results

    # ------------------------------------------------------------------ memory

    def sleep(self) -> None:
        """Free the engine's accelerator memory until the next sync/generate (``sleep_level`` > 0)."""
        if self.sleep_level and not self._asleep:
            self.llm.sleep(level=self.sleep_level)
            self._asleep = self.sleep_level

    def wake_up(self) -> None:
        self._wake()

    def _wake(self) -> None:
        if not self._asleep:
            return
        if self._asleep == 2:  # the weights were discarded: send them again
            self._load(self.state_dict())
        else:
            self.llm.wake_up()
            self._asleep = 0

    def close(self) -> None:
        """Stop vLLM's processes and delete the engine's files (idempotent)."""
        if self._bus is not None:
            self._bus.close()
            self._bus = None
        self._llm = None
        self._finalizer()
        gc.collect()


@register_engine("vllm")
def _vllm(model, tokenizer, *, device, max_batch_size, seed, shared=True, **params) -> Engine:
    """``shared=True``: ``sync()`` pulls the training model's weights (after every update);
    ``shared=False``: the engine keeps its weights until ``sync(state_dict)``. vLLM places
    itself (the CPU build on CPU, the first visible GPU otherwise); ``device`` is not used."""
    del device
    return VLLMEngine(
        model, tokenizer, seed=seed, max_batch_size=max_batch_size, source=model if shared else None, **params
    )
