"""An engine that answers every generation request with the scripted expert.

Agent programs attach ``expert(rng, noise) -> text`` to their
:class:`~horizonrl.agents.driver.Generate` requests (the environment's
``expert_action`` for ordinary turns; a context manager's own expert for
protocol messages such as compaction summaries or memory selections; the fork
agent's planner). Driving the same programs with :class:`ExpertEngine` records
expert rollouts whose prompts, sessions and protocol messages are exactly those
the policy will see, so supervised warm starts need no second formatter::

    rollouts = collect_groups(ExpertEngine(tokenizer, seed=0, noise=0.3), ...)
    rows = build_rows(rollouts)          # every generated token trainable

Log-probs of expert tokens are reported as 0.0 (they are not sampled).

With ``clean_labels=True`` a step whose text differs from the noise-free
expert's (a noise action) also carries that noise-free action's ids in
``Generation.meta["label_ids"]`` (copied to ``Turn.info["label_ids"]``): SFT can
then train the state a noise action led to on the expert's correction while the
episode continues from the action taken (DART; ``sft.labels: clean``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from horizonrl.agents.driver import Generate
from horizonrl.inference.base import Engine, Generation, SamplingParams


class ExpertEngine(Engine):
    """Replies with ``request.expert(rng, noise)`` + end-of-turn, cut to ``max_new_tokens``."""

    answers_requests = True

    def __init__(
        self, tokenizer, *, eos_id: int, seed: int = 0, noise: float = 0.0, clean_labels: bool = False
    ) -> None:
        self.tokenizer = tokenizer
        self.eos_id = int(eos_id)
        self.rng = random.Random(seed)
        self.noise = float(noise)
        self.clean_labels = bool(clean_labels)

    def generate_requests(self, requests: Sequence[Generate]) -> list[Generation]:
        out = []
        for req in requests:
            if req.expert is None:
                raise ValueError(
                    "ExpertEngine got a request without an expert; the agent program must set one"
                )
            text = req.expert(self.rng, self.noise)
            ids = self._ids(text)
            cut = len(ids) > req.params.max_new_tokens
            ids = ids[: req.params.max_new_tokens]
            shown = self.tokenizer.decode(ids[:-1] if ids and ids[-1] == self.eos_id else ids)
            gen = Generation(ids, [0.0] * len(ids), shown, "length" if cut else "stop")
            if self.clean_labels and self.noise > 0:
                # a fixed rng: the noise-free expert's draw must not shift the noisy stream
                clean = req.expert(random.Random(0), 0.0)
                if clean != text:
                    gen.meta["label_ids"] = self._ids(clean)[: req.params.max_new_tokens]
            out.append(gen)
        return out

    def _ids(self, text: str) -> list[int]:
        return [*self.tokenizer.encode(text, add_special_tokens=False), self.eos_id]

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        raise TypeError("ExpertEngine answers Generate requests (drive() calls generate_requests)")

    def score(self, contexts, continuations) -> list[np.ndarray]:
        raise TypeError("ExpertEngine cannot score")
