"""Group-relative advantages of horizonrl.credit (GRPO, Dr.GRPO, RLOO, broadcasting to tokens) equal values
derived by hand from docs/spec/baselines.md; the estimator registry checks names, parameters and outputs."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from horizonrl import credit
from horizonrl.credit import (
    EstimatorSpec,
    broadcast_to_tokens,
    get_estimator,
    group_advantage,
    list_estimators,
    register_estimator,
    rloo_advantage,
)
from horizonrl.credit import registry as registry_mod
from horizonrl.trajectory import Group, Rollout, Segment, Turn, build_rows
from horizonrl.vocab import AggMode


def _turn(n: int, start: int = 0) -> Turn:
    return Turn(prompt_ids=[1, 2], response_ids=list(range(start, start + n)), logprobs=[-0.5] * n)


def _rollout(uid: str, reward: float, layout: list[list[int]], gid: str = "g") -> Rollout:
    """``layout[s]`` = response lengths of the turns of segment ``s``."""
    segs = [
        Segment(kind="normal" if s == 0 else "compaction", turns=[_turn(n) for n in lens])
        for s, lens in enumerate(layout)
    ]
    return Rollout(uid=uid, task_id="t", group_id=gid, segments=segs, reward=reward)


def _groups() -> list[Group]:
    g1 = Group(
        "g1",
        "t1",
        [
            _rollout("a", 1.0, [[3, 2], [4]], "g1"),
            _rollout("b", 0.0, [[1]], "g1"),
            _rollout("c", 0.0, [[2], [1, 1], [5]], "g1"),
            _rollout("d", 1.0, [[2, 2]], "g1"),
        ],
    )
    g2 = Group("g2", "t2", [_rollout("e", 0.5, [[3], [2]], "g2")])  # singleton group
    return [g1, g2]


# ----------------------------------------------------------------- group formulas


def test_grpo_by_hand():
    # R = [1,0,0,1]: mean 0.5, deviations ±0.5, sample var = 4*0.25/3 = 1/3
    std = math.sqrt(1 / 3)
    expected = np.array([0.5, -0.5, -0.5, 0.5]) / (std + 1e-6)
    np.testing.assert_allclose(group_advantage([1, 0, 0, 1]), expected, rtol=1e-12)
    assert abs(expected[0] - 0.8660239) < 1e-6


def test_grpo_uneven_and_eps():
    # R = [1,0,0]: mean 1/3, var = ((2/3)^2 + 2 (1/3)^2)/2 = 1/3
    a = group_advantage([1, 0, 0], eps=0.5)
    s = math.sqrt(1 / 3) + 0.5
    np.testing.assert_allclose(a, [(2 / 3) / s, (-1 / 3) / s, (-1 / 3) / s], rtol=1e-12)


def test_drgrpo_is_centered_only():
    np.testing.assert_allclose(
        group_advantage([1, 0, 0, 0], normalize_std=False), [0.75, -0.25, -0.25, -0.25]
    )


@pytest.mark.parametrize("rewards", [[1.0], [0.0, 0.0, 0.0], [0.1, 0.1, 0.1], [1, 1]])
@pytest.mark.parametrize("normalize_std", [True, False])
def test_grpo_degenerate_groups_are_zero(rewards, normalize_std):
    a = group_advantage(rewards, normalize_std=normalize_std)
    assert a.shape == (len(rewards),)
    assert np.all(a == 0.0)


def test_group_advantage_input_checks():
    assert group_advantage([]).shape == (0,)
    with pytest.raises(ValueError, match="1-D"):
        group_advantage([[1, 0]])
    with pytest.raises(ValueError, match="finite"):
        group_advantage([1.0, float("nan")])


def test_rloo_by_hand_and_identity():
    # R = [1,0,0,1]: A_0 = 1 - (0+0+1)/3 = 2/3 ; A_1 = 0 - 2/3
    np.testing.assert_allclose(rloo_advantage([1, 0, 0, 1]), [2 / 3, -2 / 3, -2 / 3, 2 / 3])
    r = np.random.default_rng(0).normal(size=7)
    loo = np.array([r[i] - np.delete(r, i).mean() for i in range(7)])
    np.testing.assert_allclose(rloo_advantage(r), loo, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(rloo_advantage(r), 7 / 6 * (r - r.mean()), rtol=1e-12, atol=1e-12)


def test_rloo_degenerate():
    assert np.all(rloo_advantage([0.7]) == 0.0)
    assert np.all(rloo_advantage([0.3, 0.3, 0.3]) == 0.0)


# ----------------------------------------------------------------- broadcasting


def test_broadcast_to_tokens_shapes_and_values():
    groups = _groups()
    adv = broadcast_to_tokens(groups, [1.0, 2.0, 3.0, 4.0, 5.0])
    rollouts = [r for g in groups for r in g.rollouts]
    assert len(adv) == 5
    for i, (r, a) in enumerate(zip(rollouts, adv, strict=True)):
        assert len(a) == len(r.segments)
        for seg, a_s in zip(r.segments, a, strict=True):
            assert [x.shape for x in a_s] == [(t.num_response_tokens,) for t in seg.turns]
            assert all(np.all(x == i + 1.0) for x in a_s)
    # accepts a flat list of rollouts as well
    adv2 = broadcast_to_tokens(rollouts, np.arange(5.0))
    assert adv2[2][1][1].tolist() == [2.0]


def test_broadcast_to_tokens_per_segment_values():
    r = _rollout("x", 1.0, [[2], [1, 3]])
    adv = broadcast_to_tokens([r], [[0.5, -1.0]])
    assert adv[0][0][0].tolist() == [0.5, 0.5]
    assert adv[0][1][1].tolist() == [-1.0, -1.0, -1.0]
    with pytest.raises(ValueError, match="one value per segment"):
        broadcast_to_tokens([r], [[1.0, 2.0, 3.0]])
    with pytest.raises(ValueError, match="values for"):
        broadcast_to_tokens([r], [1.0, 2.0])
    with pytest.raises(TypeError):
        broadcast_to_tokens(["nope"], [1.0])


def test_broadcast_output_feeds_build_rows():
    groups = _groups()
    rollouts = [r for g in groups for r in g.rollouts]
    rows = build_rows(rollouts, get_estimator("grpo")(groups))
    assert sum(row.num_trainable for row in rows) == sum(r.num_response_tokens for r in rollouts)


# ----------------------------------------------------------------- estimators


def test_builtin_estimators_registered():
    assert {"grpo", "drgrpo", "rloo", "broadcast"} <= set(list_estimators())
    assert get_estimator("grpo").loss_agg_mode == "rollout-mean-token-mean"
    assert get_estimator("drgrpo").loss_agg_mode == "seq-mean-token-sum-norm"
    assert get_estimator("broadcast").loss_agg_mode == "rollout-mean-token-mean"
    spec = get_estimator("rloo")
    assert isinstance(spec, EstimatorSpec) and spec.description
    with pytest.raises(AttributeError):
        spec.name = "x"  # frozen


@pytest.mark.parametrize(
    ("name", "params", "expected_g1"),
    [
        ("grpo", {}, group_advantage([1, 0, 0, 1])),
        ("grpo", {"normalize_std": False}, [0.5, -0.5, -0.5, 0.5]),
        ("broadcast", {"eps": 0.0}, np.array([0.5, -0.5, -0.5, 0.5]) / math.sqrt(1 / 3)),
        ("drgrpo", {}, [0.5, -0.5, -0.5, 0.5]),
        ("rloo", {}, [2 / 3, -2 / 3, -2 / 3, 2 / 3]),
    ],
)
def test_estimators_broadcast_every_token(name, params, expected_g1):
    groups = _groups()
    adv = get_estimator(name)(groups, **params)
    rollouts = [r for g in groups for r in g.rollouts]
    expected = [*np.asarray(expected_g1, dtype=float), 0.0]  # singleton group -> 0
    for r, a, e in zip(rollouts, adv, expected, strict=True):
        assert len(a) == len(r.segments)
        for seg, a_s in zip(r.segments, a, strict=True):
            for t, a_t in zip(seg.turns, a_s, strict=True):
                assert a_t.shape == (t.num_response_tokens,)
                np.testing.assert_allclose(a_t, e, rtol=1e-12)


def test_estimator_groups_are_independent():
    g_a = Group("a", "t", [_rollout("1", 1.0, [[1]]), _rollout("2", 0.0, [[1]])])
    g_b = Group("b", "t", [_rollout("3", 5.0, [[1]]), _rollout("4", 3.0, [[1]])])
    adv = get_estimator("drgrpo")([g_a, g_b])
    assert [a[0][0][0] for a in adv] == [0.5, -0.5, 1.0, -1.0]


def test_unknown_estimator_lists_known_names():
    with pytest.raises(KeyError) as ei:
        get_estimator("nope")
    assert "nope" in str(ei.value) and "grpo" in str(ei.value) and "rloo" in str(ei.value)
    with pytest.raises(
        ValueError, match=r"unknown estimator 'nope'; known: \[.*'grpo'.*\]; register one with"
    ):
        get_estimator("nope")


def test_unknown_param_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match="normalise_std"):
        get_estimator("grpo")(_groups(), normalise_std=False)
    with pytest.raises(TypeError, match="eps"):
        get_estimator("rloo")(_groups(), eps=1.0)


def test_estimator_rejects_non_groups():
    with pytest.raises(TypeError, match="Group"):
        get_estimator("grpo")([r for g in _groups() for r in g.rollouts])


@pytest.fixture
def scratch_registry():
    with registry_mod.ESTIMATORS.scratch():
        yield


def test_register_custom_estimator(scratch_registry):
    @register_estimator("unit_const", loss_agg_mode="seq-mean-token-mean")
    def unit_const(groups, *, value: float = 1.0):
        """Constant advantage."""
        return broadcast_to_tokens(groups, [value] * sum(len(g.rollouts) for g in groups))

    spec = get_estimator("unit_const")
    assert spec.fn is unit_const and spec.description == "Constant advantage."
    assert spec.params == ("value",)
    assert "unit_const" in list_estimators()
    adv = spec(_groups(), value=2.0)
    assert adv[0][1][0].tolist() == [2.0] * 4
    with pytest.raises(ValueError, match="already registered"):
        register_estimator("unit_const")(unit_const)
    register_estimator("unit_const", replace=True, description="d")(unit_const)
    assert get_estimator("unit_const").description == "d"


def test_register_checks(scratch_registry):
    with pytest.raises(ValueError, match="token-mean"):
        register_estimator("bad", loss_agg_mode="mean")
    with pytest.raises(TypeError, match="first positional"):
        register_estimator("bad2")(lambda *, x=1: [])


def test_estimator_output_is_checked(scratch_registry):
    @register_estimator("unit_broken")
    def broken(groups):
        return [[[np.zeros(1)]] for g in groups for _ in g.rollouts]

    with pytest.raises(ValueError, match="rollout 0"):
        get_estimator("unit_broken")(_groups())


def test_loss_aggregation_accepts_exactly_the_agg_modes(scratch_registry):
    torch = pytest.importorskip("torch")
    from horizonrl.losses import AGG_MODES, token_coefficients

    assert list(AGG_MODES) == list(AggMode) == list(credit.LOSS_AGG_MODES)
    w, ids = torch.ones(2, 3), torch.tensor([0, 1])
    for mode in AggMode:  # the plain strings of configs and JSON, in losses and in credit
        assert token_coefficients(w, mode.value, rollout_ids=ids).shape == w.shape
        register_estimator(f"unit_{mode.value}", loss_agg_mode=mode.value)(lambda groups: [])
        assert get_estimator(f"unit_{mode.value}").loss_agg_mode == mode
    for bad in ("mean", "token_mean", "TOKEN-MEAN"):
        with pytest.raises(ValueError, match="token-mean"):
            token_coefficients(w, bad, rollout_ids=ids)
        with pytest.raises(ValueError, match="token-mean"):
            register_estimator("unit_bad", loss_agg_mode=bad)


def test_credit_does_not_import_torch():
    code = "import sys, horizonrl.credit; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _field_docs(cls) -> dict[str, str]:
    """Field name -> the string literal under it in ``cls``'s source (the per-field docstring)."""
    import ast
    import inspect
    import itertools
    import textwrap

    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    out = {}
    for node, nxt in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
        ):
            out[node.target.id] = nxt.value.value
    return out


