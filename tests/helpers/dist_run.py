"""The torchrun tests' worker: ``torchrun --nproc-per-node N tests/helpers/dist_run.py OUT OVERRIDES...``.

Registers the shaped test environment, trains with ``make_trainer`` (``--resume`` resumes), and on rank 0
writes ``OUT/weights.pt`` (the final full weights) and ``OUT/time.json`` (the update seconds per step).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for helpers.shaped_env
from helpers import shaped_env  # noqa: F401  (registers arith_shaped)
from horizonrl.config import load_config
from horizonrl.train.trainers.registry import make_trainer


def main() -> None:
    torch.set_num_threads(1)
    args = sys.argv[1:]
    resume = "--resume" in args
    args = [a for a in args if a != "--resume"]
    out, overrides = Path(args[0]), args[1:]
    trainer = make_trainer(load_config(None, overrides), resume=resume)
    times = []
    advance = trainer.advance

    def timed_advance():
        m = advance()
        times.append(m.get("time/update_s", 0.0))
        return m

    trainer.advance = timed_advance
    trainer.fit()
    world = trainer.world
    full = world.full_state_dict(trainer.model) if world is not None else trainer.model.state_dict()
    saved = {k: v.detach().cpu().clone() for k, v in full.items()}
    rank = trainer.world.rank if trainer.world is not None else 0
    trainer.close()  # leaves the process group
    # A crash after this line is a teardown crash, not a training one: say so in the test's failure.
    print(f"dist_run: rank {rank} finished training and left the group", file=sys.stderr, flush=True)
    if trainer.is_main:
        out.mkdir(parents=True, exist_ok=True)
        torch.save(saved, out / "weights.pt")
        (out / "time.json").write_text(json.dumps({"update_s": times}))


if __name__ == "__main__":
    main()
