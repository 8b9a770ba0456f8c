"""The sparkring server process and its two front ends.

- The process: ``process`` (wires its ``components`` and orders start and shutdown),
  ``runner`` (the poll and renew loops) with its steps ``claims``, ``launch`` and
  ``launch_spec``, ``stops``, ``warm``, ``outcomes``, ``adoption``, ``log_shipping``, over
  one ``run_table`` (the runner's state) and a ``run_context``; ``reconcile`` (its pure
  decisions); ``coordinator_loop``; ``health``, ``retention``, ``master_watch``,
  ``alert_sender``; ``supervisor``.
- One run's processes: ``driver`` and ``watchdog`` (fencing by lease deadline), their
  contract ``watchdog_contract``, ``rundir`` (the files they share), ``driver_user``,
  ``driver_network``, ``checkpoint``, ``job_deps``, ``warm_entry``.
- Below them all: ``settings``, ``defaults``, ``clients``, ``tls``, ``metrics``.
- ``cli/`` (the ``sparkring`` commands) and ``web/`` (the API, the console and live logs)
  sit on the floor above and are never imported from here (``tests/unit/test_floors.py``)."""
