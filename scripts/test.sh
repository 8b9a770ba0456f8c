#!/usr/bin/env bash
# The README's test command: install what is missing, start the local stack (3-node
# ZooKeeper ensemble, PostgreSQL, S3, Spark standalone), run the whole suite.
# Extra arguments go to pytest (e.g. scripts/test.sh -k ring -x).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
scripts/bootstrap.sh
.venv/bin/python scripts/stack.py up --zk-nodes 3 >/dev/null
echo "test: set-up took $(( $(date +%s) - started )) s" >&2
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "${CI:-}" = "true" ]; then .venv/bin/python scripts/stack.py down; fi
# pytest's 5 means no test ran: a failure here, never a pass.
exit $rc
