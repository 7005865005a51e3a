"""The method boundary: generic code names no method, and what names methods is true.

- The generic floors (``train/trainers``, ``train/rollout``, ``train/update``, ``train/records``,
  ``viz``) name no registered method — estimator, trainer, feature provider, agent, context manager or
  paper, the names read from the registries at test time — in a string literal or an identifier
  (docstrings and comments are prose and may), and import no module that registers one: a method
  plugs in through its registry, it is not special-cased by name.
- Every metric a paper declaration lists is one some code can emit (``ig/score_s`` was renamed
  ``time/ig_score_s`` and its column stayed empty).
- Every repository path the per-method index (``docs/methods.md``) names exists.
- The two places that special-cased methods by name now read the data or the declaration.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import horizonrl

SRC = Path(horizonrl.__file__).parent
REPO = SRC.parents[1]
GENERIC_FLOORS = ("train/trainers", "train/rollout", "train/update", "train/records", "viz")

#: Registered names that are also ordinary words of generic code; they are not looked for. Kept short:
#: every other registered name is a method's (or one method's component's) and must not appear.
ALLOWED = {
    # the generic trainers themselves (train/trainers/group.py, gateway.py), which apply any estimator;
    # "group" is also Group, group_id, group_size, re.Match.group, process_group
    "group": "the generic trainer; Group, group_id, group_size",
    "gateway": "the generic recording-gateway trainer",
    # the default agent (rollout/collect.py's agent="react") and context manager (list.append)
    "react": "the default agent",
    "append": "the default context manager; list.append",
    # words of tensor and logging code: hidden_size, scores, memory, sliding window, SummaryWriter,
    # identity, a segment's fork_index
    "hidden": "hidden states, hidden_size",
    "scores": "Engine.score's result",
    "memory": "GPU memory",
    "window": "sliding-window attention",
    "summary": "SummaryWriter",
    "identity": "an identity map",
    "fork": "Segment.fork_index",
    # a reproduction named after the model it trains (reproduce/pretrained.py): model.path: smollm2
    "smollm2": "the SmolLM2 model (model.path), which the smollm2 reproduction trains",
}


def _registered() -> dict[str, list[tuple[str, str]]]:
    """``name -> [(registry kind, module defining its entry)]`` over the method registries."""
    from horizonrl.agents.context import CONTEXTS
    from horizonrl.agents.registry import AGENTS
    from horizonrl.credit.registry import ESTIMATORS
    from horizonrl.reproduce.spec import PAPERS
    from horizonrl.train.trainers.features import FEATURES
    from horizonrl.train.trainers.registry import TRAINERS

    out: dict[str, list[tuple[str, str]]] = {}
    for reg in (ESTIMATORS, TRAINERS, FEATURES, AGENTS, CONTEXTS, PAPERS):
        for name in reg.names():
            entry = reg.get(name)
            obj = getattr(entry, "fn", entry)  # an EstimatorSpec wraps the estimator function
            module = getattr(obj, "__module__", "") or ""
            if module.startswith("horizonrl."):  # not what a test (or a user) registered for itself
                out.setdefault(name, []).append((reg.kind, module))
    return out


def _words(token: str) -> list[str]:
    """``CCPOFeatures`` -> ``[ccpo, features]``, ``rtpo/zero_adv_rate`` -> ``[rtpo, zero, adv, rate]``."""
    token = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", token)
    token = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", token)
    return [w for w in re.split(r"[^a-z0-9]+", token.lower()) if w]


def _names_in(words: list[str], name: str) -> bool:
    """``name``'s words appear consecutively in ``words`` (``grpo_steps`` in ``[grpo, steps, mean]``)."""
    want = name.split("_")
    return any(words[i : i + len(want)] == want for i in range(len(words) - len(want) + 1))


