"""Few-shot prompts (``rollout.few_shot``): expert episodes shown before the task as earlier chat turns.

A pretrained model that has never seen an environment's protocol rarely writes a well-formed tool call or
final answer, so RL starts from a reward of exactly zero and has no signal. In-context examples are the
standard fix (the few-shot prompting of Brown et al., 2020; ReAct, Yao et al., 2023, prompts its agents
with solved trajectories the same way). Here the examples are the environment's own scripted expert
(``Env.expert_action`` at noise 0) on training tasks, kept only when they succeed, and placed between
the system message and the task as ordinary user / assistant / tool turns. Their tool calls become
structured ``tool_calls``, so the chat renderer writes them in the model family's own syntax (Hermes,
Qwen, Llama 3 JSON, pythonic; :mod:`horizonrl.tool_formats`) exactly as the policy would write them.

The examples are the same for every episode of a run (drawn once from ``env.seed``), are part of every
prompt, and are never trained on: only the policy's own responses are.
"""

from __future__ import annotations

import random
from typing import Any

from horizonrl.envs.core.tools import ToolCall, parse_tool_calls
from horizonrl.errors import ConfigError
from horizonrl.textparse import iter_blocks
from horizonrl.tool_formats import TOOL_CLOSE, TOOL_OPEN
from horizonrl.train.warmstart.bootstrap import expert_demo

__all__ = ["few_shot_messages", "structured_turn"]

#: Offset of the example tasks' seed from ``env.seed`` (a different draw from the training tasks').
SEED_OFFSET = 7_919


def structured_turn(content: str) -> dict[str, Any]:
    """An assistant message in the canonical syntax (``<tool_call>{...}</tool_call>`` blocks) as
    ``{"role": "assistant", "content": text outside the blocks, "tool_calls": [...]}``; text without
    well-formed calls stays as it is."""
    calls = parse_tool_calls(content)
    if not calls or not all(isinstance(c, ToolCall) for c in calls):
        return {"role": "assistant", "content": content}
    rest = content
    for block in reversed(list(iter_blocks(content, TOOL_OPEN, TOOL_CLOSE))):
        rest = rest[: block.start] + rest[block.end :]
    return {
        "role": "assistant",
        "content": rest.strip(),
        "tool_calls": [{"name": c.name, "arguments": dict(c.arguments)} for c in calls],
    }


def few_shot_messages(setup: Any, k: int, *, seed: int, max_turns: int) -> tuple[dict[str, Any], ...]:
    """``k`` successful expert episodes on training tasks of ``setup`` (an
    :class:`~horizonrl.train.rollout.env_setup.EnvSetup`) as chat turns without their system messages.

    Tasks are drawn from the training split with seed ``seed + SEED_OFFSET``; up to ``8 k`` are tried.
    ConfigError when the environment has no expert or fewer than ``k`` of its episodes succeed.
    """
    if k <= 0:
        return ()
    tasks = setup.tasks(8 * k, seed=seed + SEED_OFFSET, split="train")
    rng = random.Random(seed)
    shown: list[dict[str, Any]] = []
    found = 0
    for task in tasks:
        env = setup.make()
        try:
            demo = expert_demo(env, task, rng, noise=0.0, max_turns=max_turns)
        except NotImplementedError:
            raise ConfigError(
                f"rollout.few_shot={k}: environment {env.name!r} has no expert to show examples"
            ) from None
        finally:
            env.close()
        if not demo["success"]:
            continue
        for m in demo["messages"][1:]:  # without the system message: the episode's own comes first
            shown.append(structured_turn(m["content"]) if m["role"] == "assistant" else dict(m))
        found += 1
        if found == k:
            return tuple(shown)
    raise ConfigError(
        f"rollout.few_shot={k}: only {found} of {len(tasks)} expert episodes succeeded within "
        f"rollout.max_turns={max_turns}"
    )
