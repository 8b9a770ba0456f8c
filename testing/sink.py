"""Reading what Spark's file sink committed, as any Spark reader would see it."""

from __future__ import annotations

import json
import os
from pathlib import Path


def committed_files(output: Path) -> set[str]:
    """The files the file sink committed (its _spark_metadata log). Files of an
    interrupted batch are not in the log, so they do not count."""
    files: set[str] = set()
    log_dir = output / "_spark_metadata"
    if not log_dir.exists():
        return files
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
    return files


def committed_values(output: Path) -> list[int]:
    """Values in the files the file sink committed (:func:`committed_files`)."""
    values = []
    for path in committed_files(output):
        with open(path) as handle:
            values += [json.loads(line)["value"] for line in handle if line.strip()]
    return values


def committed_batches(output: Path) -> int:
    log_dir = output / "_spark_metadata"
    if not log_dir.exists():
        return 0
    return sum(1 for entry in log_dir.iterdir() if not entry.name.startswith("."))


def written_by_epoch(output: Path) -> dict[int, list[float]]:
    """Driver epoch -> modification times of the committed files it wrote (examples/
    jobs/streaming_counter.py writes its driver's epoch in every row)."""
    written: dict[int, list[float]] = {}
    for path in committed_files(output):
        with open(path) as handle:
            line = handle.readline()
        if line.strip():
            epoch = int(json.loads(line)["epoch"])
            written.setdefault(epoch, []).append(os.stat(path).st_mtime)
    return written


def output_gap(output: Path, before: int, after: int) -> float:
    """The output gap of a move: seconds between the last committed file written by the
    driver of epoch ``before`` and the first written by the driver of epoch ``after``."""
    written = written_by_epoch(output)
    assert written.get(before) and written.get(after), f"no output of epoch {before} or {after}"
    return min(written[after]) - max(written[before])
