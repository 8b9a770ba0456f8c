"""Errors of the resource center: one base class, each message one clear line.

Messages name the resource, file, object key or endpoint involved and never contain a
credential.
"""

from __future__ import annotations


class ResourceError(Exception):
    """Base of every resource center error; the CLI prints its message as one line."""


class InvalidResource(ResourceError):
    """A name, reference or file was refused before anything was stored."""


class UnknownResource(ResourceError):
    """No resource (or no such version of one) exists."""


class ResourceInUse(ResourceError):
    """A version cannot be deleted because jobs reference it."""


class IntegrityError(ResourceError):
    """Bytes do not match the sha256 they are stored under; they are never used."""


class StoreError(ResourceError):
    """S3 answered, but with an error (access denied, missing object, bad bucket name)."""


class MissingObject(StoreError):
    """The object a version points to is not in the bucket."""


class StoreUnavailable(StoreError):
    """S3 could not be reached or failed transiently; the server path retries these."""
