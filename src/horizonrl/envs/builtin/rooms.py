"""``rooms``: an ALFWorld-like text game driven by one tool, ``act(command)``.

A few rooms joined by doors (a random tree), containers in them (some closed,
e.g. a fridge; some always open, e.g. a table) and objects in the containers.
The goal is "put the apple in the fridge". Every observation shows the current
room, what is visible and the admissible actions::

    You are in the kitchen. You see fridge (closed); table: apple. You hold nothing.
    Actions: open fridge, take apple, go to hall.

Commands: ``go to R``, ``open C``, ``close C``, ``take O``, ``put O in C`` (the
agent can carry several objects). A command that is not admissible gives
"Nothing happens." with ``invalid=True``. The episode ends with reward 1 as soon
as the goal object is put in the goal container (no ``<answer>`` is needed), or
with reward 0 after ``max_steps`` assistant messages. An ``<answer>`` also ends
the episode, with reward 0 (giving up). ``Task.answer`` holds the goal command.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any, ClassVar

from horizonrl.envs.core.base import Task
from horizonrl.envs.core.common import ToolEnv, check_int, check_noise
from horizonrl.envs.core.registry import register_env
from horizonrl.envs.core.tools import Tool, ToolCall, error_format_hint, format_tool_call

ROOMS = ("kitchen", "hall", "bedroom", "bathroom", "office", "garage", "garden", "attic")
OPENABLE = ("fridge", "drawer", "cabinet", "box", "safe", "chest", "locker", "oven")
SURFACES = ("table", "shelf", "counter", "desk", "bed", "sofa", "stool", "bench", "rack")
OBJECTS = ("apple", "key", "book", "cup", "pen", "sock", "coin", "ball", "mug", "phone", "plate", "card")
HELD = "held"

ACT = Tool(
    "act",
    "Do one action from the Actions list.",
    {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "the action"}},
        "required": ["command"],
    },
)


def normalize_command(command: str) -> str:
    """``Put the apple into the fridge.`` -> ``put apple in fridge``; ``go hall`` -> ``go to hall``."""
    words = re.sub(r"[^a-z0-9 ]", " ", command.lower()).split()
    words = [
        "in" if w in ("into", "inside", "on", "onto") else w for w in words if w not in ("the", "a", "an")
    ]
    if len(words) == 2 and words[0] == "go":
        words.insert(1, "to")
    return " ".join(words)


def _room_containers(st: dict[str, Any]) -> list[str]:
    return sorted(c for c, r in st["room_of"].items() if r == st["at"])


def _is_open(st: dict[str, Any], c: str) -> bool:
    return st["open"].get(c, True)


def admissible(st: dict[str, Any]) -> list[str]:
    """The commands that do something in state ``st``, in display order."""
    here = _room_containers(st)
    acts = [f"go to {r}" for r in st["doors"][st["at"]]]
    acts += [f"{'close' if _is_open(st, c) else 'open'} {c}" for c in here if c in st["open"]]
    visible = sorted(o for o, w in st["where"].items() if w in here and _is_open(st, w))
    acts += [f"take {o}" for o in visible]
    held = sorted(o for o, w in st["where"].items() if w == HELD)
    acts += [f"put {o} in {c}" for o in held for c in here if _is_open(st, c)]
    return acts


def describe(st: dict[str, Any]) -> str:
    """The observation of the current room (location, visible things, actions)."""
    parts = []
    for c in _room_containers(st):
        items = ", ".join(sorted(o for o, w in st["where"].items() if w == c)) or "empty"
        if c not in st["open"]:
            parts.append(f"{c}: {items}")
        else:
            parts.append(f"{c} (open): {items}" if st["open"][c] else f"{c} (closed)")
    held = ", ".join(sorted(o for o, w in st["where"].items() if w == HELD)) or "nothing"
    return (
        f"You are in the {st['at']}. You see {'; '.join(parts)}. You hold {held}.\n"
        f"Actions: {', '.join(admissible(st))}."
    )


def apply_command(st: dict[str, Any], command: str) -> tuple[str, bool]:
    """Execute ``command`` in ``st`` (mutated); return (message, invalid). Sets ``success`` on the goal."""
    cmd = normalize_command(command)
    if cmd not in admissible(st):
        return "Nothing happens.", True
    verb, *rest = cmd.split()
    if verb == "go":
        st["at"] = rest[1]
        return f"You go to the {rest[1]}.", False
    if verb in ("open", "close"):
        st["open"][rest[0]] = verb == "open"
        return f"You {verb} the {rest[0]}.", False
    if verb == "take":
        st["where"][rest[0]] = HELD
        return f"You take the {rest[0]}.", False
    obj, container = rest[0], rest[2]
    st["where"][obj] = container
    if [obj, container] == st["goal"]:
        st["done"] = st["success"] = True
        return f"You put the {obj} in the {container}. Task complete!", False
    return f"You put the {obj} in the {container}.", False


def _next_room(st: dict[str, Any], dest: str) -> str:
    """The first room on a shortest path from the current room to ``dest``."""
    prev: dict[str, str | None] = {st["at"]: None}
    queue = deque([st["at"]])
    while queue:
        r = queue.popleft()
        for nb in st["doors"][r]:
            if nb not in prev:
                prev[nb] = r
                queue.append(nb)
    step = dest
    while prev[step] != st["at"]:
        step = prev[step]  # type: ignore[assignment]
    return step


def expert_command(st: dict[str, Any]) -> str:
    """The next command of a shortest plan to the goal from ``st``."""
    obj, target = st["goal"]
    holder = target if st["where"][obj] == HELD else st["where"][obj]
    room = st["room_of"][holder]
    if st["at"] != room:
        return f"go to {_next_room(st, room)}"
    if not _is_open(st, holder):
        return f"open {holder}"
    return f"put {obj} in {target}" if holder == target else f"take {obj}"


def plan_length(st: dict[str, Any]) -> int:
    """Number of commands the noise-free expert needs from ``st``."""
    sim = {**st, "where": dict(st["where"]), "open": dict(st["open"]), "done": False, "success": False}
    n = 0
    while not sim["success"]:
        apply_command(sim, expert_command(sim))
        n += 1
    return n


@register_env("rooms")
class RoomsEnv(ToolEnv):
    """ALFWorld-like text game (see module docstring).

    Knobs: ``n_rooms`` (1-8, default 2), ``n_objects`` (1-12, default 2),
    ``max_steps`` (2-10000, default 10; tasks whose shortest plan is longer are not generated),
    ``hint`` (default false): the task also says where the object and the target container
    are ("the apple is in the drawer of the office; the fridge is in the kitchen"). Without it
    the scripted expert acts on hidden knowledge a policy cannot imitate (which room holds
    the object), so a small model's warm start can only wander; with it the expert's
    choices follow from what the policy sees, while the room text still hides the state of
    containers elsewhere (identical observations, different progress).
    """

    KNOBS: ClassVar[dict[str, Any]] = {"n_rooms": 2, "n_objects": 2, "max_steps": 10, "hint": False}
    system_prompt: ClassVar[str] = (
        f"Complete the task. Do one action from the Actions list per turn with {ACT.example_call()}."
    )

    @property
    def tools(self) -> list[Tool]:
        return [ACT]

    @classmethod
    def _check_knobs(cls, knobs: dict[str, Any]) -> None:
        check_int(cls.name, "n_rooms", knobs["n_rooms"], 1, len(ROOMS))
        check_int(cls.name, "n_objects", knobs["n_objects"], 1, len(OBJECTS))
        check_int(cls.name, "max_steps", knobs["max_steps"], 2, 10_000)  # every plan takes >= 2 steps
        if not isinstance(knobs["hint"], bool):
            raise ValueError(f"{cls.name}: knob 'hint' must be true or false, got {knobs['hint']!r}")

    @classmethod
    def _generate(cls, rng: Any, knobs: dict[str, Any]) -> dict[str, Any] | None:
        rooms = rng.sample(ROOMS, knobs["n_rooms"])
        doors: dict[str, list[str]] = {r: [] for r in rooms}
        for i in range(1, len(rooms)):
            other = rng.choice(rooms[:i])
            doors[rooms[i]].append(other)
            doors[other].append(rooms[i])
        counts = [2 if len(rooms) == 1 else rng.choice((1, 2)) for _ in rooms]
        containers = rng.sample(OPENABLE + SURFACES, sum(counts))
        owners = [r for r, k in zip(rooms, counts, strict=True) for _ in range(k)]
        room_of = dict(zip(containers, owners, strict=True))
        objects = rng.sample(OBJECTS, knobs["n_objects"])
        where = {o: rng.choice(containers) for o in objects}
        obj = rng.choice(objects)
        target = rng.choice([c for c in containers if c != where[obj]])
        world = {
            "doors": {r: sorted(d) for r, d in doors.items()},
            "room_of": room_of,
            "open": {c: False for c in containers if c in OPENABLE},
            "where": where,
            "goal": [obj, target],
            "start": rng.choice(rooms),
        }
        st = {**world, "at": world["start"]}
        if plan_length(st) > knobs["max_steps"]:
            return None
        hint = ""
        if knobs["hint"]:
            holder = where[obj]
            hint = (
                f" The {obj} is in the {holder} of the {room_of[holder]}; the {target} is in the "
                f"{room_of[target]}."
            )
        prompt = f"Your task: put the {obj} in the {target}.{hint}\n{describe(st)}"
        meta = {**world, "max_steps": knobs["max_steps"]}
        return {"prompt": prompt, "answer": f"put {obj} in {target}", "meta": meta, "key": world}

    def _init_state(self, task: Task) -> dict[str, Any]:
        m = task.meta
        return {
            "doors": {r: list(d) for r, d in m["doors"].items()},
            "room_of": dict(m["room_of"]),
            "open": dict(m["open"]),
            "where": dict(m["where"]),
            "goal": list(m["goal"]),
            "at": m["start"],
        }

    def _call_tool(self, call: ToolCall) -> tuple[str, bool]:
        msg, invalid = apply_command(self.state, call.arguments["command"])
        return (msg if self.state["done"] else f"{msg}\n{describe(self.state)}"), invalid

    def check_answer(self, answer: str) -> bool:
        """Rooms are finished by acting; an ``<answer>`` ends the episode unsolved."""
        return False

    def reminder(self) -> str:
        return f"No action found. {error_format_hint(self.tools)}"

    def state_key(self) -> str | None:
        st = self.state
        if not st:
            return None
        doors = ",".join(f"{c}={'open' if v else 'closed'}" for c, v in sorted(st["open"].items()))
        objs = ",".join(f"{o}@{w}" for o, w in sorted(st["where"].items()))
        return f"{st['task_id']}|at={st['at']}|{doors}|{objs}"

    def admissible_commands(self) -> list[str]:
        return admissible(self.state)

    def expert_action(self, rng: Any, noise: float = 0.0) -> str:
        """One ``act`` call with the next command of a shortest plan (replanned from the current state).

        With probability ``noise`` per call the expert instead takes a random
        admissible action other than the planned one.
        """
        noise = check_noise(noise)
        command = expert_command(self.state)
        if rng.random() < noise:
            others = [a for a in admissible(self.state) if a != command]
            if others:
                command = rng.choice(others)
        return format_tool_call("act", {"command": command})
