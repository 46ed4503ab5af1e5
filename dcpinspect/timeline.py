"""Per-stream timelines: the story of each DCP stream, built from records (pure, incremental).

Feed :class:`~dcpinspect.records.Record` objects one at a time (live) or in
bulk (a capture) to a :class:`TimelineBuilder`; the result is the same either
way.  It follows FACTS §7:

* connections (DCP_OPEN name and flags, HELLO features, controls and their
  replies, buffer size, noop interval, SASL mechanism and user - never the
  secret, bucket);
* streams, identified as the protocol does (§7.1): (connection, vbucket) or
  (connection, vbucket, stream id), joined to messages by the stream-request
  opaque; a new STREAM_REQ after a stream ended starts a new segment;
* per stream the attempts (every STREAM_REQ and its outcome: success with the
  failover log, rollback with the seqno, or an error), snapshots with the items
  inside them, the end;
* per vbucket a failover-log branch tree merged from every log seen, with each
  rollback explained by replaying the producer's rule (§7.4) on what was seen;
* flow control (bytes outstanding per §7.5, acks, stalls) and noops;
* anomalies, each tied to the frame numbers involved.

No I/O and no heavy imports; :mod:`dcpinspect.timeline_frames` turns a
:class:`Timeline` into DataFrames.
"""

from __future__ import annotations

import contextlib
import struct
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, NamedTuple

from . import spec
from .columns import SEQNO_FIELD
from .decoder import Frame
from .dissect import DissectContext, Dissection, dissect
from .flows import TS_UNKNOWN
from .records import Record

__all__ = [
    "Anomaly",
    "Attempt",
    "Branch",
    "ConnectionInfo",
    "Snapshot",
    "Stream",
    "Timeline",
    "TimelineBuilder",
    "build_timeline",
]

MAX_SEQNO = 2**64 - 1
MAX_FRAMES = 1000  # frame numbers kept per (merged) anomaly
MAX_PENDING = 4096  # requests awaiting an answer kept per connection (the oldest are forgotten)
MAX_STREAM_REQUESTS = 1 << 17  # the same for STREAM_REQ / CLOSE_STREAM: one per vbucket (2^16) at once, and then some
#: producer messages that belong to a stream (FACTS §7.1) and count against flow control (§7.5)
STREAM_MESSAGES = frozenset((0x55, 0x56, 0x57, 0x58, 0x59, 0x5B, 0x5F, 0x60, 0x62, 0x63, 0x64, 0x65, 0x66, 0x67))
#: the items of a snapshot (seqno-carrying data messages)
ITEMS = frozenset((0x57, 0x58, 0x59, 0x5F, 0x60, 0x62, 0x63, 0x64))
SYNC_WRITES = frozenset((0x60, 0x61, 0x62, 0x63))
#: requests that expect a response (the rest - producer stream messages, buffer acks, seqno acks - do not)
EXPECTS_RESPONSE = frozenset((0x1F, 0x20, 0x21, 0x22, 0x89, 0xFE, 0x48, 0x50, 0x52, 0x53, 0x54, 0x5C, 0x5E, 0x96, 0x10))


@dataclass
class Anomaly:
    """Something the protocol does not allow (or that looks wrong), with the frames involved."""

    kind: str
    frames: list[int]
    message: str
    conn: int | None = None
    vbucket: int | None = None
    stream_id: int | None = None
    uncertain: bool = False  # bytes were lost on this connection before it: it may be the capture's fault
    count: int = 1  # repeats merged into this one (consecutive, same kind, same stream)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"kind": self.kind, "frames": self.frames, "message": self.message, "uncertain": self.uncertain, "count": self.count}


@dataclass
class ConnectionInfo:
    """What one connection negotiated."""

    conn: int
    label: str = ""
    name: str = ""  # DCP_OPEN key
    side: str = ""  # "producer" (the server produces) or "consumer" (a consumer connection: the server consumes)
    open_flags: int | None = None
    features: list[str] = field(default_factory=list)
    controls: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (value, response status name)
    buffer_size: int | None = None
    noop_interval: float | None = None
    sasl_mechanism: str = ""
    sasl_user: str = ""
    bucket: str = ""
    producer_dir: str = "s2c"  # direction the producer's stream messages travel
    lost: int = 0  # bytes lost to capture gaps
    closed_frame: int | None = None


@dataclass
class Attempt:
    """One DCP_STREAM_REQ and its outcome."""

    frame: int
    ts: int
    opaque: int
    flags: int
    start: int
    end: int
    uuid: int
    snap_start: int
    snap_end: int
    value: Any = None  # the JSON value (collections filter, sid, purge_seqno)
    outcome: str | None = None  # "success" | "rollback" | "error" | None (no answer seen)
    status: int | None = None
    status_name: str | None = None
    rollback_seqno: int | None = None
    failover_log: list[tuple[int, int]] = field(default_factory=list)
    response_frame: int | None = None
    explanation: str = ""
    predicted: int | None = None  # the rollback seqno FACTS §7.4 predicts from what was seen (None: cannot tell)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (the ``attempts`` entries of ``dcpinspect timeline --json``)."""
        return {
            "frame": self.frame,
            "start": self.start,
            "end": self.end,
            "uuid": self.uuid,
            "snap_start": self.snap_start,
            "snap_end": self.snap_end,
            "flags": self.flags,
            "outcome": self.outcome,
            "status": self.status,
            "rollback_seqno": self.rollback_seqno,
            "failover_log": [[u, s] for u, s in self.failover_log],
            "explanation": self.explanation,
        }


