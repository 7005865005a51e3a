"""CCPO hidden-state provider: exact last-token states of the frozen reference, row order, cache, no grad."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from horizonrl import credit
from horizonrl.config import RunConfig, from_dict
from horizonrl.credit.ccpo import peer_diagnostics
from horizonrl.credit.ccpo_features import observation_mode, step_batch_from_groups
from horizonrl.train.methods.ccpo import (
    HiddenStateCache,
    hidden,
    last_token_states,
    reference_model,
    support_rates,
)
from horizonrl.train.trainers.features import FeatureContext, compute_features
from horizonrl.trajectory import Group, Rollout, Segment, Turn

pytestmark = pytest.mark.usefixtures("one_thread")


def _ctx(model, tok, ref=None):
    return FeatureContext(
        cfg=None, engine=None, renderer=None, tokenizer=tok, model=model, ref_model=ref, tasks_by_id={}
    )


def _turn(prompt):
    return Turn(prompt_ids=list(prompt), response_ids=[5, 6], logprobs=[-1.0, -1.0], obs_key=None)


def _groups(seed=0, vocab=300):
    """Two tasks; rollouts of 1-4 turns with prompts of 3-40 tokens. Every rollout of a task starts from
    the same prompt (a duplicate across rollouts), and rollout 1 of task 0 repeats a whole prompt of
    rollout 0 at another step."""
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(2):
        first = rng.integers(3, vocab, size=int(rng.integers(3, 12))).tolist()
        rollouts = []
        for k in range(3 if g == 0 else 2):
            prompts = [first] + [
                rng.integers(3, vocab, size=int(rng.integers(3, 40))).tolist()
                for _ in range(int(rng.integers(0, 4)))
            ]
            seg = Segment(turns=[_turn(p) for p in prompts])
            rollouts.append(
                Rollout(uid=f"{g}-{k}", task_id=f"t{g}", group_id=str(g), segments=[seg], reward=float(k % 2))
            )
        groups.append(Group(group_id=str(g), task_id=f"t{g}", rollouts=rollouts))
    extra = groups[0].rollouts[0].turns[-1].prompt_ids
    groups[0].rollouts[1].segments[0].turns.append(_turn(extra))
    return groups


def _direct(model, prompt):
    """Independent reference: an unbatched full forward, the last layer's state at the last position."""
    with torch.no_grad():
        out = model(torch.tensor([prompt]), output_hidden_states=True)
    return out.hidden_states[-1][0, -1].float().numpy()


def _forward_counter(model):
    """Count the prompt rows the decoder runs; record whether grad mode was on during each call."""
    seen = {"rows": 0, "grad": []}

    def hook(module, args, kwargs):
        seen["rows"] += int(kwargs["input_ids"].shape[0])
        seen["grad"].append(torch.is_grad_enabled())

    handle = model.base_model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen, handle


def test_states_equal_a_direct_forward_in_step_batch_order(model_tok):
    model, tok = model_tok
    ctx = _ctx(model, tok)
    groups = _groups()
    out = hidden(ctx, groups, {}).value
    steps = step_batch_from_groups(groups)
    rollouts = [r for g in groups for r in g.rollouts]
    assert out.dtype == np.float32 and out.shape == (len(steps), model.config.hidden_size)
    for k in range(len(steps)):
        prompt = rollouts[steps.trajectory_ids[k]].turns[steps.steps[k]].prompt_ids
        np.testing.assert_allclose(out[k], _direct(model, prompt), rtol=1e-4, atol=1e-5)
    # Rows of different prompts differ (the gather picked each prompt's own last position).
    assert not np.allclose(out[0], out[1])


