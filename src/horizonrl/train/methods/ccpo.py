"""CCPO's context states: frozen reference-model hidden states of step prompts (docs/spec/ccpo.md;
paper App. C.1).

For every step ``(i, t)`` of the batch::

    h_{i,t} = H_ref(p_{i,t})[L_{i,t} - 1]

the final-layer hidden state (after the model's final norm, i.e. HF's
``hidden_states[-1]``) at the last token of the step's exact prompt ids
``p_{i,t}`` (``Turn.prompt_ids``, length ``L_{i,t}``) under the frozen reference
policy ``pi_ref``: the trainer's ``ref_model`` when it has one (KL > 0), else a
frozen copy of the initial policy made once and kept for the run
(``FeatureContext.state["ref"]``). No gradient flows (``torch.inference_mode``).

Cost: only the *unique* prompts of the batch that are not in the cache run, in
length-sorted, right-padded micro-batches of at most ``algo.micro_batch_tokens``
padded tokens (right padding with a causal mask leaves every real position
exactly as in an unpadded forward); with ``algo.tree_training: auto``, prompts that share a
prefix forward it once where that costs fewer FLOPs (``train/update/prefix.py``). ``pi_ref``
never changes, so states are kept in an LRU cache keyed by the prompt's token tuple
(:class:`HiddenStateCache`, ``CACHE_ENTRIES`` entries) across steps: with step-wise prompts every group's
first step shares one prompt, and repeated tasks repeat their early steps.

The provider returns ``[N, D]`` float32 rows aligned with
:func:`horizonrl.credit.ccpo_features.step_batch_from_groups` (rollouts of the
groups in order, turns in order) and these metrics (its wall time is the trainer's
``time/feature_hidden_s``): ``ccpo/cache_hit_rate`` (share of the batch's unique
prompts found in the cache), ``ccpo/unique_prompt_rate`` (unique prompts / rows),
``ccpo/forward_prompts``, ``ccpo/supported_rate`` (rows with any peer: another
trajectory of the same task has steps, or any row without self-exclusion) and
``ccpo/exact_peer_rate`` (rows with an exact-observation peer in another
trajectory; the rest of the supported rows use the task fallback), and the peer diagnostics of
:func:`horizonrl.credit.ccpo.peer_diagnostics` (``ccpo/peer_trajs_mean``, ``ccpo/thin_peer_rate``,
``ccpo/baseline_gap_rms``, ``ccpo/baseline_gap_rms_thin``, ``ccpo/baseline_gap_rms_kappa`` at
kappa = 2, whatever the run's kappa): how many other trajectories back a step's historical
baseline and how far that baseline moves from the task's.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from horizonrl.credit.ccpo import CCPOParams, peer_diagnostics
from horizonrl.credit.ccpo_features import observation_mode, step_batch_from_groups
from horizonrl.models.lora import FrozenBase, is_lora
from horizonrl.train.trainers.features import Feature, FeatureContext, register_feature
from horizonrl.train.update.chunks import update_chunks
from horizonrl.train.update.prefix import prefix_cost, shared_hidden
from horizonrl.trajectory import Group

#: the released recipe's shrinkage, applied to the paper readout's gap for ccpo/baseline_gap_rms_kappa
PROBE_KAPPA = 2.0
CCPO_FIELDS = frozenset(f.name for f in dataclasses.fields(CCPOParams))
CACHE_ENTRIES = 16_384  # 6,400 steps per batch at the paper's scale (16 x 8 x 50); ~100 MB at D = 1,536
DEFAULT_TOKEN_BUDGET = 8192

PromptKey = tuple[int, ...]


class HiddenStateCache:
    """LRU map ``prompt token tuple -> float32 state [D]`` with hit/miss counters."""

    def __init__(self, max_entries: int = CACHE_ENTRIES) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"HiddenStateCache.max_entries must be a positive integer, got {max_entries!r}")
        self.max_entries = max_entries
        self._data: OrderedDict[PromptKey, np.ndarray] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.model_id: int | None = None  # id() of the reference model the states belong to

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: PromptKey) -> bool:
        return key in self._data

    def get(self, key: PromptKey) -> np.ndarray | None:
        """The cached state (marked most recently used), counting a hit or a miss."""
        value = self._data.get(key)
        if value is None:
            self.misses += 1
            return None
        self.hits += 1
        self._data.move_to_end(key)
        return value

    def put(self, key: PromptKey, value: np.ndarray) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.max_entries:
            self._data.popitem(last=False)


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def last_token_states(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    pad_id: int = 0,
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    share: bool = False,
) -> np.ndarray:
    """``[len(prompts), D]`` float32: final-layer hidden state at each prompt's last token (no gradient).

    Prompts run length-sorted in right-padded micro-batches of at most
    ``token_budget`` padded tokens; the decoder stack (``model.base_model``) is
    called directly so no vocabulary logits are computed. ``share``
    (``algo.tree_training: auto``): prompts that share a prefix (the system prompt, the task, the
    earlier turns) forward it once where that costs fewer FLOPs (``train/update/prefix.py``, the
    update's micro-batches: :func:`~horizonrl.train.update.chunks.update_chunks`).
    """
    if any(len(p) == 0 for p in prompts):
        raise ValueError("last_token_states: every prompt needs at least one token, got an empty prompt")
    if not prompts:
        return np.zeros((0, 0), dtype=np.float32)
    device = _device(model)
    chunks = update_chunks(prompts, token_budget, cost=prefix_cost(model) if share else None)
    out: list[np.ndarray | None] = [None] * len(prompts)
    base = getattr(model, "base_model", None)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for idx, plan in chunks:
                lengths = [len(prompts[i]) for i in idx]
                ids = torch.full((len(idx), max(lengths)), int(pad_id), dtype=torch.long)
                mask = torch.zeros((len(idx), max(lengths)), dtype=torch.long)
                for row, i in enumerate(idx):
                    ids[row, : len(prompts[i])] = torch.as_tensor(list(prompts[i]), dtype=torch.long)
                    mask[row, : len(prompts[i])] = 1
                ids, mask = ids.to(device), mask.to(device)
                last = mask.sum(dim=1) - 1
                rows_at = torch.arange(len(idx), device=device)
                if plan is not None and plan.shares:
                    hidden, where = shared_hidden(model, ids, lengths, plan)
                    rows = hidden[where[rows_at, last]]
                else:
                    if base is not None and base is not model:
                        h = base(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
                    else:
                        h = model(
                            input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False
                        ).hidden_states[-1]
                    rows = h[rows_at, last]
                rows = rows.float().cpu().numpy()
                for row, i in enumerate(idx):
                    out[i] = rows[row]
    finally:
        if was_training:
            model.train()
    return np.stack(out).astype(np.float32, copy=False)


def reference_model(ctx: FeatureContext) -> torch.nn.Module:
    """``pi_ref``: ``ctx.ref_model``, else a frozen initial policy kept in ``ctx.state["ref"]``.

    The copy is made from ``ctx.model`` on the first call of a fresh run (step
    0, before any update). A run resumed past step 0 without a reference model
    reloads its starting weights (``train.init`` or the base model) instead.
    A LoRA policy (``model.lora_r > 0``) needs no copy: its frozen base (adapters off,
    :class:`~horizonrl.models.lora.FrozenBase`) is the initial policy, also after a resume.
    """
    if ctx.ref_model is not None:
        return ctx.ref_model
    ref = ctx.state.get("ref")
    if ref is None and is_lora(ctx.model):  # the frozen base: the initial policy, no second copy
        ref = ctx.state["ref"] = FrozenBase(ctx.model)
    if ref is None:
        if ctx.step > 0 and ctx.cfg is not None:
            from horizonrl.train.warmstart.bootstrap import load_policy

            ref, _ = load_policy(ctx.cfg.model, init=ctx.cfg.train.init, work_dir=ctx.run_dir)
            ref = ref.to(_device(ctx.model))
        else:
            ref = copy.deepcopy(ctx.model)
        ref = ref.eval().requires_grad_(False)
        ctx.state["ref"] = ref
    return ref


def _cache_for(ctx: FeatureContext, model: torch.nn.Module) -> HiddenStateCache:
    """The run's cache for ``model`` (a new one if the reference model changed)."""
    cache = ctx.state.get("cache")
    if cache is None or cache.model_id != id(model):
        cache = HiddenStateCache(ctx.state.get("cache_entries", CACHE_ENTRIES))
        cache.model_id = id(model)
        ctx.state["cache"] = cache
    return cache


def step_prompts(groups: Sequence[Group]) -> list[PromptKey]:
    """Every turn's prompt ids as a tuple, in :func:`step_batch_from_groups` row order."""
    return [tuple(t.prompt_ids) for g in groups for r in g.rollouts for t in r.turns]


def hidden_states(ctx: FeatureContext, groups: Sequence[Group]) -> tuple[np.ndarray, dict[str, float]]:
    """``([N, D] float32 states, stats)`` for the steps of ``groups`` (module docstring)."""
    model = reference_model(ctx)
    cache = _cache_for(ctx, model)
    prompts = step_prompts(groups)
    unique = list(dict.fromkeys(prompts))
    found = {k: v for k in unique if (v := cache.get(k)) is not None}
    missing = [k for k in unique if k not in found]
    # algo.micro_batch_tokens=0 sizes the update from memory; this no-grad pass keeps the default
    budget = (ctx.cfg.algo.micro_batch_tokens if ctx.cfg is not None else 0) or DEFAULT_TOKEN_BUDGET
    tok = ctx.tokenizer
    pad_id = (getattr(tok, "pad_token_id", None) or 0) if tok is not None else 0
    if missing:
        share = ctx.cfg is None or ctx.cfg.algo.tree_training == "auto"
        states = last_token_states(model, missing, pad_id=pad_id, token_budget=budget, share=share)
        for k, v in zip(missing, states, strict=True):
            found[k] = v = v.copy()
            cache.put(k, v)
    if prompts:
        out = np.stack([found[k] for k in prompts]).astype(np.float32, copy=False)
    else:
        out = np.zeros((0, int(getattr(model.config, "hidden_size", 0))), dtype=np.float32)
    stats = {
        "ccpo/cache_hit_rate": (len(unique) - len(missing)) / max(len(unique), 1),
        "ccpo/unique_prompt_rate": len(unique) / max(len(prompts), 1),
        "ccpo/forward_prompts": float(len(missing)),
    }
    return out, stats


def support_rates(groups: Sequence[Group], *, exclude_self: bool = True, observation: str = "prompt"):
    """``(supported_rate, exact_peer_rate)`` of the step rows, as :func:`~horizonrl.credit.contextual_credit`
    decides support: an exact peer is a same-task row with the same observation in another trajectory
    (any row, itself included, without self-exclusion); otherwise any same-task row of another trajectory."""
    steps = step_batch_from_groups(groups, observation=observation)
    n = len(steps)
    if n == 0:
        return 0.0, 0.0
    if not exclude_self:
        return 1.0, 1.0
    trajs_of_task: dict[Any, set] = {}
    trajs_of_obs: dict[tuple, set] = {}
    for task, traj, obs in zip(steps.task_ids, steps.trajectory_ids, steps.observations, strict=True):
        trajs_of_task.setdefault(task, set()).add(traj)
        trajs_of_obs.setdefault((task, obs), set()).add(traj)
    supported = sum(len(trajs_of_task[t]) > 1 for t in steps.task_ids)
    exact = sum(
        len(trajs_of_obs[(t, o)]) > 1 for t, o in zip(steps.task_ids, steps.observations, strict=True)
    )
    return supported / n, exact / n


def aliased_rate(groups: Sequence[Group]) -> float:
    """Share of step rows whose observation text is shared, within the task, with a different hidden state.

    The case contextual credit exists for (CCPO paper Sec. 4.4): identical observations concealing
    different task progress. Text keys come from ``obs_key="text"``, states from ``"state"``.
    """
    text = step_batch_from_groups(groups, observation="text")
    state = step_batch_from_groups(groups, observation="prompt")
    states: dict[tuple, set] = {}
    for task, t, s in zip(text.task_ids, text.observations, state.observations, strict=True):
        states.setdefault((task, t), set()).add(s)
    n = len(text)
    hits = sum(len(states[(task, t)]) > 1 for task, t in zip(text.task_ids, text.observations, strict=True))
    return hits / n if n else 0.0


@register_feature("hidden")
def hidden(ctx: FeatureContext, groups: Sequence[Group], params: dict[str, Any]) -> Feature:
    """CCPO's ``hidden=[N, D]`` input and its ``ccpo/*`` metrics (module docstring)."""
    out, stats = hidden_states(ctx, groups)
    # the run's CCPO parameters, defaults filled in (another estimator that needs hidden states may take
    # other keys: those are not CCPO's)
    p = CCPOParams(**{k: v for k, v in params.items() if k in CCPO_FIELDS})
    mode = observation_mode(p.obs_key)
    sup, exact = support_rates(groups, exclude_self=bool(p.exclude_self), observation=mode)
    stats.update(
        {"ccpo/supported_rate": sup, "ccpo/exact_peer_rate": exact, "ccpo/aliased_rate": aliased_rate(groups)}
    )
    diag = peer_diagnostics(step_batch_from_groups(groups, observation=mode), out, p, kappa=PROBE_KAPPA)
    stats.update({f"ccpo/{k}": v for k, v in diag.items()})
    return Feature(out, stats)
