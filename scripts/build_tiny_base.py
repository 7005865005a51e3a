"""Build the tiny base model that horizonrl ships as package data (``model.tiny_pretrain: shipped``).

Runs the project's own build (:func:`horizonrl.train.warmstart.bootstrap.build_tiny`: the offline BPE
tokenizer, the randomly initialised ~1M-parameter model, the synthetic in-context copy pretraining)
with the default ``model.*`` settings, and writes it to ``src/horizonrl/models/tiny_base/`` with
``build.json`` (the settings it was built with, the torch version and thread count, the seconds it
took). A run whose tiny settings equal those loads this copy instead of pretraining again.

    python scripts/build_tiny_base.py              # rebuild the shipped copy (5-8 minutes on 2 cores)
    python scripts/build_tiny_base.py --out DIR    # build elsewhere (e.g. to compare with the shipped one)
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from horizonrl.config import ModelConfig
from horizonrl.models.shipped import SHIPPED_DIR, write_build_record
from horizonrl.train.warmstart.bootstrap import build_tiny


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(SHIPPED_DIR), help="where to write the model directory")
    args = ap.parse_args()
    cfg = ModelConfig(tiny_pretrain="rebuild")
    out = Path(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        build_tiny(cfg, Path(tmp) / "model")
        seconds = time.perf_counter() - t0
        write_build_record(Path(tmp) / "model", cfg, seconds=seconds)
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(Path(tmp) / "model", out)
    print(f"built the tiny base model in {seconds:.0f}s -> {out}")


if __name__ == "__main__":
    main()
