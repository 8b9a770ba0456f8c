# Stand-in for zookeeper:3.9 where no image registry can be reached: Debian's
# ZooKeeper 3.8, one node, configured from ZOO_* variables like the official image
# (data in /data and /datalog). Built by scripts/compose-smoke.sh only.
ARG BASE_IMAGE=localhost/sparkring-standin/debian:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends zookeeper liblog4j1.2-java \
       libslf4j-java \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /data /datalog /conf \
    && chown -R zookeeper:zookeeper /data /datalog /conf
COPY zookeeper-entrypoint.sh /usr/local/bin/zookeeper-entrypoint
# The compose file's healthcheck, `zkServer.sh status`, as a ruok probe.
COPY zkServer.sh /usr/local/bin/zkServer.sh
USER zookeeper
EXPOSE 2181
ENTRYPOINT ["/usr/local/bin/zookeeper-entrypoint"]
