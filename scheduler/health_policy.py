"""A job's health policy: when its run is flagged, and whether a stall restarts it.

Server-wide defaults come from the settings (``SPARKRING_STALL_TIMEOUT``,
``SPARKRING_RESOURCE_WAIT_TIMEOUT``); a job overrides them with ``sparkring.health.*``
keys of its conf (never passed to Spark, pinned per revision like the rest of the
conf). ``job create``/``update --restart-on-stall`` set ``RESTART_ON_STALL``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

STALL_TIMEOUT = "sparkring.health.stallTimeout"  # seconds
RESOURCE_WAIT_TIMEOUT = "sparkring.health.resourceWaitTimeout"  # seconds
RESTART_ON_STALL = "sparkring.health.restartOnStall"  # true | false
KEYS = (STALL_TIMEOUT, RESOURCE_WAIT_TIMEOUT, RESTART_ON_STALL)
_TRUE = ("true", "yes", "1", "on")
_FALSE = ("false", "no", "0", "off")


class PolicyError(ValueError):
    """A ``sparkring.health.*`` conf value is invalid; the message names the key."""


@dataclass(frozen=True)
class Policy:
    stall_timeout: float  # a streaming query with no new batch this long is stalled
    resource_wait_timeout: float  # an application with no executor cores this long waits
    restart_on_stall: bool = False  # a stalled job is restarted (a new generation)


def _seconds(conf: Mapping[str, str], key: str, default: float) -> float:
    if key not in conf:
        return default
    text = str(conf[key]).strip()
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise PolicyError(f"conf {key} must be a number of seconds above 0, not {text!r}")
    return value


def of(conf: Mapping[str, str], stall_timeout: float, resource_wait_timeout: float) -> Policy:
    """The policy of a job with ``conf``, given the server's defaults."""
    restart = str(conf.get(RESTART_ON_STALL, "false")).strip().lower()
    if restart not in _TRUE + _FALSE:
        raise PolicyError(f"conf {RESTART_ON_STALL} must be true or false, not {restart!r}")
    unknown = sorted(key for key in conf if key.startswith("sparkring.health.") and key not in KEYS)
    if unknown:
        raise PolicyError(f"unknown conf {', '.join(unknown)} (known: {', '.join(KEYS)})")
    return Policy(
        stall_timeout=_seconds(conf, STALL_TIMEOUT, stall_timeout),
        resource_wait_timeout=_seconds(conf, RESOURCE_WAIT_TIMEOUT, resource_wait_timeout),
        restart_on_stall=restart in _TRUE,
    )


def check(conf: Mapping[str, str]) -> None:
    """Raise :class:`PolicyError` if ``conf`` holds an invalid ``sparkring.health.*``."""
    of(conf, 1.0, 1.0)
