"""The PPO update over training rows (one loss-aggregation point: ``losses.aggregate``).

For every epoch the *rollouts* are shuffled and split into ``mini_batches``
optimizer steps (all rows of a rollout stay in one mini-batch, so the per-rollout
normalizers of ``rollout-mean-token-mean`` are exact for any number of
mini-batches). Each mini-batch computes its aggregation coefficients once
(``token_coefficients``) and then runs forward/backward in token-budgeted
micro-batches, so gradient accumulation gives the same gradient as one big
batch.

``train/ratio_geomean`` — ``exp(mean(logp_train - logp_rollout))`` over
trainable tokens, before any optimizer step — is 1 exactly when training
recomputes the rollout's log-probs under the same context and weights
(``train/ratio_max_abs_log`` is the largest ``|logp_train - logp_rollout|``).
PPO's ``pi_old`` is the rollout's log-probs (``old_logprobs='rollout'``) or a
no-grad recomputation under the training rows (``'recompute'``, verl's
default), which matters when rows are not the sampled contexts (flat-history
baselines) or when a second engine sampled them.

A NaN or infinite loss or gradient norm in a mini-batch raises
:class:`~horizonrl.errors.NonFiniteError` (``nonfinite='stop'``) or drops that
optimizer step (``'skip'``, counted in ``train/skipped_batches``); parameters
that are not finite after a step always raise.

With ``'recompute'`` and ``tis_cap`` set, each token's PPO loss is also weighted
by the truncated (or masked) importance ratio ``pi_old / pi_rollout`` of
:func:`horizonrl.losses.rollout_correction` (token or sequence level; MIS drops
tokens or rows from the loss and its normaliser), logged as
``train/tis_weight_mean`` (mean weight over the kept tokens),
``train/tis_clipped_frac`` (trainable tokens whose ratio exceeded the cap:
truncated or dropped) and ``train/tis_ratio_mean`` / ``train/tis_ratio_max``.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from horizonrl.errors import NonFiniteError
from horizonrl.losses import aggregate, kl_penalty, policy_loss, rollout_correction, token_coefficients
from horizonrl.losses.mismatch import CORRECTION_LEVELS, CORRECTION_MODES
from horizonrl.train.records.checkpoint import check_finite
from horizonrl.train.update.batching import collate
from horizonrl.train.update.forward import MicroBatch, RowForward
from horizonrl.train.update.lean import ForwardOptions
from horizonrl.trajectory import Row
from horizonrl.vocab import OldLogprobs

OLD_LOGPROBS = tuple(m.value for m in OldLogprobs)


@dataclass(frozen=True)
class UpdateSettings:
    loss_agg_mode: str
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    turn_level_is: bool = False
    kl_coef: float = 0.0
    kl_kind: str = "low_var_kl"
    ppo_epochs: int = 1
    mini_batches: int = 1
    micro_batch_tokens: int = 8192
    grad_clip: float = 1.0
    old_logprobs: str = "rollout"
    logprob_clip: float | None = None
    policy_loss: str = "ppo"
    norm_tokens: int | None = None
    nonfinite: str = "stop"
    tis_cap: float | None = None
    tis_level: str = "token"
    tis_mode: str = "truncate"
    #: Memory-lean forwards (train/update/lean.py): LM-head chunk size (0 = full logits), packed rows,
    #: 'fp32' or 'bf16' autocast.
    logprob_chunk_tokens: int = 0
    pack_rows: bool = False
    precision: str = "fp32"
    #: 'auto': rows sharing a token prefix forward it once where that pays (train/update/prefix.py); 'off'.
    tree_training: str = "off"

    @property
    def forward(self) -> ForwardOptions:
        """How the update computes log-probs (:func:`~horizonrl.train.update.batching.token_logprobs`)."""
        return ForwardOptions(
            self.logprob_chunk_tokens, self.pack_rows, self.precision, tree=self.tree_training == "auto"
        )

    @classmethod
    def from_config(cls, cfg: Any, *, loss_agg_mode: str, micro_batch_tokens: int) -> UpdateSettings:
        """The settings of a run's ``algo`` / ``optim`` / ``train`` sections.

        ``loss_agg_mode`` (the estimator's default when ``algo.loss_agg_mode`` is unset) and
        ``micro_batch_tokens`` (resolved against the model and device by
        :func:`~horizonrl.train.update.lean.resolve_micro_batch_tokens`) are decided by the trainer.
        """
        a, o = cfg.algo, cfg.optim
        return cls(
            loss_agg_mode=loss_agg_mode,
            clip_low=a.clip_low,
            clip_high=a.clip_high,
            dual_clip=a.dual_clip,
            turn_level_is=a.turn_level_is,
            kl_coef=a.kl_coef,
            kl_kind=a.kl_kind,
            ppo_epochs=a.ppo_epochs,
            mini_batches=a.mini_batches,
            micro_batch_tokens=micro_batch_tokens,
            grad_clip=o.grad_clip,
            old_logprobs=a.old_logprobs,
            logprob_clip=a.logprob_clip,
            policy_loss=a.policy_loss,
            norm_tokens=a.loss_norm_tokens or cfg.rollout.max_new_tokens * cfg.rollout.max_turns,
            nonfinite=o.nonfinite,
            tis_cap=a.tis_cap,
            tis_level=a.tis_level,
            tis_mode=a.tis_mode,
            logprob_chunk_tokens=cfg.train.logprob_chunk_tokens,
            pack_rows=a.pack_rows,
            tree_training=a.tree_training,
            precision=cfg.train.precision,
        )

    def __post_init__(self) -> None:
        self.forward  # noqa: B018 (validates precision and chunk size)
        if self.old_logprobs not in OLD_LOGPROBS:
            raise ValueError(f"old_logprobs={self.old_logprobs!r}: must be one of {list(OLD_LOGPROBS)}")
        if self.tree_training not in ("auto", "off"):
            raise ValueError(f"tree_training={self.tree_training!r}: must be 'auto' or 'off'")
        if self.nonfinite not in ("stop", "skip"):
            raise ValueError(f"nonfinite={self.nonfinite!r}: must be 'stop' or 'skip'")
        if self.tis_level not in CORRECTION_LEVELS or self.tis_mode not in CORRECTION_MODES:
            raise ValueError(f"tis_level={self.tis_level!r}, tis_mode={self.tis_mode!r}: unknown")
        if self.tis_cap is not None and (self.old_logprobs != "recompute" or not self.tis_cap > 1):
            raise ValueError(f"tis_cap={self.tis_cap!r}: needs old_logprobs='recompute' and a cap > 1")


def rollout_mini_batches(rows: Sequence[Row], n: int, generator: torch.Generator) -> list[list[int]]:
    """Row indices of ``n`` mini-batches: rollouts shuffled, dealt round-robin, all rows of one together."""
    by_rollout: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        by_rollout.setdefault(r.rollout_index, []).append(i)
    keys = list(by_rollout)
    n = max(1, min(n, len(keys)))
    perm = torch.randperm(len(keys), generator=generator).tolist()
    return [[i for j in perm[m::n] for i in by_rollout[keys[j]]] for m in range(n)]


@torch.no_grad()
def score_rows(
    model: torch.nn.Module,
    rows: Sequence[Row],
    *,
    device,
    pad_id: int,
    micro_batch_tokens: int,
    world=None,
    forward: ForwardOptions | None = None,
):
    """Training-model log-probs of every row's target positions (``[T-1]`` per row, no grad): those a
    loss reads (``batching.loss_positions``: trainable tokens and generated turns) always, the others
    only on the plain full-logits path (0 where the LM head is chunked or a prefix shared).

    With ``world`` each rank scores its share of the rows and the results are all-gathered;
    ``forward``: the update's precision, LM-head chunks and packing (``UpdateSettings.forward``).
    """
    out: list[torch.Tensor] = [torch.zeros(0)] * len(rows)
    forward = forward or ForwardOptions()
    training = model.training
    model.eval()
    mine = []
    try:
        fwd = RowForward(
            model,
            rows,
            forward,
            micro_batch_tokens=micro_batch_tokens,
            device=device,
            pad_id=pad_id,
            world=world,
        )
        for micro in fwd.micro_batches(rows):
            lp = micro.logprobs(model, forward).cpu()
            if micro.idle:  # an idle rank's forward, for the collectives only
                continue
            for b, i in enumerate(micro.positions):
                out[i] = lp[b, : len(rows[i]) - 1]
                mine.append(i)
    finally:
        model.train(training)
    if world is not None:
        for part in world.all_gather_object([(i, out[i]) for i in mine]):
            for i, lp in part:
                out[i] = lp
    return out


def consistency_metrics(rows: Sequence[Row], scored: Sequence[torch.Tensor]) -> dict[str, float]:
    """``train/ratio_geomean``, ``ratio_max_abs_log`` and the k3 ``KL(pi_rollout || pi_train)``."""
    d = []
    for r, lp in zip(rows, scored, strict=True):
        mask = torch.tensor(r.trainable[1:], dtype=torch.bool)
        d.append(lp[mask].double() - torch.tensor(r.old_logprobs[1:], dtype=torch.float64)[mask])
    d = torch.cat(d) if d else torch.zeros(0, dtype=torch.float64)
    if d.numel() == 0:
        return {}
    return {
        "train/ratio_geomean": float(torch.exp(d.mean())),
        "train/ratio_max_abs_log": float(d.abs().max()),
        "train/kl_rollout_train": float(torch.mean(torch.expm1(d) - d)),
    }


def _add_tis_metrics(add, w, keep, rho, mask, cap: float) -> None:
    """Mismatch-correction metrics of one mini-batch (means over its trainable tokens)."""
    n = float(mask.sum())
    if n == 0:
        return
    kept = float(keep.sum())
    add("train/tis_weight_mean", float(w.sum()) / kept if kept else 0.0)
    add("train/tis_clipped_frac", float(((rho > cap) & (mask > 0)).sum()) / n)
    add("train/tis_ratio_mean", float(rho.sum()) / n)
    add("train/tis_ratio_max", float(rho.max()))


class _Means:
    """Training metrics averaged over the optimizer steps (and mini-batches) that reported them."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def add(self, key: str, value: float) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + float(value)
        self.counts[key] = self.counts.get(key, 0) + 1

    def means(self) -> dict[str, float]:
        return {k: self.sums[k] / self.counts[k] for k in self.sums}


def ppo_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler,
    rows: Sequence[Row],
    s: UpdateSettings,
    *,
    generator: torch.Generator,
    device: torch.device,
    pad_id: int = 0,
    ref_model: torch.nn.Module | None = None,
    world=None,
) -> dict[str, float]:
    """Run ``ppo_epochs`` over ``rows``; return averaged training metrics.

    ``world`` (:class:`horizonrl.world.World`, with ``model`` wrapped by
    ``world.wrap``): every rank passes all rows and trains its share of each mini-batch with
    the mini-batch's global coefficients (:func:`~horizonrl.train.update.chunks.rank_chunks`);
    gradients and metrics are summed across ranks, so the step equals the single-process one up to
    floating-point summation order.

    ``train/forwarded_tokens``: tokens the loss loop's forwards processed over all epochs (padding
    included; a prefix shared by ``k`` rows once), ``train/row_tokens``: the same rows' own tokens.
    """
    if not rows:
        return {}
    model.train()
    means = _Means()
    lr_before = optimizer.param_groups[0]["lr"]
    skipped = 0
    kw = {"device": device, "pad_id": pad_id, "micro_batch_tokens": s.micro_batch_tokens, "world": world}
    before: dict[str, float] = {}
    scored = None
    if s.old_logprobs == "recompute":
        scored = score_rows(model, rows, forward=s.forward, **kw)
        before = consistency_metrics(rows, scored)
    fwd = RowForward(model, rows, s.forward, ref_model=ref_model if s.kl_coef > 0 else None, **kw)
    for epoch in range(s.ppo_epochs):
        for m, idx in enumerate(rollout_mini_batches(rows, s.mini_batches, generator)):
            mb, coef, tis = _mini_batch(
                rows, idx, scored, s, device, pad_id, means.add if epoch == 0 else None
            )
            ratio = _Ratio() if epoch == 0 and m == 0 and not before else None
            totals = _backward(model, fwd, [rows[i] for i in idx], mb, coef, tis, s, ref_model, world, ratio)
            ratio = ratio or _Ratio()
            if world is not None:
                totals = ratio.reduce(world, totals)
            gn = _step(model, optimizer, s, totals["loss"], world, epoch, m)
            if gn is None:
                skipped += 1
                continue
            means.add("train/grad_norm", gn)
            for k, v in totals.items():
                means.add(f"train/{k}", v)
            if epoch == 0 and m == 0 and ratio.n_tok > 0:
                means.add("train/ratio_geomean", float(torch.exp(torch.tensor(ratio.log_sum / ratio.n_tok))))
                means.add("train/ratio_max_abs_log", ratio.max_abs)
    if scheduler is not None:
        with warnings.catch_warnings():
            if skipped:  # the schedule counts the step even when its mini-batches were skipped
                warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
            scheduler.step()
    out = means.means() | before | {"train/lr": lr_before}
    out["train/trainable_tokens"] = float(sum(r.num_trainable for r in rows))
    forwarded, own = fwd.tokens
    out["train/forwarded_tokens"], out["train/row_tokens"] = float(forwarded), float(own)
    out["train/rows"] = float(len(rows))
    return out | ({"train/skipped_batches": float(skipped)} if s.nonfinite == "skip" else {})


