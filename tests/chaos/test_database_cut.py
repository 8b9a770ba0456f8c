"""A statement in flight when the network to PostgreSQL goes silent (a cut: packets
dropped, no RST) fails within the TCP user timeout of every connection
(sql/database.py), instead of waiting on TCP's retransmissions. Their backoff doubles,
so a cut of 20 s left such a statement waiting until the retransmission after the
heal, 25 s in, and a lease renewal stuck that way let the server's drivers die at
their deadlines after the cluster was back (the ``pg_cut_all`` campaign case: a
server's renewals failed for about 15 s after the heal)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from testing import services
from testing.chaos import faults
from tests.conftest import unavailable

# How long the cut lasts: past the retransmission at 12.6 s, before the one at 25.4 s.
CUT_S = 20.0

# Inside the namespace: one connection, ready; then one statement sent into the cut.
_STATEMENT = """
import sys, time
import sqlalchemy as sa
from sql import database
engine = database.create_engine(sys.argv[1], pool_size=1)
with engine.connect() as conn:
    conn.execute(sa.text("SELECT 1"))
    print("ready", flush=True)
    sys.stdin.readline()
    began = time.monotonic()
    try:
        conn.execute(sa.text("SELECT 1"))
        print("answered", round(time.monotonic() - began, 1), flush=True)
    except sa.exc.DBAPIError as exc:
        print("failed", round(time.monotonic() - began, 1), exc.connection_invalidated, flush=True)
"""


def test_a_statement_sent_into_a_cut_fails_within_the_tcp_user_timeout(
    stack: faults.Stack, postgres_url: str
) -> None:
    reason = faults.namespaces_unavailable()
    if reason:
        unavailable(reason)
    partition = faults.Partition([stack.pg_port])
    partition.create()
    try:
        url = postgres_url.replace(f"127.0.0.1:{stack.pg_port}", partition.address(stack.pg_port))
        inside = subprocess.Popen(
            [*partition.wrapper, sys.executable, "-c", _STATEMENT, url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=services.REPO,
            env={**os.environ, "PYTHONPATH": str(services.REPO)},
        )
        assert inside.stdin is not None and inside.stdout is not None
        try:
            assert inside.stdout.readline().strip() == "ready"
            partition.cut([stack.pg_port])
            inside.stdin.write("\n")
            inside.stdin.flush()
            time.sleep(CUT_S)  # the cut itself is the fault
            partition.heal()
            said = inside.communicate(timeout=60)[0].split()
        finally:
            inside.kill()
    finally:
        partition.close()
    assert said[:1] == ["failed"], f"the statement waited out the cut: {said}"
    assert float(said[1]) < CUT_S and said[2] == "True", said
