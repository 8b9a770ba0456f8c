"""The API's routes, one module per noun, each a function of the server's ``Backend``
(``server/web/dependencies.py``, below them) that returns its ``APIRouter``
(``server/web/api.py`` includes them all)."""