def _mini_batch(rows, idx, scored, s: UpdateSettings, device, pad_id: int, add):
    """``(batch, coefficients, tis)`` of one mini-batch: its rows collated (``pi_old`` recomputed when
    ``scored``), the rollout-correction weights (``tis``, None without ``tis_cap``; MIS drops tokens
    from the mask), and the aggregation coefficients of the whole mini-batch (``token_coefficients``).
    ``add``: where the correction's metrics go (None: not reported)."""
    old = [scored[i] for i in idx] if scored is not None else None
    mb = collate([rows[i] for i in idx], pad_id=pad_id, old_logprobs=old).to(device)
    tis = None
    if s.tis_cap is not None:
        tis, keep, rho = rollout_correction(
            mb.old_logprobs,
            mb.rollout_logprobs,
            mb.mask,
            cap=s.tis_cap,
            level=s.tis_level,
            mode=s.tis_mode,
        )
        if add is not None:
            _add_tis_metrics(add, tis, keep, rho, mb.mask, s.tis_cap)
        mb.mask = keep  # MIS: dropped tokens leave the loss and its normaliser
    coef = token_coefficients(mb.mask, s.loss_agg_mode, rollout_ids=mb.rollout_ids, norm_tokens=s.norm_tokens)
    return mb, coef, tis


