"""The consistent-hash ring: a pure, deterministic map from names to positions and servers.

This module owns the continuum: where a job name lands (:func:`position`), which vnode
follows a position (:func:`successor`), the walk from a position around the ring
(:func:`walk`) and the plain consistent-hash assignment (:func:`assign`). Bounded loads
and capacities live in ``scheduler/placement.py``, which builds on these functions.

The ring is built by uhashring (``HashRing``), given our hash explicitly rather than
relying on its default: a position is the MD5 digest of the UTF-8 name read as a
128-bit big-endian integer, so the answer is the same on every machine and Python
version (no ``hash()``, no salting). uhashring places ``vnodes`` points per server at
``position(f"{server}-{i}")`` for ``i`` in ``range(vnodes)``; a test pins a few of those
values so that an upgrade of uhashring that changed them would fail loudly instead of
moving every job. Every server has the same number of vnodes: capacity is a hard cap
applied by the placement, not a ring weight, because the balance goal is an equal
number of jobs per server and weights would rescale every vnode whenever one server's
capacity changed.

Order independence: inputs are treated as sets and sorted before uhashring sees them.
uhashring keeps the last writer when two vnodes hash to the same point, which only
happens on an MD5 collision; sorting makes even that case independent of input order.
A key maps to the first vnode strictly after its position, wrapping past the top, as
uhashring's own ``get_node`` does (a test checks that the two agree).

Only the public parts of uhashring are used (``HashRing(nodes, hash_fn=...)``,
``get_points``); its mutable defaults and aliases are avoided by always passing every
argument.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import hashlib
from collections.abc import Iterable, Iterator

import uhashring

# Positions are 128-bit MD5 values; distances wrap modulo this.
HASH_SPACE = 1 << 128

# uhashring's default, and enough for max/mean ~1.1 on a plain ring of 10 servers.
DEFAULT_VNODES = 160


class RingError(ValueError):
    """Bad input to the ring or the placement (names, vnodes, capacities, epsilon)."""


@dataclasses.dataclass(frozen=True)
class Ring:
    """A built continuum: vnode points in ascending order and the server owning each."""

    points: tuple[int, ...]  # vnode positions, ascending
    owners: tuple[str, ...]  # owners[i] is the server whose vnode sits at points[i]
    servers: tuple[str, ...]  # every server on the ring, sorted
    vnodes: int


def position(name: str) -> int:
    """Where ``name`` sits on the ring: MD5 of its UTF-8 bytes as a 128-bit integer."""
    return int.from_bytes(hashlib.md5(name.encode("utf-8")).digest(), "big")


def build(servers: Iterable[str], vnodes: int = DEFAULT_VNODES) -> Ring:
    """The ring over ``servers`` (a set: order and duplicates do not matter).

    Rings are immutable and a pure function of their servers: the last four are kept
    (a coordinator's cycle builds up to two), so a cycle over an unchanged membership
    does not hash 160 points per server again (about a seventh of an idle server's CPU
    before)."""
    _check_vnodes(vnodes)
    return _build(name_set(servers, "server"), vnodes)


@functools.lru_cache(maxsize=4)
def _build(names: tuple[str, ...], vnodes: int) -> Ring:
    nodes = {name: {"vnodes": vnodes, "weight": 1} for name in names}
    hash_ring = uhashring.HashRing(nodes=nodes, hash_fn=position, vnodes=vnodes)
    points = hash_ring.get_points()  # [(point, server)], ascending by point
    return Ring(
        points=tuple(point for point, _ in points),
        owners=tuple(owner for _, owner in points),
        servers=names,
        vnodes=vnodes,
    )


def successor(ring: Ring, at: int) -> int:
    """Index of the first vnode strictly after position ``at`` (wrapping past the top)."""
    if not ring.points:
        raise RingError("the ring has no servers")
    index = bisect.bisect_right(ring.points, at)
    return 0 if index == len(ring.points) else index


def distance(at: int, point: int) -> int:
    """Clockwise distance from position ``at`` to a vnode ``point``, in [1, HASH_SPACE].

    A vnode exactly at ``at`` is the last one reached (a full turn), matching
    :func:`successor`, which never picks a vnode at the key's own position.
    """
    return (point - at - 1) % HASH_SPACE + 1


def walk(ring: Ring, at: int) -> Iterator[tuple[str, int]]:
    """Each server once, in ring order from position ``at``: (server, its first point)."""
    if not ring.points:
        return
    seen: set[str] = set()
    start = successor(ring, at)
    count = len(ring.points)
    for step in range(count):
        index = (start + step) % count
        owner = ring.owners[index]
        if owner not in seen:
            seen.add(owner)
            yield owner, ring.points[index]
            if len(seen) == len(ring.servers):
                return


def assign(
    jobs: Iterable[str], servers: Iterable[str], vnodes: int = DEFAULT_VNODES
) -> dict[str, str]:
    """Plain consistent hashing: each job to the server of the next vnode clockwise.

    Returns job name -> server, sorted by job name; ``{}`` when there are no servers.
    No loads, no capacities: adding or removing a server moves only the jobs that land
    on, or were on, that server.
    """
    names = name_set(jobs, "job")
    ring = build(servers, vnodes)
    if not ring.points:
        return {}
    return {name: ring.owners[successor(ring, position(name))] for name in names}


def name_set(values: Iterable[str], what: str) -> tuple[str, ...]:
    """The distinct names in ``values``, sorted; ``what`` (job, server) names them in errors."""
    if isinstance(values, str):
        # A bare string is an iterable of characters: almost certainly a mistake.
        raise RingError(f"{what}s must be a collection of names, not the string {values!r}")
    names = set()
    for value in values:
        if not isinstance(value, str) or not value:
            raise RingError(f"a {what} name must be a non-empty string, got {value!r}")
        names.add(value)
    return tuple(sorted(names))


def _check_vnodes(vnodes: int) -> None:
    if isinstance(vnodes, bool) or not isinstance(vnodes, int) or vnodes < 1:
        raise RingError(f"vnodes must be a positive integer, got {vnodes!r}")
