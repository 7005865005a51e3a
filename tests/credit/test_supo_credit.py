"""SUPO credit (docs/spec/baselines.md "SUPO"): GRPO over non-overlong rollouts, broadcast, overlong -> 0."""

from __future__ import annotations

import math

import numpy as np
import pytest

import horizonrl.credit.supo as supo_mod
from horizonrl.credit.registry import get_estimator
from horizonrl.credit.supo import supo_advantage
from horizonrl.trajectory import Group, Rollout, Segment, Span, Turn


def _turn(n: int, summary: bool = False) -> Turn:
    spans = [Span("summary", 0, n)] if summary else []
    return Turn(prompt_ids=[1], response_ids=list(range(n)), logprobs=[-0.1] * n, spans=spans)


def _rollout(uid: str, reward: float, termination: str = "done") -> Rollout:
    """Two segments: working turns + a summary turn, then a continuation from the summary."""
    segs = [
        Segment(kind="normal", turns=[_turn(3), _turn(2, summary=True)]),
        Segment(kind="summary", turns=[_turn(4)], parent=0),
    ]
    return Rollout(uid=uid, task_id="t", group_id="g", segments=segs, reward=reward, termination=termination)


def _flat(adv_r) -> np.ndarray:
    return np.concatenate([t for s in adv_r for t in s])


def test_supo_advantage_excludes_overlong_from_stats():
    # non-overlong rewards [1, 0, 0]: mean 1/3, sample std sqrt(1/3); the overlong reward 1 is ignored
    a = supo_advantage([1, 0, 1, 0], [False, False, True, False])
    s = math.sqrt(1 / 3) + 1e-6
    np.testing.assert_allclose(a, [(2 / 3) / s, (-1 / 3) / s, 0.0, (-1 / 3) / s])
    np.testing.assert_allclose(
        supo_advantage([1, 0, 1], [False, False, True], normalize_std=False), [0.5, -0.5, 0.0]
    )
    assert supo_advantage([1, 0], [True, True]).tolist() == [0.0, 0.0]
    assert supo_advantage([1, 0], [False, True]).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError):
        supo_advantage([1, 0], [False])


def test_supo_estimator_broadcasts_including_summary_tokens():
    g = Group("g", "t", [_rollout("a", 1), _rollout("b", 0), _rollout("c", 1, "overlong"), _rollout("d", 0)])
    adv = get_estimator("supo")([g])
    s = math.sqrt(1 / 3) + 1e-6
    for i, a in enumerate([(2 / 3) / s, (-1 / 3) / s, 0.0, (-1 / 3) / s]):
        flat = _flat(adv[i])
        assert flat.shape == (9,)  # 3 + 2 summary tokens + 4
        np.testing.assert_allclose(flat, a)
    assert [t.shape for seg in adv[0] for t in seg] == [(3,), (2,), (4,)]


def test_supo_all_overlong_or_all_equal_groups_are_zero():
    g1 = Group("g", "t", [_rollout("a", 1, "overlong"), _rollout("b", 0, "overlong")])
    g2 = Group("h", "t", [_rollout("c", 1), _rollout("d", 1), _rollout("e", 0, "overlong")])
    adv = supo_mod.supo([g1, g2])
    assert all(np.all(_flat(r) == 0) for r in adv)


def test_supo_other_terminations_are_not_overlong():
    g = Group("g", "t", [_rollout("a", 1), _rollout("b", 0, "error"), _rollout("c", 0, "max_turns")])
    adv = supo_mod.supo([g])
    assert _flat(adv[1])[0] < 0 and _flat(adv[2])[0] < 0
    adv = supo_mod.supo([g], overlong_terminations=("overlong", "error"))
    assert np.all(_flat(adv[1]) == 0)
    np.testing.assert_allclose(_flat(adv[0]), 0.5 / (math.sqrt(0.5) + 1e-6))


def test_supo_registry_wiring():
    spec = get_estimator("supo")
    assert spec.loss_agg_mode == "token-mean"
    assert set(spec.params) == {"overlong_terminations", "normalize_std", "eps"}
    with pytest.raises(TypeError, match="unknown parameter"):
        spec([Group("g", "t", [_rollout("a", 1)])], sign_rule="signed")
