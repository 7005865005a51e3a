"""Reading a run directory for the viewer: rollout files (tolerantly), metrics, the tokenizer, payloads.

The payloads are what the viewer's JavaScript reads (``static/viewer.js``):

- :func:`index_payload`: the run (name, config, estimator), one entry per step
  file with that step's metrics, and the problems found while reading;
- :func:`step_payload`: one step's rollouts in a compact form — shared full
  prompts once per step, a turn's prompt as the delta after the previous turn
  (the environment tokens) when it extends it, log-probs to 3 decimals, the
  run-length-coded advantages of ``rollout_log`` as stored, and the text piece of
  every token id used.

Bad input never stops the viewer: a truncated or non-JSON line is reported
with its line number and skipped, an unknown field is reported and ignored. What
is not a run at all is refused with one error (:func:`check_run_dir`,
:func:`check_rollouts_file`): a directory with none of a run's files, a file
that is not JSONL or holds no rollout records.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from horizonrl.errors import DataError
from horizonrl.jsonl import read_jsonl
from horizonrl.train.records.metrics import read_metrics
from horizonrl.trajectory import Rollout, UnknownFieldWarning
from horizonrl.trajectory.io import rollout_from_record

STEP_FILE = re.compile(r"^(step|trunks|chains)_(\d+)\.jsonl$")
#: The generic trainers (``train.trainer``), which apply the config's ``algo.estimator``; any other
#: trainer computes its own credit and is named as the estimator (:attr:`Run.estimator`).
ESTIMATOR_TRAINERS = ("group", "gateway")


@dataclass
class RolloutFile:
    """The readable records of one rollouts file and what was wrong with the rest."""

    path: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    rollouts: list[Rollout] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: JSON objects read (rollouts or not), and those without ``uid`` and ``segments`` (not rollouts at all).
    objects: int = 0
    foreign: int = 0


def read_rollout_file(path: str | Path) -> RolloutFile:
    """Read ``path`` keeping every record that loads (the one JSONL reader, :mod:`horizonrl.jsonl`).

    A bad line (not JSON, not UTF-8, a torn last line) and a record that is not a rollout
    are reported in ``problems`` and skipped; unknown fields are reported
    (``path:N: unknown field(s) [...] ignored``) and the record kept.
    """
    path = Path(path)
    out = RolloutFile(path)
    for rec in read_jsonl(path, allow_nan=True, what="rollouts", on_bad=out.problems.append):
        out.objects += 1
        out.foreign += "uid" not in rec.value and "segments" not in rec.value
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", UnknownFieldWarning)
            try:
                r = rollout_from_record(rec)
            except DataError as e:
                out.problems.append(f"{e}; skipped")
                continue
        out.problems.extend(str(w.message) for w in caught if issubclass(w.category, UnknownFieldWarning))
        out.records.append(rec.value)
        out.rollouts.append(r)
    return out


#: What ``horizonrl view`` takes, for its error messages.
WANTED = "a run directory or a rollouts/*.jsonl file"


def check_run_dir(run_dir: str | Path) -> Path:
    """``run_dir`` if it holds a run; ``FileNotFoundError`` naming it and what was expected otherwise.

    A run is a directory with ``metrics.jsonl``, ``rollouts/`` or ``config.yaml`` (the first file a
    trainer writes, so a run still in its first evaluation can be served).
    """
    d = Path(run_dir)
    if not d.exists():
        raise FileNotFoundError(f"{d} does not exist; expected {WANTED}")
    if not d.is_dir():
        raise NotADirectoryError(f"{d} is not a directory; expected a run directory")
    if not any((d / name).exists() for name in ("metrics.jsonl", "rollouts", "config.yaml")):
        what = f"expected {WANTED}"
        if any(STEP_FILE.match(p.name) for p in d.glob("*.jsonl")):
            what = f"it holds rollouts files: view one of them, or the run directory {d.resolve().parent}"
        raise FileNotFoundError(f"{d} holds no run (no metrics.jsonl, rollouts/ or config.yaml); {what}")
    return d


def check_rollouts_file(f: RolloutFile) -> RolloutFile:
    """``f`` if it is a rollouts file; ``DataError`` naming it when it has lines but no rollout and no
    record that tries to be one (``metrics.jsonl``, a demonstrations file, text). An empty file passes,
    and so does one with a rollout record that is broken (the viewer reports its line)."""
    if f.rollouts or f.objects > f.foreign or not (f.objects or f.problems):
        return f
    if f.foreign:
        why = f"none of its {f.objects} record(s) has a uid or segments"
    else:
        more = len(f.problems) - 1
        why = f.problems[0].removesuffix("; skipped")
        why += f" (and {more} more bad line{'s' * (more > 1)})" if more else ""
    raise DataError(f"{f.path} holds no rollouts: {why}; expected {WANTED}")


# ----------------------------------------------------------------------------- tokenizer


def _tokenizer_candidates(run_dir: Path, config: dict[str, Any]) -> list[Path]:
    ckpts = sorted(
        run_dir.glob("checkpoints/*/tokenizer.json"),
        key=lambda p: int(m.group(1)) if (m := re.search(r"(\d+)$", p.parent.name)) else -1,
        reverse=True,
    )
    out = [*ckpts, run_dir / "base_model" / "tokenizer.json"]
    for key in (("train", "init"), ("model", "path")):
        v = (config.get(key[0]) or {}).get(key[1])
        if isinstance(v, str) and v not in ("tiny", "smollm2"):
            out.append(Path(v) / "tokenizer.json")
    return out


def token_decoder(run_dir: str | Path, config: dict[str, Any], tokenizer: str | Path | None = None):
    """``decode(ids) -> {id: piece}`` from the run's tokenizer, or ``None`` when none is found.

    ``tokenizer``: a directory or ``tokenizer.json`` to use instead of the run's
    (checkpoints, the built tiny model, ``train.init``, ``model.path``).
    """
    from tokenizers import Tokenizer

    if tokenizer is not None:
        p = Path(tokenizer)
        paths = [p / "tokenizer.json" if p.is_dir() else p]
    else:
        paths = _tokenizer_candidates(Path(run_dir), config)
    for p in paths:
        if p.is_file():
            tok = Tokenizer.from_file(str(p))

            def decode(ids, tok=tok) -> dict[int, str]:
                return {int(i): tok.decode([int(i)], skip_special_tokens=False) for i in ids}

            decode.source = str(p)  # type: ignore[attr-defined]
            return decode
    return None


# ----------------------------------------------------------------------------- the run


def _clean(x: Any) -> Any:
    """JSON-safe values (NaN/inf -> None) for ``JSON.parse``."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _small(info: dict[str, Any]) -> dict[str, Any]:
    """Segment/turn ``info`` for display: token-id lists (``h_minus``...) become their length."""
    out = {}
    for k, v in info.items():
        if isinstance(v, list) and len(v) > 16 and all(isinstance(x, int) for x in v[:16]):
            out[k] = f"[{len(v)} token ids]"
        else:
            out[k] = v
    return out


