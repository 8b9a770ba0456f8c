"""The ``sparkring`` command line: one module per noun (``job``, ``resource``,
``servers``, ``ring``, ``token``, ``events``, ``alert``, ``db``, ``apply`` and its
``spec``, ``health``), the Typer app that joins them (``main``), and terminal output
(``console``).

May import: the process floor (``server``'s own modules, e.g. ``process`` for
``server run``), the web package (its live logs and endpoint), and every lower
package (``scheduler``, ``resource_center``, ``registry``, ``sql``). Nothing below
imports it (``tests/unit/test_floors.py``). Importing this package loads nothing: the CLI's
start-up cost is what ``main`` imports (``tests/integration/test_cli_user.py`` guards it), and
``python -m server.cli.health``, the containers' probe, stays light.
"""
