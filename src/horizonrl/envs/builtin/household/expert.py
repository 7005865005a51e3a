"""The scripted expert of the household games (the demonstrations' planner).

Like ALFWorld's hand-coded TextWorld expert it reads the true state (where every
object is) and replans from the current state at every step, so it recovers from
any detour a noisy policy took. It picks the ground action it wants and emits the
admissible command that textworld's grammar derives for that action, so an expert
command is always admissible.

The plan: put away a held object that is not wanted; go to an object of the goal
type that is not yet where it must be, open its receptacle if closed, take it;
clean / heat / cool it at the sink basin / microwave / fridge when the task asks;
for ``examine`` go to the desk lamp and use it; otherwise go to the goal receptacle
(for ``pick_two`` the one already holding most goal objects), open it if closed and
move the object there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from horizonrl.envs.builtin.household.pddl import Atom
from horizonrl.envs.builtin.household.problems import AGENT, APPLIANCE, PROPERTY, type_of

if TYPE_CHECKING:  # game imports textworld (about a second); the expert only needs its methods
    from horizonrl.envs.builtin.household.game import GroundAction, HouseholdGame


class NoPlanError(RuntimeError):
    """The expert found no admissible action towards the goal (a bug in the generator or expert)."""


def _facts(state: frozenset[Atom], pred: str) -> list[Atom]:
    return sorted(a for a in state if a[0] == pred)


def next_action(game: HouseholdGame, state: frozenset[Atom], meta: dict) -> GroundAction:
    """The expert's next ground action for the task described by ``meta`` in ``state``."""
    task, obj, recep = meta["task_type"], meta["object"], meta["receptacle"]
    at = next(a[2] for a in _facts(state, "atlocation") if a[1] == AGENT)
    held = next((a[2] for a in _facts(state, "holds") if a[1] == AGENT), None)
    where = {a[1]: a[2] for a in _facts(state, "inreceptacle")}
    loc = {a[1]: a[2] for a in _facts(state, "receptacleatlocation")}
    rtype = {a[1]: a[2][: -len("type")] for a in _facts(state, "receptacletype")}
    opened = {a[1] for a in _facts(state, "opened")}
    openable = {a[1] for a in _facts(state, "openable")}
    objects = sorted(o for o, t in game.problem.objects.items() if t == "object")
    prop = PROPERTY[task][1] if task in PROPERTY else None

    def ready(o: str) -> bool:
        return prop is None or (prop, o) in state

    def reach(r: str, then: GroundAction) -> GroundAction:
        """Go to receptacle ``r``, open it if needed, then do ``then``."""
        if at != loc[r]:
            return ("gotolocation", (AGENT, at, loc[r], r))
        if r in openable and r not in opened and then[0] in ("pickupobject", "putobject"):
            return ("openobject", (AGENT, at, r))
        return then

    def put(o: str, r: str) -> GroundAction:
        return reach(r, ("putobject", (AGENT, loc[r], o, r, f"{type_of(o)}type", f"{rtype[r]}type")))

    goal_objs = [o for o in objects if type_of(o) == obj]
    target: str | None = None
    if recep is not None:
        targets = sorted(r for r in loc if rtype[r] == recep)
        # pick_two needs both in one receptacle: aim at the one already holding most finished objects
        target = max(
            targets, key=lambda r: (sum(where.get(o) == r and ready(o) for o in goal_objs), -targets.index(r))
        )
    need = 2 if task == "pick_two" else 1
    done = [o for o in goal_objs if target is not None and where.get(o) == target and ready(o)]
    if target is not None and len(done) >= need:
        raise NoPlanError(f"the goal of task {meta.get('description')!r} is already reached")

    if held is not None and (type_of(held) != obj or held in done):
        homes = [r for r in sorted(loc) if type_of(held) in _can_contain(state, rtype[r])]
        homes.sort(key=lambda r: (loc[r] != at, r))  # prefer a receptacle right here
        return put(held, homes[0])
    if held is None:
        todo = [o for o in goal_objs if o not in done and o in where]
        if not todo:
            raise NoPlanError(f"no {obj} left to take for task {meta.get('description')!r}")
        o = todo[0]
        return reach(where[o], ("pickupobject", (AGENT, loc[where[o]], o, where[o])))
    if task == "examine":
        lamps = [o for o in objects if ("toggleable", o) in state and type_of(o) == meta["toggle"]]
        if not lamps or lamps[0] not in where:
            raise NoPlanError(
                f"no {meta['toggle']} standing on a receptacle for task {meta.get('description')!r}"
            )
        lamp = lamps[0]
        return reach(where[lamp], ("toggleobject", (AGENT, loc[where[lamp]], lamp, where[lamp])))
    if not ready(held):
        appliance = sorted(r for r in loc if rtype[r] == APPLIANCE[task])[0]
        verb = {"clean": "cleanobject", "heat": "heatobject", "cool": "coolobject"}[task]
        return reach(appliance, (verb, (AGENT, loc[appliance], appliance, held)))
    assert target is not None
    return put(held, target)


def _can_contain(state: frozenset[Atom], rtype: str) -> set[str]:
    return {a[2][: -len("type")] for a in state if a[0] == "cancontain" and a[1] == f"{rtype}type"}


def expert_command(game: HouseholdGame, state: frozenset[Atom], meta: dict) -> str:
    """The admissible command text of :func:`next_action`."""
    want = next_action(game, state, meta)
    if want not in game.world.applicable(state):
        raise NoPlanError(f"expert action {want!r} is not applicable; admissible: {game.admissible(state)}")
    return game.command(state, want)


def expert_plan(game: HouseholdGame, state: frozenset[Atom], meta: dict, limit: int = 200) -> list[str]:
    """The commands the noise-free expert plays from ``state`` until the goal is reached."""
    plan: list[str] = []
    while not game.won(state):
        if len(plan) >= limit:
            raise NoPlanError(f"expert plan exceeds {limit} steps for task {meta.get('description')!r}")
        action = next_action(game, state, meta)
        if action not in game.world.applicable(state):
            raise NoPlanError(
                f"expert action {action!r} is not applicable; admissible: {game.admissible(state)}"
            )
        plan.append(game.command(state, action))
        state = game.apply(state, action)
    return plan