def _extends(prefix: list[int], full: list[int]) -> bool:
    return len(full) >= len(prefix) and full[: len(prefix)] == prefix


def _adv_values(enc: Any) -> list[float]:
    if enc is None:
        return []
    if isinstance(enc, int | float):
        return [float(enc)]
    return [float(v) for v, _ in enc]


def credit_sign(advantages: list[list[Any]] | None) -> tuple[str | None, float | None]:
    """``(sign, mean)`` over the trained tokens: ``+``, ``-``, ``0``, ``±`` (mixed); ``None`` untrained."""
    if not advantages:
        return None, None
    vals, total, count = [], 0.0, 0
    for seg in advantages:
        for enc in seg:
            if enc is None:
                continue
            runs = [[float(enc), 1]] if isinstance(enc, int | float) else enc
            for v, c in runs:
                vals.append(float(v))
                total += float(v) * int(c)
                count += int(c)
    if not vals:
        return None, None
    pos, neg = any(v > 0 for v in vals), any(v < 0 for v in vals)
    sign = "±" if pos and neg else "+" if pos else "-" if neg else "0"
    return sign, total / count if count else 0.0


@dataclass
class Run:
    """A run directory as the viewer sees it."""

    run_dir: Path
    tokenizer: str | Path | None = None

    def __post_init__(self) -> None:
        self.run_dir = check_run_dir(self.run_dir)

    @cached_property
    def config(self) -> dict[str, Any]:
        p = self.run_dir / "config.yaml"
        if not p.is_file():
            return {}
        try:
            cfg = yaml.safe_load(p.read_text())
        except yaml.YAMLError:
            return {}
        return cfg if isinstance(cfg, dict) else {}

    @cached_property
    def decode(self) -> Callable[[Any], dict[int, str]] | None:
        return token_decoder(self.run_dir, self.config, self.tokenizer)

    @property
    def estimator(self) -> str | None:
        """What computed the run's advantages, as the data says it.

        The ``credit.estimator`` of the first record of the first ``step_N.jsonl`` (``rollout_log``
        writes the config's ``algo.estimator`` there, and a trainer that computes its own credit, as a
        method trainer does, its own name); without one (no step file yet, or ``train.save_credit``
        off): ``algo.estimator`` under a trainer of :data:`ESTIMATOR_TRAINERS`, else the trainer's name.
        """
        for kind, _, path in self.step_files():
            if kind == "step":
                for rec in read_jsonl(path, allow_nan=True, what="rollouts", on_bad=lambda _: None):
                    credit = rec.value.get("credit")
                    if isinstance(credit, dict) and isinstance(credit.get("estimator"), str):
                        return credit["estimator"]
                    break
                break
        trainer = (self.config.get("train") or {}).get("trainer", "group")
        if trainer in ESTIMATOR_TRAINERS:
            return (self.config.get("algo") or {}).get("estimator")
        return trainer

    def metrics(self) -> tuple[list[dict[str, Any]], list[str]]:
        if not (self.run_dir / "metrics.jsonl").is_file():
            return [], []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            recs = read_metrics(self.run_dir)
        return recs, [str(w.message) for w in caught]

    def step_files(self) -> list[tuple[str, int, Path]]:
        """``(kind, number, path)`` of ``rollouts/{step,trunks,chains}_N.jsonl``, steps first, by number."""
        out = []
        for p in (self.run_dir / "rollouts").glob("*.jsonl"):
            m = STEP_FILE.match(p.name)
            if m:
                out.append((m.group(1), int(m.group(2)), p))
        order = {"step": 0, "trunks": 1, "chains": 2}
        return sorted(out, key=lambda x: (order[x[0]], x[1]))

    def file_for(self, key: str) -> Path:
        for kind, n, p in self.step_files():
            if f"{kind}_{n}" == key:
                return p
        raise FileNotFoundError(f"no rollouts file {key}.jsonl in {self.run_dir / 'rollouts'}")


