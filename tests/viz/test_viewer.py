"""The run viewer without a browser: tolerant reading, text view, HTML, local server, plots."""

from __future__ import annotations

import json
import math
import re
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

from horizonrl.cli import main
from horizonrl.train.records.rollout_log import credit_records, write_rollout_log
from horizonrl.trajectory import Group, Rollout, Segment, Span, Turn, build_rows
from horizonrl.viz.data import Run, credit_sign, read_rollout_file, step_payload
from horizonrl.viz.html import build_html
from horizonrl.viz.plot import plot_curves, plot_runs, seed_band
from horizonrl.viz.serve import ViewerServer


def _rollout(uid, reward, text="<answer>7</answer>"):
    t0 = Turn([1, 2, 3], [4, 5], [-0.5, -0.25], response_text="call", observation="obs one", tool_calls=1)
    t1 = Turn(
        [1, 2, 3, 4, 5, 6, 7],
        [8, 9, 10],
        [-1.0, -0.1, -0.2],
        response_text=text,
        spans=[Span("answer", 0, 3)],
    )
    comp = Turn(
        [20, 21], [22, 23], [-0.3, -0.4], response_text="<summary>s</summary>", spans=[Span("summary", 0, 2)]
    )
    segs = [Segment(turns=[t0, t1]), Segment("compaction", [comp], parent=0, fork_index=0)]
    return Rollout(uid, "task-a", "g0", segs, reward=reward, success=reward > 0, final_answer="7")


@pytest.fixture
def run_dir(tmp_path):
    """A run directory with one annotated step (GRPO credit) and a metrics file."""
    ros = [_rollout("s1-0-0", 1.0), _rollout("s1-0-1", 0.0, text="</script><script>alert(1)</script>")]
    from horizonrl import credit

    adv = credit.get_estimator("grpo")([Group("g0", "task-a", ros)])
    write_rollout_log(
        tmp_path / "rollouts" / "step_1.jsonl",
        ros,
        credit_records(ros, adv, build_rows(ros, adv), None, estimator="grpo"),
    )
    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"step": 0, "eval/pass@1": 0.25})
        + "\n"
        + json.dumps({"step": 1, "reward/mean": 0.5})
        + "\n"
    )
    (tmp_path / "config.yaml").write_text("algo: {estimator: grpo}\ntrain: {trainer: group}\n")
    return tmp_path


def test_truncated_last_line_and_unknown_field_are_reported_and_the_rest_kept(run_dir, capsys):
    path = run_dir / "rollouts" / "step_1.jsonl"
    lines = path.read_text().splitlines()
    extra = json.loads(lines[0])
    extra["from_the_future"] = True
    path.write_text("\n".join([json.dumps(extra), "not json", lines[1], lines[1][:50]]) + "\n")
    f = read_rollout_file(path)
    assert [r.uid for r in f.rollouts] == ["s1-0-0", "s1-0-1"]
    assert any(p.startswith(f"{path}:1: unknown field(s) ['from_the_future'] ignored") for p in f.problems)
    assert any(p.startswith(f"{path}:2: not valid JSON") and p.endswith("skipped") for p in f.problems)
    assert any(p.startswith(f"{path}:4: not valid JSON") and p.endswith("skipped") for p in f.problems)
    # A torn last line (no newline: an interrupted write) is named as such.
    path.write_text("\n".join([lines[0], lines[1], lines[1][:50]]))
    torn = read_rollout_file(path)
    assert len(torn.rollouts) == 2 and any(
        f"{path}:3: the last line is incomplete" in p for p in torn.problems
    )
    path.write_text("\n".join([json.dumps(extra), "not json", lines[1], lines[1][:50]]) + "\n")
    assert main(["view", str(path)]) == 0
    cap = capsys.readouterr()
    assert cap.out.splitlines()[:4] == [
        "=== rollout s1-0-0 task=task-a reward=1.0 success=True end=done",
        "--- segment 0 (normal)",
        "[turn 0] assistant (2 tokens): call",
        "[turn 0] observation: obs one",
    ]
    assert cap.out.count("=== rollout") == 2
    assert "step_1.jsonl:4: not valid JSON" in cap.err and "from_the_future" in cap.err
    assert main(["view", str(path), "--index", "1"]) == 0
    assert capsys.readouterr().out.startswith("=== rollout s1-0-1 ")


