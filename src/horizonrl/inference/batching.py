"""Batching helpers shared by the HF engine's whole-batch and continuous paths."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Run in eval mode under ``torch.inference_mode``; restore train mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        if was_training:
            model.train()


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int, device: torch.device):
    """Left-pad ``seqs`` into ``(ids, attention_mask, position_ids)``; positions count real tokens only."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, seq in enumerate(seqs):
        if seq:
            ids[row, width - len(seq) :] = torch.as_tensor(seq, dtype=torch.long)
            mask[row, width - len(seq) :] = 1
    pos = (mask.cumsum(-1) - 1).clamp_(min=0)
    return ids.to(device), mask.to(device), pos.to(device)
