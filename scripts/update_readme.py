"""Regenerate the generated parts of README.md from the code and from a real run.

    python scripts/update_readme.py                      # config reference, results summary, real model
    python scripts/update_readme.py --quickstart LOG     # also the quickstart output, from a run's log
    python scripts/update_readme.py --quickstart-check LOG   # and the 3-seed check's table

``LOG`` is the stdout of ``horizonrl quickstart`` (``make quickstart | tee LOG``); the
block between the ``quickstart-output`` markers is replaced by its table part, so the
README shows exactly what a run printed. The config reference is ``horizonrl
config-reference``; ``tests/config/test_config.py`` checks it is current. The results summary is
built from ``docs/results/*.json`` (written by ``horizonrl reproduce NAME``).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

from horizonrl import benchtools  # one writer of generated blocks, shared with the benchmarks
from horizonrl.config import describe
from horizonrl.reproduce.learning import MEASURES
from horizonrl.train.trainers.registry import trainer_reference

ROOT = Path(__file__).resolve().parents[1]

README = ROOT / "README.md"
PAPERS = ("rtpo", "ccpo", "mosaic", "echo")


def replace_block(text: str, name: str, body: str) -> str:
    """The README's ``<!-- name -->`` block replaced by ``body``: the benchmarks' block writer."""
    return benchtools.replace_block(text, name, body, where="README.md")


def quickstart_block(log: str) -> str:
    """The quickstart's printed lines from ``[1/3]`` on, as a terminal shows them, without progress bars."""
    # What a terminal shows of each line; a line that was only a progress bar, cleared, is dropped.
    lines = [
        ln.rsplit("\r", 1)[-1].rstrip()
        for ln in log.split("\n")
        if not ("\r" in ln and not ln.rsplit("\r", 1)[-1].strip())
    ]
    start = next(i for i, ln in enumerate(lines) if ln.startswith("[1/3]"))
    bar = re.compile(r"\d+/\d+ \[\d+:\d+")  # a tqdm progress bar (train.progress)
    keep = [ln for ln in lines[start:] if not bar.search(ln)]
    return "```\n" + "\n".join(keep).strip("\n") + "\n```\n"


def check_block(log: str) -> str:
    """The table and verdict that ``scripts/quickstart_check.py`` printed."""
    lines = [ln.rstrip() for ln in log.splitlines()]
    start = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["seed", "SFT"])
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("quickstart-check"))
    return "```\n" + "\n".join(lines[start : end + 1]) + "\n```\n"


def _not_run(warm: dict, res: dict) -> str:
    """Why a paper (or one of its scenarios) has no comparison rows: its warm start missed the gate."""
    return f"not run: warm-start pass@1 {warm['pass@1']:.3f} outside the gate {res['setup']['gate']}"


def _median_updates(res: dict, arm: str) -> str:
    """Median policy updates over ``arm``'s seeds ('–' when the page does not record them)."""
    seeds = (res.get("arms") or {}).get(arm, {}).get("seeds") or []
    counts = [s["updates"] for s in seeds if s.get("updates") is not None]
    return f"{statistics.median(counts):g}" if counts else "–"


def _learned(res: dict, arm: str) -> str:
    """The page's learning reading of ``arm`` (``rose`` / ``fell`` / ``unresolved``; '–' when absent)."""
    g = (res.get("gains") or {}).get(arm)
    if not g:
        return "–"
    return {"rose": "rose", "fell": "fell"}.get(g["reading"].split(" ")[0], "unresolved")