def test_step_payload_is_compact_and_exact(run_dir):
    st = step_payload(Run(run_dir), "step_1")
    r0, r1 = st["R"]
    t0, t1 = r0["S"][0]["T"]
    assert st["P"][t0["pi"]] == [1, 2, 3] and "p" not in t0  # full prompt, shared table
    assert t1["p"] == [6, 7] and "pi" not in t1  # prompt 2 extends prompt 1 + response: only env tokens
    assert r0["S"][1]["T"][0]["pi"] != t0["pi"] and r1["S"][0]["T"][0]["pi"] == t0["pi"]  # deduplicated
    a = 0.5 / (np.std([1.0, 0.0], ddof=1) + 1e-6)
    assert t0["a"] == pytest.approx(a) and r1["S"][0]["T"][1]["a"] == pytest.approx(-a)
    assert (r0["sg"], r1["sg"]) == ("+", "-") and r0["am"] == pytest.approx(a)
    assert [t0["row"], t1["row"], r0["S"][1]["T"][0]["row"]] == [0, 0, 1]
    assert t1["sp"] == [["answer", 0, 3, None]] and t0["lp"] == [-0.5, -0.25]
    assert credit_sign([[1.0, None], [[[0.0, 2], [-1.0, 1]]]]) == ("±", pytest.approx(0.0))
    assert credit_sign([[None]]) == (None, None)


def test_html_is_self_contained_and_escapes_payloads(run_dir):
    html, problems = build_html(run_dir)
    assert "no tokenizer found" in " ".join(problems)  # the fixture run has no tokenizer: ids are shown
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)  # nothing fetched from a network
    assert "<link" not in html and "@import" not in html and "cdn" not in html.lower()
    # index, 1 step, mode, viewer: the payload's "</script>" did not close a block
    assert html.count("<script") == html.count("</script>") == 4
    assert "alert(1)" in html and "</script><script>alert" not in html
    blocks = dict(re.findall(r'<script type="application/json" id="([^"]+)">(.*?)</script>', html, re.S))
    assert set(blocks) == {"hz-index", "hz-step-step_1"}
    index = json.loads(blocks["hz-index"])
    assert index["estimator"] == "grpo" and [s["key"] for s in index["steps"]] == ["step_1"]
    assert json.loads(blocks["hz-step-step_1"]) == step_payload(Run(run_dir), "step_1")


