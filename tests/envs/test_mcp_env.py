"""The ``mcp`` environment: tools of a real stdio MCP server (a script written here) as policy tools."""

from __future__ import annotations

import json
import random
import sys
import textwrap

import pytest

pytest.importorskip("mcp.server.mcpserver")

from horizonrl.agents import AgentSpec, LoopLimits
from horizonrl.agents.expert import ExpertEngine
from horizonrl.config import load_config
from horizonrl.envs import Task, format_answer, format_tool_call, register_env
from horizonrl.envs.hubs.mcp import MCPEnv, MCPError, server_for
from horizonrl.inference import SamplingParams
from horizonrl.train.rollout.collect import collect_groups

SERVER = textwrap.dedent(
    '''
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("inventory")
    STOCK = {"apples": 3, "pears": 5, "plums": 11}

    @server.tool()
    def count(item: str) -> str:
        """Count one item in stock."""
        if item not in STOCK:
            raise ToolError(f"no item {item!r} in stock")
        return str(STOCK[item])

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    if __name__ == "__main__":
        server.run("stdio")
    '''
)


@pytest.fixture(scope="module")
def server_cmd(tmp_path_factory):
    path = tmp_path_factory.mktemp("mcp") / "inventory_server.py"
    path.write_text(SERVER)
    return [sys.executable, str(path)]


def _task(prompt: str, answer: str, i: int = 0, env: str = "mcp") -> Task:
    return Task(
        f"mcp-{i}", prompt, answer, (), {"env": env, "split": "train", "source": "file", "fields": {}}
    )


def test_server_tools_become_policy_tools_and_calls_are_tool_turns(server_cmd):
    env = MCPEnv(command=server_cmd)
    by_name = {t.name: t for t in env.tools}
    assert set(by_name) == {"count", "add"}
    assert by_name["count"].description == "Count one item in stock."
    assert by_name["count"].parameters["required"] == ["item"]
    assert by_name["add"].parameters["properties"]["a"]["type"] == "integer"
    assert not env.can_fork  # a server cannot be restored, unless declared stateless
    assert MCPEnv(command=server_cmd, stateless=True).can_fork

    env.reset(_task("How many pears?", "5"))
    res = env.step(format_tool_call("count", {"item": "pears"}))
    assert (res.observation, res.role, res.invalid, res.tool_calls) == ("5", "tool", False, 1)
    assert env.step(format_tool_call("add", {"a": 2, "b": 40})).observation == "42"
    err = env.step(format_tool_call("count", {"item": "kiwi"}))
    assert (
        err.invalid and err.observation.startswith("Error") and "no item 'kiwi' in stock" in err.observation
    )
    # arguments are validated against the server's schema before anything is sent
    bad = env.step(format_tool_call("add", {"a": "two", "b": 1}))
    assert bad.invalid and 'argument "a" of add must be an integer' in bad.observation
    done = env.step(format_answer("5"))
    assert done.done and done.success and done.reward == 1.0


def test_parallel_calls_are_answered_by_one_tool_message_each(server_cmd):
    """Two calls in one message: two tool messages named after their tools, in order (not one text)."""
    env = MCPEnv(command=server_cmd)
    env.reset(_task("How many pears and plums?", "16"))
    res = env.step(format_tool_call("count", {"item": "pears"}) + format_tool_call("add", {"a": 5, "b": 11}))
    assert [(m.role, m.name, m.content) for m in res.messages] == [
        ("tool", "count", "5"),
        ("tool", "add", "16"),
    ]
    assert (res.observation, res.role, res.tool_calls) == ("5\n16", "tool", 2)


def test_one_server_process_is_shared(server_cmd):
    a, b = MCPEnv(command=server_cmd), MCPEnv(command=server_cmd)
    assert a.server is b.server is server_for(server_cmd)


def test_bad_commands_are_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match="knob 'command' must be the server's command line"):
        MCPEnv(command=[])
    with pytest.raises(MCPError, match="failed to start") as e:
        MCPEnv(command=[sys.executable, str(tmp_path / "missing.py")], startup_timeout_s=20)
    assert "\n" not in str(e.value)


@register_env("test-mcp-expert")
class InventoryExpert(MCPEnv):
    """An MCP environment with a scripted expert: count the asked item, then answer."""

    def expert_action(self, rng: random.Random, noise: float = 0.0) -> str:
        item = self.state["question"].split()[2].rstrip("?")
        if not self.state.get("counted"):
            self.state["counted"] = True
            return format_tool_call("count", {"item": item})
        return format_answer(self.state["answer"])


def test_calls_are_recorded_as_ordinary_tool_turns_in_rollouts(server_cmd, tiny_model_dir):
    from horizonrl.models import ChatRenderer, load_model_and_tokenizer

    _, tok = load_model_and_tokenizer(tiny_model_dir)
    renderer = ChatRenderer(tok)
    tasks = [
        _task(f"How many {item}?", str(n), i, env="test-mcp-expert")
        for i, (item, n) in enumerate([("apples", 3), ("plums", 11)])
    ]
    params = SamplingParams(max_new_tokens=64)
    limits = LoopLimits(max_turns=4, context_budget=2048)

    def make_env():
        return InventoryExpert(command=server_cmd)

    spec = AgentSpec(renderer=renderer, params=params, limits=limits, make_env=make_env)
    engine = ExpertEngine(tok, eos_id=renderer.eos_id, seed=0)
    groups = collect_groups(engine, renderer, make_env, tasks, 1, params, limits, spec=spec)
    for group, want in zip(groups, ("3", "11"), strict=True):
        (rollout,) = group.rollouts
        assert rollout.success and rollout.reward == 1.0
        first = rollout.segments[0].turns[0]
        assert (
            '"name": "count"' in first.response_text and first.observation == want and first.tool_calls == 1
        )


def test_a_training_step_on_the_mcp_env(server_cmd, tiny_model_dir, tmp_path):
    from horizonrl.train.trainers.group import GroupTrainer

    tasks = tmp_path / "tasks.jsonl"
    rows = [{"prompt": f"How many {x}?", "answer": str(n)} for x, n in [("apples", 3), ("pears", 5)] * 1]
    rows += [{"prompt": f"Add {a} and {b}.", "answer": str(a + b)} for a in range(4) for b in range(4)]
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(
        None,
        [
            f"model.path={tiny_model_dir}",
            "env.name=mcp",
            f"env.knobs={{command: {json.dumps(server_cmd)}}}",
            f"env.tasks={{path: {tasks}}}",
            "env.reward=exact_match",
            "rollout.group_size=2",
            "rollout.tasks_per_step=2",
            "rollout.max_new_tokens=16",
            "rollout.max_turns=2",
            "rollout.context_budget=768",
            "train.steps=1",
            "train.eval_samples=1",
            "env.test_tasks=2",
            "train.progress=false",
            f"train.out_dir={tmp_path / 'run'}",
        ],
    )
    records = GroupTrainer(cfg).fit()
    assert records[-1]["step"] == 1
