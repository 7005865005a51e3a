"""The one fit loop and the trainers built on it; imports ``rollout``, ``update``, ``records``, ``warmstart``.

``loop`` (:class:`~horizonrl.train.trainers.loop.Trainer`: evaluation schedule,
checkpoints, progress), ``registry`` (``train.trainer``), ``checks`` (a config
checked against every registry before any work), ``features`` (the typed seam
through which methods compute estimator inputs with a model), and the generic
trainers: ``group`` (GRPO and every estimator over groups of rollouts),
``reverse_turn`` (the shared machinery of per-turn reverse-order training) and
``gateway`` (groups recorded from an external harness). Nothing here names a
method; methods plug in from :mod:`horizonrl.train.methods`.
"""
