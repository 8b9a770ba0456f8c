# Stand-in for python:3.11-slim-bookworm where no image registry can be reached:
# Debian bookworm's Python 3.11 in a virtualenv first on PATH (so `python` and `pip`
# behave as in the official image). Built by scripts/compose-smoke.sh only.
ARG BASE_IMAGE=localhost/sparkring-standin/debian:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /usr/local/python \
    && /usr/local/python/bin/pip install --no-cache-dir --upgrade pip
ENV PATH=/usr/local/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8
CMD ["python3"]
