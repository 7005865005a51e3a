"""The package's import graph: no circles, and the layers of DESIGN.md point downward only."""

from __future__ import annotations

import ast
from pathlib import Path

import horizonrl

ROOT = Path(horizonrl.__file__).parent


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _graph(lazy: bool) -> dict[str, set[str]]:
    """Module -> package modules it imports (module level only unless ``lazy``; TYPE_CHECKING skipped)."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text())
        nodes = ast.walk(tree) if lazy else tree.body
        deps: set[str] = set()
        for node in nodes:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("horizonrl"):
                subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in mods]
                deps.update(subs or [node.module])
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith("horizonrl"))
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def test_no_import_circles_between_modules():
    graph = _graph(lazy=False)
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
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c) for c in cycles)


# DESIGN.md: trajectory depends on nothing; credit and losses never touch models, agents, envs or trainers.
FORBIDDEN = {
    "horizonrl.trajectory": ("horizonrl.credit", "horizonrl.losses", "horizonrl.envs", "horizonrl.agents",
                             "horizonrl.inference", "horizonrl.train", "horizonrl.models"),
    "horizonrl.credit": ("horizonrl.losses", "horizonrl.envs", "horizonrl.agents", "horizonrl.inference",
                         "horizonrl.train", "horizonrl.models"),
    "horizonrl.losses": ("horizonrl.credit", "horizonrl.envs", "horizonrl.agents", "horizonrl.inference",
                         "horizonrl.train", "horizonrl.models"),
    "horizonrl.envs": ("horizonrl.agents", "horizonrl.train", "horizonrl.inference"),
    "horizonrl.agents": ("horizonrl.train",),
}  # fmt: skip

# Inside train/ (its package docstring): records < update < rollout, warmstart < trainers < methods < recipes.
_T = "horizonrl.train."
TRAIN_FLOORS = [
    ("records",),
    ("update",),
    ("rollout", "warmstart"),
    ("trainers",),
    ("methods",),
    ("recipes",),
]
for _i, _floor in enumerate(TRAIN_FLOORS):
    _above = [_T + p for f in TRAIN_FLOORS[_i + 1 :] for p in f]
    for _pkg in _floor:
        _same = [_T + p for p in _floor if p != _pkg]  # packages on one floor do not import each other
        FORBIDDEN[_T + _pkg] = (*_above, *_same)


def test_every_train_module_is_on_a_floor():
    floors = {p for f in TRAIN_FLOORS for p in f}
    stray = [m for m in _modules() if m.startswith(_T) and m[len(_T) :].split(".")[0] not in floors]
    assert not stray, f"train modules outside the documented subpackages: {stray}"


def test_layers_point_downward():
    graph = _graph(lazy=True)
    bad = []
    for mod, deps in graph.items():
        for layer, banned in FORBIDDEN.items():
            if mod == layer or mod.startswith(layer + "."):
                bad += [f"{mod} -> {d}" for d in deps if any(d == b or d.startswith(b + ".") for b in banned)]
    assert not bad, "imports against the layering: " + "; ".join(sorted(bad))