def test_duplicates_run_once_and_later_calls_hit_the_cache(model_tok):
    model, tok = model_tok
    ctx = _ctx(model, tok)
    groups = _groups(seed=1)
    prompts = [tuple(t.prompt_ids) for g in groups for r in g.rollouts for t in r.turns]
    n_unique = len(set(prompts))
    assert n_unique < len(prompts)  # the batch has duplicates
    ref = ctx.state["ref"] = copy.deepcopy(model).eval().requires_grad_(False)
    seen, handle = _forward_counter(ref)
    try:
        first = hidden(ctx, groups, {})
        assert seen["rows"] == n_unique
        m = first.metrics
        assert m["ccpo/forward_prompts"] == n_unique and m["ccpo/cache_hit_rate"] == 0.0
        assert m["ccpo/unique_prompt_rate"] == pytest.approx(n_unique / len(prompts))
        second = hidden(ctx, groups, {})
        assert seen["rows"] == n_unique  # nothing ran again
        assert second.metrics["ccpo/cache_hit_rate"] == 1.0
        np.testing.assert_array_equal(first.value, second.value)
        # A batch mixing cached and new prompts runs only the new ones.
        more = _groups(seed=2)
        new = {tuple(t.prompt_ids) for g in more for r in g.rollouts for t in r.turns} - set(prompts)
        hidden(ctx, [groups[0], *more], {})
        assert seen["rows"] == n_unique + len(new)
    finally:
        handle.remove()
    assert not any(seen["grad"])


def test_frozen_copy_of_the_initial_policy_and_no_gradient(model_tok):
    model, tok = model_tok
    policy = copy.deepcopy(model)
    initial = copy.deepcopy(model)
    ctx = _ctx(policy, tok)
    groups = _groups(seed=3)
    hidden(ctx, groups, {})
    ref = ctx.state["ref"]
    assert ref is not policy and not any(p.requires_grad for p in ref.parameters())
    assert all(p.grad is None for p in policy.parameters())
    with torch.no_grad():  # the policy moves on; the reference does not
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    fresh = _groups(seed=4)
    out = hidden(ctx, fresh, {}).value
    assert ctx.state["ref"] is ref
    prompt = fresh[0].rollouts[0].turns[0].prompt_ids
    np.testing.assert_allclose(out[0], _direct(initial, prompt), rtol=1e-4, atol=1e-5)
    assert not np.allclose(out[0], _direct(policy, prompt), atol=1e-4)


