"""A small tool environment and a scripted run of the react loop, shared by the tests of a step's
separate messages (``tests/envs/test_env_messages.py``, ``tests/models/test_env_messages_families.py``)."""

from __future__ import annotations

from typing import ClassVar

from horizonrl.agents.context import LoopLimits, make_context
from horizonrl.agents.program import Generate
from horizonrl.agents.react import episode_program, start_episode
from horizonrl.envs import CustomEnv, EnvMessage, StepResult, Task, format_tool_call, tool
from horizonrl.inference.base import Generation, SamplingParams

#: Tool results that are hard at a message boundary: leading spaces, a leading digit, a leading newline.
STOCK = {"pears": "  5 pears", "plums": "11", "figs": "\nnone left"}
NUDGE = "One more call is allowed."
QUESTION = "How many pears and plums are there?"


class Shelf(CustomEnv):
    """Count items on a shelf; ``nudge`` adds a user message after the tool results of a step."""

    name = "shelf_test"
    system_prompt = "Count with the tool, then answer."
    KNOBS: ClassVar[dict] = {"nudge": False}

    def setup(self, task):
        self.state["stock"] = dict(STOCK)

    @tool
    def count(self, item: str) -> str:
        """Count one item.

        Args:
            item: the item to count
        """
        return self.state["stock"][item]

    def step(self, action: str) -> StepResult:
        result = super().step(action)
        if not self.knobs["nudge"] or result.done:
            return result
        return StepResult(
            messages=[*result.messages, EnvMessage("user", NUDGE)],
            obs_key=result.obs_key,
            tool_calls=result.tool_calls,
            info=result.info,
        )


def shelf_task() -> Task:
    return Task("shelf-0", QUESTION, "16", (), {"env": "shelf_test", "split": "train"})


def count_calls(fam: str, items: list[str]) -> dict:
    """The assistant message that calls ``count`` once per item, as the template takes it."""
    if fam == "llama3_1":  # one structured call per message: the calls are the message's text
        return {
            "role": "assistant",
            "content": "\n".join(format_tool_call("count", {"item": i}) for i in items),
        }
    calls = [{"type": "function", "function": {"name": "count", "arguments": {"item": i}}} for i in items]
    return {"role": "assistant", "content": "", "tool_calls": calls}


def loop_prompts(
    renderer, env: Shelf, responses: list[dict], context: str = "append", **params
) -> tuple[list[list[int]], object]:
    """Run the react loop's program on ``env`` with ``responses`` as the sampled assistant messages
    (context manager ``context``); return the prompt of every generation request and the episode."""
    ep = start_episode(env, shelf_task(), renderer, uid="u", group_id="g")
    limits = LoopLimits(max_turns=len(responses), context_budget=8192)
    manager = make_context(context, limits, params)
    program = episode_program(ep, manager, SamplingParams(max_new_tokens=64))
    prompts = []
    request = next(program)
    for msg in responses:
        assert isinstance(request, Generate)
        prompts.append(list(request.prompt_ids))
        raw = renderer.assistant_text(msg)
        ids = renderer.response_ids(msg)
        gen = Generation(ids, [0.0] * len(ids), renderer.canonical_text(raw), "stop", {"raw_text": raw})
        try:
            request = program.send(gen)
        except StopIteration:
            break
    return prompts, ep
