# Stand-in for MinIO where no image registry can be reached: moto's S3 server on port
# 9000 (no admin API: users and policies are not enforced). Built by
# scripts/compose-smoke.sh only.
ARG PYTHON_IMAGE=localhost/sparkring-standin/python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}
RUN pip install --no-cache-dir "moto[server]>=5,<6"
COPY standin_probe.py /usr/local/bin/standin-probe
RUN useradd --system --user-group moto
USER moto
EXPOSE 9000
CMD ["moto_server", "-H", "0.0.0.0", "-p", "9000"]
