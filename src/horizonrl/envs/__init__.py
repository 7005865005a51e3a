"""Environments: the Env protocol, tools, and the built-in synthetic environments.

Importing this package registers the synthetic ``lookup``, ``rooms`` and ``arithmetic``,
the real-data ``airline`` (τ²-bench), ``household`` (ALFWorld PDDL), ``math_python``
(reasoning-gym + sandboxed Python) and ``search`` (local corpus, BM25 / dense) environments,
``qa`` (single-turn answers to file tasks), ``mcp`` (the tools of a local MCP server), ``gym``
(any gymnasium-style ``reset``/``step`` text environment, :mod:`horizonrl.envs.gym_text`) and
``openenv`` (an OpenEnv environment server, :mod:`horizonrl.envs.openenv_client`) and ``verifiers``
(an environment of the ``verifiers`` hub, :mod:`horizonrl.envs.verifiers_env`).
User environments subclass :class:`CustomEnv` with ``@tool`` methods (``docs/custom_env.md``)::

    from horizonrl.envs import get_env
    env = get_env("lookup")(hops=2)
    tasks = env.tasks(100, seed=0, split="train")
"""

from horizonrl.envs.airline import AirlineEnv
from horizonrl.envs.arithmetic import ArithmeticEnv
from horizonrl.envs.base import Env, EnvMessage, StepResult, Task
from horizonrl.envs.common import ToolEnv
from horizonrl.envs.custom import CustomEnv, QAEnv, ToolError, tool
from horizonrl.envs.gym_text import GymTextEnv  # registers "gym"; gymnasium loads only for knob 'id'
from horizonrl.envs.household import HouseholdEnv  # registers "household"; textworld loads on first use
from horizonrl.envs.lookup import LookupEnv
from horizonrl.envs.math_tool import (
    MathPythonEnv,
)  # registers "math_python"; reasoning-gym loads on first use
from horizonrl.envs.mcp import MCPEnv  # registers "mcp"; the mcp SDK loads on first use
from horizonrl.envs.openenv_client import OpenEnvEnv  # registers "openenv"; openenv-core loads on first use
from horizonrl.envs.registry import get_env, import_env_modules, list_envs, make_env, register_env
from horizonrl.envs.rooms import RoomsEnv
from horizonrl.envs.search import SearchEnv  # registers "search"; bm25s/faiss/torch load on first use
from horizonrl.envs.tools import (
    Tool,
    ToolCall,
    ToolCallError,
    format_answer,
    format_tool_call,
    parse_answer,
    parse_tool_calls,
)
from horizonrl.envs.verifiers_env import VerifiersEnv  # registers "verifiers"; verifiers loads on first use

__all__ = [
    "AirlineEnv",
    "ArithmeticEnv",
    "CustomEnv",
    "Env",
    "EnvMessage",
    "GymTextEnv",
    "HouseholdEnv",
    "LookupEnv",
    "MCPEnv",
    "MathPythonEnv",
    "OpenEnvEnv",
    "QAEnv",
    "RoomsEnv",
    "SearchEnv",
    "StepResult",
    "Task",
    "Tool",
    "ToolCall",
    "ToolCallError",
    "ToolEnv",
    "ToolError",
    "VerifiersEnv",
    "format_answer",
    "format_tool_call",
    "get_env",
    "import_env_modules",
    "list_envs",
    "make_env",
    "parse_answer",
    "parse_tool_calls",
    "register_env",
    "tool",
]
