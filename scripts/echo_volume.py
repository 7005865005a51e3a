"""Trajectory volume of ECHO and SUPO on the expert's episodes of `horizonrl reproduce echo`'s scenarios.

    PYTHONPATH=src python scripts/echo_volume.py

Prints, per scenario, the mean saved tokens per rollout (``trajectory.saved_tokens``: every session
its own row) and the mean appended tokens (``trajectory.appended_tokens``: selection / summary
sessions counted by what they add to their parent's context, as ECHO's released code saves them).
No model runs: the episodes are the scripted expert's, as in the reproduction's regime checks.
"""

from __future__ import annotations

import numpy as np

import horizonrl.reproduce.papers  # noqa: F401  (registers the papers)
from horizonrl.reproduce.checks import _flat, expert_groups
from horizonrl.reproduce.runner import Settings, stage_config
from horizonrl.reproduce.spec import get_paper
from horizonrl.trajectory import appended_tokens, saved_tokens


def main() -> None:
    paper = get_paper("echo")
    for label, scenario in (("ECHO", "memory"), ("SUPO", "summary")):
        rollouts = _flat(expert_groups(stage_config(paper, Settings(seeds=1), scenario=scenario)))
        saved = np.mean([saved_tokens(r) for r in rollouts])
        appended = np.mean([appended_tokens(r) for r in rollouts])
        print(
            f"{label:5s} {len(rollouts)} rollouts: saved {saved:.1f}, appended {appended:.1f} tokens/rollout"
        )


if __name__ == "__main__":
    main()
