"""Streaming checkpoints: whose a checkpoint directory is, and what a run gets (plain
files), then what a hostile job can plant in its own checkpoint: files made by the real
driver user in a directory it owns, and the server's ``prepare`` run against them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from server import checkpoint, driver_user


def test_a_new_job_gets_a_new_directory_recorded_as_its_own(tmp_path: Path) -> None:
    path = checkpoint.prepare(tmp_path, "s", 7)
    assert path == tmp_path / "s" and path.is_dir()
    assert checkpoint.owner(tmp_path, "s") == "7"
    # Recorded beside the checkpoint, in a folder of the server's, never inside it.
    assert (tmp_path / checkpoint.OWNERS_DIR / "s").read_text() == "7\n"
    assert os.listdir(path) == []
    (path / "offsets").mkdir()
    assert checkpoint.prepare(tmp_path, "s", 7) == path  # the next run resumes it
    assert (path / "offsets").is_dir()


def test_a_deleted_namesakes_checkpoint_is_moved_aside_intact(tmp_path: Path) -> None:
    deleted = checkpoint.prepare(tmp_path, "s", 7)
    (deleted / "offsets").mkdir()
    path = checkpoint.prepare(tmp_path, "s", 8)  # job 7 deleted, s created again
    assert path == tmp_path / "s" and not (path / "offsets").exists()
    assert checkpoint.owner(tmp_path, "s") == "8"
    aside = tmp_path / checkpoint.DELETED_DIR / "7-s"
    assert (aside / "offsets").is_dir()


def test_an_unmarked_checkpoint_of_the_older_code_is_kept_and_recorded(tmp_path: Path) -> None:
    (tmp_path / "s" / "offsets").mkdir(parents=True)
    path = checkpoint.prepare(tmp_path, "s", 8)
    assert (path / "offsets").is_dir() and checkpoint.owner(tmp_path, "s") == "8"


def test_a_legacy_marker_inside_the_checkpoint_still_decides_once(tmp_path: Path) -> None:
    """Upgrade: code before 2026-11-28 marked the owner inside the checkpoint. Its word
    is taken (a namesake's checkpoint is moved aside) and recorded beside it."""
    (tmp_path / "s" / "offsets").mkdir(parents=True)
    (tmp_path / "s" / checkpoint.LEGACY_OWNER_FILE).write_text("7\n")
    assert checkpoint.prepare(tmp_path, "s", 7) == tmp_path / "s"
    assert (tmp_path / "s" / "offsets").is_dir()
    assert (tmp_path / checkpoint.OWNERS_DIR / "s").read_text() == "7\n"
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / checkpoint.LEGACY_OWNER_FILE).write_text("5\n")
    checkpoint.prepare(tmp_path, "t", 9)
    assert (tmp_path / checkpoint.DELETED_DIR / "5-t" / checkpoint.LEGACY_OWNER_FILE).exists()
    assert checkpoint.owner(tmp_path, "t") == "9"


def test_a_checkpoint_that_cannot_be_moved_aside_is_refused(tmp_path: Path) -> None:
    (tmp_path / checkpoint.DELETED_DIR / "7-s").mkdir(parents=True)
    checkpoint.prepare(tmp_path, "s", 7)
    with pytest.raises(OSError):
        checkpoint.prepare(tmp_path, "s", 8)
    assert checkpoint.owner(tmp_path, "s") == "7"  # left as it was: the run defers


def test_read_small_file_reads_only_small_regular_files(tmp_path: Path) -> None:
    (tmp_path / "ok").write_text("12\n")
    (tmp_path / "big").write_bytes(b"1" * (checkpoint.MARKER_MAX_BYTES + 1))
    (tmp_path / "link").symlink_to(tmp_path / "ok")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "binary").write_bytes(b"\xff\xfe")
    assert checkpoint.read_small_file(tmp_path / "ok") == "12\n"
    for name in ("big", "link", "fifo", "binary", "absent"):
        assert checkpoint.read_small_file(tmp_path / name) is None, name
    assert checkpoint.read_small_file(Path("/dev/zero")) is None


# --- a hostile job's checkpoint ----------------------------------------------------------


@pytest.fixture
def user(driver_account: driver_user.DriverUser) -> driver_user.DriverUser:
    return driver_account


