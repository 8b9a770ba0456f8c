"""Streaming jobs' checkpoint directories: which one a run gets, and whose it is.

A streaming job's checkpoint is ``<checkpoint_root>/<name>`` (``SPARKRING_CHECKPOINT_DIR``
in its driver's environment; docs/jobs.md). The path stays keyed by the job's name, so
that every server (old code or new, during a rolling upgrade) and the job's own code
find it where they always did. Whose it is is written inside it: the file
:data:`OWNER_FILE` holds the id of the job that owns it.

A name is reused when a job is deleted and created again (``job delete`` keeps its
checkpoints; ``apply --prune`` then re-apply). The new job must not resume the deleted
job's offsets and state (hole H6), and the deleted job's checkpoint must not be lost.
So, when a run of job ``J`` named ``N`` starts (:func:`prepare`):

- ``<root>/N`` absent: created, and marked as ``J``'s;
- marked as ``J``'s: used as it is;
- marked as another job's (a deleted namesake's): moved aside, intact, to
  ``<root>/.deleted/<id>-N`` (``<id>`` the owner it names), and a new one is created
  and marked as ``J``'s;
- not marked (left by the code before job ids were recorded, or created by hand): taken
  as ``J``'s and marked, once. Before that code there was no way to tell a deleted
  namesake's checkpoint from the job's own; docs/upgrade.md says what to check.

Only the claim holder of a job's current epoch starts its driver, and two existing jobs
never share a name, so nothing else writes the marker of a name meanwhile.
"""

from __future__ import annotations

import os
from pathlib import Path

OWNER_FILE = ".sparkring-job-id"
# Below the root, where checkpoints of deleted jobs go when their name is reused. Job
# names cannot start with a dot, so no job's checkpoint is ever here.
DELETED_DIR = ".deleted"


def owner(path: Path) -> str | None:
    """The job id the checkpoint at ``path`` is marked with; None when it is unmarked."""
    try:
        return (path / OWNER_FILE).read_text().strip() or None
    except FileNotFoundError:
        return None


def prepare(root: Path, name: str, job_id: int) -> Path:
    """The checkpoint directory of job ``job_id`` named ``name``, created if need be and
    marked as that job's; a deleted namesake's is moved aside first (module docstring).
    Raises OSError when the directory cannot be prepared (the caller defers the run)."""
    path = root / name
    found = owner(path)
    if found == str(job_id):
        return path
    if found is not None:
        aside = root / DELETED_DIR / f"{found if found.isdigit() else 'unknown'}-{name}"
        aside.parent.mkdir(parents=True, exist_ok=True)
        # rename(2) refuses nothing here: ids are never reused, so ``aside`` is new. If it
        # exists anyway (a marker edited by hand), the OSError defers the run.
        if aside.exists():
            raise FileExistsError(f"cannot move {path} aside: {aside} exists")
        os.rename(path, aside)
    path.mkdir(parents=True, exist_ok=True)
    # Written atomically: a marker read half-written would move the job's own checkpoint.
    partial = path / f"{OWNER_FILE}.{os.getpid()}.tmp"
    partial.write_text(f"{job_id}\n")
    os.replace(partial, path / OWNER_FILE)
    return path
