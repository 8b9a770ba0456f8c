"""The resource center's own defaults, each with its unit: the S3 client and the local
artifact cache. ``server/settings.py`` reads them for its settings of the same names;
this package's modules use them as argument defaults, and never read ``os.environ``."""

from __future__ import annotations

S3_BUCKET = "sparkring"
S3_SECURE = False
S3_REGION = "us-east-1"
# Local artifact cache bound, bytes (least recently used entries are evicted).
CACHE_MAX_BYTES = 2 * 1024 * 1024 * 1024
# S3 client timeouts, seconds: opening a connection, and waiting for bytes on it.
S3_CONNECT_TIMEOUT_S = 5.0
S3_READ_TIMEOUT_S = 60.0
# Fetching an artifact for a driver (server path): an unreachable S3 is retried for up
# to this long, seconds, with exponential backoff from base to max between attempts.
S3_FETCH_RETRY_S = 30.0
S3_FETCH_BACKOFF_BASE_S = 0.5
S3_FETCH_BACKOFF_MAX_S = 5.0
