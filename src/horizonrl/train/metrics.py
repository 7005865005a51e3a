"""Run logging: ``metrics.jsonl`` (one JSON object per step), optional TensorBoard, progress bar."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _clean(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class MetricsLogger:
    """Appends one JSON line per step to ``run_dir/metrics.jsonl``.

    On resume, lines for steps after the checkpoint are dropped first, so the file
    reads as if the run had never stopped.
    """

    def __init__(self, run_dir: str | Path, *, tensorboard: bool = False, resume_step: int | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None and self.path.exists():
            kept = [ln for ln in self.path.read_text().splitlines() if ln.strip()]
            kept = [ln for ln in kept if json.loads(ln).get("step", 0) <= resume_step]
            self.path.write_text("".join(ln + "\n" for ln in kept))
        elif resume_step is None and self.path.exists():
            self.path.unlink()
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:  # pragma: no cover - depends on optional package
                raise RuntimeError(
                    "train.tensorboard=true needs the tensorboard package: "
                    "pip install 'horizonrl[tensorboard]'"
                ) from e
            self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))

    def log(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        record = {"step": step, **{k: _clean(v) for k, v in sorted(metrics.items())}}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for k, v in record.items():
                if isinstance(v, int | float) and k != "step":
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()
        return record

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
