"""The ``gateway`` section: the recording gateway for external agent harnesses (train.trainer=gateway)."""

from __future__ import annotations

from dataclasses import dataclass

from horizonrl.config.fields import _Section, opt


@dataclass(frozen=True)
class GatewayConfig(_Section):
    """The recording gateway trainer (train.trainer=gateway; docs/gateway.md)."""

    _prefix = "gateway."
    command: str | None = opt(
        None,
        "harness command run once per episode (split like a shell line, run without a shell); "
        "{base_url}, {episode_id}, {reward_url}, {task_file} are filled in and also set as HORIZONRL_* "
        "environment variables (OPENAI_BASE_URL too); a number on its last stdout line is the reward",
    )
    callable: str | None = opt(
        None,
        "'package.module:function' called once per episode in a thread with the keyword arguments it "
        "names among task, base_url, episode_id, reward_url, api_key; a returned number is the reward",
    )
    reward: str | None = opt(
        None,
        "reward of episodes whose harness posts none: a registered reward (exact_match, token_f1, math, "
        "...) or 'package.module:function' (prediction, golds) -> float, applied to the final answer "
        "and the task's answer and aliases; null = only posted rewards count",
    )
    host: str = opt("127.0.0.1", "address the gateway listens on")
    port: int = opt(0, "port of the gateway (0 = a free port)", ge=0, le=65535)
    model_name: str = opt("policy", "model name the gateway serves (what harnesses send as 'model')")
    concurrency: int = opt(0, "harness episodes run at once (0 = all episodes of a step)", ge=0)
    episode_timeout_s: float = opt(300.0, "a harness episode running longer is stopped and dropped", gt=0.0)
    reward_timeout_s: float = opt(
        10.0,
        "after a harness ends, how long to wait for its reward; an episode without one is dropped "
        "(counted in gateway/dropped_episodes), never trained with a made-up reward",
        ge=0.0,
    )
    slice_tokens: int = opt(
        32, "scheduler slice: the longest a call waits behind others, in decode steps", ge=1
    )
    max_request_tokens: int = opt(8192, "cap on n x max_tokens of one call", ge=1)
