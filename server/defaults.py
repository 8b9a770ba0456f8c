"""Every tunable default of sparkring, in one place, each with its unit.

Settings (``server/settings.py``) read these; library packages receive plain values
and never import this module's names implicitly through ``os.environ``. A lower package
owns its own defaults (``resource_center/defaults.py``: S3 and the artifact cache), and
settings read them there: no module reaches up a floor for a constant.
"""

from __future__ import annotations

ZK_ROOT = "/sparkring"
# ZooKeeper session timeout, seconds. Peers use 60 s; 6 s keeps failover fast while a
# 2 s tick ZooKeeper still tolerates a couple of missed heartbeats (min is 2 x tick).
ZK_SESSION_TIMEOUT_S = 6.0
# Membership changes within this window are folded into one recomputation, seconds.
MEMBERSHIP_DEBOUNCE_S = 0.5
# Job commands (start, stop...) fold into one recomputation within this window, seconds.
JOB_CHANGE_DEBOUNCE_S = 0.05

# Largest artifact accepted on upload, bytes.
MAX_ARTIFACT_BYTES = 512 * 1024 * 1024
# Largest JSON request body the HTTP API reads, bytes (every write but an upload).
MAX_JSON_BODY_BYTES = 1024 * 1024

SPARK_MASTER = "local[2]"
CHECKPOINT_ROOT = "/var/lib/sparkring/checkpoints"
WORK_DIR = "/var/lib/sparkring/work"

# How many nice steps below the server and its watchdogs drivers run (0-19, 0 = none).
# A watchdog kills its driver when the lease runs out; on a host saturated by drivers
# (or thawed after a pause, every JVM runnable at once) a watchdog of equal priority
# waited seconds for a CPU (docs/drivers.md, "Priority"). YARN's
# container-executor.os.sched.priority.adjustment does the same for its containers.
DRIVER_NICE = 10

# The schedule firing loop (scheduler/fires.py) sleeps until the next fire time, at most
# this long, seconds: a fire switched on elsewhere is seen within it even if its NOTIFY
# was lost.
SCHEDULE_FIRE_INTERVAL_S = 1.0
# How often every server looks for due alert deliveries (server/alert_sender.py), s.
ALERT_INTERVAL_S = 1.0

# How often every server judges the auto-rollback watches (scheduler/auto_rollback.py),
# seconds: a crash of a watched revision is rolled back within about this long.
AUTO_ROLLBACK_INTERVAL_S = 2.0

# Maximum concurrent drivers on one server, drivers.
CAPACITY = 4
ROLE = "both"

