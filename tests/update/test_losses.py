"""The policy losses, KL penalties and token aggregation of horizonrl.losses equal hand-computed values
from docs/spec/baselines.md, with the gradients they should have."""

from __future__ import annotations

import math

import pytest
import torch

from horizonrl.losses import AGG_MODES, aggregate, kl_penalty, list_kl_kinds, policy_loss, token_coefficients

T = torch.tensor


def _pl(ratio: float, adv: float, **kw):
    logp = T([math.log(ratio)], dtype=torch.float64)
    loss, stats = policy_loss(logp, T([0.0], dtype=torch.float64), T([adv], dtype=torch.float64), **kw)
    return loss.item(), stats


# ----------------------------------------------------------------- policy loss


@pytest.mark.parametrize(
    ("ratio", "adv", "expected", "clipped"),
    [
        (1.1, 2.0, -2.2, False),  # A>0 inside the band: -A r
        (1.5, 2.0, -2.4, True),  # A>0 above 1+eps: -A (1.2)
        (0.5, 2.0, -1.0, False),  # A>0 below 1-eps: max(-1.0, -1.6) = -1.0 (unclipped)
        (0.5, -2.0, 1.6, True),  # A<0 below 1-eps: max(1.0, 1.6) = 1.6
        (1.5, -2.0, 3.0, False),  # A<0 above 1+eps: max(3.0, 2.4) = 3.0 (unclipped)
        (0.9, -2.0, 1.8, False),  # A<0 inside the band
    ],
)
def test_ppo_clip_hand_cases(ratio, adv, expected, clipped):
    loss, stats = _pl(ratio, adv)
    assert loss == pytest.approx(expected, rel=1e-12)
    assert bool(stats["clipped"].item()) is clipped
    assert stats["ratio"].item() == pytest.approx(ratio, rel=1e-12)


def test_asymmetric_clip():
    # clip_high=0.28: r=1.5, A=1 -> -1.28 ; r=1.25 inside -> -1.25 ; low side r=0.7, A=-1 -> 0.8
    assert _pl(1.5, 1.0, clip_high=0.28)[0] == pytest.approx(-1.28)
    assert _pl(1.25, 1.0, clip_high=0.28)[0] == pytest.approx(-1.25)
    assert _pl(0.7, -1.0, clip_high=0.28)[0] == pytest.approx(0.8)
    assert _pl(0.7, -1.0, clip_low=0.1, clip_high=0.28)[0] == pytest.approx(0.9)


def test_dual_clip():
    # A=-1, r=5: PPO gives max(5, 1.2) = 5 ; dual clip c=3 -> min(5, 3) = 3
    loss, stats = _pl(5.0, -1.0, dual_clip=3.0)
    assert loss == pytest.approx(3.0) and bool(stats["dual_clipped"].item())
    assert _pl(5.0, -1.0)[0] == pytest.approx(5.0)
    # below the bound: unchanged ; A>0 untouched
    assert _pl(2.0, -1.0, dual_clip=3.0)[0] == pytest.approx(2.0)
    assert _pl(5.0, 1.0, dual_clip=3.0)[0] == pytest.approx(-1.2)
    for bad in (1.0, 0.5):
        with pytest.raises(ValueError, match="dual_clip"):
            _pl(1.0, 1.0, dual_clip=bad)


def test_dual_clip_gradient_is_zero_when_active():
    logp = T([math.log(5.0)], requires_grad=True)
    loss, _ = policy_loss(logp, T([0.0]), T([-1.0]), dual_clip=3.0)
    loss.sum().backward()
    assert logp.grad.item() == 0.0


def test_ratio_clamped_log_ratio_and_logprob_clip():
    loss, stats = policy_loss(T([100.0]), T([0.0]), T([-1.0]))
    assert stats["ratio"].item() == pytest.approx(math.exp(20.0), rel=1e-6)
    assert torch.isfinite(loss).all()
    # logprob_clip=10: logp -30 -> -10, old -12 -> -10 => ratio 1
    _, stats = policy_loss(T([-30.0]), T([-12.0]), T([1.0]), logprob_clip=10.0)
    assert stats["ratio"].item() == pytest.approx(1.0)
    _, stats = policy_loss(T([-11.0]), T([-9.0]), T([1.0]), logprob_clip=10.0)
    assert stats["ratio"].item() == pytest.approx(math.exp(-1.0))
    with pytest.raises(ValueError, match="logprob_clip"):
        policy_loss(T([0.0]), T([0.0]), T([1.0]), logprob_clip=0.0)


