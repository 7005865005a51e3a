"""The one fit loop and the trainers built on it; imports ``rollout``, ``update``, ``records``, ``warmstart``.

``loop`` (:class:`~horizonrl.train.trainers.loop.Trainer`: evaluation schedule,
checkpoints, progress), ``workspace`` (the run built once into a typed
:class:`~horizonrl.train.trainers.workspace.RunWorkspace` that every trainer holds,
with the checkpoint state they share), ``registry`` (``train.trainer``),
``checks`` (a config checked against every registry before any work),
``features`` (the typed seam through which methods compute estimator inputs with a
model), ``train_context`` (the seam through which methods register what a turn is
trained under, ``algo.train_context``), and the generic trainers: ``group`` (GRPO
and every estimator over groups of rollouts) and ``gateway`` (groups recorded from
an external harness). Nothing here names a method; methods, and the machinery only
they use (``methods.reverse_turn``), plug in from :mod:`horizonrl.train.methods`.
"""
