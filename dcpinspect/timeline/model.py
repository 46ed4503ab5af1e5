"""What a timeline is made of: connections, streams, attempts, snapshots, items, branches, flow, anomalies.

Plain data (dataclasses and named tuples, picklable across Spark workers); the
:class:`~dcpinspect.timeline.builder.TimelineBuilder` fills them in, the tables
and views read them.  :meth:`Timeline.renumber` is the one place that knows
which fields hold frame numbers and connection ids.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from ..protocol.session import STREAM_END_NORMAL, STREAM_END_REREQUEST

HistoryKey = tuple[int, int, int]  # (capture set, vbucket, history)

__all__ = [
    "Anomaly",
    "AnomalyKind",
    "Attempt",
    "Branch",
    "ConnectionInfo",
    "FlowSample",
    "HistoryKey",
    "Item",
    "Snapshot",
    "Stream",
    "StreamState",
    "Timeline",
    "stream_label",
]


class AnomalyKind(StrEnum):
    """The kinds of :class:`Anomaly` (equal to their text: ``AnomalyKind.ROLLBACK_LOOP == "rollback loop"``)."""

    # requests and responses
    RESPONSE_WITHOUT_REQUEST = "response without request"
    REQUEST_NEVER_ANSWERED = "request never answered"
    NOOP_UNANSWERED = "noop unanswered"
    NOOP_ANSWERED_LATE = "noop answered late"
    UNKNOWN_OPCODE = "unknown opcode"
    # stream lifecycle
    NO_STREAM_REQUEST = "no stream request"
    STREAM_ALREADY_OPEN = "stream already open"
    AFTER_STREAM_END = "after stream end"
    AFTER_CLOSE_STREAM = "after close stream"
    UNEXPECTED_STREAM_INPUT = "unexpected stream input"
    STREAM_NEVER_ENDED = "stream never ended"
    STREAM_ID_NOT_ENABLED = "stream id not enabled"
    STREAM_ID_MISSING = "stream id missing"
    SYNC_WRITE_WITH_STREAM_IDS = "sync write with stream ids"
    ROLLBACK_LOOP = "rollback loop"
    # snapshots and seqnos
    SNAPSHOT_NEVER_COMPLETED = "snapshot never completed"
    MARKER_GOES_BACKWARDS = "marker goes backwards"
    MARKER_OVERLAPS = "marker overlaps"
    SEQNO_OUTSIDE_SNAPSHOT = "seqno outside snapshot"
    ITEM_BEFORE_MARKER = "item before marker"
    SEQNO_NOT_INCREASING = "seqno not increasing"
    BEYOND_END_SEQNO = "beyond end seqno"
    DUPLICATE_KEY = "key twice in snapshot"
    # flow control
    FLOW_CONTROL_OVERRUN = "flow-control overrun"
    FLOW_CONTROL_STALL = "flow-control stall"
    ACK_BEYOND_RECEIVED = "ack beyond bytes received"


class StreamState(StrEnum):
    """Where a stream segment is in its life (see :mod:`dcpinspect.timeline.transitions`)."""

    FOLLOWED = "followed"  # data seen without a captured request: open, followed from mid-way
    REQUESTED = "requested"  # its last STREAM_REQ awaits an answer
    OPEN = "open"  # its last STREAM_REQ succeeded
    ROLLED_BACK = "rolled back"  # its last STREAM_REQ was answered ROLLBACK: the consumer asks again on this segment
    REFUSED = "refused"  # its last STREAM_REQ failed otherwise
    CLOSING = "closing"  # the consumer sent CLOSE_STREAM while it was open
    CLOSED = "closed"  # that CLOSE_STREAM was answered
    ENDED = "ended"  # DCP_STREAM_END


@dataclass
class Anomaly:
    """Something the protocol does not allow (or that looks wrong), with the frames involved."""

    kind: str  # an AnomalyKind
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
    capture_set: int = 1  # the capture set of the file of its first record (histories never cross sets)
    file: str = ""  # the file of its first record ("" when the records carry none)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (the ``connection`` objects of ``dcpinspect timeline --json``)."""
        return {
            "conn": self.conn,
            "capture_set": self.capture_set,
            "file": self.file,
            "label": self.label,
            "name": self.name,
            "side": self.side,
            "open_flags": self.open_flags,
            "features": list(self.features),
            "controls": {k: {"value": v, "status": st} for k, (v, st) in self.controls.items()},
            "buffer_size": self.buffer_size,
            "noop_interval": self.noop_interval,
            "sasl_mechanism": self.sasl_mechanism,
            "sasl_user": self.sasl_user,
            "bucket": self.bucket,
            "bytes_lost": self.lost,
            "closed_frame": self.closed_frame,
        }


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
    predicted: int | None = None  # the rollback seqno the rule predicts from what was seen (None: cannot tell)
    # whether the stream streams only some collections (a filter, or a legacy stream: the default collection), so the
    # purge exemption of the rollback rule may apply (None: the connection's features were not captured)
    filtered: bool | None = None
    log_frame: int | None = None  # the frame of the later failover log its explanation names ("at frame N"), if it names one

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
    #: the keys delivered so far while this is a stream's current snapshot (the builder's dedup check; not kept)
    keys: dict[Any, int] | None = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without :attr:`keys` (a timeline part shipped between processes carries no working state)."""
        state = dict(self.__dict__)
        state.pop("keys", None)
        return state

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
    oso_ended: bool = False  # an OSO snapshot ended and no marker followed yet: SEQNO_ADVANCED may follow
    end_seqno: int | None = None  # the successful request's end seqno (None: open-ended or unknown)
    anomalies: list[Anomaly] = field(default_factory=list)
    state: StreamState = StreamState.FOLLOWED

    @property
    def active(self) -> bool:
        """Whether the stream is open (a successful attempt, or data without a captured request, and no end yet)."""
        return self.state in _ACTIVE

    @property
    def end_action(self) -> str | None:
        """What a consumer does after the stream's DCP_STREAM_END: ``"stop"``, ``"re-request"``, ``"unexpected"``, or ``None`` (no end).

        From the stream-end sets of :mod:`dcpinspect.protocol.session`; a
        status in neither set is one a producer never puts on the wire
        (Disconnected: the reason a stream ends when its connection goes) or
        one the table does not know.
        """
        if self.end is None:
            return None
        status = self.end.get("status")
        if status in STREAM_END_NORMAL:
            return "stop"
        return "re-request" if status in STREAM_END_REREQUEST else "unexpected"

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


_ACTIVE = frozenset((StreamState.FOLLOWED, StreamState.OPEN, StreamState.CLOSING, StreamState.CLOSED))


@dataclass
class Branch:
    """One failover-log entry as a branch of a vbucket's history."""

    uuid: int
    seqno: int
    first_frame: int  # the frame whose log first showed it
    order: int  # order of first sight: its index among the vbucket's branches (set by set, history by history)
    cut_frame: int | None = None  # the log that no longer had it
    cut_by: int | None = None  # the newer entry whose branch point removed it (None: capped, or unknown)
    capture_set: int = 1  # the capture set of the logs that showed it
    history: int = 1  # which history of (capture set, vbucket) it belongs to: 1.. in order of first sight
    conn: int | None = None  # the connection whose log first showed it


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
    # (capture set, vbucket, history) -> [(frame, log newest first)]: the logs of each history, in frame order
    history_logs: dict[HistoryKey, list[tuple[int, list[tuple[int, int]]]]] = field(default_factory=dict)
    # capture set -> its first frame number (the reader fills it after any renumbering; renumber leaves it alone)
    set_first: dict[int, int] = field(default_factory=dict)

    def histories(self) -> dict[HistoryKey, list[Branch]]:
        """The branches of each history, keyed ``(capture set, vbucket, history)``, each in order of first sight."""
        out: dict[HistoryKey, list[Branch]] = {}
        for vb, branches in sorted(self.branches.items()):
            for b in branches:
                out.setdefault((b.capture_set, vb, b.history), []).append(b)
        return dict(sorted(out.items()))

    def locate(self, frame: int) -> tuple[int, int]:
        """``(capture set, frame number within that set)`` of a frame number of the run (no sets known: ``(1, frame)``)."""
        if not self.set_first:
            return 1, frame
        starts = sorted((first, cs) for cs, first in self.set_first.items())
        i = bisect_right([first for first, _cs in starts], frame) - 1
        if i < 0:
            return 1, frame
        first, cs = starts[i]
        return cs, frame - first + 1

    def stream(self, vbucket: int, conn: int | None = None) -> list[Stream]:
        """The streams of one vbucket (on one connection)."""
        return [s for s in self.streams if s.vbucket == vbucket and (conn is None or s.conn == conn)]

    def renumber(
        self,
        frames: Callable[[int], int],
        conns: Mapping[int, int],
        items: Callable[[list[int]], list[int]] | None = None,
    ) -> None:
        """Map every frame number through ``frames`` and every connection id through ``conns``, in place.

        The items' frame numbers are mapped only with ``items`` (many numbers
        at once -> theirs); an anomaly listed both on its stream and in
        :attr:`anomalies` is mapped once.
        """

        def maybe(v: int | None) -> int | None:
            return None if v is None else frames(v)

        self.connections = {conns[k]: c for k, c in self.connections.items()}
        for c in self.connections.values():
            c.conn = conns[c.conn]
            c.closed_frame = maybe(c.closed_frame)
        done: set[int] = set()

        def anomaly(a: Anomaly) -> None:
            if id(a) in done:
                return
            done.add(id(a))
            a.frames = [frames(x) for x in a.frames]
            if a.conn is not None:
                a.conn = conns[a.conn]

        for s in self.streams:
            s.conn = conns[s.conn]
            for at in s.attempts:
                at.frame, at.response_frame = frames(at.frame), maybe(at.response_frame)
                if at.log_frame is not None:  # the explanation names it: the text follows
                    moved = frames(at.log_frame)
                    at.explanation = at.explanation.replace(f"at frame {at.log_frame}", f"at frame {moved}")
                    at.log_frame = moved
            for sn in s.snapshots:
                sn.frame, sn.last_frame = frames(sn.frame), maybe(sn.last_frame)
            if s.items and items is not None:
                old = s.items
                new = items([it[0] for it in old])
                make = type(old[0])._make
                s.items = [make((k, *it[1:])) for k, it in zip(new, old, strict=True)]
            if s.end is not None:
                s.end = {**s.end, "frame": frames(s.end["frame"])}
            s.closed_frame, s.close_answered = maybe(s.closed_frame), maybe(s.close_answered)
            for a in s.anomalies:
                anomaly(a)
        for a in self.anomalies:
            anomaly(a)
        for branches in self.branches.values():
            for b in branches:
                b.first_frame, b.cut_frame = frames(b.first_frame), maybe(b.cut_frame)
                if b.conn is not None:
                    b.conn = conns[b.conn]
        self.logs = {vb: [(frames(k), log) for k, log in logs] for vb, logs in self.logs.items()}
        self.history_logs = {h: [(frames(k), log) for k, log in logs] for h, logs in self.history_logs.items()}
        self.flow = [x._replace(conn=conns[x.conn], frame=frames(x.frame)) for x in self.flow]
        self.noops = [
            {**n, "conn": conns[n["conn"]], "frame": frames(n["frame"]), "reply_frame": frames(n["reply_frame"])} for n in self.noops
        ]
        self.stalls = [
            {**n, "conn": conns[n["conn"]], "frame": frames(n["frame"]), "ack_frame": frames(n["ack_frame"])} for n in self.stalls
        ]
        self.high_seqnos = {vb: (frames(k), q) for vb, (k, q) in self.high_seqnos.items()}


def stream_label(s: Stream) -> str:
    """``conn 1 vb 3 sid 2 #1`` (the segment only when it is not the first)."""
    out = f"conn {s.conn} vb {s.vbucket}"
    if s.stream_id is not None:
        out += f" sid {s.stream_id}"
    if s.segment:
        out += f" #{s.segment}"
    return out
