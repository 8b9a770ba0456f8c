"""The API's routes, one module per noun, each with its module-level ``router``
(``server/web/api.py`` includes them all). A route takes the server's ``Backend`` as a
dependency (``server/web/dependencies.py``, below the routes) and its caller's token
check from ``server/web/auth.py``."""
