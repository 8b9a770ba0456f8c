"""A job that tries what a hostile job author would (tests/e2e/test_sandbox.py).

spark-submit sandbox_probe.py OUTPUT [--linger]: copies every ``/proc/*/environ`` and
``/proc/*/cmdline`` it can read, tries to open each control file of its run directory
for writing (and to put a file there, to replace its lease, and to make its own pinned
artifact writable), and writes what it found to OUTPUT as one JSON object. It is given
no secret to look for: the test, which knows them, searches the copies. With
``--linger`` it then sleeps until it is killed (tests/integration/test_driver_user.py: its lease).
"""

from __future__ import annotations

import json
import os
import sys
import time


def readable_proc_files() -> dict[str, str]:
    copies = {}
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        for name in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as handle:
                    data = handle.read()
            except OSError:
                continue  # gone, or not ours to read
            copies[f"{pid}/{name}"] = data.replace(b"\0", b" ").decode(errors="replace")
    return copies


def writable_control_files(run_dir: str, artifact: str) -> list[str]:
    writable = []
    names = ("lease.json", "watchdog.json", "stop.json", "result.json", "driver.log", "new")
    for name in names:
        try:
            with open(os.path.join(run_dir, name), "a"):
                writable.append(name)
        except OSError:
            pass
    try:
        with open("forged-lease", "w") as handle:
            handle.write('{"deadline": 1e12}')
        os.replace("forged-lease", os.path.join(run_dir, "lease.json"))
        writable.append("replaced lease.json")
    except OSError:
        pass
    try:
        os.chmod(artifact, 0o644)
        writable.append("chmod of its artifact")
    except OSError:
        pass
    return writable


def main() -> int:
    output = sys.argv[1]
    run_dir = os.environ["SPARKRING_RUN_DIR"]
    report = {
        "pid": os.getpid(),
        "uid": os.getuid(),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "gid": os.getgid(),
        "groups": os.getgroups(),
        "home": os.environ.get("HOME"),
        "cwd": os.getcwd(),
        "run_dir": run_dir,
        "proc": readable_proc_files(),
        "writable": writable_control_files(run_dir, os.path.abspath(sys.argv[0])),
    }
    partial = f"{output}.partial"
    with open(partial, "w") as handle:
        json.dump(report, handle)
    os.replace(partial, output)
    print(f"probe: {len(report['proc'])} proc files read, writable: {report['writable']}")
    while "--linger" in sys.argv[2:]:
        time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
