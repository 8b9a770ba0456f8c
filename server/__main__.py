"""``python -m server`` runs the sparkring CLI."""

from server.cli import main as cli

cli.main()
