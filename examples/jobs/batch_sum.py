"""Sample batch job: sums spark.range(N) and writes the result as JSON to OUTPUT.

    spark-submit batch_sum.py OUTPUT [--n N]

The result also carries the SPARKRING_* variables the driver saw, so tests can check
what the server passed. Exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ENV_KEYS = (
    "SPARKRING_JOB",
    "SPARKRING_EPOCH",
    "SPARKRING_SERVER",
    "SPARKRING_ATTEMPT",
    "SPARKRING_CHECKPOINT_DIR",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output")
    parser.add_argument("--n", type=int, default=1000)
    args = parser.parse_args()

    from pyspark.sql import SparkSession, functions

    spark = SparkSession.builder.appName("batch_sum").getOrCreate()
    total = spark.range(args.n).agg(functions.sum("id").alias("total")).collect()[0]["total"]
    partitions = spark.sparkContext.defaultParallelism
    spark.stop()

    result = {
        "n": args.n,
        "sum": int(total),
        "default_parallelism": partitions,
        "env": {key: os.environ.get(key) for key in ENV_KEYS},
        # Names only, never values: lets tests check that no server secret leaked in.
        "sparkring_names": sorted(name for name in os.environ if name.startswith("SPARKRING_")),
        "secret_names": sorted(
            name for name in os.environ if "SECRET" in name or "PASSWORD" in name
        ),
        "pid": os.getpid(),
    }
    tmp = f"{args.output}.tmp"
    with open(tmp, "w") as handle:
        json.dump(result, handle)
    os.replace(tmp, args.output)
    print(f"batch_sum: sum of range({args.n}) = {total}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
