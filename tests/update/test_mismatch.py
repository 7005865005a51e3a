"""Rollout/train mismatch correction (TIS/MIS): the weights by hand, and their effect on a PPO update."""

from __future__ import annotations

import math

import pytest
import torch

from horizonrl.config import ConfigError, load_config
from horizonrl.losses import rollout_correction
from horizonrl.models import load_model_and_tokenizer
from horizonrl.train.update.batching import collate
from horizonrl.train.update.ppo import UpdateSettings, ppo_update, score_rows
from horizonrl.trajectory import Row

LOG = math.log


def _batch():
    # Row 0: ratios pi_old/pi_rollout = 2, 0.5, 3 on its trainable tokens; row 1: 1.2 and a padded slot.
    old = torch.tensor([[LOG(0.5), LOG(0.2), LOG(0.9)], [LOG(0.6), 0.0, 0.0]])
    roll = torch.tensor([[LOG(0.25), LOG(0.4), LOG(0.3)], [LOG(0.5), 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    return old, roll, mask


def test_token_level_truncation_and_masking_by_hand():
    old, roll, mask = _batch()
    w, keep, rho = rollout_correction(old, roll, mask, cap=2.5)
    torch.testing.assert_close(rho, torch.tensor([[2.0, 0.5, 3.0], [1.2, 0.0, 0.0]]))
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 2.5], [1.2, 0.0, 0.0]]))  # min(rho, C)
    assert torch.equal(keep, mask)
    w, keep, _ = rollout_correction(old, roll, mask, cap=2.5, mode="mask")
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 0.0], [1.2, 0.0, 0.0]]))  # rho > C dropped
    assert keep.tolist() == [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]


def test_sequence_level_uses_the_rows_product():
    old, roll, mask = _batch()
    w, keep, rho = rollout_correction(old, roll, mask, cap=2.5, level="sequence")
    torch.testing.assert_close(rho, torch.tensor([[3.0, 3.0, 3.0], [1.2, 0.0, 0.0]]))  # 2 * 0.5 * 3
    torch.testing.assert_close(w, torch.tensor([[2.5, 2.5, 2.5], [1.2, 0.0, 0.0]]))
    w, keep, _ = rollout_correction(old, roll, mask, cap=2.5, level="sequence", mode="mask")
    assert keep.tolist() == [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]  # the whole row is dropped
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0, 0.0], [1.2, 0.0, 0.0]]))


def test_bad_settings_name_the_field():
    old, roll, mask = _batch()
    with pytest.raises(ValueError, match="tis_cap"):
        rollout_correction(old, roll, mask, cap=0.5)
    with pytest.raises(ValueError, match="tis_level"):
        rollout_correction(old, roll, mask, cap=2.0, level="turn")
    with pytest.raises(ValueError, match="tis_cap"):
        UpdateSettings(loss_agg_mode="token-mean", tis_cap=2.0)  # needs old_logprobs='recompute'
    with pytest.raises(ConfigError, match=r"algo.tis_cap=2.0: needs algo.old_logprobs=recompute"):
        load_config(None, ["algo.tis_cap=2.0"])
    with pytest.raises(ConfigError, match=r"algo\.tis_mode"):
        load_config(None, ["algo.tis_mode=clip"])
    cfg = load_config(None, ["algo.tis_cap=2.0", "algo.old_logprobs=recompute", "algo.tis_level=sequence"])
    assert cfg.algo.tis_cap == 2.0


def test_collate_keeps_rollout_and_recomputed_logprobs_apart():
    row = Row([1, 2, 3, 4], [False, True, False, True], [0.0, -0.5, 0.0, -0.7], [0.0] * 4, [0] * 4, 0, 0)
    plain = collate([row])
    assert torch.equal(plain.old_logprobs, plain.rollout_logprobs)
    b = collate([row], old_logprobs=[torch.tensor([-0.4, -9.0, -0.6])])
    torch.testing.assert_close(b.rollout_logprobs, torch.tensor([[-0.5, 0.0, -0.7]]))
    torch.testing.assert_close(b.old_logprobs, torch.tensor([[-0.4, 0.0, -0.6]]))  # masked positions 0


