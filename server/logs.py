"""Logging of the server process: one line per record, structured extras as key=value.

Records carry their context in ``extra={"action": ..., "job": ..., "epoch": ...}``;
this formatter appends every such field, so ``grep action=claim`` works on any log.
Secrets never reach a record in the first place (settings hold them as SecretStr), nor
does a webhook URL (the HTTP client's own request lines are kept out).
"""

from __future__ import annotations

import logging
import sys

# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = {k: v for k, v in vars(record).items() if k not in _STANDARD}
        if extras:
            line += " " + " ".join(f"{k}={_value(v)}" for k, v in sorted(extras.items()))
        return line


def _value(value: object) -> str:
    text = str(value)
    return f'"{text}"' if " " in text or not text else text


def configure(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        KeyValueFormatter("%(asctime)s %(levelname)s %(name)s %(threadName)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # kazoo's own connection chatter is INFO; our registry reports the states that matter.
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    # httpx logs each request's URL at INFO (httpcore its connections at DEBUG): the alert
    # sender's requests go to webhook URLs, whose path can be a credential (Slack's). The
    # sender logs each attempt itself, by delivery id.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
