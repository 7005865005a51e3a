"""LoRA (``model.lora_r > 0``) on the tiny model: only adapters train, the frozen base is the KL
reference and CCPO's encoder, checkpoints hold adapters and resume exactly, export merges them."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("peft")

from helpers.shaped_env import small_run_config
from horizonrl.cli import main
from horizonrl.config import ConfigError, ModelConfig, load_config
from horizonrl.models import load_model_and_tokenizer
from horizonrl.models import lora as lora_utils
from horizonrl.train.records import checkpoint as ckpt
from horizonrl.train.records.export import export_merged
from horizonrl.train.records.metrics import read_metrics
from horizonrl.train.trainers.group import NONDETERMINISTIC_KEYS, GroupTrainer
from horizonrl.train.warmstart.bootstrap import load_policy

# eval_every=1: a run evaluates after every step, so a 2-step run's records are a 3-step run's first two.
LORA = ("model.lora_r=4", "model.lora_alpha=8", "optim.lr=1e-2", "algo.kl_coef=0.05", "train.eval_every=1")
PROMPTS = [[5, 17, 33, 80, 12, 7, 44], [9, 9, 41, 100, 3]]


def _cfg(model_dir, out_dir, *extra):
    """A small run on ``arith_shaped`` (a dense reward: the random tiny policy gets advantages)."""
    return small_run_config(model_dir, out_dir, *LORA, *extra)


def _logprobs(model, ids: list[int]) -> torch.Tensor:
    """Log-prob of each next token of ``ids`` (computed here, not by the package)."""
    x = torch.tensor([ids])
    with torch.no_grad():
        logits = model(input_ids=x).logits[0, :-1].double()
    return torch.log_softmax(logits, -1).gather(-1, x[0, 1:, None])[:, 0]


def _base_weights(model_dir) -> dict[str, torch.Tensor]:
    model, _ = load_model_and_tokenizer(model_dir)
    return model.state_dict()


@pytest.fixture(scope="module")
def lora_run(tiny_model_dir, tmp_path_factory):
    """A 2-step LoRA run with a KL reference (checkpoint after each step)."""
    out = tmp_path_factory.mktemp("lora") / "run"
    trainer = GroupTrainer(_cfg(tiny_model_dir, out, "train.steps=2", "train.save_every=1"))
    records = trainer.fit()
    return trainer, records, out


def test_only_the_adapters_train_and_the_ratio_is_one(lora_run, tiny_model_dir):
    trainer, records, _ = lora_run
    model = trainer.model
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # The optimizer holds exactly the adapters.
    held = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert held == {id(p) for n, p in model.named_parameters() if n in trainable}
    n_train, n_total = lora_utils.parameter_counts(model)
    assert n_train == sum(p.numel() for n, p in model.named_parameters() if n in trainable)
    assert 0 < n_train < n_total / 2
    # Base weights: bit-identical to the model directory; adapters: moved away from B = 0.
    base = lora_utils.plain_state_dict(model)
    original = _base_weights(tiny_model_dir)
    assert base.keys() == original.keys()
    for k, v in original.items():
        assert torch.equal(base[k], v), k
    assert any(float(p.detach().abs().max()) > 0 for n, p in model.named_parameters() if ".lora_B." in n)
    # The hf engine runs the adapted module: rollout log-probs equal the training ones.
    ratios = [r["train/ratio_geomean"] for r in records if "train/ratio_geomean" in r]
    assert len(ratios) == 2 and all(abs(r - 1) < 1e-4 for r in ratios), ratios
    assert all(r["train/ratio_max_abs_log"] < 1e-4 for r in records if "train/ratio_max_abs_log" in r)
    assert records[-1]["train/kl"] > 0  # the second update's policy differs from the reference


def test_the_reference_is_the_frozen_base_without_a_copy(lora_run, tiny_model_dir):
    trainer, _, _ = lora_run
    ref = trainer.ref_model
    assert isinstance(ref, lora_utils.FrozenBase)
    assert {p.data_ptr() for p in ref.parameters()} <= {p.data_ptr() for p in trainer.model.parameters()}
    plain, _ = load_model_and_tokenizer(tiny_model_dir)  # loaded separately, never adapted
    trainer.model.train()
    for ids in PROMPTS:
        want = _logprobs(plain, ids)
        assert float((_logprobs(ref, ids) - want).abs().max()) < 1e-6
        assert float((_logprobs(trainer.model, ids) - want).abs().max()) > 1e-4  # the adapters act
    # Calling the reference leaves the policy as it was: adapters on, trainable, in train mode.
    assert trainer.model.training
    assert all(p.requires_grad for n, p in trainer.model.named_parameters() if ".lora_" in n)
    # CCPO's frozen encoder: the decoder stack's states without adapters, and no copy either.
    from horizonrl.train.methods.ccpo import last_token_states, reference_model
    from horizonrl.train.trainers.features import FeatureContext

    ctx = FeatureContext(
        cfg=None, engine=None, renderer=None, tokenizer=None, model=trainer.model, ref_model=None,
        tasks_by_id={}, step=5,
    )  # fmt: skip
    enc = reference_model(ctx)
    assert isinstance(enc, lora_utils.FrozenBase) and reference_model(ctx) is enc
    got = last_token_states(enc, PROMPTS)
    want = last_token_states(plain, PROMPTS)
    assert got.shape == want.shape and float(abs(got - want).max()) < 1e-5


def test_checkpoints_hold_the_adapters_and_resume_exactly(lora_run, tiny_model_dir, tmp_path):
    _, _, first_dir = lora_run
    step = first_dir / "checkpoints" / "step_2"
    names = {p.name for p in step.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", ckpt.STATE_FILE} <= names
    assert "model.safetensors" not in names
    adapter = json.loads((step / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["base_model_name_or_path"] == str(tiny_model_dir.resolve())
    # An uninterrupted 3-step run against the 2-step run resumed for a third step.
    full = GroupTrainer(_cfg(tiny_model_dir, tmp_path / "a", "train.steps=3", "train.save_every=1"))
    full.fit()
    resumed_dir = tmp_path / "b"
    import shutil

    shutil.copytree(first_dir, resumed_dir)
    resumed = GroupTrainer(
        _cfg(tiny_model_dir, resumed_dir, "train.steps=3", "train.save_every=1"), resume=True
    )
    assert resumed.step == 2
    resumed.fit()
    for (name, p), q in zip(full.model.named_parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p, q), name

    def keep(rs):
        return [{k: v for k, v in r.items() if not k.startswith(NONDETERMINISTIC_KEYS)} for r in rs]

    a, b = keep(read_metrics(tmp_path / "a")), keep(read_metrics(resumed_dir))
    assert [r["step"] for r in b] == [1, 2, 3]
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_a_full_model_checkpoint_does_not_load_into_a_lora_run(tiny_model_dir, tmp_path):
    model, _ = load_policy(ModelConfig(path=str(tiny_model_dir), lora_r=4), init=None, work_dir=tmp_path)
    with pytest.raises(ckpt.CheckpointError, match="full-model checkpoint"):
        ckpt.load_weights_into(model, _base_weights(tiny_model_dir))


def test_export_merges_the_adapters_into_a_plain_model(lora_run, tmp_path):
    trainer, _, run = lora_run
    out = tmp_path / "merged"
    assert main(["export", str(run), "--out", str(out)]) == 0
    merged, _ = load_model_and_tokenizer(out)  # a plain HF directory: config, weights, tokenizer
    assert not lora_utils.is_lora(merged)
    assert not any(".lora_" in k or ".base_layer." in k for k in merged.state_dict())
    trainer.model.eval()
    for ids in PROMPTS:
        diff = (_logprobs(merged, ids) - _logprobs(trainer.model, ids)).abs().max()
        assert float(diff) < 1e-5
    # The checkpoint itself loads (merged) wherever a model directory is taken: eval, serve, train.init.
    loaded, _ = load_policy(
        ModelConfig(path=str(run / "checkpoints" / "step_2")), init=None, work_dir=tmp_path
    )
    for ids in PROMPTS:
        assert float((_logprobs(loaded, ids) - _logprobs(merged, ids)).abs().max()) < 1e-6
    with pytest.raises(FileExistsError):
        export_merged(run, out)


def test_merge_and_unload_gives_the_adapted_model(tiny_model_dir, tmp_path):
    torch.manual_seed(0)
    model, _ = load_policy(ModelConfig(path=str(tiny_model_dir), lora_r=8), init=None, work_dir=tmp_path)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.normal_(0, 0.1)
    want = [_logprobs(model, ids) for ids in PROMPTS]
    lora_utils.merge_and_unload(model)
    assert not lora_utils.is_lora(model) and all(p.requires_grad for p in model.parameters())
    for ids, w in zip(PROMPTS, want, strict=True):
        assert float((_logprobs(model, ids) - w).abs().max()) < 1e-5


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.lora_r=-1"], "model.lora_r=-1: must be >= 0"),
        (["model.lora_alpha=0"], "model.lora_alpha=0"),
        (["model.lora_dropout=1.5"], "model.lora_dropout=1.5"),
        (["model.lora_target_modules=[]"], "model.lora_target_modules=[]"),
        (["model.lora_target_modules=[q_proj, 'a b']"], "model.lora_target_modules="),
    ],
)
def test_bad_lora_settings_are_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config(None, overrides)


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        ("[q_proj, qq_proj]", r"'qq_proj' matches no linear layer .*known: \['down_proj'"),
        ("[embed_tokens]", "'model.embed_tokens' is Embedding, not a linear layer"),
        ("lm_head", "'lm_head' is the output head"),
    ],
)
def test_an_unknown_target_module_is_named(tiny_model_dir, tmp_path, targets, message):
    cfg = load_config(
        None, [f"model.path={tiny_model_dir}", "model.lora_r=4", f"model.lora_target_modules={targets}"]
    )
    with pytest.raises(ConfigError, match=message):
        load_policy(cfg.model, init=None, work_dir=tmp_path)


def test_sft_with_lora_writes_a_plain_merged_model(tiny_model_dir, tmp_path):
    from horizonrl.train.recipes import run_sft

    cfg = load_config(
        None,
        [
            f"model.path={tiny_model_dir}",
            "model.lora_r=4",
            "env.name=arithmetic",
            "sft.demos=4",
            "sft.epochs=1",
            "sft.batch_size=4",
            "sft.lr=0.05",
            f"sft.out_dir={tmp_path / 'sft'}",
        ],
    )
    out = run_sft(cfg)
    assert not lora_utils.is_adapter_dir(out)
    model, _ = load_model_and_tokenizer(out)
    trained, original = model.state_dict(), _base_weights(tiny_model_dir)
    assert trained.keys() == original.keys()
    changed = {k for k, v in original.items() if not torch.equal(trained[k], v)}
    # Only the adapted (linear) layers moved: their merged updates; embeddings and norms are the base's.
    assert changed and all(k.endswith("_proj.weight") for k in changed), sorted(changed)


def test_ccpo_trains_a_lora_policy_with_the_frozen_base_as_encoder(tiny_model_dir, tmp_path):
    import horizonrl.agents.stepwise  # noqa: F401  (registers the agent)

    cfg = load_config(
        None,
        [
            f"train.init={tiny_model_dir}",
            f"train.out_dir={tmp_path}",
            "train.progress=false",
            "model.lora_r=4",
            "env.name=rooms",
            "env.knobs={n_rooms: 2}",
            "env.train_tasks=4",
            "env.test_tasks=2",
            "rollout.agent=stepwise",
            "rollout.agent_params={history: 2, tools: false}",
            "rollout.group_size=3",
            "rollout.tasks_per_step=2",
            "rollout.max_new_tokens=8",
            "rollout.max_turns=3",
            "algo.estimator=ccpo",
            "algo.estimator_params={eta: 0.01}",
        ],
    )
    trainer = GroupTrainer(cfg)
    for _ in range(2):
        m = trainer.train_step()
        assert m["ccpo/forward_prompts"] >= 1 and abs(m["train/ratio_geomean"] - 1) < 1e-4
    enc = trainer.feature_state["hidden"]["ref"]
    assert trainer.ref_model is None and isinstance(enc, lora_utils.FrozenBase)
