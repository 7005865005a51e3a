"""verifiers environments this adapter must refuse or survive (tests/envs/test_verifiers_env.py)."""

from __future__ import annotations

import asyncio

import verifiers as vf
from datasets import Dataset

ROWS = [{"question": f"Say {i}.", "answer": str(i)} for i in range(6)]


def load_environment(kind: str = "nan") -> vf.Environment:
    if kind == "few_shot":
        return vf.SingleTurnEnv(
            dataset=Dataset.from_list(ROWS),
            few_shot=[{"role": "user", "content": "Say 9."}, {"role": "assistant", "content": "9"}],
            rubric=vf.Rubric(funcs=[lambda completion, **kw: 1.0]),
        )
    if kind == "group":

        def ranked(completions, **kw) -> list[float]:
            return [float(i) for i in range(len(completions))]

        return vf.SingleTurnEnv(dataset=Dataset.from_list(ROWS), rubric=vf.Rubric(funcs=[ranked]))
    if kind == "nan":
        return vf.SingleTurnEnv(
            dataset=Dataset.from_list(ROWS), rubric=vf.Rubric(funcs=[lambda completion, **kw: float("nan")])
        )
    if kind == "raising_tool":

        def boom(x: int) -> int:
            """Always fails.

            Args:
                x: anything
            """
            raise RuntimeError("boom")

        return vf.ToolEnv(
            dataset=Dataset.from_list(ROWS),
            tools=[boom],
            rubric=vf.Rubric(funcs=[lambda completion, **kw: 0.5]),
            max_turns=2,
        )
    if kind in ("raising_env", "slow_env", "bad_setup"):

        class Odd(vf.MultiTurnEnv):
            async def setup_state(self, state):
                if kind == "bad_setup":
                    raise RuntimeError("no sandbox for this row")
                return state

            async def env_response(self, messages, state, **kwargs):
                if kind == "raising_env":
                    raise RuntimeError("the environment broke")
                await asyncio.sleep(60)
                return [{"role": "user", "content": "late"}]

        return Odd(
            dataset=Dataset.from_list(ROWS),
            rubric=vf.Rubric(funcs=[lambda completion, **kw: 0.25]),
            max_turns=3,
        )
    raise ValueError(f"unknown kind {kind!r}")
