"""An example receiver of sparkring's alerts: checks each delivery's Standard Webhooks
signature and timestamp before it trusts the body, and de-duplicates on its id.

    SPARKRING_WEBHOOK_SECRET=... python3 webhook_receiver.py [PORT]

A delivery is accepted (204) when its ``webhook-signature`` is ``v1,<base64>`` of the
HMAC-SHA256 of ``<webhook-id>.<webhook-timestamp>.<body>`` under the alert's secret, and
its timestamp is within five minutes of this host's clock: a captured delivery replayed
later is refused (401), as is one whose body or id was changed. A delivery already seen
(the same ``webhook-id``: sparkring sends at least once) is acknowledged and not acted on
again. Standard library only; put it behind your TLS terminator.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOLERANCE_S = 5 * 60
MAX_BODY = 1 << 20


def verified(secret: bytes, headers: dict[str, str], body: bytes, now: float) -> bool:
    """Whether ``body`` with ``headers`` was signed with ``secret`` within TOLERANCE_S."""
    delivery = headers.get("webhook-id", "")
    stamp = headers.get("webhook-timestamp", "")
    if not delivery or not stamp.isdigit() or abs(now - int(stamp)) > TOLERANCE_S:
        return False
    signed = f"{delivery}.{stamp}.".encode() + body
    expected = base64.b64encode(hmac.new(secret, signed, hashlib.sha256).digest()).decode()
    # Several signatures may be sent, space-separated, while a secret is rotated.
    offered = headers.get("webhook-signature", "").split()
    return any(
        version == "v1" and hmac.compare_digest(value, expected)
        for version, _, value in (entry.partition(",") for entry in offered)
    )


def serve(port: int, secret: bytes) -> None:
    seen: set[str] = set()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            if length > MAX_BODY:
                self.send_response(413)
                self.end_headers()
                return
            body = self.rfile.read(length)
            headers = {k.lower(): v for k, v in self.headers.items()}
            if not verified(secret, headers, body, time.time()):
                self.send_response(401)
                self.end_headers()
                return
            delivery = headers["webhook-id"]
            if delivery not in seen:
                seen.add(delivery)
                alert = json.loads(body)
                print(f"{alert.get('kind')} of job {alert.get('job')}: {alert.get('detail')}")
            self.send_response(204)
            self.end_headers()

    ThreadingHTTPServer(("0.0.0.0", port), Handler).serve_forever()


if __name__ == "__main__":
    serve(
        int(sys.argv[1]) if len(sys.argv) > 1 else 8099,
        os.environ["SPARKRING_WEBHOOK_SECRET"].encode(),
    )
