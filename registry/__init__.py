"""The registry center on ZooKeeper: server membership, coordinator election and the
connection-state policy (``docs/registry.md``).

Modules: :mod:`registry.servers` (the registration record and znode layout),
:mod:`registry.connection` (clients, ACLs, connection states), :mod:`registry.membership`
(the watched, debounced view of live servers), :mod:`registry.election` (the coordinator
and its term), :mod:`registry.session` (:class:`~registry.session.Registry`, what a
server process runs), :mod:`registry.errors`.
"""
