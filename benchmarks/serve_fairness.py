"""How long a small request waits behind a large one on ``horizonrl serve`` (issue 15, item 7).

Starts ``horizonrl.serve.serve(MODEL)`` from the sources in ``--src`` (so an older checkout can be
measured the same way), sends a large request (``n`` completions of ``max_tokens`` tokens each) and,
``--delay`` seconds later, a small one (1 completion of ``--small-tokens`` tokens), and prints, per
repetition and as the median, the small request's latency and the large one's duration::

    python benchmarks/serve_fairness.py --model /tmp/tiny --src src
    python benchmarks/serve_fairness.py --model /tmp/tiny --src /tmp/old/src   # e.g. git archive f6f271f

Measured numbers are in docs/serve.md ("Concurrency").
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict, out: dict, key: str) -> None:
    t0 = time.perf_counter()
    r = httpx.post(url, json=body, timeout=3600)
    out[key] = time.perf_counter() - t0
    out[key + "_end"] = time.perf_counter()
    out[key + "_tokens"] = r.json()["usage"]["completion_tokens"] if r.status_code == 200 else r.text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model directory served")
    p.add_argument("--src", default="src", help="PYTHONPATH of the horizonrl sources to measure")
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--small-tokens", type=int, default=8)
    p.add_argument("--delay", type=float, default=0.5)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()

    port = _free_port()
    code = (
        "import torch; torch.set_num_threads(1)\n"
        "from horizonrl.serve import serve\n"
        f"serve({args.model!r}, '127.0.0.1', {port}, device='cpu', log_level='warning')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.path.abspath(args.src), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the server did not start")
            time.sleep(0.2)
        url = base + "/v1/chat/completions"
        msgs = [{"role": "user", "content": "Tell me a story."}]
        large = {"messages": msgs, "n": args.n, "max_tokens": args.max_tokens, "ignore_eos": True}
        small = {"messages": msgs, "max_tokens": args.small_tokens}
        runs = []
        for _ in range(args.repeats):
            out: dict = {}
            t = threading.Thread(target=_post, args=(url, large, out, "large"))
            t.start()
            time.sleep(args.delay)
            _post(url, small, out, "small")
            t.join()
            out["small_before_large"] = out["small_end"] < out["large_end"]
            runs.append(out)
            print(
                json.dumps(
                    {
                        "small_latency_s": round(out["small"], 3),
                        "large_duration_s": round(out["large"], 3),
                        "small_finished_first": out["small_before_large"],
                        "large_tokens": out["large_tokens"],
                    }
                )
            )
        print(
            json.dumps(
                {
                    "median_small_latency_s": round(statistics.median(r["small"] for r in runs), 3),
                    "median_large_duration_s": round(statistics.median(r["large"] for r in runs), 3),
                    "n": args.n,
                    "max_tokens": args.max_tokens,
                    "small_tokens": args.small_tokens,
                }
            )
        )
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
