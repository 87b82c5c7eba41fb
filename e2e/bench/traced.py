"""`python -m e2e.bench.traced ARGS`: the operator (`python -m psoperator ARGS`) with tracemalloc on.
SIGUSR2 writes where its live memory was allocated to the file named by $PSOPERATOR_MEMORY_REPORT:
the total, then the largest sources by file, by line and by call chain. `python -m e2e.bench
--trace-memory` runs the operator this way and asks for a report after the steady scenario's windows
at rest (its CPU figures are then not the operator's own: tracing slows every allocation)."""

from __future__ import annotations

import os
import runpy
import signal
import sys
import tracemalloc
from pathlib import Path
from types import FrameType

FRAMES = 8  # deep enough to reach the operator's own line under kopf's, aiohttp's or json's
TOP = {"filename": 25, "lineno": 40, "traceback": 12}
REPORT_ENV = "PSOPERATOR_MEMORY_REPORT"


def report(snapshot: tracemalloc.Snapshot) -> str:
    """The snapshot's live memory: in all, then its largest sources by each grouping of TOP."""
    snapshot = snapshot.filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    total = sum(stat.size for stat in snapshot.statistics("filename"))
    lines = [f"traced: {total / 2**20:.1f} MiB"]
    for key, count in TOP.items():
        lines.append(f"\n--- by {key}, the largest {count}")
        for stat in snapshot.statistics(key)[:count]:
            first, *callers = reversed(stat.traceback)  # the allocating line first
            lines.append(f"{stat.size / 2**20:8.2f} MiB {stat.count:9d} blocks  {first}")
            lines += [f"{'':30}{frame}" for frame in callers]
    return "\n".join(lines) + "\n"


def _write_report(_signum: int, _frame: FrameType | None) -> None:
    path = Path(os.environ[REPORT_ENV])
    partial = path.with_suffix(".partial")
    partial.write_text(report(tracemalloc.take_snapshot()))
    partial.rename(path)  # whole or not at all for whoever waits for it


def main() -> None:
    tracemalloc.start(FRAMES)
    signal.signal(signal.SIGUSR2, _write_report)
    sys.argv = ["psoperator", *sys.argv[1:]]
    runpy.run_module("psoperator", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
