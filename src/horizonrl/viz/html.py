"""``horizonrl view RUN_DIR``: one self-contained HTML file (no network: script and styles inline).

The run's index and each step's payload (:mod:`.data`) are embedded as
``<script type="application/json">`` blocks, which the browser does not parse
as JavaScript; the viewer ``JSON.parse``\\ s a step only when it is opened, so a
large run opens as fast as its index. ``<`` is escaped in the JSON, so no
payload can close its block.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

from horizonrl.viz.data import Run, index_payload, step_payload


def asset(name: str) -> str:
    """The text of ``horizonrl/viz/static/<name>`` (package data), checked safe to inline."""
    text = (resources.files("horizonrl.viz") / "static" / name).read_text(encoding="utf-8")
    if re.search(r"</?(script|style)", text, re.I):
        raise ValueError(f"viz/static/{name} contains a <script>/<style> tag and cannot be inlined")
    return text


def _json_block(element_id: str, data: Any) -> str:
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    text = text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return f'<script type="application/json" id="{element_id}">{text}</script>\n'


def page(title: str, mode: str, blocks: str = "") -> str:
    """The viewer page; ``mode`` ``"file"`` (data in ``blocks``) or ``"serve"`` (fetched from ``api/``)."""
    esc = title.replace("&", "&amp;").replace("<", "&lt;")
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n'
        f"<title>horizonrl · {esc}</title>\n"
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<style>\n{asset('viewer.css')}</style>\n</head>\n<body>\n"
        '<header id="hz-top"><h1 id="hz-name"></h1><span class="meta" id="hz-meta"></span></header>\n'
        '<div id="hz-problems"></div>\n'
        '<div id="hz-main"><nav id="hz-steps"></nav><section id="hz-list"></section>'
        '<section id="hz-detail"></section></div>\n'
        f"{blocks}"
        f"<script>window.HZ_MODE = {json.dumps(mode)};</script>\n"
        f"<script>\n{asset('viewer.js')}</script>\n</body></html>\n"
    )


def build_html(run_dir: str | Path, *, tokenizer: str | Path | None = None) -> tuple[str, list[str]]:
    """The HTML of a run and the problems met while reading it (also shown in the page)."""
    run = Run(Path(run_dir), tokenizer=tokenizer)
    index = index_payload(run)
    blocks = [_json_block("hz-index", index)]
    problems = list(index["problems"])
    for entry in index["steps"]:
        payload = step_payload(run, entry["key"])
        problems.extend(payload["problems"])
        blocks.append(_json_block(f"hz-step-{entry['key']}", payload))
    return page(index["name"], "file", "".join(blocks)), problems


def write_html(
    run_dir: str | Path, out: str | Path | None = None, *, tokenizer=None
) -> tuple[Path, list[str]]:
    """Write the viewer of ``run_dir`` to ``out`` (default ``RUN_DIR/viewer.html``)."""
    html, problems = build_html(run_dir, tokenizer=tokenizer)
    path = Path(out) if out is not None else Path(run_dir) / "viewer.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html, encoding="utf-8")
    return path, problems
