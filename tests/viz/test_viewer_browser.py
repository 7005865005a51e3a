"""The HTML viewer of a real tiny run, driven in a real browser (Debian's Chromium through Playwright).

Chromium comes from the Debian package (``apt-get install -y chromium``; tried here when missing and
running as root); Playwright only drives it (``executable_path``), it never downloads a browser. Without
either, the tests are skipped with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from importlib import resources

import pytest

from horizonrl.config import load_config
from horizonrl.train.records.rollout_log import decode_advantages
from horizonrl.train.trainers.group import GroupTrainer
from horizonrl.viz.html import write_html
from horizonrl.viz.serve import ViewerServer

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
POS, NEG = (33, 102, 172), (178, 24, 43)


def _find_chromium() -> tuple[str | None, str]:
    for name in ("chromium", "chromium-browser"):
        if path := shutil.which(name):
            return path, ""
    reason = "Chromium is not installed (apt-get install -y chromium)"
    if (
        hasattr(os, "geteuid")
        and os.geteuid() == 0
        and shutil.which("apt-get")
        and not os.environ.get("HORIZONRL_NO_APT")
    ):
        try:
            r = subprocess.run(
                ["apt-get", "install", "-y", "--no-install-recommends", "chromium"],
                capture_output=True,
                text=True,
                timeout=600,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, f"{reason}; installing it failed: {e}"
        if path := shutil.which("chromium"):
            return path, ""
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
        reason = f"{reason}; apt-get install -y chromium failed: {tail[0]}"
    return None, reason


@pytest.fixture(scope="module")
def browser():
    path, reason = _find_chromium()
    if path is None:
        pytest.skip(reason)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright; it drives the system Chromium)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, headless=True, args=FLAGS)  # a fresh temporary profile
        yield b
        b.close()


@pytest.fixture(scope="module")
def compaction_run(tiny_model_dir, tmp_path_factory):
    """Two real steps of the Mosaic compaction config on the tiny model.

    An untrained model rarely writes a parseable ``<summary>``, and a failed compaction is removed from
    the rollout by default; ``keep_failed`` (the paper's ablation) keeps it, so every rollout that hits
    the session limit carries a compaction session for the viewer to draw, whatever the model writes."""
    out = tmp_path_factory.mktemp("browser_run")
    path = resources.files("horizonrl") / "configs" / "mosaic_compaction_lookup.yaml"
    small = [
        "rollout.group_size=2",
        "rollout.tasks_per_step=2",
        "train.steps=2",
        "train.eval_samples=1",
        "env.test_tasks=2",
        "env.train_tasks=20",
        "train.progress=false",
        "rollout.context_params.keep_failed=true",
    ]
    cfg = load_config(str(path), [*small, f"train.init={tiny_model_dir}", f"train.out_dir={out}"])
    GroupTrainer(cfg).fit()
    return out


def _colour(a: float, m: float) -> str:
    """The legend's diverging scale, written independently of viewer.js: white->blue (+), white->red (-)."""
    t = max(-1.0, min(1.0, a / m if m > 0 else 0.0))
    c, k = (POS if t >= 0 else NEG), abs(t) * 0.9
    return "rgb({}, {}, {})".format(*(round(255 + (ci - 255) * k) for ci in c))


def _records(run, step):
    return [json.loads(ln) for ln in (run / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]


def test_viewer_shows_dag_spans_and_coloured_tokens(browser, compaction_run, tmp_path):
    html, problems = write_html(compaction_run, tmp_path / "viewer.html")
    assert problems == []
    step, recs = next(
        (s, r)
        for s in (1, 2)
        for r in [_records(compaction_run, s)]
        if any(seg["kind"] == "compaction" for rec in r for seg in rec["segments"])
    )
    i, rec = next((i, r) for i, r in enumerate(recs) if any(s["kind"] == "compaction" for s in r["segments"]))
    scale = max(
        abs(v)
        for r in recs
        for seg in r["credit"]["advantages"]
        for a in seg
        for v in ([a] if isinstance(a, float | int) else [x for x, _ in a])
    )

    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(html.as_uri())
    page.wait_for_function("document.body.dataset.ready === '1'")
    page.click(f"#hz-steps .step[data-key='step_{step}']")
    page.wait_for_selector(f"#hz-list .ro[data-uid='{rec['uid']}']")
    page.click(f"#hz-list .ro[data-uid='{rec['uid']}']")
    page.wait_for_selector(f"#hz-detail h2:text-is('{rec['uid']}')")
    assert page.evaluate("location.hash") == f"#/step_{step}/{i}"

    # Session DAG: one node per session with its kind, one edge per parent link, the compaction edge labelled.
    kinds = page.eval_on_selector_all(".dag svg .node", "els => els.map(e => e.dataset.kind)")
    assert kinds == [s["kind"] for s in rec["segments"]] and "compaction" in kinds
    edges = page.eval_on_selector_all(".dag svg .edge", "els => els.map(e => [e.dataset.from, e.dataset.to])")
    assert edges == [
        [f"s{s['parent']}", f"s{k}"] for k, s in enumerate(rec["segments"]) if s["parent"] is not None
    ]
    assert "compact #0" in page.text_content(".dag svg")

    # Spans: the compaction session's summary span over its recorded token range.
    comp = next(k for k, s in enumerate(rec["segments"]) if s["kind"] == "compaction")
    want = [
        [sp["label"], sp["start"], sp["end"]] for t in rec["segments"][comp]["turns"] for sp in t["spans"]
    ]
    got = page.eval_on_selector_all(
        f".session[data-seg='{comp}'] .spanwrap",
        "els => els.map(e => [e.dataset.label, +e.dataset.start, +e.dataset.end])",
    )
    assert got == want and want and want[0][0] == "summary"

    # Tokens: every response token, its id, the estimator's advantage, coloured on the legend's scale.
    toks = page.eval_on_selector_all(
        ".session .response .tk",
        "els => els.map(e => [+e.closest('.session').dataset.seg, +e.dataset.i, e.dataset.a, "
        "e.style.backgroundColor])",
    )
    expect = []
    for s, seg in enumerate(rec["segments"]):
        for t, turn in enumerate(seg["turns"]):
            adv = decode_advantages(rec["credit"]["advantages"][s][t], len(turn["response_ids"]))
            expect += [(s, tok, float(a)) for tok, a in zip(turn["response_ids"], adv, strict=True)]
    assert [(s, i_, float(a)) for s, i_, a, _ in toks] == expect
    assert [bg for *_, bg in toks] == [_colour(a, scale) for *_, a in expect]
    assert float(page.get_attribute(".legend", "data-scale")) == pytest.approx(scale)
    n_rows = len({r for seg in rec["credit"]["rows"] for r in seg})
    assert page.locator("#hz-detail .rowmark").count() == n_rows  # one marker where each training row starts

    # Filters: failures only, then a search that matches nothing.
    page.select_option("select[data-filter='success']", "no")
    n_fail = sum(not r["success"] for r in recs)
    page.wait_for_function(f"document.querySelectorAll('#hz-list .ro').length === {n_fail}")
    page.fill("input[data-filter='q']", "zzz-no-such-text")
    page.press("input[data-filter='q']", "Enter")
    page.wait_for_function("document.querySelectorAll('#hz-list .ro').length === 0")
    page.select_option("select[data-filter='success']", "any")
    page.fill("input[data-filter='q']", "")
    page.press("input[data-filter='q']", "Enter")
    page.wait_for_function(f"document.querySelectorAll('#hz-list .ro').length === {len(recs)}")

    shot = tmp_path / "viewer.png"
    page.screenshot(path=str(shot), full_page=False)
    assert shot.read_bytes()[:4] == b"\x89PNG" and errors == []
    page.close()


def test_served_viewer_lists_the_steps(browser, compaction_run):
    server = ViewerServer(compaction_run, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    page = browser.new_page()
    try:
        page.goto(server.url)
        page.wait_for_function("document.body.dataset.ready === '1'")
        assert page.eval_on_selector_all("#hz-steps .step", "els => els.map(e => e.dataset.key)") == [
            "step_1",
            "step_2",
        ]
        page.click("#hz-list .ro")
        page.wait_for_selector("#hz-detail .dag svg .node")
        assert page.locator("#hz-detail .session").count() >= 1
    finally:
        page.close()
        server.shutdown()
        server.server_close()


def _quickstart_sized_run(root, tokenizer_dir, steps=40, tasks=16, group=8):
    """A run directory shaped like the 40-step quickstart (128 rollouts a step, 258-token prompts)."""
    import numpy as np

    from horizonrl.trajectory import Rollout, Segment, Turn

    rng = np.random.default_rng(0)
    (root / "checkpoints" / "step_40").mkdir(parents=True)
    shutil.copy(tokenizer_dir / "tokenizer.json", root / "checkpoints" / "step_40" / "tokenizer.json")
    (root / "config.yaml").write_text("algo: {estimator: grpo}\n")
    metrics = []
    for step in range(1, steps + 1):
        ros, notes = [], []
        for t in range(tasks):
            prompt = rng.integers(3, 390, 258).tolist()
            rewards = rng.integers(0, 2, group).astype(float)
            adv = (rewards - rewards.mean()) / (rewards.std(ddof=1) + 1e-6) if rewards.std() else 0 * rewards
            for k in range(group):
                r0, r1 = rng.integers(3, 390, 32).tolist(), rng.integers(3, 390, 5).tolist()
                t0 = Turn(prompt, r0, (-rng.random(32)).tolist(), response_text="call", observation="42")
                t1 = Turn(
                    prompt + r0 + rng.integers(3, 390, 12).tolist(),
                    r1,
                    (-rng.random(5)).tolist(),
                    response_text="<answer>42</answer>",
                )
                ros.append(
                    Rollout(
                        f"s{step}-{t}-{k}",
                        f"task-{t}",
                        f"s{step}-{t}",
                        [Segment(turns=[t0, t1])],
                        reward=rewards[k],
                        success=bool(rewards[k]),
                    )
                )
                notes.append(
                    {
                        "v": 1,
                        "estimator": "grpo",
                        "advantages": [[float(adv[k])] * 2],
                        "rows": [[len(ros) - 1] * 2],
                    }
                )
        from horizonrl.train.records.rollout_log import write_rollout_log

        write_rollout_log(root / "rollouts" / f"step_{step}.jsonl", ros, notes)
        metrics.append(json.dumps({"step": step, "reward/mean": float(np.mean([r.reward for r in ros]))}))
    (root / "metrics.jsonl").write_text("\n".join(metrics) + "\n")
    return root


@pytest.mark.slow
def test_forty_step_quickstart_sized_run_opens_in_under_two_seconds(browser, tiny_model_dir, tmp_path):
    run = _quickstart_sized_run(tmp_path / "run", tiny_model_dir)
    html, _ = write_html(run, tmp_path / "viewer.html")
    assert html.stat().st_size < 20e6
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    page.goto(html.as_uri() + "#/step_40/5")
    page.wait_for_function("document.body.dataset.ready === '1'")
    ready_ms = page.evaluate(
        "window.HZ_READY"
    )  # from navigation start: HTML parsed, step 40 listed, rollout drawn
    assert page.locator("#hz-list .ro").count() == 128 and page.locator("#hz-detail .tk").count() == 37
    assert ready_ms < 2000, f"opened in {ready_ms:.0f} ms"
    page.close()
