"""User simulators of the airline environment: a deterministic script, or an LLM.

In τ²-bench the agent talks to a simulated customer. Here the environment's
reply to an assistant message without tool calls is the simulated user's next
message (role ``user``); a user message containing ``###STOP###`` (done),
``###TRANSFER###`` (the agent transferred the call) or ``###OUT-OF-SCOPE###``
(the scenario cannot go on) ends the episode.

A simulator is stateless: everything it remembers lives in a ``state`` dict that
the environment keeps inside its episode state (so snapshots cover it), and it
sees the visible conversation (``[{"role": "assistant"|"user", "content"}]``,
tool calls and results excluded; it starts with the agent's virtual greeting
:data:`AGENT_GREETING`).

:class:`ScriptedUser` reveals the task's scenario deterministically. Its
*beats* are the reason for the call (the opening message), the lines of
``known_info``, then the paragraphs of ``task_instructions``, all rewritten from
second to first person ("Your user id is x" -> "My user id is x"). Each reply
is, in order of precedence:

1. ``###TRANSFER###`` if the agent has transferred the call;
2. ``Thank you, that's all I needed. ###STOP###`` once the environment reports
   the goal reached (final database and required information match the task's
   expected outcome) and the opening and every ``known_info`` line were said;
3. the unrevealed ``known_info`` lines on the topics the agent asked about
   (user id, reservation, name);
4. ``Yes, please go ahead.`` if the agent asks for a confirmation;
5. the next unrevealed beat;
6. ``###STOP###`` when every beat was said or after ``max_turns`` replies.

So the scripted user knows when the work is done from the environment (an
oracle), which makes it cheap and reproducible but not a faithful customer.

:class:`LLMUser` asks any ``chat(messages) -> str`` callable (e.g. an
OpenAI-compatible client) to play the customer from the scenario, with the
roles flipped (the agent's messages are ``user`` messages of that chat).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

STOP, TRANSFER, OUT_OF_SCOPE = "###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"
STOP_TOKENS = (STOP, TRANSFER, OUT_OF_SCOPE)
AGENT_GREETING = "Hi! How can I help you today?"
THANKS = f"Thank you, that's all I needed. {STOP}"
CONFIRM = "Yes, please go ahead."
SCENARIO_KEYS = ("reason_for_call", "known_info", "unknown_info", "task_instructions", "persona")

Conversation = list[dict[str, str]]


def is_stop(text: str) -> bool:
    """Whether a user message ends the conversation."""
    return any(tok in text for tok in STOP_TOKENS)


def scenario_from_task(task: dict[str, Any]) -> dict[str, str | None]:
    """The user scenario of a raw τ² task (reason_for_call, known_info, unknown_info, task_instructions,
    persona)."""
    us = task.get("user_scenario") or {}
    inst = us.get("instructions") or {}
    if isinstance(inst, str):  # τ² allows free-text instructions
        inst = {"task_instructions": inst}
    out = {k: inst.get(k) for k in SCENARIO_KEYS if k != "persona"}
    out["persona"] = us.get("persona")
    return out


# ---------------------------------------------------------------- first person

_PRONOUNS = [
    (r"\byou are\b", "I am"),
    (r"\byou were\b", "I was"),
    (r"\byou're\b", "I'm"),
    (r"\byou've\b", "I've"),
    (r"\byou'll\b", "I'll"),
    (r"\byourself\b", "myself"),
    (r"\byours\b", "mine"),
    (r"\byour\b", "my"),
    (r"\b(tell|tells|told|ask|asks|asked|give|gives|offer|offers|to|for|with|transfer|transfers|"
     r"let|lets|help|helps|call|calls) you\b", r"\1 me"),
    (r"\byou\b", "I"),
]  # fmt: skip


def first_person(text: str) -> str:
    """Rewrite scenario text from second to first person ("Your id is x." -> "My id is x.")."""
    out = re.sub(r"\s+", " ", text).strip()
    for pattern, repl in _PRONOUNS:

        def sub(m: re.Match[str], repl: str = repl) -> str:
            new = m.expand(repl)
            return new[0].upper() + new[1:] if m.group(0)[0].isupper() else new

        out = re.sub(pattern, sub, out, flags=re.IGNORECASE)
    return out


def _paragraphs(text: str | None) -> list[str]:
    return [first_person(p) for p in re.split(r"\n\s*\n", text or "") if p.strip()]


def _lines(text: str | None) -> list[str]:
    return [first_person(p) for p in (text or "").splitlines() if p.strip()]


def beats(scenario: dict[str, Any]) -> tuple[list[str], int]:
    """The scripted beats and how many of them are required before stopping (opening + known_info)."""
    reason = first_person(scenario.get("reason_for_call") or "I need help with my reservation.")
    known = _lines(scenario.get("known_info"))
    return [f"Hi. {reason}", *known, *_paragraphs(scenario.get("task_instructions"))], 1 + len(known)


def opening_message(scenario: dict[str, Any]) -> str:
    """The scripted user's first message (also the ``prompt`` of a task)."""
    return beats(scenario)[0][0]


_ASK_TOPICS = {
    "user_id": ("user id", "user_id", "userid", "account", "profile"),
    "reservation": ("reservation", "confirmation", "booking"),
    "name": ("name",),
}
_LINE_TOPICS = {
    "user_id": re.compile(r"user id", re.IGNORECASE),
    "reservation": re.compile(r"reservation|confirmation number|booking", re.IGNORECASE),
    "name": re.compile(r"^(my name is|i am [A-Z])", re.IGNORECASE),
}
_CONFIRM = re.compile(
    r"\b(confirm|proceed|go ahead|shall i|should i|would you like me to|do you want me to|yes/no|\(yes\))",
    re.IGNORECASE,
)


