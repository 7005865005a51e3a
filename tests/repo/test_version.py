"""The package version: one place (``horizonrl.__version__``), printed by ``horizonrl --version`` and
matching the newest release of CHANGELOG.md."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

import horizonrl
from horizonrl.cli import main

ROOT = Path(__file__).resolve().parents[2]
RELEASE = re.compile(r"^## \[(\d+)\.(\d+)\.(\d+)\](.*)$")


def _releases() -> list[tuple[tuple[int, int, int], str, list[str]]]:
    """Each ``## [X.Y.Z]`` section of CHANGELOG.md, newest first: (version, heading rest, body lines)."""
    out: list[tuple[tuple[int, int, int], str, list[str]]] = []
    body: list[str] | None = None
    for line in (ROOT / "CHANGELOG.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            m = RELEASE.match(line)
            body = None
            if m:
                body = []
                out.append(((int(m[1]), int(m[2]), int(m[3])), m[4], body))
        elif body is not None:
            body.append(line)
    return out


def test_version_flag_prints_package_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"horizonrl {horizonrl.__version__}"


def test_newest_release_is_the_package_version():
    releases = _releases()
    assert releases, "CHANGELOG.md has no ## [X.Y.Z] release"
    assert ".".join(map(str, releases[0][0])) == horizonrl.__version__


def test_releases_are_dated_nonempty_and_descending():
    releases = _releases()
    for version, rest, body in releases:
        assert re.fullmatch(r" - \d{4}-\d{2}-\d{2}", rest), f"{version}: heading has no date: {rest!r}"
        assert any(line.startswith("- ") for line in body), f"{version}: no entry"
    versions = [v for v, _, _ in releases]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions)
    dates = [rest for _, rest, _ in releases]
    assert dates == sorted(dates, reverse=True)


def test_pyproject_reads_the_version_from_the_package():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    if "version" in project["project"]:  # a literal version must agree
        assert project["project"]["version"] == horizonrl.__version__
    else:
        assert "version" in project["project"]["dynamic"]
        attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
        assert attr == "horizonrl.__version__"
