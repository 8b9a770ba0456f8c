"""The cluster's shared state and the decisions over it, in PostgreSQL; nothing here runs a
driver (that is ``server/``).

- Placement: ``ring`` (the consistent-hash ring), ``placement`` (bounded loads, the
  targets), ``residency``, ``coordinator`` (one rebalance: plan, fence, reap).
- The distribution table: ``distribution/`` (claims, renewals, reaps, ends and deferrals,
  each write fenced by owner and epoch).
- Jobs: ``job_spec`` (a definition and its checks), ``job_views`` (``JobView``,
  ``RunDefinition``: what the CLI, the API and the launch read), ``job_events``,
  ``job_revisions`` (update, rollback, history), ``jobs`` (create, start, stop, restart,
  backfill, delete), ``runs`` (a job's run history).
- Time: ``schedule`` (cron and intervals), ``fires`` (each fire time once), ``run_health``
  and ``health_policy`` (stalls), ``auto_rollback``.
- Alerts: ``alerts``, ``destinations``, ``alert_delivery``.
- Access: ``tokens`` (API tokens), ``audit`` (who did what), ``secrets`` (encrypted values).
- Plumbing: ``notify`` (LISTEN/NOTIFY wake-ups), ``loop`` (the thread shell every
  periodic loop uses).

Imports only ``sql``, ``registry`` and ``resource_center`` below it
(``tests/unit/test_floors.py``)."""
