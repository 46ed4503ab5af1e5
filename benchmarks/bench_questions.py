"""The questions (key history, rollback losses, consumer lag, comparison) against the read they start from, in one run.

    python benchmarks/bench_questions.py [--frames 200000] [--runs 3] [--keep DIR] [--spark]

Writes (or reuses, ``--keep``) the generated capture of ``bench_capture.py``
(N DCP_MUTATION frames over 4 interleaved connections), reads it once into
the frames table and the timeline's tables (the baseline: what every
question starts from), then times each question's pure function on those
tables, best of ``--runs``, and prints each as a fraction of the read:

* ``key_versions`` (every version of every document with its fate),
  ``key_history`` of one key, ``rollback_losses``;
* ``progress`` and ``lag_summary`` (consumer lag);
* ``compare_consumers`` of two of the capture's connections.

Targets: each question under the read's own time (ratio < 1), so asking it
never costs more than reading the capture again.  ``--spark`` also runs
``dcpinspect analyze --no-report`` with and without ``--items`` (the
question tables come only with ``--items``) and prints both wall times.

A benchmark, not a test: it prints and exits 0 (1 only when something failed
to run).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_capture import capture

from dcpinspect.capture.read import read_records
from dcpinspect.tables.compare import compare_consumers, select_consumer
from dcpinspect.tables.export import frames_df
from dcpinspect.tables.history import key_history, key_versions, rollback_losses
from dcpinspect.tables.progress import lag_summary, progress
from dcpinspect.tables.timeline import timeline_frames
from dcpinspect.timeline import build_timeline


def best(fn: Callable[[], Any], runs: int) -> tuple[float, Any]:
    """(the fastest wall time of ``runs`` calls, the last result)."""
    times, out = [], None
    for _ in range(runs):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def read(path: Path) -> tuple[Any, Any]:
    frames = frames_df([str(path)])
    return frames, timeline_frames(build_timeline(read_records([str(path)])))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--keep", type=Path, help="keep the capture in this directory and reuse it")
    ap.add_argument("--spark", action="store_true", help="also time dcpinspect analyze with and without --items")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-questions-"))
    work.mkdir(parents=True, exist_ok=True)
    path = capture(work, args.frames)

    base, (frames, tables) = best(lambda: read(path), 1)
    print(f"read (frames table + timeline tables): {base:.2f} s for {len(frames):,} frames")
    conns = [int(c) for c in tables["connections"]["conn"]][:2]
    key = str(frames.loc[frames["name"] == "DCP_MUTATION", "key"].iloc[0])
    questions: dict[str, Callable[[], Any]] = {
        "key_versions": lambda: key_versions(frames, tables),
        f"key_history({key!r})": lambda: key_history(None, key, frames=frames, tables=tables),
        "rollback_losses": lambda: rollback_losses(frames, tables),
        "progress": lambda: progress(frames, tables),
        "lag_summary": lambda: lag_summary(progress(frames, tables)),
    }
    if len(conns) == 2:
        a, b = (select_consumer(frames, tables, c) for c in conns)
        questions[f"compare_consumers(conn {conns[0]}, conn {conns[1]})"] = lambda: compare_consumers(a, b)
    failed = 0
    for name, fn in questions.items():
        try:
            t, out = best(fn, args.runs)
        except Exception as exc:  # a benchmark reports what failed and goes on
            print(f"{name}: failed: {type(exc).__name__}: {exc}")
            failed += 1
            continue
        rows = len(out.table) if hasattr(out, "table") else len(out)
        verdict = "ok" if t < base else "SLOWER THAN THE READ"
        print(f"{name}: {t:.2f} s = {t / base:.2f}x the read ({rows:,} rows; target < 1x: {verdict})")
    if args.spark:
        for extra in ([], ["--items"]):
            out_dir = work / ("analyze-items" if extra else "analyze")
            cmd = [sys.executable, "-m", "dcpinspect", "analyze", str(path), "--no-report", "--overwrite", "--out", str(out_dir), *extra]
            t = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            wall = time.perf_counter() - t
            if proc.returncode != 0:
                print(f"analyze {' '.join(extra)}: failed: {proc.stderr.strip()[-300:]}")
                failed += 1
                continue
            print(f"analyze --no-report {' '.join(extra)}: {wall:.1f} s wall ({proc.stdout.strip().splitlines()[-1]})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
