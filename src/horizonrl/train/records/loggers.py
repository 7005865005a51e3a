"""Experiment-logger backends behind one interface (``train.loggers``).

``metrics.jsonl`` (``jsonl``) is always written by :class:`~horizonrl.train.records.metrics.MetricsLogger`,
which fans every record out to the backends named here. Each backend logs

- the run config once (:meth:`ExperimentLogger.__init__`),
- the scalars of every step (:meth:`ExperimentLogger.log_scalars`),
- a sample of each step's rollouts as a table where it has one (:meth:`ExperimentLogger.log_table`).

Backends, all local / offline:

- ``tensorboard``: event files in ``RUN_DIR/tensorboard``; the config and the rollout
  sample as text (markdown tables).
- ``wandb``: W&B in offline mode (``WANDB_MODE`` overrides), files under ``RUN_DIR/wandb``;
  ``wandb sync`` uploads them later. Rollouts as a ``wandb.Table``.
- ``mlflow``: a local file store ``RUN_DIR/mlruns`` (``MLFLOW_TRACKING_URI`` overrides; MLflow 3
  keeps file stores in maintenance mode, so ``MLFLOW_ALLOW_FILE_STORE=true`` is set for it);
  ``mlflow ui --backend-store-uri RUN_DIR/mlruns`` shows it. Metric names are sanitized
  (``eval/pass@1`` -> ``eval/pass_at_1``). Rollouts via ``log_table`` (``rollouts/step_N.json``).
- ``trackio``: a local SQLite store in ``RUN_DIR/trackio`` (``TRACKIO_DIR`` overrides; trackio
  reads it at import, so a process that imported trackio earlier keeps its directory);
  ``trackio show`` opens it. Rollouts as a ``trackio.Table``.

A backend whose package is missing fails when the trainer is built
(:func:`check_loggers`), with the pip command that installs it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from horizonrl.errors import ConfigError
from horizonrl.registry import Registry


class LoggerUnavailableError(ConfigError):
    """A configured logger's package is not installed."""


class ExperimentLogger:
    """One backend. ``package`` is the module it imports, ``pip`` what installs it."""

    name: ClassVar[str] = ""
    package: ClassVar[str | None] = None
    pip: ClassVar[str] = ""

    def __init__(self, run_dir: Path, *, project: str, run_name: str, config: dict, resume: bool) -> None:
        self.run_dir = Path(run_dir)

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def log_table(self, step: int, name: str, columns: list[str], rows: list[list[Any]]) -> None:
        """Log a table (default: the backend has none)."""

    def close(self) -> None:
        """Flush and release the backend."""


EXPERIMENT_LOGGERS: Registry[type[ExperimentLogger]] = Registry(
    "logger",
    register_with="@register_logger on an ExperimentLogger subclass (horizonrl.train.records.loggers)",
    sort=False,  # the documented order: jsonl, then the backends as defined below
)


def register_logger(cls: type[ExperimentLogger]) -> type[ExperimentLogger]:
    """Class decorator registering an :class:`ExperimentLogger` subclass under its ``name``."""
    return EXPERIMENT_LOGGERS.register(cls.name, cls)


@register_logger
class JsonlLogger(ExperimentLogger):
    """``jsonl``: ``metrics.jsonl``, always written by the metrics logger itself; registered so the name is
    known, never constructed by :func:`make_loggers`."""

    name = "jsonl"

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        """Nothing: the metrics logger writes ``metrics.jsonl``."""


#: Logger names in their documented order, ``jsonl`` (written by the metrics logger itself) first.
list_loggers = EXPERIMENT_LOGGERS.names


def check_loggers(names: Sequence[str]) -> None:
    """Raise :class:`LoggerUnavailableError` (one line, with the pip command) for a missing package.

    An unknown name raises :class:`~horizonrl.registry.UnknownNameError` (a ``ConfigError``) naming the
    known ones.
    """
    for name in names:
        cls = EXPERIMENT_LOGGERS.get(name, field="train.loggers")
        if cls.package and importlib.util.find_spec(cls.package) is None:
            raise LoggerUnavailableError(
                f"train.loggers: {name!r} needs the {cls.package} package: pip install {cls.pip} "
                "(or pip install 'horizonrl[loggers]')"
            )


def make_loggers(
    names: Sequence[str], run_dir: Path, *, project: str, config: dict, resume: bool
) -> list[ExperimentLogger]:
    """The backends of ``names`` (``jsonl`` excluded), constructed in order."""
    check_loggers(names)
    run_name = Path(run_dir).resolve().name
    out: list[ExperimentLogger] = []
    try:
        for name in names:
            if name != JsonlLogger.name:
                out.append(
                    EXPERIMENT_LOGGERS.get(name)(
                        run_dir, project=project, run_name=run_name, config=config, resume=resume
                    )
                )
    except BaseException:
        for lg in out:
            lg.close()
        raise
    return out


