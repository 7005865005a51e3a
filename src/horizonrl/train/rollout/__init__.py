"""Rollout collection and where it runs; imports ``update`` (the torchrun engine) and layers below ``train``.

``collect`` (G rollouts per task through the agent programs, rollout metrics,
pass@k evaluation), ``budget`` (the generated-token budget every arm is matched
on), ``staleness`` (bounded-staleness rollouts in a background thread,
``train.max_staleness``), ``workers`` (the engine and environments, local or as
Ray actors), ``env_setup`` and ``env_knobs`` (``env.*`` to environments, tasks
and rewards).
"""
