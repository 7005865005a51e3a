"""Experiment loggers (train.loggers), each backend offline, and metrics.jsonl robustness."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
import warnings

import pytest

from horizonrl.cli import main
from horizonrl.config import LOGGERS, load_config
from horizonrl.train.records import loggers as lg
from horizonrl.train.records.metrics import MetricsLogger, TornLineWarning, read_metrics
from horizonrl.trajectory import Rollout, Segment, Turn

TINY = [
    "env.name=arithmetic",
    "env.train_tasks=8",
    "env.test_tasks=1",
    "rollout.group_size=2",
    "rollout.tasks_per_step=2",
    "rollout.max_new_tokens=8",
    "rollout.max_turns=2",
    "train.eval_samples=1",
    "train.progress=false",
]
STEPS = [(0, {"reward/mean": 0.25, "eval/pass@1": 0.5}), (1, {"reward/mean": 0.75, "train/kl": 0.01})]


def _rollouts():
    turn = Turn([1, 2], [3, 4], [-0.1, -0.2], response_text="<answer>7</answer>", observation="Correct.")
    return [
        Rollout(f"s1-0-{i}", "task-a", "s1-0", [Segment(turns=[turn])], reward=float(i % 2)) for i in range(4)
    ]


def _log(run_dir, name, project="horizonrl"):
    config = {"algo": {"estimator": "grpo"}}
    m = MetricsLogger(run_dir, loggers=["jsonl", name], config=config, project=project, rollout_sample=2)
    for step, scalars in STEPS:
        m.log(step, scalars)
    m.log_rollouts(1, _rollouts())
    m.close()
    assert [r["reward/mean"] for r in read_metrics(run_dir)] == [0.25, 0.75]


def test_config_logger_names_match_the_registry():
    assert tuple(lg.list_loggers()) == LOGGERS
    cfg = load_config(None, ["train.loggers=[mlflow]", "train.tensorboard=true"])
    assert cfg.train.logger_names == ["jsonl", "mlflow", "tensorboard"]  # jsonl always, the alias appended


def test_tensorboard_backend(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _log(tmp_path, "tensorboard")
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("reward/mean")] == [(0, 0.25), (1, 0.75)]
    texts = {t for t in acc.Tags()["tensors"]}
    assert any(t.startswith("config") for t in texts) and any(t.startswith("rollouts") for t in texts)


def _wandb_records(run_dir):
    """Records of an offline ``run-*.wandb`` file (LevelDB-style log: 32 KiB blocks, 7-byte chunk headers)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data, pos, block, out, buf = path.read_bytes(), 7, 32768, [], b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:
            out.append(chunk)
        elif kind in (2, 3):
            buf = (buf if kind == 3 else b"") + chunk
        elif kind == 4:
            out.append(buf + chunk)
    records = []
    for raw in out:
        r = pb.Record()
        r.ParseFromString(raw)
        records.append(r)
    return records


def test_wandb_backend_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    _log(tmp_path, "wandb")
    deadline = time.monotonic() + 30
    while True:  # wandb's service process writes the file out after finish() returns
        recs = _wandb_records(tmp_path)
        if any(r.WhichOneof("record_type") == "exit" for r in recs) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    history = {}
    for r in recs:
        if r.WhichOneof("record_type") == "history":
            items = {it.key or "/".join(it.nested_key): json.loads(it.value_json) for it in r.history.item}
            history.setdefault(r.history.step.num, {}).update(items)
    assert history[0]["reward/mean"] == 0.25 and history[0]["eval/pass@1"] == 0.5
    assert history[1]["reward/mean"] == 0.75 and history[1]["train/kl"] == 0.01
    (run,) = [r.run for r in recs if r.WhichOneof("record_type") == "run"]
    config = {it.key: json.loads(it.value_json) for it in run.config.update}
    assert config["algo"] == {"estimator": "grpo"} and run.project == "horizonrl"
    (table,) = tmp_path.glob("wandb/offline-run-*/files/media/table/rollouts_*.table.json")
    t = json.loads(table.read_text())
    assert t["columns"][:4] == ["step", "uid", "task_id", "reward"]
    assert [row[1] for row in t["data"]] == ["s1-0-0", "s1-0-2"]  # 2 of 4, evenly spaced


