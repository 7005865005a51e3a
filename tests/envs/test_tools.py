"""Tool declarations, the tool-call/answer parser, the safe calculator, malformed calls in envs."""

from __future__ import annotations

import dataclasses
import random
from fractions import Fraction

import pytest

from horizonrl.envs import LookupEnv, make_env
from horizonrl.envs.builtin.calculator import CalcError, calculate, parse_number, safe_eval
from horizonrl.envs.core.tools import (
    Tool,
    ToolCall,
    ToolCallError,
    format_answer,
    format_tool_call,
    parse_answer,
    parse_tool_calls,
)

SEARCH = Tool(
    "search",
    "Find facts.",
    {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
)
MIXED = Tool(
    "mixed",
    "Typed arguments.",
    {
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "x": {"type": "number"},
            "flag": {"type": "boolean"},
            "mode": {"type": "string", "enum": ["fast", "slow"]},
            "opts": {"type": "object"},
        },
        "required": ["n"],
    },
)
TOOLS = [SEARCH, MIXED]


def one(text: str, tools=TOOLS) -> ToolCall | ToolCallError:
    calls = parse_tool_calls(text, tools)
    assert len(calls) == 1, calls
    return calls[0]


def test_tool_schema_and_frozen():
    schema = SEARCH.to_schema()
    assert schema == {
        "type": "function",
        "function": {"name": "search", "description": "Find facts.", "parameters": SEARCH.parameters},
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        SEARCH.name = "other"  # type: ignore[misc]
    assert hash(SEARCH) == hash(Tool("search", "Find facts.", {}))


def test_format_tool_call_exact_and_round_trip():
    text = format_tool_call("search", {"query": "Alice"})
    assert text == '<tool_call>{"name": "search", "arguments": {"query": "Alice"}}</tool_call>'
    assert one(text) == ToolCall("search", {"query": "Alice"})
    assert format_answer(42) == "<answer>42</answer>"


def test_parse_whitespace_multiple_and_surrounding_text():
    text = (
        'I will search.\n<tool_call>\n  {"name": "search",\n "arguments": {"query": "Ana"}}\n</tool_call>\n'
        'and <tool_call>{"name": "mixed", "arguments": {"n": 3, "mode": "fast"}}</tool_call> done'
    )
    calls = parse_tool_calls(text, TOOLS)
    assert calls == [ToolCall("search", {"query": "Ana"}), ToolCall("mixed", {"n": 3, "mode": "fast"})]
    assert parse_tool_calls("no calls here", TOOLS) == []
    assert parse_tool_calls("", TOOLS) == []


def test_unterminated_at_end_with_complete_json_is_accepted():
    # a generation stopped by a "</tool_call>" stop string
    assert one('<tool_call>{"name": "search", "arguments": {"query": "Bo"}}') == ToolCall(
        "search", {"query": "Bo"}
    )


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "search", "arguments": {"query": "Bo"',
        '<tool_call>{"name": "search"} <tool_call>{"name": "search", "arguments": {}}</tool_call>',
    ],
)
def test_unterminated_is_error(text):
    first = parse_tool_calls(text, TOOLS)[0]
    assert isinstance(first, ToolCallError) and first.kind == "unterminated"
    assert "</tool_call>" in first.message and "Format: <tool_call>" in first.message


def test_unterminated_then_valid_call_still_parses_the_valid_one():
    text = (
        '<tool_call>{"name": "search"} <tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call>'
    )
    calls = parse_tool_calls(text, TOOLS)
    assert calls[1] == ToolCall("search", {"query": "x"})