def test_turn_level_is_geometric_mean():
    ratios = [[1.2, 0.8, 1.5, 1.0, 0.9], [2.0, 0.5, 1.1, 1.0, 1.0]]
    turn_ids = T([[0, 0, 1, -1, 1], [0, 0, 1, 1, -1]])  # ids repeat across rows (rollout-local)
    logp = torch.log(T(ratios, dtype=torch.float64))
    adv = torch.ones_like(logp)
    _, stats = policy_loss(logp, torch.zeros_like(logp), adv, turn_ids=turn_ids)
    g0 = math.sqrt(1.2 * 0.8)
    g1 = math.sqrt(1.5 * 0.9)
    expected = [[g0, g0, g1, 1.0, g1], [1.0, 1.0, (1.1 * 1.0) ** 0.5, (1.1 * 1.0) ** 0.5, 1.0]]
    torch.testing.assert_close(stats["ratio"], T(expected, dtype=torch.float64))


def test_turn_level_is_loss_and_gradient():
    logp = torch.log(T([[1.1, 1.0, 0.95]], dtype=torch.float64)).requires_grad_()
    loss, _ = policy_loss(logp, torch.zeros_like(logp), T([[1.0, 1.0, 1.0]]), turn_ids=T([[3, 3, 3]]))
    g = (1.1 * 0.95) ** (1 / 3)
    torch.testing.assert_close(loss.detach(), torch.full((1, 3), -g, dtype=torch.float64))
    loss.sum().backward()
    # d/dlogp_j of sum_k -exp(mean logp) = -3 * g / 3
    torch.testing.assert_close(logp.grad, torch.full((1, 3), -g, dtype=torch.float64))


def test_turn_level_is_all_masked_is_token_level():
    logp = torch.log(T([[1.1, 0.9]]))
    _, s1 = policy_loss(logp, torch.zeros_like(logp), T([[1.0, 1.0]]), turn_ids=T([[-1, -1]]))
    _, s2 = policy_loss(logp, torch.zeros_like(logp), T([[1.0, 1.0]]))
    torch.testing.assert_close(s1["ratio"], s2["ratio"])
    with pytest.raises(ValueError, match="turn_ids"):
        policy_loss(logp, torch.zeros_like(logp), T([[1.0, 1.0]]), turn_ids=T([0, 0]))


def test_policy_loss_gradient_matches_reinforce_at_ratio_one():
    logp = torch.zeros(2, 3, requires_grad=True)
    adv = T([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0]])
    loss, _ = policy_loss(logp, logp.detach().clone(), adv)
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, -adv)


# ----------------------------------------------------------------- KL


def test_kl_hand_values():
    logp, ref = T([-1.0, -2.0]), T([-1.5, -1.0])
    # k = ref - logp = [-0.5, 1.0]
    k3 = [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1]
    torch.testing.assert_close(kl_penalty(logp, ref, "low_var_kl"), T(k3))
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), T([0.5, -1.0]))
    torch.testing.assert_close(kl_penalty(logp, ref, "k2"), T([0.125, 0.5]))
    assert kl_penalty(T([0.0]), T([0.0]), "low_var_kl").item() == 0.0


def test_kl_clamps():
    # k = 30 -> clamp 20 -> exp(20)-21 -> clamp to 10
    assert kl_penalty(T([-30.0]), T([0.0]), "low_var_kl").item() == pytest.approx(10.0)
    # k = -30 -> clamp -20 -> exp(-20)+19 -> clamp to 10
    assert kl_penalty(T([0.0]), T([-30.0]), "low_var_kl").item() == pytest.approx(10.0)


def test_kl_unknown_kind_and_grad():
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(T([0.0]), T([0.0]), "k4")
    assert set(list_kl_kinds()) >= {"low_var_kl", "k1", "k2"}
    logp = T([-1.0], requires_grad=True)
    ref = T([-0.5], requires_grad=True)
    kl_penalty(logp, ref, "k2").sum().backward()
    assert logp.grad.item() == pytest.approx(-0.5) and ref.grad is None


# ----------------------------------------------------------------- aggregation