class _Ratio:
    """``log(pi_train / pi_rollout)`` over the trainable tokens of the first mini-batch, before any step."""

    def __init__(self) -> None:
        self.log_sum, self.n_tok, self.max_abs = 0.0, 0.0, 0.0

    def add(self, logp: torch.Tensor, sub) -> None:
        d = (logp.detach() - sub.old_logprobs) * sub.mask
        self.log_sum += float(d.sum())
        self.n_tok += float(sub.mask.sum())
        self.max_abs = max(self.max_abs, float(d.abs().max()))

    def reduce(self, world, totals: dict[str, float]) -> dict[str, float]:
        """``totals`` and this ratio summed (its max: maxed) across the ranks."""
        keys = list(totals)
        summed = world.sum([totals[k] for k in keys] + [self.log_sum, self.n_tok])
        self.log_sum, self.n_tok = summed[len(keys) :]
        self.max_abs = world.max([self.max_abs])[0]
        return dict(zip(keys, summed[: len(keys)], strict=True))


def _backward(model, fwd: RowForward, rows, mb, coef, tis, s: UpdateSettings, ref_model, world, ratio):
    """Forward and backward over the micro-batches of one mini-batch (gradients accumulate); returns the
    summed ``loss``, ``pg_loss``, ``kl`` and ``clipfrac``. ``ratio``: measures the first mini-batch."""
    totals = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clipfrac": 0.0}
    # Micro-batches: rows sorted by length so they pad little, or shared-prefix forests.
    for micro in fwd.micro_batches(rows, mb):
        c, sub = micro.index, micro.batch
        cf = coef[c] if not micro.idle else torch.zeros_like(coef[c])
        sync = world.grad_sync(model, micro.last) if world else contextlib.nullcontext()
        with sync:
            logp = micro.logprobs(model, s.forward)
            loss = _loss(logp, micro, cf, tis, s, ref_model, totals)
            # DDP / FSDP average gradients over ranks; the scaled partial losses sum to the loss.
            (loss if world is None else loss * world.size).backward()
        if ratio is not None and not micro.idle:
            ratio.add(logp, sub)
    return totals


