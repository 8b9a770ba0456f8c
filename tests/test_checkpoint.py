"""Streaming checkpoints: whose a checkpoint directory is, and what a run gets (no
services: plain files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from server import checkpoint


def test_a_new_job_gets_a_new_directory_marked_as_its_own(tmp_path: Path) -> None:
    path = checkpoint.prepare(tmp_path, "s", 7)
    assert path == tmp_path / "s" and path.is_dir()
    assert checkpoint.owner(path) == "7"
    (path / "offsets").mkdir()
    assert checkpoint.prepare(tmp_path, "s", 7) == path  # the next run resumes it
    assert (path / "offsets").is_dir()


def test_a_deleted_namesakes_checkpoint_is_moved_aside_intact(tmp_path: Path) -> None:
    deleted = checkpoint.prepare(tmp_path, "s", 7)
    (deleted / "offsets").mkdir()
    path = checkpoint.prepare(tmp_path, "s", 8)  # job 7 deleted, s created again
    assert path == tmp_path / "s" and not (path / "offsets").exists()
    assert checkpoint.owner(path) == "8"
    aside = tmp_path / checkpoint.DELETED_DIR / "7-s"
    assert (aside / "offsets").is_dir() and checkpoint.owner(aside) == "7"


def test_an_unmarked_checkpoint_of_the_older_code_is_kept_and_marked(tmp_path: Path) -> None:
    (tmp_path / "s" / "offsets").mkdir(parents=True)
    path = checkpoint.prepare(tmp_path, "s", 8)
    assert (path / "offsets").is_dir() and checkpoint.owner(path) == "8"


def test_a_checkpoint_that_cannot_be_moved_aside_is_refused(tmp_path: Path) -> None:
    (tmp_path / checkpoint.DELETED_DIR / "7-s").mkdir(parents=True)
    checkpoint.prepare(tmp_path, "s", 7)
    with pytest.raises(OSError):
        checkpoint.prepare(tmp_path, "s", 8)
    assert checkpoint.owner(tmp_path / "s") == "7"  # left as it was: the run defers
