"""A test environment with a dense reward, so a random tiny policy gets non-zero advantages.

``arith_shaped`` is ``arithmetic`` plus a step reward ``(len(action) % 7) / 7`` — a deterministic
function of the sampled text, so groups always have a reward spread and the update is not a no-op.
Imported by the distributed/Ray tests and by the torchrun worker script ``dist_run.py``.
"""

from __future__ import annotations

from horizonrl.envs.arithmetic import ArithmeticEnv
from horizonrl.envs.base import StepResult
from horizonrl.envs.registry import register_env


@register_env("arith_shaped")
class ShapedArithmeticEnv(ArithmeticEnv):
    def step(self, action: str) -> StepResult:
        result = super().step(action)
        result.reward += (len(action) % 7) / 7
        return result
