"""Mutated captures through records -> ``TimelineBuilder``: 0 exceptions and bounded time expected.

    python benchmarks/fuzz_timeline.py [--count 5000] [--seed 5] [--budget 2.0]

The inputs are the frames of the shipped captures (``captures/*.pcap``) and a
few hand-built DCP sessions (``dcpinspect.wire.encode``), mutated per input with a
few of: drop a frame (never sent), lose it (a capture gap: the sequence
numbers skip it), duplicate it, move it elsewhere (both directions: a response
before its request, data before the stream request, ...), flip bits (the
header lengths too: the decoder re-frames), and start the capture at a random
point (no SYN: the session's start unknown) or end it early.  Each input is
turned back into TCP segments and read through :func:`dcpinspect.flows.records.iter_records`
(the same reassembly, decoding and per-connection context as a capture file),
fed to a :class:`~dcpinspect.timeline.builder.TimelineBuilder`, and the timeline and its
tables are asked for.  Prints the counts, each distinct failure once (with its
traceback) and the slowest inputs; exits 1 on any exception or any input that
took longer than ``--budget`` seconds.  Not part of the test run
(``tests/test_timeline_fuzz.py`` runs a small seeded slice of it).
"""

from __future__ import annotations

import argparse
import random
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from dcpinspect import encode
from dcpinspect.capture.pcapwrite import ACK, FIN, PSH, SYN
from dcpinspect.capture.read import read_records
from dcpinspect.flows.reassembly import Segment
from dcpinspect.flows.records import Record, iter_records
from dcpinspect.timeline import MAX_SEQNO, Timeline, TimelineBuilder
from dcpinspect.wire.events import Frame

ROOT = Path(__file__).resolve().parent.parent
CAPTURES = ROOT / "captures"
T0 = 1_700_000_000_000_000_000

#: one frame of an input: (connection index, direction, bytes)
Piece = tuple[int, str, bytes]


@dataclass
class Session:
    """The frames of one capture (or hand-built sequence), in record order."""

    name: str
    pieces: list[Piece] = field(default_factory=list)


def capture_sessions(paths: Iterable[Path] | None = None) -> list[Session]:
    """The frames of the shipped captures (connections renumbered from 0)."""
    out = []
    for path in sorted(paths if paths is not None else CAPTURES.glob("*.pcap")):
        conns: dict[int, int] = {}
        pieces = [
            (conns.setdefault(r.conn, len(conns)), r.direction, r.event[1])
            for r in read_records([str(path)])
            if r.event.__class__ is Frame and r.event[2] == "mcbp"
        ]
        out.append(Session(path.name, pieces))
    return out


def _req(vb: int, opaque: int, **extras: int) -> bytes:
    ext = {"flags": 0, "reserved": 0, "start_seqno": 0, "end_seqno": MAX_SEQNO, "vb_uuid": 0, "snap_start_seqno": 0, "snap_end_seqno": 0}
    ext.update(extras)
    return encode("DCP_STREAM_REQ", extras=ext, vbucket=vb, opaque=opaque)


def _log(*entries: tuple[int, int]) -> dict[str, list[dict[str, int]]]:
    return {"failover_log": [{"vb_uuid": u, "vb_seqno": s} for u, s in entries]}


