"""Time every parser of model text on adversarial inputs (issue 15, item 5).

Each case runs in its own subprocess with a 30 s timeout (so a hang or crash of one does not stop the
rest), on ``N`` repetitions of an adversarial fragment; the output is the time, the input size and
``ok`` or the exception raised. Works on any checkout (run it on an old one to compare)::

    PYTHONPATH=src python benchmarks/parsers.py 100000            # all cases at N = 100,000
    PYTHONPATH=src python benchmarks/parsers.py 10000,40000 tool_call_open_x,echo_repair_many

Measured at N = 100,000 (one thread, 2-core machine shared with other jobs), before (f6f271f) and
after the textparse rewrite::

    case                         input    before                        after
    tool_call_open_x             1.1 MB   15.2 s                        0.15 s
    tool_call_deep_json          0.2 MB   RecursionError                0.00 s (too_large error)
    tool_call_huge_int           0.1 MB   ValueError (4300 digits)      0.00 s (too_large error)
    compaction_summary_open_x    0.9 MB   > 30 s (3.3 s at N=10,000)    0.00 s
    compaction_turn_record       1.1 MB   16.1 s                        0.28 s
    echo_render_action           1.1 MB   25.9 s                        0.25 s
    echo_selection_huge_index    0.1 MB   ValueError (4300 digits)      0.00 s (malformed entry)
    echo_repair_many             1.1 MB   > 30 s (5.5 s at N=40,000)    0.08 s
    psi_summary                  1.1 MB   25.2 s                        0.28 s
    stepwise_action              1.1 MB   25.5 s                        0.32 s
    arith_answer_exponent        "1e10^7" 5.2 s (grows with exponent)   0.00 s (None)
    serve_extract                1.1 MB   > 30 s                        0.30 s
    answer, SUPO summary, ECHO finding/selection tags, judge, airline: linear before and after (< 0.01 s)
"""

from __future__ import annotations

import subprocess
import sys

CASES = {
    "tool_call_open_x": ("from horizonrl.envs.core.tools import parse_tool_calls as f", "'<tool_call>' * N"),
    "tool_call_deep_json": (
        "from horizonrl.envs.core.tools import parse_tool_calls as f",
        "'<tool_call>{\"name\": \"x\", \"arguments\": {\"a\": ' + '[' * N + ']' * N + '}}</tool_call>'",
    ),
    "tool_call_huge_int": (
        "from horizonrl.envs.core.tools import parse_tool_calls as f",
        '\'<tool_call>{"name": "x", "arguments": {"a": \' + \'7\' * N + \'}}</tool_call>\'',
    ),
    "answer_open_x": ("from horizonrl.envs.core.tools import parse_answer as f", "'<answer>' * N"),
    "compaction_summary_open_x": (
        "from horizonrl.agents.compaction import extract_summary as f",
        "'<summary>' * N",
    ),
    "compaction_turn_record": (
        "from horizonrl.agents.compaction import turn_record; f = lambda t: turn_record(t, 'obs', None)",
        "'<tool_call>' * N",
    ),
    "supo_summary_open_x": ("from horizonrl.agents.summary import parse_summary as f", "'<summary>' * N"),
    "supo_think_open_x": (
        "from horizonrl.agents.summary import parse_summary as f",
        "'<think>' * N + '<summary>x</summary>'",
    ),
    "echo_finding_open_x": (
        "from horizonrl.agents.memory import locate_finding as f",
        "'<sum_last_turn>' * N",
    ),
    "echo_render_action": ("from horizonrl.agents.memory import render_action as f", "'<tool_call>' * N"),
    "echo_selection_open_x": (
        "from horizonrl.agents.memory import parse_selection as f",
        "'<selection>' * N",
    ),
    "echo_selection_huge_index": (
        "from horizonrl.agents.memory import parse_selection as f",
        "'<selection>turn_' + '1' * N + '</selection>'",
    ),
    "echo_repair_many": (
        "from horizonrl.agents.memory import repair_selection, parse_selection; "
        "f = lambda t: repair_selection(parse_selection(t), range(N), max_selected=3, keep_latest=1)",
        "'<selection>' + ''.join(f'turn_{i}\\n' for i in range(N)) + '</selection>'",
    ),
    "judge_verdict_think_x": ("from horizonrl.judge import parse_verdict as f", "'<think>' * N + '1'"),
    "psi_summary": (
        "from horizonrl.agents.psi import extract_summary; f = lambda t: extract_summary(t, 'o', [])",
        "'<tool_call>' * N",
    ),
    "stepwise_action": ("from horizonrl.agents.stepwise import action_summary as f", "'<tool_call>' * N"),
    "arith_answer_exponent": (
        "from horizonrl.envs.builtin.calculator import parse_number as f",
        "'1e' + str(N * 100)",
    ),
    "serve_extract": ("from horizonrl.serve import extract_tool_calls as f", "'<tool_call>' * N"),
    "airline_visible": (
        "from horizonrl.envs.builtin.airline.env import visible_text as f",
        "'<tool_call><think>' * N",
    ),
}

BODY = """
import sys, time
sys.setrecursionlimit(1000)
{imp}
N = {n}
text = {expr}
t = time.perf_counter()
try:
    f(text); out = 'ok'
except BaseException as e:
    out = type(e).__name__ + ': ' + str(e)[:60]
print(f'{{time.perf_counter() - t:.3f}}s {{len(text)/1e6:.2f}}MB {{out}}')
"""


def main():
    sizes = [int(x) for x in sys.argv[1].split(",")] if len(sys.argv) > 1 else [10_000, 100_000]
    only = sys.argv[2].split(",") if len(sys.argv) > 2 else list(CASES)
    for name in only:
        imp, expr = CASES[name]
        for n in sizes:
            try:
                r = subprocess.run(
                    [sys.executable, "-c", BODY.format(imp=imp, n=n, expr=expr)],
                    capture_output=True,
                    text=True,
                    timeout=30,
                )
                res = r.stdout.strip() or r.stderr.strip().splitlines()[-1]
            except subprocess.TimeoutExpired:
                res = "TIMEOUT >30s"
            print(f"{name:28s} N={n:>8d}  {res}", flush=True)


main()