def test_local_server_lists_steps_and_serves_them(run_dir):
    server = ViewerServer(run_dir, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert server.url.startswith("http://127.0.0.1:")
        page = urllib.request.urlopen(server.url).read().decode()
        assert 'window.HZ_MODE = "serve"' in page and 'type="application/json"' not in page
        index = json.loads(urllib.request.urlopen(server.url + "api/index").read())
        assert [s["key"] for s in index["steps"]] == ["step_1"] and index["steps"][0]["metrics"][
            "reward/mean"
        ] == 0.5
        st = json.loads(urllib.request.urlopen(server.url + "api/step/step_1").read())
        assert st == step_payload(Run(run_dir), "step_1")
        # A step written while the server runs appears without a restart.
        (run_dir / "rollouts" / "step_2.jsonl").write_text(
            (run_dir / "rollouts" / "step_1.jsonl").read_text()
        )
        index = json.loads(urllib.request.urlopen(server.url + "api/index").read())
        assert [s["key"] for s in index["steps"]] == ["step_1", "step_2"]
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(server.url + "api/step/step_9")
        assert e.value.code == 404
    finally:
        server.shutdown()
        server.server_close()


def _one_error_line(capsys, code: int) -> str:
    cap = capsys.readouterr()
    assert code == 2, cap.err
    lines = [ln for ln in cap.err.splitlines() if ln.strip()]
    assert "Traceback" not in cap.err and len(lines) == 1 and not cap.out, cap
    assert lines[0].startswith("horizonrl: error: "), cap.err
    return lines[0]


@pytest.mark.parametrize("serve", [False, True])
def test_view_of_a_directory_without_a_run_is_one_error_and_writes_nothing(tmp_path, capsys, serve):
    empty = tmp_path / "notes"
    empty.mkdir()
    (empty / "todo.txt").write_text("not a run\n")
    line = _one_error_line(capsys, main(["view", str(empty), *(["--serve"] if serve else [])]))
    assert line == (
        f"horizonrl: error: {empty} holds no run (no metrics.jsonl, rollouts/ or config.yaml); "
        "expected a run directory or a rollouts/*.jsonl file"
    )
    assert "tokenizer" not in line and [p.name for p in empty.iterdir()] == ["todo.txt"]  # no viewer.html
    # The rollouts/ folder itself is not the run either; the message points at the run above it.
    run = tmp_path / "run"
    (run / "rollouts").mkdir(parents=True)
    (run / "rollouts" / "step_1.jsonl").write_text("")
    line = _one_error_line(capsys, main(["view", str(run / "rollouts")]))
    assert line.endswith(f"it holds rollouts files: view one of them, or the run directory {run.resolve()}")
    assert sorted(p.name for p in (run / "rollouts").iterdir()) == ["step_1.jsonl"]
    # The Python entry points refuse it the same way, before reading anything or binding a port.
    with pytest.raises(FileNotFoundError, match="holds no run"):
        build_html(empty)
    with pytest.raises(FileNotFoundError, match="holds no run"):
        ViewerServer(empty, port=0)


def test_view_of_a_missing_path_or_a_file_without_rollouts_is_one_error(run_dir, tmp_path, capsys):
    missing = tmp_path / "nope"
    line = _one_error_line(capsys, main(["view", str(missing), "--out", str(tmp_path / "v.html")]))
    assert line == (
        f"horizonrl: error: {missing} does not exist; expected a run directory or a rollouts/*.jsonl file"
    )
    assert not missing.exists() and not (tmp_path / "v.html").exists()
    notes = tmp_path / "notes.txt"
    notes.write_text('{"uid": "looks like json"}\n')
    line = _one_error_line(capsys, main(["view", str(notes)]))
    assert line == (
        f"horizonrl: error: {notes} is not a rollouts file (*.jsonl); "
        "expected a run directory or a rollouts/*.jsonl file"
    )
    # A .jsonl file of other records (the run's metrics) or of no JSON at all holds no rollouts.
    metrics = run_dir / "metrics.jsonl"
    line = _one_error_line(capsys, main(["view", str(metrics)]))
    assert line == (
        f"horizonrl: error: {metrics} holds no rollouts: none of its 2 record(s) has a uid or segments; "
        "expected a run directory or a rollouts/*.jsonl file"
    )
    text = tmp_path / "text.jsonl"
    text.write_text("hello\nworld\n")
    line = _one_error_line(capsys, main(["view", str(text)]))
    assert line.startswith(f"horizonrl: error: {text} holds no rollouts: {text}:1: not valid JSON")
    assert "(and 1 more bad line)" in line
    # An empty rollouts file (a step with nothing saved yet) is still shown, as nothing.
    empty = tmp_path / "step_9.jsonl"
    empty.write_text("")
    assert main(["view", str(empty)]) == 0
    assert capsys.readouterr() == ("", "")
    # A run directory with only its config (a fresh run still in its first evaluation) is a run.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "config.yaml").write_text("train: {trainer: group}\n")
    assert main(["view", str(fresh)]) == 0
    assert (fresh / "viewer.html").is_file()


def _metrics_dir(path, rows):
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_plot_runs_overlays_runs_in_png_and_svg(tmp_path, capsys):
    def rows(scale):
        out = [{"step": 0, "eval/pass@1": 0.1 * scale}]
        for s in range(1, 6):
            out.append(
                {
                    "step": s,
                    "reward/mean": scale * s / 10,
                    "rollout/sessions_mean": 1 + s / 5,
                    "train/ratio_geomean": 1.0,
                    "throughput/tokens_per_s": 100.0 * scale,
                    "time/rollout_s": 1.0,
                    "time/credit_s": 0.1,
                    "time/update_s": 0.5,
                }
            )
        out.append({"step": 5, "eval/pass@1": 0.3 * scale})
        return out

    a, b = _metrics_dir(tmp_path / "run-a", rows(1)), _metrics_dir(tmp_path / "run-b", rows(2))
    with pytest.warns(UserWarning, match="panel 'kl' left out"):
        paths = plot_runs([a, b], tmp_path / "out" / "curves")
    assert [p.name for p in paths] == ["curves.png", "curves.svg"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = paths[1].read_text()
    assert "run-a" in svg and "run-b" in svg and "held-out pass@1" in svg and "step time split" in svg
    assert (
        main(
            [
                "plot",
                str(a),
                str(b),
                "--out",
                str(tmp_path / "cli"),
                "--keys",
                "reward,time",
                "--labels",
                "A,B",
            ]
        )
        == 0
    )
    assert "cli.svg" in capsys.readouterr().out
    svg = (tmp_path / "cli.svg").read_text()
    assert "<!-- A -->" in svg and "<!-- B -->" in svg and "held-out" not in svg  # only the asked panels
    assert main(["plot", str(tmp_path / "nope")]) == 2


def test_seed_band_by_hand_and_plot_curves(tmp_path):
    dirs = [
        _metrics_dir(tmp_path / f"seed{i}", [{"step": 1, "x": v}, {"step": 2, "x": 2 * v}])
        for i, v in enumerate([1.0, 2.0, 3.0])
    ]
    steps, mean, lo, hi = seed_band(dirs, "x")
    assert steps == [1, 2] and np.allclose(mean, [2.0, 4.0])
    half = 4.303 * np.array([1.0, 2.0]) / math.sqrt(3)  # t_{0.975, 2} * sd / sqrt(n); sd = 1 and 2
    assert np.allclose(lo, mean - half) and np.allclose(hi, mean + half)
    assert seed_band(dirs, "x", band="minmax")[2].tolist() == [1.0, 2.0]
    assert seed_band(dirs[:1], "x")[2] is None
    paths = plot_curves(
        {"method": (steps, mean, lo, hi)}, tmp_path / "band.svg", ylabel="x", formats=("svg",)
    )
    assert paths == [tmp_path / "band.svg"] and "method" in paths[0].read_text()
