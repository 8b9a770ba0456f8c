#!/usr/bin/env bash
# Print JVM options that make spark-submit's driver JVM cheap to start, for test runs of
# many short drivers: C1 only (-XX:TieredStopAtLevel=1), the serial GC, and a class-data
# archive of Spark's classpath kept in the folder $1 (made here once, by a spark-submit
# of a one-line program, ~20 s; a JVM whose archive is missing or stale starts without
# it). Usage: SPARK_SUBMIT_OPTS="$(scripts/spark-submit-opts.sh DIR)".
set -euo pipefail
cd "$(dirname "$0")/.."
folder="${1:?usage: spark-submit-opts.sh DIR}"
archive="$folder/spark-submit.jsa"
if [ ! -s "$archive" ]; then
    mkdir -p "$folder"
    spark_submit="$(.venv/bin/python -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit"))')"
    program="$(mktemp --suffix .py)"
    trap 'rm -f "$program"' EXIT
    echo 'print("archived")' > "$program"
    # The archive is written as the JVM exits; a failure only costs the speed-up.
    SPARK_SUBMIT_OPTS="-XX:ArchiveClassesAtExit=$archive" SPARK_LOCAL_IP=127.0.0.1 \
        "$spark_submit" --master 'local[1]' "$program" >"$folder/spark-submit-jsa.log" 2>&1 \
        || echo "spark-submit-opts: no class-data archive (see $folder/spark-submit-jsa.log)" >&2
    chmod a+r "$archive" 2>/dev/null || true
fi
echo "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:SharedArchiveFile=$archive"
