"""The baselines as their papers (or the reference implementation the papers ran) define them.

The hand batch (one task, three trajectories; every value below is worked by hand on it):
traj 0: s0 s1 s2 (R = 1, step 1 invalid); traj 1: s0 s1 s1 s3 (R = 0, step 2 invalid); traj 2: s0 s4 (R = 1).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from horizonrl.credit import get_estimator
from horizonrl.credit.ccpo_features import prompt_observations
from horizonrl.credit.gigpo import discounted_returns, episode_advantage, hgpo_advantage
from horizonrl.losses import aggregate, policy_loss, token_coefficients
from horizonrl.train.update.ppo import rollout_mini_batches
from horizonrl.trajectory import Rollout, Row, Segment, Turn

TRAJ = [0, 0, 0, 1, 1, 1, 1, 2, 2]
STEP = [0, 1, 2, 0, 1, 2, 3, 0, 1]
OBS = ["s0", "s1", "s2", "s0", "s1", "s1", "s3", "s0", "s4"]
R = np.array([1, 1, 1, 0, 0, 0, 0, 1, 1.0])
INV = np.array([0, 1, 0, 0, 0, 1, 0, 0, 0.0])
ETA = 0.1


def test_gigpo_episode_term_over_step_rows_as_in_verl_agent():
    # verl-agent: score_{i,t} = R_i - eta 1[invalid]; mean over the task's step rows (cross steps).
    scores = R - ETA * INV
    want = scores - scores.mean()
    got = episode_advantage(["x"] * 9, TRAJ, R, episode="steps", penalties=ETA * INV)
    np.testing.assert_allclose(got, want)
    np.testing.assert_allclose(got[:3], [0.4667, 0.3667, 0.4667], atol=1e-4)  # the review's numbers
    # The spec's per-trajectory reading: one value per rollout, no penalty: R - mean over rollouts.
    per_traj = episode_advantage(["x"] * 9, TRAJ, R)
    np.testing.assert_allclose(per_traj, [1 / 3] * 3 + [-2 / 3] * 4 + [1 / 3] * 2)


def _recipe_hgpo(traj, t, obs, ret, history=2, drop_zero=True, ddof=0):
    """Independent loop transcription of the released HGPO recipe (population std, zero items dropped)."""
    n = len(t)
    groups: dict = {}
    for i in range(n):
        hist = [
            obs[j]
            for j in sorted((j for j in range(n) if traj[j] == traj[i] and t[j] <= t[i]), key=t.__getitem__)
        ]
        for k in range(1, min(history + 1, t[i] + 1) + 1):
            groups.setdefault((k, tuple(hist[-k:])), []).append(i)
    items: dict = {i: [] for i in range(n)}
    for (k, _), members in groups.items():
        if len(members) < 2:
            continue
        r = ret[members]
        sd = r.std(ddof=ddof)
        for j, i in enumerate(members):
            items[i].append((k, 0.0 if np.all(r == r[0]) else (r[j] - r.mean()) / (sd + 1e-6)))
    out = np.zeros(n)
    for i in range(n):
        its = [(k, a) for k, a in items[i] if a != 0 or not drop_zero]
        if its:
            w = np.array([k + 1.0 for k, _ in its])
            out[i] = float((w * np.array([a for _, a in its])).sum() / w.sum())
    return out


def test_hgpo_defaults_follow_the_released_recipe():
    last = {j: max(s for s, k in zip(STEP, TRAJ, strict=True) if k == j) for j in set(TRAJ)}
    r = np.array([-ETA * INV[i] + (R[i] if STEP[i] == last[TRAJ[i]] else 0.0) for i in range(9)])
    ret = discounted_returns(TRAJ, np.array(STEP), r, 0.95)
    got = hgpo_advantage(["x"] * 9, TRAJ, np.array(STEP), OBS, ret, history=2, mode="mean_std_norm")
    np.testing.assert_allclose(got, _recipe_hgpo(TRAJ, STEP, OBS, ret), atol=1e-6)
    np.testing.assert_allclose(
        got[:4], [0.5467, 1.1657, 0.0, -1.4029], atol=1e-4
    )  # the review's recipe values
    keep = hgpo_advantage(
        ["x"] * 9,
        TRAJ,
        np.array(STEP),
        OBS,
        ret,
        history=2,
        mode="mean_std_norm",
        ddof=1,
        drop_zero_items=False,
    )
    np.testing.assert_allclose(keep, _recipe_hgpo(TRAJ, STEP, OBS, ret, drop_zero=False, ddof=1), atol=1e-6)


def test_drgrpo_normalizer_is_a_constant_not_the_padded_width():
    w = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]])
    padded = torch.cat([torch.zeros(2, 6), w], dim=1)  # the same responses after 6 more masked prompt tokens
    a = token_coefficients(w, "seq-mean-token-sum-norm", norm_tokens=16)
    b = token_coefficients(padded, "seq-mean-token-sum-norm", norm_tokens=16)
    assert torch.equal(a[:, :], b[:, 6:]) and float(a.sum()) == pytest.approx(5 / (2 * 16))
    # Without the constant, the value depends on the padding (the review's 1.25 vs 0.50 example).
    loss = torch.ones_like(w) * 2
    assert float(aggregate(loss, w, "seq-mean-token-sum-norm")) == pytest.approx(10 / 8)
    assert float(aggregate(torch.ones_like(padded) * 2, padded, "seq-mean-token-sum-norm")) == pytest.approx(
        10 / 20
    )


def test_rloo_reinforce_form_is_unclipped_and_sequence_summed():
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = torch.tensor([[-1.5, -2.0, -0.1]])  # ratios e^0.5, 1, e^-0.4: PPO would clip the first and last
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    loss, stats = policy_loss(logp, old, adv, clip=False)
    np.testing.assert_allclose(loss.detach().numpy(), (-adv * torch.exp(logp - old)).detach().numpy())
    assert not stats["clipped"].any()
    ppo, _ = policy_loss(logp, old, adv)
    assert not torch.allclose(ppo, loss)
    spec = get_estimator("rloo")
    assert spec.loss_agg_mode == "seq-mean-token-sum" and "REINFORCE" in spec.agg_source
    assert get_estimator("grpo").loss_agg_mode == "rollout-mean-token-mean"  # DeepSeekMath: per-sequence mean


def _rows(sessions: list[int]) -> list[Row]:
    rows = []
    for ri, n in enumerate(sessions):
        for si in range(n):
            rows.append(
                Row(list(range(11)), [False] + [True] * 10, [0.0] * 11, [0.0] * 11, [-1] * 11, ri, si)
            )
    return rows


@pytest.mark.parametrize("mini_batches", [1, 2, 4])
def test_rollout_mean_weights_every_rollout_equally_for_any_number_of_mini_batches(mini_batches):
    # The review's case: 4 rollouts with 5, 1, 3 and 1 sessions of 10 trainable tokens each.
    rows = _rows([5, 1, 3, 1])
    per_rollout = np.zeros(4)
    for idx in rollout_mini_batches(rows, mini_batches, torch.Generator().manual_seed(0)):
        mask = torch.tensor([rows[i].trainable[1:] for i in idx], dtype=torch.float32)
        coef = token_coefficients(
            mask, "rollout-mean-token-mean", rollout_ids=torch.tensor([rows[i].rollout_index for i in idx])
        )
        for b, i in enumerate(idx):
            per_rollout[rows[i].rollout_index] += float(coef[b].sum())
    # Every mini-batch holds whole rollouts, so each rollout's weight is 1 / (rollouts in its mini-batch).
    assert np.allclose(per_rollout, per_rollout[0]) and per_rollout.sum() == pytest.approx(mini_batches)


def test_text_observation_keys_match_identical_text_with_different_hidden_state():
    def turn(obs, key):
        return Turn(prompt_ids=[1], response_ids=[2], logprobs=[0.0], observation=obs, obs_key=key)

    # Two rollouts reach the same room text with different hidden progress (a cabinet opened elsewhere).
    a = Rollout(
        "a", "t", "g", [Segment(turns=[turn("You go to the kitchen.\nK", "k|cab=closed"), turn(None, None)])]
    )
    b = Rollout(
        "b", "t", "g", [Segment(turns=[turn("You go to the kitchen.\nK", "k|cab=open"), turn(None, None)])]
    )
    for r in (a, b):
        r.env = {"initial_obs_text": "Your task.\nHall", "initial_obs_key": "hall"}
    text = [prompt_observations(r, mode="text") for r in (a, b)]
    state = [prompt_observations(r, mode="prompt") for r in (a, b)]
    assert text[0] == text[1] == ["text:Your task.\nHall", "text:You go to the kitchen.\nK"]
    assert state[0][1] != state[1][1]
    assert get_estimator("ccpo").params_cls().obs_key == "text"
    assert get_estimator("gigpo").params_cls().obs_key == "text"
