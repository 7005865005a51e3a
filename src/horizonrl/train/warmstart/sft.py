"""Supervised warm start on demonstration JSONL (loss on assistant tokens only).

Each demonstration is tokenized exactly as the agent loop builds contexts
(``ChatRenderer.sft_example``): the same prompt ids, each assistant message
followed by its end-of-turn token (trainable), each tool/user reply as masked
continuation ids. The loss is the mean negative log-likelihood over all
assistant tokens of the batch. Batches go through the update's forward path
(:class:`~horizonrl.train.update.forward.RowForward`): with ``share_prefix`` the demonstrations' common
prefix (system prompt, tool block: four fifths of the quickstart's rows) is forwarded once per
micro-batch, and the LM head runs only at assistant tokens. A NaN or infinite loss or gradient stops training
(:class:`~horizonrl.errors.NonFiniteError` naming the step), so no such model is saved.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import torch

from horizonrl.errors import DataError, NonFiniteError
from horizonrl.train.update.batching import collate
from horizonrl.train.update.forward import RowForward
from horizonrl.train.update.lean import ForwardOptions
from horizonrl.trajectory import Row


def demo_rows(renderer, demos: Sequence[dict[str, Any]]) -> list[Row]:
    """One row per demonstration; DataError when none has an assistant token to train on."""
    rows = []
    for i, d in enumerate(demos):
        ids, mask = renderer.sft_example(d["messages"], tools=d.get("tools"))
        n = len(ids)
        rows.append(
            Row(
                input_ids=list(ids),
                trainable=[bool(x) for x in mask],
                old_logprobs=[0.0] * n,
                advantages=[0.0] * n,
                turn_ids=[-1] * n,
                rollout_index=i,
                segment_index=0,
            )
        )
    if not any(r.num_trainable for r in rows):
        raise DataError(f"no demonstration has an assistant token to train on ({len(rows)} demonstrations)")
    return rows


def sft_train(
    model: torch.nn.Module,
    rows: Sequence[Row],
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    seed: int,
    device: torch.device,
    pad_id: int = 0,
    micro_batch_tokens: int = 8192,
    share_prefix: bool = True,
    log=None,
) -> list[float]:
    """Train ``model`` in place; returns the mean loss of every optimizer step.

    ``share_prefix`` (``algo.tree_training: auto``): rows of a micro-batch that share a token prefix
    forward it once where the FLOP model says that pays (exact to float rounding).
    """
    # Only what trains: every weight, or the LoRA adapters (model.lora_r > 0).
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    n_steps = epochs * ((len(rows) + batch_size - 1) // batch_size)
    # 10 warmup steps, then constant: a decaying rate measurably slowed the tiny model's SFT.
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))
    rng = random.Random(seed)
    model.train()
    losses = []
    order = list(range(len(rows)))
    fwd = RowForward(
        model, rows, ForwardOptions(tree=share_prefix), micro_batch_tokens=micro_batch_tokens,
        device=device, pad_id=pad_id,
    )  # fmt: skip
    for _epoch in range(epochs):
        rng.shuffle(order)
        for b in range(0, len(order), batch_size):
            idx = sorted(order[b : b + batch_size], key=lambda i: len(rows[i]))
            batch = collate([rows[i] for i in idx], pad_id=pad_id).to(device)
            total = float(batch.mask.sum())
            step_loss = 0.0
            for mb in fwd.micro_batches([rows[i] for i in idx], batch):
                lp = mb.logprobs(model, fwd.options)
                loss = -(lp * mb.batch.mask).sum() / total
                loss.backward()
                step_loss += loss.item()
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if not (math.isfinite(step_loss) and math.isfinite(float(gn))):
                raise NonFiniteError(
                    f"SFT step {len(losses) + 1}: non-finite loss {step_loss} or gradient norm {float(gn)}; "
                    "no model was written (lower sft.lr)"
                )
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            losses.append(step_loss)
            if log is not None:
                log(len(losses), n_steps, step_loss)
    return losses
