"""PNG plots of the failover benchmark for docs/benchmarks.md.

Reads the JSON that ``benchmarks/failover.py --json`` prints (one file per timeout
setting) and writes, under ``docs/img/``:

- ``failover-kill.png``: the distribution (empirical CDF) of kill -9 -> new driver, with
  the ZooKeeper session timeout and the lease TTL marked;
- ``failover-handoff.png``: hand-off gaps (join and graceful leave) and job start ->
  driver spawned.

    .venv/bin/python -m benchmarks.failover --json > /tmp/failover-fast.json
    .venv/bin/python -m benchmarks.failover --json --timeouts production \\
        --only kill > /tmp/failover-production.json
    .venv/bin/python -m benchmarks.plots /tmp/failover-fast.json /tmp/failover-production.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display here

from matplotlib import pyplot

REPO = Path(__file__).resolve().parent.parent
COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red")


def _cdf(axes: Any, samples: list[float], label: str, colour: str) -> None:
    ordered = sorted(samples)
    fractions = [(i + 1) / len(ordered) for i in range(len(ordered))]
    axes.step(ordered, fractions, where="post", label=label, color=colour)


def kill_plot(runs: list[dict[str, Any]], out: Path) -> None:
    figure, axes = pyplot.subplots(figsize=(7, 4))
    for run, colour in zip(runs, COLOURS, strict=False):
        samples = run["raw"].get("kill_to_new_driver", [])
        if not samples:
            continue
        name = (
            f"{run['timeouts']} (session {run['session_timeout_s']:g} s, "
            f"lease {run['lease_ttl_s']:g} s), n={len(samples)}"
        )
        _cdf(axes, samples, name, colour)
        axes.axvline(run["session_timeout_s"], color=colour, linestyle=":", linewidth=1)
        axes.axvline(run["lease_ttl_s"], color=colour, linestyle="--", linewidth=1)
        axes.axvline(run["session_timeout_s"] + 2, color=colour, linestyle="-.", linewidth=1)
    axes.set_xlabel("kill -9 of the owner -> new driver started elsewhere (s)")
    axes.set_ylabel("fraction of failovers")
    axes.set_title(
        "Failover time (dotted: session timeout, dash-dot: L1 target session + 2 s,\n"
        "dashed: lease TTL)",
        fontsize=10,
    )
    axes.set_ylim(0, 1.02)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    pyplot.close(figure)


def handoff_plot(run: dict[str, Any], out: Path) -> None:
    series = [
        ("server joins: old driver ended -> new started", run["raw"].get("join_gap", [])),
        ("server leaves (SIGTERM): ended -> started", run["raw"].get("leave_gap", [])),
        ("job start committed -> driver started", run["raw"].get("start_from_commit", [])),
        (
            "'sparkring job start' invoked -> driver started",
            run["raw"].get("start_from_invocation", []),
        ),
    ]
    series = [(label, samples) for label, samples in series if samples]
    figure, axes = pyplot.subplots(figsize=(7, 4))
    for (label, samples), colour in zip(series, COLOURS, strict=False):
        _cdf(axes, samples, f"{label}, n={len(samples)}", colour)
    axes.set_xlabel("seconds")
    axes.set_ylabel("fraction")
    axes.set_title(f"Hand-off gap and start reaction ({run['timeouts']} timeouts)")
    axes.set_ylim(0, 1.02)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    pyplot.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=Path, help="failover.py --json outputs")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img")
    args = parser.parse_args()
    runs = [json.loads(path.read_text()) for path in args.results]
    args.out.mkdir(parents=True, exist_ok=True)
    kill_plot(runs, args.out / "failover-kill.png")
    with_handoff = [
        r for r in runs if r["raw"].get("join_gap") or r["raw"].get("start_from_return")
    ]
    if with_handoff:
        handoff_plot(with_handoff[0], args.out / "failover-handoff.png")
    print(f"plots written to {args.out}")


if __name__ == "__main__":
    main()