@dataclass
class Snapshot:
    """One snapshot marker and the items that fell inside it."""

    frame: int
    start: int
    end: int
    flags: int
    version: str = "v1"
    max_visible: int | None = None
    high_completed: int | None = None
    purge_seqno: int | None = None
    high_prepared: int | None = None
    items: int = 0
    first_seqno: int | None = None
    last_seqno: int | None = None
    last_frame: int | None = None
    complete: bool = False

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "start": self.start,
            "end": self.end,
            "flags": self.flags,
            "items": self.items,
            "first_seqno": self.first_seqno,
            "last_seqno": self.last_seqno,
        }


class Item(NamedTuple):
    """One data message of a stream (its key and value are in the frames table, row ``frame``)."""

    frame: int
    ts: int
    opcode: int
    seqno: int | None
    snapshot: int  # index into Stream.snapshots (-1: before any marker)


@dataclass
class Stream:
    """One stream segment: (connection, vbucket[, stream id]) from its first request to its end."""

    conn: int
    vbucket: int
    stream_id: int | None
    segment: int
    attempts: list[Attempt] = field(default_factory=list)
    snapshots: list[Snapshot] = field(default_factory=list)
    items: list[Item] = field(default_factory=list)
    end: dict[str, Any] | None = None  # {"status", "name", "frame"}
    closed_frame: int | None = None  # the consumer's CLOSE_STREAM
    close_answered: int | None = None  # the producer's response to it
    opaque: int | None = None
    last_seqno: int | None = None
    oso: bool = False  # inside an OSO snapshot (seqnos may be out of order)
    oso_ended: bool = False  # an OSO snapshot ended and no marker followed yet: SEQNO_ADVANCED may follow (FACTS §6.20)
    end_seqno: int | None = None  # the successful request's end seqno (None: open-ended or unknown)
    anomalies: list[Anomaly] = field(default_factory=list)

    @property
    def active(self) -> bool:
        """Whether the stream is open (a successful attempt, or data without a captured request, and no end yet)."""
        return self.end is None and (not self.attempts or self.attempts[-1].outcome == "success")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (one object of ``dcpinspect timeline --json``)."""
        return {
            "conn": self.conn,
            "vbucket": self.vbucket,
            "stream_id": self.stream_id,
            "attempts": [a.as_dict() for a in self.attempts],
            "snapshots": [s.as_dict() for s in self.snapshots],
            "items": len(self.items),
            "end": self.end,
            "anomalies": [a.as_dict() for a in self.anomalies],
        }


@dataclass
class Branch:
    """One failover-log entry as a branch of a vbucket's history."""

    uuid: int
    seqno: int
    first_frame: int  # the frame whose log first showed it
    order: int  # order of first sight
    cut_frame: int | None = None  # the log that no longer had it
    cut_by: int | None = None  # the newer entry whose branch point removed it (None: capped, or unknown)


class FlowSample(NamedTuple):
    """Bytes outstanding on a connection after one frame."""

    conn: int
    frame: int
    ts: int
    outstanding: int
    event: str  # "sent" | "ack"
    size: int


@dataclass
class Timeline:
    """Everything the builder reconstructed."""

    connections: dict[int, ConnectionInfo]
    streams: list[Stream]
    branches: dict[int, list[Branch]]  # vbucket -> branches in order of first sight
    logs: dict[int, list[tuple[int, list[tuple[int, int]]]]]  # vbucket -> [(frame, log newest first)]
    flow: list[FlowSample]
    noops: list[dict[str, Any]]
    anomalies: list[Anomaly]
    stalls: list[dict[str, Any]]  # flow-control stalls that an ack ended: conn, frame, ack_frame, duration_ns
    high_seqnos: dict[int, tuple[int, int]]  # vbucket -> (frame, high seqno) last seen

    def stream(self, vbucket: int, conn: int | None = None) -> list[Stream]:
        """The streams of one vbucket (on one connection)."""
        return [s for s in self.streams if s.vbucket == vbucket and (conn is None or s.conn == conn)]


def stream_label(s: Stream) -> str:
    """``conn 1 vb 3 sid 2 #1`` (the segment only when it is not the first)."""
    out = f"conn {s.conn} vb {s.vbucket}"
    if s.stream_id is not None:
        out += f" sid {s.stream_id}"
    if s.segment:
        out += f" #{s.segment}"
    return out


@dataclass
class _Conn:
    info: ConnectionInfo
    pending: dict[tuple[str, int], tuple[int, Dissection | None, int]] = field(
        default_factory=dict
    )  # (dir, opaque) -> (opcode, req, frame)
    # STREAM_REQ / CLOSE_STREAM in flight, apart (light, and as many as there are streams: a request per vbucket at once):
    # (dir, opaque) -> (opcode, frame, the stream it was for) - the answer finds its stream without a scan of them all
    stream_pending: dict[tuple[str, int], tuple[int, int, Stream | None]] = field(default_factory=dict)
    by_opaque: dict[int, Stream] = field(default_factory=dict)
    by_key: dict[tuple[int, int | None], Stream] = field(default_factory=dict)
    stream_ids: bool = False
    outstanding: int = 0
    stalled_at: int | None = None  # frame where outstanding reached the buffer
    stall_ts: int = 0
    last: dict[str, Record] = field(default_factory=dict)  # direction -> its latest record
    noops: dict[int, tuple[int, int]] = field(default_factory=dict)  # opaque -> (frame, ts)
    lost: bool = False
    # acks for bytes not yet seen sent: the capture reordered the directions (or missed data);
    # the excess is credited to the next bytes sent, and overruns become uncertain
    ack_credit: int = 0
    ack_ahead: bool = False


