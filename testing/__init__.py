"""The test harness: what the tests, the benchmarks and the demo share, and nothing that
is a test itself (those live in ``tests/``). The product never imports it
(``tests/unit/test_floors.py``), and the wheel does not ship it (``pyproject.toml``
lists the product's packages only).

Services and their per-test isolation:
    ``services``     where the local stack is; a database copied from a migrated
                     template, a ZooKeeper chroot and an S3 bucket per test
    ``factories``    rows of jobs and resources without going through S3
    ``waiting``      polling with a deadline, the one way tests wait

Real processes:
    ``cluster``      ``sparkring server run`` processes on the stack, with real drivers
    ``cli_runner``   ``sparkring`` commands forked from a warm parent, each a process
    ``api_helpers``  a real server for the HTTP API and console tests
    ``stand_in_server``  a stand-in ``server run`` under the supervisor
    ``jobs/``        the light PySpark jobs the clusters submit (heartbeat, fail once,
                     a stallable stream, the sandbox probe)

Peers and stand-ins:
    ``webhook_receiver``  an alert receiver; ``hostile_http`` a peer that trickles or
    floods; ``rawhttp`` requests on a raw socket; ``spark_ui`` a driver's REST API;
    ``sink`` what Spark's file sink committed; ``certificates`` self-signed TLS.

Running the suite: ``dealing`` deals the tests marked ``long(seconds)`` to the front of
every pytest-xdist worker's share. The chaos campaign's harness is ``testing.chaos``.
"""