def _loss(logp, micro: MicroBatch, cf, tis, s: UpdateSettings, ref_model, totals) -> torch.Tensor:
    """One micro-batch's share of the mini-batch loss: the policy loss (weighted by ``tis``) and, with
    ``kl_coef``, ``kl_coef * KL(pi || pi_ref)``, both aggregated with the mini-batch's coefficients ``cf``
    (so the micro-batches' losses sum to the mini-batch's); its parts are added to ``totals``."""
    sub = micro.batch
    pl, stats = policy_loss(
        logp,
        sub.old_logprobs,
        sub.advantages,
        clip_low=s.clip_low,
        clip_high=s.clip_high,
        dual_clip=s.dual_clip,
        turn_ids=sub.turn_ids if s.turn_level_is else None,
        logprob_clip=s.logprob_clip,
        clip=s.policy_loss == "ppo",
    )
    if tis is not None:
        pl = pl * tis[micro.index]
    loss = aggregate(pl, sub.mask, s.loss_agg_mode, coefficients=cf)
    totals["pg_loss"] += loss.item()
    totals["clipfrac"] += float((cf * stats["clipped"].float()).sum())
    if ref_model is not None and s.kl_coef > 0:
        with torch.no_grad():
            ref_lp = micro.logprobs(ref_model, s.forward)
        kl = aggregate(kl_penalty(logp, ref_lp, s.kl_kind), sub.mask, s.loss_agg_mode, coefficients=cf)
        totals["kl"] += kl.item()
        loss = loss + s.kl_coef * kl
    totals["loss"] += loss.item()
    return loss