def _tokens(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``(line, text)`` of every string literal (docstrings excluded) and identifier of a module."""
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
        and isinstance(node.body[0].value.value, str)
    }
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield line, node.value
        elif isinstance(node, ast.Name):
            yield line, node.id
        elif isinstance(node, ast.Attribute):
            yield line, node.attr
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield line, node.name
        elif isinstance(node, ast.arg) or (isinstance(node, ast.keyword) and node.arg):
            yield line, node.arg
        elif isinstance(node, ast.alias):
            yield line, node.asname or node.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield line, node.module


def _imports(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``(line, module)`` of every import, lazy ones included (``from a import b``: ``a.b`` and ``a``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.lineno, node.module
            for a in node.names:
                yield node.lineno, f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name


def boundary_violations() -> list[str]:
    """``path:line: why`` of every method name or method-module import in the generic floors."""
    registered = _registered()
    names = sorted(n for n in registered if n not in ALLOWED)
    # a module that registers a method's entry is that method's code (agents.psi: RTPO's maps)
    method_modules = {mod: name for name in names for _, mod in registered[name] if mod}
    out: list[tuple[str, int, str]] = []
    for floor in GENERIC_FLOORS:
        for path in sorted((SRC / floor).rglob("*.py")):
            rel = path.relative_to(SRC.parent).as_posix()
            tree = ast.parse(path.read_text())
            for line, text in _tokens(tree):
                words = _words(text)
                out += [(rel, line, f"names {n!r} ({text[:60]!r})") for n in names if _names_in(words, n)]
            for line, mod in _imports(tree):
                if mod in method_modules:
                    out.append((rel, line, f"imports {mod} (registers {method_modules[mod]!r})"))
    return [f"{rel}:{line}: {why}" for rel, line, why in sorted(set(out))]


def test_the_allow_list_names_registered_names():
    stale = sorted(set(ALLOWED) - set(_registered()))
    assert not stale, f"allow-listed names nothing registers any more: {stale}"


def test_generic_floors_name_no_method():
    bad = boundary_violations()
    assert not bad, "generic code that names a method:\n" + "\n".join(bad)


# ------------------------------------------------------------------ paper metrics


def _emitted() -> tuple[set[str], list[tuple[re.Pattern, int]]]:
    """String constants of the package outside ``reproduce/`` (docstrings too: a key may be a dict key
    of a helper's result), and each f-string with a ``/`` in its literal text as a regex."""
    consts: set[str] = set()
    patterns: list[tuple[re.Pattern, int]] = []
    for path in SRC.rglob("*.py"):
        if "reproduce" in path.relative_to(SRC).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.JoinedStr):
                parts = [v.value if isinstance(v, ast.Constant) else None for v in node.values]
                if any(p and "/" in p for p in parts):
                    rx = "".join(re.escape(p) if p is not None else "(.*?)" for p in parts)
                    patterns.append((re.compile(rx), sum(p is None for p in parts)))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                consts.add(node.value)
    return consts, patterns


def _can_emit(key: str, consts: set[str], patterns: list[tuple[re.Pattern, int]]) -> bool:
    """``key`` is a constant, or an f-string's literal text with every placeholder filled by a
    constant (or by nothing: a ``prefix`` that is empty for training metrics)."""
    if key in consts:
        return True
    for rx, _ in patterns:
        m = rx.fullmatch(key)
        if m and all(g == "" or g in consts for g in m.groups()):
            return True
    return False


def test_every_metric_a_paper_lists_is_emitted_somewhere():
    from horizonrl.reproduce.spec import PAPERS, get_paper

    consts, patterns = _emitted()
    bad = []
    for name in PAPERS.names():
        p = get_paper(name)
        for field in ("diagnostics", "per_seed", "paired_metrics", "zero_adv_metrics"):
            bad += [f"{name}.{field}: {k}" for k in getattr(p, field) if not _can_emit(k, consts, patterns)]
    assert not bad, "metrics a paper reads that no code writes: " + "; ".join(bad)
    assert not _can_emit("ig/score_s", consts, patterns)  # the renamed key the check exists for


# ------------------------------------------------------------------ the per-method index

METHODS_DOC = REPO / "docs" / "methods.md"
_PATH = re.compile(r"`((?:src|docs|tests|benchmarks|scripts|examples)/[^`\s]+?)`")


def test_every_path_the_method_index_names_exists():
    text = METHODS_DOC.read_text()
    paths = _PATH.findall(text) + re.findall(r"\]\(((?!https?:|#)[^)#\s]+)", text)
    assert len(paths) > 40, "the index names the files of every method"
    missing = sorted({p for p in paths if not (METHODS_DOC.parent / p).exists() and not (REPO / p).exists()})
    assert not missing, f"docs/methods.md names paths that do not exist: {missing}"


def test_the_method_index_covers_every_paper_and_estimator():
    from horizonrl.credit.registry import ESTIMATORS
    from horizonrl.reproduce.spec import PAPERS

    text = METHODS_DOC.read_text()
    ours = {
        n
        for n, entries in _registered().items()
        if any(k in (ESTIMATORS.kind, PAPERS.kind) for k, _ in entries)
    }
    missing = sorted(n for n in ours if f"`{n}`" not in text)
    assert not missing, f"docs/methods.md does not mention: {missing}"


# ------------------------------------------------------------------ what was special-cased


def _run(tmp_path: Path, trainer: str, estimator: str, credit: str | None) -> Path:
    (tmp_path / "rollouts").mkdir()
    (tmp_path / "config.yaml").write_text(f"train:\n  trainer: {trainer}\nalgo:\n  estimator: {estimator}\n")
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    if credit is not None:
        rec = {"uid": "u", "task_id": "t", "group_id": "g", "segments": []}
        if credit:
            rec["credit"] = {"v": 1, "estimator": credit}
        (tmp_path / "rollouts" / "step_1.jsonl").write_text(json.dumps(rec) + "\n")
    return tmp_path


@pytest.mark.parametrize(
    ("trainer", "estimator", "credit", "shown"),
    [
        ("group", "mosaic", "mosaic", "mosaic"),  # the data and the config agree
        ("group", "grpo", None, "grpo"),  # no step file yet: the config's estimator
        ("gateway", "ccpo", "", "ccpo"),  # saved without credit: the config's
        ("rtpo", "grpo", "rtpo", "rtpo"),  # a method trainer writes its own name
        ("seeupo", "grpo", None, "seeupo"),  # ... and is named before it has written any
        ("seeupo", "grpo", "", "seeupo"),
    ],
)
def test_viewer_names_the_estimator_the_run_used(tmp_path, trainer, estimator, credit, shown):
    from horizonrl.viz.data import Run, index_payload

    index = index_payload(Run(_run(tmp_path, trainer, estimator, credit)))
    assert index["estimator"] == shown and index["trainer"] == trainer


def test_zero_advantage_rate_is_the_first_declared_metric_a_run_reports(tmp_path):
    from horizonrl.reproduce.runner import summarize_run

    rows = [{"step": 1, "rtpo/zero_adv_rate": 0.25}, {"step": 2, "rtpo/zero_adv_rate": 0.75}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert summarize_run(tmp_path, [], 1.0)["zero_adv_group_rate"] is None
    both = ("train/zero_adv_group_rate", "rtpo/zero_adv_rate")
    assert summarize_run(tmp_path, [], 1.0, both)["zero_adv_group_rate"] == 0.5
    rows = [{**r, "train/zero_adv_group_rate": 0.0} for r in rows]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert summarize_run(tmp_path, [], 1.0, both)["zero_adv_group_rate"] == 0.0
