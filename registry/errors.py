"""The registry's errors: one base class the CLI turns into a one-line message."""

from __future__ import annotations


class RegistryError(Exception):
    """A registry operation failed; the message says why and never carries a secret."""


class ZooKeeperUnreachable(RegistryError):
    """No ZooKeeper server of the connect string answered in time."""


class ServerIdTaken(RegistryError):
    """Another live server (another ZooKeeper session) holds this server id."""


class InvalidServer(RegistryError):
    """A server record or an argument is malformed (bad id, role, capacity or auth)."""