# Three rows, T=4; rows 0 and 1 belong to rollout 7, row 2 to rollout 9.
LOSS = T([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 0.0, 0.0], [10.0, 20.0, 30.0, 40.0]])
W = T([[1.0, 1.0, 0.0, 0.0], [1.0, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 2.0]])
RIDS = T([7, 7, 9])
# weighted row sums: 3, 8, 80 ; row weights: 2, 1.5, 2
HAND = {
    "token-mean": (3 + 8 + 80) / 5.5,
    "seq-mean-token-mean": (3 / 2 + 8 / 1.5 + 80 / 2) / 3,
    "seq-mean-token-sum": (3 + 8 + 80) / 3,
    "seq-mean-token-sum-norm": (3 + 8 + 80) / (3 * 4),
    "rollout-mean-token-mean": ((3 + 8) / 3.5 + 80 / 2) / 2,
}


@pytest.mark.parametrize("mode", AGG_MODES)
def test_aggregate_hand_values(mode):
    out = aggregate(LOSS, W, mode, rollout_ids=RIDS)
    assert out.dim() == 0
    assert out.item() == pytest.approx(HAND[mode], rel=1e-6)
    coef = token_coefficients(W, mode, rollout_ids=RIDS)
    assert (coef * LOSS).sum().item() == pytest.approx(HAND[mode], rel=1e-6)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_empty_rows_do_not_count(mode):
    loss = torch.cat([LOSS, T([[99.0, 99.0, float("nan"), 99.0]])])
    w = torch.cat([W, torch.zeros(1, 4)])
    out = aggregate(loss, w, mode, rollout_ids=T([7, 7, 9, 11]))
    assert out.item() == pytest.approx(HAND[mode], rel=1e-6)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_all_zero_weights_give_zero(mode):
    out = aggregate(LOSS, torch.zeros_like(W), mode, rollout_ids=RIDS)
    assert out.item() == 0.0


def test_aggregate_errors():
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(LOSS, W, "mean")
    with pytest.raises(ValueError, match="rollout_ids"):
        aggregate(LOSS, W, "rollout-mean-token-mean")
    with pytest.raises(ValueError, match="non-negative"):
        aggregate(LOSS, -W, "token-mean")
    with pytest.raises(ValueError, match="shape"):
        aggregate(LOSS, W[:, :3], "token-mean")
    with pytest.raises(ValueError, match="coefficients"):
        aggregate(LOSS, W, "token-mean", coefficients=W[:2])


def test_aggregate_one_dimensional_and_bool_weights():
    out = aggregate(T([1.0, 2.0, 3.0]), T([True, False, True]), "seq-mean-token-mean")
    assert out.item() == pytest.approx(2.0)


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_micro_batch_invariance(mode, seed):
    gen = torch.Generator().manual_seed(seed)
    rows, t = 13, 9
    loss = torch.randn(rows, t, generator=gen, dtype=torch.float64)
    lengths = torch.randint(0, t + 1, (rows,), generator=gen)
    w = (torch.arange(t) < lengths.unsqueeze(1)).double() * torch.rand(rows, t, generator=gen).add(0.1)
    rollout_ids = torch.randint(0, 4, (rows,), generator=gen) * 10  # rollouts span several rows
    full = aggregate(loss, w, mode, rollout_ids=rollout_ids)
    coef = token_coefficients(w, mode, rollout_ids=rollout_ids)
    perm = torch.randperm(rows, generator=gen)
    cuts = sorted(torch.randperm(rows - 1, generator=gen)[:3].add(1).tolist())
    total = torch.zeros((), dtype=torch.float64)
    for idx in torch.tensor_split(perm, cuts):
        total = total + aggregate(
            loss[idx], w[idx], mode, rollout_ids=rollout_ids[idx], coefficients=coef[idx]
        )
    torch.testing.assert_close(total, full, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_gradients_flow_through_aggregate(mode):
    loss = LOSS.clone().requires_grad_()
    aggregate(loss, W, mode, rollout_ids=RIDS).backward()
    torch.testing.assert_close(loss.grad, token_coefficients(W, mode, rollout_ids=RIDS))
    assert loss.grad[0, 0] > 0 and loss.grad[0, 2] == 0


def test_end_to_end_policy_loss_gradient():
    logp = torch.zeros(2, 3, requires_grad=True)
    loss, stats = policy_loss(logp, torch.zeros(2, 3), T([[1.0, 1.0, 0.0], [-1.0, 0.0, 0.0]]))
    w = T([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    out = aggregate(loss, w, "token-mean")
    out.backward()
    torch.testing.assert_close(logp.grad, T([[-1 / 3, -1 / 3, 0.0], [1 / 3, 0.0, 0.0]]))
    assert aggregate(stats["clipped"].float(), w, "token-mean").item() == 0.0