def test_mlflow_backend_local_file_store(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    _log(tmp_path, "mlflow", project="hz-test")
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    run_id = (tmp_path / ".mlflow_run_id").read_text()
    hist = client.get_metric_history(run_id, "reward/mean")
    assert [(m.step, m.value) for m in hist] == [(0, 0.25), (1, 0.75)]
    assert [m.value for m in client.get_metric_history(run_id, "eval/pass_at_1")] == [0.5]
    run = client.get_run(run_id)
    assert run.data.params["algo.estimator"] == "grpo" and run.info.status == "FINISHED"
    (table,) = (tmp_path / "mlruns").rglob("artifacts/rollouts/step_1.json")
    t = json.loads(table.read_text())
    assert t["columns"][:2] == ["step", "uid"] and [row[1] for row in t["data"]] == ["s1-0-0", "s1-0-2"]


def test_trackio_backend_local(tmp_path, monkeypatch):
    pytest.importorskip("trackio")
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    project = f"hz-test-{uuid.uuid4().hex[:8]}"
    _log(tmp_path, "trackio", project=project)
    from trackio import utils  # TRACKIO_DIR is read when trackio is first imported

    db = sqlite3.connect(utils.TRACKIO_DIR / f"{project}.db")
    rows = [(step, json.loads(m)) for step, m in db.execute("select step, metrics from metrics order by id")]
    assert (0, {"reward/mean": 0.25, "eval/pass@1": 0.5}) in rows
    assert (1, {"reward/mean": 0.75, "train/kl": 0.01}) in rows
    tables = [m["rollouts"] for _, m in rows if "rollouts" in m]
    assert tables and [r["uid"] for r in tables[0]["_value"]] == ["s1-0-0", "s1-0-2"]
    (cfg,) = [json.loads(c) for (c,) in db.execute("select config from configs")]
    assert cfg["algo"] == {"estimator": "grpo"}


def test_missing_logger_package_fails_at_start_with_the_pip_command(tmp_path, monkeypatch, capsys):
    real = lg.importlib.util.find_spec
    monkeypatch.setattr(lg.importlib.util, "find_spec", lambda name: None if name == "wandb" else real(name))
    with pytest.raises(
        lg.LoggerUnavailableError, match=r"'wandb' needs the wandb package: pip install wandb"
    ):
        lg.check_loggers(["jsonl", "wandb"])
    out = tmp_path / "run"
    rc = main(["train", "train.loggers=[wandb]", f"train.out_dir={out}", "train.steps=1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "pip install wandb" in err[0]
    assert not out.exists()  # failed before the model was built or anything was written


def test_resume_drops_a_torn_last_line_with_a_warning(tmp_path):
    good = [json.dumps({"step": s, "reward/mean": s / 10}) for s in range(4)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(good) + '\n{"step": 4, "reward/me')
    with pytest.warns(TornLineWarning, match=r"metrics.jsonl:5: dropped a torn or non-JSON line"):
        recs = read_metrics(tmp_path)
    assert [r["step"] for r in recs] == [0, 1, 2, 3]
    with pytest.warns(TornLineWarning, match=r":5:"):
        m = MetricsLogger(tmp_path, resume_step=2)
    m.log(3, {"reward/mean": 0.9})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kept = [(r["step"], r["reward/mean"]) for r in read_metrics(tmp_path)]
    assert kept == [(0, 0.0), (1, 0.1), (2, 0.2), (3, 0.9)]


def test_trainer_logs_to_mlflow_and_tensorboard(tiny_model_dir, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    pytest.importorskip("tensorboard")
    from mlflow import MlflowClient

    from horizonrl.train.trainers.registry import make_trainer

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    overrides = [
        *TINY,
        "train.steps=2",
        "train.loggers=[jsonl, mlflow]",
        "train.tensorboard=true",
        "train.log_rollouts=3",
    ]
    cfg = load_config(None, [f"model.path={tiny_model_dir}", *overrides, f"train.out_dir={tmp_path}"])
    make_trainer(cfg).fit()
    recs = read_metrics(tmp_path)
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    run_id = (tmp_path / ".mlflow_run_id").read_text()
    hist = client.get_metric_history(run_id, "reward/mean")
    assert [(m.step, m.value) for m in hist] == [
        (r["step"], r["reward/mean"]) for r in recs if "reward/mean" in r
    ]
    assert json.loads(client.get_run(run_id).data.params["rollout.group_size"]) == 2
    for step in (1, 2):
        (t,) = (tmp_path / "mlruns").rglob(f"artifacts/rollouts/step_{step}.json")
        assert len(json.loads(t.read_text())["data"]) == 3
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
