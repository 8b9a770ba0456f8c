"""Streaming jobs' checkpoint directories: which one a run gets, and whose it is.

A streaming job's checkpoint is ``<checkpoint_root>/<name>`` (``SPARKRING_CHECKPOINT_DIR``
in its driver's environment; docs/jobs.md). The path stays keyed by the job's name, so
that every server (old code or new, during a rolling upgrade) and the job's own code
find it where they always did. Whose it is is recorded beside it, never inside it: the
file ``<root>/.owners/<name>`` (:data:`OWNERS_DIR`) holds the id of the job that owns
it. The checkpoint itself belongs to the driver's user, who may put anything there; the
server writes nothing below it and opens nothing there but the legacy marker below,
read with care.

A name is reused when a job is deleted and created again (``job delete`` keeps its
checkpoints; ``apply --prune`` then re-apply). The new job must not resume the deleted
job's offsets and state (hole H6), and the deleted job's checkpoint must not be lost.
So, when a run of job ``J`` named ``N`` starts (:func:`prepare`):

- ``<root>/N`` absent: created, and recorded as ``J``'s;
- recorded as ``J``'s: used as it is;
- recorded as another job's (a deleted namesake's): moved aside, intact, to
  ``<root>/.deleted/<id>-N`` (``<id>`` the owner it names), and a new one is created
  and recorded as ``J``'s;
- not recorded: the marker that code before 2026-11-28 kept inside the checkpoint
  (:data:`LEGACY_OWNER_FILE`) decides as a record would, and the record is written; a
  checkpoint with neither (created by hand, or before job ids were recorded) is taken
  as ``J``'s, once. docs/upgrade.md says what to check.

The legacy marker lives in a directory the driver's user writes, so it is opened
without following a link and without blocking (a FIFO), only when it is a regular file,
and at most :data:`MARKER_MAX_BYTES` of it are read: a marker that is anything else is
no marker (docs/security.md, "Files a driver can write").

Only the claim holder of a job's current epoch starts its driver, and two existing jobs
never share a name, so nothing else writes the record of a name meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

# Below the root, the server's record of whose each checkpoint is (one file per name).
# Job names cannot start with a dot, so no job's checkpoint is ever here.
OWNERS_DIR = ".owners"
# Below the root, where checkpoints of deleted jobs go when their name is reused.
DELETED_DIR = ".deleted"
# The owner marker code before 2026-11-28 wrote inside the checkpoint; read, never written.
LEGACY_OWNER_FILE = ".sparkring-job-id"
# A job id in decimal and a newline: anything longer is not a marker.
MARKER_MAX_BYTES = 32


def read_small_file(path: Path, limit: int = MARKER_MAX_BYTES) -> str | None:
    """The text of ``path`` when it is a regular file of at most ``limit`` bytes, opened
    without following a link at its last component and without blocking; None when it is
    absent, a link, a FIFO, a device, a directory, larger, or not text."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError:  # absent, a symbolic link (ELOOP), unreadable
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > limit:
        return None
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        return None


def _job_id(text: str | None) -> str | None:
    value = (text or "").strip()
    return value if value.isdigit() else None


def owner(root: Path, name: str) -> str | None:
    """The id of the job that checkpoint ``name`` under ``root`` is recorded as; else the
    one its legacy marker names; None when neither says (or says nonsense)."""
    recorded = _job_id(read_small_file(root / OWNERS_DIR / name))
    if recorded is not None:
        return recorded
    return _job_id(read_small_file(root / name / LEGACY_OWNER_FILE))


def _record(root: Path, name: str, job_id: int) -> None:
    """Write ``<root>/.owners/<name>`` atomically: a new file of ours (``mkstemp``:
    O_EXCL, in a folder only the server writes), then renamed over the old record."""
    owners = root / OWNERS_DIR
    owners.mkdir(mode=0o755, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=owners)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(f"{job_id}\n")
        os.chmod(partial, 0o644)
        os.replace(partial, owners / name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise


def prepare(root: Path, name: str, job_id: int) -> Path:
    """The checkpoint directory of job ``job_id`` named ``name``, created if need be and
    recorded as that job's; a deleted namesake's is moved aside first (module docstring).
    Raises OSError when the directory cannot be prepared (the caller defers the run)."""
    path = root / name
    found = owner(root, name)
    if found == str(job_id):
        if not (root / OWNERS_DIR / name).is_file():
            _record(root, name, job_id)  # a legacy marker said so: recorded from now on
        if path.is_dir():
            return path
    elif found is not None and os.path.lexists(path):
        aside = root / DELETED_DIR / f"{found}-{name}"
        aside.parent.mkdir(parents=True, exist_ok=True)
        # rename(2) refuses nothing here: ids are never reused, so ``aside`` is new. If it
        # exists anyway (a record edited by hand), the OSError defers the run.
        if os.path.lexists(aside):
            raise FileExistsError(f"cannot move {path} aside: {aside} exists")
        os.rename(path, aside)
    path.mkdir(parents=True, exist_ok=True)
    _record(root, name, job_id)
    return path
