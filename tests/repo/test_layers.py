"""The package's import graph: no circles, and the floors of docs/architecture.md point downward only.

Every import counts, at module level or inside a function (read with ``ast.walk``: a lazy import is
still an arrow), except those under ``if TYPE_CHECKING:`` (annotations only, never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

import horizonrl

ROOT = Path(horizonrl.__file__).parent
P = "horizonrl."


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _walk(nodes: list[ast.stmt], lazy: bool):
    """The statements (every node below them if ``lazy``), skipping ``if TYPE_CHECKING:`` bodies."""
    todo = list(reversed(nodes))
    while todo:
        node = todo.pop()
        yield node
        if _is_type_checking(node):
            todo.extend(reversed(node.orelse))
        elif lazy:
            todo.extend(reversed(list(ast.iter_child_nodes(node))))


def _graph(lazy: bool) -> dict[str, set[str]]:
    """Module -> package modules it imports (module level only unless ``lazy``; TYPE_CHECKING skipped)."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps: set[str] = set()
        for node in _walk(ast.parse(path.read_text()).body, lazy):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("horizonrl"):
                subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in mods]
                deps.update(subs or [node.module])
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith("horizonrl"))
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(u: str) -> None:
        state[u] = 1
        stack.append(u)
        for v in sorted(graph[u]):
            # a package's __init__ re-exporting its own submodules is not a circle
            if v.startswith(u + ".") or u.startswith(v + "."):
                continue
            if state.get(v) == 1:
                cycles.append([*stack[stack.index(v) :], v])
            elif not state.get(v):
                visit(v)
        stack.pop()
        state[u] = 2

    for m in sorted(graph):
        if not state.get(m):
            visit(m)
    return cycles


# Circles tolerated while a change that removes them is under way (none now); an entry is the sorted
# tuple of its modules.
ALLOWED_CIRCLES: set[tuple[str, ...]] = set()


def test_no_import_circles_between_modules():
    cycles = [c for c in _cycles(_graph(lazy=True)) if tuple(sorted(set(c))) not in ALLOWED_CIRCLES]
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_circle_check_sees_lazy_imports():
    # models.lora once imported train.records.checkpoint inside a function, which imports lora back.
    graph = {"a": {"b"}, "b": set()}
    src = "def f():\n    from horizonrl.b import x\n"
    nodes = [n for n in _walk(ast.parse(src).body, lazy=True) if isinstance(n, ast.ImportFrom)]
    assert [n.module for n in nodes] == ["horizonrl.b"]
    graph["b"].add("a")
    assert _cycles(graph) == [["a", "b", "a"]]
    hidden = "if TYPE_CHECKING:\n    from horizonrl.b import x\n"
    assert not [n for n in _walk(ast.parse(hidden).body, lazy=True) if isinstance(n, ast.ImportFrom)]


# The package's floors, top to bottom (docs/architecture.md; docs/design.md's layers): a module
# imports its own package and the floors below its own only; packages on one floor do not import
# each other. Every top-level package and module of horizonrl stands on one.
FLOORS = [
    ("cli",),
    ("reproduce", "serve", "viz"),  # tools over runs: they read train's records
    ("train",),
    ("gateway",),  # calls -> sessions -> rollouts for train.trainer=gateway
    ("api",),  # the OpenAI chat dialect shared by serve and gateway
    ("agents", "config"),
    ("envs",),
    ("rewards",),  # env.reward specs; the LLM judge below
    ("judge",),
    ("inference",),  # engines (judge and rewards reach its OpenAI client)
    ("models",),
    ("credit", "losses"),
    ("trajectory",),
    ("tool_formats", "math_answer", "cluster", "world", "userimport"),
    ("registry", "jsonl", "safe_yaml", "textparse", "sympy_worker", "vocab", "benchtools"),
    ("errors",),
]

# docs/design.md, beyond the floors: trajectory depends on nothing; credit and losses never touch models,
# agents, envs or trainers; environments never drive an engine (rewards reach an LLM judge's
# client, not envs).
FORBIDDEN: dict[str, tuple[str, ...]] = {
    P + "trajectory": tuple(
        P + p for p in ("credit", "losses", "envs", "agents", "inference", "train", "models")
    ),
    P + "credit": tuple(P + p for p in ("losses", "envs", "agents", "inference", "train", "models")),
    P + "losses": tuple(P + p for p in ("credit", "envs", "agents", "inference", "train", "models")),
    P + "envs": tuple(P + p for p in ("agents", "train", "inference")),
    P + "agents": (P + "train",),
}


def _add_floors(prefix: str, floors: list[tuple[str, ...]]) -> None:
    """Each package of ``floors`` (listed top to bottom) may not import those above it or beside it."""
    for i, floor in enumerate(floors):
        above = [prefix + p for f in floors[:i] for p in f]
        for pkg in floor:
            same = [prefix + p for p in floor if p != pkg]
            FORBIDDEN[prefix + pkg] = tuple(dict.fromkeys([*FORBIDDEN.get(prefix + pkg, ()), *above, *same]))


_add_floors(P, FLOORS)

# Inside train/ (its package docstring), top to bottom: recipes, methods, trainers, rollout and
# warmstart, update, records.
_T = "horizonrl.train."
TRAIN_FLOORS = [
    ("recipes",),
    ("methods",),
    ("trainers",),
    ("rollout", "warmstart"),
    ("update",),
    ("records",),
]
_add_floors(_T, TRAIN_FLOORS)

# Upward imports that are known and owned by another change (issue 43); remove an entry when its
# import is gone (test_the_allow_list_is_current fails on a stale one). Nothing is waived today.
ALLOWED: set[str] = set()


def _top(mod: str) -> str:
    return mod.split(".")[1] if "." in mod else mod


def test_every_package_is_on_a_floor():
    floors = {p for f in FLOORS for p in f}
    stray = sorted({_top(m) for m in _modules() if m != "horizonrl"} - floors)
    assert not stray, f"horizonrl packages or modules on no floor of FLOORS: {stray}"


def test_every_train_module_is_on_a_floor():
    floors = {p for f in TRAIN_FLOORS for p in f}
    stray = [m for m in _modules() if m.startswith(_T) and m[len(_T) :].split(".")[0] not in floors]
    assert not stray, f"train modules outside the documented subpackages: {stray}"


def _upward() -> list[str]:
    graph = _graph(lazy=True)
    bad = []
    for mod, deps in graph.items():
        for layer, banned in FORBIDDEN.items():
            if mod == layer or mod.startswith(layer + "."):
                bad += [f"{mod} -> {d}" for d in deps if any(d == b or d.startswith(b + ".") for b in banned)]
    return sorted(set(bad))


def test_layers_point_downward():
    bad = [b for b in _upward() if b not in ALLOWED]
    assert not bad, "imports against the layering: " + "; ".join(bad)


def test_the_allow_list_is_current():
    stale = sorted(ALLOWED - set(_upward()))
    assert not stale, f"allowed upward imports that no longer exist (remove them from ALLOWED): {stale}"


def test_the_circle_allow_list_is_current():
    found = {tuple(sorted(set(c))) for c in _cycles(_graph(lazy=True))}
    stale = sorted(ALLOWED_CIRCLES - found)
    assert not stale, f"allowed circles that no longer exist (remove them from ALLOWED_CIRCLES): {stale}"
