"""Looking at runs: the trajectory viewer and learning-curve plots (docs/viewer.md).

- :mod:`.data`: reading a run directory tolerantly and the viewer's compact payloads;
- :mod:`.html`: ``horizonrl view RUN_DIR`` -> one self-contained HTML file;
- :mod:`.serve`: ``horizonrl view --serve RUN_DIR`` -> a local server on 127.0.0.1;
- :mod:`.text`: ``horizonrl view FILE.jsonl`` -> plain text;
- :mod:`.plot`: ``horizonrl plot RUN_DIR ...`` and the importable ``plot_runs`` / ``plot_curves``.

The JavaScript and CSS of the viewer are package data (``static/``), inlined into every page.
Submodules are imported on use (matplotlib only by :mod:`.plot`).
"""
