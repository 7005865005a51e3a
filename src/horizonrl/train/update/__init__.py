"""The policy update; imports ``records`` and the layers below ``train``.

``batching`` (rows to padded tensors, token-budgeted micro-batches, per-token
log-probs under the training model), ``lean`` (chunked log-probs, bf16 autocast, packed rows,
micro-batches sized from memory), ``ppo`` (PPO epochs over rows: mini-batches,
KL, the rollout/train consistency metrics). Under torchrun the update runs through
:class:`horizonrl.world.World` (DDP / FSDP2, each rank's share of a mini-batch).
"""
