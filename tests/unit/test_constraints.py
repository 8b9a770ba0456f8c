"""constraints.txt pins every dependency of pyproject.toml (runtime and tests), so
scripts/bootstrap.sh and the Dockerfile install the same versions everywhere, and the
versions installed here are the pinned ones."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep, f"constraints.txt: {line!r} is not NAME==VERSION"
            pins[_name(name)] = version.strip()
    return pins


def test_every_dependency_is_pinned_and_installed_at_its_pin() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = {_name(r) for r in project["dependencies"]}
    wanted |= {_name(r) for extra in project["optional-dependencies"].values() for r in extra}
    pins = _pins()
    assert sorted(wanted - set(pins)) == []
    for name in sorted(wanted):
        assert metadata.version(name) == pins[name], name


def test_the_image_and_the_bootstrap_install_with_the_constraints() -> None:
    assert "-c constraints.txt" in (REPO / "scripts" / "bootstrap.sh").read_text()
    assert (
        "pip install -c /tmp/constraints.txt /tmp/sparkring-src"
        in (REPO / "Dockerfile").read_text()
    )
    assert "!constraints.txt" in (REPO / ".dockerignore").read_text()
