"""``horizonrl view --serve RUN_DIR``: the viewer as a local web server on 127.0.0.1.

The same page as the HTML file, but the data is fetched per request and read
fresh from the run directory, so a run in progress shows its new steps on
reload. Routes: ``/`` (the viewer, which lists the steps), ``/api/index``,
``/api/step/<step_N|trunks_N|chains_N>``. Standard library only
(:class:`http.server.ThreadingHTTPServer`); it binds to the loopback address.
"""

from __future__ import annotations

import json
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from horizonrl.viz.data import Run, index_payload, step_payload
from horizonrl.viz.html import page

HOST = "127.0.0.1"


class _Handler(BaseHTTPRequestHandler):
    server: ViewerServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet by default
        if self.server.verbose:
            super().log_message(format, *args)

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, data: Any, status: int = HTTPStatus.OK) -> None:
        body = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        self._send(status, body, "application/json; charset=utf-8")

    def do_GET(self) -> None:
        path = unquote(urlparse(self.path).path)
        try:
            if path in ("/", "/index.html"):
                self._send(HTTPStatus.OK, self.server.page().encode(), "text/html; charset=utf-8")
            elif path == "/api/index":
                self._json(index_payload(self.server.run()))
            elif path.startswith("/api/step/"):
                self._json(self.server.step(path.removeprefix("/api/step/")))
            else:
                self._json({"error": f"no such page {path}"}, HTTPStatus.NOT_FOUND)
        except FileNotFoundError as e:
            self._json({"error": str(e)}, HTTPStatus.NOT_FOUND)


class ViewerServer(ThreadingHTTPServer):
    """A viewer server for one run directory; :attr:`url` is where it listens."""

    daemon_threads = True

    def __init__(self, run_dir: str | Path, *, port: int = 0, tokenizer=None, verbose: bool = False):
        self.run_dir = Path(run_dir)
        self.tokenizer = tokenizer
        self.verbose = verbose
        self._run: Run | None = None
        self._cache: dict[str, tuple[tuple[float, int], dict]] = {}
        self._lock = threading.Lock()
        self.run()  # a missing run directory fails here, before binding
        super().__init__((HOST, port), _Handler)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.server_address[1]}/"

    def run(self) -> Run:
        with self._lock:
            if self._run is None:
                self._run = Run(self.run_dir, tokenizer=self.tokenizer)
            return self._run

    def page(self) -> str:
        return page(self.run_dir.resolve().name, "serve")

    def step(self, key: str) -> dict:
        run = self.run()
        path = run.file_for(key)
        st = path.stat()
        stamp = (st.st_mtime, st.st_size)
        cached = self._cache.get(key)
        if cached is None or cached[0] != stamp:
            cached = (stamp, step_payload(run, key))
            self._cache[key] = cached
        return cached[1]


def serve(run_dir: str | Path, *, port: int = 8765, tokenizer=None, verbose: bool = False) -> None:
    """Serve the viewer of ``run_dir`` on ``http://127.0.0.1:PORT/`` until interrupted."""
    server = ViewerServer(run_dir, port=port, tokenizer=tokenizer, verbose=verbose)
    print(f"horizonrl viewer for {run_dir}: {server.url}  (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
