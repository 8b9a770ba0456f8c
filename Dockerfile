# syntax=docker/dockerfile:1
#
# The sparkring image: Python 3.11, a JRE 17 and the project, whose pyspark wheel brings
# Spark's jars, spark-submit and spark-class. One image runs the servers, the one-shot
# migrate job and the Spark standalone master and workers, so drivers (client mode, on
# the servers) and executors always agree on the Spark and the Python version.
#
#   docker build -t sparkring:dev .
#   docker build -t sparkring:dev --build-arg PYSPARK_VERSION=4.0.1 --build-arg WITH_S3A=true \
#       --build-arg HADOOP_AWS_SHA256=<sha256> --build-arg AWS_SDK_BUNDLE_SHA256=<sha256> .
#
# No credential is read at build time and none is stored in a layer: every secret
# arrives at run time as a SPARKRING_* environment variable (see .env.example), and
# .dockerignore admits only the sources `pip install .` needs into the build context.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# "true" adds hadoop-aws and the AWS SDK bundle, for s3a:// paths on MinIO/S3.
ARG WITH_S3A=false

# Bookworm, not the newer Debian the floating 3.11-slim tag follows: it has OpenJDK 17,
# the JRE Spark 4 is tested with.
FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYSPARK_PYTHON=python3 \
    SPARK_WORKER_DIR=/var/lib/sparkring/spark-worker
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless tini procps \
    && rm -rf /var/lib/apt/lists/*
# Empty: the newest pyspark pyproject.toml allows. Pin it for reproducible images (and
# to match the hadoop-aws jar of the s3a stage).
ARG PYSPARK_VERSION=""
COPY . /tmp/sparkring-src
RUN pip install /tmp/sparkring-src ${PYSPARK_VERSION:+"pyspark==${PYSPARK_VERSION}"} \
    && rm -rf /tmp/sparkring-src \
    && sparkring --help >/dev/null

FROM base AS s3a-false

# hadoop-aws must be the exact Hadoop release inside pyspark's jars (Spark 4.0.x ships
# 3.4.1), and the AWS SDK bundle the one that Hadoop release was built against (2.24.6
# for 3.4.1). Both are verified against sha256 values given at build time; the build
# refuses to download anything unverified. docs/deployment.md shows how to get them.
FROM base AS s3a-true
ARG HADOOP_AWS_VERSION=3.4.1
ARG HADOOP_AWS_SHA256=""
ARG AWS_SDK_BUNDLE_VERSION=2.24.6
ARG AWS_SDK_BUNDLE_SHA256=""
ARG MAVEN_REPOSITORY=https://repo1.maven.org/maven2
RUN <<'EOF'
set -eu
jars="$(python -c 'import pathlib, pyspark; print(pathlib.Path(pyspark.__file__).parent / "jars")')"
shipped="$(ls "$jars" | sed -n 's/^hadoop-client-api-\(.*\)\.jar$/\1/p')"
if [ "$shipped" != "$HADOOP_AWS_VERSION" ]; then
  echo "pyspark ships Hadoop $shipped, not $HADOOP_AWS_VERSION: set HADOOP_AWS_VERSION (and its AWS SDK bundle) or PYSPARK_VERSION" >&2
  exit 1
fi
if [ -z "$HADOOP_AWS_SHA256" ] || [ -z "$AWS_SDK_BUNDLE_SHA256" ]; then
  echo "WITH_S3A=true needs HADOOP_AWS_SHA256 and AWS_SDK_BUNDLE_SHA256 (see docs/deployment.md)" >&2
  exit 1
fi
python - "$jars" \
  "$MAVEN_REPOSITORY/org/apache/hadoop/hadoop-aws/$HADOOP_AWS_VERSION/hadoop-aws-$HADOOP_AWS_VERSION.jar" "$HADOOP_AWS_SHA256" \
  "$MAVEN_REPOSITORY/software/amazon/awssdk/bundle/$AWS_SDK_BUNDLE_VERSION/bundle-$AWS_SDK_BUNDLE_VERSION.jar" "$AWS_SDK_BUNDLE_SHA256" <<'PY'
import hashlib, pathlib, sys, urllib.request

jars, pairs = pathlib.Path(sys.argv[1]), sys.argv[2:]
for url, expected in zip(pairs[0::2], pairs[1::2]):
    target = jars / url.rsplit("/", 1)[1]
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=60) as response, target.open("wb") as out:
        for chunk in iter(lambda: response.read(1 << 20), b""):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != expected.lower():
        target.unlink()
        sys.exit(f"{url}: sha256 {digest.hexdigest()} does not match {expected}")
    print(f"added {target.name} ({target.stat().st_size} bytes, sha256 verified)")
PY
EOF

FROM s3a-${WITH_S3A} AS final
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/sparkring sparkring \
    && mkdir -p /var/lib/sparkring/checkpoints /var/lib/sparkring/work \
       /var/lib/sparkring/spark-worker \
    && chown -R sparkring:sparkring /var/lib/sparkring
USER sparkring
WORKDIR /var/lib/sparkring
# /healthz and /metrics when SPARKRING_HEALTH_PORT=8090 (as docker-compose.yml sets).
EXPOSE 8090
# tini reaps the drivers' orphans and passes SIGTERM to the server alone, which then
# stops its drivers in order and hands its jobs off (no process-group broadcast).
ENTRYPOINT ["tini", "--"]
CMD ["sparkring", "server", "run"]
