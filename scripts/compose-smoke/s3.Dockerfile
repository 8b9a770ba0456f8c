# Stand-in for minio/minio and minio/mc where no image registry can be reached: moto's
# S3 server on port 9000 (`server /data ...` starts it), and an `mc` that runs the few
# commands docker-compose.yml uses (admin commands are skipped: moto has no users or
# policies). Built by scripts/compose-smoke.sh only.
ARG PYTHON_IMAGE=localhost/sparkring-standin/python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}
RUN pip install --no-cache-dir "moto[server]>=5,<6"
COPY mc_standin.py /usr/local/bin/mc
COPY minio-entrypoint.sh /usr/local/bin/minio-entrypoint
RUN useradd --system --user-group moto
USER moto
EXPOSE 9000
ENTRYPOINT ["/usr/local/bin/minio-entrypoint"]
CMD ["server", "/data"]