def built_sessions() -> list[Session]:
    """Hand-built DCP sessions that use every part of the builder (controls, rollbacks, OSO, closes, noops, acks)."""
    c, s = "c2s", "s2c"
    boot = [
        (0, c, encode("HELLO", key="fuzz", value=b"\x00\x12\x00\x13", opaque=0)),
        (0, s, encode("HELLO", response=True, value=b"\x00\x12\x00\x13", opaque=0)),
        (0, c, encode("DCP_OPEN", extras={"seqno": 0, "flags": 1}, key="fuzz:conn", opaque=1)),
        (0, s, encode("DCP_OPEN", response=True, opaque=1)),
        (0, c, encode("DCP_CONTROL", key="connection_buffer_size", value=b"400", opaque=2)),
        (0, s, encode("DCP_CONTROL", response=True, opaque=2)),
        (0, c, encode("DCP_CONTROL", key="set_noop_interval", value=b"1", opaque=3)),
        (0, s, encode("DCP_CONTROL", response=True, opaque=3)),
    ]
    rollback = [
        (0, c, _req(0, 0x10, start_seqno=9, vb_uuid=0xAA, snap_start_seqno=5, snap_end_seqno=9)),
        (0, s, encode("DCP_STREAM_REQ", response=True, status=0x23, opaque=0x10, value={"rollback_seqno": 4})),
        (0, c, encode("DCP_GET_FAILOVER_LOG", vbucket=0, opaque=0x11)),
        (0, s, encode("DCP_GET_FAILOVER_LOG", response=True, opaque=0x11, value=_log((0xBB, 5), (0xAA, 0)))),
        (0, c, _req(0, 0x12, start_seqno=4, vb_uuid=0xAA, snap_start_seqno=4, snap_end_seqno=4)),
        (0, s, encode("DCP_STREAM_REQ", response=True, opaque=0x12, value=_log((0xBB, 5), (0xAA, 0)))),
    ]
    data = [(0, s, encode("DCP_SNAPSHOT_MARKER", extras={"start_seqno": 5, "end_seqno": 8, "flags": 1}, opaque=0x12))]
    data += [
        (0, s, encode("DCP_MUTATION", extras={"by_seqno": q, "rev_seqno": 1}, key=f"k{q}", value=b"v", opaque=0x12)) for q in (5, 6, 7)
    ]
    data += [
        (0, s, encode("DCP_DELETION", extras={"by_seqno": 8, "rev_seqno": 1}, key="k8", opaque=0x12)),
        (0, c, encode("DCP_BUFFER_ACKNOWLEDGEMENT", extras={"buffer_bytes": 120})),
        (0, s, encode("DCP_NOOP", opaque=0x50)),
        (0, c, encode("DCP_NOOP", response=True, opaque=0x50)),
        (0, s, encode("DCP_OSO_SNAPSHOT", extras={"flags": 1}, opaque=0x12)),
        (0, s, encode("DCP_MUTATION", extras={"by_seqno": 12, "rev_seqno": 1}, key="a", value=b"v", opaque=0x12)),
        (0, s, encode("DCP_MUTATION", extras={"by_seqno": 10, "rev_seqno": 1}, key="b", value=b"v", opaque=0x12)),
        (0, s, encode("DCP_OSO_SNAPSHOT", extras={"flags": 2}, opaque=0x12)),
        (0, s, encode("DCP_SEQNO_ADVANCED", extras={"seqno": 14}, opaque=0x12)),
        (0, c, encode("DCP_CLOSE_STREAM", vbucket=0, opaque=0x13)),
        (0, s, encode("DCP_CLOSE_STREAM", response=True, opaque=0x13)),
        (0, s, encode("DCP_STREAM_END", extras={"status": 1}, opaque=0x12)),
        (0, c, _req(1, 0x20, end_seqno=3)),
        (0, s, encode("DCP_STREAM_REQ", response=True, opaque=0x20, value=_log((0xCC, 0)))),
        (0, s, encode("DCP_SNAPSHOT_MARKER", extras={"start_seqno": 1, "end_seqno": 3, "flags": 2}, vbucket=1, opaque=0x20)),
        (0, s, encode("DCP_MUTATION", extras={"by_seqno": 2, "rev_seqno": 1}, key="x", value=b"v", vbucket=1, opaque=0x20)),
        (0, s, encode("DCP_STREAM_END", extras={"status": 0}, vbucket=1, opaque=0x20)),
        (0, c, encode("GET_ALL_VB_SEQNOS", opaque=0x30)),
        (0, s, encode("GET_ALL_VB_SEQNOS", response=True, opaque=0x30, value=b"\x00\x00" + (7).to_bytes(8, "big"))),
    ]
    # a second connection with stream ids: two streams on one vbucket
    sids = [
        (1, c, encode("DCP_OPEN", extras={"seqno": 0, "flags": 1}, key="fuzz:sid", opaque=1)),
        (1, s, encode("DCP_OPEN", response=True, opaque=1)),
        (1, c, encode("DCP_CONTROL", key="enable_stream_id", value=b"true", opaque=2)),
        (1, s, encode("DCP_CONTROL", response=True, opaque=2)),
    ]
    for sid in (1, 2):
        sids += [
            (1, c, encode("DCP_STREAM_REQ", extras={"end_seqno": MAX_SEQNO}, value={"sid": sid}, vbucket=3, opaque=0x40 + sid)),
            (1, s, encode("DCP_STREAM_REQ", response=True, opaque=0x40 + sid, value=_log((0xDD, 0)))),
            (
                1,
                s,
                encode(
                    "DCP_SNAPSHOT_MARKER",
                    extras={"start_seqno": 1, "end_seqno": 2, "flags": 1},
                    vbucket=3,
                    opaque=0x40 + sid,
                    stream_id=sid,
                ),
            ),
            (
                1,
                s,
                encode(
                    "DCP_MUTATION", extras={"by_seqno": 1, "rev_seqno": 1}, key="s", value=b"v", vbucket=3, opaque=0x40 + sid, stream_id=sid
                ),
            ),
        ]
    return [Session("built: rollback, data, oso, close, ends", boot + rollback + data), Session("built: stream ids", sids)]


