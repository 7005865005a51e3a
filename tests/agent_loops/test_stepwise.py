"""The step-wise agent: rebuilt prompts with exactly K_H pairs, invalid flags, one row per step, demos."""

from __future__ import annotations

import random

import pytest

from horizonrl.agents import LoopLimits, run_program
from horizonrl.agents.registry import AgentSpec, check_agent_params, make_program
from horizonrl.agents.stepwise import revisit_rate, rollout_states, stepwise_demos
from horizonrl.envs import get_env
from horizonrl.envs.core.tools import format_tool_call
from horizonrl.inference.base import Engine, Generation, SamplingParams
from horizonrl.models import ChatRenderer, load_model_and_tokenizer
from horizonrl.trajectory import build_rows

ROOMS = {"n_rooms": 3, "n_objects": 2, "max_steps": 12}


class PolicyEngine(Engine):
    """Generates ``policy()`` (a function of nothing: it reads its env) + the end-of-turn token."""

    def __init__(self, tok, eos_id, policy):
        self.tok, self.eos_id, self.policy = tok, eos_id, policy
        self.actions: list[str] = []

    def generate(self, prompts, params):
        out = []
        for _ in prompts:
            text = self.policy()
            self.actions.append(text)
            ids = [*self.tok.encode(text, add_special_tokens=False), self.eos_id]
            out.append(Generation(ids, [-0.25] * len(ids), text, "stop"))
        return out

    def score(self, contexts, continuations):  # pragma: no cover - unused
        raise NotImplementedError


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    return ChatRenderer(load_model_and_tokenizer(tiny_model_dir)[1])


def _run(renderer, task, policy_of_env, *, max_turns=12, budget=4096, overflow="truncate", **agent_params):
    env = get_env("rooms")(**ROOMS)
    engine = PolicyEngine(renderer.tokenizer, renderer.eos_id, lambda: policy_of_env(env))
    spec = AgentSpec(
        renderer=renderer,
        params=SamplingParams(max_new_tokens=64),
        limits=LoopLimits(max_turns, budget, overflow),
        agent_params=agent_params,
    )
    rollout = run_program(engine, make_program("stepwise", env, task, spec, uid="u0", group_id="g0"))
    return rollout, engine.actions, env


def _tasks(n=3):
    return get_env("rooms").make_tasks(n, seed=5, split="train", **ROOMS)


def _command(action_text: str) -> str:
    return action_text.split('"command": "')[1].split('"')[0]


def _expected_user(task_prompt, observations, actions, t, k, admissible):
    """The step-t user message written out by hand from the recorded observations and actions."""
    task_line, _, first_obs = task_prompt.partition("\n")
    obs = [first_obs, *observations]
    lines = [task_line]
    if t:
        shown = list(range(max(0, t - k), t)) if k else []
        lines.append(f"History ({t} steps taken, last {len(shown)} shown):")
        lines += [
            f"[Observation {u + 1}: {obs[u].replace(chr(10), ' ')} | Action {u + 1}: {actions[u]}]"
            for u in shown
        ]
    lines.append(f"Step {t + 1}. Current observation: {obs[t]}")
    lines.append("Admissible actions: " + "; ".join(admissible) + ".")
    return "\n".join(lines)


@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_prompts_are_rebuilt_with_exactly_k_pairs(renderer, k):
    task = _tasks(1)[0]
    rng = random.Random(11)
    admissible_seen: list[list[str]] = []

    def policy(env):
        admissible_seen.append(env.admissible_commands())
        return env.expert_action(rng, noise=0.5)

    rollout, actions, env = _run(renderer, task, policy, history=k, tools=False)
    assert rollout.termination == "done" and rollout.success and rollout.num_turns >= 5  # > k + 1: truncated
    observations = [t.observation for t in rollout.turns[:-1]]
    commands = [_command(a) for a in actions]
    system = {"role": "system", "content": env.system_prompt}
    for t, turn in enumerate(rollout.turns):
        user = _expected_user(task.prompt, observations, commands, t, k, admissible_seen[t])
        assert turn.prompt_ids == renderer.initial_ids([system, {"role": "user", "content": user}])
        assert turn.info["history"] == min(t, k) and turn.info["step"] == t
        text = renderer.tokenizer.decode(turn.prompt_ids)
        assert text.count("[Observation ") == min(t, k)


def test_tool_schemas_are_rendered_when_enabled(renderer):
    task = _tasks(1)[0]
    rng = random.Random(0)
    with_tools, _, env = _run(renderer, task, lambda e: e.expert_action(rng), max_turns=1, tools=True)
    rng = random.Random(0)
    without, _, _ = _run(renderer, task, lambda e: e.expert_action(rng), max_turns=1, tools=False)
    user = without.turns[0].prompt_ids
    msgs = [{"role": "system", "content": env.system_prompt}]
    assert len(with_tools.turns[0].prompt_ids) > len(user)
    schemas = [t.to_schema() for t in env.tools]
    first = renderer.tokenizer.decode(user)
    user_text = first.split("<|im_start|>user\n")[1].split("<|im_end|>")[0]
    msgs.append({"role": "user", "content": user_text})
    assert with_tools.turns[0].prompt_ids == renderer.initial_ids(msgs, schemas)


