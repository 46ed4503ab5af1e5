"""Timeline building speed: records of the 1M-mutation capture through ``TimelineBuilder``.

    python benchmarks/bench_timeline.py [--frames 1000000]

Writes the capture of ``bench_capture.py`` (N mutations, 4 connections), reads
its records once (not timed), then times feeding them all to a
``TimelineBuilder`` and asking for the timeline.  Target: >= 500k frames/s on
one core.  A benchmark, not a test: it prints and exits 0.
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time
from pathlib import Path

from bench_capture import write_capture

from dcpinspect.records import read_records
from dcpinspect.timeline import TimelineBuilder


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--frames", type=int, default=1_000_000)
    args = p.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    with tempfile.TemporaryDirectory(prefix="dcpinspect-bench-") as work:
        cap = Path(work) / "mutations.pcap"
        write_capture(cap, args.frames)
        records = list(read_records([str(cap)]))
        gc.freeze()  # the records stay alive: keep the collector from walking them
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            b = TimelineBuilder()
            for r in records:
                b.feed(r)
            tl = b.timeline()
            best = min(best, time.perf_counter() - t)
        print(f"timeline: {len(records):,} frames, {len(tl.streams)} streams, {len(tl.anomalies)} anomalies")
        print(f"best of 3: {best:.2f} s, {len(records) / best:,.0f} frames/s (target 500,000)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
