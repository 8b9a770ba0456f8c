"""The version of sparkring: written once, in ``pyproject.toml``, and read back from the
installed package's metadata (``sparkring --version``, each server's registration)."""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "sparkring"
# A source tree run without being installed has no metadata to read.
UNKNOWN = "0+unknown"


def current() -> str:
    """The installed version of sparkring."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return UNKNOWN
