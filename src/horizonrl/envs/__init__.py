"""Environments: the Env protocol, tools, the built-in environments, hub adapters and the sandbox.

Four wings; a newcomer reads ``core`` and nothing else to write an environment:

- :mod:`horizonrl.envs.core`: the protocol. ``base`` (``Env``, ``Task``, ``StepResult``,
  ``EnvMessage``), ``tools`` (tool declarations, the parser of tool calls and answers),
  ``common`` (``ToolEnv``, the turn protocol of tool environments, and knob checks),
  ``custom`` (``CustomEnv`` and ``@tool``; the ``qa`` environment), ``registry``
  (``register_env``, ``get_env``), ``taskfile`` (tasks from local files, ``env.tasks``) and
  ``remote`` (environments in Ray actors). It imports no other wing.
- :mod:`horizonrl.envs.builtin`: the environments horizonrl ships: the synthetic ``lookup``,
  ``rooms`` and ``arithmetic`` (with ``calculator`` and the ``names`` pool), and the real-data
  ``airline`` (τ²-bench), ``household`` (ALFWorld PDDL), ``math_python`` (reasoning-gym +
  sandboxed Python, ``math_tool``) and ``search`` (local corpus, BM25 / dense).
- :mod:`horizonrl.envs.hubs`: adapters of environments defined elsewhere: ``gym`` (any
  gymnasium-style ``reset``/``step`` text environment, ``gym_text``), ``openenv`` (an OpenEnv
  server, ``openenv_client``), both over one turn protocol (``episodic``), ``mcp`` (the tools of
  a local MCP server) and ``verifiers`` (an environment of the ``verifiers`` hub, ``verifiers_env``).
- :mod:`horizonrl.envs.sandbox`: run untrusted Python in a limited process (``run_python``);
  it knows nothing of environments.

Wings import ``core`` and never each other, except ``builtin.math_tool``, which runs its
``python`` tool in the sandbox. Importing this package registers every environment above
(each loads its third-party library on first use). User environments subclass
:class:`CustomEnv` with ``@tool`` methods (``docs/custom_env.md``)::

    from horizonrl.envs import get_env
    env = get_env("lookup")(hops=2)
    tasks = env.tasks(100, seed=0, split="train")
"""

# Importing each environment's module registers it; third-party libraries load on first use.
from horizonrl.envs.builtin.airline import AirlineEnv
from horizonrl.envs.builtin.arithmetic import ArithmeticEnv
from horizonrl.envs.builtin.household import HouseholdEnv
from horizonrl.envs.builtin.lookup import LookupEnv
from horizonrl.envs.builtin.math_tool import MathPythonEnv
from horizonrl.envs.builtin.rooms import RoomsEnv
from horizonrl.envs.builtin.search import SearchEnv
from horizonrl.envs.core.base import Env, EnvMessage, StepResult, Task
from horizonrl.envs.core.common import ToolEnv
from horizonrl.envs.core.custom import CustomEnv, QAEnv, ToolError, tool
from horizonrl.envs.core.registry import get_env, import_env_modules, list_envs, make_env, register_env
from horizonrl.envs.core.tools import (
    Tool,
    ToolCall,
    ToolCallError,
    format_answer,
    format_tool_call,
    parse_answer,
    parse_tool_calls,
)
from horizonrl.envs.hubs.gym_text import GymTextEnv
from horizonrl.envs.hubs.mcp import MCPEnv
from horizonrl.envs.hubs.openenv_client import OpenEnvEnv
from horizonrl.envs.hubs.verifiers_env import VerifiersEnv

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
