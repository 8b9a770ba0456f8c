#!/usr/bin/env python3
"""Health probes and setup for the smoke test's stand-in images (exec form, no shell).

standin-probe ruok HOST PORT      ZooKeeper answers "imok" to the ruok command
standin-probe http URL            URL answers 2xx
standin-probe s3-bucket ENDPOINT  create $S3_BUCKET (credentials from S3_ACCESS_KEY
                                  and S3_SECRET_KEY); an existing bucket is fine
"""

from __future__ import annotations

import os
import socket
import sys
import urllib.request


def ruok(host: str, port: str) -> None:
    with socket.create_connection((host, int(port)), timeout=3) as sock:
        sock.sendall(b"ruok")
        answer = sock.recv(16)
    if answer != b"imok":
        sys.exit(f"zookeeper {host}:{port} answered {answer!r}, not imok")


def http(url: str) -> None:
    with urllib.request.urlopen(url, timeout=3) as response:
        if not 200 <= response.status < 300:
            sys.exit(f"{url} answered {response.status}")


def s3_bucket(endpoint: str) -> None:
    import boto3  # only the S3 stand-in ships it

    bucket = os.environ["S3_BUCKET"]
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=os.environ["S3_ACCESS_KEY"],
        aws_secret_access_key=os.environ["S3_SECRET_KEY"],
        region_name="us-east-1",
    )
    names = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if bucket not in names:
        client.create_bucket(Bucket=bucket)
    print(f"bucket {bucket} ready (moto stand-in: no users or policies)")


COMMANDS = {"ruok": (ruok, 2), "http": (http, 1), "s3-bucket": (s3_bucket, 1)}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(__doc__)
    function, arity = COMMANDS[sys.argv[1]]
    if len(sys.argv) - 2 != arity:
        sys.exit(__doc__)
    try:
        function(*sys.argv[2:])
    except OSError as exc:
        sys.exit(f"{sys.argv[1]}: {exc}")
