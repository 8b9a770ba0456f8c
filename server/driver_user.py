"""The OS user drivers run as (``SPARKRING_DRIVER_USER``): who it is, whether this server
can switch to it, and which of the run's paths it may reach.

A job's code runs with the rights of its driver's user. Under the server's own user it
could read the server's credentials (``/proc/<server pid>/environ``: the S3 secret, the
database URL) and rewrite its own fencing (``lease.json`` in its run directory). Under a
user of its own it can do neither: ``/proc/<pid>/environ`` of another user's process is
unreadable, and the run's control files are the server's (docs/drivers.md, "The driver's
user").

The server (root, or holding CAP_SETUID, CAP_SETGID, CAP_KILL and CAP_CHOWN) starts each
watchdog as itself; the watchdog starts the driver as this user, with the user's own
group and no supplementary groups. The driver owns only its private working directory
(``cwd/`` of the run, also its HOME) and its streaming checkpoint.

This module never reads ``os.environ``: the name comes from the settings.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

# Capability numbers (linux/capability.h) a non-root server needs to run drivers under
# another user: switch to it (SETUID, SETGID), signal its processes (KILL) and give it
# its working directory and checkpoint (CHOWN).
CAP_CHOWN = 0
CAP_KILL = 5
CAP_SETGID = 6
CAP_SETUID = 7
REQUIRED_CAPABILITIES = {
    "CAP_CHOWN": CAP_CHOWN,
    "CAP_KILL": CAP_KILL,
    "CAP_SETGID": CAP_SETGID,
    "CAP_SETUID": CAP_SETUID,
}


class DriverUserError(Exception):
    """The driver user cannot be used; the message names the setting and the problem."""


@dataclass(frozen=True)
class DriverUser:
    """A resolved driver user: its name, uid and primary group."""

    name: str
    uid: int
    gid: int

    def describe(self) -> str:
        return f"{self.name} (uid {self.uid}, gid {self.gid})"


def resolve(name: str) -> DriverUser:
    """The user called ``name`` (a name or a numeric uid), checked to be usable: it
    exists, it is not root, and it is not the user this process runs as (that would
    isolate nothing). Raises :class:`DriverUserError` otherwise."""
    setting = "SPARKRING_DRIVER_USER"
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, OverflowError):
        raise DriverUserError(
            f"{setting}: no user {name!r} on this host (scripts/bootstrap.sh creates "
            "sparkring-driver; in the image it exists)"
        ) from None
    if entry.pw_uid == 0:
        raise DriverUserError(f"{setting}: {name!r} is root; drivers must not run as root")
    if entry.pw_uid == os.geteuid():
        raise DriverUserError(
            f"{setting}: {name!r} is the server's own user (uid {entry.pw_uid}); drivers "
            "under it can read the server's credentials. Use a user of their own"
        )
    if entry.pw_gid == 0:
        raise DriverUserError(f"{setting}: {name!r} has root's group as its primary group")
    return DriverUser(name=entry.pw_name, uid=entry.pw_uid, gid=entry.pw_gid)


def effective_capabilities() -> int:
    """This process's effective capability set (a bit mask), from /proc/self/status."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def missing_capabilities(capabilities: int | None = None) -> list[str]:
    """The capabilities from :data:`REQUIRED_CAPABILITIES` this process lacks (none for
    root, which holds them all)."""
    held = effective_capabilities() if capabilities is None else capabilities
    return [name for name, bit in REQUIRED_CAPABILITIES.items() if not held >> bit & 1]


def check_can_switch(user: DriverUser) -> None:
    """Raise :class:`DriverUserError` when this process cannot start, signal and equip
    processes of ``user`` (it lacks one of :data:`REQUIRED_CAPABILITIES`)."""
    missing = missing_capabilities()
    if missing:
        raise DriverUserError(
            f"SPARKRING_DRIVER_USER={user.name}: the server runs as uid {os.geteuid()} "
            f"without {', '.join(missing)}; run it as root or grant them "
            "(docs/deployment.md, 'The driver user')"
        )


def _may(st: os.stat_result, user: DriverUser, bits: tuple[int, int, int]) -> bool:
    """``user`` holds the permission given as (owner, group, other) mode bits on ``st``
    (its primary group only: drivers get no supplementary groups)."""
    owner_bit, group_bit, other_bit = bits
    if st.st_uid == user.uid:
        return bool(st.st_mode & owner_bit)
    if st.st_gid == user.gid:
        return bool(st.st_mode & group_bit)
    return bool(st.st_mode & other_bit)


def unreachable(path: Path, user: DriverUser) -> Path | None:
    """The first directory on the way to ``path`` (itself included, if it exists) that
    ``user`` cannot pass through, or None when it can reach ``path``."""
    path = path.absolute()
    for step in [*reversed(path.parents), path]:
        try:
            st = step.stat()
        except FileNotFoundError:
            return None  # created later by the server, with a mode it can pass
        passable = _may(st, user, (stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH))
        if stat.S_ISDIR(st.st_mode) and not passable:
            return step
    return None


def check_reachable(setting: str, path: Path, user: DriverUser) -> None:
    """Raise :class:`DriverUserError` naming ``setting`` when ``user`` cannot reach
    ``path`` (a driver must read its artifacts below the work dir and write its
    checkpoint below the checkpoint root)."""
    blocked = unreachable(path, user)
    if blocked is not None:
        mode = stat.filemode(blocked.stat().st_mode)
        raise DriverUserError(
            f"{setting} ({path}): the driver user {user.name} cannot reach it: {blocked} is "
            f"{mode}; let it pass (chmod o+x, or give it the group {_group_name(user.gid)})"
        )


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def give(path: Path, user: DriverUser, mode: int = 0o700) -> None:
    """Make ``path`` (a directory the server created) the driver user's, with ``mode``."""
    os.chown(path, user.uid, user.gid)
    os.chmod(path, mode)


def give_tree(path: Path, user: DriverUser) -> None:
    """Make the directory ``path`` and everything below it the driver user's, unless it
    already is (a streaming checkpoint written by drivers of the server's own user
    before ``SPARKRING_DRIVER_USER`` was set). Symbolic links are not followed, and each
    entry is changed relative to its folder's open descriptor (``os.fwalk``), so that a
    folder swapped for a link meanwhile cannot lead the walk out of ``path``."""
    if path.lstat().st_uid == user.uid:
        return
    for _folder, dirs, files, folder_fd in os.fwalk(path, follow_symlinks=False):
        for name in (*dirs, *files):
            os.chown(name, user.uid, user.gid, dir_fd=folder_fd, follow_symlinks=False)
    os.chown(path, user.uid, user.gid, follow_symlinks=False)