class TimelineBuilder:
    """Feed records; ask for :meth:`timeline` at any time (live) or at the end (bulk)."""

    def __init__(self) -> None:
        self._conns: dict[int, _Conn] = {}
        self._streams: list[Stream] = []
        self._segments: dict[tuple[int, int, int | None], int] = {}
        self._branches: dict[int, list[Branch]] = {}
        self._logs: dict[int, list[tuple[int, list[tuple[int, int]]]]] = {}
        self._flow: list[FlowSample] = []
        # rollback attempts the rule does not explain yet (id() -> (stream, attempt)): a later log may (see timeline())
        self._unexplained: dict[int, tuple[Stream, Attempt]] = {}
        # vbucket -> [highest last seqno of its ended streams, its streams not ended yet]: the rollback replay's highest seqno
        # seen on a vbucket without a scan of every stream (an ended stream takes no more items: folded in once)
        self._vb_streams: dict[int, list[Any]] = {}
        self._known: dict[int, dict[int, Branch]] = {}  # vbucket -> uuid -> its branch
        self._uncut: dict[int, list[Branch]] = {}  # vbucket -> the branches no log has cut yet, in order of first sight
        self._logs_unordered: set[int] = set()  # vbuckets whose logs were not fed in frame order (no bisecting those)
        self._noops: list[dict[str, Any]] = []
        self._anomalies: list[Anomaly] = []
        self._high: dict[int, tuple[int, int]] = {}
        self._stalls: list[dict[str, Any]] = []
        self._purge: dict[int, tuple[int, int]] = {}  # vbucket -> (frame, purge seqno) from v2.2 markers
        self._seen_elsewhere: dict[int, int] = {}  # vbucket -> highest item seqno seen outside this builder
        self._finished = False

    # --- input -------------------------------------------------------------------
    def feed(self, rec: Record) -> None:
        """Take one record (in record order)."""
        c = self._conns.get(rec.conn)
        if c is None:
            c = self._conn(rec)
        c.last[rec.direction] = rec
        ev = rec.event
        if ev.__class__ is not Frame:
            if ev.type == "gap":
                c.lost = True
                c.info.lost += ev.length
            return
        raw = ev[1]
        if ev[2] != "mcbp":
            return
        h = _HEADER(raw, 0)
        magic, op = h[0], h[1]
        if magic in (0x82, 0x83):
            return
        opaque = h[7]
        if magic in spec.RESPONSE_MAGICS:
            self._response(c, rec, ev, h, op, opaque)
        elif op in STREAM_MESSAGES:  # the hot path: straight to the stream
            self._stream_message(c, rec, ev, h, op, opaque, ev.stream_id if magic == 0x08 else None)
        else:
            self._request(c, rec, ev, h, op, opaque)

    def observe_seqno(self, vbucket: int, seqno: int) -> None:
        """Note an item seqno of ``vbucket`` seen outside this builder (e.g. by another connection's builder).

        The rollback replay (FACTS §7.4) brackets the producer's unknown high
        seqno from the highest seqno seen on the vbucket; builders that each
        see part of a capture pass that on this way, in record order.
        """
        if seqno > self._seen_elsewhere.get(vbucket, -1):
            self._seen_elsewhere[vbucket] = seqno

    def feed_all(self, records: Iterable[Record]) -> TimelineBuilder:
        """Feed many records."""
        for r in records:
            self.feed(r)
        return self

    # --- connections -------------------------------------------------------------
    def _conn(self, rec: Record) -> _Conn:
        c = self._conns.get(rec.conn)
        if c is None:
            c = self._conns[rec.conn] = _Conn(ConnectionInfo(rec.conn, rec.conn_label))
        return c

    def _anomaly(
        self, c: _Conn, kind: str, frames: list[int], message: str, stream: Stream | None = None, *, uncertain: bool = False
    ) -> None:
        uncertain = uncertain or c.lost
        if stream is not None and stream.anomalies and stream.anomalies[-1].kind == kind and stream.anomalies[-1].uncertain == uncertain:
            last = stream.anomalies[-1]  # the same thing again: one anomaly with every frame (bounded, each frame once)
            last.count += 1
            if len(last.frames) < MAX_FRAMES:
                seen = set(last.frames)
                last.frames.extend(f for f in frames if f not in seen)
            return
        a = Anomaly(
            kind,
            frames,
            message,
            c.info.conn,
            stream.vbucket if stream else None,
            stream.stream_id if stream else None,
            uncertain=uncertain,
        )
        self._anomalies.append(a)
        if stream is not None:
            stream.anomalies.append(a)

    # --- requests ----------------------------------------------------------------
    def _request(self, c: _Conn, rec: Record, fr: Frame, h: tuple[Any, ...], op: int, opaque: int) -> None:
        n = rec.number
        sid = fr.stream_id if h[0] == 0x08 else None
        if op in STREAM_MESSAGES:
            self._stream_message(c, rec, fr, h, op, opaque, sid)
            return
        d: Dissection | None = None
        if op in (0x1F, 0x21, 0x20, 0x89, 0x50, 0x5E, 0x53, 0x54, 0x96, 0x5D, 0x48):
            d = dissect(fr, rec.context)
        s: Stream | None = None
        if op == 0x53 and d is not None:
            s = self._stream_req(c, rec, d, h, opaque, sid)
        elif op == 0x52:
            s = c.by_key.get((h[5], sid))
            if s is not None and s.active:
                s.closed_frame = n
            else:
                s = None
        if op in (0x53, 0x52):
            c.stream_pending[(rec.direction, opaque)] = (op, n, s)
            if len(c.stream_pending) > MAX_STREAM_REQUESTS:
                del c.stream_pending[next(iter(c.stream_pending))]
            return
        if op in EXPECTS_RESPONSE:
            c.pending[(rec.direction, opaque)] = (op, d, n)
            if len(c.pending) > MAX_PENDING:
                del c.pending[next(iter(c.pending))]
        if op == 0x5D and d is not None:
            acked = d.extras.get("buffer_bytes")
            if isinstance(acked, int):
                if acked > c.outstanding:  # acknowledges bytes not seen sent yet (directions reordered in the capture)
                    c.ack_credit += acked - c.outstanding
                    c.ack_ahead = True
                c.outstanding = max(0, c.outstanding - acked)
                self._flow.append(FlowSample(c.info.conn, n, rec.ts, c.outstanding, "ack", acked))
                if c.stalled_at is not None and c.info.buffer_size and c.outstanding < c.info.buffer_size:
                    self._stalls.append(
                        {"conn": c.info.conn, "frame": c.stalled_at, "ack_frame": n, "duration_ns": _elapsed(c.stall_ts, rec.ts)}
                    )
                    c.stalled_at = None
        elif op == 0x5C:
            c.noops[opaque] = (n, rec.ts)
        elif op == 0x21 and d is not None:
            c.info.sasl_mechanism = d.key_text
            user = next((f.value for f in d.fields if f.path == "value.user"), None)  # never the password
            if isinstance(user, str):
                c.info.sasl_user = user
        elif op in SYNC_WRITES and c.stream_ids:
            self._anomaly(
                c,
                "sync write with stream ids",
                [n],
                f"{spec.COMMANDS[op].name} on a connection with stream ids enabled (they are exclusive)",
            )

    def _stream_req(self, c: _Conn, rec: Record, d: Dissection, h: tuple[Any, ...], opaque: int, sid: int | None) -> Stream | None:
        """Record one STREAM_REQ as an attempt of its stream (a new segment when the last one ended or succeeded); the stream."""
        ext = d.extras
        if not isinstance(ext.get("start_seqno"), int):
            return None
        doc = d.document if isinstance(d.document, dict) else None
        if sid is None and doc is not None and isinstance(doc.get("sid"), int):
            sid = doc["sid"]
        vb = h[5]
        key = (vb, sid)
        attempt = Attempt(
            rec.number,
            rec.ts,
            opaque,
            ext.get("flags", 0),
            ext["start_seqno"],
            ext.get("end_seqno", MAX_SEQNO),
            ext.get("vb_uuid", 0),
            ext.get("snap_start_seqno", 0),
            ext.get("snap_end_seqno", 0),
            value=d.document,
        )
        s = c.by_key.get(key)
        if s is not None and s.active:
            # a stream followed from mid-way (its request not captured) counts as opened where it was first seen
            first = [s.attempts[-1].frame] if s.attempts else s.anomalies[0].frames[:1] if s.anomalies else []
            self._anomaly(
                c,
                "stream already open",
                [*first, rec.number],
                f"stream request for vbucket {vb} while a stream is live on this connection"
                + ("" if s.attempts else " (followed from mid-way: its request was not captured)"),
                s,
                uncertain=not s.attempts and bool(s.anomalies) and s.anomalies[0].uncertain,
            )
        if s is None or s.end is not None or not s.attempts or s.attempts[-1].outcome == "success":
            seg = self._segments.get((c.info.conn, vb, sid), -1) + 1
            self._segments[(c.info.conn, vb, sid)] = seg
            s = Stream(c.info.conn, vb, sid, seg)
            self._streams.append(s)
            self._vb_streams.setdefault(vb, [0, []])[1].append(s)
            c.by_key[key] = s
        s.attempts.append(attempt)
        s.opaque = opaque
        return s

    def _stream_message(self, c: _Conn, rec: Record, fr: Frame, h: tuple[Any, ...], op: int, opaque: int, sid: int | None) -> None:
        n = rec.number
        vb = h[5]
        c.info.producer_dir = rec.direction
        if sid is not None and not c.stream_ids and c.info.name:
            self._anomaly(c, "stream id not enabled", [n], f"{_name(op)} carries stream id {sid} but enable_stream_id was not negotiated")
        elif sid is None and c.stream_ids:
            self._anomaly(c, "stream id missing", [n], f"{_name(op)} without a stream id on a connection with stream ids enabled")
        s = c.by_opaque.get(opaque) if sid is None else None
        if s is None or s.vbucket != vb:
            s = c.by_key.get((vb, sid))
        # flow control (FACTS §7.5): the full packet, a prepare 2 bytes more
        size = len(fr[1]) + (2 if op == 0x60 else 0)
        buf = c.info.buffer_size
        if buf:
            if c.outstanding >= buf:
                self._anomaly(
                    c,
                    "flow-control overrun",
                    [n],
                    f"producer sent {size} bytes with {c.outstanding} outstanding >= buffer {buf}",
                    s,
                    uncertain=c.ack_ahead,
                )
            if c.ack_credit:
                used = min(c.ack_credit, size)
                c.ack_credit -= used
                c.outstanding += size - used
            else:
                c.outstanding += size
            self._flow.append(FlowSample(c.info.conn, n, rec.ts, c.outstanding, "sent", size))
            if c.outstanding >= buf and c.stalled_at is None:
                c.stalled_at = n
                c.stall_ts = rec.ts
        if s is None:  # its stream request was not captured (or never sent): follow it anyway, say so once
            seg = self._segments.get((c.info.conn, vb, sid), -1) + 1
            self._segments[(c.info.conn, vb, sid)] = seg
            s = Stream(c.info.conn, vb, sid, seg, opaque=opaque)
            self._streams.append(s)
            self._vb_streams.setdefault(vb, [0, []])[1].append(s)
            c.by_key[(vb, sid)] = s
            c.by_opaque[opaque] = s
            started_unseen = rec.context == DissectContext()  # the connection's start was not captured
            a = Anomaly(
                "no stream request",
                [n],
                f"{_name(op)} for vbucket {vb} (opaque 0x{opaque:08x}) before any stream request"
                + (" (the connection's start was not captured)" if started_unseen else ""),
                c.info.conn,
                vb,
                sid,
                uncertain=c.lost or started_unseen,
            )
            self._anomalies.append(a)
            s.anomalies.append(a)
        if s.end is not None:
            self._anomaly(c, "after stream end", [s.end["frame"], n], f"{_name(op)} after DCP_STREAM_END", s)
            return
        if s.close_answered is not None and not (op == 0x55 and self._end_on_close(c)):
            self._anomaly(c, "after close stream", [s.close_answered, n], f"{_name(op)} after the CLOSE_STREAM response", s)
        if op in ITEMS:
            self._item(c, rec, fr, h, op, s)
        elif op == 0x56:
            self._marker(c, rec, fr, s)
        elif op == 0x55:
            d = dissect(fr, rec.context)
            status = d.extras.get("status")
            s.end = {
                "status": status,
                "name": spec.STREAM_END_STATUS.get(status, "unknown") if isinstance(status, int) else None,
                "frame": n,
            }
            if s.snapshots and not s.snapshots[-1].complete and status == 0:
                snap = s.snapshots[-1]
                self._anomaly(
                    c, "snapshot never completed", [snap.frame, n], f"stream ended (OK) inside snapshot {snap.start}-{snap.end}", s
                )
            if c.by_opaque.get(opaque) is s:
                del c.by_opaque[opaque]
        elif op == 0x65:
            d = dissect(fr, rec.context)
            flags = d.extras.get("flags", 0)
            s.oso = bool(flags & 0x01) and not flags & 0x02
            s.oso_ended = bool(flags & 0x02)

    @staticmethod
    def _end_on_close(c: _Conn) -> bool:
        """Whether the producer ends a stream closed by the client with STREAM_END(Closed) (FACTS §6.3)."""
        value, status = c.info.controls.get("send_stream_end_on_client_close_stream", ("", ""))
        return value == "true" and status == "Success"

    def _marker(self, c: _Conn, rec: Record, fr: Frame, s: Stream) -> None:
        d = dissect(fr, rec.context)
        src = d.extras if "start_seqno" in d.extras else d.body
        start, end, flags = src.get("start_seqno"), src.get("end_seqno"), src.get("flags", 0)
        if not isinstance(start, int) or not isinstance(end, int):
            return
        prev = s.snapshots[-1] if s.snapshots else None
        if prev is not None and not prev.complete and s.last_seqno is not None and s.last_seqno < prev.end:
            self._anomaly(
                c,
                "snapshot never completed",
                [prev.frame, rec.number],
                f"new marker before snapshot {prev.start}-{prev.end} reached its end (last seqno {s.last_seqno})",
                s,
            )
        if prev is not None and end < prev.end:
            self._anomaly(
                c,
                "marker goes backwards",
                [prev.frame, rec.number],
                f"marker {start}-{end} ends before the previous one ({prev.start}-{prev.end})",
                s,
            )
        elif prev is not None and s.last_seqno is not None and end <= s.last_seqno:
            self._anomaly(
                c,
                "marker overlaps",
                [prev.frame, rec.number],
                f"marker {start}-{end} ends at or below seqno {s.last_seqno} already delivered",
                s,
            )
        version = "v1" if "start_seqno" in d.extras else {0: "v2.0", 2: "v2.2"}.get(d.extras.get("version", -1), "v2")
        snap = Snapshot(rec.number, start, end, flags, version)
        b = d.body
        snap.max_visible = b.get("max_visible_seqno")
        snap.high_completed = b.get("high_completed_seqno")
        snap.purge_seqno = b.get("purge_seqno")
        snap.high_prepared = b.get("high_prepared_seqno")
        if isinstance(snap.purge_seqno, int):
            self._purge[s.vbucket] = (rec.number, snap.purge_seqno)
        s.snapshots.append(snap)
        s.oso = s.oso_ended = False

    def _item(self, c: _Conn, rec: Record, fr: Frame, h: tuple[Any, ...], op: int, s: Stream) -> None:
        n = rec.number
        layout = _ITEM_LAYOUTS.get(op << 8 | h[3])
        seqno: int | None
        if layout is not None:  # the table's struct for this layout, read in place (the common case)
            seqno = layout[0].unpack_from(fr[1], 24 + (h[2] >> 8 if h[0] == 0x08 else 0))[layout[1]]
        else:
            value = dissect(fr, rec.context).extras.get(SEQNO_FIELD.get(op, ""))
            seqno = value if isinstance(value, int) else None
        snaps = s.snapshots
        idx = len(snaps) - 1
        s.items.append(Item(n, rec.ts, op, seqno, idx))
        if c.stream_ids and op in SYNC_WRITES:
            self._anomaly(c, "sync write with stream ids", [n], f"{_name(op)} on a connection with stream ids enabled", s)
        if seqno is None:
            return
        oso = s.oso
        if idx >= 0:
            snap = snaps[idx]
            if not snap.start <= seqno <= snap.end and op != 0x64 and not oso:
                self._anomaly(c, "seqno outside snapshot", [snap.frame, n], f"seqno {seqno} outside snapshot {snap.start}-{snap.end}", s)
            snap.items += 1
            if snap.first_seqno is None:
                snap.first_seqno = seqno
            snap.last_seqno = seqno
            snap.last_frame = n
            if seqno >= snap.end:
                snap.complete = True
        elif s.attempts and not oso and not (op == 0x64 and s.oso_ended):
            # mid-way streams may start anywhere; OSO items (and a SEQNO_ADVANCED after them) have no marker (FACTS §6.20)
            self._anomaly(c, "item before marker", [n], f"{_name(op)} seqno {seqno} before any snapshot marker", s)
        last = s.last_seqno
        if last is None or seqno > last:
            s.last_seqno = seqno
        elif not oso and op != 0x64:
            self._anomaly(c, "seqno not increasing", [n], f"seqno {seqno} after {last}", s)
        if s.end_seqno is not None and seqno > s.end_seqno and op != 0x64:
            self._anomaly(c, "beyond end seqno", [*_requested(s), n], f"seqno {seqno} beyond the requested end {s.end_seqno}", s)

    # --- responses -------------------------------------------------------------------
    def _response(self, c: _Conn, rec: Record, fr: Frame, h: tuple[Any, ...], op: int, opaque: int) -> None:
        n = rec.number
        other = "c2s" if rec.direction == "s2c" else "s2c"
        status = h[5]
        if op in (0x53, 0x52):
            self._stream_answer(c, rec, fr, op, opaque, status, c.stream_pending.pop((other, opaque), None))
            return
        req = c.pending.pop((other, opaque), None)
        if op == 0x5C:
            sent = c.noops.pop(opaque, None)
            if sent is not None:
                rtt = _elapsed(sent[1], rec.ts)
                self._noops.append({"conn": c.info.conn, "frame": sent[0], "reply_frame": n, "ts": sent[1], "rtt_ns": rtt})
                if c.info.noop_interval and rtt is not None and rtt > 2 * c.info.noop_interval * 1e9:
                    self._anomaly(
                        c,
                        "noop answered late",
                        [sent[0], n],
                        f"DCP_NOOP answered after {rtt / 1e9:.1f} s (> 2 x interval {c.info.noop_interval:g} s)",
                    )
        if req is None or req[0] != op:
            if op not in (0x56, 0x5B):  # acks of marker (Ack flag) and set-vbucket-state are not requests of ours
                self._anomaly(c, "response without request", [n], f"{_name(op)} response (opaque 0x{opaque:08x}) matches no request")
            return
        _, d, _req_frame = req
        ok = status == spec.SUCCESS
        if op in (0x54, 0x96) and ok and d is not None:
            resp = dissect(fr, rec.context)
            log = _log(resp.body.get("failover_log"))
            if log:
                self._observe_log(h_vb(d), n, log)
        elif op == 0x5E and d is not None:
            key = d.key_text
            value = str(d.document) if d.document is not None else ""
            c.info.controls[key] = (value, spec.STATUS.get(status, f"0x{status:04x}"))
            if ok:
                if key == "connection_buffer_size" and value.isdigit():
                    c.info.buffer_size = int(value)
                elif key == "set_noop_interval":
                    with contextlib.suppress(ValueError):
                        c.info.noop_interval = float(value)
                elif key == "enable_stream_id" and value == "true":
                    c.stream_ids = True
        elif op == 0x50 and ok and d is not None:
            c.info.name = d.key_text
            flags = d.extras.get("flags")
            if isinstance(flags, int):
                c.info.open_flags = flags
                c.info.side = "producer" if flags & spec.OPEN_PRODUCER else "consumer"
        elif op == 0x1F and ok:
            resp = dissect(fr, rec.context)
            c.info.features = [spec.FEATURES.get(f["feature"], hex(f["feature"])) for f in resp.body.get("features", ())]
        elif op == 0x89 and ok and d is not None:
            c.info.bucket = d.key_text
        elif op == 0x48 and ok:
            resp = dissect(fr, rec.context)
            for e in resp.body.get("vb_seqnos", ()):
                if isinstance(e, dict) and isinstance(e.get("vbucket"), int) and isinstance(e.get("high_seqno"), int):
                    self._high[e["vbucket"]] = (n, e["high_seqno"])

    def _stream_answer(
        self, c: _Conn, rec: Record, fr: Frame, op: int, opaque: int, status: int, req: tuple[int, int, Stream | None] | None
    ) -> None:
        """A STREAM_REQ or CLOSE_STREAM response: recorded on the stream its request was for (found without a scan)."""
        if req is None or req[0] != op:
            self._anomaly(c, "response without request", [rec.number], f"{_name(op)} response (opaque 0x{opaque:08x}) matches no request")
            return
        _, req_frame, s = req
        if s is None or c.by_key.get((s.vbucket, s.stream_id)) is not s:
            return  # no stream (a request without a start seqno, a close of no live stream), or a newer segment took over
        if op == 0x53:
            if s.attempts and s.attempts[-1].frame == req_frame:  # else a later request of the stream superseded it
                self._stream_resp(c, rec, fr, s, opaque, status)
        elif s.closed_frame == req_frame:
            s.close_answered = rec.number

    def _stream_resp(self, c: _Conn, rec: Record, fr: Frame, s: Stream, opaque: int, status: int) -> None:
        """The answer to the stream's last attempt."""
        a = s.attempts[-1]
        a.response_frame = rec.number
        a.status = status
        a.status_name = spec.STATUS.get(status, f"unknown 0x{status:04x}")
        resp = dissect(fr, rec.context)
        if status == spec.SUCCESS:
            a.outcome = "success"
            s.end_seqno = None if a.end == MAX_SEQNO else a.end
            a.failover_log = _log(resp.body.get("failover_log"))
            c.by_opaque[opaque] = s
            if a.failover_log:
                self._observe_log(s.vbucket, rec.number, a.failover_log)
        elif status == spec.ROLLBACK:
            a.outcome = "rollback"
            rb = resp.body.get("rollback_seqno")
            a.rollback_seqno = rb if isinstance(rb, int) else None
            self._explain(s, a)
            self._loops(c, s)
        else:
            a.outcome = "error"
            a.explanation = f"refused: {a.status_name}"

    # --- failover logs ---------------------------------------------------------------
    def _observe_log(self, vb: int, frame: int, log: list[tuple[int, int]]) -> None:
        logs = self._logs.setdefault(vb, [])
        if logs and frame < logs[-1][0]:
            self._logs_unordered.add(vb)
        logs.append((frame, log))
        branches = self._branches.setdefault(vb, [])
        known = self._known.setdefault(vb, {})
        uncut = self._uncut.setdefault(vb, [])
        for uuid, seqno in reversed(log):  # oldest first: order of first sight within one log
            if uuid not in known:
                b = Branch(uuid, seqno, frame, len(branches))
                branches.append(b)
                known[uuid] = b
                uncut.append(b)
        present = {u for u, _ in log}
        kept = []  # at most len(log): the work per log does not grow with the branches seen
        for b in uncut:
            if b.uuid in present:
                kept.append(b)
                continue
            b.cut_frame = frame
            # the newest entry whose branch point is below b's removed it (FACTS §7.3)
            cutter = next((u for u, s in log if s < b.seqno), None)
            b.cut_by = cutter
        self._uncut[vb] = kept

    # --- rollback explanation (FACTS §7.4) -----------------------------------------
    def _explain(self, s: Stream, a: Attempt) -> None:
        """Replay the producer's rule (FACTS §7.4) on what was seen, and say what it predicts.

        The failover log is the last one seen before the rollback; when that
        one does not give the observed seqno and a log was seen after it (the
        retry's success: the producer's log at that moment, e.g. after a
        failover), the rule is replayed on that one too.  Unknown inputs are
        bracketed rather than guessed: the high seqno H is tried at the
        highest seqno seen for the vbucket and at 2^64-1, the purge seqno P
        (when no v2.2 marker showed it) at 0 and just above the start seqno;
        a prediction is made only when the bracket agrees.
        """
        logs = self._logs.get(s.vbucket) or []
        at = a.response_frame or a.frame
        if s.vbucket in self._logs_unordered:
            before = [e for e in logs if e[0] < at][-1:]
            after = [e for e in logs if e[0] > at][:1]
        else:  # the logs in frame order (the rule): bisect, no scan of every log of the vbucket
            i, j = bisect_left(logs, at, key=_FIRST), bisect_right(logs, at, key=_FIRST)
            before, after = logs[max(0, i - 1) : i], logs[j : j + 1]
        candidates = [(before[-1][1], "")] if before else []
        if after:
            why = ": the producer's log had changed since the one seen before" if before else ""
            candidates.append((after[0][1], f" (using the failover log seen later, at frame {after[0][0]}{why})"))
        if not candidates:
            a.explanation = "cannot replay the rule: no failover log of this vbucket was seen"
            self._unexplained[id(a)] = (s, a)
            return
        results = [self._replay(s, a, table, source) for table, source in candidates]
        explanation, predicted, matched = next((r for r in results if r[2]), results[0])
        a.explanation, a.predicted = explanation, predicted
        if matched:
            self._unexplained.pop(id(a), None)
        else:
            self._unexplained[id(a)] = (s, a)

    def _replay(self, s: Stream, a: Attempt, table: list[tuple[int, int]], source: str) -> tuple[str, int | None, bool]:
        """(explanation, predicted rollback seqno, whether the rule gives the observed seqno) for one failover log."""
        from .producer import rollback_decision

        vb = s.vbucket
        high = self._high.get(vb)
        seen = max(self._seen(vb), self._seen_elsewhere.get(vb, 0))
        highs = [high[1]] if high else [max(seen, table[0][1]), MAX_SEQNO]
        purge = self._purge.get(vb)
        purges = [purge[1]] if purge else [0, a.start + 1]
        client_purge = a.value.get("purge_seqno", 0) if isinstance(a.value, dict) and isinstance(a.value.get("purge_seqno"), int) else 0
        tried = [
            (
                h,
                p,
                rollback_decision(
                    start=a.start,
                    snap_start=a.snap_start,
                    snap_end=a.snap_end,
                    vb_uuid=a.uuid,
                    flags=a.flags,
                    failover_log=table,
                    high_seqno=h,
                    purge_seqno=p,
                    client_purge_seqno=client_purge,
                ),
            )
            for h in highs
            for p in purges
        ]
        outcomes = {d for _h, _p, d in tried}
        observed = a.rollback_seqno
        matching = [(h, p, d) for h, p, d in tried if d.rollback and d.seqno == observed]
        if len(outcomes) == 1:
            (d,) = outcomes
            predicted = d.seqno if d.rollback else None
            if matching:
                return f"{d.reason}{source}", predicted, True
            what = f"predicts a rollback to {d.seqno}" if d.rollback else "predicts no rollback"
            return f"observed a rollback to {observed}, but the rule {what} from what was seen: {d.reason}{source}", predicted, False
        if matching and purge is None and all(p != 0 for _h, p, _d in matching):
            return (
                f"only a purge seqno above the start seqno {a.start} explains a rollback to {observed} "
                f"(FACTS §7.4 step 3; the purge seqno was not observed){source}",
                None,
                True,
            )
        if matching:
            _h, _p, d = matching[0]
            return f"consistent with the rule for some value of the high seqno (not observed): {d.reason}{source}", None, True
        got = sorted({d.seqno for d in outcomes if d.rollback})
        return f"observed a rollback to {observed}; the rule gives {got or 'no rollback'} for the unobserved inputs{source}", None, False

    def _seen(self, vb: int) -> int:
        """The highest item seqno seen on ``vb`` by this builder (0: none)."""
        entry = self._vb_streams.get(vb)
        if entry is None:
            return 0
        if any(x.end is not None for x in entry[1]):
            entry[0] = max([entry[0], *(x.last_seqno or 0 for x in entry[1] if x.end is not None)])
            entry[1] = [x for x in entry[1] if x.end is None]
        return max([entry[0], *(x.last_seqno or 0 for x in entry[1])])

    def _loops(self, c: _Conn, s: Stream) -> None:
        rolls: list[Attempt] = []  # the last three rollbacks (from the end: no scan of every attempt of a long loop)
        for a in reversed(s.attempts):
            if a.outcome == "rollback":
                rolls.append(a)
                if len(rolls) == 3:
                    break
        rolls.reverse()
        if len(rolls) >= 3 and all(a.rollback_seqno == 0 for a in rolls[-3:]):
            self._anomaly(c, "rollback loop", [a.frame for a in rolls[-3:]], "rolled back to 0 three times in a row", s)
        elif len(rolls) >= 3 and len({(a.start, a.uuid, a.snap_start, a.snap_end) for a in rolls[-3:]}) == 1:
            self._anomaly(c, "rollback loop", [a.frame for a in rolls[-3:]], "the same request rolled back three times", s)

    # --- output ----------------------------------------------------------------------
    def timeline(self, *, final: bool = True) -> Timeline:
        """The timeline so far; with ``final`` also the end-of-input anomalies (requests never answered...)."""
        anomalies = list(self._anomalies)
        for st, at in list(self._unexplained.values()):  # a log seen only after a rollback can still explain it
            if at.outcome == "rollback" and self._logs.get(st.vbucket):
                self._explain(st, at)
        if final:
            for c in self._conns.values():
                waiting = [(d, opaque, op, frame) for (d, opaque), (op, _req, frame) in c.pending.items()]
                waiting += [(d, opaque, op, frame) for (d, opaque), (op, frame, _s) in c.stream_pending.items()]
                for d, opaque, op, frame in sorted(waiting, key=itemgetter(3)):
                    peer = c.last.get("c2s" if d == "s2c" else "s2c")
                    if op == 0x5C or peer is None or peer.number < frame:
                        continue  # the peer sent nothing after it: still in flight when the capture ended
                    anomalies.append(
                        Anomaly(
                            "request never answered",
                            [frame],
                            f"{_name(op)} (opaque 0x{opaque:08x}) got no response",
                            c.info.conn,
                            uncertain=c.lost,
                        )
                    )
                for opaque, (frame, ts) in c.noops.items():
                    newest = max(v.ts for v in c.last.values())
                    if not c.info.noop_interval or newest - ts <= 2 * c.info.noop_interval * 1e9:
                        continue  # interval unknown, or the capture ended within 2 x the interval (FACTS §7.6)
                    anomalies.append(
                        Anomaly("noop unanswered", [frame], f"DCP_NOOP 0x{opaque:08x} was never answered", c.info.conn, uncertain=c.lost)
                    )
            for st in self._streams:
                if st.end is None and st.end_seqno is not None and st.last_seqno is not None and st.last_seqno >= st.end_seqno:
                    c = self._conns[st.conn]
                    later = c.last.get(c.info.producer_dir)
                    if st.items and (later is None or later.number <= st.items[-1].frame):
                        continue  # the producer sent nothing after the last item: its STREAM_END may be in flight
                    anomalies.append(
                        Anomaly(
                            "stream never ended",
                            _requested(st),
                            f"end seqno {st.end_seqno} reached but no DCP_STREAM_END",
                            st.conn,
                            st.vbucket,
                            st.stream_id,
                        )
                    )
            for c in self._conns.values():
                if c.stalled_at is not None:
                    anomalies.append(
                        Anomaly(
                            "flow-control stall",
                            [c.stalled_at],
                            "bytes outstanding reached the buffer size and no ack freed it",
                            c.info.conn,
                            uncertain=c.lost,
                        )
                    )
        return Timeline(
            {k: c.info for k, c in self._conns.items()},
            list(self._streams),
            self._branches,
            self._logs,
            self._flow,
            self._noops,
            anomalies,
            list(self._stalls),
            dict(self._high),
        )


