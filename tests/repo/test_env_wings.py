"""envs/ in wings (its package docstring): core imports no other wing; the wings do not import each other.

``core`` is the protocol (what a newcomer learns), ``builtin`` the shipped environments, ``hubs`` the
adapters of environments defined elsewhere, ``sandbox`` the python sandbox. Every import counts,
lazy ones (inside functions) included; ``TYPE_CHECKING`` blocks too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import horizonrl.envs

ROOT = Path(horizonrl.envs.__file__).parent
PKG = "horizonrl.envs"
WINGS = ("core", "builtin", "hubs", "sandbox")
# wing -> the other wings it may import
ALLOWED = {"core": (), "builtin": ("core", "sandbox"), "hubs": ("core",), "sandbox": ()}


def _wing(module: str) -> str | None:
    rest = module[len(PKG) + 1 :] if module.startswith(PKG + ".") else ""
    return rest.split(".")[0] or None


def _envs_imports(path: Path) -> set[str]:
    """The ``horizonrl.envs`` modules and packages a file imports, anywhere in it."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == PKG:  # from horizonrl.envs import a submodule, or a public name
                out.update(f"{PKG}.{a.name}" for a in node.names if a.name in WINGS)
                out.add(PKG)
            elif node.module.startswith(PKG + "."):
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name == PKG or a.name.startswith(PKG + "."))
    return out


def test_every_envs_module_is_in_a_wing():
    stray = [p.name for p in ROOT.glob("*.py") if p.name != "__init__.py"]
    stray += [p.name for p in ROOT.iterdir() if p.is_dir() and p.name not in (*WINGS, "__pycache__")]
    assert not stray, f"envs/ modules outside the wings {WINGS}: {stray}"


def test_wings_import_only_what_their_floor_allows():
    bad = []
    for wing in WINGS:
        for path in sorted((ROOT / wing).rglob("*.py")):
            for dep in _envs_imports(path):
                target = _wing(dep)
                if target is None:
                    bad.append(f"{wing}/{path.relative_to(ROOT / wing)} -> {dep} (the package's public face)")
                elif target != wing and target not in ALLOWED[wing]:
                    bad.append(f"{wing}/{path.relative_to(ROOT / wing)} -> {dep}")
    assert not bad, "imports across the envs wings: " + "; ".join(bad)


def test_the_sandbox_imports_nothing_else_of_horizonrl():
    bad = []
    for path in sorted((ROOT / "sandbox").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("horizonrl"):
                mod = node.module
            elif isinstance(node, ast.Import):
                mod = next((a.name for a in node.names if a.name.startswith("horizonrl")), None)
            else:
                continue
            if mod and not mod.startswith(f"{PKG}.sandbox"):
                bad.append(f"{path.name} -> {mod}")
    assert not bad, bad
