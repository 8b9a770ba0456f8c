"""A light batch driver that fails its first run and succeeds the next (no SparkSession,
started by spark-submit): batch retries end to end.

``fail_once.py MARKER``: when MARKER does not exist, writes into it the name under which
the driver was started (``argv[0]``'s base name) and exits 4; when it exists, exits 0.
"""

from __future__ import annotations

import os
import sys


def main() -> int:
    marker = sys.argv[1]
    if os.path.exists(marker):
        return 0
    with open(marker, "w") as f:
        f.write(os.path.basename(sys.argv[0]) + "\n")
    print("fail_once: first run, failing on purpose", file=sys.stderr)
    return 4


if __name__ == "__main__":
    sys.exit(main())
