#!/usr/bin/env bash
# The README's test command: install what is missing, start the local stack (3-node
# ZooKeeper ensemble, PostgreSQL, S3, Spark standalone), run the whole suite.
#
# Two pytest runs, and both must pass: every test but the chaos campaign, then the chaos
# campaign (tests/chaos) alone, last, because it stops ZooKeeper and PostgreSQL. Each run
# spreads its tests over workers (SUITE_WORKERS, CHAOS_WORKERS below).
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

# The campaign stops ZooKeeper and PostgreSQL, so each of its CHAOS_WORKERS workers
# (default 1; 2 or more opt in) gets a stack of its own: the first the main one, each other one started
# here, while the suite runs, in a folder beside the main one and on its ports + 1000 x i
# (ZooKeeper, PostgreSQL and S3 only: the campaign's Spark masters are its own).
chaos_workers="${CHAOS_WORKERS:-1}"
main_stack=$(.venv/bin/python scripts/stack.py env | sed -n 's/^export SPARKRING_STACK_DIR=//p')
chaos_stacks="$main_stack"
chaos_pids=()
for i in $(seq 1 $(( chaos_workers - 1 ))); do
    [ "$chaos" = "1" ] || break
    chaos_stacks="$chaos_stacks,$main_stack-chaos$i"
    (
        eval "$(.venv/bin/python -c 'import json, sys
for name, port in json.load(open(sys.argv[1] + "/ports.json")).items():
    print(f"export SPARKRING_STACK_{name.upper()}_PORT={port + 1000 * int(sys.argv[2])}")' \
            "$main_stack" "$i")"
        export SPARKRING_STACK_DIR="$main_stack-chaos$i"
        .venv/bin/python scripts/stack.py up --zk-nodes 3 --no-spark >/dev/null
    ) > "$main_stack-chaos$i.log" 2>&1 &
    chaos_pids+=($!)
done
wait_for_chaos_stacks() {
    for pid in "${chaos_pids[@]}"; do
        wait "$pid" || { echo "test: a chaos stack did not start (see $main_stack-chaos*.log)" >&2; exit 1; }
    done
    echo "test: chaos stacks up at $(( $(date +%s) - started )) s: $chaos_stacks" >&2
}
stop_chaos_stacks() {
    for dir in ${chaos_stacks//,/ }; do
        if [ "$dir" != "$main_stack" ]; then
            SPARKRING_STACK_DIR="$dir" .venv/bin/python scripts/stack.py down >/dev/null
        fi
    done
}
# Every run leaves its evidence: the slowest tests and a JUnit XML per pytest run.
reports="${TEST_REPORTS:-test-reports}"
mkdir -p "$reports"
set +e
# The suite on SUITE_WORKERS pytest-xdist workers (default 2; 0: one process): its tests
# wait on leases and sessions more than they compute, and each has its own database,
# ZooKeeper chroot and bucket. worksteal: an idle worker takes half a busy one's queue
# (the slow end-to-end tests are collected first, together).
.venv/bin/python -m pytest --ignore=tests/chaos -n "${SUITE_WORKERS:-2}" --dist worksteal \
    --durations=30 --junitxml="$reports/suite.xml" "$@"
rc=$?
echo "test: suite done at $(( $(date +%s) - started )) s" >&2
chaos_rc=0
if [ "$chaos" = "1" ]; then
    wait_for_chaos_stacks
    chaos_args=()
    if [ "$chaos_workers" -gt 1 ]; then chaos_args=(-n "$chaos_workers" --dist load); fi
    SPARKRING_CHAOS_STACKS="$chaos_stacks" .venv/bin/python -m pytest tests/chaos "${chaos_args[@]}" \
        --durations=30 --junitxml="$reports/chaos.xml"
    chaos_rc=$?
    echo "test: chaos campaign done at $(( $(date +%s) - started )) s" >&2
    stop_chaos_stacks  # only the campaign uses them
fi
set -e
if [ "${CI:-}" = "true" ]; then .venv/bin/python scripts/stack.py down; fi
# pytest's 5 means no test ran: a failure here, never a pass.
if [ $rc -eq 0 ]; then rc=$chaos_rc; fi
exit $rc