def test_a_resumed_run_reloads_its_starting_weights(model_tok, tiny_model_dir, tmp_path):
    model, tok = model_tok
    policy = copy.deepcopy(model)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05)
    cfg: RunConfig = from_dict({"model": {"device": "cpu"}, "train": {"init": str(tiny_model_dir)}})
    ctx = _ctx(policy, tok)
    ctx.step, ctx.cfg, ctx.run_dir = 3, cfg, tmp_path
    ref = reference_model(ctx)
    assert ref is ctx.state["ref"] and not any(p.requires_grad for p in ref.parameters())
    for a, b in zip(ref.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_the_trainers_reference_model_is_used_when_present(model_tok):
    model, tok = model_tok
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(1.1)
    ctx = _ctx(model, tok, ref=other)
    groups = _groups(seed=5)
    out = hidden(ctx, groups, {}).value
    assert "ref" not in ctx.state
    prompt = groups[1].rollouts[1].turns[-1].prompt_ids
    np.testing.assert_allclose(out[-1], _direct(other, prompt), rtol=1e-4, atol=1e-5)


def test_micro_batches_and_padding_do_not_change_states(model_tok):
    model, _ = model_tok
    prompts = [[7, 8, 9], list(range(3, 60)), [11] * 20, [12, 13]]
    small = last_token_states(model, prompts, pad_id=0, token_budget=64)  # one prompt per chunk or two
    large = last_token_states(model, prompts, pad_id=1, token_budget=10_000)  # one padded batch
    np.testing.assert_allclose(small, large, rtol=1e-4, atol=1e-5)
    for k, p in enumerate(prompts):
        np.testing.assert_allclose(large[k], _direct(model, p), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="empty prompt"):
        last_token_states(model, [[1, 2], []])


def test_lru_cache_evicts_the_least_recently_used():
    cache = HiddenStateCache(2)
    a, b, c = (1,), (2,), (3,)
    cache.put(a, np.zeros(1))
    cache.put(b, np.ones(1))
    assert cache.get(a) is not None  # a is now the most recent
    cache.put(c, np.full(1, 2.0))
    assert a in cache and c in cache and b not in cache and len(cache) == 2
    assert cache.get(b) is None and (cache.hits, cache.misses) == (1, 1)
    with pytest.raises(ValueError, match="max_entries"):
        HiddenStateCache(0)


def test_support_rates_by_hand():
    # Task 0: two rollouts; task 1: a single rollout (its steps have no peer trajectory).
    def ro(uid, keys):
        turns = [_turn([1, 2, 3])] + [_turn([4 + i]) for i in range(len(keys))]
        for t, k in zip(turns, keys, strict=False):
            t.obs_key = k
        return Rollout(uid=uid, task_id="t", group_id="g", segments=[Segment(turns=turns)])

    groups = [
        Group("0", "t0", [ro("a", ["x", "y"]), ro("b", ["x", "z"])]),  # steps: [p, x, y], [p, x, z]
        Group("1", "t1", [ro("c", ["x"])]),  # steps: [p', x]
    ]
    # Observations (prompt mode): a: p, x, y; b: p, x, z; c: p, x -> exact peers for p, x in a and b.
    sup, exact = support_rates(groups)
    assert sup == pytest.approx(6 / 8) and exact == pytest.approx(4 / 8)
    assert support_rates(groups, exclude_self=False) == (1.0, 1.0)


def test_the_ccpo_estimator_runs_on_the_provided_states(model_tok):
    model, tok = model_tok
    ctx = _ctx(model, tok)
    groups = _groups(seed=6)
    est = credit.get_estimator("ccpo")
    values, metrics = compute_features(ctx, est.needs, groups, {})
    assert values["hidden"].shape[0] == len(step_batch_from_groups(groups))
    assert "time/feature_hidden_s" in metrics and "ccpo/supported_rate" in metrics
    adv = est(groups, **values)
    assert len(adv) == sum(len(g.rollouts) for g in groups)
    # The peer diagnostics read the estimator's own parameters (here gamma, eta) and probe kappa = 2.
    params = {"gamma": 0.9, "eta": 0.05, "kappa": 0.0}
    _, metrics = compute_features(ctx, est.needs, groups, params)
    steps = step_batch_from_groups(groups, observation=observation_mode("text"))  # obs_key defaults to text
    want = peer_diagnostics(steps, values["hidden"], gamma=0.9, eta=0.05, kappa=2.0)
    assert want and {f"ccpo/{k}": v for k, v in want.items()}.items() <= metrics.items()


def test_one_group_trainer_step_with_ccpo_and_the_stepwise_agent(tiny_model_dir, tmp_path):
    import horizonrl.agents.stepwise  # noqa: F401  (registers the agent)
    from horizonrl.train.trainers.group import GroupTrainer

    cfg = from_dict(
        {
            "model": {"device": "cpu"},
            "env": {"name": "rooms", "knobs": {"n_rooms": 2}, "train_tasks": 4, "test_tasks": 2},
            "rollout": {
                "agent": "stepwise",
                "agent_params": {"history": 2, "tools": False},
                "group_size": 3,
                "tasks_per_step": 2,
                "max_new_tokens": 8,
                "max_turns": 3,
            },
            "algo": {"estimator": "ccpo", "estimator_params": {"eta": 0.01}},
            "train": {"init": str(tiny_model_dir), "out_dir": str(tmp_path), "progress": False},
        }
    )
    trainer = GroupTrainer(cfg)
    m = trainer.train_step()
    assert trainer.ref_model is None and trainer.feature_state["hidden"]["ref"] is not trainer.model
    assert m["ccpo/forward_prompts"] >= 2 and m["ccpo/supported_rate"] == 1.0
    assert 0.0 <= m["ccpo/cache_hit_rate"] <= 1.0 and "rollout/revisit_rate" in m
    assert 1.0 <= m["rollout/turns_mean"] <= 3.0
