"""Scripted policies driving Mosaic's multi-session loops (compaction, subagent forking) on the ``lookup``
environment, shared by ``tests/agent_loops/test_mosaic_agents.py`` and ``test_mosaic_fixes.py``."""

from __future__ import annotations

from horizonrl.agents import AgentSpec, LoopLimits
from horizonrl.envs import get_env
from horizonrl.envs.core.tools import format_answer, format_tool_call
from horizonrl.inference.base import Engine, Generation, SamplingParams
from horizonrl.models import ChatRenderer
from horizonrl.train.rollout.collect import collect_groups

KNOBS = {"hops": 3, "obs_facts": 3}


class PolicyEngine(Engine):
    """Scripted policy over the decoded context; records the batch size of every call."""

    def __init__(self, tok, policy):
        self.tok, self.policy, self.batches = tok, policy, []

    def generate(self, prompts, params):
        self.batches.append(len(prompts))
        out = []
        for p in prompts:
            text = self.policy(self.tok.decode(p))
            ids = [*self.tok.encode(text, add_special_tokens=False), self.tok.eos_token_id]
            finish = "length" if len(ids) > params.max_new_tokens else "stop"
            ids = ids[: params.max_new_tokens]
            out.append(
                Generation(ids, [-0.1] * len(ids), self.tok.decode(ids, skip_special_tokens=True), finish)
            )
        return out

    def score(self, contexts, continuations):  # pragma: no cover - unused
        raise NotImplementedError


def run_lookup(
    tok, policy, *, agent="react", context="compaction", cparams=None, aparams=None, budget=900, turns=8
):
    """One ``lookup`` task (seed 5) run by the scripted ``policy(context_text, task)`` under ``agent`` and
    ``context``; returns ``(rollout, task, renderer, engine)``."""
    cls = get_env("lookup")
    task = cls.make_tasks(1, seed=5, **KNOBS)[0]
    renderer = ChatRenderer(tok)
    spec = AgentSpec(
        renderer=renderer,
        params=SamplingParams(max_new_tokens=120),
        limits=LoopLimits(turns, budget),
        context=context,
        context_params={"prompts": "short", **(cparams or {})},
        agent_params=aparams or {},
        make_env=lambda: cls(**KNOBS),
    )
    eng = PolicyEngine(tok, lambda ctx: policy(ctx, task))
    (g,) = collect_groups(
        eng, renderer, spec.make_env, [task], 1, spec.params, spec.limits, agent=agent, spec=spec
    )
    return g.rollouts[0], task, renderer, eng


def forker(n_tasks, *, child_answers=True, forks=1):
    """A parent policy that forks ``n_tasks`` subagents ``forks`` times, then answers; the children search
    once and answer when ``child_answers``."""

    def policy(ctx, task):
        if "Subagent task:" in ctx:
            if child_answers and "<tool_response>" in ctx:
                return format_answer("Madi")
            return format_tool_call("search", {"query": task.meta["chain"][0]})
        made = ctx.count("Subagent #1:") + ctx.count("not executed")
        if made < forks:
            subs = [{"task": f"Find fact {k}."} for k in range(n_tasks)]
            return format_tool_call("fork", {"subagents": subs})
        return format_answer(task.answer)

    return policy
