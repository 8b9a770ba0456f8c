"""A job's Python dependencies: a requirements file built once into a zip artifact.

``pip install --target`` installs the requirements into an empty folder with the
Python that runs sparkring (the drivers' Python: its version and platform decide which
wheels fit); the folder is zipped and stored in the resource center as the artifact
``deps-<key>``, where the key is a SHA-256 of the requirements' text, that Python's
version and the machine's architecture. A second job, or a second ``job update``, with
the same requirements and Python finds the artifact and builds nothing.

A server unpacks the zip once per content (``server/job_deps.py``) and puts the folder
first on the driver's ``PYTHONPATH``; a driver of a cluster master also ships the zip
to its executors (``--archives``, unpacked there as ``sparkring_deps``, put on their
``PYTHONPATH``). Executors must run the same Python version (docs/dependencies.md).

A build that fails is refused with pip's own last lines, before any job is changed.
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from sqlalchemy.engine import Engine

from resource_center import catalog, errors, store

# The largest requirements file read, and the longest build, seconds.
MAX_REQUIREMENTS_BYTES = 1024 * 1024
BUILD_TIMEOUT_S = 900.0
# How much of pip's output a refused build quotes (its end: where pip says why).
QUOTED_OUTPUT_CHARS = 3000
NAME_PREFIX = "deps-"
# Bumped when the layout of the built zip changes: an old build is not reused.
LAYOUT = "1"


class DepsError(errors.InvalidResource):
    """The requirements cannot be read or built (the message says why)."""


def python_tag() -> str:
    """``cp311-x86_64``: what a build is only good for (the drivers' Python, the CPU)."""
    return f"cp{sys.version_info.major}{sys.version_info.minor}-{platform.machine()}"


def read_requirements(path: Path) -> bytes:
    """The requirements file's bytes; refused by name when unreadable, empty or huge."""
    try:
        with path.open("rb") as handle:
            text = handle.read(MAX_REQUIREMENTS_BYTES + 1)
    except OSError as exc:
        raise DepsError(f"requirements {path}: cannot read it ({exc.strerror})") from None
    if len(text) > MAX_REQUIREMENTS_BYTES:
        raise DepsError(f"requirements {path}: over {MAX_REQUIREMENTS_BYTES} bytes")
    if not text.strip():
        raise DepsError(f"requirements {path}: the file is empty")
    return text


def artifact_name(requirements: bytes, tag: str) -> str:
    """``deps-<16 hex digits>``: the same text for the same Python gives the same name."""
    digest = hashlib.sha256(b"\0".join([LAYOUT.encode(), tag.encode(), requirements]))
    return NAME_PREFIX + digest.hexdigest()[:16]


def ensure(
    engine: Engine,
    bucket: store.Store,
    requirements: Path,
    *,
    max_bytes: int,
) -> tuple[catalog.Resource, bool]:
    """The deps artifact of ``requirements``: the one stored, or built and stored now;
    and whether it was built. Raises DepsError when pip fails."""
    text = read_requirements(requirements)
    name = artifact_name(text, python_tag())
    stored = catalog.list_resources(engine, name)
    if stored:
        return max(stored, key=lambda r: r.version), False
    with tempfile.TemporaryDirectory(prefix="sparkring-deps-") as scratch:
        folder = Path(scratch)
        target = folder / "site"
        _install(requirements, text, folder, target)
        archive = folder / f"{name}.zip"
        _zip(target, archive)
        return catalog.upload(engine, bucket, name=name, path=archive, max_bytes=max_bytes), True


def _install(requirements: Path, text: bytes, folder: Path, target: Path) -> None:
    """``pip install --target`` of the requirements' text, run beside the original file
    (a relative path in it, ``-r other.txt`` or ``./wheels/x.whl``, means what it meant)."""
    copy = folder / "requirements.txt"
    copy.write_bytes(text)
    output = folder / "pip.log"
    argv = [
        sys.executable, "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
        "--no-warn-script-location", "--target", str(target), "-r", str(copy),
    ]  # fmt: skip
    with output.open("wb") as log:
        try:
            done = subprocess.run(
                argv,
                cwd=requirements.resolve().parent,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=BUILD_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise DepsError(
                f"requirements {requirements}: pip install took over {BUILD_TIMEOUT_S:g} s"
            ) from None
    if done.returncode != 0:
        tail = _tail(output)
        raise DepsError(
            f"requirements {requirements}: pip install failed (exit {done.returncode}); "
            f"its last lines:\n{tail}"
        )
    if not target.is_dir() or not any(target.iterdir()):
        raise DepsError(f"requirements {requirements}: pip installed nothing")


def _tail(path: Path) -> str:
    with path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - QUOTED_OUTPUT_CHARS))
        return handle.read().decode("utf-8", errors="replace").strip()


def _zip(folder: Path, archive: Path) -> None:
    """Every regular file under ``folder``, in name order, without bytecode caches
    (Python writes its own where it may). A link is stored as the file it names only
    when that file is inside the folder; others are left out."""
    root = folder.resolve()
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as out:
        for path in sorted(folder.rglob("*")):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            if path.is_symlink() and not path.resolve().is_relative_to(root):
                continue
            out.write(path, path.relative_to(folder).as_posix())
