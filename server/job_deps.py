"""A job's dependencies on a server: its deps zip (``resource_center/deps.py``) unpacked
once per content under ``<work dir>/deps/<sha256>``, readable by the driver user.

The zip is verified (the resource cache checks its SHA-256) and unpacked by ``zipfile``,
which keeps every member inside the folder (no absolute path, no ``..``) and makes no
links. It goes to a folder of its own first, renamed into place when complete: a start
that finds the folder finds it whole; two starts that unpack at once both succeed, the
second's copy is dropped.
"""

from __future__ import annotations

import os
import shutil
import zipfile
from pathlib import Path

DEPS_DIR = "deps"
# The folder name executors unpack the shipped zip under (``--archives zip#NAME``).
EXECUTOR_FOLDER = "sparkring_deps"


def unpacked(work_dir: Path, archive: Path, sha256: str) -> Path:
    """The folder holding ``archive``'s files (unpacked now if it is not yet)."""
    root = work_dir / DEPS_DIR
    folder = root / sha256
    if folder.is_dir():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    scratch = root / f".{sha256}.{os.getpid()}.{os.urandom(4).hex()}"
    try:
        with zipfile.ZipFile(archive) as zipped:
            zipped.extractall(scratch)
        _open_to_all(scratch)
        try:
            scratch.rename(folder)
        except OSError:
            if not folder.is_dir():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return folder


def _open_to_all(folder: Path) -> None:
    """Folders 0755, files 0644: the driver runs as a user of its own."""
    folder.chmod(0o755)
    for parent, dirs, files in os.walk(folder):
        for name in dirs:
            os.chmod(os.path.join(parent, name), 0o755)
        for name in files:
            os.chmod(os.path.join(parent, name), 0o644)
