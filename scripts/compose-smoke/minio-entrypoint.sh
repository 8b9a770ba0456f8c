#!/bin/bash
# `server DIR [options]` (MinIO's command line) starts moto's S3 server on port 9000;
# anything else runs as given.
set -euo pipefail
if [[ ${1:-} == server ]]; then
  exec moto_server -H 0.0.0.0 -p 9000
fi
exec "$@"
