"""A job's Python dependencies (resource_center/deps.py, server/job_deps.py): a
requirements file built once by pip into a deps artifact in S3, refused with pip's own
words when it cannot be built, unpacked on a server once per content and only inside its
folder. Real pip (the package registry), PostgreSQL and S3."""

from __future__ import annotations

import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import sqlalchemy as sa

from resource_center import catalog, deps, store
from server import job_deps

# A small pure-Python package the servers' own environment does not have.
PACKAGE = "tabulate==0.9.0"


def test_the_package_is_not_in_the_servers_environment() -> None:
    """What the other tests prove would prove nothing if the servers had it already."""
    found = subprocess.run([sys.executable, "-c", "import tabulate"], capture_output=True)
    assert found.returncode != 0


def test_requirements_are_built_once_and_unpacked_where_they_import(
    engine: sa.Engine, bucket: store.Store, tmp_path: Path
) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(PACKAGE + "\n")
    resource, built = deps.ensure(engine, bucket, requirements, max_bytes=1 << 30)
    assert built and resource.name.startswith("deps-") and resource.filename.endswith(".zip")
    again, built_again = deps.ensure(engine, bucket, requirements, max_bytes=1 << 30)
    assert (again.id, built_again) == (resource.id, False)
    archive = tmp_path / "deps.zip"
    archive.write_bytes(b"".join(bucket.read(resource.object_key)))
    folder = job_deps.unpacked(tmp_path / "work", archive, resource.sha256)
    assert job_deps.unpacked(tmp_path / "work", archive, resource.sha256) == folder
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    imported = subprocess.run(
        [sys.executable, "-c", "import tabulate; print(tabulate.__version__)"],
        env={"PYTHONPATH": str(folder)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert imported.stdout.strip() == "0.9.0"


def test_a_build_that_fails_is_refused_with_pips_words_and_stores_nothing(
    engine: sa.Engine, bucket: store.Store, tmp_path: Path
) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("sparkring-no-such-package-anywhere==1.0\n")
    with pytest.raises(deps.DepsError) as refused:
        deps.ensure(engine, bucket, requirements, max_bytes=1 << 30)
    message = str(refused.value)
    assert "pip install failed" in message
    assert "sparkring-no-such-package-anywhere" in message
    assert catalog.list_resources(engine) == []


@pytest.mark.parametrize(
    ("content", "fragment"), [(b"", "is empty"), (b"x" * (deps.MAX_REQUIREMENTS_BYTES + 1), "over")]
)
def test_requirements_that_cannot_be_built_are_refused_before_pip(
    tmp_path: Path, content: bytes, fragment: str
) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_bytes(content)
    with pytest.raises(deps.DepsError, match=fragment):
        deps.read_requirements(requirements)


def test_the_same_text_for_another_python_is_another_artifact() -> None:
    text = b"tabulate==0.9.0\n"
    assert deps.artifact_name(text, "cp311-x86_64") != deps.artifact_name(text, "cp312-x86_64")
    assert deps.artifact_name(text, "cp311-x86_64") == deps.artifact_name(text, "cp311-x86_64")


def test_a_member_that_climbs_out_is_unpacked_inside(tmp_path: Path) -> None:
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as out:
        out.writestr("../../outside.py", "x = 1\n")
        out.writestr("/abs.py", "y = 2\n")
    folder = job_deps.unpacked(tmp_path / "work", archive, "0" * 64)
    assert not (tmp_path / "outside.py").exists()
    assert sorted(p.name for p in folder.rglob("*.py")) == ["abs.py", "outside.py"]
    assert all(p.resolve().is_relative_to(folder.resolve()) for p in folder.rglob("*"))