# Lease length, seconds. A driver's watchdog kills it when renewals stop for longer
# than LEASE_TTL_S - WATCHDOG_MARGIN_S, so it is dead before another server may claim.
# Failover after a crash takes about one TTL (docs/benchmarks.md): 8 s keeps it within
# the ZooKeeper session timeout + 2 s while three renewals fit before the deadline.
LEASE_TTL_S = 8.0
WATCHDOG_MARGIN_S = 3.0
# How often leases are renewed, seconds (several renewals fit in one TTL).
LEASE_RENEW_INTERVAL_S = 1.5
# A live server's expired lease (H7, docs/distribution.md#lapsed-leases): once a lease
# has been expired this long and its owner, still in ZooKeeper, has neither re-claimed
# nor released the job, the coordinator places the job on another server (and gives
# a server whose every lease lapsed no job), seconds. A healthy owner acts on its own
# expired lease at its next poll (POLL_INTERVAL_S, NOTIFY sooner); two TTLs leave ample
# room for that while bounding the outage: the driver died at its deadline, so the job
# is down for about TTL + this (the server also withdraws from ZooKeeper after one TTL
# without a renewal, which usually moves its jobs sooner). The same grace holds after
# PostgreSQL starts and after any outage of it (distribution.HELD_OVER): no departed
# owner's lease is reaped or claimed over before the cluster has reached it again for
# this long, so an owner that withdrew through the outage records first how its
# drivers ended meanwhile.
LEASE_LAPSE_GRACE_S = 2 * LEASE_TTL_S
# A server that deferred a job (a start failed for a reason that may pass) this many
# times in a row, with no driver of it started since, steps back from it: the
# coordinator places the job elsewhere for DEFER_AVOID_S (then that server may be tried
# again: its disk may have been freed). 0 = never; deferrals, seconds. Three: a single
# PostgreSQL or S3 blip defers once, and each retry comes after RESTART_BACKOFF_BASE_S.
DEFER_STREAK = 3
DEFER_AVOID_S = 300.0
# PostgreSQL session limits of a server process, seconds (sql/database.SessionLimits):
# a wait for a row lock gives up after DB_LOCK_TIMEOUT_S (a renewal then retries at
# once), and a transaction left idle (its holder paused) is ended after
# DB_IDLE_IN_TRANSACTION_TIMEOUT_S, both well inside LEASE_TTL_S - WATCHDOG_MARGIN_S so
# that a stuck lock never outlives a driver's deadline. DB_STATEMENT_TIMEOUT_S is a
# backstop for runaway statements (a rebalance of 100,000 jobs takes ~6 s).
DB_LOCK_TIMEOUT_S = 1.0
DB_IDLE_IN_TRANSACTION_TIMEOUT_S = 3.0
DB_STATEMENT_TIMEOUT_S = 60.0
# Planned restart (SIGTERM with a window above 0): leases are extended by this many
# seconds and the drivers left running for the successor on the same host and work dir
# to adopt; 0 = SIGTERM stops the drivers and hands the jobs to other servers, seconds.
HANDOVER_WINDOW_S = 0.0
# After a restarted server is a member again, how long a driver it adopted is kept even
# if its target still names another server: the coordinator needs a membership debounce
# and a rebalance to give the job back, seconds.
ADOPTION_SETTLE_S = 3.0
# Supervisor of the server in a container (server supervise): a crashed server is
# restarted after DELAY * 2**(crashes within the window - 1), capped at DELAY_MAX,
# seconds. The first restart must come well within LEASE_TTL_S - WATCHDOG_MARGIN_S of
# the last renewal (plus the server's own start-up, ~1-2 s), or the watchdogs kill the
# drivers the restarted server was to adopt. More than CRASH_LIMIT crashes within
# CRASH_WINDOW_S seconds is a crash loop: the supervisor exits (ExitCode.CRASH_LOOP).
SUPERVISOR_RESTART_DELAY_S = 0.25
SUPERVISOR_RESTART_DELAY_MAX_S = 10.0
SUPERVISOR_CRASH_LIMIT = 5
SUPERVISOR_CRASH_WINDOW_S = 120.0
# Fallback poll interval of the distribution table when no NOTIFY arrives, seconds.
POLL_INTERVAL_S = 2.0
# Graceful stop of a driver: SIGTERM, then SIGKILL after this grace, seconds.
STOP_GRACE_S = 20.0
# Restart backoff of a crashed streaming driver: base * 2**restarts, capped, seconds.
RESTART_BACKOFF_BASE_S = 1.0
RESTART_BACKOFF_MAX_S = 60.0
# A run deferred because no Spark master answered waits RESTART_BACKOFF_BASE_S, doubling
# with each consecutive deferral, at most this long: it starts soon after a master is
# back (seconds).
SPARK_MASTER_WAIT_MAX_S = 15.0
# How often a server looks at whether its Spark masters answer, for `server list`, the
# API and sparkring_spark_master_up (server/master_watch.py), seconds; and how long one
# master may take to accept the TCP connection, seconds.
SPARK_MASTER_PROBE_INTERVAL_S = 15.0
SPARK_MASTER_PROBE_TIMEOUT_S = 1.0
MAX_RESTARTS = 3
# Warm hand-off of a planned move of a streaming job (docs/drivers.md, "Warm hand-off"):
# how long the old owner waits for its target's warm driver to be ready before it stops
# its own driver anyway (the cold path), seconds: the slowest Spark cold start measured
# here (90 s, on a loaded 2-core host; 10-50 s idle). Past it the target's claim still
# takes the warm driver if it runs, only a colder one.
WARM_READY_WAIT_S = 90.0
# How long a warm driver lives without its go signal (the move cancelled, the claim
# lost), seconds: its watchdog's deadline. Covers the ready wait, the old driver's stop
# grace and the claim, with room.
WARM_GO_SLACK_S = 40.0
WARM_GO_TIMEOUT_S = WARM_READY_WAIT_S + STOP_GRACE_S + WARM_GO_SLACK_S
# Bounded-load placement slack: a server takes at most ceil((1 + eps) * average) jobs.
PLACEMENT_EPSILON = 0.05
# Settle window of placement, seconds: a server that joined is given streaming jobs
# only once it has been a member this long, new jobs wait while a server is this new
# (so servers starting seconds apart do not make a job hop), and a server back within
# this long after leaving is the same member (a flap moves nothing). Leaves are never
# delayed by it (docs/distribution.md).
PLACEMENT_SETTLE_S = 5.0
# Minimum residency of a gentle join, seconds (docs/distribution.md, "Gentle joins"): a
# joiner takes a streaming job only once it has run healthily on its server this long
# since its last claim, so a job that failed over, moved or restarted is not moved again
# for balance right away (one fault, one restart). 300 s is the stall timeout: the
# health monitor can call a stream healthy only after it made progress for that long,
# and it is more than three times the slowest Spark cold start measured here (90 s).
MIN_RESIDENCY_S = 300.0
# Virtual nodes per server on the ring: 640 keeps moves on a join or leave within
# 1.10x of the ideal K/(N+1) with bounded loads (160 gives 1.15-1.2x, docs/benchmarks.md).
RING_VNODES = 640

# Health monitor of the local drivers (server/health.py): how often it reads their logs
# and REST APIs, seconds; a streaming query that completed no new batch for
# STALL_TIMEOUT_S is flagged stalled, an application without executor cores for
# RESOURCE_WAIT_TIMEOUT_S waiting for resources (per job: sparkring.health.* conf).
HEALTH_INTERVAL_S = 5.0
STALL_TIMEOUT_S = 300.0
RESOURCE_WAIT_TIMEOUT_S = 120.0
# History retention (docs/operations.md#history-retention): job events and shipped
# driver logs older than this are deleted; 0 keeps them forever, seconds (30 days).
HISTORY_RETENTION_S = 30 * 24 * 3600.0
# How often a server runs the retention pass, seconds; only the server holding the
# retention advisory lock prunes, the others skip that pass. The first pass comes
# HISTORY_PRUNE_FIRST_DELAY_S after start-up, so a restart loop never prunes in a loop.
HISTORY_PRUNE_INTERVAL_S = 3600.0
HISTORY_PRUNE_FIRST_DELAY_S = 60.0
# Job events deleted per transaction by a prune, rows: each batch is one short DELETE.
HISTORY_PRUNE_BATCH = 1000

# HTTP port for the API, the console, /healthz and /metrics; 0 picks a free port.
HEALTH_PORT = 0
# Database connections of the HTTP API, apart from the runner's (never starve renewals).
HTTP_DB_POOL = 4