def index_payload(run: Run) -> dict[str, Any]:
    """The run, its step files with their metrics, and problems (metrics file, tokenizer)."""
    metrics, problems = run.metrics()
    by_step = {int(m.get("step", -1)): m for m in metrics}
    steps = []
    for kind, n, p in run.step_files():
        entry = {"key": f"{kind}_{n}", "kind": kind, "n": n, "bytes": p.stat().st_size}
        if kind == "step":
            entry["metrics"] = by_step.get(n, {})
        steps.append(entry)
    if run.decode is None:
        problems.append(
            "no tokenizer found (checkpoints/*/tokenizer.json, base_model/, train.init, model.path): "
            "tokens are shown as ids; pass --tokenizer DIR"
        )
    cfg = run.config
    trainer = (cfg.get("train") or {}).get("trainer", "group")
    return _clean(
        {
            "run": str(run.run_dir),
            "name": run.run_dir.resolve().name,
            "estimator": run.estimator,
            "trainer": trainer,
            "config": cfg,
            "metrics": [by_step[k] for k in sorted(by_step)],
            "steps": steps,
            "problems": problems,
        }
    )


def _turn_payload(
    turn: dict[str, Any], prev: list[int] | None, prompts: dict[tuple, int], table: list[list[int]]
) -> dict[str, Any]:
    pids, rids = list(turn.get("prompt_ids") or []), list(turn.get("response_ids") or [])
    t: dict[str, Any] = {"r": rids, "lp": [round(float(x), 3) for x in turn.get("logprobs") or []]}
    if prev is not None and _extends(prev, pids):
        t["p"] = pids[len(prev) :]
    else:
        key = tuple(pids)
        if key not in prompts:
            prompts[key] = len(table)
            table.append(pids)
        t["pi"] = prompts[key]
    t["txt"] = turn.get("response_text", "")
    if turn.get("observation") is not None:
        t["obs"] = turn["observation"]
    t["sp"] = [[s["label"], s["start"], s["end"], s.get("source_turn")] for s in turn.get("spans") or []]
    for src, dst in (("reward", "rw"), ("truncated", "tr"), ("invalid", "inv"), ("tool_calls", "tc")):
        if turn.get(src):
            t[dst] = turn[src]
    if turn.get("info"):
        t["info"] = _small(turn["info"])
    return t


