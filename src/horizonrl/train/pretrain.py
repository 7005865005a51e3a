"""Brief synthetic pretraining of the embedded tiny model: in-context copying.

A randomly initialised model knows nothing, not even that the answer to a
tool task is usually written somewhere in its context. Real base models learn
to copy from context ("induction heads") during pretraining; the tiny default
gets the same skill from a few hundred cheap steps on sequences
``x_1 .. x_L <sep> x_1 .. x_L`` of random vocabulary tokens, with the loss on
the second copy only. It sees no environment text and no task, so it cannot
leak answers; it only makes the later SFT warm start take minutes instead of
hours on a CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def copy_pretrain(
    model: torch.nn.Module,
    *,
    vocab_size: int,
    steps: int,
    batch_size: int = 32,
    min_len: int = 4,
    max_len: int = 16,
    lr: float = 3e-3,
    sep_id: int = 1,
    first_id: int = 3,
    seed: int = 0,
) -> list[float]:
    """Train ``model`` in place on random-span copying; returns the loss of every step.

    Tokens are drawn uniformly from ``[first_id, vocab_size)`` (special tokens
    excluded); the chance-level loss is ``log(vocab_size - first_id)``.
    """
    if not 1 <= min_len <= max_len:
        raise ValueError(f"copy_pretrain needs 1 <= min_len <= max_len, got {min_len}, {max_len}")
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for _ in range(steps):
        n = int(torch.randint(min_len, max_len + 1, (1,), generator=gen))
        x = torch.randint(first_id, vocab_size, (batch_size, n), generator=gen)
        seq = torch.cat([x, torch.full((batch_size, 1), sep_id), x], dim=1).to(device)
        logits = model(input_ids=seq, use_cache=False).logits[:, n:-1]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), seq[:, n + 1 :].reshape(-1))
        loss.backward()  # no gradient clipping: it measurably delays the copy circuit here
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses
