"""Names, references and files the resource center accepts (pure logic, no services)."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resource_center import errors, store, validation
from sql import tables

NAMES = st.from_regex(validation.NAME_PATTERN, fullmatch=True)


@given(NAMES)
def test_every_valid_name_is_a_plain_file_name_and_passes_the_table_check(name: str) -> None:
    assert validation.check_name(name) == name
    assert "/" not in name and "\\" not in name and ":" not in name
    assert name not in (".", "..") and not name.startswith(".")
    checks = [getattr(c, "sqltext", "") for c in tables.resources.constraints]
    pattern = next(str(text) for text in checks if str(text).startswith("name ~")).split("'")[1]
    assert re.fullmatch(pattern, name)


@given(NAMES, st.integers(min_value=1, max_value=2**31 - 1))
def test_references_round_trip(name: str, version: int) -> None:
    assert validation.parse_reference(name) == (name, None)
    pinned = validation.parse_reference(f"{name}:{version}")
    assert pinned == (name, version)
    assert validation.parse_reference(str(pinned)) == pinned


@given(st.text(max_size=140))
def test_any_text_is_accepted_or_refused_with_one_line(text: str) -> None:
    try:
        reference = validation.parse_reference(text)
    except errors.InvalidResource as exc:
        assert "\n" not in str(exc).replace(repr(text), "")
    else:
        assert validation.NAME_PATTERN.fullmatch(reference.name)


@pytest.mark.parametrize(
    "text", ["", "..", ".hidden", "a/b", "a\\b", "-x", "x" * 129, "etl:", "etl:0", "etl:-1",
             "etl:1:2", "etl:v1", "etl:\u0661"]
)  # fmt: skip
def test_bad_references_are_refused(text: str) -> None:
    with pytest.raises(errors.InvalidResource):
        validation.parse_reference(text)


def test_file_kinds(tmp_path: Path) -> None:
    jar = tmp_path / "lib.JAR"
    with zipfile.ZipFile(jar, "w") as archive:
        archive.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
    assert validation.check_file(jar, 10_000) == jar.stat().st_size
    assert validation.suffix(jar.name) == ".jar"
    with pytest.raises(errors.InvalidResource, match="no such file"):
        validation.check_file(tmp_path / "missing.py", 10)
    with pytest.raises(errors.InvalidResource, match="not a regular file"):
        (tmp_path / "dir.py").mkdir()
        validation.check_file(tmp_path / "dir.py", 10)
    with pytest.raises(errors.InvalidResource, match=r"unsupported file kind '\(no suffix\)'"):
        validation.check_file(tmp_path / "Makefile", 10)


def test_corrupt_zip_member_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "deps.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr("pkg/mod.py", "VALUE = 'intact'\n")
    data = path.read_bytes().replace(b"intact", b"broken")
    path.write_bytes(data)
    with pytest.raises(errors.InvalidResource, match=r"member 'pkg/mod\.py' is corrupt"):
        validation.check_file(path, 10_000)


@pytest.mark.parametrize(
    ("endpoint", "secure", "expected"),
    [
        ("127.0.0.1:19000", False, ("127.0.0.1:19000", False)),
        ("minio:9000", True, ("minio:9000", True)),
        ("http://minio:9000", True, ("minio:9000", False)),
        ("https://minio:9000/", False, ("minio:9000", True)),
    ],
)
def test_endpoints(endpoint: str, secure: bool, expected: tuple[str, bool]) -> None:
    assert store.parse_endpoint(endpoint, secure) == expected


@pytest.mark.parametrize(
    "endpoint", ["ftp://minio:21", "http://minio:9000/bucket", "http://user:pw@minio:9000", ""]
)
def test_bad_endpoints_are_refused_without_credentials(endpoint: str) -> None:
    with pytest.raises(errors.StoreError) as caught:
        store.parse_endpoint(endpoint, False)
    assert "pw" not in str(caught.value)
