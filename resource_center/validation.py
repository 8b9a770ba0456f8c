"""What the resource center accepts: names, ``NAME[:VERSION]`` references and files.

Every refusal is an :class:`errors.InvalidResource` with one line naming the problem.
Names are checked here and again by a CHECK constraint on ``resources.name``; the
charset has no ``/``, ``\\`` or ``:`` and must start with a letter or digit, so a name can
never be a path (``..``, ``/etc``) nor be confused with a version suffix.
"""

from __future__ import annotations

import re
import zipfile
import zlib
from pathlib import Path
from typing import NamedTuple

from resource_center import errors

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
NAME_RULE = "1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"
# Suffixes spark-submit understands for a PySpark application or its --py-files /
# --jars; the cached copy keeps the suffix because spark-submit decides by it.
PYTHON_SUFFIXES = frozenset({".py"})
ZIP_SUFFIXES = frozenset({".zip", ".egg", ".jar"})
SUFFIXES = PYTHON_SUFFIXES | ZIP_SUFFIXES
# Setting that bounds uploads, named in the size refusal so an operator knows what to raise.
SIZE_SETTING = "SPARKRING_MAX_ARTIFACT_BYTES"


class Reference(NamedTuple):
    """A parsed ``NAME`` (version None: the latest) or ``NAME:VERSION`` (pinned)."""

    name: str
    version: int | None

    def __str__(self) -> str:
        return self.name if self.version is None else f"{self.name}:{self.version}"


def check_name(name: str) -> str:
    if not NAME_PATTERN.fullmatch(name):
        raise errors.InvalidResource(f"resource name {name!r} is invalid: use {NAME_RULE}")
    return name


def parse_reference(text: str) -> Reference:
    """``etl`` -> (etl, None); ``etl:3`` -> (etl, 3); anything else is refused."""
    name, colon, version = text.partition(":")
    if not colon:
        return Reference(check_name(name), None)
    check_name(name)
    if not version.isascii() or not version.isdigit() or int(version) < 1:
        raise errors.InvalidResource(
            f"resource reference {text!r} is invalid: the version after ':' must be a "
            "positive integer"
        )
    return Reference(name, int(version))


def human_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def suffix(filename: str) -> str:
    """The lower-cased suffix that decides how spark-submit receives the file."""
    return Path(filename).suffix.lower()


def check_file(path: Path, max_bytes: int) -> int:
    """Refuse anything that is not a regular, non-empty, allowed, intact file; its size."""
    kind = suffix(path.name)
    if kind not in SUFFIXES:
        allowed = ", ".join(sorted(SUFFIXES))
        raise errors.InvalidResource(
            f"{path.name}: unsupported file kind {kind or '(no suffix)'!r}; allowed: {allowed}"
        )
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise errors.InvalidResource(f"{path}: no such file") from None
    except OSError as exc:
        raise errors.InvalidResource(f"{path}: cannot read it ({exc.strerror})") from None
    if not path.is_file():
        raise errors.InvalidResource(f"{path}: not a regular file")
    if stat.st_size == 0:
        raise errors.InvalidResource(f"{path}: the file is empty")
    if stat.st_size > max_bytes:
        raise errors.InvalidResource(
            f"{path.name} is {human_size(stat.st_size)} ({stat.st_size} bytes), over the "
            f"limit of {max_bytes} bytes ({SIZE_SETTING})"
        )
    if kind in ZIP_SUFFIXES:
        _check_zip(path)
    return stat.st_size


def _check_zip(path: Path) -> None:
    """A .zip/.egg/.jar must open as a zip and every member's CRC must match."""
    try:
        with zipfile.ZipFile(path) as archive:
            broken = archive.testzip()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, ValueError) as exc:
        raise errors.InvalidResource(f"{path.name} is not a valid zip archive: {exc}") from None
    except OSError as exc:
        raise errors.InvalidResource(f"{path}: cannot read it ({exc.strerror})") from None
    if broken is not None:
        raise errors.InvalidResource(
            f"{path.name} is not a valid zip archive: member {broken!r} is corrupt"
        )
