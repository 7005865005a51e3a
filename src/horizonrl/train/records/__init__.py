"""What a run leaves on disk; the bottom of ``train`` (imports only the layers below ``train``).

``checkpoint`` (atomic, exactly-resumable checkpoints that fall back past corrupt
ones), ``sharded_checkpoint`` (a torchrun run's: model and optimizer through
``torch.distributed.checkpoint``), ``export`` (a checkpoint or a run's latest as a plain
Hugging Face model directory, LoRA adapters merged), ``metrics`` (``metrics.jsonl``, the
configured experiment loggers, and the silent logger of ranks other than 0),
``loggers`` (``train.loggers`` backends) and ``rollout_log`` (``rollouts/step_N.jsonl``
with per-token advantages, rows and estimator side information).
"""