def results_block() -> str:
    """One row per reported comparison of every reproduction page that exists."""
    lines = [
        "| paper | comparison | claim | Δ end pass@1, mean [95% t-CI over seeds] | seeds "
        "| updates / arm-seed (median, arm / baseline) | reading | end − start (arm / baseline) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in PAPERS:
        path = ROOT / "docs" / "results" / f"{name}.json"
        if not path.exists():
            lines.append(f"| {name} | – | – | not run yet | – | – | – | – |")
            continue
        res = json.loads(path.read_text())
        if res.get("status") == "gate_refused":
            why = _not_run(res["warm_start"], res)
            lines.append(f"| [{name}](docs/results/{name}.md) | – | – | {why} | – | – | – | – |")
            continue
        for s, r in (res.get("refused_scenarios") or {}).items():
            lines.append(
                f"| [{name}](docs/results/{name}.md) | scenario `{s}` | – | {_not_run(r, res)} "
                "| – | – | – | – |"
            )
        for c in res["comparisons"]:
            t = c["t"]
            ci = f"{t['mean']:+.3f} [{t['lo']:+.3f}, {t['hi']:+.3f}]"
            link = f"[{name}](docs/results/{name}.md)"
            pair = f"`{c['arm']}` − `{c['baseline']}`"
            updates = " / ".join(_median_updates(res, a) for a in (c["arm"], c["baseline"]))
            learned = " / ".join(_learned(res, a) for a in (c["arm"], c["baseline"]))
            lines.append(
                f"| {link} | {pair} | {c['claim']} | {ci} | {t['n']} | {updates} | {c['verdict']} "
                f"| {learned} |"
            )
    return "\n".join(lines) + "\n"


def real_model_block(name: str = "smollm2", arm: str = "grpo") -> str:
    """One row per seed of a pretrained-model reproduction (``docs/results/NAME.json``): held-out pass@1
    at the start (shared) and the end, the gain with that seed's task-bootstrap interval, and, where the
    page measured them, the same for greedy decoding and pass@k, and the episodes' mean tool calls; the
    run's updates and wall time."""
    path = ROOT / "docs" / "results" / f"{name}.json"
    if not path.exists():
        return f"not run yet: `horizonrl reproduce {name} --jobs 2`\n"
    res = json.loads(path.read_text())
    st = res["setup"]
    runs = {x["seed"]: x for x in res["arms"][arm]["seeds"]}
    start = res["arms"][arm]["start"]
    measures = [(m.title, g) for m in MEASURES.values() if (g := (res.get(m.gains_key) or {}).get(arm))]
    calls = start.get("tool_calls_mean") is not None
    head = ["seed"]
    for title, _ in measures:
        head += [f"{title} start → end", "end − start [95% task-bootstrap CI]", "reading"]
    head += [*(["tool calls / episode start → end"] if calls else []), "updates"]
    head.append("wall time (one thread, beside other runs)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for seed in (x["seed"] for x in measures[0][1]["per_seed"]):
        run, row = runs[seed], [str(seed)]
        for _, g in measures:
            x = next(x for x in g["per_seed"] if x["seed"] == seed)
            b = x["bootstrap"]
            row += [
                f"{g['start']:.3f} → {x['end']:.3f}",
                f"{b['mean']:+.3f} [{b['lo']:+.3f}, {b['hi']:+.3f}]",
            ]
            row.append(x["reading"])
        if calls:
            row.append(f"{start['tool_calls_mean']:.2f} → {run['tool_calls_mean']:.2f}")
        row += [str(run["updates"]), f"{run['wall_s'] / 60:.0f} min"]
        lines.append("| " + " | ".join(row) + " |")
    n = st["eval_tasks"]
    greedy = ", and one greedy episode per task" if st.get("eval_greedy") else ""
    return (
        "\n".join(lines)
        + f"\n\n{n} held-out tasks x {st['eval_samples']} sample at temperature {st['eval_temperature']}"
        f"{greedy}, the same draws for the start and every seed ([results page](docs/results/{name}.md)).\n"
    )


#: The README's real-model tables: block name -> the pretrained-model reproduction it shows (one row per
#: seed of its ``grpo`` arm); a block the README does not hold is skipped.
REAL_MODEL_BLOCKS = {"real-model": "smollm2", "real-model-search": "smollm2_search"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quickstart", default=None, help="log of a `horizonrl quickstart` run")
    ap.add_argument("--quickstart-check", default=None, help="log of a `make quickstart-check` run")
    args = ap.parse_args()
    text = README.read_text()
    text = replace_block(text, "config-reference", describe())
    text = replace_block(text, "trainer-params", trainer_reference())
    if "<!-- results-summary -->" in text:
        text = replace_block(text, "results-summary", results_block())
    for block, name in REAL_MODEL_BLOCKS.items():
        if f"<!-- {block} -->" in text:
            text = replace_block(text, block, real_model_block(name))
    if args.quickstart:
        with open(args.quickstart, newline="") as f:  # keep the progress bars' carriage returns
            text = replace_block(text, "quickstart-output", quickstart_block(f.read()))
    if args.quickstart_check:
        text = replace_block(text, "quickstart-check", check_block(Path(args.quickstart_check).read_text()))
    README.write_text(text)


if __name__ == "__main__":
    main()