def mutate(pieces: list[Piece], rng: random.Random) -> tuple[list[Piece], set[int], dict[int, bool]]:
    """A mutated copy: (pieces, indexes whose bytes the capture lost, connection -> whether its start (SYN) was seen)."""
    out = list(pieces)
    if out and rng.random() < 0.3:  # a window of the session: starts (and maybe ends) anywhere
        a = rng.randrange(len(out))
        out = out[a : a + rng.randrange(1, len(out) + 1)]
    for _ in range(rng.randrange(1, 5)):
        if not out:
            break
        i = rng.randrange(len(out))
        what = rng.random()
        if what < 0.2:
            del out[i]
        elif what < 0.35:
            out.insert(rng.randrange(len(out) + 1), out[i])
        elif what < 0.6:
            out.insert(rng.randrange(len(out) + 1), out.pop(i))
        elif what < 0.7 and len(out) > 1:  # swap neighbours (a response overtaking its request, ...)
            j = min(i + 1, len(out) - 1)
            out[i], out[j] = out[j], out[i]
        else:
            conn, d, raw = out[i]
            b = bytearray(raw)
            for _ in range(rng.randrange(1, 4)):
                k = rng.randrange(len(b)) if rng.random() < 0.5 else rng.randrange(min(24, len(b)))  # the header half the time
                b[k] ^= 1 << rng.randrange(8)
            out[i] = (conn, d, bytes(b))
    lost = {rng.randrange(len(out))} if out and rng.random() < 0.15 else set()
    syn = {c: rng.random() < 0.75 for c in {p[0] for p in out}}
    return out, lost, syn


def segments(pieces: list[Piece], lost: set[int] = frozenset(), syn: dict[int, bool] | None = None) -> list[Segment]:  # type: ignore[assignment]
    """TCP segments carrying ``pieces`` (one frame each), with handshakes and closes; ``lost`` pieces leave a sequence gap."""
    seq: dict[tuple[int, str], int] = {}
    out: list[Segment] = []
    ts = T0
    ends = {}
    for conn, _d, _raw in pieces:
        if conn in ends:
            continue
        client, server = ("10.0.0.1", 40000 + conn), ("10.0.0.2", 11210)
        ends[conn] = (client, server)
        seq[(conn, "c2s")], seq[(conn, "s2c")] = 1000, 5000
        if syn is None or syn.get(conn, True):
            out.append(Segment(ts, *client, *server, 999, SYN))
            out.append(Segment(ts, *server, *client, 4999, SYN | ACK))
    for i, (conn, d, raw) in enumerate(pieces):
        client, server = ends[conn]
        src, dst = (client, server) if d == "c2s" else (server, client)
        ts += 1_000_000
        if i not in lost:
            out.append(Segment(ts, *src, *dst, seq[(conn, d)], PSH | ACK, raw, packet=i + 1))
        seq[(conn, d)] += len(raw)
    for conn, (client, server) in ends.items():
        out.append(Segment(ts + 1, *client, *server, seq[(conn, "c2s")], FIN | ACK))
        out.append(Segment(ts + 2, *server, *client, seq[(conn, "s2c")], FIN | ACK))
    return out


