"""The HTTP side of a server: the app (``api``: the console's pages, and the API's
routers, one per noun in ``routes/``), what the routes share (``dependencies``: the
server's ``Backend``), the API's contract and errors (``contract``, ``errors``), admission
before a body is read (``admission``), bearer-token checks (``auth``; the tokens
and the audit trail are ``scheduler``'s), driver logs served live
(``livelog``), the listener (``httpd``), and ``endpoint``, which builds all of that
for one server process. The console's page and assets are in ``static/``.

May import: the process floor (``server``'s own modules) and every lower package; never
the CLI. The process never imports this package: ``sparkring server run``
(``server/cli/servers.py``) hands ``endpoint.open`` to ``process.Server``
(``tests/unit/test_floors.py``).
"""