def rollout_payload(d: dict[str, Any], prompts: dict[tuple, int], table: list[list[int]]) -> dict[str, Any]:
    """One rollout record in the viewer's compact form (see the module docstring)."""
    cr = d.get("credit") or {}
    adv, rows = cr.get("advantages"), cr.get("rows")
    side_r, side_s, side_t = cr.get("rollout") or {}, cr.get("sessions") or [], cr.get("turns") or []
    segs = []
    for s, seg in enumerate(d.get("segments") or []):
        turns, prev = [], None
        for t, turn in enumerate(seg.get("turns") or []):
            tp = _turn_payload(turn, prev, prompts, table)
            prev = list(turn.get("prompt_ids") or []) + list(turn.get("response_ids") or [])
            if adv is not None and s < len(adv) and t < len(adv[s]):
                tp["a"] = adv[s][t]
            if rows is not None and s < len(rows) and t < len(rows[s]):
                tp["row"] = rows[s][t]
            if s < len(side_t) and t < len(side_t[s] or []) and side_t[s][t]:
                tp["side"] = side_t[s][t]
            turns.append(tp)
        sp: dict[str, Any] = {
            "k": seg.get("kind", "normal"),
            "p": seg.get("parent"),
            "f": seg.get("fork_index"),
        }
        if seg.get("info"):
            sp["info"] = _small(seg["info"])
        if s < len(side_s) and side_s[s]:
            sp["side"] = side_s[s]
        sp["T"] = turns
        segs.append(sp)
    sign, mean = credit_sign(adv)
    br = d.get("branch")
    group = d.get("group_id", "")
    if "trunk" in side_r and "k" in side_r:
        group = f"{side_r['trunk']} k={side_r['k']}"
    out = {
        "u": d.get("uid"),
        "g": group,
        "task": d.get("task_id"),
        "R": d.get("reward"),
        "ok": bool(d.get("success")),
        "end": d.get("termination", "done"),
        "fa": d.get("final_answer"),
        "br": [br.get("trunk_id"), br.get("turn")] if isinstance(br, dict) else None,
        "est": cr.get("estimator"),
        "sg": sign,
        "am": mean,
        "S": segs,
    }
    if side_r:
        out["side"] = side_r
    metrics = (d.get("env") or {}).get("metrics")
    if metrics:
        out["env"] = metrics
    return out


def _trunk_summary(d: dict[str, Any]) -> dict[str, Any]:
    seg0 = (d.get("segments") or [{}])[0]
    return {
        "u": d.get("uid"),
        "R": d.get("reward"),
        "ok": bool(d.get("success")),
        "turns": [(t.get("response_text") or "")[:160] for t in seg0.get("turns") or []],
    }


def step_payload(run: Run, key: str) -> dict[str, Any]:
    """The viewer payload of one rollouts file (``step_N``, ``trunks_N``, ``chains_N``)."""
    f = read_rollout_file(run.file_for(key))
    prompts: dict[tuple, int] = {}
    table: list[list[int]] = []
    rollouts = [rollout_payload(d, prompts, table) for d in f.records]
    out: dict[str, Any] = {"key": key, "R": rollouts, "P": table, "problems": f.problems}
    trunk_ids = {r["br"][0] for r in rollouts if r["br"]}
    if trunk_ids:  # RTPO siblings: the trunks they forked from (rollouts/trunks_<iteration>.jsonl)
        trunks = {}
        for it in sorted({r.get("side", {}).get("iteration") for r in rollouts} - {None}):
            p = run.run_dir / "rollouts" / f"trunks_{it}.jsonl"
            if p.is_file():
                for d in read_rollout_file(p).records:
                    if d.get("uid") in trunk_ids:
                        trunks[d["uid"]] = _trunk_summary(d)
        out["trunks"] = trunks
    if run.decode is not None:
        ids = {
            i
            for r in f.records
            for s in r.get("segments") or []
            for t in s.get("turns") or []
            for i in t.get("response_ids") or []
        }
        ids |= {i for p in table for i in p}
        ids |= {i for r in rollouts for s in r["S"] for t in s["T"] for i in t.get("p", [])}
        out["V"] = {str(k): v for k, v in run.decode(sorted(ids)).items()}
    return _clean(out)
