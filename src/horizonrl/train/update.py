"""The PPO update over training rows (one loss-aggregation point: ``losses.aggregate``).

For every epoch the rows are shuffled and split into ``mini_batches`` optimizer
steps. Each mini-batch computes its aggregation coefficients once
(``token_coefficients``) and then runs forward/backward in token-budgeted
micro-batches, so gradient accumulation gives the same gradient as one big
batch. ``train/ratio_geomean`` — ``exp(mean(logp_train - logp_rollout))`` over
trainable tokens — is measured on the first mini-batch of the first epoch,
before any optimizer step: it is 1 exactly when training recomputes the
rollout's log-probs under the same context and weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from horizonrl.losses import aggregate, kl_penalty, policy_loss, token_coefficients
from horizonrl.train.batching import collate, micro_batches, token_logprobs
from horizonrl.trajectory import Row


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
    temperature: float = 1.0
    grad_clip: float = 1.0


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
) -> dict[str, float]:
    """Run ``ppo_epochs`` over ``rows``; return averaged training metrics."""
    if not rows:
        return {}
    model.train()
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}

    def add(key: str, value: float) -> None:
        sums[key] = sums.get(key, 0.0) + float(value)
        counts[key] = counts.get(key, 0) + 1

    lr_before = optimizer.param_groups[0]["lr"]
    n_mb = min(s.mini_batches, len(rows))
    for epoch in range(s.ppo_epochs):
        perm = torch.randperm(len(rows), generator=generator).tolist()
        for m in range(n_mb):
            idx = perm[m::n_mb]
            # Sort by length inside the mini-batch so micro-batches pad little.
            idx.sort(key=lambda i: len(rows[i]))
            mb = collate([rows[i] for i in idx], pad_id=pad_id).to(device)
            coef = token_coefficients(mb.mask, s.loss_agg_mode, rollout_ids=mb.rollout_ids)
            log_ratio_sum, n_tok, max_abs_log = 0.0, 0.0, 0.0
            totals = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clipfrac": 0.0}
            for chunk in micro_batches([len(rows[i]) for i in idx], s.micro_batch_tokens):
                c = torch.tensor(chunk, device=device)
                sub = mb.slice(c)
                logp = token_logprobs(model, sub, temperature=s.temperature)
                pl, stats = policy_loss(
                    logp,
                    sub.old_logprobs,
                    sub.advantages,
                    clip_low=s.clip_low,
                    clip_high=s.clip_high,
                    dual_clip=s.dual_clip,
                    turn_ids=sub.turn_ids if s.turn_level_is else None,
                )
                cf = coef[c]
                loss = aggregate(pl, sub.mask, s.loss_agg_mode, coefficients=cf)
                totals["pg_loss"] += loss.item()
                totals["clipfrac"] += float((cf * stats["clipped"].float()).sum())
                if ref_model is not None and s.kl_coef > 0:
                    with torch.no_grad():
                        ref_lp = token_logprobs(ref_model, sub, temperature=s.temperature)
                    kl = aggregate(
                        kl_penalty(logp, ref_lp, s.kl_kind), sub.mask, s.loss_agg_mode, coefficients=cf
                    )
                    totals["kl"] += kl.item()
                    loss = loss + s.kl_coef * kl
                totals["loss"] += loss.item()
                loss.backward()
                if epoch == 0 and m == 0:
                    d = (logp.detach() - sub.old_logprobs) * sub.mask
                    log_ratio_sum += float(d.sum())
                    n_tok += float(sub.mask.sum())
                    max_abs_log = max(max_abs_log, float(d.abs().max()))
            if s.grad_clip > 0:
                gn = torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
            else:
                gn = torch.linalg.vector_norm(
                    torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None])
                )
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            add("train/grad_norm", float(gn))
            for k, v in totals.items():
                add(f"train/{k}", v)
            if epoch == 0 and m == 0 and n_tok > 0:
                add("train/ratio_geomean", float(torch.exp(torch.tensor(log_ratio_sum / n_tok))))
                add("train/ratio_max_abs_log", max_abs_log)
    if scheduler is not None:
        scheduler.step()
    out = {k: sums[k] / counts[k] for k in sums}
    out["train/lr"] = lr_before
    out["train/trainable_tokens"] = float(sum(r.num_trainable for r in rows))
    out["train/rows"] = float(len(rows))
    return out
