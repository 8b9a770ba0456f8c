"""Terminal output of the CLI: settings per invocation, tables, JSON, one-line errors.

Output that is piped or redirected is read by programs and people with ``grep``: it is
never wrapped or cut at a width (Rich assumes 80 columns when stdout is not a
terminal), and on a terminal a cell too long for its column folds onto the next line
rather than losing its end to an ellipsis.

Rich is imported when something is printed through it (``out``, ``err``, tables): a
command whose only output is ``--json`` never loads it, nor SQLAlchemy until it opens the
database (``engine``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from server import settings as settings_module

if TYPE_CHECKING:
    import sqlalchemy as sa
    from rich.console import Console

# Width of output that is not a terminal: wide enough for any value, so never wrapped.
UNBOUNDED_WIDTH = 1_000_000


def _stdout() -> Console:
    from rich.console import Console

    if sys.stdout.isatty():
        return Console()
    return Console(width=UNBOUNDED_WIDTH, soft_wrap=True)


def _stderr() -> Console:
    from rich.console import Console

    return Console(stderr=True)


# The consoles ``console.out`` (stdout) and ``console.err`` (stderr), made at first use.
_CONSOLES = {"out": _stdout, "err": _stderr}


def _made(name: str) -> Console:
    if name not in globals():
        globals()[name] = _CONSOLES[name]()
    return globals()[name]


def __getattr__(name: str) -> Console:
    """``console.out`` and ``console.err`` (PEP 562: looked up here until first made)."""
    if name in _CONSOLES:
        return _made(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class Context:
    """What every command shares: the --config path and settings read once, lazily."""

    config: Path | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    _settings: settings_module.Settings | None = None

    def settings(self) -> settings_module.Settings:
        """The settings of this invocation. The services' keys are required where a
        command uses them (``server/clients.py``), not here."""
        if self._settings is None:
            self._settings = settings_module.load(self.config, require=(), **self.overrides)
        return self._settings


def engine(ctx: typer.Context) -> sa.Engine:
    """A checked engine from this invocation's settings (one connection is plenty)."""
    from server import clients

    return clients.engine(context(ctx).settings())


def context(ctx: typer.Context) -> Context:
    root = ctx.find_root()
    if not isinstance(root.obj, Context):
        root.obj = Context()
    return root.obj


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print one clear line to stderr; ``raise fail(...)`` ends the command."""
    from rich.text import Text

    # Text, not markup: a message may quote brackets ("HOST:PORT[,HOST:PORT...]").
    _made("err").print(Text.assemble(("error:", "bold red"), " ", message), soft_wrap=True)
    return typer.Exit(code)


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, default=_default, indent=2, sort_keys=True) + "\n")


def one_line(value: str) -> str:
    """``value`` with its line breaks and tabs as single spaces: an error recorded with
    a stack trace (older releases kept one) is still one row of a listing."""
    if not any(c in value for c in "\n\r\t\v\f"):
        return value
    return " ".join(value.split())


def text(value: Any) -> str:
    """A value as a person reads it: ``-`` for none, yes/no, ``k=v k=v`` for a mapping
    (a value with spaces quoted as JSON), comma-separated lists; never a Python repr.
    Always one line (:func:`one_line`)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, dict):
        return " ".join(f"{key}={_word(item)}" for key, item in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(text(item) for item in value) or "-"
    return one_line(str(value))


def _word(value: Any) -> str:
    if isinstance(value, str):
        value = one_line(value)
    if isinstance(value, str) and value and not any(c.isspace() or c in '"=' for c in value):
        return value
    if isinstance(value, str | int | float | bool) or value is None:
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value, default=_default, separators=(",", ":"), sort_keys=True)


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], title: str | None = None) -> None:
    from rich.table import Table
    from rich.text import Text

    grid = Table(title=title, show_edge=False, header_style="bold")
    for column in columns:
        grid.add_column(column, overflow="fold")
    for row in rows:
        # Text, not str: a value is never read as markup ("[bold]" in a job's error).
        grid.add_row(*(Text(text(value)) for value in row))
    _made("out").print(grid)


def fields(pairs: Iterable[tuple[str, str]], width: int = 15) -> None:
    """One ``key value`` line per pair, keys right-aligned (a record such as ``job show``)."""
    from rich.text import Text

    for key, value in pairs:
        _made("out").print(Text.assemble((f"{key:>{width}}", "bold"), " ", value))


def write_raw(data: str) -> None:
    """Text passed through as it is (driver logs): no wrapping, markup or tab expansion."""
    sys.stdout.write(data)
    sys.stdout.flush()