@pytest.fixture
def root(tmp_path: Path, user: driver_user.DriverUser) -> Path:
    """A checkpoint root as a server keeps it (its own), with job 7's checkpoint ``s``
    left by the code before 2026-11-28 (its owner marker inside), given to the driver
    user as a run's start gives it."""
    for folder in (tmp_path.parent.parent, tmp_path.parent, tmp_path):
        folder.chmod(folder.stat().st_mode | 0o711)
    root = tmp_path / "checkpoints"
    (root / "s" / "offsets").mkdir(parents=True)
    (root / "s" / checkpoint.LEGACY_OWNER_FILE).write_text("7\n")
    driver_user.give_tree(root / "s", user)
    return root


def _as_driver(user: driver_user.DriverUser, *argv: str) -> None:
    """Run ``argv`` as the driver user: what a job's code can do in its checkpoint."""
    subprocess.run(["runuser", "-u", user.name, "--", *argv], check=True, timeout=30)


def _prepare_bounded(root: Path, name: str, job_id: int) -> subprocess.CompletedProcess[str]:
    """``checkpoint.prepare`` in a process of its own with 512 MiB of address space and
    20 s: a start that blocks, or reads without bound, fails instead of hanging the
    suite or eating the machine."""
    code = textwrap.dedent(
        f"""
        import resource, sys
        from pathlib import Path
        resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))
        from server import checkpoint
        print(checkpoint.prepare(Path({str(root)!r}), {name!r}, {job_id}))
        # This process's own peak (ru_maxrss would count the forked parent's, from
        # before the exec).
        peak = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")]
        print(peak[0].split()[1])
        """
    )
    try:
        return subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=20
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"prepare did not return within 20 s: {exc}") from None


def test_a_link_planted_at_the_old_temporary_name_is_never_written_through(
    root: Path, user: driver_user.DriverUser, tmp_path: Path
) -> None:
    """The job unlinks its marker and plants ``.sparkring-job-id.<server pid>.tmp`` as a
    link to a file of root's elsewhere: the code before 2026-11-28 wrote the job id
    into that file at the next start."""
    victim = tmp_path / "elsewhere" / "root-owned"
    victim.parent.mkdir()
    victim.write_text("untouched\n")
    marker = root / "s" / checkpoint.LEGACY_OWNER_FILE
    _as_driver(user, "rm", "-f", str(marker))
    planted = root / "s" / f"{checkpoint.LEGACY_OWNER_FILE}.{os.getpid()}.tmp"
    _as_driver(user, "ln", "-s", str(victim), str(planted))
    assert checkpoint.prepare(root, "s", 7) == root / "s"
    assert victim.read_text() == "untouched\n"
    assert planted.is_symlink() and not marker.exists()  # the server wrote nothing there
    assert checkpoint.owner(root, "s") == "7"
    assert (root / "s" / "offsets").is_dir()


@pytest.mark.parametrize(
    "plant",
    [
        pytest.param(["mkfifo", "{marker}"], id="fifo"),
        pytest.param(["ln", "-s", "/dev/zero", "{marker}"], id="link-to-dev-zero"),
        pytest.param(["truncate", "-s", "100G", "{marker}"], id="sparse-100g"),
    ],
)
def test_a_hostile_marker_neither_hangs_nor_grows_the_server(
    root: Path, user: driver_user.DriverUser, plant: list[str]
) -> None:
    marker = root / "s" / checkpoint.LEGACY_OWNER_FILE
    _as_driver(user, "rm", "-f", str(marker))
    _as_driver(user, *(arg.format(marker=marker) for arg in plant))
    done = _prepare_bounded(root, "s", 7)
    assert done.returncode == 0, done.stderr[-2000:]
    path, peak_kib = done.stdout.split()
    assert path == str(root / "s")
    assert int(peak_kib) < 200 << 10  # a reader of the marker whole would need GBs
    assert checkpoint.owner(root, "s") == "7"  # no marker: the job's own name decides
    assert (root / "s" / "offsets").is_dir()


def test_give_tree_changes_nothing_outside_through_a_link(
    tmp_path: Path, user: driver_user.DriverUser
) -> None:
    for folder in (tmp_path.parent.parent, tmp_path.parent, tmp_path):
        folder.chmod(folder.stat().st_mode | 0o711)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "file").write_text("x")
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "f").write_text("y")
    (tree / "link").symlink_to(outside)
    driver_user.give_tree(tree, user)
    assert (tree / "sub" / "f").stat().st_uid == user.uid
    assert (tree / "link").lstat().st_uid == user.uid
    assert (outside / "file").stat().st_uid == os.geteuid()
    assert outside.stat().st_uid == os.geteuid()
