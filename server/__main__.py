"""``python -m server`` runs the sparkring CLI."""

from server import cli

cli.main()
