"""Options are explicit, not stamped attributes: driver options on the agent spec, engine capabilities
declared on the engine base class, the renderer protocol, and the declared parameters of agent kinds and
context managers."""

from __future__ import annotations

import dataclasses
import re

import pytest

from horizonrl.agents import AgentSpec, DriverOptions, LoopLimits, Renderer
from horizonrl.agents.context import CONTEXTS, context_params_declaration, make_context
from horizonrl.agents.driver import Generate, drive
from horizonrl.agents.expert import ExpertEngine
from horizonrl.agents.registry import AGENT_PARAMS, AGENTS, agent_params_declaration
from horizonrl.config import load_config
from horizonrl.inference.base import Engine, EngineWrapper, Generation, SamplingParams
from horizonrl.models.chat import ChatRenderer
from horizonrl.train.rollout.budget import BudgetedEngine, TokenBudget
from horizonrl.train.rollout.workers import driver_options
from horizonrl.vocab import DriverMode, ThinkingHistory


class _Echo(Engine):
    def __init__(self):
        self.calls = 0

    def generate(self, prompts, params):
        self.calls += 1
        return [Generation(ids=[len(p)], logprobs=[0.0], text="", finish_reason="stop") for p in prompts]

    def score(self, contexts, continuations):
        raise NotImplementedError


def _prog(i):
    g = yield Generate([i] * (i + 1), SamplingParams(max_new_tokens=1))
    return g.ids


def test_driver_options_come_from_the_config_not_the_engine():
    assert AgentSpec(renderer=None, params=SamplingParams(), limits=LoopLimits()).driver == DriverOptions()
    assert driver_options(load_config(None, [])) == DriverOptions(DriverMode.SYNC, 1)
    assert driver_options(load_config(None, ["rollout.driver=async", "rollout.env_threads=5"])) == (
        DriverOptions(DriverMode.ASYNC, 5)
    )
    assert driver_options(load_config(None, ["rollout.sync_env_threads=3"])) == DriverOptions("sync", 3)
    engine = _Echo()
    want = [[i + 1] for i in range(4)]
    assert drive(engine, [_prog(i) for i in range(4)], DriverOptions(threads=3)) == want
    assert not hasattr(engine, "driver") and not hasattr(engine, "program_threads")
    with pytest.raises(ValueError, match=r"driver mode must be one of \('sync', 'async'\)"):
        drive(engine, [_prog(0)], mode="eager")


def test_closed_vocabularies_are_the_config_choices():
    from horizonrl.config.rollout import RolloutConfig

    choices = {f.name: f.metadata.get("choices") for f in dataclasses.fields(RolloutConfig)}
    assert tuple(choices["driver"]) == ("sync", "async") == tuple(DriverMode)
    assert tuple(choices["thinking_history"]) == ("keep", "drop") == tuple(ThinkingHistory)


def test_engine_capabilities_are_declared_on_the_base_class():
    engine = _Echo()
    for flag in (
        "supports_top_logprobs",
        "supports_ignore_eos",
        "supports_interrupt",
        "supports_grammar",
        "supports_grammar_resume",
        "supports_seeds",
        "answers_requests",
    ):
        assert getattr(Engine, flag) is False and getattr(engine, flag) is False
    assert engine.open_stream() is None
    with pytest.raises(NotImplementedError):
        engine.generate_requests([])
    expert = ExpertEngine(None, eos_id=0)
    wrapped = BudgetedEngine(expert, TokenBudget())
    assert isinstance(wrapped, EngineWrapper)
    assert expert.answers_requests and wrapped.answers_requests and not wrapped.supports_seeds
    assert wrapped.generate_requests([]) == []


def test_chat_renderer_implements_the_renderer_protocol():
    members = [n for n in vars(Renderer) if not n.startswith("_") and n not in ("tokenizer", "eos_id")]
    assert {"initial_ids", "continuation_ids", "end_of_turn_ids", "drops_history"} <= set(members)
    missing = [n for n in members if not hasattr(ChatRenderer, n)]
    assert not missing


def _declared(params_cls) -> None:
    assert dataclasses.is_dataclass(params_cls) and params_cls.__dataclass_params__.frozen
    params_cls()  # every field has a default


def test_agent_kinds_and_context_managers_declare_their_parameters():
    for name in AGENTS.names():
        decl = agent_params_declaration(name)
        if name in AGENT_PARAMS:
            _declared(decl)
    assert set(AGENT_PARAMS) >= {"fork", "stepwise"}
    limits = LoopLimits(max_turns=4, context_budget=512)
    for name in CONTEXTS.names():
        cls = CONTEXTS.get(name)
        if cls.params_cls is None:
            continue
        _declared(context_params_declaration(cls))
        keys = [f.name for f in dataclasses.fields(cls.params_cls)]
        with pytest.raises(ValueError, match=re.escape(f"got unknown parameter(s) ['zz']; accepted: {keys}")):
            make_context(name, limits, {"zz": 1})
    assert {"compaction", "memory", "summary", "window", "strip_think", "turn_summary"} <= {
        n for n in CONTEXTS.names() if CONTEXTS.get(n).params_cls is not None
    }
    assert make_context("window", limits, {"n": 4}).n == 4
