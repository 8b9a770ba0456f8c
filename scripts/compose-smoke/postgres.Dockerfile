# Stand-in for postgres:15 where no image registry can be reached: Debian's
# postgresql-15, initialised on first start from POSTGRES_USER, POSTGRES_PASSWORD and
# POSTGRES_DB like the official image. Like it, it starts as root with
# docker-entrypoint.sh and has gosu, which docker-compose.pg-standby.yml's commands
# call. Built by scripts/compose-smoke.sh only.
ARG BASE_IMAGE=localhost/sparkring-standin/debian:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends postgresql-15 gosu \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/lib/postgresql/data /var/run/postgresql \
    && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql
COPY postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PGDATA=/var/lib/postgresql/data
EXPOSE 5432
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["postgres"]
