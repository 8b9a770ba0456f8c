"""Terminal output of the CLI: settings per invocation, tables, JSON, one-line errors."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import typer
from rich.console import Console
from rich.table import Table

from server import clients
from server import settings as settings_module

out = Console()
err = Console(stderr=True)


@dataclass
class Context:
    """What every command shares: the --config path and settings read once, lazily."""

    config: Path | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    _settings: settings_module.Settings | None = None

    def settings(self) -> settings_module.Settings:
        if self._settings is None:
            self._settings = settings_module.load(self.config, **self.overrides)
        return self._settings


def engine(ctx: typer.Context) -> sa.Engine:
    """A checked engine from this invocation's settings (one connection is plenty)."""
    return clients.engine(context(ctx).settings())


def context(ctx: typer.Context) -> Context:
    root = ctx.find_root()
    if not isinstance(root.obj, Context):
        root.obj = Context()
    return root.obj


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print one clear line to stderr; ``raise fail(...)`` ends the command."""
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, default=_default, indent=2, sort_keys=True) + "\n")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], title: str | None = None) -> None:
    grid = Table(title=title, show_edge=False, header_style="bold")
    for column in columns:
        grid.add_column(column)
    for row in rows:
        grid.add_row(*(_cell(value) for value in row))
    out.print(grid)
