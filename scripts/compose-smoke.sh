#!/usr/bin/env bash
# End-to-end smoke test of the compose deployment on a real container engine (podman or
# Docker). Takes minutes and gigabytes; never run by CI. docs/deployment.md explains it.
#
#   scripts/compose-smoke.sh                        # images from their registries
#   COMPOSE_SMOKE_STANDINS=1 scripts/compose-smoke.sh   # no registry: local stand-ins
#
# Steps, each printed with its result and time: engine settings, (stand-in base images),
# build the sparkring image, start ZooKeeper/PostgreSQL/S3/Spark and wait for their
# healthchecks, `sparkring db upgrade` through the one-shot migrate service (and the
# minio-setup one-shot), start three servers, upload and run a PySpark streaming job on
# the compose Spark cluster and check that it works (micro-batches committed to the
# output volume by the cluster's executors, each value once, its health moving, no
# crash), run Spark's own pi.py as a batch job (its tasks on the workers, its answer in
# its log), kill the server container that runs the stream and check that it works on
# another server (each value still once), (with COMPOSE_SMOKE_PG_STANDBY=1: kill the
# PostgreSQL primary, promote its synchronous standby, and check that the stream goes on
# and a new batch job runs), pi.py again, scale the servers to 4, tear everything down.
#
# Variables:
#   COMPOSE_SMOKE_ENGINE     podman or docker (default: docker when `docker compose` works,
#                            else podman)
#   COMPOSE_SMOKE_COMPOSE    the compose command (default: `docker compose`, or
#                            podman-compose >= 1.6 on podman)
#   COMPOSE_SMOKE_STANDINS   1: build stand-ins for the third-party images from Debian's
#                            packages (mmdebstrap) and select them with
#                            scripts/compose-smoke/docker-compose.standins.yml
#   COMPOSE_SMOKE_DIR        work directory (default /var/tmp/sparkring-compose-smoke)
#   COMPOSE_SMOKE_REBUILD    1: rebuild every image from scratch (no reuse, no build
#                            cache); by default existing stand-ins are reused
#   COMPOSE_SMOKE_KEEP       1: leave the stack running at the end (or on failure)
#   COMPOSE_SMOKE_PORT_BASE  host ports for the Spark UI and MinIO console are
#                            PORT_BASE+80 and PORT_BASE+1 (default 28000)
#   COMPOSE_SMOKE_PG_STANDBY 1: the deployment with docker-compose.pg-standby.yml (a
#                            synchronous standby, the servers on both nodes), and the
#                            step pg-failover after failover: the primary killed, the
#                            standby promoted by hand as docs/deployment.md says
#
# The staged bring-up (infrastructure, wait healthy, one-shots with `run`, then servers
# with --no-deps) is what podman-compose needs: it ignores depends_on conditions and
# cannot start a service that depends on a finished one-shot. `docker compose up -d`
# does all of it in one command; the script stages it on both engines alike.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SMOKE=$REPO/scripts/compose-smoke
WORK=${COMPOSE_SMOKE_DIR:-/var/tmp/sparkring-compose-smoke}
PROJECT=sparkring-smoke
SERVER_IMAGE=localhost/sparkring:smoke
STANDINS=${COMPOSE_SMOKE_STANDINS:-0}
PG_STANDBY=${COMPOSE_SMOKE_PG_STANDBY:-0}
PORT_BASE=${COMPOSE_SMOKE_PORT_BASE:-28000}
STANDIN_PREFIX=localhost/sparkring-standin
JOB=smoke-counter
# The compose file's output volume (docker-compose.yml): where jobs write.
OUTPUT=/var/lib/sparkring/output/$JOB
REPORT=/var/lib/sparkring/output/report.json
STANDIN_USED=()
NO_CACHE=()
[[ ${COMPOSE_SMOKE_REBUILD:-0} == 1 ]] && NO_CACHE=(--no-cache)

ts() { date +%s.%N; }
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):7.1f}s')" "$1" "$(ts)"; }
T_ALL=$(ts)
CURRENT=""
step() { # NAME FUNCTION [ARGS...]: run, then print PASS/FAIL with the time it took
  local name=$1 start
  shift
  CURRENT=$name
  start=$(ts)
  echo "--- $name"
  "$@"
  printf 'STEP %-16s PASS %s\n' "$name" "$(elapsed "$start")"
  CURRENT=""
}
first_line() { # COMMAND...: its first line of output (no `| head`: pipefail + SIGPIPE)
  local out
  out=$("$@" 2>/dev/null) || true
  echo "${out%%$'\n'*}"
}
die() {
  echo "error: $*" >&2
  exit 1
}
wait_until() { # TIMEOUT_S DESCRIPTION COMMAND...: poll COMMAND until it succeeds
  local timeout=$1 what=$2 deadline
  shift 2
  deadline=$(($(date +%s) + timeout))
  until "$@" >/dev/null 2>&1; do
    (($(date +%s) < deadline)) || die "$what: not within ${timeout}s"
    sleep 2
  done
}

