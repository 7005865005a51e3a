"""The policy update; imports ``records`` and the layers below ``train``.

One forward path, ``forward`` (rows -> micro-batches -> per-token log-probs), over
``batching`` (rows to padded tensors, token-budgeted micro-batches, the plain log-prob
forward), ``chunks`` (which rows form each micro-batch: by padded or packed tokens, or
shared-prefix forests; each rank's share), ``tree`` (the forest layout and its tree mask)
and ``lean`` (chunked LM head, bf16 autocast, packed rows, micro-batches sized from
memory). ``ppo`` is the loss loop over it: PPO epochs, mini-batches, KL, the rollout/train
consistency metrics. Under torchrun the update runs through :class:`horizonrl.world.World`
(DDP / FSDP2, each rank's share of a mini-batch).
"""