def _item_layouts() -> dict[int, tuple[struct.Struct, int]]:
    """Opcode << 8 | extras length -> (the table's extras struct, index of the seqno) for the item messages."""
    out: dict[int, tuple[struct.Struct, int]] = {}
    for op, name in SEQNO_FIELD.items():
        for v in spec.COMMANDS[op].request:
            if v.extras_struct is None or name not in v.extras_names:
                continue
            entry = (v.extras_struct, v.extras_names.index(name))
            key = op << 8 | v.extras_len
            if out.get(key, entry)[1] != entry[1]:  # two layouts of one length disagree: dissect those
                out[key] = (v.extras_struct, -1)
            else:
                out.setdefault(key, entry)
    return {k: v for k, v in out.items() if v[1] >= 0}


_ITEM_LAYOUTS = _item_layouts()
_HEADER = spec.HEADER.unpack_from
_FIRST = itemgetter(0)


def _requested(s: Stream) -> list[int]:
    """The frame of the stream's last request (none: followed from mid-way)."""
    return [s.attempts[-1].frame] if s.attempts else []


def h_vb(d: Dissection) -> int:
    """The vbucket of a request."""
    return int(d.frame.header[5])


def _log(raw: Any) -> list[tuple[int, int]]:
    if not isinstance(raw, list):
        return []
    out = []
    for e in raw:
        if isinstance(e, dict) and isinstance(e.get("vb_uuid"), int) and isinstance(e.get("vb_seqno"), int):
            out.append((e["vb_uuid"], e["vb_seqno"]))
    return out


def _name(op: int) -> str:
    cmd = spec.COMMANDS.get(op)
    return cmd.name if cmd else f"opcode 0x{op:02x}"


def build_timeline(records: Iterable[Record]) -> Timeline:
    """The timeline of records (a capture, in bulk)."""
    return TimelineBuilder().feed_all(records).timeline()


def _elapsed(start: int, end: int) -> int | None:
    """``end - start`` in ns, or None when either time is unknown (a packet timestamp out of range)."""
    return None if TS_UNKNOWN in (start, end) else end - start
