"""The environment side of a run, built once from ``env.*``: class, knobs, tasks and reward.

:func:`env_setup` imports the modules of ``env.imports`` (so user environments and rewards
register), looks up ``env.name``, resolves knobs that need objects (chat endpoints,
:mod:`horizonrl.train.rollout.env_knobs`), loads ``env.tasks`` (:mod:`horizonrl.envs.core.taskfile`)
and builds ``env.reward`` (:func:`horizonrl.rewards.make_reward`; the judge's endpoint is checked now,
and its cache defaults to ``<run dir>/judge_cache.jsonl``). Every problem is a
:class:`~horizonrl.config.ConfigError` naming the field, raised before any model is loaded.
Trainers and recipes take tasks from :meth:`EnvSetup.tasks` and environments from
:meth:`EnvSetup.make`.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from horizonrl.config import ConfigError, EnvConfig
from horizonrl.envs import Env, Task, get_env, import_env_modules
from horizonrl.envs.core.taskfile import TaskFileError, TaskFileSpec, load_task_file
from horizonrl.rewards import AnswerReward, RewardConfigError, make_reward
from horizonrl.train.rollout.env_knobs import resolve_knobs
from horizonrl.userimport import UserImportError

__all__ = ["EnvSetup", "env_setup"]

log = logging.getLogger(__name__)


@dataclass
class EnvSetup:
    """What a run needs from ``env.*`` (see the module docstring)."""

    cls: type[Env]
    knobs: dict[str, Any]
    reward: AnswerReward | None = None
    file_tasks: dict[str, list[Task]] | None = None
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = self.cls.name

    def make(self) -> Env:
        """A new environment instance with the configured reward."""
        env = self.cls(**self.knobs)
        if self.reward is not None:
            env.set_reward(self.reward)
        return env

    def tasks(self, n: int, *, seed: int, split: str) -> list[Task]:
        """``n`` tasks of ``split``: from the task file (all of them, or a seeded subsample of ``n``
        in file order when it has more), else from the environment's generator."""
        if self.file_tasks is None:
            try:
                return self.cls.make_tasks(n, seed=seed, split=split, **self.knobs)
            except ValueError as e:
                raise ConfigError(f"env.name={self.name!r} (env.{split}_tasks={n}, env.knobs): {e}") from None
        pool = self.file_tasks[split]
        if not pool:
            raise ConfigError(
                f"env.tasks: the file has no {split} rows (give a split column with {split} rows, or "
                "{train: FILE, test: FILE})"
            )
        if len(pool) <= n:
            return list(pool)
        keep = sorted(random.Random(f"{seed}:{split}").sample(range(len(pool)), n))
        return [pool[i] for i in keep]


def import_env_imports(imports: str | list) -> None:
    """Import the modules of ``env.imports`` (they register environments, rewards, gymnasium ids);
    ConfigError (one line) when one cannot be imported. The run checks call it before looking up
    ``env.name``."""
    try:
        import_env_modules(imports)
    except UserImportError as e:
        raise ConfigError(str(e)) from None


def env_setup(cfg: EnvConfig, *, run_dir: str | Path | None = None) -> EnvSetup:
    """Build the :class:`EnvSetup` of ``cfg`` (``run_dir``: where the judge cache goes by default)."""
    import_env_imports(cfg.imports)
    cls = get_env(cfg.name, field="env.name")
    try:
        knobs = resolve_knobs(dict(cfg.knobs))
        if hasattr(cls, "validate_knobs"):
            cls.validate_knobs(knobs)
    except ValueError as e:
        raise ConfigError(f"env.knobs: {e}") from None
    file_tasks = None
    if (cfg.tasks is not None or cfg.reward is not None) and not cls.qa_style:
        field_name = "env.tasks" if cfg.tasks is not None else "env.reward"
        raise ConfigError(
            f"{field_name}: environment {cfg.name!r} is not QA-style (it does not end with an answer "
            "graded against the task's), so it takes neither task files nor a configured reward"
        )
    if cfg.tasks is not None:
        try:
            file_tasks = load_task_file(
                TaskFileSpec.from_mapping(cfg.tasks), cls.name, required_fields=cls.task_fields
            )
        except TaskFileError as e:
            raise ConfigError(str(e)) from None
        log.info(
            "env.tasks: %d train and %d test tasks from %s",
            len(file_tasks["train"]),
            len(file_tasks["test"]),
            cfg.tasks["path"],
        )
    reward = None
    if cfg.reward is not None:
        cache = Path(run_dir) / "judge_cache.jsonl" if run_dir is not None else None
        try:
            reward = make_reward(cfg.reward, cfg.reward_params, judge_cache=cache)
        except RewardConfigError as e:
            raise ConfigError(str(e)) from None
    return EnvSetup(cls, knobs, reward, file_tasks)
