"""Config validation: every error names the field and the bad value."""

from __future__ import annotations

import pytest

from horizonrl.config import ConfigError, RunConfig, describe, from_dict, load_config, save_config


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rollout.group_size=0", "rollout.group_size=0: must be >= 1"),
        ("rollout.top_p=1.5", "rollout.top_p=1.5: must be <= 1.0"),
        ("rollout.overflow=drop", "rollout.overflow='drop': must be one of"),
        ("algo.kl_kind=k9", "algo.kl_kind='k9'"),
        ("algo.dual_clip=1.0", "algo.dual_clip=1.0: must be > 1.0"),
        ("algo.loss_agg_mode=sum", "algo.loss_agg_mode='sum'"),
        ("optim.lr=fast", "optim.lr='fast': expected float"),
        ("train.progress=3", "train.progress=3: expected bool"),
        ("rollout.temp=1", "unknown config field rollout.temp"),
        ("nosuch.x=1", "unknown config section 'nosuch'"),
    ],
)
def test_bad_values_name_the_field(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert message in str(e.value)


def test_overrides_parse_yaml_and_ints_widen_to_float(tmp_path):
    cfg = load_config(
        None, ["optim.lr=1", "env.knobs={hops: 3}", "algo.dual_clip=3", "optim.weight_decay=1e-2"]
    )
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)
    assert cfg.env.knobs == {"hops": 3}
    assert cfg.algo.dual_clip == 3.0
    assert cfg.optim.weight_decay == 0.01  # YAML reads 1e-2 as a string
    path = tmp_path / "c.yaml"
    save_config(cfg, path)
    assert load_config(path) == cfg


def test_defaults_and_reference():
    assert from_dict({}) == RunConfig()
    ref = describe()
    assert "`rollout.group_size`" in ref and "rollouts per task" in ref
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/nonexistent.yaml")
    with pytest.raises(ConfigError, match="override"):
        load_config(None, ["no_equals_sign"])


def test_readme_config_reference_is_current():
    from pathlib import Path

    readme = Path(__file__).resolve().parents[2] / "README.md"
    assert describe() in readme.read_text(), "regenerate the README's config reference"
    from horizonrl.train.trainers.registry import trainer_reference

    assert trainer_reference() in readme.read_text(), "regenerate the README's trainer parameters"


def test_vocabulary_enums_are_the_config_choices():
    """Each config choice set written from a vocab enum accepts exactly the enum's plain strings."""
    import dataclasses

    from horizonrl.config.algo import AlgoConfig
    from horizonrl.config.train import TrainConfig
    from horizonrl.credit.ccpo_features import OBS_KEYS
    from horizonrl.vocab import ObsKey, PolicyLoss, Precision

    def choices(cls, name):
        return next(f.metadata["choices"] for f in dataclasses.fields(cls) if f.name == name)

    assert choices(AlgoConfig, "policy_loss") == ("ppo", "reinforce") == tuple(PolicyLoss)
    assert choices(TrainConfig, "precision") == ("fp32", "bf16") == tuple(Precision)
    assert all(type(c) is str for c in choices(AlgoConfig, "policy_loss") + choices(TrainConfig, "precision"))
    assert list(OBS_KEYS) == ["text", "state", "turn"] == list(ObsKey)