@pytest.mark.parametrize(
    ("body", "kind", "needle"),
    [
        ('{"name": "search", "arguments": {"query": "x"}', "invalid_json", "not valid JSON"),
        ("{name: search}", "invalid_json", "not valid JSON"),
        ('["search", {"query": "x"}]', "not_object", "JSON object"),
        ('{"arguments": {"query": "x"}}', "missing_name", '"name"'),
        ('{"name": 7, "arguments": {}}', "missing_name", '"name"'),
        ('{"name": "fly", "arguments": {}}', "unknown_tool", 'unknown tool "fly"; available: mixed, search'),
        ('{"name": "search", "arguments": "x"}', "bad_arguments", '"arguments" must be a JSON object'),
        ('{"name": "search", "arguments": ["x"]}', "bad_arguments", '"arguments" must be a JSON object'),
        ('{"name": "search", "arguments": {}}', "invalid_arguments", 'missing required argument "query"'),
        ('{"name": "search"}', "invalid_arguments", 'missing required argument "query"'),
        (
            '{"name": "search", "arguments": {"query": 3}}',
            "invalid_arguments",
            "must be a string, got integer",
        ),
        ('{"name": "mixed", "arguments": {"n": "3"}}', "invalid_arguments", "must be an integer, got string"),
        (
            '{"name": "mixed", "arguments": {"n": true}}',
            "invalid_arguments",
            "must be an integer, got boolean",
        ),
        ('{"name": "mixed", "arguments": {"n": 1.5}}', "invalid_arguments", "must be an integer, got number"),
        ('{"name": "mixed", "arguments": {"n": 1, "x": "1"}}', "invalid_arguments", "must be a number"),
        ('{"name": "mixed", "arguments": {"n": 1, "flag": 1}}', "invalid_arguments", "must be a boolean"),
        ('{"name": "mixed", "arguments": {"n": 1, "opts": []}}', "invalid_arguments", "must be an object"),
        (
            '{"name": "mixed", "arguments": {"n": 1, "mode": "x"}}',
            "invalid_arguments",
            'one of ["fast", "slow"]',
        ),
        ('{"name": "mixed", "arguments": {"n": null}}', "invalid_arguments", "got null"),
    ],
)
def test_malformed_calls(body, kind, needle):
    err = one(f"<tool_call>{body}</tool_call>")
    assert isinstance(err, ToolCallError), err
    assert err.kind == kind
    assert needle in err.message
    assert err.message.startswith("Error: ")
    assert "Format: <tool_call>{" in err.message  # tells the model the correct format
    assert len(err.message) < 250


def test_error_format_uses_the_named_tool():
    err = one('<tool_call>{"name": "mixed", "arguments": {}}</tool_call>')
    assert 'Format: <tool_call>{"name": "mixed", "arguments": {"n": 1}}</tool_call>' in err.message
    err = one('<tool_call>{"name": "search", "arguments": {}}</tool_call>')
    assert 'Format: <tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call>' in err.message


def test_valid_typed_arguments_and_lenient_extras():
    ok = one(
        '<tool_call>{"name": "mixed", "arguments": {"n": 2.0, "x": 1, "flag": false, "extra": 1}}</tool_call>'
    )
    assert isinstance(ok, ToolCall) and ok.arguments["n"] == 2.0


def test_without_tools_only_syntax_is_checked():
    assert parse_tool_calls('<tool_call>{"name": "anything", "arguments": {"a": 1}}</tool_call>') == [
        ToolCall("anything", {"a": 1})
    ]
    err = parse_tool_calls("<tool_call>{oops}</tool_call>")[0]
    assert isinstance(err, ToolCallError) and '"name": "<tool>"' in err.message


def test_parse_answer():
    assert parse_answer("think... <answer> Oslo </answer>") == "Oslo"
    assert parse_answer("<answer>\n42\n</answer> trailing") == "42"
    assert parse_answer("<answer>a</answer><answer>b</answer>") == "a"
    assert parse_answer("<answer>12") == "12"  # stopped at a stop string
    assert parse_answer("<answer></answer>") == ""
    assert parse_answer("no answer") is None
    assert parse_answer('<tool_call>{"name": "x"}</tool_call>') is None


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("1 + 2", 3),
        ("(17 + 25) * 3", 126),
        ("2 + 3 * 4", 14),
        ("10 / 4", Fraction(5, 2)),
        ("-3 - -4", 1),
        ("+5", 5),
        ("1.5 * 2", 3),
        ("6 × 7 =", 42),
        ("8 ÷ 2", 4),
    ],
)
def test_calculator_evaluates(expr, value):
    assert safe_eval(expr) == value