def test_builtin_estimator_params_are_documented_frozen_dataclasses():
    import dataclasses
    import inspect

    builtin = [n for n in list_estimators() if get_estimator(n).fn.__module__.startswith("horizonrl.")]
    declared = {n: get_estimator(n).params_cls for n in builtin}
    assert {n for n, c in declared.items() if c is None} == {"drgrpo", "rloo"}  # they take no parameters
    for name, cls in declared.items():
        if cls is None:
            assert get_estimator(name).params == ()
            continue
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, name
        fields = [f.name for f in dataclasses.fields(cls)]
        docs = _field_docs(cls)
        assert [f for f in fields if not docs.get(f)] == [], f"{name}: fields without a docstring"
        spec = get_estimator(name)
        assert set(spec.settable()) == set(fields), name
        named = [p for p in inspect.signature(spec.fn).parameters][1:-1]  # groups, needs..., **params
        assert tuple(named) == spec.needs, name
        cls()  # every field has a default


def test_estimator_params_keep_their_defaults():
    """The dataclass defaults are the keyword defaults the estimators had (same keys, same values)."""
    expect = {
        "grpo": {"normalize_std": True, "eps": 1e-6},
        "ccpo": dict(gamma=0.95, horizon=2, kernel_scale=0.15, eta=0.1, final_standardize=True,
                     episode_weight=0.0, kernel="exp", summary_weight=1.0, exclude_self=True,
                     history_weight=1.0, future_weight=1.0, kappa=0.0, episode_adv_norm="zscore",
                     obs_key="text"),
        "gigpo": dict(mode="mean_norm", omega=1.0, gamma=0.95, eps=1e-6, eta=0.0, obs_key="text",
                      episode="trajectory"),
        "grpo_steps": dict(eta=0.0, eps=1e-6, obs_key="text"),
        "igpo": dict(mode="logprob", gamma=1.0),
        "supo": dict(overlong_terminations=("overlong",), normalize_std=True, eps=1e-6),
    }  # fmt: skip
    for name, defaults in expect.items():
        assert {k: d for k, (_, d) in get_estimator(name).settable().items()} == defaults, name


def test_register_params_dataclass(scratch_registry):
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class UnitParams:
        value: float = 1.0
        """The constant."""

    @register_estimator("unit_params", params=UnitParams)
    def unit(groups, **params):
        p = UnitParams(**params)
        return broadcast_to_tokens(groups, [p.value] * sum(len(g.rollouts) for g in groups))

    spec = get_estimator("unit_params")
    assert spec.params == ("value",) and spec.params_cls is UnitParams
    assert spec(_groups(), value=2.0)[0][1][0].tolist() == [2.0] * 4
    with pytest.raises(TypeError, match="nope"):
        spec(_groups(), nope=1)
    with pytest.raises(TypeError, match="must take"):
        register_estimator("unit_bad", params=UnitParams)(lambda groups, *, value=1.0: [])