def _step(model, optimizer, s: UpdateSettings, loss: float, world, epoch: int, m: int) -> float | None:
    """Clip the gradients and step the optimizer; the gradient norm, or None when a non-finite loss or
    norm made ``nonfinite='skip'`` drop the step (``'stop'`` raises)."""
    gn = _grad_norm(model, s.grad_clip, world)
    if not (math.isfinite(loss) and math.isfinite(float(gn))):
        optimizer.zero_grad(set_to_none=True)
        what = "loss" if not math.isfinite(loss) else "gradient norm"
        if s.nonfinite == "stop":
            raise NonFiniteError(
                f"non-finite {what} (loss {loss}, gradient norm {float(gn)}) in epoch "
                f"{epoch}, mini-batch {m}; no checkpoint was written. Lower optim.lr, or set "
                "optim.nonfinite=skip to skip such batches"
            )
        return None
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    try:
        _check_finite(model, world)
    except NonFiniteError as e:
        raise NonFiniteError(
            f"{e} after the optimizer step (epoch {epoch}, mini-batch {m}); lower optim.lr"
        ) from None
    return float(gn)


def _grad_norm(model: torch.nn.Module, grad_clip: float, world) -> torch.Tensor:
    """Global gradient norm, clipped to ``grad_clip`` when > 0 (sharded gradients: the full norm)."""
    if world is not None:
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else float("inf"))
        return gn.full_tensor() if hasattr(gn, "full_tensor") else gn
    if grad_clip > 0:
        return torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    return torch.linalg.vector_norm(
        torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None])
    )


def _check_finite(model: torch.nn.Module, world) -> None:
    """``check_finite`` of the weights; sharded: every rank checks its shards and all ranks agree."""
    if world is None:
        check_finite(model)
        return
    bad = ""
    for name, p in model.named_parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        if not bool(torch.isfinite(local.detach()).all()):
            bad = name
            break
    if world.max([1.0 if bad else 0.0])[0] > 0:
        raise NonFiniteError(f"parameter {bad or '(on another rank)'} holds NaN or infinite values")
