"""The ``env`` section: the environment, its task pool (generated or from a file) and its answer reward."""

from __future__ import annotations

from dataclasses import dataclass

from horizonrl.config.fields import MAX_SEED, _Section, opt
from horizonrl.errors import ConfigError


@dataclass(frozen=True)
class EnvConfig(_Section):
    _prefix = "env."
    name: str = opt("arithmetic", "registered environment name (see `horizonrl envs`)")
    knobs: dict = opt({}, "difficulty knobs passed to the environment and its task generator")
    train_tasks: int = opt(
        2000, "size of the training task pool (a task file: at most this many rows)", gt=0, le=10**7
    )
    test_tasks: int = opt(
        100, "number of held-out evaluation tasks (a task file: at most this many)", gt=0, le=10**6
    )
    seed: int = opt(
        0,
        "seed of the task generator (a task file: of the subsample when it has more rows)",
        ge=0,
        le=MAX_SEED,
    )
    imports: list | str = opt(
        [],
        "modules imported before env.name is looked up, so that environments and rewards defined in your "
        "own code register: dotted names on sys.path (mypkg.envs) or .py file paths",
    )
    tasks: dict | None = opt(
        None,
        "tasks from a local file instead of the generator: {path: FILE.jsonl|.json|.csv|.parquet (or "
        "{train: FILE, test: FILE}), prompt: COLUMN, answer: COLUMN, id: COLUMN, split: COLUMN (train/test), "
        "aliases: COLUMN}; QA-style environments and CustomEnv subclasses (docs/custom_env.md)",
    )
    reward: str | None = opt(
        None,
        "answer reward of a QA-style environment: exact_match | token_f1 | math_equivalent | judge | "
        "module:function (also path/file.py:function); null = the environment's own check",
    )
    reward_params: dict = opt(
        {},
        "parameters of env.reward: judge {url, model, cache, api_key_env, timeout_s, max_retries, "
        "max_tokens}; math_equivalent {timeout_s}; module:function: keyword arguments",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        imports = [self.imports] if isinstance(self.imports, str) else self.imports
        for item in imports:
            if not isinstance(item, str) or not item.strip():
                raise ConfigError(
                    f"env.imports={self.imports!r}: each entry must be a module name or .py path"
                )
        if self.tasks is not None:
            from horizonrl.envs.core.taskfile import TaskFileError, TaskFileSpec

            try:
                TaskFileSpec.from_mapping(self.tasks)
            except TaskFileError as e:
                raise ConfigError(str(e)) from None
        if self.reward is not None and not (
            self.reward.replace("_", "a").isalnum() or (":" in self.reward and self.reward.rpartition(":")[2])
        ):
            raise ConfigError(f"env.reward={self.reward!r}: expected a reward name or module:function")
        if self.reward_params and self.reward is None:
            raise ConfigError(f"env.reward_params={self.reward_params!r}: set only together with env.reward")
