"""A generator of small ALFWorld-style PDDL problems for the shipped ``alfred.pddl`` domain.

A problem is one room: an agent standing in the middle (``loc_0``, no receptacle
there), a few receptacles, each at its own location (``countertop 1`` at
``loc_3``), and objects inside them. The six ALFWorld task types:

==========  =====================================  ==================================
type        ALFWorld name                          description (one of two templates)
==========  =====================================  ==================================
pick        pick_and_place_simple                  put some apple on countertop
clean       pick_clean_then_place_in_recep         clean some apple and put it in ...
heat        pick_heat_then_place_in_recep          heat some egg and put it in ...
cool        pick_cool_then_place_in_recep          cool some potato and put it in ...
examine     look_at_obj_in_light                   look at book under the desklamp
pick_two    pick_two_obj_and_place                 put two cellphone in sofa
==========  =====================================  ==================================

Goals are the PDDL goals of ALFWorld's goal library (``alfworld/gen/goal_library.py``),
so they are existential: any object of the type in any receptacle of the type.
Kitchen tasks always have a fridge, a microwave and a sink basin; the ``examine``
scene always has a desk lamp on a desk or side table. The goal receptacle of a clean,
heat or cool task is never the sink basin, microwave, fridge or garbage can. No object
of the goal type starts in a receptacle of the goal type, so no task is solved at the
start.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

TASK_TYPES = ("pick", "clean", "heat", "cool", "examine", "pick_two")
AGENT = "agent1"
START = "loc_0"

FOOD = ("apple", "egg", "potato", "tomato", "lettuce", "bread")
DISHES = ("mug", "cup", "bowl", "plate")
CUTLERY = ("fork", "spoon")
KITCHEN_OBJECTS = FOOD + DISHES + CUTLERY
SMALL = ("book", "cellphone", "keychain", "pen", "pencil", "creditcard", "remotecontrol", "cd")
BEDROOM_OBJECTS = SMALL
LAMP = "desklamp"

HEATABLE = frozenset({"apple", "egg", "potato", "tomato", "bread", "mug", "cup", "plate"})
COOLABLE = frozenset({"apple", "egg", "potato", "tomato", "bread", "lettuce", "mug", "cup", "plate", "bowl"})
CLEANABLE = frozenset(
    {"apple", "egg", "potato", "tomato", "lettuce", "mug", "cup", "plate", "bowl", *CUTLERY}
)
PROPERTY = {"clean": ("cleanable", "isclean"), "heat": ("heatable", "ishot"), "cool": ("coolable", "iscool")}
APPLIANCE = {"clean": "sinkbasin", "heat": "microwave", "cool": "fridge"}

OPENABLE = frozenset({"fridge", "microwave", "cabinet", "drawer", "safe"})
CAN_CONTAIN: dict[str, frozenset[str]] = {
    "countertop": frozenset(KITCHEN_OBJECTS),
    "diningtable": frozenset(KITCHEN_OBJECTS),
    "sinkbasin": frozenset(CLEANABLE),
    "fridge": frozenset(FOOD + DISHES),
    "microwave": frozenset(FOOD + DISHES),
    "cabinet": frozenset(DISHES),
    "shelf": frozenset(DISHES + SMALL),
    "drawer": frozenset((*CUTLERY, "keychain", "creditcard", "cellphone", "pen", "pencil", "cd", "book")),
    "garbagecan": frozenset(
        ("apple", "egg", "potato", "tomato", "lettuce", "pen", "pencil", "cd", "creditcard")
    ),
    "stoveburner": frozenset(("egg", "potato", "tomato")),
    "desk": frozenset(SMALL),
    "sidetable": frozenset(SMALL),
    "dresser": frozenset(SMALL),
    "coffeetable": frozenset(SMALL),
    "bed": frozenset(("book", "cellphone", "remotecontrol", "creditcard", "keychain")),
    "sofa": frozenset(("book", "cellphone", "remotecontrol", "creditcard", "keychain")),
    "safe": frozenset(("keychain", "creditcard", "cellphone", "cd")),
}
KITCHEN_REQUIRED = ("fridge", "microwave", "sinkbasin", "countertop")
KITCHEN_OPTIONAL = ("cabinet", "cabinet", "cabinet", "drawer", "drawer", "diningtable", "shelf", "garbagecan")
KITCHEN_OPTIONAL += ("stoveburner", "countertop")
BEDROOM_REQUIRED = ("desk",)
BEDROOM_OPTIONAL = ("sidetable", "dresser", "bed", "sofa", "shelf", "drawer", "drawer", "safe", "coffeetable")
BEDROOM_OPTIONAL += ("garbagecan", "shelf")
# Type constants named by the domain's actions; declared in every problem so that a PDDL
# planner (e.g. Fast Downward) accepts the file even where the scene has no such thing.
DOMAIN_CONSTANTS_R = ("sinkbasintype", "microwavetype", "fridgetype")
DOMAIN_CONSTANTS_O = ("knifetype", "butterknifetype")

GOALS = {
    "pick": """(exists (?r - receptacle) (exists (?o - object) (and (inReceptacle ?o ?r)
        (objectType ?o {obj}Type) (receptacleType ?r {recep}Type))))""",
    "clean": """(exists (?r - receptacle) (exists (?o - object) (and (cleanable ?o) (objectType ?o {obj}Type)
        (receptacleType ?r {recep}Type) (isClean ?o) (inReceptacle ?o ?r))))""",
    "heat": """(exists (?r - receptacle) (exists (?o - object) (and (heatable ?o) (objectType ?o {obj}Type)
        (receptacleType ?r {recep}Type) (isHot ?o) (inReceptacle ?o ?r))))""",
    "cool": """(exists (?r - receptacle) (exists (?o - object) (and (coolable ?o) (objectType ?o {obj}Type)
        (receptacleType ?r {recep}Type) (isCool ?o) (inReceptacle ?o ?r))))""",
    "pick_two": """(exists (?r - receptacle) (exists (?o1 - object) (and (objectType ?o1 {obj}Type)
        (receptacleType ?r {recep}Type) (inReceptacle ?o1 ?r) (exists (?o2 - object) (and (not (= ?o1 ?o2))
        (objectType ?o2 {obj}Type) (receptacleType ?r {recep}Type) (inReceptacle ?o2 ?r))))))""",
    "examine": """(and (exists (?ot - object ?r - receptacle ?a - agent ?l - location) (and
        (objectType ?ot {toggle}Type) (toggleable ?ot) (isToggled ?ot) (receptacleAtLocation ?r ?l)
        (atLocation ?a ?l) (inReceptacle ?ot ?r)))
        (exists (?o - object ?a - agent) (and (objectType ?o {obj}Type) (holds ?a ?o))))""",
}
TEMPLATES = {
    "pick": ("put a {obj} in {recep}", "put some {obj} on {recep}"),
    "clean": ("put a clean {obj} in {recep}", "clean some {obj} and put it in {recep}"),
    "heat": ("put a hot {obj} in {recep}", "heat some {obj} and put it in {recep}"),
    "cool": ("put a cool {obj} in {recep}", "cool some {obj} and put it in {recep}"),
    "pick_two": ("put two {obj} in {recep}", "find two {obj} and put them in {recep}"),
    "examine": ("look at {obj} under the {toggle}", "examine the {obj} with the {toggle}"),
}


@dataclass
class Spec:
    """A generated problem before rendering: goal, receptacles, objects and where they are."""

    task_type: str
    obj: str  # goal object type, e.g. "apple"
    recep: str | None  # goal receptacle type (None for examine)
    toggle: str | None  # lamp type for examine
    receptacles: list[str] = field(default_factory=list)  # ids, e.g. "cabinet_2"
    location: dict[str, str] = field(default_factory=dict)  # receptacle id -> location id
    contents: dict[str, str] = field(default_factory=dict)  # object id -> receptacle id
    description: str = ""


def type_of(entity: str) -> str:
    """``cabinet_2`` -> ``cabinet``."""
    return entity.rsplit("_", 1)[0]


def display_name(entity: str) -> str:
    """``cabinet_2`` -> ``cabinet 2`` (ALFWorld's demangled names)."""
    base, _, num = entity.rpartition("_")
    return f"{base} {num}"


def _number(types: list[str]) -> list[str]:
    counts: dict[str, int] = {}
    out = []
    for t in types:
        counts[t] = counts.get(t, 0) + 1
        out.append(f"{t}_{counts[t]}")
    return out


def sample_spec(rng: random.Random, task_type: str, n_receptacles: int, n_objects: int) -> Spec | None:
    """One random problem of ``task_type`` (None when the draw cannot host the task)."""
    if task_type not in TASK_TYPES:
        raise ValueError(f"unknown household task type {task_type!r}; known: {', '.join(TASK_TYPES)}")
    kitchen = task_type in ("clean", "heat", "cool") or (task_type != "examine" and rng.random() < 0.5)
    required = list(KITCHEN_REQUIRED if kitchen else BEDROOM_REQUIRED)
    optional = list(KITCHEN_OPTIONAL if kitchen else BEDROOM_OPTIONAL)
    extra = max(0, n_receptacles - len(required))
    rtypes = sorted(required + rng.sample(optional, min(extra, len(optional))))
    receptacles = _number(rtypes)
    universe = KITCHEN_OBJECTS if kitchen else BEDROOM_OBJECTS
    if task_type in PROPERTY:
        universe = tuple(
            o for o in universe if o in {"clean": CLEANABLE, "heat": HEATABLE, "cool": COOLABLE}[task_type]
        )
    obj = rng.choice(universe)
    recep: str | None = None
    if task_type != "examine":
        # a cleaned / heated / cooled object goes to a table, shelf, cabinet..., not into an appliance
        banned = {*APPLIANCE.values(), "garbagecan"} if task_type in APPLIANCE else set()
        targets = sorted({type_of(r) for r in receptacles if obj in CAN_CONTAIN[type_of(r)]} - banned)
        if not targets:
            return None
        recep = rng.choice(targets)
    toggle = LAMP if task_type == "examine" else None
    spec = Spec(task_type, obj, recep, toggle, receptacles)
    locs = rng.sample(range(1, len(receptacles) + 1), len(receptacles))
    spec.location = {r: f"loc_{k}" for r, k in zip(receptacles, locs, strict=True)}
    # Goal objects first (1, or 2 for pick_two), then distractors of any kind in the scene.
    n_goal = 2 if task_type == "pick_two" else 1
    kinds = [obj] * n_goal + [
        rng.choice(KITCHEN_OBJECTS if kitchen else BEDROOM_OBJECTS) for _ in range(n_objects)
    ]
    kinds = kinds[: max(n_objects, n_goal)]
    if toggle:
        kinds.append(toggle)
    for oid, kind in zip(_number(kinds), kinds, strict=True):
        if kind == LAMP:
            homes = [r for r in receptacles if type_of(r) in ("desk", "sidetable")]
        else:
            homes = [r for r in receptacles if kind in CAN_CONTAIN[type_of(r)]]
            if kind == obj and recep is not None:
                homes = [r for r in homes if type_of(r) != recep]
        if not homes:
            if kind == obj:
                return None
            continue
        spec.contents[oid] = rng.choice(homes)
    template = rng.choice(TEMPLATES[task_type])
    spec.description = template.format(obj=obj, recep=recep, toggle=toggle)
    return spec


def objects_of(spec: Spec) -> dict[str, str]:
    """Every PDDL object of the problem with its type."""
    objs: dict[str, str] = {AGENT: "agent", START: "location"}
    objs.update({loc: "location" for loc in spec.location.values()})
    objs.update({r: "receptacle" for r in spec.receptacles})
    objs.update({o: "object" for o in spec.contents})
    objs.update({f"{t}type": "rtype" for t in CAN_CONTAIN})
    objs.update({f"{t}type": "otype" for t in (*KITCHEN_OBJECTS, *BEDROOM_OBJECTS, LAMP)})
    objs.update({t: "rtype" for t in DOMAIN_CONSTANTS_R})
    objs.update({t: "otype" for t in DOMAIN_CONSTANTS_O})
    return objs


def init_facts(spec: Spec) -> list[tuple[str, ...]]:
    """The ``:init`` atoms (camelCase predicate names, as in ALFWorld's problem files)."""
    facts: list[tuple[str, ...]] = [("atLocation", AGENT, START)]
    for r in spec.receptacles:
        rt = type_of(r)
        facts += [("receptacleAtLocation", r, spec.location[r]), ("receptacleType", r, f"{rt}type")]
        if rt in OPENABLE:
            facts.append(("openable", r))
    for o, r in spec.contents.items():
        ot = type_of(o)
        facts += [
            ("objectType", o, f"{ot}type"),
            ("inReceptacle", o, r),
            ("objectAtLocation", o, spec.location[r]),
        ]
        if ot == LAMP:
            facts.append(("toggleable", o))
            continue
        facts.append(("pickupable", o))
        facts += [
            (prop, o)
            for prop, group in (("cleanable", CLEANABLE), ("heatable", HEATABLE), ("coolable", COOLABLE))
            if ot in group
        ]
    for rt, kinds in sorted(CAN_CONTAIN.items()):
        facts += [("canContain", f"{rt}type", f"{k}type") for k in sorted(kinds)]
    return facts


def problem_pddl(spec: Spec, name: str) -> str:
    """The PDDL problem text of ``spec`` for the shipped ``alfred`` domain."""
    by_type: dict[str, list[str]] = {}
    for obj, typ in objects_of(spec).items():
        by_type.setdefault(typ, []).append(obj)
    objects = "\n".join(f"    {' '.join(sorted(v))} - {t}" for t, v in sorted(by_type.items()))
    init = "\n".join(f"    ({' '.join(f)})" for f in init_facts(spec))
    goal = GOALS[spec.task_type].format(
        obj=spec.obj.capitalize(),
        recep=(spec.recep or "").capitalize(),
        toggle=(spec.toggle or "").capitalize(),
    )
    goal = " ".join(goal.split())
    return (
        f"(define (problem {name})\n  (:domain alfred)\n  (:objects\n{objects}\n  )\n"
        f"  (:init\n{init}\n  )\n  (:goal {goal})\n)\n"
    )


def names_of(spec: Spec) -> dict[str, str]:
    """Display names of the entities the player sees (receptacles, objects, locations)."""
    ids = [*spec.receptacles, *spec.contents, START, *spec.location.values()]
    return {i: display_name(i) for i in ids}


def spec_to_meta(spec: Spec) -> dict[str, Any]:
    return {
        "task_type": spec.task_type,
        "object": spec.obj,
        "receptacle": spec.recep,
        "toggle": spec.toggle,
        "description": spec.description,
        "contents": dict(sorted(spec.contents.items())),
        "location": dict(sorted(spec.location.items())),
    }
