#!/usr/bin/env bash
# The README's test command: install what is missing, start the local stack (3-node
# ZooKeeper ensemble, PostgreSQL, S3, Spark standalone), run the whole suite.
#
# Two pytest runs, and both must pass: every test but the chaos campaign, then the chaos
# campaign (tests/chaos) alone, last, because it stops ZooKeeper and PostgreSQL.
# Durations (--durations=30) and JUnit XML (test-reports/, or TEST_REPORTS) are kept for
# both runs; under CI=true (.ci/run) a missing service fails, never skips.
# Extra arguments go to the first run (e.g. scripts/test.sh -k ring -x); the campaign
# runs when no argument was given or with CHAOS=1, and CHAOS=0 skips it.
# CHAOS_ROUNDS=N makes it the long campaign; its randomized mode injects faults for
# CHAOS_MINUTES (default 2) from CHAOS_SEED (printed; drawn when unset) (docs/chaos.md).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
scripts/bootstrap.sh
.venv/bin/python scripts/stack.py up --zk-nodes 3 >/dev/null
echo "test: set-up took $(( $(date +%s) - started )) s" >&2
chaos="${CHAOS:-$([ $# -eq 0 ] && echo 1 || echo 0)}"
# Every run leaves its evidence: the slowest tests and a JUnit XML per pytest run.
reports="${TEST_REPORTS:-test-reports}"
mkdir -p "$reports"
set +e
.venv/bin/python -m pytest --ignore=tests/chaos --durations=30 \
    --junitxml="$reports/suite.xml" "$@"
rc=$?
echo "test: suite done at $(( $(date +%s) - started )) s" >&2
chaos_rc=0
if [ "$chaos" = "1" ]; then
    .venv/bin/python -m pytest tests/chaos --durations=30 --junitxml="$reports/chaos.xml"
    chaos_rc=$?
    echo "test: chaos campaign done at $(( $(date +%s) - started )) s" >&2
fi
set -e
if [ "${CI:-}" = "true" ]; then .venv/bin/python scripts/stack.py down; fi
# pytest's 5 means no test ran: a failure here, never a pass.
if [ $rc -eq 0 ]; then rc=$chaos_rc; fi
exit $rc
