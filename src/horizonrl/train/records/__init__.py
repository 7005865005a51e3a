"""What a run leaves on disk; the bottom of ``train`` (imports only the layers below ``train``).

``checkpoint`` (atomic, exactly-resumable checkpoints that fall back past corrupt
ones), ``metrics`` (``metrics.jsonl`` and the configured experiment loggers),
``loggers`` (``train.loggers`` backends) and ``rollout_log`` (``rollouts/step_N.jsonl``
with per-token advantages, rows and estimator side information).
"""
