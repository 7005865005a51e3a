"""The household environment: shipped PDDL domain + grammar, generator, expert, errors, snapshots, cleanup."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
from collections import Counter

import pytest

import horizonrl.envs.builtin.household  # noqa: F401  (registers "household")
from horizonrl.envs import StepResult, format_tool_call, get_env, make_env
from horizonrl.envs.builtin.household import TASK_TYPES, HouseholdEnv, HouseholdGame
from horizonrl.envs.builtin.household.env import normalize_command
from horizonrl.envs.builtin.household.game import shipped_file, shipped_logic, template_shape
from horizonrl.envs.builtin.household.pddl import PddlError, World, parse_domain, parse_problem, parse_sexpr

# A problem written by hand (not by the generator): agent in the middle, an apple on countertop 1,
# a closed fridge, a sink basin, a desk with a lamp. Expected texts below are read off alfred.twl2.
HAND_PROBLEM = """
(define (problem hand) (:domain alfred)
 (:objects agent1 - agent
           loc_0 loc_1 loc_2 loc_3 loc_4 - location
           countertop_1 fridge_1 sinkbasin_1 desk_1 - receptacle
           apple_1 apple_2 desklamp_1 - object
           appletype desklamptype - otype
           countertoptype fridgetype sinkbasintype desktype - rtype)
 (:init (atLocation agent1 loc_0)
        (receptacleAtLocation countertop_1 loc_1) (receptacleAtLocation fridge_1 loc_2)
        (receptacleAtLocation sinkbasin_1 loc_3) (receptacleAtLocation desk_1 loc_4)
        (receptacleType countertop_1 countertoptype) (receptacleType fridge_1 fridgetype)
        (receptacleType sinkbasin_1 sinkbasintype) (receptacleType desk_1 desktype)
        (openable fridge_1)
        (objectType apple_1 appletype) (objectType apple_2 appletype) (objectType desklamp_1 desklamptype)
        (pickupable apple_1) (pickupable apple_2) (cleanable apple_1) (coolable apple_1)
        (toggleable desklamp_1)
        (inReceptacle apple_1 countertop_1) (objectAtLocation apple_1 loc_1)
        (inReceptacle apple_2 countertop_1) (objectAtLocation apple_2 loc_1)
        (inReceptacle desklamp_1 desk_1) (objectAtLocation desklamp_1 loc_4)
        (canContain fridgetype appletype) (canContain countertoptype appletype))
 (:goal (exists (?r - receptacle) (exists (?o1 - object) (and (objectType ?o1 appletype)
        (receptacleType ?r fridgetype) (inReceptacle ?o1 ?r) (exists (?o2 - object) (and (not (= ?o1 ?o2))
        (objectType ?o2 appletype) (inReceptacle ?o2 ?r)))))))
)"""
HAND_NAMES = {
    "countertop_1": "countertop 1",
    "fridge_1": "fridge 1",
    "sinkbasin_1": "sinkbasin 1",
    "desk_1": "desk 1",
    "apple_1": "apple 1",
    "apple_2": "apple 2",
    "desklamp_1": "desklamp 1",
}


def act(command: str) -> str:
    return format_tool_call("act", {"command": command})


def run(env: HouseholdEnv, task, rng: random.Random, noise: float = 0.0, max_turns: int = 60):
    env.reset(task)
    out: list[tuple[str, StepResult]] = []
    for _ in range(max_turns):
        action = env.expert_action(rng, noise)
        out.append((action, env.step(action)))
        if out[-1][1].done:
            break
    return out


@pytest.fixture(scope="module")
def hand_game() -> HouseholdGame:
    return HouseholdGame(HAND_PROBLEM, HAND_NAMES, "put two apple in fridge")


@pytest.fixture(scope="module")
def tasks_by_type() -> dict[str, list]:
    tasks = HouseholdEnv.make_tasks(30, seed=11)
    out: dict[str, list] = {}
    for t in tasks:
        out.setdefault(t.meta["task_type"], []).append(t)
    return out


# ---------------------------------------------------------------- shipped data and textworld grammar


def test_uses_the_shipped_domain_and_grammar_without_importing_alfworld():
    domain = parse_domain(shipped_file("alfred.pddl"))
    assert domain.name == "alfred"
    assert {"gotolocation", "pickupobject", "putobject", "heatobject", "coolobject", "cleanobject"} <= set(
        domain.actions
    )
    assert [p for p, _ in domain.actions["putobject"].parameters] == ["?a", "?l", "?o", "?r", "?ot", "?rt"]
    logic = shipped_logic()
    assert logic.actions["pickupobject"].template == "take {o} from {r}"
    assert logic.actions["putobject"].template == "move {o} to {r}"
    assert logic.actions["heatobject"].feedback_rule == "#heatObject.feedback#"
    assert not any(m == "alfworld" or m.startswith("alfworld.") for m in sys.modules)
    assert "fast_downward" not in sys.modules
    with pytest.raises(FileNotFoundError, match=r"no_such_file\.pddl"):
        shipped_file("no_such_file.pddl")


def test_registration_is_light_and_alfworld_is_never_imported():
    code = (
        "import sys, horizonrl.envs.builtin.household as h\n"
        "assert 'textworld' not in sys.modules\n"
        "h.HouseholdEnv.make_tasks(1, seed=0)\n"
        "assert 'textworld' in sys.modules\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('alfworld', 'fast_downward')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_hand_problem_intro_admissible_and_feedback(hand_game):
    s = hand_game.initial_state
    assert hand_game.intro(s) == (
        "-= Welcome to TextWorld, ALFRED! =-\n\n"
        "You are in the middle of a room. Looking quickly around you, you see a countertop 1, a desk 1, "
        "a fridge 1, and a sinkbasin 1.\n\nYour task is to: put two apple in fridge."
    )
    # From loc_0 only GotoLocation (one per receptacle), inventory, look and help apply.
    assert hand_game.admissible(s) == [
        "go to countertop 1",
        "go to desk 1",
        "go to fridge 1",
        "go to sinkbasin 1",
        "help",
        "inventory",
        "look",
    ]
    s, fb, action = hand_game.step(s, "go to countertop 1")
    assert action == ("gotolocation", ("agent1", "loc_0", "loc_1", "countertop_1"))
    assert fb == "You arrive at countertop 1. On the countertop 1, you see a apple 1, and a apple 2."
    assert "take apple 1 from countertop 1" in hand_game.admissible(s)
    assert "go to countertop 1" in hand_game.admissible(s)  # GotoLocation allows lStart = lEnd
    s, fb, _ = hand_game.step(s, "take apple 1 from countertop 1")
    assert fb == "You pick up the apple 1 from the countertop 1."
    # hands full: the second apple cannot be taken (PickupObject needs (not (holdsAny ?a)))
    assert "take apple 2 from countertop 1" not in hand_game.admissible(s)
    s2, fb, action = hand_game.step(s, "take apple 2 from countertop 1")
    assert (s2, fb, action) == (s, "Nothing happens.", None)
    s, fb, _ = hand_game.step(s, "go to fridge 1")
    assert fb == "You arrive at fridge 1. The fridge 1 is closed."
    assert "move apple 1 to fridge 1" not in hand_game.admissible(s)  # closed
    s, fb, _ = hand_game.step(s, "open fridge 1")
    assert fb == "You open the fridge 1. The fridge 1 is open. In it, you see nothing."
    s, fb, _ = hand_game.step(s, "move apple 1 to fridge 1")
    assert fb == "You move the apple 1 to the fridge 1."
    assert not hand_game.won(s)  # pick-two goal needs two distinct apples: (not (= ?o1 ?o2))
    for cmd in [
        "go to countertop 1",
        "take apple 2 from countertop 1",
        "go to fridge 1",
        "move apple 2 to fridge 1",
    ]:
        s, fb, action = hand_game.step(s, cmd)
        assert action is not None, (cmd, fb)
    assert hand_game.won(s)
    s, fb, _ = hand_game.step(s, "inventory")
    assert fb == "You are not carrying anything."


def test_hand_problem_clean_cool_toggle_and_negated_facts(hand_game):
    g = hand_game
    s = g.initial_state
    for cmd in ["go to countertop 1", "take apple 1 from countertop 1", "go to sinkbasin 1"]:
        s, _, _ = g.step(s, cmd)
    assert "clean apple 1 with sinkbasin 1" in g.admissible(s)
    assert "heat apple 1 with sinkbasin 1" not in g.admissible(s)  # HeatObject needs a MicrowaveType
    s, fb, _ = g.step(s, "clean apple 1 with sinkbasin 1")
    assert fb == "You clean the apple 1 using the sinkbasin 1." and ("isclean", "apple_1") in s
    s, fb, _ = g.step(s, "examine apple 1")
    assert fb == "This is a clean apple 1."
    # PickupObject deleted (inreceptacle apple_1 countertop_1): textworld's PddlState records not_ facts
    assert ("not_inreceptacle", "apple_1", "countertop_1") in s
    s, _, _ = g.step(s, "go to fridge 1")
    s, fb, _ = g.step(s, "cool apple 1 with fridge 1")
    assert fb == "You cool the apple 1 using the fridge 1."
    s, fb, _ = g.step(s, "examine apple 1")
    assert fb == "This is a cool and clean apple 1."
    # ToggleObject's conditional effects are evaluated in the state before the action
    s, _, _ = g.step(s, "go to desk 1")
    s, fb, _ = g.step(s, "use desklamp 1")
    assert (
        fb == "You turn on the desklamp 1."
        and ("ison", "desklamp_1") in s
        and ("istoggled", "desklamp_1") in s
    )
    s, _, _ = g.step(s, "use desklamp 1")
    assert ("ison", "desklamp_1") not in s and ("istoggled", "desklamp_1") in s


def test_command_cache_matches_fresh_derivation(hand_game):
    g = hand_game
    s = g.initial_state
    for cmd in ["go to countertop 1", "take apple 1 from countertop 1"]:
        s, _, _ = g.step(s, cmd)
    from horizonrl.envs.builtin.household.game import derive

    for text, action in g.commands(s):
        fresh = derive(g.grammar, g.logic.actions[action[0]].template, g._context(g.tw_state(s), action))
        assert fresh == text
    shown, queries = template_shape("go to [{r.name | receptacleatlocation(r:receptacle, lend:location)}]")
    assert shown == (("lend", "location"), ("r", "receptacle"))
    assert queries == (("receptacleatlocation", (("r", "receptacle"), ("lend", "location"))),)
    assert template_shape("#look.feedback#") is None
    with pytest.raises(ValueError, match="grammar symbols"):
        HouseholdGame(HAND_PROBLEM, HAND_NAMES, "put #two# apples in fridge")


# ---------------------------------------------------------------- the PDDL interpreter


TOY_DOMAIN = """(define (domain toy) (:types thing)
 (:action paint :parameters (?x - thing)
   :precondition (and (imply (big ?x) (ready ?x)) (forall (?y - thing) (not (broken ?y))))
   :effect (and (painted ?x) (when (painted ?x) (twice ?x)) (not (ready ?x))
                (forall (?y - thing) (when (big ?y) (seen ?y))) (increase (total-cost) 1))))"""


def test_pddl_interpreter_semantics():
    d = parse_domain(TOY_DOMAIN)
    p = parse_problem(
        "(define (problem t) (:domain toy) (:objects a b - thing)"
        " (:init (big a) (ready a) (big b)) (:goal (painted a)))"
    )
    w = World(d, p)
    # imply: a is big and ready -> ok; b is big and not ready -> not applicable
    assert w.applicable(p.init) == [("paint", ("a",))]
    adds, dels = w.apply(p.init, "paint", ("a",))
    # (when (painted ?x) ...) is evaluated before the action: a was not painted yet
    assert adds == {("painted", "a"), ("seen", "a"), ("seen", "b")} and dels == {("ready", "a")}
    assert not w.goal_reached(p.init) and w.goal_reached(frozenset(p.init | adds))
    broken = frozenset(p.init | {("broken", "b")})
    assert w.applicable(broken) == []  # the forall precondition fails


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("(define (domain x)", "unclosed"),
        ("(define (domain x)))", "unbalanced"),
        ("(define (problem p) (:objects a - t) (:init (on a zz)))", "undeclared object 'zz'"),
        ("(foo)", "define"),
    ],
)
def test_pddl_errors_name_the_problem(text, match):
    with pytest.raises(PddlError, match=match):
        parse_problem(text) if "problem" in text else parse_domain(text)


def test_undeclared_variable_is_an_error():
    d = parse_domain(
        "(define (domain u) (:action a :parameters (?x - t) :precondition (on ?x ?y) :effect ()))"
    )
    p = parse_problem("(define (problem q) (:domain u) (:objects k - t) (:init (on k k)) (:goal (on k k)))")
    with pytest.raises(PddlError, match=r"'\?y'"):
        World(d, p).applicable(p.init)


def test_parse_sexpr_drops_comments_and_commas():
    assert parse_sexpr("(a ; comment\n (B, c))") == [["a", ["b", "c"]]]


# ---------------------------------------------------------------- generator and expert


def test_registered_and_knobs_validated():
    assert get_env("household") is HouseholdEnv
    env = make_env("household", task_types="heat, cool", n_receptacles=8)
    assert env.knobs["task_types"] == ("heat", "cool")
    for knob, value in [
        ("task_types", "pick,fly"),
        ("task_types", []),
        ("task_types", "pick,pick"),
        ("n_receptacles", 3),
        ("n_objects", 1),
        ("max_steps", 5),
        ("list_actions", "yes"),
        ("colour", 1),
    ]:
        with pytest.raises(ValueError, match=f"'{knob}'") as e:
            HouseholdEnv(**{knob: value})
        assert "household" in str(e.value)


def test_generated_problems_cover_all_types_and_parse(tasks_by_type):
    assert set(tasks_by_type) == set(TASK_TYPES)
    for tasks in tasks_by_type.values():
        for t in tasks:
            prob = parse_problem(t.meta["pddl_problem"])
            assert prob.objects["agent1"] == "agent"
            w = World(parse_domain(shipped_file("alfred.pddl")), prob)
            assert not w.goal_reached(prob.init)  # never solved at the start
            assert t.prompt.startswith(
                "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room."
            )
            assert f"Your task is to: {t.answer}.\nActions: go to " in t.prompt
            assert 2 <= len(t.meta["walkthrough"]) <= t.meta["max_steps"]
            m = t.meta
            kinds = Counter(o.rsplit("_", 1)[0] for o in m["contents"])
            assert kinds[m["object"]] >= (2 if m["task_type"] == "pick_two" else 1)
            if m["task_type"] == "examine":
                assert kinds["desklamp"] == 1 and m["receptacle"] is None
            else:
                assert m["receptacle"] in {r.rsplit("_", 1)[0] for r in m["location"]}
            if m["task_type"] in ("clean", "heat", "cool"):
                assert m["receptacle"] not in ("sinkbasin", "microwave", "fridge", "garbagecan")
                assert {"sinkbasin", "microwave", "fridge"} <= {r.rsplit("_", 1)[0] for r in m["location"]}


def test_expert_solves_every_task_type(tasks_by_type):
    env = HouseholdEnv()
    for task_type, tasks in tasks_by_type.items():
        for task in tasks[:4]:
            env.reset(task)
            assert env.expert_plan() == task.meta["walkthrough"]
            steps = run(env, task, random.Random(0))
            last = steps[-1][1]
            assert last.done and last.success and last.reward == 1.0, (task_type, task.meta["description"])
            assert not any(r.invalid for _, r in steps)
            assert all(r.reward == 0.0 for _, r in steps[:-1])
            played = [
                json.loads(a[len("<tool_call>") : -len("</tool_call>")])["arguments"]["command"]
                for a, _ in steps
            ]
            assert played == task.meta["walkthrough"]
            assert last.observation.endswith("\nTask complete!")


def test_expert_plan_steps_match_task_type(tasks_by_type):
    # Independent check of plan shape: a clean task cleans at a sink basin, heat uses a microwave, etc.
    verbs = {"clean": "clean ", "heat": "heat ", "cool": "cool ", "examine": "use desklamp"}
    for task_type, tasks in tasks_by_type.items():
        for t in tasks:
            plan = t.meta["walkthrough"]
            takes = sum(c.startswith("take ") for c in plan)
            moves = sum(c.startswith("move ") for c in plan)
            assert takes == {"pick_two": 2, "examine": 1}.get(task_type, 1)
            assert moves == {"pick_two": 2, "examine": 0}.get(task_type, 1)
            if task_type in verbs:
                assert sum(c.startswith(verbs[task_type]) for c in plan) == 1
            if task_type in ("clean", "heat", "cool"):
                tool = {"clean": "sinkbasin", "heat": "microwave", "cool": "fridge"}[task_type]
                assert f"{task_type} {t.meta['object']} " in next(
                    c for c in plan if c.startswith(verbs[task_type])
                )
                assert f" with {tool} " in next(c for c in plan if c.startswith(verbs[task_type]))


def test_noisy_expert_recovers_sometimes_fails_and_is_deterministic(tasks_by_type):
    env = HouseholdEnv(max_steps=30)
    tasks = [t for ts in tasks_by_type.values() for t in ts[:2]]
    results = [run(env, t, random.Random(i), noise=0.3) for i, t in enumerate(tasks)]
    # recovery: some episode deviated from the walkthrough (a random admissible command) and still won
    recovered = [
        r
        for r, t in zip(results, tasks, strict=True)
        if r[-1][1].success and len(r) > len(t.meta["walkthrough"])
    ]
    assert recovered and sum(r[-1][1].success for r in results) >= len(tasks) // 2
    a = [(x, y.observation, y.reward) for x, y in run(env, tasks[0], random.Random(7), noise=0.5)]
    b = [(x, y.observation, y.reward) for x, y in run(env, tasks[0], random.Random(7), noise=0.5)]
    assert a == b
    harsh = [run(env, t, random.Random(i), noise=0.95)[-1][1].success for i, t in enumerate(tasks[:6])]
    assert sum(harsh) < 6


def test_make_tasks_deterministic_serializable_and_split_disjoint():
    a = HouseholdEnv.make_tasks(12, seed=3)
    b = HouseholdEnv.make_tasks(12, seed=3)
    assert [dataclasses.asdict(t) for t in a] == [dataclasses.asdict(t) for t in b]
    assert len({t.id for t in a}) == 12 and all(t.meta["split"] == "train" for t in a)
    json.dumps([dataclasses.asdict(t) for t in a])
    test = HouseholdEnv.make_tasks(6, seed=3, split="test")
    world = lambda t: json.dumps([t.meta[k] for k in ("task_type", "object", "contents", "location")])  # noqa: E731
    assert not {world(t) for t in a} & {world(t) for t in test}
    only = HouseholdEnv.make_tasks(4, seed=0, task_types=["examine"], max_steps=6, n_receptacles=4)
    assert all(t.meta["task_type"] == "examine" and len(t.meta["walkthrough"]) <= 6 for t in only)


# ---------------------------------------------------------------- invalid and malformed actions


def test_invalid_and_normalized_commands():
    env = HouseholdEnv()
    task = HouseholdEnv.make_tasks(1, seed=5, task_types=["pick"])[0]
    first = env.reset(task)
    key0 = env.state_key()
    res = env.step(act("fly to the moon"))
    assert (
        res.invalid and res.observation.startswith("Nothing happens.\nActions: go to ") and res.role == "tool"
    )
    assert res.obs_key == key0 and not res.done
    where = task.meta["contents"]
    obj = next(o for o in where if o.startswith(task.meta["object"] + "_"))
    name = obj.replace("_", " ")
    rec = where[obj].replace("_", " ")
    res = env.step(act(f"take {name} from {rec}"))  # not there yet: not admissible
    assert res.invalid and res.observation.startswith("Nothing happens.")
    res = env.step(act(f"Go to the {rec.title()}."))
    assert not res.invalid and res.observation.startswith(f"You arrive at {rec}.")
    assert normalize_command("Put the apple 1 on countertop 2.") == "move apple 1 to countertop 2"
    assert normalize_command("  TAKE a mug 1 FROM the cabinet 2!") == "take mug 1 from cabinet 2"
    no_list = HouseholdEnv(list_actions=False)
    t2 = HouseholdEnv.make_tasks(1, seed=5, task_types=["pick"], list_actions=False)[0]
    assert "Actions:" not in no_list.reset(t2) and "Actions:" in first
    assert no_list.step(act("look")).observation.startswith("You are in the middle of a room.")


@pytest.mark.parametrize(
    ("message", "needle"),
    [
        ('<tool_call>{"name": "act", "arguments": {"command": 3}}</tool_call>', 'argument "command" of act'),
        ('<tool_call>{"name": "act", "arguments": {}}</tool_call>', 'missing required argument "command"'),
        ('<tool_call>{"name": "act", "arguments": {"command": "   "}}</tool_call>', "non-empty string"),
        ('<tool_call>{"name": "walk", "arguments": {}}</tool_call>', 'unknown tool "walk"'),
        ("<tool_call>{not json</tool_call>", "not valid JSON"),
    ],
)
def test_malformed_calls_are_error_observations(message, needle):
    env = HouseholdEnv()
    env.reset(HouseholdEnv.make_tasks(1, seed=2)[0])
    before = env.snapshot()
    res = env.step(message)
    assert res.invalid and res.observation.startswith("Error: ") and needle in res.observation
    assert not res.done and res.reward == 0.0
    assert env.state["facts"] == before["facts"]


def test_reminder_answer_and_out_of_steps():
    env = HouseholdEnv(max_steps=8)
    task = HouseholdEnv.make_tasks(1, seed=4, max_steps=8)[0]
    env.reset(task)
    res = env.step("I will look around.")
    assert res.role == "user" and res.invalid and res.observation.startswith("No action found.")
    for _ in range(7):  # turns 2..8: the 8th message hits max_steps
        res = env.step(act("look"))
    assert res.done and not res.success and res.reward == 0.0 and res.observation.endswith("Out of steps.")
    assert env.step(act("look")).observation == "The episode is over."
    env.reset(task)
    res = env.step("<answer>done</answer>")
    assert res.done and res.reward == 0.0 and not res.success


def test_state_key_tracks_world_not_bookkeeping():
    env = HouseholdEnv()
    env.reset(HouseholdEnv.make_tasks(1, seed=8)[0])
    k0 = env.state_key()
    assert env.step(act("look")).obs_key == k0  # look only adds (checked loc_0)
    assert env.step(act("inventory")).obs_key == k0
    first_go = next(c for c in env.admissible_commands() if c.startswith("go to "))
    k1 = env.step(act(first_go)).obs_key
    assert k1 != k0 and "atlocation agent1 loc_" in k1


# ---------------------------------------------------------------- snapshot / restore


def test_snapshot_restore_replay_is_exact(tasks_by_type):
    env = HouseholdEnv()
    tasks = [tasks_by_type[k][0] for k in ("pick_two", "heat", "examine")]
    for i, task in enumerate(tasks):
        env.reset(task)
        rng = random.Random(i)
        snaps, actions, results = [env.snapshot()], [], []
        for _ in range(14):
            actions.append(env.expert_action(rng, noise=0.3))
            results.append(env.step(actions[-1]))
            snaps.append(env.snapshot())
            if results[-1].done:
                break
        for t in range(0, len(actions), 2):
            env.restore(snaps[t])
            env.step(act(env.admissible_commands()[0]))  # diverge, then fork again
            env.restore(snaps[t])
            replay = [env.step(a) for a in actions[t:]]
            assert [dataclasses.asdict(r) for r in replay] == [dataclasses.asdict(r) for r in results[t:]]
            assert env.snapshot() == snaps[-1]
    # a snapshot is self-contained: restore it into a fresh env that played another task
    other = HouseholdEnv()
    other.reset(tasks[0])
    env.reset(tasks[1])
    env.step(env.expert_action(random.Random(0)))
    snap = env.snapshot()
    expected = env.step(env.expert_action(random.Random(0)))
    other.restore(snap)
    assert dataclasses.asdict(other.step(other.expert_action(random.Random(0)))) == dataclasses.asdict(
        expected
    )


# ---------------------------------------------------------------- resources


def _children() -> set[str]:
    pid = os.getpid()
    out: set[str] = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            out |= set(f.read().split())
    return out


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs /proc")
def test_no_leaked_processes_threads_or_temp_files():
    tmp = tempfile.gettempdir()
    before = (set(os.listdir(tmp)), _children(), threading.active_count())
    env = HouseholdEnv()
    for i, task in enumerate(HouseholdEnv.make_tasks(3, seed=21)):
        run(env, task, random.Random(i), noise=0.2)
    env.close()
    after = (set(os.listdir(tmp)), _children(), threading.active_count())
    assert after[0] - before[0] == set() and after[1] == before[1] and after[2] == before[2]


def test_expert_success_rate_per_type_counts():
    env = HouseholdEnv()
    solved: Counter = Counter()
    total: Counter = Counter()
    for i, task in enumerate(HouseholdEnv.make_tasks(12, seed=31)):
        total[task.meta["task_type"]] += 1
        solved[task.meta["task_type"]] += run(env, task, random.Random(i))[-1][1].success
    assert solved == total
