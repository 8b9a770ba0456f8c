"""Measured figures: each module prints what it measures (``--json`` for the same figures
as JSON) and docs/benchmarks.md holds the results with the command that produced them.

Run each as a module from the repository root, ``.venv/bin/python -m benchmarks.NAME``,
so it imports the test harness (``testing.cluster``, ``testing.chaos.trial``) as a package
(benchmarks/README.md)."""
