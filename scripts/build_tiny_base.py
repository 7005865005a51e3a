"""Build a tiny base model that horizonrl ships as package data (``model.tiny_pretrain: shipped``).

Runs the project's own build (:func:`horizonrl.train.warmstart.bootstrap.build_tiny`: the offline BPE
tokenizer, the randomly initialised ~1M-parameter model, the synthetic in-context copy pretraining)
and writes it with ``build.json`` (the settings it was built with, the torch version and thread count,
the seconds it took). With the default ``model.*`` settings it goes to ``src/horizonrl/models/tiny_base/``;
with ``--set`` build settings to a sibling named after them (``--set seed=1`` -> ``tiny_base_seed1/``,
:func:`horizonrl.models.shipped.build_dir_name`). A run whose tiny settings equal a build's copies it
instead of pretraining again. Never rebuild a shipped build in place (warm starts key on settings).

    python scripts/build_tiny_base.py                      # the default build (6-40 minutes on 2 cores)
    python scripts/build_tiny_base.py --set seed=1 --threads 1
    python scripts/build_tiny_base.py --out DIR            # build elsewhere (e.g. to compare)
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch

from horizonrl.config import ModelConfig, apply_overrides, from_dict
from horizonrl.errors import ConfigError
from horizonrl.models.shipped import (
    BUILD_FIELDS,
    SHIPPED_DIR,
    build_dir_name,
    build_settings,
    write_build_record,
)
from horizonrl.train.warmstart.bootstrap import build_tiny


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a model build setting (horizonrl.models.shipped.BUILD_FIELDS), e.g. seed=1",
    )
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--out", default="", help="where to write the model directory (default: package data)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    for item in args.set:
        if item.split("=", 1)[0] not in BUILD_FIELDS:
            ap.error(f"--set {item!r}: a build setting is one of {', '.join(BUILD_FIELDS)}")
    sets = [f"model.{s}" for s in args.set] + ["model.tiny_pretrain=rebuild"]
    try:
        cfg = from_dict(apply_overrides({}, sets)).model
    except ConfigError as e:
        ap.error(str(e))
    name = build_dir_name(build_settings(cfg), build_settings(ModelConfig()))
    out = Path(args.out or SHIPPED_DIR.parent / name)
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