# --- engine -----------------------------------------------------------------------

pick_engine() {
  ENGINE=${COMPOSE_SMOKE_ENGINE:-}
  if [[ -z $ENGINE ]]; then
    if command -v docker >/dev/null && docker compose version >/dev/null 2>&1; then
      ENGINE=docker
    elif command -v podman >/dev/null; then
      ENGINE=podman
    else
      die "neither Docker (with compose v2) nor podman is installed (docs/deployment.md)"
    fi
  fi
  if [[ -n ${COMPOSE_SMOKE_COMPOSE:-} ]]; then
    read -r -a COMPOSE_CMD <<<"$COMPOSE_SMOKE_COMPOSE"
  elif [[ $ENGINE == docker ]]; then
    COMPOSE_CMD=(docker compose)
  else
    command -v podman-compose >/dev/null ||
      die "podman-compose is not installed: pip install 'podman-compose>=1.6'"
    COMPOSE_CMD=(podman-compose)
  fi
}

# podman on a host without CAP_SYS_RESOURCE or with a hybrid cgroup layout needs two
# engine settings; a CONTAINERS_CONF of the user's own is left alone.
engine_settings() {
  mkdir -p "$WORK"
  echo "engine: $("$ENGINE" --version); compose: $(first_line "${COMPOSE_CMD[@]}" version)"
  [[ $ENGINE == podman ]] || return 0
  if [[ -n ${CONTAINERS_CONF:-} ]]; then
    echo "CONTAINERS_CONF=$CONTAINERS_CONF (yours, used as is)"
    return 0
  fi
  local nofile nproc conf=() reasons=()
  nofile=$(ulimit -Hn)
  nproc=$(ulimit -Hu)
  if [[ $nofile != unlimited ]] && ((nofile < 1048576)); then
    # podman's own default for root is the maximum; its own hard limit proved not
    # always settable (runc: "error setting rlimit type 6"), 32768 processes were.
    if [[ $nproc == unlimited ]] || ((nproc > 32768)); then nproc=32768; fi
    conf+=("[containers]" "default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=$nproc:$nproc\"]")
    reasons+=("hard nofile limit $nofile;")
  fi
  if [[ $(stat -fc %T /sys/fs/cgroup) != cgroup2fs ]]; then
    conf+=("[engine]" 'runtime = "runc"')
    reasons+=("cgroup v1/hybrid layout (crun refuses it)")
  fi
  if ((${#conf[@]})); then
    printf '%s\n' "${conf[@]}" >"$WORK/containers.conf"
    export CONTAINERS_CONF=$WORK/containers.conf
    echo "engine settings in $CONTAINERS_CONF for: ${reasons[*]}"
  fi
}

# --- images -----------------------------------------------------------------------

have_image() { "$ENGINE" image inspect "$1" >/dev/null 2>&1; }

# The recipe of a stand-in: a hash of its Dockerfile and of the files it copies in.
recipe_hash() { # DOCKERFILE
  local sources
  sources=$(awk 'toupper($1) == "COPY" { for (i = 2; i < NF; i++) print $i }' "$SMOKE/$1")
  # shellcheck disable=SC2086 # one file name per word
  (cd "$SMOKE" && cat "$1" $sources) | sha256sum | cut -c1-16
}

# Builds IMAGE with FILE from scripts/compose-smoke unless it exists already, built from
# the same recipe (its label sparkring.standin.recipe).
standin_image() { # IMAGE DOCKERFILE [BUILD ARGS...]
  local image=$1 file=$2 recipe
  shift 2
  recipe=$(recipe_hash "$file")
  if have_image "$image" && [[ ${COMPOSE_SMOKE_REBUILD:-0} != 1 ]]; then
    if [[ $("$ENGINE" image inspect --format '{{index .Labels "sparkring.standin.recipe"}}' "$image") == "$recipe" ]]; then
      echo "  $image: reused"
      return 0
    fi
    echo "  $image: built from another recipe than $file's (or before the label): rebuilding"
  fi
  local start
  start=$(ts)
  "$ENGINE" build "${NO_CACHE[@]}" -f "$SMOKE/$file" --label "sparkring.standin.recipe=$recipe" "$@" \
    -t "$image" "$SMOKE" >"$WORK/build-${file%%.*}.log" 2>&1 ||
    { tail -20 "$WORK/build-${file%%.*}.log"; die "building $image failed"; }
  echo "  $image: built in $(elapsed "$start")"
}

base_images() {
  local base=$STANDIN_PREFIX/debian:bookworm
  if ! have_image "$base" || [[ ${COMPOSE_SMOKE_REBUILD:-0} == 1 ]]; then
    command -v mmdebstrap >/dev/null || die "mmdebstrap is not installed (apt-get install mmdebstrap)"
    # The host's extra CA certificates (a re-signing proxy) go into the base image at
    # build time, from the host's files: none is ever committed.
    local hooks=() certs=(/usr/local/share/ca-certificates/*.crt)
    if [[ -e ${certs[0]} ]]; then
      hooks+=(--customize-hook="copy-in ${certs[*]} /usr/local/share/ca-certificates")
      # shellcheck disable=SC2016 # $1 is mmdebstrap's, expanded by its hook
      hooks+=(--customize-hook='chroot "$1" update-ca-certificates')
    fi
    local start
    start=$(ts)
    mmdebstrap --quiet --variant=minbase --include=ca-certificates "${hooks[@]}" \
      bookworm "$WORK/rootfs.tar" >"$WORK/build-debian.log" 2>&1 ||
      { tail -20 "$WORK/build-debian.log"; die "mmdebstrap failed"; }
    "$ENGINE" import --quiet "$WORK/rootfs.tar" "$base" >/dev/null
    rm -f "$WORK/rootfs.tar"
    echo "  $base: built from Debian's packages in $(elapsed "$start")"
  else
    echo "  $base: reused"
  fi
  standin_image "$STANDIN_PREFIX/python:3.11-slim-bookworm" python.Dockerfile
  standin_image "$STANDIN_PREFIX/postgres:15" postgres.Dockerfile
  standin_image "$STANDIN_PREFIX/zookeeper:3.8" zookeeper.Dockerfile
  standin_image "$STANDIN_PREFIX/s3:moto" s3.Dockerfile
  STANDIN_USED=(
    "python:3.11-slim-bookworm -> $STANDIN_PREFIX/python:3.11-slim-bookworm (Debian python3 in a venv)"
    "postgres:15 -> $STANDIN_PREFIX/postgres:15 (Debian postgresql-15, gosu)"
    "zookeeper:3.9.3 -> $STANDIN_PREFIX/zookeeper:3.8 (Debian zookeeper 3.8)"
    "minio/minio, minio/mc -> $STANDIN_PREFIX/s3:moto (moto S3 server; mc admin skipped)"
  )
  if [[ $PG_STANDBY == 1 ]]; then
    STANDIN_USED+=("postgres:15 of postgres-standby -> the same stand-in (scripts/compose-smoke/docker-compose.pg-standby.standins.yml)")
  fi
}

build_image() {
  local args=()
  [[ $STANDINS == 1 ]] && args+=(--build-arg "PYTHON_IMAGE=$STANDIN_PREFIX/python:3.11-slim-bookworm")
  "$ENGINE" build "${NO_CACHE[@]}" "${args[@]}" -t "$SERVER_IMAGE" "$REPO" >"$WORK/build-sparkring.log" 2>&1 ||
    { tail -30 "$WORK/build-sparkring.log"; die "building $SERVER_IMAGE failed"; }
  echo "  $SERVER_IMAGE: $("$ENGINE" image inspect --format '{{.Size}}' "$SERVER_IMAGE" |
    python3 -c 'import sys; print(f"{int(sys.stdin.read()) / 1e9:.2f} GB")')"
}

# --- compose ----------------------------------------------------------------------

compose() {
  local files=(-f "$REPO/docker-compose.yml")
  [[ $STANDINS == 1 ]] && files+=(-f "$SMOKE/docker-compose.standins.yml")
  if [[ $PG_STANDBY == 1 ]]; then
    files+=(-f "$REPO/docker-compose.pg-standby.yml")
    if [[ $STANDINS == 1 ]]; then
      files+=(-f "$SMOKE/docker-compose.pg-standby.standins.yml")
    fi
  fi
  "${COMPOSE_CMD[@]}" --project-name "$PROJECT" "${files[@]}" --env-file "$WORK/smoke.env" "$@"
}

secret() { python3 -c 'import secrets; print(secrets.token_urlsafe(24))'; }
# A Fernet key (SPARKRING_SECRET_KEYS: 32 random bytes, url-safe base64).
fernet_secret() { python3 -c 'import base64, os; print(base64.urlsafe_b64encode(os.urandom(32)).decode())'; }

write_env() {
  # .env.example's development values, fresh secrets for those it leaves empty (compose
  # refuses to start without them), this project's image, host ports clear of anything
  # else on the machine, one core per worker.
  install -m 600 /dev/null "$WORK/smoke.env" # secrets: readable by us only
  grep -v -E '^(SERVER_IMAGE|SPARK_UI_PORT|MINIO_CONSOLE_PORT|SPARK_WORKER_CORES|SPARK_WORKER_MEMORY|POSTGRES_PASSWORD|MINIO_ROOT_PASSWORD|S3_SECRET_KEY|ZK_AUTH|SECRET_KEYS)=' \
    "$REPO/.env.example" >"$WORK/smoke.env"
  cat >>"$WORK/smoke.env" <<EOF
POSTGRES_PASSWORD=$(secret)
MINIO_ROOT_PASSWORD=$(secret)
S3_SECRET_KEY=$(secret)
ZK_AUTH=sparkring:$(secret)
SECRET_KEYS=$(fernet_secret)
SERVER_IMAGE=$SERVER_IMAGE
SPARK_UI_PORT=$((PORT_BASE + 80))
MINIO_CONSOLE_PORT=$((PORT_BASE + 1))
SPARK_WORKER_CORES=1
SPARK_WORKER_MEMORY=1g
EOF
}

containers() { # SERVICE -> ids of its running containers
  "$ENGINE" ps -q --filter "label=com.docker.compose.project=$PROJECT" \
    --filter "label=com.docker.compose.service=$1"
}

healthy() { # CONTAINER: its healthcheck passes now
  if [[ $ENGINE == podman ]]; then
    # No systemd here to run podman's healthcheck timers: run the check itself.
    podman healthcheck run "$1"
  else
    [[ $(docker inspect --format '{{.State.Health.Status}}' "$1") == healthy ]]
  fi
}

running_at_least() { # SERVICE COUNT
  (($(containers "$1" | wc -l) >= $2))
}

wait_healthy() { # SERVICE COUNT TIMEOUT_S
  local service=$1 count=$2 timeout=$3 ids
  wait_until "$timeout" "$count running $service container(s)" running_at_least "$service" "$count"
  for id in $(containers "$service"); do
    wait_until "$timeout" "$service container $id healthy" healthy "$id"
  done
  ids=$(containers "$service" | tr '\n' ' ')
  echo "  $service: $count healthy (${ids% })"
}

env_value() { # NAME DEFAULT: its value in the settings file (.env.example's), else DEFAULT
  local line
  line=$(grep -m1 "^$1=" "$WORK/smoke.env") && [[ -n ${line#*=} ]] || {
    echo "$2"
    return 0
  }
  echo "${line#*=}"
}
psql_in() { # SERVICE SQL: one statement through the service's own socket, unaligned
  "$ENGINE" exec "$(first_line containers "$1")" \
    psql -U "$(env_value POSTGRES_USER sparkring)" -d "$(env_value POSTGRES_DB sparkring)" -Atc "$2"
}
standby_sync() { [[ $(psql_in postgres "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'postgres_standby'") == sync ]]; }

# docker-compose.pg-standby.yml's standby: started once the primary is healthy (its
# first start copies it), healthy, and the primary's commits waiting for it.
pg_standby_up() {
  compose up -d --no-deps postgres-standby >>"$WORK/up.log" 2>&1 ||
    { cat "$WORK/up.log"; die "compose up postgres-standby failed"; }
  wait_healthy postgres-standby 1 180
  wait_until 60 "postgres-standby a synchronous standby of postgres" standby_sync
  echo "  postgres: streams to postgres-standby ($(psql_in postgres "SELECT application_name || ' ' || state || ', ' || sync_state FROM pg_stat_replication")), synchronous_standby_names = '$(psql_in postgres 'SHOW synchronous_standby_names')'"
}

infrastructure() {
  write_env
  compose up -d zookeeper postgres minio spark-master-1 spark-master-2 spark-worker >"$WORK/up.log" 2>&1 ||
    { cat "$WORK/up.log"; die "compose up failed"; }
  wait_healthy zookeeper 1 120
  wait_healthy postgres 1 120
  if [[ $PG_STANDBY == 1 ]]; then pg_standby_up; fi
  wait_healthy minio 1 120
  wait_healthy spark-master-1 1 180
  wait_healthy spark-master-2 1 180
  wait_healthy spark-worker 2 180
}

one_shots() {
  compose run --rm --no-deps migrate >"$WORK/migrate.log" 2>&1 ||
    { cat "$WORK/migrate.log"; die "migrate (sparkring db upgrade) failed"; }
  echo "  migrate: $(tail -1 "$WORK/migrate.log" | sed 's/\x1b\[[0-9;]*m//g')"
  compose run --rm --no-deps minio-setup >"$WORK/minio-setup.log" 2>&1 ||
    { cat "$WORK/minio-setup.log"; die "minio-setup failed"; }
  grep -h "stand-in" "$WORK/minio-setup.log" | sed 's/^/  minio-setup: /' || true
  echo "  minio-setup: $(tail -1 "$WORK/minio-setup.log")"
}

any_server() { first_line containers server; }
cli() { "$ENGINE" exec "$(any_server)" sparkring "$@"; }

live_servers() { cli server list --json | python3 -c 'import json, sys; print(len(json.load(sys.stdin)))'; }
registered() { (($(live_servers) == $1)); } # COUNT

servers_up() { # COUNT
  wait_healthy server "$1" 240
  wait_until 60 "$1 servers registered in ZooKeeper" registered "$1"
  echo "  registered servers: $(live_servers)"
}

start_servers() {
  compose up -d --no-deps server >"$WORK/servers.log" 2>&1 ||
    { cat "$WORK/servers.log"; die "compose up server failed"; }
  servers_up 3
}

json_get() { # KEY...: the value at that path of the JSON on stdin (None when absent)
  python3 -c 'import json, sys
value = json.load(sys.stdin)
for key in sys.argv[1:]:
    value = value.get(key) if isinstance(value, dict) else None
print(value)' "$@"
}

job_field() { # FIELD [JOB]: of the job (default the stream), from `sparkring job show --json`
  cli job show "${2:-$JOB}" --json | json_get "$1"
}

health_field() { # FIELD: of the stream's health (its driver's Spark UI, as the server read it)
  cli job show "$JOB" --json | json_get health "$1"
}

job_running() { # [NOT_OWNER]: running on a server other than NOT_OWNER
  [[ $(job_field state) == running ]] && [[ $(job_field owner) != "${1:-}" ]]
}

job_ended() { # JOB
  [[ $(job_field state "$1") =~ ^(finished|failed|stopped)$ ]]
}

ends_and_restarts() { # JOB: "<crashed and failed events> <restarts>" (a crash loop shows in both)
  local ends
  ends=$(cli job events "$1" --json --limit 1000 |
    python3 -c 'import json, sys; print(sum(e["kind"] in ("crashed", "failed") for e in json.load(sys.stdin)))')
  echo "$ends $(job_field restarts "$1")"
}

not_crash_looping() { # JOB [ALLOWED]: at most ALLOWED (default 0) crashes and restarts
  local counts ends restarts
  counts=$(ends_and_restarts "$1")
  read -r ends restarts <<<"$counts"
  ((ends <= ${2:-0} && restarts <= ${2:-0})) ||
    die "job $1 crashed (crashed/failed events, restarts: $counts): $(job_field last_error "$1")"
}

spark_apps() { # ids of the applications running on the compose Spark masters (the active one has them)
  local master
  for master in spark-master-1 spark-master-2; do
    "$ENGINE" exec "$(first_line containers "$master")" python -c \
      'import json, urllib.request; print(" ".join(a["id"] for a in json.load(urllib.request.urlopen("http://127.0.0.1:8080/json"))["activeapps"] if a["state"] == "RUNNING"))'
  done | xargs
}

spark_app_running() { # [APP_IDS]: an application other than APP_IDS runs on the cluster
  local id
  for id in $(spark_apps); do
    [[ " ${1:-} " == *" $id "* ]] || return 0
  done
  return 1
}

# What the stream committed (scripts/compose-smoke/stream_output.py, run in a server
# container, which mounts the output volume as the workers do).
stream_output() { "$ENGINE" exec -i "$(any_server)" python - "$OUTPUT" <"$SMOKE/stream_output.py"; }
committed_at_least() { (($(stream_output | json_get batches) >= $1)); } # BATCHES
health_has_executors() { [[ $(health_field executors) =~ ^[1-9] ]]; }
health_batch_past() { # BATCH_ID: the health's last batch id is a number above it
  local last
  last=$(health_field last_batch_id)
  [[ $last =~ ^[0-9]+$ ]] && ((last > $1))
}

# The stream does work, not only `running`: micro-batches committed to its output since
# the last look, its health (read by its server from the driver's UI) names executors of
# the cluster and a last batch that moves, each value of the rate source once (none
# duplicated, none missing: exactly once, across any failover before), no crash.
stream_works() { # [ALLOWED]: crashes and restarts allowed (default none)
  local before last out
  before=$(stream_output | json_get batches)
  wait_until 240 "$JOB committing 3 micro-batches more than its $before" committed_at_least $((before + 3))
  wait_until 120 "$JOB's health naming executors of the cluster" health_has_executors
  last=$(health_field last_batch_id)
  [[ $last =~ ^[0-9]+$ ]] || last=-1
  wait_until 120 "$JOB's health: a last batch past $last" health_batch_past "$last"
  out=$(stream_output)
  [[ $(json_get duplicated <<<"$out") == 0 && $(json_get missing <<<"$out") == 0 ]] ||
    die "$JOB's output is not exactly once: $out"
  not_crash_looping "$JOB" "${1:-0}"
  echo "  $JOB: committed $out"
  echo "  $JOB: health: last batch $(health_field last_batch_id), $(health_field executors) executor(s), $(health_field cores) core(s)"
}

run_job() {
  local server
  server=$(any_server)
  "$ENGINE" cp "$REPO/examples/jobs/streaming_counter.py" "$server:/tmp/streaming_counter.py"
  cli resource upload counter /tmp/streaming_counter.py >"$WORK/job.log"
  cli job create "$JOB" --resource counter --kind streaming --arg "$OUTPUT" >>"$WORK/job.log"
  cli job start "$JOB" >>"$WORK/job.log"
  echo "  uploaded counter (examples/jobs/streaming_counter.py), created and started $JOB (output $OUTPUT)"
  wait_until 240 "job $JOB running" job_running
  wait_until 120 "a running application on the compose Spark master" spark_app_running
  echo "  $JOB: running on server $(job_field owner), epoch $(job_field epoch); Spark master runs $(spark_apps)"
  stream_works
}

# Spark's own pi.py (from the pyspark wheel in the image) as a batch job on the cluster:
# it must finish with its answer in its log, its tasks run by executors on the workers
# (a driver its executors cannot reach waits for resources for ever).
batch_pi() { # NAME
  local name=$1 pi log answer tasks hosts
  pi=$("$ENGINE" exec "$(any_server)" python -c \
    'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "examples/src/main/python/pi.py"))')
  cli resource upload pi "$pi" >>"$WORK/job.log"
  cli job create "$name" --resource pi --kind batch --max-retries 0 --arg 4 >>"$WORK/job.log"
  cli job start "$name" >>"$WORK/job.log"
  wait_until 300 "batch job $name ended" job_ended "$name"
  [[ $(job_field state "$name") == finished ]] ||
    die "batch job $name is $(job_field state "$name"): $(job_field last_error "$name")"
  not_crash_looping "$name"
  # An ended run's log is read from S3, where its server ships it after the run.
  wait_until 60 "$name's log shipped" cli job logs "$name"
  log=$WORK/$name.log
  cli job logs "$name" -n 5000 >"$log"
  answer=$(grep -m1 "Pi is roughly" "$log") || die "no answer in $name's log ($log)"
  tasks=$(grep -cE 'Finished task .* on [^ ]+ \(executor [0-9]+\)' "$log" || true)
  ((tasks == 4)) || die "$name: $tasks of its 4 tasks ran on an executor of the cluster ($log)"
  hosts=$(grep -oE 'Finished task .* on [^ ]+ \(executor [0-9]+\)' "$log" |
    sed -E 's/.* on ([^ ]+) \(executor.*/\1/' | sort -u | xargs)
  echo "  $name (Spark's pi.py, batch): finished: $answer"
  echo "  $name: its 4 tasks run by executors at $hosts"
}

# A data team's job (examples/jobs/region_report.py) on the cluster: a variable, a secret
# and a package the image lacks (built by pip in a server container, docs/dependencies.md).
# It must finish with its report: the secret it got, the package imported by its driver
# and by tasks in the workers' executors; the value shows in no CLI output or server log.
data_team_job() {
  local server value report log
  server=$(any_server)
  "$ENGINE" cp "$REPO/examples/jobs/region_report.py" "$server:/tmp/region_report.py"
  "$ENGINE" cp "$REPO/examples/jobs/region_report.requirements.txt" "$server:/tmp/requirements.txt"
  value=$(secret)
  printf '%s' "$value" | "$ENGINE" exec -i "$server" sparkring secret create warehouse --from-stdin >>"$WORK/job.log"
  "$ENGINE" exec "$server" sparkring resource upload region-report /tmp/region_report.py >>"$WORK/job.log"
  "$ENGINE" exec "$server" sparkring job create report --resource region-report --kind batch \
    --max-retries 0 --env REGION=eu --secret-env WAREHOUSE_PASSWORD=warehouse \
    --requirements /tmp/requirements.txt --arg "$REPORT" >>"$WORK/job.log" 2>&1 ||
    { tail -20 "$WORK/job.log"; die "job create report (with --requirements) failed"; }
  cli job start report >>"$WORK/job.log"
  wait_until 300 "batch job report ended" job_ended report
  [[ $(job_field state report) == finished ]] ||
    die "batch job report is $(job_field state report): $(job_field last_error report)"
  report=$("$ENGINE" exec "$(any_server)" cat "$REPORT")
  python3 - "$value" "$report" <<'PY' || die "report of the data team's job: $report"
import hashlib, json, sys
value, report = sys.argv[1], json.loads(sys.argv[2])
assert report["password_sha256"] == hashlib.sha256(value.encode()).hexdigest(), "secret"
assert report["executor_tabulate"] == [report["driver_tabulate"]], "package on the executors"
assert all("/app-" in f for f in report["task_folders"]), "tasks on the cluster's executors"
PY
  log=$WORK/report.log
  { cli job show report --json; cli job events report --json; cli job logs report -n 5000; cli secret list
    compose logs server; } >"$log" 2>&1
  ! grep -qF "$value" "$log" || die "the secret's value shows in the CLI's output or a log ($log)"
  echo "  report (region_report.py, batch): finished: $(json_get orders <<<"$report") orders in eu, tabulate $(json_get driver_tabulate <<<"$report") on the driver and in $(json_get task_folders <<<"$report" | grep -o app- | wc -l) executor folder(s)"
  echo "  report: the secret reached the driver, and its value is in none of $(wc -l <"$log") lines of CLI output and server logs"
}

failover() {
  local owner epoch victim apps
  owner=$(job_field owner)
  epoch=$(job_field epoch)
  apps=$(spark_apps)
  for id in $(containers server); do
    if [[ $("$ENGINE" inspect --format '{{.Config.Hostname}}' "$id") == "$owner" ]]; then
      victim=$id
    fi
  done
  [[ -n ${victim:-} ]] || die "no server container has host name $owner"
  "$ENGINE" kill "$victim" >/dev/null
  echo "  killed server container $victim (server $owner, SIGKILL)"
  wait_until 240 "job $JOB running on another server" job_running "$owner"
  (($(job_field epoch) > epoch)) || die "epoch did not advance past $epoch"
  wait_until 120 "a new application on the compose Spark master" spark_app_running "$apps"
  echo "  $JOB: running on server $(job_field owner), epoch $(job_field epoch) (was $owner, epoch $epoch)"
  echo "  Spark master runs $(spark_apps) (was $apps)"
  stream_works
  [[ $(stream_output | json_get epochs) == *"'$(job_field epoch)'"* ]] ||
    die "no output of $JOB's epoch $(job_field epoch) yet"
}

# --- PostgreSQL failover (COMPOSE_SMOKE_PG_STANDBY=1) ------------------------------

# Seconds from SINCE (epoch seconds) to the first event of KIND after it, of any of the
# jobs: "<seconds> <job>" of the earliest, or nothing.
first_event_after() { # SINCE KIND JOB...
  local since=$1 kind=$2 job
  shift 2
  for job; do
    cli job events "$job" --json --limit 1000 | python3 -c 'import datetime, json, sys
since, kind, job = float(sys.argv[1]), sys.argv[2], sys.argv[3]
ats = [datetime.datetime.fromisoformat(e["at"]).timestamp() for e in json.load(sys.stdin) if e["kind"] == kind]
later = [at - since for at in ats if at > since]
if later:
    print(f"{min(later):.1f} {job}")' "$since" "$kind" "$job"
  done | sort -n | first_line cat
}

# When the stream's lease was last written, read on the promoted node (lease_until is
# now() + the lease TTL at each renewal or claim): epoch seconds.
lease_written_at() { # TTL
  local until
  until=$(psql_in postgres-standby "SELECT extract(epoch FROM d.lease_until) FROM distribution d JOIN jobs j ON j.id = d.job_id WHERE j.name = '$JOB'")
  python3 -c 'import sys; print(float(sys.argv[1]) - float(sys.argv[2]))' "$until" "$1"
}

since() { python3 -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.1f}")' "$1" "$2"; }
later_than() { python3 -c 'import sys; sys.exit(float(sys.argv[1]) <= float(sys.argv[2]))' "$1" "$2"; } # A B

# docs/deployment.md's failover by hand, the primary crashing: the PostgreSQL primary
# killed (SIGKILL), the synchronous standby promoted with pg_promote(). The stream must
# go on (its lease written on the promoted node, its output growing, each value once, at
# most one restart), a new batch job must be placed and run to its end, and each server
# must have said at start that commits wait for a synchronous standby.
pg_failover() {
  local epoch restarts primary killed promoted ttl written=0 deadline claim start servers=0 id
  epoch=$(job_field epoch)
  restarts=$(job_field restarts)
  primary=$(first_line containers postgres)
  [[ -n $primary ]] || die "no running postgres container"
  standby_sync || die "postgres-standby is not a synchronous standby before the failover"
  ttl=$("$ENGINE" exec "$(any_server)" python -c 'from server.settings import Settings; print(Settings().lease_ttl)')
  echo "  $JOB: running on server $(job_field owner), epoch $epoch, $restarts restart(s), $(stream_output | json_get batches) micro-batches committed"
  killed=$(ts)
  "$ENGINE" kill "$primary" >/dev/null
  [[ $(psql_in postgres-standby 'SELECT pg_promote()') == t ]] || die "pg_promote() on postgres-standby failed"
  promoted=$(ts)
  [[ -z $(containers postgres) ]] || die "the killed postgres container runs again (its restart policy)"
  [[ $(psql_in postgres-standby 'SELECT pg_is_in_recovery()') == f ]] || die "postgres-standby is still in recovery"
  echo "  killed postgres container $primary (SIGKILL); postgres-standby promoted (pg_promote()) $(since "$killed" "$promoted") s after the kill"
  # The newest lease write, read as fast as podman exec goes: the first one seen after
  # the kill bounds the first renewal from above.
  deadline=$(($(date +%s) + 60))
  until later_than "$written" "$killed"; do
    (($(date +%s) < deadline)) || die "$JOB's lease not written on the promoted node within 60 s"
    written=$(lease_written_at "$ttl" 2>/dev/null) || written=0
  done
  echo "  $JOB: lease written on the promoted node $(since "$killed" "$written") s after the kill (the first write seen: an upper bound of the first; lease TTL $ttl s)"
  batch_pi smoke-pi-pg
  stream_works 1
  (($(job_field restarts) <= restarts + 1)) || die "$JOB restarted more than once: $(job_field restarts) restarts (was $restarts)"
  echo "  $JOB: epoch $(job_field epoch) (was $epoch), $(job_field restarts) restart(s) (was $restarts), on server $(job_field owner)"
  claim=$(first_event_after "$killed" claimed "$JOB" smoke-pi-pg)
  start=$(first_event_after "$killed" driver_started "$JOB" smoke-pi-pg)
  [[ -n $claim && -n $start ]] || die "no claim or driver start after the kill (claim: '$claim', start: '$start')"
  echo "  from the kill: first claim ${claim% *} s (${claim#* }), first driver start ${start% *} s (${start#* })"
  for id in $(containers server); do
    # grep -c reads the whole log: grep -q would end the pipe early (pipefail, SIGPIPE).
    (($("$ENGINE" logs "$id" 2>&1 | grep -c 'PostgreSQL commits wait for a synchronous standby' || true) > 0)) ||
      die "server container $id did not log 'PostgreSQL commits wait for a synchronous standby'"
    servers=$((servers + 1))
  done
  echo "  $servers server(s) logged at start: PostgreSQL commits wait for a synchronous standby (action=replication)"
}

scale() {
  compose up -d --no-deps --scale server=4 server >"$WORK/scale.log" 2>&1 ||
    { cat "$WORK/scale.log"; die "compose up --scale server=4 failed"; }
  servers_up 4
}

project_containers() { "$ENGINE" ps -aq --filter "label=com.docker.compose.project=$PROJECT"; }

# What is left of the project: containers, volumes, networks (and podman-compose's pod).
leftovers() {
  local volumes networks
  volumes=$("$ENGINE" volume ls --format '{{.Name}}' | grep -c "^${PROJECT}_" || true)
  networks=$("$ENGINE" network ls --format '{{.Name}}' | grep -c "^${PROJECT}_" || true)
  echo "$(project_containers | wc -l) container(s), $volumes volume(s), $networks network(s)"
}

teardown() {
  compose down -v --timeout 30 >"$WORK/down.log" 2>&1 || true
  local left
  left=$(project_containers)
  if [[ -n $left ]]; then
    # podman-compose 1.6 removes the configured replicas only, not those --scale added.
    echo "  compose down left $(wc -l <<<"$left") scaled-up container(s): stopping them, then down again"
    # shellcheck disable=SC2086 # one id per word
    "$ENGINE" stop --time 30 $left >>"$WORK/down.log" 2>&1
    # shellcheck disable=SC2086
    "$ENGINE" rm -f $left >>"$WORK/down.log" 2>&1
    compose down -v --timeout 30 >>"$WORK/down.log" 2>&1 || true
  fi
  [[ $(leftovers) == "0 container(s), 0 volume(s), 0 network(s)" ]] ||
    { tail -20 "$WORK/down.log"; die "left after teardown: $(leftovers)"; }
  echo "  containers, volumes and network of $PROJECT removed"
}

on_exit() {
  local code=$?
  if [[ -n $CURRENT ]]; then
    printf 'STEP %-16s FAIL\n' "$CURRENT"
    if [[ $CURRENT != teardown && ${COMPOSE_SMOKE_KEEP:-0} != 1 && -n ${ENGINE:-} ]]; then
      compose logs --tail 30 server >"$WORK/failure-logs.txt" 2>&1 || true
      echo "server logs: $WORK/failure-logs.txt"
      compose down -v --timeout 30 >/dev/null 2>&1 || true
    fi
  fi
  exit "$code"
}
trap on_exit EXIT
trap "exit 143" TERM
trap "exit 130" INT

pick_engine
step engine engine_settings
if [[ $STANDINS == 1 ]]; then
  step standin-images base_images
fi
step build-image build_image
step infrastructure infrastructure
step db-upgrade one_shots
step servers start_servers
step pyspark-job run_job
step pi-batch batch_pi smoke-pi
step data-team-job data_team_job
step failover failover
if [[ $PG_STANDBY == 1 ]]; then
  step pg-failover pg_failover
fi
step pi-after batch_pi smoke-pi-2
step scale-to-4 scale
if [[ ${COMPOSE_SMOKE_KEEP:-0} == 1 ]]; then
  echo "stack left running (COMPOSE_SMOKE_KEEP=1): ${COMPOSE_CMD[*]} --project-name $PROJECT down -v"
else
  step teardown teardown
fi
echo "compose smoke test passed in $(elapsed "$T_ALL") with $ENGINE and ${COMPOSE_CMD[*]}"
if ((${#STANDIN_USED[@]})); then
  echo "locally built stand-ins (no image registry reachable):"
  printf '  %s\n' "${STANDIN_USED[@]}"
else
  echo "third-party images: from their registries (no stand-ins)"
fi