# ---------------------------------------------------------------- simulators


class UserSimulator(ABC):
    """A simulated customer. ``max_turns`` replies at most; the next one is ``###STOP###``."""

    def __init__(self, *, max_turns: int = 15) -> None:
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"user simulator: max_turns must be an integer >= 1, got {max_turns!r}")
        self.max_turns = max_turns

    @abstractmethod
    def opening(self, scenario: dict[str, Any], state: dict[str, Any]) -> str:
        """The user's first message (the answer to :data:`AGENT_GREETING`)."""

    def reply(
        self,
        scenario: dict[str, Any],
        conversation: Conversation,
        state: dict[str, Any],
        *,
        goal_reached: Callable[[], bool],
        transferred: bool,
    ) -> str:
        """The user's answer to the last (assistant) message of ``conversation``."""
        state["turns"] = state.get("turns", 0) + 1
        if transferred:
            return TRANSFER
        if state["turns"] > self.max_turns:
            return STOP
        return self._reply(scenario, conversation, state, goal_reached)

    @abstractmethod
    def _reply(
        self,
        scenario: dict[str, Any],
        conversation: Conversation,
        state: dict[str, Any],
        goal_reached: Callable[[], bool],
    ) -> str: ...


class ScriptedUser(UserSimulator):
    """Deterministic customer that reveals the scenario beat by beat (see module docstring)."""

    def opening(self, scenario: dict[str, Any], state: dict[str, Any]) -> str:
        state["said"] = [0]
        return opening_message(scenario)

    def _reply(
        self,
        scenario: dict[str, Any],
        conversation: Conversation,
        state: dict[str, Any],
        goal_reached: Callable[[], bool],
    ) -> str:
        script, required = beats(scenario)
        said: list[int] = state.setdefault("said", [0])
        if all(i in said for i in range(required)) and goal_reached():
            return THANKS
        asked = conversation[-1]["content"].lower() if conversation else ""
        topics = {t for t, words in _ASK_TOPICS.items() if any(w in asked for w in words)}
        wanted = [
            i
            for i in range(1, required)
            if i not in said and any(_LINE_TOPICS[t].search(script[i]) for t in topics)
        ]
        if wanted:
            said.extend(wanted)
            return " ".join(script[i] for i in wanted)
        if _CONFIRM.search(asked):
            return CONFIRM
        nxt = next((i for i in range(len(script)) if i not in said), None)
        if nxt is None:
            return STOP
        said.append(nxt)
        return script[nxt]


USER_SYSTEM_PROMPT = """You are playing a customer who contacts an airline's customer service agent.
Follow the scenario below and stay in character.

Rules:
- Write one message at a time, as the customer, in plain language.
- Only use information given in the scenario; anything else is unknown to you.
- Reveal information gradually, when the agent asks for it; do not copy the scenario verbatim.
- When your goal is reached, or cannot be reached, end the conversation with {stop}.
- If you are transferred to a human agent, reply with {transfer} only.
- If the scenario gives you nothing to continue with, reply with {out_of_scope}.

<scenario>
{scenario}
</scenario>"""


def render_scenario(scenario: dict[str, Any]) -> str:
    """The scenario as labelled sections (empty fields left out)."""
    labels = {
        "persona": "Persona",
        "reason_for_call": "Reason for the call",
        "known_info": "What you know",
        "unknown_info": "What you do not know",
        "task_instructions": "Instructions",
    }
    return "\n\n".join(f"{label}:\n{scenario[k].strip()}" for k, label in labels.items() if scenario.get(k))


class LLMUser(UserSimulator):
    """Customer played by a chat model: ``chat(messages) -> str`` with OpenAI-style message dicts.

    The chat sees a system prompt with the scenario, then the conversation with
    the roles flipped (agent -> ``user``, customer -> ``assistant``). A reply that
    is not a string, or an exception of ``chat``, raises a RuntimeError naming
    the simulator (an unreachable model is not a customer's answer).
    """

    def __init__(self, chat: Callable[[list[dict[str, str]]], str], *, max_turns: int = 15) -> None:
        super().__init__(max_turns=max_turns)
        if not callable(chat):
            raise TypeError(f"LLMUser: chat must be a callable chat(messages) -> str, got {chat!r}")
        self.chat = chat

    def system_prompt(self, scenario: dict[str, Any]) -> str:
        return USER_SYSTEM_PROMPT.format(
            stop=STOP, transfer=TRANSFER, out_of_scope=OUT_OF_SCOPE, scenario=render_scenario(scenario)
        )

    def messages(self, scenario: dict[str, Any], conversation: Conversation) -> list[dict[str, str]]:
        """The chat request for the customer's next message."""
        flip = {"assistant": "user", "user": "assistant"}
        return [{"role": "system", "content": self.system_prompt(scenario)}] + [
            {"role": flip[m["role"]], "content": m["content"]} for m in conversation
        ]

    def _ask(self, messages: list[dict[str, str]]) -> str:
        try:
            out = self.chat(messages)
        except Exception as e:
            raise RuntimeError(f"airline LLM user simulator: chat() failed: {type(e).__name__}: {e}") from e
        if not isinstance(out, str):
            raise RuntimeError(f"airline LLM user simulator: chat() must return a string, got {out!r}")
        return out.strip()

    def opening(self, scenario: dict[str, Any], state: dict[str, Any]) -> str:
        return self._ask(self.messages(scenario, [{"role": "assistant", "content": AGENT_GREETING}]))

    def _reply(
        self,
        scenario: dict[str, Any],
        conversation: Conversation,
        state: dict[str, Any],
        goal_reached: Callable[[], bool],
    ) -> str:
        return self._ask(self.messages(scenario, conversation))
