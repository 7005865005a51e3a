"""The ``sft`` section: the supervised warm start on demonstrations (``horizonrl sft``)."""

from __future__ import annotations

from dataclasses import dataclass

from horizonrl.config.fields import _Section, opt


@dataclass(frozen=True)
class SFTConfig(_Section):
    _prefix = "sft."
    data: str | None = opt(
        None, "demonstration JSONL ({messages, tools} per line); null = generate from the env"
    )
    demos: int = opt(400, "demonstrations to generate when data is null", ge=1, le=10**7)
    noise: float = opt(0.3, "expert noise of generated demonstrations", ge=0.0, le=1.0)
    labels: str = opt(
        "executed",
        "targets of a noisy step in agent-program demos: 'executed' = the noise action taken; 'clean' = "
        "the noise-free expert's action at that state (DART, Laskey et al. 2017), while the episode "
        "continues from the action taken",
        choices=("executed", "clean"),
    )
    epochs: int = opt(3, "passes over the demonstrations", ge=1, le=10**5)
    batch_size: int = opt(16, "demonstrations per optimizer step", ge=1, le=2**16)
    lr: float = opt(1e-3, "AdamW learning rate", gt=0.0, le=1.0)
    out_dir: str = opt("runs/sft", "where the fine-tuned model is written")
