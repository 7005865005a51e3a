"""ALFWorld-style household games over the PDDL domain and grammar that ``alfworld`` ships.

Importing this package registers the ``household`` environment (textworld itself is
imported on first use)::

    from horizonrl.envs import make_env
    import horizonrl.envs.builtin.household  # noqa: F401  (registers "household")
    env = make_env("household", task_types="heat,cool")
    tasks = env.tasks(10, seed=0)

Modules: :mod:`.pddl` (a small PDDL interpreter), :mod:`.game` (textworld's grammar
engine over the shipped ``alfred.pddl``/``alfred.twl2``), :mod:`.problems` (the
problem generator), :mod:`.expert` (the scripted expert), :mod:`.env` (the Env).
"""

from typing import Any

from horizonrl.envs.builtin.household.env import HouseholdEnv
from horizonrl.envs.builtin.household.problems import TASK_TYPES

__all__ = ["TASK_TYPES", "HouseholdEnv", "HouseholdGame", "load_game", "shipped_logic"]


def __getattr__(name: str) -> Any:
    """``HouseholdGame``, ``load_game`` and ``shipped_logic`` from :mod:`.game`, imported lazily."""
    if name in ("HouseholdGame", "load_game", "shipped_logic"):
        from horizonrl.envs.builtin.household import game

        return getattr(game, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
