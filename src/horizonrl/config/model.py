"""The ``model`` section: which policy model is loaded, its dtype and device, and the tiny model's build."""

from __future__ import annotations

import re
from dataclasses import dataclass

from horizonrl.config.fields import _DEVICE, MAX_SEED, _Section, opt
from horizonrl.errors import ConfigError

#: A module name (or dotted suffix) in ``model.lora_target_modules``.
_MODULE_NAME = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")


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
        "tiny model: add the entity-name pool (horizonrl.envs.builtin.names, lookup's `names: pool`) to the "
        "tokenizer as whole-word tokens, so each entity is one token",
    )
    seed: int = opt(0, "seed for the tiny model's initialisation and tokenizer corpus", ge=0, le=MAX_SEED)
    tiny_pretrain: str = opt(
        "shipped",
        "tiny model: 'shipped' copies a base model packaged with horizonrl when the tiny_* settings and "
        "seed above are the ones it was built with (the defaults, or tiny_pretrain_steps=12000: the "
        "build whose deep recall converged; same weights on every machine), else builds it; 'rebuild' "
        "always builds and pretrains it here (minutes on 2 cores)",
        choices=("shipped", "rebuild"),
    )

    family: str = opt(
        "auto",
        "model family: its tool-call syntax, thinking convention and stop tokens (`horizonrl families` "
        "lists them); 'auto' detects it from the chat template",
    )
    chat_template_kwargs: dict = opt(
        {},
        "keyword arguments passed to every rendering of the chat template (e.g. {enable_thinking: "
        "false} for Qwen3)",
    )

    lora_r: int = opt(
        0,
        "LoRA rank (peft adapters on the policy; docs/models.md, 'LoRA'): 0 trains every weight; > 0 trains "
        "only rank-r adapters, the frozen base serving as the KL reference and CCPO's frozen encoder, "
        "checkpoints holding the adapters (`horizonrl export` merges them)",
        ge=0,
        le=512,
    )
    lora_alpha: float = opt(
        16.0, "LoRA scale numerator: an adapter's update is (lora_alpha / lora_r) * B A", gt=0.0, le=1e6
    )
    lora_dropout: float = opt(
        0.0,
        "dropout on the adapters' input during the update (> 0 makes train/ratio_geomean differ from 1: "
        "rollouts sample without it)",
        ge=0.0,
        le=0.9,
    )
    lora_target_modules: str | list = opt(
        "all-linear",
        "layers that get adapters: 'all-linear' (every linear layer of attention and MLP, not the output "
        "head) or a list of module names, e.g. [q_proj, v_proj] (matched as peft does: the name or a "
        "dotted suffix of it)",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        targets = self.lora_target_modules
        names = [targets] if isinstance(targets, str) else targets
        if not names or not all(isinstance(n, str) and _MODULE_NAME.match(n) for n in names):
            raise ConfigError(
                f"model.lora_target_modules={targets!r}: must be 'all-linear' or a non-empty list of module "
                "names such as [q_proj, v_proj]"
            )
        if self.family != "auto":
            from horizonrl.models.families import FAMILIES

            if self.family not in FAMILIES.names():
                raise ConfigError(f"model.family={self.family!r}: {FAMILIES.unknown(self.family)}")
        if not _DEVICE.match(self.device):
            raise ConfigError(
                f"model.device={self.device!r}: must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'"
            )