def test_invalid_actions_are_flagged_per_step(renderer):
    task = _tasks(1)[0]

    def valid(env):
        return format_tool_call("act", {"command": env.admissible_commands()[0]})

    def two_valid(env):  # walk through a door and back: both admissible, but two actions in one step
        there = next(a for a in env.admissible_commands() if a.startswith("go to "))
        back = f"go to {env.state['at']}"
        return format_tool_call("act", {"command": there}) + format_tool_call("act", {"command": back})

    script = iter(
        [
            lambda env: format_tool_call("act", {"command": "go to the moon"}),  # not admissible
            lambda env: "I will think about it.",  # no action at all
            valid,
            lambda env: (
                format_tool_call("act", {"command": "fly"}) + format_tool_call("act", {"command": "swim"})
            ),
            two_valid,
        ]
    )
    rollout, _, _ = _run(renderer, task, lambda env: next(script)(env), max_turns=5, tools=False)
    turns = rollout.turns
    assert [t.invalid for t in turns] == [True, True, False, True, True]
    assert [t.info["invalid_reason"] for t in turns] == ["env", "env", None, "env", "multiple_actions"]
    assert turns[4].tool_calls == 2
    assert "Nothing happens." in turns[0].observation
    # An invalid step leaves the state unchanged: steps 1 and 2 are decided on the initial state.
    states = rollout_states(rollout)
    assert states[1] == states[0] and states[2] == states[0] and states[3] != states[0]


def test_one_row_per_step_with_its_exact_prompt(renderer):
    rng = random.Random(3)
    rollouts = [
        _run(renderer, t, lambda e: e.expert_action(rng, noise=0.3), tools=False)[0] for t in _tasks(3)
    ]
    rows = build_rows(rollouts)
    turns = [t for r in rollouts for t in r.turns]
    assert len(rows) == len(turns) == sum(r.num_turns for r in rollouts)
    assert all(len(r.segments) == 1 for r in rollouts)
    for row, turn in zip(rows, turns, strict=True):
        assert row.input_ids == turn.prompt_ids + turn.response_ids
        assert row.trainable == [False] * len(turn.prompt_ids) + [True] * len(turn.response_ids)
        assert row.old_logprobs[len(turn.prompt_ids) :] == [-0.25] * len(turn.response_ids)


def test_turn_limit_context_limit_and_revisits(renderer):
    task = _tasks(1)[0]
    stuck = format_tool_call("act", {"command": "dance"})
    rollout, _, _ = _run(renderer, task, lambda e: stuck, max_turns=4, tools=False)
    assert rollout.termination == "max_turns" and rollout.num_turns == 4 and not rollout.success
    assert rollout.reward == 0.0 and all(t.invalid for t in rollout.turns)
    # Every step after the first sees the initial state again: 3 revisits out of 4 steps.
    assert rollout.env["metrics"]["revisit_rate"] == pytest.approx(3 / 4)
    first_len = len(rollout.turns[0].prompt_ids)
    short, _, _ = _run(renderer, task, lambda e: stuck, budget=first_len + 10, overflow="fail", tools=False)
    assert short.termination == "context" and short.num_turns == 0


def test_revisit_rate_counts_earlier_states():
    assert revisit_rate(["a", "b", "a", None, "b", "c"]) == pytest.approx(2 / 6)
    assert revisit_rate([None, None]) == 0.0
    assert revisit_rate([]) == 0.0


def test_demos_use_the_agents_exact_prompts(renderer):
    tasks = _tasks(2)
    records = stepwise_demos(
        "rooms", 2, seed=7, noise=0.4, max_turns=12, knobs=ROOMS, task_seed=5, history=2, tools=False
    )
    rng = random.Random(7)
    turns = []
    for task in tasks:
        rollout, _, _ = _run(
            renderer, task, lambda e: e.expert_action(rng, noise=0.4), history=2, tools=False
        )
        turns += rollout.turns
    assert len(records) == len(turns)
    for rec, turn in zip(records, turns, strict=True):
        ids, mask = renderer.sft_example(rec["messages"], tools=rec["tools"])
        n = len(turn.prompt_ids)
        assert ids[:n] == turn.prompt_ids and ids[n:] == turn.response_ids
        assert mask == [0] * n + [1] * len(turn.response_ids)


def test_agent_parameters_are_checked(renderer):
    check_agent_params("stepwise", {"history": 2, "tools": False, "admissible": True, "task_lines": 1})
    with pytest.raises(ValueError, match="histroy"):
        check_agent_params("stepwise", {"histroy": 2})
    task = _tasks(1)[0]
    for bad in ({"history": -1}, {"history": 1.5}, {"task_lines": 0}, {"tools": "yes"}):
        with pytest.raises(ValueError, match=str(next(iter(bad.values())))):
            _run(renderer, task, lambda e: "", **bad)


