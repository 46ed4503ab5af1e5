"""The explorer model on a 1M-frame capture: open, page, filter, select.

    python benchmarks/bench_explorer.py [--frames 1000000] [--keep DIR]

Writes the capture of ``bench_capture.py`` (N DCP_MUTATIONs on 4 interleaved
connections) and times the explorer's model (``dcpinspect.views.explorer.ExplorerModel``,
what the widget drives):

* open in the background: until the first page can be shown (first chunk read);
* the whole load (frames table + raw bytes + timeline), for reference;
* open from a frames table already built (parquet / DataFrame users);
* next page, jump to the last page, filter by vbucket, filter by key text,
  select a frame (its annotation HTML), the selected stream's seqno plot.

Target: under a second per action. A benchmark, not a test: it prints and exits 0.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_capture import write_capture

from dcpinspect.views.explorer import ExplorerModel


def timed(label: str, fn, results: list[tuple[str, float]]):
    t0 = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t0
    results.append((label, dt))
    print(f"{label:<58} {dt * 1000:10.1f} ms", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=1_000_000)
    ap.add_argument("--keep", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = args.keep or Path(tmp)
        path = base / f"explorer-{args.frames}.pcap"
        if not path.exists():
            write_capture(path, args.frames)
        print(f"capture: {path.stat().st_size / 2**20:.0f} MiB, {args.frames:,} frames")
        r: list[tuple[str, float]] = []
        m = timed("open (background): first page ready", lambda: ExplorerModel.open(str(path), background=True), r)
        timed("  ... first page rows", m.page_rows, r)
        timed("full load in the background (table, raw bytes, timeline)", m.wait, r)
        print(
            f"rows {m.store.rows:,}, streams {len(m.timeline.streams)}, peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB"
        )
        timed("first page after the load (count + rows)", lambda: (m.total, m.page_rows()), r)
        timed("next page", lambda: (m.next_page(), m.page_rows()), r)
        timed("last page", lambda: (m.goto_page(m.pages - 1), m.page_rows()), r)
        timed("filter by vbucket (vbucket=7) + its first page", lambda: (m.set_filters(vbucket=7), m.total, m.page_rows()), r)
        timed("next page of the filter", lambda: (m.next_page(), m.page_rows()), r)
        timed(
            "filter by key text ('doc-0001') + first page", lambda: (m.set_filters(vbucket=None, key="doc-0001"), m.total, m.page_rows()), r
        )
        m.clear_filters()
        target = m.store.rows - 12_345
        timed(f"select frame {target:,} (annotation HTML)", lambda: (m.select(target), m.annotation_html()), r)
        timed("  ... its stream (stream_of)", lambda: m.stream_of(target), r)
        timed("  ... its stream's seqno plot (Figure, not rendered)", m.stream_figure, r)
        table = m.store.table
        m2 = timed("open from a frames table already built (Arrow)", lambda: ExplorerModel.open(table, timeline=False), r)
        timed("  ... filter by vbucket + first page", lambda: (m2.set_filters(vbucket=3), m2.total, m2.page_rows()), r)
        slow = [label for label, dt in r if dt > 1.0 and not label.startswith("full load")]
        print("over a second:", ", ".join(slow) if slow else "none (besides the full load)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
