#!/usr/bin/env python3
"""The few `mc` (MinIO client) commands docker-compose.yml runs, against moto's S3.

The S3 stand-in ships this as `mc`, so the compose file's own healthcheck
(`mc ready local`) and minio-setup script run unchanged:

    mc ready ALIAS                       ALIAS answers (local: http://127.0.0.1:9000)
    mc alias set ALIAS URL KEY SECRET    remember an endpoint and its credentials
    mc mb [--ignore-existing] ALIAS/BUCKET
    mc admin ...                         skipped: moto has no admin API, so the user
                                         and policy of minio-setup are not created
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ALIASES = Path("/tmp/mc-standin-aliases.json")
LOCAL = {"url": "http://127.0.0.1:9000", "key": "standin", "secret": "standin"}


def _aliases() -> dict[str, dict[str, str]]:
    stored = json.loads(ALIASES.read_text()) if ALIASES.exists() else {}
    return {"local": LOCAL, **stored}


def _alias(name: str) -> dict[str, str]:
    aliases = _aliases()
    if name not in aliases:
        sys.exit(f"mc stand-in: unknown alias {name}")
    return aliases[name]


def ready(name: str) -> None:
    import urllib.request

    with urllib.request.urlopen(_alias(name)["url"] + "/", timeout=3) as response:
        if not 200 <= response.status < 300:
            sys.exit(f"mc stand-in: {name} answered {response.status}")


def alias_set(name: str, url: str, key: str, secret: str) -> None:
    stored = json.loads(ALIASES.read_text()) if ALIASES.exists() else {}
    stored[name] = {"url": url, "key": key, "secret": secret}
    ALIASES.touch(mode=0o600)
    ALIASES.write_text(json.dumps(stored))
    print(f"Added `{name}` successfully.")


def make_bucket(target: str, ignore_existing: bool) -> None:
    import boto3  # moto's dependency

    name, _, bucket = target.partition("/")
    alias = _alias(name)
    client = boto3.client(
        "s3",
        endpoint_url=alias["url"],
        aws_access_key_id=alias["key"],
        aws_secret_access_key=alias["secret"],
        region_name="us-east-1",
    )
    existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if bucket in existing:
        if not ignore_existing:
            sys.exit(f"mc stand-in: bucket {bucket} exists")
    else:
        client.create_bucket(Bucket=bucket)
    print(f"Bucket created successfully `{target}`.")


def main(argv: list[str]) -> None:
    match argv:
        case ["ready", name]:
            ready(name)
        case ["alias", "set", name, url, key, secret]:
            alias_set(name, url, key, secret)
        case ["mb", "--ignore-existing", target]:
            make_bucket(target, ignore_existing=True)
        case ["mb", target]:
            make_bucket(target, ignore_existing=False)
        case ["admin", *rest]:
            # Never echo the arguments: `admin user add` carries a secret.
            words = " ".join(["admin", *rest[:2]])
            print(f"mc stand-in: '{words}' skipped (moto has no admin API)")
        case _:
            sys.exit(__doc__)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except OSError as exc:
        sys.exit(f"mc stand-in: {exc}")
