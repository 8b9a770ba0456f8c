"""``sparkring job``: define, start, stop and inspect jobs (all through SQL). The group
only; its commands are in ``job_define`` (create, update, rollback, history),
``job_life`` (start, stop, restart, run, runs, backfill, delete), ``job_show`` (list,
show, events) and ``job_logs`` (logs)."""

from __future__ import annotations

import typer

from server.cli import job_define, job_life, job_logs, job_show

app = typer.Typer(no_args_is_help=True, help="Define, start, stop and inspect jobs.")

# In the order ``sparkring job --help`` lists them.
app.command()(job_define.create)
app.command()(job_define.update)
app.command()(job_define.rollback)
app.command()(job_define.history)
app.command()(job_life.start)
app.command()(job_life.stop)
app.command()(job_life.restart)
app.command()(job_life.run)
app.command()(job_life.runs)
app.command()(job_life.backfill)
app.command()(job_life.delete)
app.command("list")(job_show.list_)
app.command()(job_show.show)
app.command()(job_show.events)
app.command()(job_logs.logs)
