"""What stream requests, their answers and the producer's stream messages do to stream segments.

:class:`StreamHandlers` adds to :class:`~dcpinspect.timeline.core.BuilderCore`
the handlers of DCP_STREAM_REQ and DCP_CLOSE_STREAM (requests and answers)
and of every stream message.  A stream message is the hot path: its stream is
found by opaque or by (vbucket, stream id), flow control is charged by the
rule, the segment's state goes through the transition table only when it is
not one that simply takes data, and an item's seqno is read with the table's
own extras struct (``ITEM_LAYOUTS``) rather than by a full dissection.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping

from ..flows.records import Record
from ..protocol import spec
from ..protocol.enums import Magic, MarkerVersion, Opcode, OsoFlag, SnapshotFlag, Status, StreamEndStatus
from ..protocol.rules import DUPLICATES_ALLOWED, KEY_SPACES, MAX_SEQNO, STREAM_ID_MESSAGES, flow_control_size
from ..protocol.session import ITEMS, SEQNO_FIELD, STREAM_MESSAGES, SYNC_WRITES
from .core import (
    ALT_REQUEST,
    MAX_SHARED,
    MAX_STREAM_REQUESTS,
    OTHER,
    BuilderCore,
    Conn,
    Header,
    name_of,
    requested_frames,
)
from .model import Anomaly, Attempt, FlowSample, Item, Snapshot, Stream, StreamState
from .model import AnomalyKind as K
from .rollback import failover_log, rollback_loop
from .transitions import TRANSITIONS, Input

__all__ = ["ITEM_LAYOUTS", "STREAM", "TAKES_DATA", "StreamHandlers", "flow_charges"]

_STREAM_REQ, _STREAM_END, _SEQNO_ADVANCED = int(Opcode.DCP_STREAM_REQ), int(Opcode.DCP_STREAM_END), int(Opcode.DCP_SEQNO_ADVANCED)
_SUCCESS, _ROLLBACK = int(Status.SUCCESS), int(Status.ROLLBACK)
_END_OK = int(StreamEndStatus.OK)
_OSO_START, _OSO_END = int(OsoFlag.START), int(OsoFlag.END)
_HEADER_SIZE = spec.HEADER_SIZE
_MARKER_VERSIONS = {int(MarkerVersion.V2_0): "v2.0", int(MarkerVersion.V2_2): "v2.2"}
_END_ON_CLOSE = "send_stream_end_on_client_close_stream"
# enum members used per frame or per stream, bound once (an enum attribute lookup costs more than a global)
_DATA, _END, _CLOSE_END, _REQUEST_IN, _CLOSE_IN = Input.DATA, Input.END, Input.CLOSE_END, Input.REQUEST, Input.CLOSE
_CLOSE_DATA = Input.CLOSE_DATA
_SUCCEEDED, _ROLLED_BACK, _REFUSED, _CLOSE_ANSWERED = Input.SUCCESS, Input.ROLLBACK, Input.ERROR, Input.CLOSE_ANSWERED
_FOLLOWED, _REQUESTED, _CLOSING, _CLOSED = StreamState.FOLLOWED, StreamState.REQUESTED, StreamState.CLOSING, StreamState.CLOSED
#: the states of a segment whose last request is not (yet) a success: a closed segment it replaces still takes messages
_NOT_OPEN_YET = frozenset((StreamState.REQUESTED, StreamState.ROLLED_BACK, StreamState.REFUSED))
_HISTORY = int(SnapshotFlag.HISTORY)
#: the states in which a stream message other than STREAM_END changes nothing (the fast path: no table lookup)
TAKES_DATA = frozenset(s for (s, i), t in TRANSITIONS.items() if i is Input.DATA and t is s)


def flow_charges() -> dict[int, tuple[int, int]]:
    """Stream message opcode -> (a, b): the rule (:func:`~dcpinspect.protocol.rules.flow_control_size`) charges a*length + b.

    Tabulated once from the rule itself, so the hot loop needs no call per message;
    a test checks the table against the rule for every opcode and length.
    """
    request = int(Magic.CLIENT_REQUEST)  # the alt request magic is charged the same
    out = {}
    for op in STREAM_MESSAGES:
        b = flow_control_size(request, op, 0)
        out[op] = (flow_control_size(request, op, 1) - b, b)
    return out


_FLOW = flow_charges()


def _item_layouts() -> dict[int, tuple[struct.Struct, int, int | None]]:
    """Opcode << 8 | extras length -> (the table's extras struct, index of the seqno, key space) for the item messages.

    The key space is :data:`~dcpinspect.protocol.rules.KEY_SPACES`'s (``None``: not checked for duplicates).
    """
    out: dict[int, tuple[struct.Struct, int, int | None]] = {}
    for op, name in SEQNO_FIELD.items():
        for v in spec.COMMANDS[op].request:
            if v.extras_struct is None or name not in v.extras_names:
                continue
            entry = (v.extras_struct, v.extras_names.index(name), KEY_SPACES.get(op))
            key = op << 8 | v.extras_len
            if out.get(key, entry)[1] != entry[1]:  # two layouts of one length disagree: dissect those
                out[key] = (v.extras_struct, -1, None)
            else:
                out.setdefault(key, entry)
    return {k: v for k, v in out.items() if v[1] >= 0}


#: opcode << 8 | extras length -> (extras struct, index of the seqno, key space): the item fast path's layouts
ITEM_LAYOUTS = _item_layouts()


class StreamHandlers(BuilderCore):
    """The handlers of stream requests, closes, their answers, and stream messages."""

    def _stream_request(self, c: Conn, rec: Record, h: Header) -> None:
        """DCP_STREAM_REQ: an attempt of its stream (a new segment unless the last one awaits a retry)."""
        s = self._attempt(c, rec, h)
        self._pend_stream(c, rec, h, s)

    @staticmethod
    def _pend_stream(c: Conn, rec: Record, h: Header, s: Stream | None) -> None:
        """A STREAM_REQ or CLOSE_STREAM waits for its answer; pipelined requests may share an opaque: answered in order."""
        key = (rec.direction, h[7])
        queue = c.stream_pending.get(key)
        if queue is None:
            queue = c.stream_pending[key] = []
            if len(c.stream_pending) > MAX_STREAM_REQUESTS:
                del c.stream_pending[next(iter(c.stream_pending))]
        queue.append((h[1], rec.number, s))
        if len(queue) > MAX_SHARED:
            del queue[0]

    def _attempt(self, c: Conn, rec: Record, h: Header) -> Stream | None:
        d = self._dissect(rec)
        ext = d.extras
        if not isinstance(ext.get("start_seqno"), int):
            return None
        sid = rec.event.stream_id if h[0] == ALT_REQUEST else None  # type: ignore[union-attr]
        doc = d.document if isinstance(d.document, dict) else None
        if sid is None and doc is not None and isinstance(doc.get("sid"), int):
            sid = doc["sid"]
        vb, opaque = h[5], h[7]
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
            filtered=self._filtered(c, doc),
        )
        s = c.by_key.get((vb, sid))
        if s is None or self._move(c, s, _REQUEST_IN, rec, h[1]) is not _REQUESTED:
            if s is not None and s.state in (_CLOSING, _CLOSED):
                c.draining[(vb, sid)] = s  # the closed segment still takes what was queued, until the new one is answered
            s = self._new_stream(c, vb, sid, _REQUESTED)
        s.attempts.append(attempt)
        s.opaque = opaque
        return s

    @staticmethod
    def _filtered(c: Conn, doc: dict[str, object] | None) -> bool | None:
        """Whether a stream request asks for some collections only: a filter, or any request without HELLO Collections (a legacy stream: the default collection)."""
        features = c.state.context.collections
        if features is None:
            return None  # the connection's start was not captured
        return not features or (doc is not None and ("collections" in doc or "scope" in doc))

    def _close_stream(self, c: Conn, rec: Record, h: Header) -> None:
        """DCP_CLOSE_STREAM: noted on the open stream of its key (none: it closes nothing)."""
        sid = rec.event.stream_id if h[0] == ALT_REQUEST else None  # type: ignore[union-attr]
        s = c.by_key.get((h[5], sid))
        if s is not None and self._move(c, s, _CLOSE_IN, rec, h[1]) in (_CLOSING, _CLOSED):
            s.closed_frame = rec.number
        else:
            s = None
        self._pend_stream(c, rec, h, s)

    def _stream_message(
        self,
        c: Conn,
        rec: Record,
        h: Header,
        _alt: int = ALT_REQUEST,
        _flow: Mapping[int, tuple[int, int]] = _FLOW,
        _takes: frozenset[StreamState] = TAKES_DATA,
        _end: int = _STREAM_END,
        _sample: type[FlowSample] = FlowSample,
        _sid_messages: frozenset[int] = STREAM_ID_MESSAGES,
    ) -> None:
        """A producer stream message: found its stream (or followed one), charged, checked against the stream's state.

        (The keyword defaults bind the hot loop's constants as locals: this runs once per item.)
        """
        n = rec.number
        op = h[1]
        vb = h[5]
        opaque = h[7]
        info = c.info
        info.producer_dir = rec.direction
        if h[0] != _alt:
            sid = None
            if c.stream_ids and op in _sid_messages:  # DCP_SET_VBUCKET_STATE never carries one
                self._anomaly(c, K.STREAM_ID_MISSING, [n], f"{name_of(op)} without a stream id on a connection with stream ids enabled")
            s = c.by_opaque.get(opaque)
            if s is None or s.vbucket != vb:
                s = c.by_key.get((vb, None))
        else:
            sid = rec.event.stream_id  # type: ignore[union-attr]
            if sid is not None and not c.stream_ids and info.name:
                msg = f"{name_of(op)} carries stream id {sid} but enable_stream_id was not negotiated"
                self._anomaly(c, K.STREAM_ID_NOT_ENABLED, [n], msg)
            elif sid is None and c.stream_ids and op in _sid_messages:
                self._anomaly(c, K.STREAM_ID_MISSING, [n], f"{name_of(op)} without a stream id on a connection with stream ids enabled")
            s = c.by_opaque.get(opaque) if sid is None else None
            if s is None or s.vbucket != vb:
                s = c.by_key.get((vb, sid))
        if c.draining and s is not None and s.state in _NOT_OPEN_YET:
            # a new request replaces a closed segment: until it is answered, messages are what the old one had queued
            s = c.draining.get((vb, sid), s)
        buf = info.buffer_size
        if buf:  # flow control: the message's size charged against the buffer, by the rule
            a, b = _flow[op]
            size = a * len(rec.event[1]) + b  # type: ignore[index]
            if c.over_acks:
                self._over_acked(c, rec, size)
            if c.outstanding >= buf:
                msg = f"producer sent {size} bytes with {c.outstanding} outstanding >= buffer {buf}"
                self._anomaly(c, K.FLOW_CONTROL_OVERRUN, [n], msg, s, uncertain=c.ack_ahead)
            if c.ack_credit:
                used = min(c.ack_credit, size)
                c.ack_credit -= used
                c.outstanding += size - used
            else:
                c.outstanding += size
            self._flow.append(_sample(info.conn, n, rec.ts, c.outstanding, "sent", size))
            if c.outstanding >= buf and c.stalled_at is None:
                c.stalled_at = n
                c.stall_ts = rec.ts
        if s is None:
            s = self._followed(c, rec, op, vb, sid, opaque)
        if (s.state not in _takes or op == _end) and self._step_message(c, rec, op, s) is None:
            return
        STREAM[op](self, c, rec, h, s)

    def _step_message(self, c: Conn, rec: Record, op: int, s: Stream) -> StreamState | None:
        """A stream end, or data a stream's state does not simply take: through the table (``None``: dropped)."""
        closing = self._end_on_close(c)
        inp = (_CLOSE_END if closing else _END) if op == _STREAM_END else _CLOSE_DATA if closing else _DATA
        return self._move(c, s, inp, rec, op)

    def _followed(self, c: Conn, rec: Record, op: int, vb: int, sid: int | None, opaque: int) -> Stream:
        """Data for a stream whose request was not captured (or never sent): follow it anyway, say so once."""
        s = self._new_stream(c, vb, sid, _FOLLOWED, opaque)
        c.by_opaque[opaque] = s
        started_unseen = not c.state.captured_start
        a = Anomaly(
            K.NO_STREAM_REQUEST,
            [rec.number],
            f"{name_of(op)} for vbucket {vb} (opaque 0x{opaque:08x}) before any stream request"
            + (" (the connection's start was not captured)" if started_unseen else ""),
            c.info.conn,
            vb,
            sid,
            uncertain=c.lost or started_unseen,
        )
        self._anomalies.append(a)
        s.anomalies.append(a)
        return s

    @staticmethod
    def _end_on_close(c: Conn) -> bool:
        """Whether the producer ends a stream closed by the client with STREAM_END(Closed)."""
        value, status = c.info.controls.get(_END_ON_CLOSE, ("", ""))
        return value == "true" and status == "Success"

    def _end(self, c: Conn, rec: Record, h: Header, s: Stream) -> None:
        status = self._dissect(rec).extras.get("status")
        n = rec.number
        s.end = {"status": status, "name": spec.STREAM_END_STATUS.get(status, "unknown") if isinstance(status, int) else None, "frame": n}
        if s.snapshots and not s.snapshots[-1].complete and status == _END_OK:
            snap = s.snapshots[-1]
            msg = f"stream ended (OK) inside snapshot {snap.start}-{snap.end}"
            # a client without HELLO Collections is sent FilterEmpty and LostPrivileges as OK (kv_engine
            # engines/ep/src/dcp/producer.cc ``mapEndStreamStatus``): before its end seqno, that may be what this is
            legacy = not c.state.context.collections
            reached = s.end_seqno is not None and s.last_seqno is not None and s.last_seqno >= s.end_seqno
            if legacy and not reached:
                msg += " (or FilterEmpty / LostPrivileges, sent as OK to a client without collections)"
            self._anomaly(c, K.SNAPSHOT_NEVER_COMPLETED, [snap.frame, n], msg, s, uncertain=legacy and not reached)
        if c.by_opaque.get(h[7]) is s:
            del c.by_opaque[h[7]]
        key = (s.vbucket, s.stream_id)
        if c.draining.get(key) is s:
            del c.draining[key]
        if s.snapshots:
            self._forget_keys(c, s.snapshots[-1])

    def _oso(self, c: Conn, rec: Record, h: Header, s: Stream) -> None:
        flags = self._dissect(rec).extras.get("flags", 0)
        s.oso = bool(flags & _OSO_START) and not flags & _OSO_END
        s.oso_ended = bool(flags & _OSO_END)

    def _marker(self, c: Conn, rec: Record, h: Header, s: Stream) -> None:
        d = self._dissect(rec)
        v1 = "start_seqno" in d.extras
        src = d.extras if v1 else d.body
        start, end, flags = src.get("start_seqno"), src.get("end_seqno"), src.get("flags", 0)
        if not isinstance(start, int) or not isinstance(end, int):
            return
        n = rec.number
        prev = s.snapshots[-1] if s.snapshots else None
        # a change-stream backfill: a NoHistory disk snapshot, then the History one with the same end (kv_engine
        # engines/ep/src/dcp/active_stream.cc ``markDiskSnapshot``, NoHistoryPrecedingHistory): one snapshot in two
        history_pair = prev is not None and end == prev.end and bool(flags & _HISTORY) and not prev.flags & _HISTORY
        if prev is not None and not history_pair and not prev.complete and s.last_seqno is not None and s.last_seqno < prev.end:
            msg = f"new marker before snapshot {prev.start}-{prev.end} reached its end (last seqno {s.last_seqno})"
            self._anomaly(c, K.SNAPSHOT_NEVER_COMPLETED, [prev.frame, n], msg, s)
        if prev is not None and end < prev.end:
            msg = f"marker {start}-{end} ends before the previous one ({prev.start}-{prev.end})"
            self._anomaly(c, K.MARKER_GOES_BACKWARDS, [prev.frame, n], msg, s)
        elif prev is not None and s.last_seqno is not None and end <= s.last_seqno:
            msg = f"marker {start}-{end} ends at or below seqno {s.last_seqno} already delivered"
            self._anomaly(c, K.MARKER_OVERLAPS, [prev.frame, n], msg, s)
        version = "v1" if v1 else _MARKER_VERSIONS.get(d.extras.get("version", -1), "v2")
        snap = Snapshot(n, start, end, flags, version)
        b = d.body
        snap.max_visible = b.get("max_visible_seqno")
        snap.high_completed = b.get("high_completed_seqno")
        snap.purge_seqno = b.get("purge_seqno")
        snap.high_prepared = b.get("high_prepared_seqno")
        if isinstance(snap.purge_seqno, int):
            self._history.observe_purge(s.conn, s.vbucket, n, snap.purge_seqno)
        if prev is not None:
            self._forget_keys(c, prev)
        s.snapshots.append(snap)
        s.oso = s.oso_ended = False

    def _item(
        self,
        c: Conn,
        rec: Record,
        h: Header,
        s: Stream,
        _layouts: Mapping[int, tuple[struct.Struct, int, int | None]] = ITEM_LAYOUTS,
        _alt: int = ALT_REQUEST,
        _hsize: int = _HEADER_SIZE,
        _new: type[Item] = Item,
        _spaces: Mapping[int, int] = KEY_SPACES,
        _dups: int = DUPLICATES_ALLOWED,
    ) -> None:
        n, op = rec.number, h[1]
        layout = _layouts.get(op << 8 | h[3])
        seqno: int | None
        if layout is not None:  # the table's struct for this layout, read in place (the common case)
            seqno = layout[0].unpack_from(rec.event[1], _hsize + (h[2] >> 8 if h[0] == _alt else 0))[layout[1]]  # type: ignore[index]
            space = layout[2]
        else:
            value = self._dissect(rec).extras.get(SEQNO_FIELD.get(op, ""))
            seqno = value if isinstance(value, int) else None
            space = _spaces.get(op)
        snaps = s.snapshots
        idx = len(snaps) - 1
        s.items.append(_new(n, rec.ts, op, seqno, idx))
        if c.stream_ids and op in SYNC_WRITES:
            self._anomaly(c, K.SYNC_WRITE_WITH_STREAM_IDS, [n], f"{name_of(op)} on a connection with stream ids enabled", s)
        if seqno is None:
            return
        oso = s.oso
        if idx >= 0:
            snap = snaps[idx]
            if not snap.start <= seqno <= snap.end and op != _SEQNO_ADVANCED and not oso:
                msg = f"seqno {seqno} outside snapshot {snap.start}-{snap.end}"
                self._anomaly(c, K.SEQNO_OUTSIDE_SNAPSHOT, [snap.frame, n], msg, s)
            snap.items += 1
            if snap.first_seqno is None:
                snap.first_seqno = seqno
            snap.last_seqno = seqno
            snap.last_frame = n
            if seqno >= snap.end:
                snap.complete = True
            if space is not None and not oso and not snap.flags & _dups:  # the dedup check
                keys = snap.keys
                if keys is None:
                    keys = snap.keys = {}
                raw: bytes = rec.event[1]  # type: ignore[index]
                kl = h[2]
                if h[0] == _alt:
                    start = _hsize + (kl >> 8) + h[3]
                    key = raw[start : start + (kl & 0xFF)]
                else:
                    start = _hsize + h[3]
                    key = raw[start : start + kl]
                if space:
                    key = (space, key)  # type: ignore[assignment]  # prepares and aborts: a key space of their own
                if c.key_room:
                    first = keys.setdefault(key, n)
                    if first == n:
                        c.key_room -= 1
                    else:
                        self._duplicate(c, s, idx, key, first, n)
                elif key in keys:
                    self._duplicate(c, s, idx, key, keys[key], n)
        elif s.attempts and not oso and not (op == _SEQNO_ADVANCED and s.oso_ended):
            # mid-way streams may start anywhere; OSO items (and a SEQNO_ADVANCED after them) have no marker
            self._anomaly(c, K.ITEM_BEFORE_MARKER, [n], f"{name_of(op)} seqno {seqno} before any snapshot marker", s)
        last = s.last_seqno
        if last is None or seqno > last:
            s.last_seqno = seqno
        elif not oso and op != _SEQNO_ADVANCED:
            self._anomaly(c, K.SEQNO_NOT_INCREASING, [n], f"seqno {seqno} after {last}", s)
        end = s.end_seqno
        # the producer sends the whole snapshot that contains the end seqno (on a replica vbucket the end is raised to
        # its checkpoint snapshot's end): only a seqno past that snapshot is beyond the end
        if end is not None and seqno > end and op != _SEQNO_ADVANCED and (idx < 0 or snaps[idx].start > end or seqno > snaps[idx].end):
            msg = f"seqno {seqno} beyond the requested end {end}"
            if idx >= 0 and snaps[idx].start <= end:
                msg += f" and the snapshot {snaps[idx].start}-{snaps[idx].end} that contains it"
            self._anomaly(c, K.BEYOND_END_SEQNO, [*requested_frames(s), n], msg, s)

    def _duplicate(self, c: Conn, s: Stream, idx: int, key: bytes | tuple[int, bytes], first: int, n: int) -> None:
        """A key delivered twice in one snapshot whose marker allows no duplicates (kv_engine's snapshot-marker.md).

        The key is compared as it is on the wire: with its collection-id prefix
        when the connection negotiated collections; committed items and
        prepares are apart.
        """
        snap = s.snapshots[idx]
        text = _key_text(key if isinstance(key, bytes) else key[1], bool(c.state.context.collections))
        msg = f"key {text} delivered twice in snapshot {snap.start}-{snap.end} (flags 0x{snap.flags:02x}: no duplicates allowed)"
        self._anomaly(c, K.DUPLICATE_KEY, [first, n], msg, s)

    @staticmethod
    def _forget_keys(c: Conn, snap: Snapshot) -> None:
        """A snapshot is over (a new marker, its stream's end): its keys leave the dedup check."""
        if snap.keys is not None:
            c.key_room += len(snap.keys)
            snap.keys = None

    def _nothing_more(self, c: Conn, rec: Record, h: Header, s: Stream) -> None:
        """A stream message that changes nothing the timeline follows beyond its stream's state (set-vbucket-state, cache transfer)."""

    def _stream_answer(self, c: Conn, rec: Record, h: Header) -> None:
        """A STREAM_REQ or CLOSE_STREAM response: recorded on the stream its request was for (found without a scan)."""
        op, opaque = h[1], h[7]
        key = (OTHER[rec.direction], opaque)
        queue = c.stream_pending.get(key, [])
        req = next((r for r in queue if r[0] == op), None)  # the oldest of its kind: answers come in request order
        if req is not None:
            queue.remove(req)
            if not queue:
                del c.stream_pending[key]
        if req is None:
            self._anomaly(c, K.RESPONSE_WITHOUT_REQUEST, [rec.number], f"{name_of(op)} response (opaque 0x{opaque:08x}) matches no request")
            return
        _, req_frame, s = req
        if s is None or c.by_key.get((s.vbucket, s.stream_id)) is not s:
            return  # no stream (a request without a start seqno, a close of no live stream), or a newer segment took over
        if op == _STREAM_REQ:
            if s.attempts and s.attempts[-1].frame == req_frame:  # else a later request of the stream superseded it
                self._stream_outcome(c, rec, h, s)
        elif s.closed_frame == req_frame and self._move(c, s, _CLOSE_ANSWERED, rec, op) is not None:
            s.close_answered = rec.number

    def _stream_outcome(self, c: Conn, rec: Record, h: Header, s: Stream) -> None:
        """The answer to the stream's last attempt."""
        status = h[5]
        inp = _SUCCEEDED if status == _SUCCESS else _ROLLED_BACK if status == _ROLLBACK else _REFUSED
        if self._move(c, s, inp, rec, h[1]) is None:
            return
        a = s.attempts[-1]
        a.response_frame = rec.number
        a.status = status
        a.status_name = spec.STATUS.get(status, f"unknown 0x{status:04x}")
        if inp is _SUCCEEDED:
            c.draining.pop((s.vbucket, s.stream_id), None)  # the producer replaced the closed stream: nothing more of it
            a.outcome = "success"
            s.end_seqno = None if a.end == MAX_SEQNO else a.end
            a.failover_log = failover_log(self._dissect(rec).body.get("failover_log"))
            c.by_opaque[h[7]] = s
            if a.failover_log:
                self._history.observe_log(s.vbucket, rec.number, a.failover_log, s.conn)
        elif inp is _ROLLED_BACK:
            a.outcome = "rollback"
            rb = self._dissect(rec).body.get("rollback_seqno")
            a.rollback_seqno = rb if isinstance(rb, int) else None
            self._history.explain(s, a)
            loop = rollback_loop(s.attempts)
            if loop is not None:
                self._anomaly(c, K.ROLLBACK_LOOP, *loop, s)
        else:
            a.outcome = "error"
            a.explanation = f"refused: {a.status_name}"


def _key_text(key: bytes, collections: bool) -> str:
    """A key for a message: ``cid 0x8 'k1'`` when it carries a collection id (LEB128), else the key."""
    cid, shift = 0, 0
    if collections:
        for i, b in enumerate(key[:5]):
            cid |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return f"cid 0x{cid:x} {key[i + 1 :].decode('utf-8', 'backslashreplace')!r}"
    return repr(key.decode("utf-8", "backslashreplace"))


StreamHandler = Callable[[StreamHandlers, Conn, Record, Header, Stream], None]
#: stream message opcode -> what it does to its stream once the stream's state allowed it
STREAM: dict[int, StreamHandler] = {
    **dict.fromkeys(STREAM_MESSAGES, StreamHandlers._nothing_more),
    **dict.fromkeys(ITEMS, StreamHandlers._item),
    int(Opcode.DCP_SNAPSHOT_MARKER): StreamHandlers._marker,
    int(Opcode.DCP_STREAM_END): StreamHandlers._end,
    int(Opcode.DCP_OSO_SNAPSHOT): StreamHandlers._oso,
}
