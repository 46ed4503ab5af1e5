"""The explorer as a notebook user gets it, on a 1M-frame capture: open, load, page, filter, select, plots rendered.

    python benchmarks/bench_explorer.py [--frames 1000000] [--keep DIR]

Writes the capture of ``bench_capture.py`` (N DCP_MUTATIONs on 4 interleaved
connections; reused from ``--keep DIR`` when there) and times
``dcpinspect.explore(path)`` - the widget (:class:`~dcpinspect.views.widgets.ExplorerView`)
over its model, with no browser: every action below includes what the view
does in answer (the frame list, the annotation, the plots drawn and rendered
to PNG at the width the browser reports):

* open: until the view is built with its first page (the first chunk read,
  the rest loading in the background);
* the full load with the view attached (how many times the view redrew on
  the way), and the peak RSS (``ru_maxrss``, and sampled every 5 ms during
  the load and during the actions, split into anonymous and file-backed
  memory - the heap, and the mapped capture and spill files);
* next page, last page, a filter by vbucket, by key text, a display filter
  (``dcpinspect.tables.filter``, when there);
* select a frame near the end: its annotation and its stream's plot (PNG);
* the all-streams plot (PNG), the branch tree (PNG), a wider picture;
* open from a frames table already built (Arrow; decoded in memory, so the
  peak RSS of the view from the capture is printed before it).

Target: every interactive action under 200 ms.  A benchmark, not a test: it
prints and exits 0.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_capture import write_capture

import dcpinspect
from dcpinspect.views.explorer import ExplorerModel
from dcpinspect.views.widgets import ExplorerView

TARGET = 0.2  # seconds per interactive action


def timed(label: str, fn: Callable[[], Any], results: list[tuple[str, float]]) -> Any:
    t0 = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t0
    results.append((label, dt))
    print(f"{label:<66} {dt * 1000:10.1f} ms", flush=True)
    return out


def warm_up() -> None:
    """What a kernel pays once, before its first view: the widget modules, matplotlib, its font cache."""
    import io

    from matplotlib.figure import Figure

    import dcpinspect.views.plots
    import dcpinspect.views.widgets  # noqa: F401

    fig = Figure()
    fig.subplots().set_title("warm")
    fig.savefig(io.BytesIO(), format="png")


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_now() -> dict[str, int]:
    """The resident set now, in MiB: anonymous (the heap: Python, numpy, Arrow) and file-backed (mapped captures and spill files)."""
    got = {"anon": 0, "file": 0}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("RssAnon:", "RssFile:")):
                    got["anon" if line.startswith("RssAnon") else "file"] = int(line.split()[1]) // 1024
    except OSError:  # not Linux: the peak only
        pass
    return got


class RssSampler:
    """Samples the resident set every few milliseconds in a thread: where the peak is, anonymous and file-backed."""

    def __init__(self, every: float = 0.005) -> None:
        self.peak = {"anon": 0, "file": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            now = rss_now()
            if now["anon"] + now["file"] > self.peak["anon"] + self.peak["file"]:
                self.peak = now

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> RssSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __str__(self) -> str:
        return f"{self.peak['anon'] + self.peak['file']} MiB ({self.peak['anon']} anonymous + {self.peak['file']} file-backed)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=1_000_000)
    ap.add_argument("--keep", type=Path, default=None)
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    with tempfile.TemporaryDirectory() as tmp:
        base = args.keep or Path(tmp)
        path = base / f"explorer-{args.frames}.pcap"
        if not path.exists():
            write_capture(path, args.frames)
        print(f"capture: {path.stat().st_size / 2**20:.0f} MiB, {args.frames:,} frames; peak RSS before: {rss_mib():.0f} MiB")
        r: list[tuple[str, float]] = []
        timed("first use in a kernel: imports, matplotlib's fonts (once)", warm_up, r)
        print(f"RSS after the imports: {rss_now()} MiB")
        with RssSampler() as load:
            explore: Callable[[str], ExplorerView] = dcpinspect.explore  # type: ignore[assignment]  # a lazy name of the package
            v = timed("explore(path): the view with its first page (load goes on)", lambda: explore(str(path)), r)
            m = v.model
            v.stream_img.width = v.branch_img.width = 1100  # what the browser reports: pictures as wide as the notebook
            timed("full load with the view attached (table, raw bytes, timeline)", m.wait, r)
        print(
            f"rows {m.store.rows:,}, streams {len(m.timeline.streams)}, chunks {m.chunks}, "
            f"view redrawn {m.notified} times during the load, peak RSS {rss_mib():.0f} MiB"
        )
        print(f"  the load's peak (sampled): {load}; after it: {rss_now()} MiB")
        actions = RssSampler().start()
        timed("next page", v.next_btn.click, r)
        timed("last page", lambda: m.goto_page(m.pages - 1), r)
        timed("filter by vbucket (vbucket=7): the list (the pictures stay)", lambda: setattr(v.vbucket, "value", 7), r)
        timed("next page of the filter", v.next_btn.click, r)

        def by_key() -> None:
            v.vbucket.value = None
            v.key.value = "doc-0001"

        timed("filter by key text ('doc-0001')", by_key, r)
        timed("display filter 'vbucket == 3 and seqno > 100'", lambda: setattr(v.text, "value", "vbucket == 3 and seqno > 100"), r)
        if m.filter_error:
            print(f"  (display filter: {m.filter_error})")
        timed("clear the filters", m.clear_filters, r)
        target = m.store.rows - 12_345
        timed(f"select frame {target:,}: annotation + its stream's plot (PNG)", lambda: m.select(target), r)
        same = m.stream_frames(m.shown_stream() or 0)
        later = int(same[min(len(same) - 1, int(same.searchsorted(target)) + 1)])
        timed(f"select frame {later:,}, the same stream's next (pictures kept)", lambda: m.select(later), r)
        timed(f"select frame {target + 1:,}, another stream's (its pictures drawn)", lambda: m.select(target + 1), r)
        timed("the all-streams plot (drawn + PNG)", lambda: v.show.__setattr__("value", None), r)
        timed("a stream picked in the plot selector (drawn + PNG)", lambda: setattr(v.show, "value", 1), r)
        timed("the same picture 1600 px wide (PNG)", lambda: setattr(v.stream_img, "width", 1600), r)
        shown = m.shown()
        timed("a click on the stream plot (hit test)", lambda: m.select_click("stream", 400.0, 200.0), r)
        assert shown is not None
        actions.stop()
        print(f"peak RSS {rss_mib():.0f} MiB, of the view from the capture; the actions' peak (sampled): {actions}")
        table = m.store.table  # decoded into memory: this part measures a table the user holds, not the view's
        m2 = timed("open from a frames table already built (Arrow)", lambda: ExplorerModel.open(table, timeline=False), r)
        timed("  ... filter by vbucket + first page", lambda: (m2.set_filters(vbucket=3), m2.total, m2.page_rows()), r)
        print(f"peak RSS {rss_mib():.0f} MiB, with the plain table held in memory besides")
        slow = [label for label, dt in r if dt > TARGET and not label.startswith(("full load", "open from", "first use"))]
        print(f"over {TARGET * 1000:.0f} ms:", ", ".join(slow) if slow else "none (besides the full load)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
