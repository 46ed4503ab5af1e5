"""Timeline building speed: records of the 1M-mutation capture through ``TimelineBuilder``.

    python benchmarks/bench_timeline.py [--frames 1000000] [--quick]
    python benchmarks/bench_timeline.py --streams 16384 65536 [--report]

Writes two captures and, for each, reads its records once (not timed), then
times feeding them all to a ``TimelineBuilder`` and asking for the timeline
(``--quick``: 200,000 frames), then the same timeline straight from the
capture with ``read_timeline`` (the frames table's parts, item runs in bulk;
reading and decoding included):

* the 1M-mutation capture of ``bench_capture.py`` (4 connections; no stream
  requests in it, so every stream is followed from mid-way);
* a DCP session: 4 connections, each opening, asking for a buffer and
  streaming 16 vbuckets (stream request, success with a failover log, a
  snapshot marker every 100 items, buffer acks, stream ends) - N frames in all.

With ``--streams N...`` it times instead one connection opening N streams
(vbuckets 0..N-1, N <= 65,536): all the stream requests, all their answers
(success with a failover log), a marker and a mutation per stream, then a
CLOSE_STREAM and its answer per stream - the cost must grow linearly with N;
with ``--report`` also the HTML report of that timeline (a bounded number of
streams is drawn).

Target: >= 500k frames/s on one core.  A benchmark, not a test: it prints
and exits 0.
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time
from pathlib import Path

from bench_capture import write_capture

from dcpinspect import encode
from dcpinspect.capture.pcapwrite import PcapWriter, TcpConversation
from dcpinspect.capture.read import read_records
from dcpinspect.timeline import MAX_SEQNO, TimelineBuilder

CONNS = 4
VBS = 16


def write_session(path: Path, frames: int) -> None:
    """Four DCP connections streaming 16 vbuckets each, about ``frames`` frames in all."""
    per_vb = frames // (CONNS * VBS)
    with PcapWriter(path) as w:
        ts = 1_700_000_000_000_000_000
        for c in range(CONNS):
            conv = TcpConversation(w, (f"10.0.{c}.1", 40000 + c), ("10.0.0.2", 11210), mss=1448)
            conv.open(ts)
            ts += 10_000
            c2s = [
                encode("DCP_OPEN", extras={"seqno": 0, "flags": 1}, key=f"bench:{c}", opaque=1),
                encode("DCP_CONTROL", key="connection_buffer_size", value=b"1048576", opaque=2),
            ]
            s2c = [encode("DCP_OPEN", response=True, opaque=1), encode("DCP_CONTROL", response=True, opaque=2)]
            for vb in range(VBS):
                extras = {
                    "flags": 0,
                    "reserved": 0,
                    "start_seqno": 0,
                    "end_seqno": MAX_SEQNO,
                    "vb_uuid": 0,
                    "snap_start_seqno": 0,
                    "snap_end_seqno": 0,
                }
                c2s.append(encode("DCP_STREAM_REQ", extras=extras, vbucket=vb, opaque=0x100 + vb))
                s2c.append(
                    encode(
                        "DCP_STREAM_REQ",
                        response=True,
                        opaque=0x100 + vb,
                        value={"failover_log": [{"vb_uuid": 0xABC0 + vb, "vb_seqno": 0}]},
                    )
                )
            ts = conv.send("c2s", b"".join(c2s), ts)
            ts = conv.send("s2c", b"".join(s2c), ts)
            out = bytearray()
            for seqno in range(1, per_vb + 1):
                for vb in range(VBS):
                    if seqno % 100 == 1:
                        end = min(seqno + 99, per_vb)
                        out += encode(
                            "DCP_SNAPSHOT_MARKER",
                            extras={"start_seqno": seqno, "end_seqno": end, "flags": 1},
                            vbucket=vb,
                            opaque=0x100 + vb,
                        )
                    out += encode(
                        "DCP_MUTATION",
                        extras={"by_seqno": seqno, "rev_seqno": 1},
                        key=f"doc-{vb}-{seqno}",
                        value=b'{"n":%d}' % seqno,
                        datatype=1,
                        vbucket=vb,
                        opaque=0x100 + vb,
                        cas=seqno,
                    )
                if seqno % 200 == 0:
                    ts = conv.send("s2c", bytes(out), ts)
                    ts = conv.send("c2s", encode("DCP_BUFFER_ACKNOWLEDGEMENT", extras={"buffer_bytes": len(out)}), ts)
                    out.clear()
            for vb in range(VBS):
                out += encode("DCP_STREAM_END", extras={"status": 0}, vbucket=vb, opaque=0x100 + vb)
            ts = conv.send("s2c", bytes(out), ts)
            conv.close(ts)


def write_streams(path: Path, n: int) -> None:
    """One connection opening ``n`` streams (vbuckets 0..n-1), one item each, then closing them all."""
    extras = {"flags": 0, "reserved": 0, "start_seqno": 0, "end_seqno": MAX_SEQNO, "vb_uuid": 0, "snap_start_seqno": 0, "snap_end_seqno": 0}
    with PcapWriter(path) as w:
        ts = 1_700_000_000_000_000_000
        conv = TcpConversation(w, ("10.0.0.1", 40000), ("10.0.0.2", 11210), mss=1448)
        conv.open(ts)
        ts = conv.send("c2s", encode("DCP_OPEN", extras={"seqno": 0, "flags": 1}, key="bench:streams", opaque=1), ts + 10_000)
        ts = conv.send("s2c", encode("DCP_OPEN", response=True, opaque=1), ts)
        ts = conv.send("c2s", b"".join(encode("DCP_STREAM_REQ", extras=extras, vbucket=vb, opaque=0x10000 + vb) for vb in range(n)), ts)
        log = [{"vb_uuid": 0xABC0, "vb_seqno": 0}]
        ts = conv.send(
            "s2c",
            b"".join(encode("DCP_STREAM_REQ", response=True, opaque=0x10000 + vb, value={"failover_log": log}) for vb in range(n)),
            ts,
        )
        data = bytearray()
        for vb in range(n):
            data += encode("DCP_SNAPSHOT_MARKER", extras={"start_seqno": 1, "end_seqno": 1, "flags": 1}, vbucket=vb, opaque=0x10000 + vb)
            data += encode(
                "DCP_MUTATION", extras={"by_seqno": 1, "rev_seqno": 1}, key=f"doc-{vb}", value=b"{}", vbucket=vb, opaque=0x10000 + vb
            )
        ts = conv.send("s2c", bytes(data), ts)
        ts = conv.send("c2s", b"".join(encode("DCP_CLOSE_STREAM", vbucket=vb, opaque=0x90000 + vb) for vb in range(n)), ts)
        ts = conv.send("s2c", b"".join(encode("DCP_CLOSE_STREAM", response=True, opaque=0x90000 + vb) for vb in range(n)), ts)
        conv.close(ts)


def measure_streams(work: Path, n: int, report: bool) -> None:
    cap = work / f"streams-{n}.pcap"
    write_streams(cap, n)
    records = list(read_records([str(cap)]))
    t = time.perf_counter()
    tl = TimelineBuilder().feed_all(records).timeline()
    took = time.perf_counter() - t
    print(f"{n:,} streams on one connection: {len(records):,} frames, {len(tl.streams):,} streams, {len(tl.anomalies)} anomalies")
    print(f"  timeline: {took:.2f} s, {len(records) / took:,.0f} frames/s")
    if report:
        import pandas as pd

        from dcpinspect.views.report import render_report

        frames = pd.DataFrame({"ts": pd.to_datetime([r.ts for r in records], unit="ns", utc=True), "type": "frame", "name": "DCP_MUTATION"})
        t = time.perf_counter()
        page = render_report(tl, frames, [], counts={"streams": len(tl.streams)})
        print(f"  report: {time.perf_counter() - t:.2f} s, {len(page):,} characters of HTML")


def measure(label: str, records: list) -> None:
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        b = TimelineBuilder()
        for r in records:
            b.feed(r)
        tl = b.timeline()
        best = min(best, time.perf_counter() - t)
    print(f"{label}: {len(records):,} frames, {len(tl.streams)} streams, {len(tl.anomalies)} anomalies")
    print(f"  best of 3: {best:.2f} s, {len(records) / best:,.0f} frames/s (target 500,000)")


def measure_parts(label: str, cap: Path, frames: int) -> None:
    """The same timeline from the capture's frames table, item runs in bulk (``read_timeline``): reading included."""
    from dcpinspect.tables.timeline_feed import read_timeline

    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        read_timeline([str(cap)])
        best = min(best, time.perf_counter() - t)
    print(f"  {label}, read_timeline (the capture read and decoded too): best of 3 {best:.2f} s, {frames / best:,.0f} frames/s")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--frames", type=int, default=1_000_000)
    p.add_argument("--quick", action="store_true", help="200,000 frames")
    p.add_argument("--streams", type=int, nargs="+", metavar="N", help="time one connection with N streams instead (N <= 65,536)")
    p.add_argument("--report", action="store_true", help="with --streams: time the HTML report too")
    args = p.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    with tempfile.TemporaryDirectory(prefix="dcpinspect-bench-") as work:
        gc.disable()  # the records stay alive: keep the collector from walking them
        if args.streams:
            for n in args.streams:
                measure_streams(Path(work), n, args.report)
            return 0
        if args.quick:
            args.frames = 200_000
        cap = Path(work) / "mutations.pcap"
        write_capture(cap, args.frames)
        records = list(read_records([str(cap)]))
        measure("mutations capture (no stream requests)", records)
        measure_parts("mutations capture", cap, len(records))
        del records
        cap = Path(work) / "session.pcap"
        write_session(cap, args.frames)
        records = list(read_records([str(cap)]))
        measure("DCP session capture (requests, markers, acks, ends)", records)
        measure_parts("DCP session capture", cap, len(records))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
