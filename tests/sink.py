"""Reading what Spark's file sink committed, as any Spark reader would see it."""

from __future__ import annotations

import json
from pathlib import Path


def committed_values(output: Path) -> list[int]:
    """Values in the files the file sink committed (its _spark_metadata log). Files of
    an interrupted batch are not in the log, so they do not count."""
    files: set[str] = set()
    log_dir = output / "_spark_metadata"
    if not log_dir.exists():
        return []
    for entry in log_dir.iterdir():
        if entry.name.startswith("."):
            continue  # checksum files
        lines = entry.read_text().splitlines()
        assert lines[0] == "v1", f"unknown sink log version in {entry}"
        for line in lines[1:]:
            record = json.loads(line)
            if record["action"] == "add":
                files.add(record["path"].removeprefix("file://"))
            else:
                files.discard(record["path"].removeprefix("file://"))
    values = []
    for path in files:
        with open(path) as handle:
            values += [json.loads(line)["value"] for line in handle if line.strip()]
    return values


def committed_batches(output: Path) -> int:
    log_dir = output / "_spark_metadata"
    if not log_dir.exists():
        return 0
    return sum(1 for entry in log_dir.iterdir() if not entry.name.startswith("."))
