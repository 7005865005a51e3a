"""The ``model`` section: which policy model is loaded, its dtype and device, and the tiny model's build."""

from __future__ import annotations

from dataclasses import dataclass

from horizonrl.config.fields import _DEVICE, MAX_SEED, _Section, opt
from horizonrl.errors import ConfigError


@dataclass(frozen=True)
class ModelConfig(_Section):
    _prefix = "model."
    path: str = opt(
        "tiny", "'tiny' (build the embedded tiny model), 'smollm2', or a local HF model directory"
    )
    dtype: str = opt("float32", "parameter dtype", choices=("float32", "bfloat16", "float16"))
    device: str = opt("auto", "'auto', 'cpu', 'cuda', 'cuda:N' or 'mps' (it must exist on this machine)")
    tiny_hidden: int = opt(128, "tiny model: hidden size", gt=0, le=8192)
    tiny_layers: int = opt(4, "tiny model: transformer layers", gt=0, le=128)
    tiny_vocab: int = opt(768, "tiny model: BPE vocabulary size of the trained tokenizer", ge=300, le=65536)
    tiny_pretrain_steps: int = opt(
        6000,
        "tiny model: at most this many steps of synthetic in-context copy pretraining after "
        "initialisation (it stops early once the copy loss has converged)",
        ge=0,
        le=10**7,
    )
    tiny_pretrain_lr: float = opt(
        1e-3,
        "tiny model: peak learning rate of the copy pretraining (3e-3 fails to converge on some CPUs)",
        gt=0.0,
        le=1.0,
    )
    tiny_pretrain_pack: int = opt(
        8,
        "tiny model: copy-pretraining problems packed into one row, so each is found by content deep in "
        "a context of others (1: one problem a row, whose copy circuit only works near the start of a "
        "context)",
        ge=1,
        le=256,
    )
    tiny_name_tokens: bool = opt(
        False,
        "tiny model: add the entity-name pool (horizonrl.envs.names, lookup's `names: pool`) to the "
        "tokenizer as whole-word tokens, so each entity is one token",
    )
    seed: int = opt(0, "seed for the tiny model's initialisation and tokenizer corpus", ge=0, le=MAX_SEED)
    tiny_pretrain: str = opt(
        "shipped",
        "tiny model: 'shipped' copies the base model packaged with horizonrl when the tiny_* settings and "
        "seed above are the ones it was built with (the defaults; same weights on every machine), else "
        "builds it; 'rebuild' always builds and pretrains it here (minutes on 2 cores)",
        choices=("shipped", "rebuild"),
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not _DEVICE.match(self.device):
            raise ConfigError(
                f"model.device={self.device!r}: must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'"
            )
