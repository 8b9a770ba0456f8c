"""Sample failing job: exits 3 at once with a clear message on stderr (no SparkSession).

Used to test that a crash-looping job ends FAILED after max_restarts with its error.
"""

from __future__ import annotations

import os
import sys

EXIT_CODE = 3


def main() -> int:
    attempt = os.environ.get("SPARKRING_ATTEMPT", "?")
    epoch = os.environ.get("SPARKRING_EPOCH", "?")
    print(
        f"crash_loop: failing on purpose (epoch {epoch}, attempt {attempt})",
        file=sys.stderr,
        flush=True,
    )
    return EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
