"""The timeline builder's state, and the moves every handler makes on it.

:class:`BuilderCore` holds what the builder keeps - per connection a
:class:`Conn` (its context tracker, requests in flight, streams by opaque and
by key, flow-control counters), the stream segments, the failover history -
and the few moves the handlers share: dissect a record (once), raise an
anomaly (merged with the stream's last one when it repeats), start a stream
segment, and move a segment through the transition table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..flows.reassembly import TS_UNKNOWN
from ..flows.records import Record
from ..flows.session import ConnState
from ..protocol import spec
from ..protocol.enums import Magic
from ..wire.dissect import dissect
from ..wire.dissection import Dissection
from .model import Anomaly, ConnectionInfo, FlowSample, Stream, StreamState
from .model import AnomalyKind as K
from .rollback import FailoverHistory
from .transitions import TRANSITIONS, Input, step

__all__ = [
    "ALT_REQUEST",
    "MAX_CONN_SNAPSHOT_KEYS",
    "MAX_FRAMES",
    "MAX_PENDING",
    "MAX_SHARED",
    "MAX_STREAM_REQUESTS",
    "OTHER",
    "BuilderCore",
    "Conn",
    "Header",
    "Seen",
    "elapsed",
    "merge_repeat",
    "name_of",
    "requested_frames",
]

MAX_FRAMES = 1000  # frame numbers kept per (merged) anomaly
MAX_PENDING = 4096  # opaques with requests awaiting an answer kept per connection (the oldest are forgotten)
MAX_SHARED = 64  # requests awaiting an answer kept per opaque (pipelined requests sharing one; the oldest are forgotten)
MAX_CONN_SNAPSHOT_KEYS = 1 << 20  # keys remembered for the dedup check, all streams of a connection together (beyond: not checked)
MAX_STREAM_REQUESTS = 1 << 17  # the same for STREAM_REQ / CLOSE_STREAM: one per vbucket (2^16) at once, and then some
ALT_REQUEST = int(Magic.ALT_CLIENT_REQUEST)  # the magic whose frames may carry a stream id
OTHER = {"c2s": "s2c", "s2c": "c2s"}  # the direction an answer travels
Header = tuple[Any, ...]  # a frame's header fields (spec.HEADER): magic, opcode, keylen, extlen, datatype, vb/status, body, opaque, cas


class Seen(NamedTuple):
    """The latest record of a direction where an item run took it in bulk (what the end-of-input checks read of it)."""

    number: int
    ts: int


@dataclass
class Conn:
    """What the builder keeps of one connection."""

    info: ConnectionInfo
    state: ConnState  # the connection context, from the one tracker
    # (dir, opaque) -> the requests awaiting an answer with that opaque, oldest first (pipelined requests may share
    # one): [(opcode, what its answer needs, frame)]
    pending: dict[tuple[str, int], list[tuple[int, Any, int]]] = field(default_factory=dict)
    # STREAM_REQ / CLOSE_STREAM in flight, apart (light, and as many as there are streams: a request per vbucket at once):
    # (dir, opaque) -> (opcode, frame, the stream it was for) - the answer finds its stream without a scan of them all
    stream_pending: dict[tuple[str, int], list[tuple[int, int, Stream | None]]] = field(default_factory=dict)
    by_opaque: dict[int, Stream] = field(default_factory=dict)
    by_key: dict[tuple[int, int | None], Stream] = field(default_factory=dict)
    # (vbucket, stream id) -> the closed segment a new request replaces: it still takes what the producer had queued
    # (and its STREAM_END(Closed)) until the new request is answered
    draining: dict[tuple[int, int | None], Stream] = field(default_factory=dict)
    # keys the dedup check may still remember (each stream's current snapshot holds its own, Snapshot.keys)
    key_room: int = field(default_factory=lambda: MAX_CONN_SNAPSHOT_KEYS)
    stream_ids: bool = False
    outstanding: int = 0
    stalled_at: int | None = None  # frame where outstanding reached the buffer
    stall_ts: int = 0
    last: dict[str, Record | Seen] = field(default_factory=dict)  # direction -> its latest record
    noops: dict[int, tuple[int, int]] = field(default_factory=dict)  # opaque -> (frame, ts)
    lost: bool = False
    # acks for bytes not yet seen sent: the capture reordered the directions (or missed data);
    # the excess is credited to the next bytes sent, and overruns become uncertain
    ack_credit: int = 0
    ack_ahead: bool = False
    # acks beyond the bytes received, not judged yet: [frame, ts, excess, acked, outstanding then]; stream messages
    # captured after the ack but sent before it (an earlier timestamp) explain the excess, a later one confirms it
    over_acks: list[list[int]] = field(default_factory=list)
    unknown: dict[int, Anomaly] = field(default_factory=dict)  # opcode -> its "unknown opcode" anomaly


class BuilderCore:
    """The builder's state and shared moves (see :class:`~dcpinspect.timeline.builder.TimelineBuilder`)."""

    def __init__(self, capture_sets: Mapping[str, int] | None = None) -> None:
        self._capture_sets = capture_sets or {}  # file -> its capture set (a file not in it: the set its records say)
        self._placed: dict[int, tuple[int, str]] = {}  # conn -> (capture set, file) fixed before its first record
        self._conns: dict[int, Conn] = {}
        self._streams: list[Stream] = []
        self._segments: dict[tuple[int, int, int | None], int] = {}
        self._history = FailoverHistory()
        self._flow: list[FlowSample] = []
        self._noops: list[dict[str, Any]] = []
        self._anomalies: list[Anomaly] = []
        self._stalls: list[dict[str, Any]] = []
        self._dissected: tuple[Record | None, Dissection | None] = (None, None)

    def _conn(self, rec: Record) -> Conn:
        """A connection's first record: its state, and its capture set (that of its first record's file)."""
        cs, file = self._placed.get(rec.conn) or (self._capture_sets.get(rec.file, rec.capture_set), rec.file)
        info = ConnectionInfo(rec.conn, rec.conn_label, capture_set=cs, file=file or rec.file)
        c = self._conns[rec.conn] = Conn(info, ConnState(rec.context))
        c.stream_ids = bool(rec.context.stream_ids)
        self._history.connection(rec.conn, cs)
        return c

    def _dissect(self, rec: Record) -> Dissection:
        """The record's frame dissected (once: the last one is kept)."""
        last, d = self._dissected
        if last is not rec or d is None:
            d = dissect(rec.event, rec.context)  # type: ignore[arg-type]
            self._dissected = (rec, d)
        return d

    def _anomaly(self, c: Conn, kind: K, frames: list[int], message: str, stream: Stream | None = None, *, uncertain: bool = False) -> None:
        uncertain = uncertain or c.lost
        if stream is not None and stream.anomalies and stream.anomalies[-1].kind == kind and stream.anomalies[-1].uncertain == uncertain:
            merge_repeat(stream.anomalies[-1], frames)  # the same thing again: one anomaly with every frame
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

    def _new_stream(self, c: Conn, vb: int, sid: int | None, state: StreamState, opaque: int | None = None) -> Stream:
        """A new segment of the stream (connection, vbucket, stream id)."""
        key = (c.info.conn, vb, sid)
        seg = self._segments[key] = self._segments.get(key, -1) + 1
        s = Stream(c.info.conn, vb, sid, seg, opaque=opaque, state=state)
        self._streams.append(s)
        self._history.add_stream(s)
        c.by_key[(vb, sid)] = s
        return s

    def _move(self, c: Conn, s: Stream, inp: Input, rec: Record, op: int) -> StreamState | None:
        """Move ``s`` by ``inp`` through the table: its next state (``None``: the input is dropped); an anomaly if not allowed."""
        nxt = TRANSITIONS.get((s.state, inp))
        if nxt is None:  # not allowed: step() says what becomes of it
            nxt, kind = step(s.state, inp)
            if kind is not None:
                self._violation(c, s, kind, inp, rec.number, op)
            if nxt is None:
                return None
        s.state = nxt
        return nxt

    def _over_acked(self, c: Conn, rec: Record, size: int) -> None:
        """A stream message of ``size`` bytes after acks beyond the bytes received: explains them, or confirms them."""
        waiting = c.over_acks
        while waiting:
            first = waiting[0]
            if TS_UNKNOWN not in (rec.ts, first[1]) and rec.ts > first[1]:
                # sent after the ack: the consumer had acknowledged bytes it had not received
                n, _ts, _excess, acked, outstanding = first
                msg = f"buffer ack of {acked} bytes with {outstanding} received and not yet acknowledged"
                self._anomaly(c, K.ACK_BEYOND_RECEIVED, [n], msg)
                del waiting[0]
                continue
            first[2] -= size  # sent before the ack (the capture put it after): these are the bytes acknowledged
            if first[2] <= 0:
                del waiting[0]
            return

    def _violation(self, c: Conn, s: Stream, kind: K, inp: Input, n: int, op: int) -> None:
        if kind is K.STREAM_ALREADY_OPEN:
            # a stream followed from mid-way (its request not captured) counts as opened where it was first seen
            first = [s.attempts[-1].frame] if s.attempts else s.anomalies[0].frames[:1] if s.anomalies else []
            self._anomaly(
                c,
                kind,
                [*first, n],
                f"stream request for vbucket {s.vbucket} while a stream is live on this connection"
                + ("" if s.attempts else " (followed from mid-way: its request was not captured)"),
                s,
                uncertain=not s.attempts and bool(s.anomalies) and s.anomalies[0].uncertain,
            )
        elif kind is K.AFTER_STREAM_END and s.end is not None:
            self._anomaly(c, kind, [s.end["frame"], n], f"{name_of(op)} after DCP_STREAM_END", s)
        elif kind is K.AFTER_CLOSE_STREAM and s.close_answered is not None:
            self._anomaly(c, kind, [s.close_answered, n], f"{name_of(op)} after the CLOSE_STREAM response", s)
        else:
            self._anomaly(c, K.UNEXPECTED_STREAM_INPUT, [n], f"{name_of(op)}: {inp} in stream state {s.state}", s)


def merge_repeat(a: Anomaly, frames: list[int]) -> None:
    """One more occurrence of ``a``: counted, its frames added (each once, at most MAX_FRAMES)."""
    a.count += 1
    if len(a.frames) < MAX_FRAMES:
        seen = set(a.frames)
        a.frames.extend(f for f in frames if f not in seen)


def requested_frames(s: Stream) -> list[int]:
    """The frame of the stream's last request (none: followed from mid-way)."""
    return [s.attempts[-1].frame] if s.attempts else []


def name_of(op: int) -> str:
    """The name of an opcode in the table (``opcode 0xNN`` for one it does not know)."""
    cmd = spec.COMMANDS.get(op)
    return cmd.name if cmd else f"opcode 0x{op:02x}"


def elapsed(start: int, end: int) -> int | None:
    """``end - start`` in ns, or None when either time is unknown (a packet timestamp out of range)."""
    return None if TS_UNKNOWN in (start, end) else end - start
