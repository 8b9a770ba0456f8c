"""What the smoke's streaming job committed, read inside a server container:

    podman exec -i <server> python - OUTPUT < scripts/compose-smoke/stream_output.py

Prints one JSON object: the micro-batches the file sink committed (its _spark_metadata
log), the values in the committed files, how many of them appear more than once and
how many are missing below the largest (the stream's values are 0, 1, 2, ...: exactly
once means none of either), and the driver epochs that wrote them. Files of a batch
that was never committed are not in the log and do not count (as for any Spark reader).
Standard library only: the image has no test helpers."""

import collections
import json
import sys
from pathlib import Path

output = Path(sys.argv[1])
log_dir = output / "_spark_metadata"
files: set[str] = set()
batches = 0
if log_dir.is_dir():
    for entry in sorted(log_dir.iterdir()):
        if entry.name.startswith("."):
            continue  # checksum files
        batches += 1
        lines = entry.read_text().splitlines()
        for line in lines[1:]:
            record = json.loads(line)
            path = record["path"].removeprefix("file://")
            if record["action"] == "add":
                files.add(path)
            else:
                files.discard(path)
values: collections.Counter[int] = collections.Counter()
epochs: collections.Counter[str] = collections.Counter()
for path in files:
    with open(path) as handle:
        for line in handle:
            if line.strip():
                row = json.loads(line)
                values[int(row["value"])] += 1
                epochs[str(row["epoch"])] += 1
top = max(values, default=-1)
print(
    json.dumps(
        {
            "batches": batches,
            "values": len(values),
            "duplicated": sum(1 for count in values.values() if count > 1),
            "missing": top + 1 - len(values),
            "epochs": dict(sorted(epochs.items())),
        }
    )
)