def test_expert_program_warm_start_matches_the_demo_records(renderer):
    """``horizonrl sft`` drives this program with the expert engine; its rows equal the demo records' rows."""
    from horizonrl.config import from_dict
    from horizonrl.train.recipes import expert_program_rows
    from horizonrl.train.warmstart.sft import demo_rows

    cfg = from_dict(
        {
            "env": {"name": "rooms", "knobs": ROOMS, "seed": 5},
            "rollout": {"agent": "stepwise", "agent_params": {"tools": False}, "max_turns": 12},
            "train": {"seed": 7},
            "sft": {"demos": 1, "noise": 0.4},
        }
    )
    rows = expert_program_rows(cfg, renderer, renderer.tokenizer)
    records = stepwise_demos(
        "rooms", 1, seed=7, noise=0.4, max_turns=12, knobs=ROOMS, task_seed=5, tools=False
    )
    expected = demo_rows(renderer, records)
    assert len(rows) == len(expected) >= 2
    for got, want in zip(rows, expected, strict=True):
        assert got.input_ids == want.input_ids and got.trainable == want.trainable


def test_clean_labels_train_noise_steps_on_the_experts_correction(renderer):
    """``sft.labels: clean`` (DART): the same prompts as the executed demos; a noise step's target is
    the noise-free expert's command at that state, replayed here from the executed actions."""
    from horizonrl.config import from_dict
    from horizonrl.envs.builtin.rooms import expert_command
    from horizonrl.train.recipes import expert_program_rows

    def rows(labels):
        cfg = {
            "env": {"name": "rooms", "knobs": ROOMS, "seed": 5},
            "rollout": {"agent": "stepwise", "agent_params": {"tools": False}, "max_turns": 12},
            "train": {"seed": 7},
            "sft": {"demos": 1, "noise": 0.4, "labels": labels},
        }
        out = expert_program_rows(from_dict(cfg), renderer, renderer.tokenizer)
        split = [
            (
                [i for i, t in zip(r.input_ids, r.trainable, strict=True) if not t],
                [i for i, t in zip(r.input_ids, r.trainable, strict=True) if t],
            )
            for r in out
        ]
        return [(p, renderer.tokenizer.decode(a).removesuffix("<|im_end|>")) for p, a in split]

    executed, clean = rows("executed"), rows("clean")
    env = get_env("rooms")(**ROOMS)
    env.reset(get_env("rooms").make_tasks(1, seed=5, split="train", **ROOMS)[0])
    assert len(executed) == len(clean) >= 4
    relabeled = 0
    for (prompt, action), (clean_prompt, target) in zip(executed, clean, strict=True):
        assert clean_prompt == prompt
        assert target == format_tool_call("act", {"command": expert_command(env.state)})
        relabeled += target != action
        env.step(action)
    assert 0 < relabeled < len(executed)


def test_clean_labels_record_agent_program_demos_and_refuse_demo_files(tmp_path):
    from horizonrl.config import ConfigError, from_dict
    from horizonrl.train.recipes import demos_from_programs, run_sft

    plain = {"env": {"name": "arithmetic"}}  # react + append: the env's message demos...
    assert not demos_from_programs(from_dict(plain))
    assert demos_from_programs(from_dict({**plain, "sft": {"labels": "clean"}}))  # ...unless relabeled
    assert demos_from_programs(from_dict({**plain, "rollout": {"context": "summary"}}))
    (tmp_path / "d.jsonl").write_text("")
    cfg = from_dict({**plain, "sft": {"labels": "clean", "data": str(tmp_path / "d.jsonl")}})
    with pytest.raises(ConfigError, match=r"sft\.labels='clean' .* sft\.data=null"):
        run_sft(cfg)


def test_clean_labels_relabel_a_react_agents_noise_searches(renderer):
    """React + append with clean labels: a distractor search (an entity the context never named) is
    trained as the noise-free expert's search, which copies an entity from the context before it."""
    import re

    from horizonrl.config import from_dict
    from horizonrl.train.recipes import expert_program_rows

    def searches(labels):  # (context before the reply, query) for every search the rows train on
        cfg = {
            "env": {"name": "lookup", "knobs": {"hops": 2, "noise_kinds": {"distractor": 1}}, "seed": 3},
            "rollout": {"max_turns": 8, "max_new_tokens": 64},
            "sft": {"demos": 8, "noise": 0.5, "labels": labels},
        }
        out = []
        for r in expert_program_rows(from_dict(cfg), renderer, renderer.tokenizer):
            mask = r.trainable
            for k, t in enumerate(mask):
                if t and (k == 0 or not mask[k - 1]):  # a reply starts here
                    end = next((e for e in range(k, len(mask)) if not mask[e]), len(mask))
                    reply = renderer.tokenizer.decode(r.input_ids[k:end])
                    for q in re.findall(r'"query": "([^"]*)"', reply):
                        out.append((renderer.tokenizer.decode(r.input_ids[:k]), q))
        return out

    executed, clean = searches("executed"), searches("clean")
    assert clean and all(q in before for before, q in clean)
    assert any(q not in before for before, q in executed)  # the noise's searches, imitated as executed
