"""Brief synthetic pretraining of the embedded tiny model: in-context copying and recall.

A randomly initialised model knows nothing, not even that the answer to a
tool task is usually written somewhere in its context. Real base models learn
to copy from context ("induction heads") during pretraining; the tiny default
gets the same skill from a few hundred cheap steps on two synthetic tasks of
random vocabulary tokens, alternating step by step:

- *span copy*: ``x_1 .. x_L <sep> x_1 .. x_L``, loss on the second copy;
- *associative recall*: ``k_1 v_1 .. k_n v_n <sep> k_a v_a k_b v_b ..`` (the keys
  queried again in a random order), loss on each value after its queried key.

Span copy alone can be solved by attending a fixed distance back, and which
solution a seed finds decides whether the skill transfers: with span copy
only, one of three model seeds learned the quickstart's tool calls but never
learned to copy the calculator's result into its answer (pass@1 0.0-0.03 after
SFT, for any SFT length or noise tried). Recall can only be solved by content
(find the queried key, copy what followed it), which is the lookup every tool
result needs.

Problems are packed, eight to a row, each opened by a start token
(``pack``). Trained one problem a row, both circuits were bound to the start
of the context: probed behind 64 random tokens every seed's copy accuracy fell
from 0.99 to 0.01-0.10 (0.00 behind 256), while a tool result sits ~250 tokens
into the quickstart's context, so SFT had to learn that copy itself and one
model seed in three never did (SFT start pass@1 0.0). Packed, each problem
must be found by content among others, which is what copying a tool result
is ("after ``<answer>``, the digits after the latest ``<tool_response>``").
The circuits then form later (2,000-6,000 steps, seed-dependent) but hold deep
into a context; :func:`copy_accuracy` measures it (``pretrain.json``: ``accuracy_256_deep``).

Either task sees no environment text and no task, so it cannot leak answers;
it only makes the later SFT warm start take minutes instead of hours on a CPU.
Whether the circuit forms is a phase transition (the loss sits near chance,
then drops to ~0 within a few hundred steps), and at a learning rate of 3e-3
span copy was on a knife edge: on some CPUs it formed within 1500 steps, on
others it never did, and the SFT and RL results downstream differed by tens of
points. So the rate is 1e-3 with a short warmup, training stops once both
tasks have converged, and :func:`copy_pretrain` reports whether they did.
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
    lr: float = 1e-3,
    warmup: int = 50,
    target_loss: float = 0.05,
    window: int = 50,
    sep_id: int = 1,
    first_id: int = 3,
    seed: int = 0,
    recall: bool = True,
    min_pairs: int = 4,
    max_pairs: int = 12,
    pack: int = 1,
    start_id: int = 2,
) -> list[float]:
    """Train ``model`` in place on span copying (and, with ``recall``, associative recall on every
    other step: the module docstring); returns the loss of every step taken.

    Tokens are drawn uniformly from ``[first_id, vocab_size)`` (special tokens
    excluded); the chance-level loss is ``log(vocab_size - first_id)``. ``pack``
    problems (each opened by ``start_id``) are concatenated into one row, and the
    batch has ``batch_size // pack`` rows, so a step costs about the same while
    every problem after the first sits deep in a context of other problems: the
    circuit must find its own problem by content, not by absolute position. The rate
    rises linearly over ``warmup`` steps; training stops early once the mean loss
    of the last ``window`` steps of each task is below ``target_loss``
    (``target_loss=0``: always ``steps`` steps). Deterministic for a given ``seed``.
    """
    if not 1 <= min_len <= max_len:
        raise ValueError(f"copy_pretrain needs 1 <= min_len <= max_len, got {min_len}, {max_len}")
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, warmup)))
    model.train()
    losses: list[float] = []
    if recall and not 2 <= min_pairs <= max_pairs <= vocab_size - first_id:
        raise ValueError(f"copy_pretrain needs 2 <= min_pairs <= max_pairs, got {min_pairs}, {max_pairs}")
    if pack < 1:
        raise ValueError(f"copy_pretrain needs pack >= 1, got {pack}")
    rows = max(1, batch_size // pack)
    for step in range(steps):
        if recall and step % 2:
            n = int(torch.randint(min_pairs, max_pairs + 1, (1,), generator=gen))
            seq, where = _recall_batch(gen, rows * pack, n, first_id, vocab_size, sep_id)
        else:
            n = int(torch.randint(min_len, max_len + 1, (1,), generator=gen))
            seq, where = _span_batch(gen, rows * pack, n, first_id, vocab_size, sep_id)
        if pack > 1:
            seq, where = _pack(seq, where, rows, pack, start_id)
        seq = seq.to(device)
        logits = model(input_ids=seq, use_cache=False).logits[:, where]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), seq[:, where + 1].reshape(-1))
        loss.backward()  # no gradient clipping: it measurably delays the copy circuit here
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if target_loss > 0 and _converged(losses, window, target_loss, 2 if recall else 1):
            break
    return losses


def _converged(losses: list[float], window: int, target: float, tasks: int) -> bool:
    """Whether the mean of the last ``window`` losses of each of ``tasks`` interleaved tasks is < target."""
    if len(losses) < window * tasks:
        return False
    return all(sum(losses[-window * tasks + t :: tasks]) / window < target for t in range(tasks))


def _pack(seq: torch.Tensor, where: torch.Tensor, rows: int, pack: int, start_id: int):
    """``rows * pack`` problems of one length -> ``rows`` rows of ``pack`` problems, each opened by
    ``start_id``; the loss positions of every problem, shifted to its place in the row."""
    length = seq.shape[1] + 1
    opened = torch.cat([torch.full((seq.shape[0], 1), start_id), seq], dim=1)
    packed = opened.reshape(rows, pack * length)
    offsets = (torch.arange(pack) * length + 1).unsqueeze(1)
    return packed, (offsets + where.unsqueeze(0)).reshape(-1)


def _span_batch(gen, batch: int, n: int, first_id: int, vocab_size: int, sep_id: int):
    """``x_1 .. x_n <sep> x_1 .. x_n`` and the positions whose next token is the copy."""
    x = torch.randint(first_id, vocab_size, (batch, n), generator=gen)
    return torch.cat([x, torch.full((batch, 1), sep_id), x], dim=1), torch.arange(n, 2 * n)


def _recall_batch(gen, batch: int, n: int, first_id: int, vocab_size: int, sep_id: int):
    """``k_1 v_1 .. k_n v_n <sep> k_a v_a ..`` (distinct keys per row, queried in a random order) and the
    positions whose next token is a queried value."""
    span = vocab_size - first_id
    keys = torch.argsort(torch.rand(batch, span, generator=gen), dim=1)[:, :n] + first_id
    values = torch.randint(first_id, vocab_size, (batch, n), generator=gen)
    order = torch.argsort(torch.rand(batch, n, generator=gen), dim=1)
    context = torch.stack([keys, values], dim=2).reshape(batch, 2 * n)
    query = torch.stack([keys.gather(1, order), values.gather(1, order)], dim=2).reshape(batch, 2 * n)
    seq = torch.cat([context, torch.full((batch, 1), sep_id), query], dim=1)
    return seq, 2 * n + 1 + 2 * torch.arange(n)  # each queried key's position


def copy_accuracy(
    model: torch.nn.Module, *, vocab_size: int, depth: int = 256, n: int = 64, seed: int = 123,
    first_id: int = 3, sep_id: int = 1, start_id: int = 2,
) -> dict[str, float]:  # fmt: skip
    """Greedy accuracy on fresh span-copy (10 tokens) and recall (8 pairs) problems packed into rows of
    at least ``depth`` tokens, scored on each row's last problem only: whether the copy circuit works
    that far into a context (a quickstart tool result sits ~250 tokens in)."""
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = {}
    for task, length in (("span", 10), ("recall", 8)):
        size = 2 * length + 2 if task == "span" else 4 * length + 2
        pack = max(1, -(-depth // size) + 1)
        batch = _span_batch if task == "span" else _recall_batch
        seq, where = batch(gen, n * pack, length, first_id, vocab_size, sep_id)
        seq, where = _pack(seq, where, n, pack, start_id)
        last = where[-len(where) // pack :]
        with torch.no_grad():
            pred = model(input_ids=seq.to(device), use_cache=False).logits[:, last].argmax(-1).cpu()
        out[task] = float((pred == seq[:, last + 1]).float().mean())
    model.train(was_training)
    return out


def copy_converged(losses: list[float], *, window: int = 100, threshold: float = 0.5) -> bool:
    """Whether the copy circuit formed: the mean loss of the last ``window`` steps is below ``threshold``."""
    tail = losses[-window:]
    return bool(tail) and sum(tail) / len(tail) < threshold