@pytest.mark.parametrize(
    "expr",
    [
        "__import__('os')",
        "__import__('os').system('echo hi')",
        "open('/etc/passwd')",
        "x + 1",
        "(1).__class__",
        "2 ** 10",
        "7 % 3",
        "7 // 2",
        "lambda: 1",
        "[1, 2]",
        "'a' + 'b'",
        "True + 1",
        "1 if 1 else 2",
        "1; 2",
        "1e999",
        "",
        "1 +",
        "9" * 300,
        "10 ** 30",
        "99999999999 * 99999999999",
    ],
)
def test_calculator_rejects(expr):
    with pytest.raises(CalcError):
        safe_eval(expr)
    text, invalid = calculate(expr)
    assert invalid and text.startswith("Error: ")


def test_calculator_output_format_and_errors():
    assert calculate("(17 + 25) * 3") == ("126", False)
    assert calculate("1 / 3") == ("0.333333", False)
    assert calculate("7 / 2") == ("3.5", False)
    text, invalid = calculate("1 / 0")
    assert invalid and "division by zero" in text
    text, invalid = calculate("__import__('os')")
    assert invalid and "not allowed" in text


def test_parse_number():
    assert parse_number(" 1,200. ") == 1200
    assert parse_number("-3.5") == Fraction(-7, 2)
    assert parse_number("7/2") == Fraction(7, 2)
    assert parse_number("seven") is None
    assert parse_number("1/0") is None


# ---------------------------------------------------------------- malformed calls inside environments

MALFORMED = {
    "unterminated": '<tool_call>{"name": "X", "arguments": {',
    "invalid_json": '<tool_call>{"name": "X", "arguments": {ARG: 1}}</tool_call>',
    "not_object": "<tool_call>[1, 2]</tool_call>",
    "missing_name": '<tool_call>{"arguments": {}}</tool_call>',
    "unknown_tool": '<tool_call>{"name": "teleport", "arguments": {}}</tool_call>',
    "bad_arguments": '<tool_call>{"name": "X", "arguments": "hello"}</tool_call>',
    "missing_argument": '<tool_call>{"name": "X", "arguments": {}}</tool_call>',
    "wrong_type": '<tool_call>{"name": "X", "arguments": {"ARG": 5}}</tool_call>',
}


@pytest.mark.parametrize("name", ["arithmetic", "lookup", "rooms"])
def test_malformed_calls_become_error_observations(name):
    env = make_env(name, **({"max_steps": 50} if name == "rooms" else {}))
    task = env.tasks(1, seed=0)[0]
    env.reset(task)
    tool = env.tools[0]
    arg = tool.parameters["required"][0]
    key0 = env.state_key()
    for kind, text in MALFORMED.items():
        res = env.step(text.replace("X", tool.name).replace("ARG", arg))
        assert res.invalid and not res.done and res.role == "tool" and res.reward == 0.0, kind
        assert res.observation.startswith("Error: ") and "Format: <tool_call>" in res.observation, kind
        assert res.tool_calls == 0 and res.info["tool_errors"] == 1
        assert res.obs_key == key0  # nothing changed
    res = env.step("I am not sure what to do.")
    assert res.invalid and res.role == "user" and not res.done and "<tool_call>" in res.observation
    # the env keeps working: the expert still solves the task from here
    rng = random.Random(0)
    for _ in range(20):
        res = env.step(env.expert_action(rng))
        if res.done:
            break
    assert res.success and res.reward == 1.0
    after = env.step(format_tool_call(tool.name, {arg: "x"}))
    assert after.done and after.invalid and after.reward == 0.0


def test_multiple_calls_in_one_message_and_call_cap():
    env = LookupEnv()
    task = env.tasks(1, seed=0)[0]
    env.reset(task)
    chain = env.state["chain"]
    res = env.step(
        format_tool_call("search", {"query": chain[0]}) + format_tool_call("search", {"query": chain[1]})
    )
    assert res.tool_calls == 2 and not res.invalid and res.observation.count("\n") == 1
    res = env.step(format_tool_call("search", {"query": "x"}) * 6)
    assert res.tool_calls == 4 and "Only the first 4" in res.observation