# ------------------------------------------------------------------ through the PPO update


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    model, _ = load_model_and_tokenizer(tiny_model_dir)
    return model


def _rows(model, shifts):
    """Rows whose rollout log-probs are the model's own minus ``shifts`` (so rho = exp(shift))."""
    g = torch.Generator().manual_seed(0)
    rows = []
    for i, row_shifts in enumerate(shifts):
        n = 4 + len(row_shifts)
        ids = torch.randint(5, 300, (n,), generator=g).tolist()
        trainable = [False] * 4 + [True] * len(row_shifts)
        adv = [0.0] * 4 + [1.0 if i % 2 == 0 else -1.0] * len(row_shifts)
        rows.append(Row(ids, trainable, [0.0] * n, adv, [0] * 4 + [1] * len(row_shifts), i, 0))
    scored = score_rows(model, rows, device="cpu", pad_id=0, micro_batch_tokens=4096)
    for r, lp, row_shifts in zip(rows, scored, shifts, strict=True):
        own = [0.0, *lp.tolist()]
        r.old_logprobs = [0.0] * 4 + [own[4 + j] - s for j, s in enumerate(row_shifts)]
    return rows


def _step(model, rows, **kw):
    m = type(model)(model.config)
    m.load_state_dict(model.state_dict())
    s = UpdateSettings(loss_agg_mode="token-mean", grad_clip=0.0, old_logprobs="recompute", **kw)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    metrics = ppo_update(m, opt, None, rows, s, generator=torch.Generator().manual_seed(0), device="cpu")
    return m, metrics


def _same_weights(a, b):
    for (k, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=k)


def test_tis_metrics_and_weights_in_the_update(tiny):
    shifts = [[0.0, LOG(3.0), LOG(0.5)], [LOG(1.5), 0.0]]
    rows = _rows(tiny, shifts)
    _, m = _step(tiny, rows, tis_cap=2.0)
    rho = [1.0, 3.0, 0.5, 1.5, 1.0]
    assert m["train/tis_ratio_mean"] == pytest.approx(sum(rho) / 5, rel=1e-5)
    assert m["train/tis_ratio_max"] == pytest.approx(3.0, rel=1e-5)
    assert m["train/tis_clipped_frac"] == pytest.approx(1 / 5)
    assert m["train/tis_weight_mean"] == pytest.approx(sum(min(r, 2.0) for r in rho) / 5, rel=1e-5)
    # The rollout/train gap is measured before the update: exp(mean(log pi_old - log pi_rollout)).
    assert m["train/ratio_geomean"] == pytest.approx(math.exp(sum(map(math.log, rho)) / 5), rel=1e-5)


def test_uniform_weight_scales_the_gradient(tiny):
    """TIS with rho = 1.5 < C on every token is the plain update with advantages x 1.5 (SGD)."""
    rows = _rows(tiny, [[LOG(1.5)] * 3, [LOG(1.5)] * 2])
    with_tis, _ = _step(tiny, rows, tis_cap=2.0)
    scaled = [Row(**{**r.__dict__, "advantages": [1.5 * a for a in r.advantages]}) for r in rows]
    plain, _ = _step(tiny, scaled)
    _same_weights(with_tis, plain)


def test_masked_tokens_leave_the_loss_and_its_normaliser(tiny):
    """MIS dropping the tokens with rho > C equals the plain update with those tokens untrainable."""
    rows = _rows(tiny, [[0.0, LOG(5.0), 0.0], [LOG(4.0), 0.0]])
    mis, m = _step(tiny, rows, tis_cap=2.0, tis_mode="mask")
    assert m["train/tis_clipped_frac"] == pytest.approx(2 / 5)
    dropped = [Row(**r.__dict__) for r in rows]
    dropped[0].trainable = [*dropped[0].trainable[:5], False, dropped[0].trainable[6]]
    dropped[1].trainable = [*dropped[1].trainable[:4], False, dropped[1].trainable[5]]
    plain, _ = _step(tiny, dropped)
    _same_weights(mis, plain)