def markdown_table(columns: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def _run_id_file(run_dir: Path, name: str) -> Path:
    return run_dir / f".{name}_run_id"


# ----------------------------------------------------------------------------- backends


@register_logger
class TensorBoardLogger(ExperimentLogger):
    name = "tensorboard"
    package = "tensorboard"
    pip = "tensorboard"

    def __init__(self, run_dir: Path, *, project: str, run_name: str, config: dict, resume: bool) -> None:
        super().__init__(run_dir, project=project, run_name=run_name, config=config, resume=resume)
        from torch.utils.tensorboard import SummaryWriter

        self._w = SummaryWriter(str(self.run_dir / "tensorboard"))
        self._w.add_text("config", "```\n" + json.dumps(config, indent=2, default=str) + "\n```", 0)

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        for k, v in scalars.items():
            self._w.add_scalar(k, v, step)
        self._w.flush()

    def log_table(self, step: int, name: str, columns: list[str], rows: list[list[Any]]) -> None:
        self._w.add_text(name, markdown_table(columns, rows), step)

    def close(self) -> None:
        self._w.close()


def _wandb_settings(wandb):
    """Quiet settings: no console capture, no system-stats sampling (older versions: just silent)."""
    try:
        return wandb.Settings(silent=True, console="off", x_disable_stats=True)
    except Exception:  # a wandb without these settings
        return wandb.Settings(silent=True)


@register_logger
class WandbLogger(ExperimentLogger):
    name = "wandb"
    package = "wandb"
    pip = "wandb"

    def __init__(self, run_dir: Path, *, project: str, run_name: str, config: dict, resume: bool) -> None:
        super().__init__(run_dir, project=project, run_name=run_name, config=config, resume=resume)
        import wandb

        self._wandb = wandb
        id_file = _run_id_file(self.run_dir, "wandb")
        run_id = id_file.read_text().strip() if resume and id_file.exists() else None
        self._run = wandb.init(
            mode=os.environ.get("WANDB_MODE", "offline"),
            dir=str(self.run_dir),
            project=project,
            name=run_name,
            id=run_id,
            resume="allow" if run_id else None,
            config=config,
            settings=_wandb_settings(wandb),
        )
        id_file.write_text(self._run.id)

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        self._run.log(dict(scalars), step=step)

    def log_table(self, step: int, name: str, columns: list[str], rows: list[list[Any]]) -> None:
        self._run.log({name: self._wandb.Table(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        self._run.finish()


_MLFLOW_BAD = re.compile(r"[^\w/.\- :]")


def mlflow_key(key: str) -> str:
    """A metric/param name MLflow accepts: ``@`` -> ``_at_``, other invalid characters -> ``_``."""
    return _MLFLOW_BAD.sub("_", key.replace("@", "_at_"))


def _flatten(d: dict, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v and prefix.count(".") < 1:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = json.dumps(v, default=str) if isinstance(v, dict | list) else str(v)
    return out


@register_logger
class MLflowLogger(ExperimentLogger):
    name = "mlflow"
    package = "mlflow"
    pip = "mlflow"

    def __init__(self, run_dir: Path, *, project: str, run_name: str, config: dict, resume: bool) -> None:
        super().__init__(run_dir, project=project, run_name=run_name, config=config, resume=resume)
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            store = (self.run_dir / "mlruns").resolve()
            store.mkdir(parents=True, exist_ok=True)
            uri = store.as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow import MlflowClient
        from mlflow.entities import Metric, Param

        self._metric, self._param = Metric, Param
        self._client = MlflowClient(tracking_uri=uri)
        exp = self._client.get_experiment_by_name(project)
        exp_id = exp.experiment_id if exp is not None else self._client.create_experiment(project)
        id_file = _run_id_file(self.run_dir, "mlflow")
        if resume and id_file.exists():
            self.run_id = id_file.read_text().strip()
            self._client.update_run(self.run_id, status="RUNNING")
        else:
            self.run_id = self._client.create_run(exp_id, run_name=run_name).info.run_id
            id_file.write_text(self.run_id)
            self._client.log_dict(self.run_id, config, "config.json")
            params = [Param(mlflow_key(k), v[:6000]) for k, v in _flatten(config).items()]
            for i in range(0, len(params), 100):
                self._client.log_batch(self.run_id, params=params[i : i + 100])

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        ts = int(time.time() * 1000)
        metrics = [self._metric(mlflow_key(k), float(v), ts, step) for k, v in scalars.items()]
        for i in range(0, len(metrics), 1000):
            self._client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def log_table(self, step: int, name: str, columns: list[str], rows: list[list[Any]]) -> None:
        data = {c: [r[j] for r in rows] for j, c in enumerate(columns)}
        self._client.log_table(self.run_id, data=data, artifact_file=f"{name}/step_{step}.json")

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


@register_logger
class TrackioLogger(ExperimentLogger):
    name = "trackio"
    package = "trackio"
    pip = "trackio"

    def __init__(self, run_dir: Path, *, project: str, run_name: str, config: dict, resume: bool) -> None:
        super().__init__(run_dir, project=project, run_name=run_name, config=config, resume=resume)
        os.environ.setdefault("TRACKIO_DIR", str((self.run_dir / "trackio").resolve()))
        self._trackio = importlib.import_module("trackio")
        with contextlib.redirect_stdout(io.StringIO()):
            self._run = self._trackio.init(
                project=project,
                name=run_name,
                config=config,
                resume="allow" if resume else "never",
                embed=False,
                auto_log_gpu=False,
                auto_log_cpu=False,
            )

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        self._run.log(dict(scalars), step=step)

    def log_table(self, step: int, name: str, columns: list[str], rows: list[list[Any]]) -> None:
        self._run.log({name: self._trackio.Table(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        current = importlib.import_module("trackio.context_vars").current_run
        with contextlib.redirect_stdout(io.StringIO()):
            if current.get() is self._run:
                self._trackio.finish()  # also clears the current run (trackio's atexit would finish it again)
            else:
                self._run.finish()


__all__ = [
    "EXPERIMENT_LOGGERS",
    "ExperimentLogger",
    "JsonlLogger",
    "LoggerUnavailableError",
    "check_loggers",
    "list_loggers",
    "make_loggers",
    "markdown_table",
    "mlflow_key",
    "register_logger",
]
