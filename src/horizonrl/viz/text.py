"""``horizonrl view FILE.jsonl``: rollouts as plain text in the terminal."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from horizonrl.viz.data import check_rollouts_file, read_rollout_file


def print_rollouts(
    path: str | Path, *, index: int | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Print the rollouts of ``path`` (only number ``index`` when given); problems go to ``err``.

    Returns the number of problems (truncated / non-JSON lines, unknown fields). A file that
    holds no rollouts at all (``metrics.jsonl``, text) is a ``DataError``, before anything is printed.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    f = check_rollouts_file(read_rollout_file(path))
    for p in f.problems:
        print(f"horizonrl: warning: {p}", file=err)
    for i, r in enumerate(f.rollouts):
        if index is not None and i != index:
            continue
        print(
            f"=== rollout {r.uid} task={r.task_id} reward={r.reward} success={r.success} end={r.termination}",
            file=out,
        )
        for si, seg in enumerate(r.segments):
            print(f"--- segment {si} ({seg.kind})", file=out)
            for ti, t in enumerate(seg.turns):
                print(f"[turn {ti}] assistant ({len(t.response_ids)} tokens): {t.response_text}", file=out)
                if t.observation is not None:
                    print(f"[turn {ti}] observation: {t.observation}", file=out)
    return len(f.problems)
