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
FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYSPARK_PYTHON=python3 \
    SPARK_WORKER_DIR=/var/lib/sparkring/spark-worker
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless tini procps \
    && rm -rf /var/lib/apt/lists/*
# Empty: the pyspark of constraints.txt, as every package (the versions CI tests). Set,
# that pyspark instead (to match the hadoop-aws jar of the s3a step, say).
ARG PYSPARK_VERSION=""
COPY . /tmp/sparkring-src
RUN if [ -n "$PYSPARK_VERSION" ]; then \
        grep -v '^pyspark==' /tmp/sparkring-src/constraints.txt > /tmp/constraints.txt; \
    else cp /tmp/sparkring-src/constraints.txt /tmp/constraints.txt; fi \
    && pip install -c /tmp/constraints.txt /tmp/sparkring-src \
        ${PYSPARK_VERSION:+"pyspark==${PYSPARK_VERSION}"} \
    && rm -rf /tmp/sparkring-src /tmp/constraints.txt \
    && sparkring --help >/dev/null

# With WITH_S3A=true: hadoop-aws and the AWS SDK bundle, for s3a:// paths on MinIO/S3
# (docker/s3a_jars.py; docs/deployment.md shows how to get the sha256 values). A step
# that does nothing when WITH_S3A=false, not a stage chosen by a variable in FROM:
# buildah (podman build) does not expand variables in a stage name. Hadoop 3.4.1 is the
# release pyspark 4.0.x ships; 2.24.6 the AWS SDK bundle it was built against.
ARG WITH_S3A
ARG HADOOP_AWS_VERSION=3.4.1
ARG HADOOP_AWS_SHA256=""
ARG AWS_SDK_BUNDLE_VERSION=2.24.6
ARG AWS_SDK_BUNDLE_SHA256=""
ARG MAVEN_REPOSITORY=https://repo1.maven.org/maven2
COPY docker/s3a_jars.py /tmp/s3a_jars.py
RUN python /tmp/s3a_jars.py && rm /tmp/s3a_jars.py

# Two users: sparkring runs the image's processes, sparkring-driver (a group of its own)
# runs job code: the drivers a server starts (SPARKRING_DRIVER_USER) and the Spark
# workers' executors. A job must never run as the server's user, whose environment holds
# the cluster's credentials (docs/drivers.md, "The driver's user"). Fixed ids: every
# container that shares the checkpoints and output volumes agrees on who owns what. A
# new named volume takes its mount point's owner from the image: /var/lib/sparkring/output
# is the drivers' (docker-compose.yml's output volume), where jobs write their results.
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/sparkring sparkring \
    && useradd --system --uid 10002 --user-group --create-home \
       --home-dir /var/lib/sparkring-driver --shell /usr/sbin/nologin sparkring-driver \
    && mkdir -p /var/lib/sparkring/checkpoints /var/lib/sparkring/work \
       /var/lib/sparkring/spark-worker /var/lib/sparkring/output \
    && chown -R sparkring:sparkring /var/lib/sparkring \
    && chown sparkring-driver:sparkring-driver /var/lib/sparkring/spark-worker \
       /var/lib/sparkring/output
# A server starts its drivers as this user; it must then run as root (compose's server
# service does) or hold CAP_SETUID, CAP_SETGID, CAP_KILL and CAP_CHOWN
# (docs/deployment.md). SPARKRING_DRIVER_USER= (empty) runs them as the server's user.
ENV SPARKRING_DRIVER_USER=sparkring-driver
USER sparkring
WORKDIR /var/lib/sparkring
# /healthz and /metrics when SPARKRING_HEALTH_PORT=8090 (as docker-compose.yml sets).
EXPOSE 8090
# tini (PID 1) reaps the drivers' orphans and passes SIGTERM to the supervisor alone,
# which passes it to the server: it stops its drivers in order and hands its jobs off
# (no process-group broadcast). The supervisor restarts a crashed server inside the
# container, so the drivers, which would die with the container, are adopted instead.
ENTRYPOINT ["tini", "--"]
CMD ["sparkring", "server", "supervise"]
