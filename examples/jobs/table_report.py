"""Sample batch job with a dependency: counts rows per bucket and prints them as a table.

    spark-submit table_report.py OUTPUT [--rows N]

It imports ``tabulate``, a package the servers do not have: the job is created with
``--requirements examples/jobs/table_report.requirements.txt`` (docs/dependencies.md).
The driver formats the table with it, and every task imports it too, on the executors,
so the report says which version each side found. Exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def _versions(rows):  # runs on the executors
    import tabulate

    yield (tabulate.__version__, sum(1 for _ in rows), os.getcwd())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output")
    parser.add_argument("--rows", type=int, default=1000)
    args = parser.parse_args()

    import tabulate
    from pyspark.sql import SparkSession, functions

    spark = SparkSession.builder.appName("table_report").getOrCreate()
    counts = (
        spark.range(args.rows)
        .groupBy((functions.col("id") % 4).alias("bucket"))
        .count()
        .orderBy("bucket")
        .collect()
    )
    tasks = spark.sparkContext.parallelize(range(args.rows), 4).mapPartitions(_versions).collect()
    master = spark.sparkContext.master
    spark.stop()

    table = tabulate.tabulate([(r["bucket"], r["count"]) for r in counts], ["bucket", "rows"])
    report = {
        "driver_tabulate": tabulate.__version__,
        "executor_tabulate": sorted({version for version, _, _ in tasks}),
        "rows_seen_by_tasks": sum(n for _, n, _ in tasks),
        # Where the tasks ran: a standalone executor works in the worker's app folder.
        "task_folders": sorted({folder for _, _, folder in tasks}),
        "master": master,
        "table": table,
    }
    tmp = f"{args.output}.tmp"
    with open(tmp, "w") as handle:
        json.dump(report, handle)
    os.replace(tmp, args.output)
    print(table, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
