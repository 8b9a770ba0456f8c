"""The repository's entry points (bootstrap, the local stack, the demo, the test run).
The demo runs as ``python -m scripts.demo`` from the repository root, so it imports the
test harness (``testing.cluster``) as a package; ``stack.py`` runs as a file, before any
virtualenv exists."""
