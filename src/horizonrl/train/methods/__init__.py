"""Each method's training-side home, one module per method; imports ``trainers`` and everything below.

A method's NumPy math stays in ``horizonrl.credit.<name>`` (torch-free); everything
else it needs in training lives here: ``ccpo`` (frozen-model hidden states),
``info_gain`` (Mosaic's and IGPO's teacher-forced information gain),
``reverse_turn`` (the machinery RTPO and SeeUPO share: sweeps of per-turn stages,
``ReverseTurnParams``, their ``credit`` records), ``rtpo`` (the reverse-turn
trainer, and the ``flat`` training context of its flattened-GRPO baseline) and
``seeupo`` (its per-turn baseline). Importing this package registers every feature
provider, training-context view and method trainer; the registries in
:mod:`horizonrl.train.trainers` import it before their first lookup.
"""

from horizonrl.train.methods import ccpo, info_gain, reverse_turn, rtpo, seeupo

__all__ = ["ccpo", "info_gain", "reverse_turn", "rtpo", "seeupo"]
