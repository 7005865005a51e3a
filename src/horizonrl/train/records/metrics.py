"""Run logging: ``metrics.jsonl`` (one JSON object per step), fanned out to the ``train.loggers`` backends.

The backends (TensorBoard, W&B offline, MLflow, trackio) live in
:mod:`horizonrl.train.records.loggers`; this module owns ``metrics.jsonl``, the record
every other tool (``--resume``, ``horizonrl plot``, ``horizonrl view``) reads.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from horizonrl.train.records.loggers import ExperimentLogger, make_loggers
from horizonrl.trajectory import Rollout


def _clean(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class TornLineWarning(UserWarning):
    """A line of ``metrics.jsonl`` is not a JSON object (a write cut short); it was dropped."""


def _parse_lines(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """``(line, record)`` of each JSON-object line; others warn, naming ``path:line``, and are dropped."""
    out = []
    for i, ln in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not ln.strip():
            continue
        try:
            rec = json.loads(ln)
        except ValueError:
            rec = None
        if not isinstance(rec, dict):
            warnings.warn(
                f"{path}:{i}: dropped a torn or non-JSON line: {ln[:80]!r}", TornLineWarning, stacklevel=3
            )
            continue
        out.append((ln, rec))
    return out


def rollout_table(rollouts: Sequence[Rollout], n: int, step: int) -> tuple[list[str], list[list[Any]]]:
    """Columns and rows of a sample of ``n`` rollouts (evenly spaced over the step) for table loggers."""
    columns = [
        "step",
        "uid",
        "task_id",
        "reward",
        "success",
        "termination",
        "sessions",
        "turns",
        "transcript",
    ]
    if n <= 0 or not rollouts:
        return columns, []
    stride = max(1, len(rollouts) // n)
    rows = []
    for r in list(rollouts)[::stride][:n]:
        parts = []
        for s, seg in enumerate(r.segments):
            for t, turn in enumerate(seg.turns):
                parts.append(f"[{s}:{seg.kind} t{t}] {turn.response_text}")
                if turn.observation:
                    parts.append(f"  -> {turn.observation}")
        text = "\n".join(parts)
        rows.append(
            [
                step,
                r.uid,
                r.task_id,
                float(r.reward),
                bool(r.success),
                r.termination,
                len(r.segments),
                r.num_turns,
                text[:2000],
            ]
        )
    return columns, rows


class MetricsLogger:
    """Appends one JSON line per step to ``run_dir/metrics.jsonl`` and forwards it to the backends.

    On resume, lines for steps after the checkpoint are dropped first, so the file
    reads as if the run had never stopped; a torn or non-JSON line (a write cut
    short by a crash) is dropped with a :class:`TornLineWarning` naming it.
    ``tensorboard=True`` is the old flag, the same as adding ``"tensorboard"`` to ``loggers``.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        tensorboard: bool = False,
        resume_step: int | None = None,
        loggers: Sequence[str] = ("jsonl",),
        config: dict[str, Any] | None = None,
        project: str = "horizonrl",
        rollout_sample: int = 0,
    ):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None and self.path.exists():
            kept = [ln for ln, rec in _parse_lines(self.path) if rec.get("step", 0) <= resume_step]
            self.path.write_text("".join(ln + "\n" for ln in kept))
        elif resume_step is None and self.path.exists():
            self.path.unlink()
        names = list(dict.fromkeys([*loggers, *(["tensorboard"] if tensorboard else [])]))
        self.rollout_sample = rollout_sample
        self.backends: list[ExperimentLogger] = make_loggers(
            names, Path(run_dir), project=project, config=config or {}, resume=resume_step is not None
        )

    @classmethod
    def from_config(cls, run_dir: str | Path, cfg, *, resume_step: int | None = None) -> MetricsLogger:
        """The logger ``cfg.train`` asks for (``loggers``, the ``tensorboard`` alias, ``log_rollouts``)."""
        t = cfg.train
        return cls(
            run_dir,
            resume_step=resume_step,
            loggers=t.logger_names,
            config=cfg.to_dict(),
            project=t.project,
            rollout_sample=t.log_rollouts,
        )

    def log(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        record = {"step": step, **{k: _clean(v) for k, v in sorted(metrics.items())}}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        scalars = {
            k: float(v)
            for k, v in record.items()
            if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)
        }
        for b in self.backends:
            b.log_scalars(step, scalars)
        return record

    def log_rollouts(self, step: int, rollouts: Sequence[Rollout]) -> None:
        """A sample of ``rollout_sample`` rollouts as a ``rollouts`` table, to backends that have tables."""
        if self.rollout_sample <= 0 or not self.backends:
            return
        columns, rows = rollout_table(rollouts, self.rollout_sample, step)
        if rows:
            for b in self.backends:
                b.log_table(step, "rollouts", columns, rows)

    def close(self) -> None:
        for b in self.backends:
            b.close()


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The records of ``run_dir/metrics.jsonl``; torn or non-JSON lines warn and are skipped."""
    return [rec for _, rec in _parse_lines(Path(run_dir) / "metrics.jsonl")]


class NullLogger:
    """The metrics logger of ranks other than 0: returns each record, writes nothing."""

    def log(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        return {"step": step, **dict(sorted(metrics.items()))}

    def log_rollouts(self, step: int, rollouts) -> None:
        pass

    def close(self) -> None:
        pass
