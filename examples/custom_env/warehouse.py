"""A custom environment in ~50 lines: count stock across the rooms of a warehouse with two tools.

Train it (from the repository root):  horizonrl train -c examples/custom_env/config.yaml
Walkthrough: docs/custom_env.md. Each row of tasks.jsonl has a question, the answer and the
warehouse's stock ({room: {item: count}}), which reaches the environment as task.meta["fields"].
"""

from __future__ import annotations

import random

from horizonrl.envs import CustomEnv, ToolError, format_answer, format_tool_call, register_env, tool


@register_env("warehouse")
class Warehouse(CustomEnv):
    """Answer stock questions by listing the rooms and counting items in each."""

    system_prompt = (
        'List the rooms with <tool_call>{"name": "rooms", "arguments": {}}</tool_call>, count with '
        '<tool_call>{"name": "count", "arguments": {"item": "apples", "room": "north"}}</tool_call>, '
        "then give the total as <answer>N</answer>."
    )

    def setup(self, task):
        self.state["stock"] = task.meta["fields"]["stock"]
        self.state["counted"] = []

    @tool
    def rooms(self) -> str:
        """List the rooms of the warehouse."""
        return ", ".join(sorted(self.state["stock"]))

    @tool
    def count(self, item: str, room: str) -> str:
        """Count one item in one room.

        Args:
            item: what to count, e.g. "apples"
            room: a room name from the rooms tool
        """
        if room not in self.state["stock"]:
            raise ToolError(f"no room {room!r}; rooms: {self.rooms()}")
        self.state["counted"].append([item, room])
        return str(self.state["stock"][room].get(item, 0))

    def expert_action(self, rng: random.Random, noise: float = 0.0) -> str:
        """Count the asked item in every room not counted yet, then answer (optional: only SFT needs it)."""
        item = self.state["question"].split("How many ")[1].split()[0]
        todo = [r for r in sorted(self.state["stock"]) if [item, r] not in self.state["counted"]]
        if todo:
            return format_tool_call("count", {"item": item, "room": todo[0]})
        return format_answer(sum(self.state["stock"][r].get(item, 0) for r in self.state["stock"]))
