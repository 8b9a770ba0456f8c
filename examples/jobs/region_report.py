"""Sample batch job of a data team: credentials from a secret, a package of its own.

    spark-submit region_report.py OUTPUT [--orders N]

Reads what a real job reads from its environment: ``REGION`` (a plain variable, ``job
create --env REGION=eu``) and ``WAREHOUSE_PASSWORD`` (a secret, ``--secret-env
WAREHOUSE_PASSWORD=warehouse``: docs/secrets.md). Imports ``tabulate``, which the
servers do not have (``--requirements examples/jobs/region_report.requirements.txt``:
docs/dependencies.md), in the driver and in every task, on the executors.

Counts the orders of its region with Spark and writes a JSON report to OUTPUT: the
count, the table, the SHA-256 of the password (never the password), the version of
``tabulate`` each side found and the folders the tasks ran in. Exits 2 when a variable
is missing, 0 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

REGIONS = ("eu", "us", "apac")


def _task(rows):  # runs on the executors
    import tabulate

    yield (tabulate.__version__, sum(1 for _ in rows), os.getcwd())


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

    import tabulate
    from pyspark.sql import SparkSession, functions

    spark = SparkSession.builder.appName("region_report").getOrCreate()
    names = functions.array(*map(functions.lit, REGIONS))
    index = (functions.col("id") % len(REGIONS) + 1).cast("int")
    orders = spark.range(args.orders).withColumn("region", functions.element_at(names, index))
    counts = {r["region"]: r["count"] for r in orders.groupBy("region").count().collect()}
    tasks = spark.sparkContext.parallelize(range(args.orders), 4).mapPartitions(_task).collect()
    master = spark.sparkContext.master
    spark.stop()

    table = tabulate.tabulate(sorted(counts.items()), ["region", "orders"])
    report = {
        "region": region,
        "orders": int(counts.get(region, 0)),
        "table": table,
        "password_sha256": hashlib.sha256(password.encode("utf-8")).hexdigest(),
        "driver_tabulate": tabulate.__version__,
        "executor_tabulate": sorted({version for version, _, _ in tasks}),
        "rows_seen_by_tasks": sum(n for _, n, _ in tasks),
        # Where the tasks ran: a standalone executor works in its worker's app folder.
        "task_folders": sorted({folder for _, _, folder in tasks}),
        "master": master,
        "run_id": os.environ.get("SPARKRING_RUN_ID"),
    }
    tmp = f"{args.output}.tmp"
    with open(tmp, "w") as handle:
        json.dump(report, handle)
    os.replace(tmp, args.output)
    print(table, flush=True)
    print(f"region_report: {report['orders']} orders in {region}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
