"""A test environment with a dense reward, so a random tiny policy gets non-zero advantages, and the
small runs the tests share (their overrides and configs).

``arith_shaped`` is ``arithmetic`` plus a step reward ``(len(action) % 7) / 7`` — a deterministic
function of the sampled text, so groups always have a reward spread and the update is not a no-op.
Imported by the distributed/Ray tests, by the torchrun worker script ``dist_run.py`` and by
benchmarks/scale.py (from its file).
"""

from __future__ import annotations

# the package's public names: tests/scale/test_async_rollout.py also imports this module under the sources
# of an older commit, whose envs/ had no wings
from horizonrl.envs import ArithmeticEnv, StepResult, register_env


@register_env("arith_shaped")
class ShapedArithmeticEnv(ArithmeticEnv):
    def step(self, action: str) -> StepResult:
        result = super().step(action)
        result.reward += (len(action) % 7) / 7
        return result


def small_run_overrides(model_dir, *extra: str) -> list[str]:
    """Overrides of the small ``arith_shaped`` run shared by the distributed tests and benchmarks/scale.py."""
    return [
        f"model.path={model_dir}",
        "env.name=arith_shaped",
        "env.knobs={n_ops: 1, max_operand: 9}",
        "env.train_tasks=40",
        "env.test_tasks=2",
        "rollout.group_size=4",
        "rollout.tasks_per_step=2",
        "rollout.max_new_tokens=16",
        "rollout.max_turns=2",
        "rollout.context_budget=512",
        "optim.lr=1e-2",
        "train.eval_samples=1",
        "train.progress=false",
        "train.eval_at_start=false",
        *extra,
    ]


def arith_run_overrides(model_dir, out_dir, *extra: str) -> list[str]:
    """Overrides of a small run on the packaged ``arithmetic`` env (trainer, reliability and vLLM tests)."""
    return [
        f"model.path={model_dir}",
        "env.name=arithmetic",
        "env.knobs={n_ops: 1, max_operand: 9}",
        "env.train_tasks=40",
        "env.test_tasks=4",
        "rollout.group_size=4",
        "rollout.tasks_per_step=2",
        "rollout.max_new_tokens=24",
        "rollout.max_turns=3",
        "rollout.context_budget=512",
        "optim.lr=1e-3",
        "train.eval_samples=2",
        "train.progress=false",
        f"train.out_dir={out_dir}",
        *extra,
    ]


def small_run_config(model_dir, out_dir, *extra: str):
    """The config of :func:`small_run_overrides` writing to ``out_dir``."""
    from horizonrl.config import load_config

    return load_config(None, small_run_overrides(model_dir, f"train.out_dir={out_dir}", *extra))


def arith_run_config(model_dir, out_dir, *extra: str):
    """The config of :func:`arith_run_overrides`."""
    from horizonrl.config import load_config

    return load_config(None, arith_run_overrides(model_dir, out_dir, *extra))


def two_op_run_config(model_dir, out_dir, *extra: str):
    """A group-trainer run on ``arithmetic`` with two operations and no evaluation unless asked
    (dynamic sampling and greedy evaluation tests)."""
    from horizonrl.config import load_config

    return load_config(
        None,
        [
            f"model.path={model_dir}",
            "env.name=arithmetic",
            "env.knobs={n_ops: 2, max_operand: 9}",
            "env.train_tasks=40",
            "env.test_tasks=2",
            "rollout.tasks_per_step=2",
            "rollout.group_size=4",
            "rollout.max_new_tokens=16",
            "rollout.max_turns=3",
            "train.eval_at_start=false",
            f"train.eval_every={10**6}",
            "train.eval_samples=1",
            "train.progress=false",
            f"train.out_dir={out_dir}",
            *extra,
        ],
    )


def rtpo_run_config(model_dir, out_dir, *extra: str):
    """One RTPO step on ``arithmetic`` with two operations, 3 siblings per boundary."""
    from horizonrl.config import load_config

    return load_config(
        None,
        [
            f"model.path={model_dir}",
            "env.name=arithmetic",
            "env.knobs={n_ops: 2, max_operand: 9}",
            "env.train_tasks=40",
            "env.test_tasks=2",
            "rollout.tasks_per_step=2",
            "rollout.max_new_tokens=16",
            "rollout.max_turns=3",
            "rollout.context_budget=1024",
            "optim.lr=1e-3",
            "train.eval_samples=1",
            "train.progress=false",
            "train.trainer=rtpo",
            "train.steps=1",
            "train.trainer_params.siblings=3",
            f"train.out_dir={out_dir}",
            *extra,
        ],
    )