def records_of(pieces: list[Piece], lost: set[int] = frozenset(), syn: dict[int, bool] | None = None) -> list[Record]:  # type: ignore[assignment]
    """The records a capture of ``pieces`` would give."""
    return list(iter_records(segments(pieces, lost, syn)))


def run(records: list[Record], *, tables: bool = True) -> Timeline:
    """Everything that reads the builder: feed, the timeline mid-way and at the end, its tables and text."""
    b = TimelineBuilder()
    half = len(records) // 2
    for k, r in enumerate(records):
        b.feed(r)
        if k == half:
            b.timeline(final=False)
    t = b.timeline()
    if tables:
        from dcpinspect.tables.timeline import story, timeline_frames

        timeline_frames(t)
        story(t)
    return t


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--count", type=int, default=5_000)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--budget", type=float, default=2.0, help="seconds one input may take")
    p.add_argument("--no-tables", action="store_true", help="leave out timeline_frames/story (faster)")
    args = p.parse_args()
    rng = random.Random(args.seed)
    sessions = capture_sessions() + built_sessions()
    run(records_of(sessions[0].pieces))  # imports (pandas) out of the first input's time
    print(f"fuzz_timeline: {len(sessions)} sessions, {sum(len(s.pieces) for s in sessions):,} frames in all")
    kinds: dict[tuple[str, str, int], int] = {}
    frames = streams = anomalies = 0
    slow: list[tuple[float, str, int]] = []
    start = time.perf_counter()
    for n in range(args.count):
        s = rng.choice(sessions)
        pieces, lost, syn = mutate(s.pieces, rng)
        t0 = time.perf_counter()
        try:
            recs = records_of(pieces, lost, syn)
            t = run(recs, tables=not args.no_tables)
            frames += len(recs)
            streams += len(t.streams)
            anomalies += len(t.anomalies)
            took = time.perf_counter() - t0
            if took > args.budget:  # a shared machine stalls now and then: an input is slow only if it is slow twice
                t0 = time.perf_counter()
                run(records_of(pieces, lost, syn), tables=not args.no_tables)
                took = time.perf_counter() - t0
        except Exception as exc:
            took = time.perf_counter() - t0
            tb = traceback.extract_tb(exc.__traceback__)[-1]
            sig = (type(exc).__name__, Path(tb.filename).name, tb.lineno or 0)
            if sig not in kinds:
                print(f"input {n} ({s.name}):")
                traceback.print_exc()
            kinds[sig] = kinds.get(sig, 0) + 1
        slow.append((took, s.name, n))
        slow = sorted(slow, reverse=True)[:3]
    total = sum(kinds.values())
    over = [x for x in slow if x[0] > args.budget]
    print(
        f"fuzz_timeline: {args.count:,} mutated inputs in {time.perf_counter() - start:.1f} s, {frames:,} records, "
        f"{streams:,} streams, {anomalies:,} anomalies, {total} exceptions"
    )
    for sig, k in sorted(kinds.items()):
        print(f"  {k} x {sig[0]} at {sig[1]}:{sig[2]}")
    print("  slowest: " + ", ".join(f"{took * 1000:.0f} ms (input {n}, {name})" for took, name, n in slow))
    print(f"  over the {args.budget:g} s budget (twice): {len(over)}")
    return 1 if total or over else 0


if __name__ == "__main__":
    raise SystemExit(main())
