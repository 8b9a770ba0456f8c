"""Sample batch job with credentials: counts orders per region and writes a report.

    spark-submit region_report.py OUTPUT [--orders N]

Reads what a real job reads from its environment: ``REGION`` (a plain variable, ``job
create --env REGION=eu``) and ``WAREHOUSE_PASSWORD`` (a secret, ``--secret-env
WAREHOUSE_PASSWORD=warehouse``). The password itself is never printed or written: the
report holds its SHA-256, so a run can be checked against the secret it was given.
Exits 2 when a variable is missing, 0 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output")
    parser.add_argument("--orders", type=int, default=10_000)
    args = parser.parse_args()
    missing = [name for name in ("REGION", "WAREHOUSE_PASSWORD") if not os.environ.get(name)]
    if missing:
        print(f"region_report: not set: {', '.join(missing)}", file=sys.stderr, flush=True)
        return 2
    region = os.environ["REGION"]
    password = os.environ["WAREHOUSE_PASSWORD"]

    from pyspark.sql import SparkSession, functions

    spark = SparkSession.builder.appName("region_report").getOrCreate()
    regions = ["eu", "us", "apac"]
    orders = spark.range(args.orders).withColumn(
        "region",
        functions.element_at(
            functions.array(*map(functions.lit, regions)),
            (functions.col("id") % len(regions) + 1).cast("int"),
        ),
    )
    mine = orders.filter(functions.col("region") == region).count()
    spark.stop()

    report = {
        "region": region,
        "orders": int(mine),
        "password_sha256": hashlib.sha256(password.encode("utf-8")).hexdigest(),
        "run_id": os.environ.get("SPARKRING_RUN_ID"),
    }
    tmp = f"{args.output}.tmp"
    with open(tmp, "w") as handle:
        json.dump(report, handle)
    os.replace(tmp, args.output)
    print(f"region_report: {mine} orders in {region}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
