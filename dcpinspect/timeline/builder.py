"""TimelineBuilder: records in, a :class:`~dcpinspect.timeline.model.Timeline` out (pure, incremental).

Each frame is looked up once in a dispatch table by its opcode - ``_REQUEST``
(stream messages included) or ``_RESPONSE``; every byte has an entry, the
protocol table's opcodes their own, and a request with any other opcode is an
anomaly.  The
handlers of the connection (session commands, noops, buffer acks, failover-log
and seqno requests) are here; those of streams are in
:mod:`~dcpinspect.timeline.streams`, and the state they share in
:mod:`~dcpinspect.timeline.core`.  The connection context comes from the one
tracker, :class:`~dcpinspect.flows.session.ConnState`, fed the session
commands as they pass.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from operator import itemgetter
from typing import Any

from ..flows.records import Record
from ..protocol import spec
from ..protocol.enums import Magic, Opcode, OpenFlag, Status
from ..protocol.exchanges import Exchange, answered_once, exchange, last_response
from ..protocol.session import RESPONSE_MAGICS as _RESPONSES
from ..protocol.session import STREAM_MESSAGES
from ..wire.events import Frame
from .core import MAX_PENDING, MAX_SHARED, OTHER, Conn, Header, elapsed, merge_repeat, name_of, requested_frames
from .model import Anomaly, FlowSample, Item, Stream, Timeline
from .model import AnomalyKind as K
from .rollback import failover_log
from .runs import RunHandlers

__all__ = ["TimelineBuilder", "build_timeline"]

_ALT_RESPONSE = int(Magic.ALT_CLIENT_RESPONSE)
_SERVER = frozenset((int(Magic.SERVER_REQUEST), int(Magic.SERVER_RESPONSE)))  # server pushes: not DCP, not followed
_NOOP, _SUCCESS = int(Opcode.DCP_NOOP), int(Status.SUCCESS)
_BUFFER_KEY, _NOOP_KEY = "connection_buffer_size", "set_noop_interval"
_HEADER = spec.HEADER.unpack_from
_FRAME = itemgetter(1)  # a FlowSample's frame

Handler = Callable[["TimelineBuilder", Conn, Record, Header], None]


class TimelineBuilder(RunHandlers):
    """Feed records; ask for :meth:`timeline` at any time (live) or at the end (bulk).

    ``capture_sets`` maps a file to its capture set (1-based): a connection
    belongs to the set of its first record's file (a file not in it: set 1),
    and failover histories never cross sets (:mod:`~dcpinspect.timeline.rollback`).
    With ``max_items`` the builder keeps at most about ``2 * max_items``
    evenly spaced items per stream (and flow samples), and the true count of
    each (:meth:`items_seen`); every item and flow sample passes through the
    sinks ``on_items(stream_index, items)`` / ``on_flow(samples)`` first.  Both
    happen at :meth:`flush` (and at :meth:`timeline`).
    """

    def __init__(
        self,
        capture_sets: Mapping[str, int] | None = None,
        *,
        max_items: int | None = None,
        on_items: Callable[[int, list[Item]], None] | None = None,
        on_flow: Callable[[list[FlowSample]], None] | None = None,
    ) -> None:
        super().__init__(capture_sets)
        self.max_items = max_items
        self._on_items, self._on_flow = on_items, on_flow
        self._kept: dict[int, list[Any]] = {}  # stream index -> [items kept, items seen, stride, last item] (flush)
        self._flow_kept = [0, 0, 1]  # flow samples kept, seen, stride

    # --- public hooks ------------------------------------------------------------
    @property
    def streams(self) -> list[Stream]:
        """The stream segments so far, in order of creation (the builder's own list: read, do not change)."""
        return self._streams

    @property
    def anomaly_count(self) -> int:
        """How many anomalies were raised while feeding (the end-of-input ones come with :meth:`timeline`)."""
        return len(self._anomalies)

    def items_seen(self, index: int) -> int:
        """The true number of items of stream ``index`` (its ``items`` may be thinned with ``max_items``)."""
        kept = self._kept.get(index)
        return len(self._streams[index].items) if kept is None else kept[1]

    def observe_seqno(self, vbucket: int, seqno: int, conn: int | None = None, capture_set: int | None = None) -> None:
        """Note an item seqno of ``vbucket`` seen outside this builder (e.g. by another connection's builder: ``conn``).

        The rollback replay brackets the producer's unknown high seqno from the
        highest seqno seen on the vbucket's history; builders that each see part of a
        capture pass that on this way, in record order.  The seqno counts in
        the capture set of ``conn`` (as placed, or ``capture_set``; set 1 when
        neither is known), and for the histories ``conn``'s logs are in.
        """
        if conn is not None and capture_set is None and conn in self._placed:
            capture_set = self._placed[conn][0]
        self._history.observe_seqno(vbucket, seqno, conn, capture_set)

    def place(self, conn: int, capture_set: int, file: str = "") -> None:
        """Put connection ``conn`` in ``capture_set`` (its file ``file``) whatever its first record's file (before that record)."""
        self._placed[conn] = (capture_set, file)
        self._history.connection(conn, capture_set)

    # --- input -------------------------------------------------------------------
    def feed(
        self,
        rec: Record,
        _frame: type[Frame] = Frame,
        _header: Callable[[bytes, int], Header] = _HEADER,
        _responses: frozenset[int] = _RESPONSES,
        _server: frozenset[int] = _SERVER,
    ) -> None:
        """Take one record (in record order).

        (The keyword defaults bind the hot loop's constants as locals: this runs once per frame.)
        """
        c = self._conns.get(rec.conn)
        if c is None:
            c = self._conn(rec)
        c.last[rec.direction] = rec
        ev = rec.event
        if ev.__class__ is not _frame:
            if ev.type == "gap":
                c.lost = True
                c.info.lost += ev.length
            return
        if ev[2] != "mcbp":
            return
        h = _header(ev[1], 0)
        magic = h[0]
        if magic in _responses:
            _RESPONSE[h[1]](self, c, rec, h)
        elif magic not in _server:
            _REQUEST[h[1]](self, c, rec, h)

    def feed_all(self, records: Iterable[Record]) -> TimelineBuilder:
        """Feed many records."""
        for r in records:
            self.feed(r)
        return self

    # --- requests of the connection -----------------------------------------------
    def _expect(self, c: Conn, rec: Record, h: Header, data: Any = None) -> None:
        """A request that is (or may be) answered: remember it until its (last) response.

        Requests sharing an opaque (pipelined) wait in order; a response answers
        the oldest of them with its opcode.
        """
        key = (rec.direction, h[7])
        entry = (h[1], data, rec.number)
        waiting = c.pending.get(key)
        if waiting is None:
            c.pending[key] = [entry]
            if len(c.pending) > MAX_PENDING:
                del c.pending[next(iter(c.pending))]
            return
        waiting.append(entry)
        if len(waiting) > MAX_SHARED:
            del waiting[0]

    def _ignore(self, c: Conn, rec: Record, h: Header) -> None:
        """A request that is not answered and changes nothing the timeline follows."""

    def _unknown(self, c: Conn, rec: Record, h: Header) -> None:
        """An opcode the table does not know: one anomaly per connection and opcode, with every frame."""
        op = h[1]
        a = c.unknown.get(op)
        if a is not None:
            merge_repeat(a, [rec.number])
            return
        self._anomaly(c, K.UNKNOWN_OPCODE, [rec.number], f"opcode 0x{op:02x} is not in the protocol table", uncertain=c.lost)
        c.unknown[op] = self._anomalies[-1]

    def _session(self, c: Conn, rec: Record, h: Header) -> None:
        """HELLO, DCP_OPEN, SELECT_BUCKET, SASL_AUTH, DCP_CONTROL (either way): the connection context follows them."""
        c.state.observe(rec.direction, rec.event, partial(self._dissect, rec))  # type: ignore[arg-type]
        st, info = c.state, c.info
        info.sasl_mechanism, info.bucket = st.sasl_mechanism, st.bucket
        info.features = [spec.FEATURES.get(f, hex(f)) for f in st.features]
        if st.open_flags is not None:
            info.name, info.open_flags = st.open_name, st.open_flags
            info.side = "producer" if st.open_flags & OpenFlag.PRODUCER else "consumer"
        buffer, noop = st.controls.get(_BUFFER_KEY), st.controls.get(_NOOP_KEY)
        if buffer is not None and buffer.isdigit():
            info.buffer_size = int(buffer)
        if noop is not None:
            with contextlib.suppress(ValueError):
                info.noop_interval = float(noop)
        c.stream_ids = bool(st.context.stream_ids)

    def _session_request(self, c: Conn, rec: Record, h: Header) -> None:
        self._session(c, rec, h)
        self._expect(c, rec, h)

    def _sasl_auth(self, c: Conn, rec: Record, h: Header) -> None:
        self._session_request(c, rec, h)
        user = next((f.value for f in self._dissect(rec).fields if f.path == "value.user"), None)  # never the password
        if isinstance(user, str):
            c.info.sasl_user = user

    def _control(self, c: Conn, rec: Record, h: Header) -> None:
        d = self._dissect(rec)
        self._session(c, rec, h)
        self._expect(c, rec, h, (d.key_text, str(d.document) if d.document is not None else ""))

    def _failover_request(self, c: Conn, rec: Record, h: Header) -> None:
        self._expect(c, rec, h, h[5])  # the answer's log is of the request's vbucket

    def _noop(self, c: Conn, rec: Record, h: Header) -> None:
        self._expect(c, rec, h)
        c.noops[h[7]] = (rec.number, rec.ts)

    def _buffer_ack(self, c: Conn, rec: Record, h: Header) -> None:
        acked = self._dissect(rec).extras.get("buffer_bytes")
        if not isinstance(acked, int):
            return
        n = rec.number
        if acked > c.outstanding:
            # more than the stream messages received (by the flow-control rule) less what was acked before: a consumer
            # bug (kv_engine's BufferLog::release warns of it), unless the capture put the directions out of order -
            # judged by the stream messages that follow (see _over_acked); the excess is credited to the next bytes sent
            if c.info.buffer_size:
                c.over_acks.append([n, rec.ts, acked - c.outstanding, acked, c.outstanding])
            c.ack_credit += acked - c.outstanding
            c.ack_ahead = True
        c.outstanding = max(0, c.outstanding - acked)
        self._flow.append(FlowSample(c.info.conn, n, rec.ts, c.outstanding, "ack", acked))
        if c.stalled_at is not None and c.info.buffer_size and c.outstanding < c.info.buffer_size:
            self._stalls.append({"conn": c.info.conn, "frame": c.stalled_at, "ack_frame": n, "duration_ns": elapsed(c.stall_ts, rec.ts)})
            c.stalled_at = None

    @staticmethod
    def _over_ack(c: Conn, entry: list[int], uncertain: bool) -> Anomaly:
        n, _ts, _excess, acked, outstanding = entry
        msg = f"buffer ack of {acked} bytes with {outstanding} received and not yet acknowledged"
        return Anomaly(K.ACK_BEYOND_RECEIVED, [n], msg, c.info.conn, uncertain=uncertain)

    def _unjudged_over_acks(self) -> list[Anomaly]:
        """The acks beyond what was received that no later stream message explained (end of input)."""
        return [self._over_ack(c, e, c.lost) for c in self._conns.values() for e in c.over_acks]

    def _seqno_ack(self, c: Conn, rec: Record, h: Header) -> None:
        if c.stream_ids:
            op = h[1]
            self._anomaly(
                c, K.SYNC_WRITE_WITH_STREAM_IDS, [rec.number], f"{name_of(op)} on a connection with stream ids enabled (they are exclusive)"
            )

    # --- responses -----------------------------------------------------------------
    def _answered(self, c: Conn, rec: Record, h: Header) -> tuple[int, Any, int] | None:
        """The request this response answers (forgotten with its last response), or ``None`` and an anomaly."""
        op, opaque = h[1], h[7]
        key = (OTHER[rec.direction], opaque)
        waiting = c.pending.get(key)
        i = next((i for i, req in enumerate(waiting) if req[0] == op), -1) if waiting else -1
        if i < 0:
            self._anomaly(c, K.RESPONSE_WITHOUT_REQUEST, [rec.number], f"{name_of(op)} response (opaque 0x{opaque:08x}) matches no request")
            return None
        assert waiting is not None
        req = waiting[i]
        if last_response(op, status=h[5], key_length=h[2] & 0xFF if h[0] == _ALT_RESPONSE else h[2]):
            del waiting[i]
            if not waiting:
                del c.pending[key]
        return req

    def _answer(self, c: Conn, rec: Record, h: Header) -> None:
        """A response that changes nothing the timeline follows, beyond answering its request."""
        self._answered(c, rec, h)

    def _ack(self, c: Conn, rec: Record, h: Header) -> None:
        """The consumer's ack of a marker (Ack flag) or of a set-vbucket-state: an answer to a stream message, not followed."""

    def _session_answer(self, c: Conn, rec: Record, h: Header) -> None:
        self._answered(c, rec, h)
        self._session(c, rec, h)

    def _control_answer(self, c: Conn, rec: Record, h: Header) -> None:
        req = self._answered(c, rec, h)
        if req is not None:
            status = h[5]
            key, value = req[1]
            c.info.controls[key] = (value, spec.STATUS.get(status, f"0x{status:04x}"))
        self._session(c, rec, h)

    def _noop_answer(self, c: Conn, rec: Record, h: Header) -> None:
        sent = c.noops.pop(h[7], None)
        if sent is not None:
            n, interval = rec.number, c.info.noop_interval
            rtt = elapsed(sent[1], rec.ts)
            self._noops.append({"conn": c.info.conn, "frame": sent[0], "reply_frame": n, "ts": sent[1], "rtt_ns": rtt})
            if interval and rtt is not None and rtt > 2 * interval * 1e9:
                msg = f"DCP_NOOP answered after {rtt / 1e9:.1f} s (> 2 x interval {interval:g} s)"
                self._anomaly(c, K.NOOP_ANSWERED_LATE, [sent[0], n], msg)
        self._answered(c, rec, h)

    def _failover_answer(self, c: Conn, rec: Record, h: Header) -> None:
        req = self._answered(c, rec, h)
        if req is not None and h[5] == _SUCCESS:
            log = failover_log(self._dissect(rec).body.get("failover_log"))
            if log:
                self._history.observe_log(req[1], rec.number, log, c.info.conn)

    def _seqnos_answer(self, c: Conn, rec: Record, h: Header) -> None:
        if self._answered(c, rec, h) is not None and h[5] == _SUCCESS:
            for e in self._dissect(rec).body.get("vb_seqnos", ()):
                if isinstance(e, dict) and isinstance(e.get("vbucket"), int) and isinstance(e.get("high_seqno"), int):
                    self._history.observe_high(c.info.conn, e["vbucket"], rec.number, e["high_seqno"])

    # --- thinning (max_items) and the sinks ------------------------------------------
    def flush(self) -> None:
        """Pass the items and flow samples added since the last flush to the sinks; with ``max_items``, thin them."""
        self._order_flow()
        if self.max_items is None and self._on_items is None and self._on_flow is None:
            return
        limit = None if self.max_items is None else 2 * self.max_items
        for i, s in enumerate(self._streams):
            kept = self._kept.get(i)
            if kept is None:
                kept = self._kept[i] = [0, 0, 1, None]
            done, seen, stride, _last = kept
            items = s.items
            if len(items) == done:
                continue
            new = items[done:]
            if self._on_items is not None:
                self._on_items(i, new)
            s.items, stride = _thin(items[:done], new, seen, stride, limit)
            kept[:] = [len(s.items), seen + len(new), stride, new[-1]]
        done, seen, stride = self._flow_kept
        if len(self._flow) > done:
            new_flow = self._flow[done:]
            if self._on_flow is not None:
                self._on_flow(new_flow)
            self._flow, stride = _thin(self._flow[:done], new_flow, seen, stride, limit)
            self._flow_kept = [len(self._flow), seen + len(new_flow), stride]

    def _order_flow(self) -> None:
        """Flow samples in frame order (runs of several connections append theirs a connection at a time)."""
        if self._flow_unordered:
            done = self._flow_kept[0]
            self._flow[done:] = sorted(self._flow[done:], key=_FRAME)
            self._flow_unordered = False

    def _finish_thinning(self) -> None:
        """Each thinned stream's true last item back at its end (the end-of-input checks read it)."""
        self.flush()
        for i, kept in self._kept.items():
            s, last = self._streams[i], kept[3]
            if last is not None and (not s.items or s.items[-1] is not last):
                s.items.append(last)
                kept[0] += 1

    # --- output ----------------------------------------------------------------------
    def timeline(self, *, final: bool = True) -> Timeline:
        """The timeline so far; with ``final`` also the end-of-input anomalies (requests never answered...)."""
        if self._kept or self.max_items is not None or self._on_items is not None or self._on_flow is not None:
            self._finish_thinning()
        self._order_flow()
        anomalies = list(self._anomalies)
        self._history.explain_again()
        if final:
            anomalies += self._unanswered()
            anomalies += self._unended()
            anomalies += self._unjudged_over_acks()
            anomalies += [
                Anomaly(
                    K.FLOW_CONTROL_STALL,
                    [c.stalled_at],
                    "bytes outstanding reached the buffer size and no ack freed it",
                    c.info.conn,
                    uncertain=c.lost,
                )
                for c in self._conns.values()
                if c.stalled_at is not None
            ]
        h = self._history
        branches, logs, history_logs = h.parts()
        return Timeline(
            {k: c.info for k, c in self._conns.items()},
            list(self._streams),
            branches,
            logs,
            self._flow,
            self._noops,
            anomalies,
            list(self._stalls),
            dict(h.high),
            history_logs,
        )

    def _unanswered(self) -> list[Anomaly]:
        """Requests and noops the peer never answered although it sent something after them."""
        out = []
        for c in self._conns.values():
            waiting = [(d, opaque, op, frame) for (d, opaque), reqs in c.pending.items() for op, _req, frame in reqs]
            waiting += [(d, opaque, op, frame) for (d, opaque), reqs in c.stream_pending.items() for op, frame, _s in reqs]
            for d, opaque, op, frame in sorted(waiting, key=itemgetter(3)):
                peer = c.last.get(OTHER[d])
                if op == _NOOP or not answered_once(op) or peer is None or peer.number < frame:
                    # a quiet command, a QUIT (the connection may close first), or the peer sent nothing after it:
                    # still in flight when the capture ended
                    continue
                msg = f"{name_of(op)} (opaque 0x{opaque:08x}) got no response"
                out.append(Anomaly(K.REQUEST_NEVER_ANSWERED, [frame], msg, c.info.conn, uncertain=c.lost))
            for opaque, (frame, ts) in c.noops.items():
                newest = max(v.ts for v in c.last.values())
                if not c.info.noop_interval or newest - ts <= 2 * c.info.noop_interval * 1e9:
                    continue  # interval unknown, or the capture ended within 2 x the interval
                msg = f"DCP_NOOP 0x{opaque:08x} was never answered"
                out.append(Anomaly(K.NOOP_UNANSWERED, [frame], msg, c.info.conn, uncertain=c.lost))
        return out

    def _unended(self) -> list[Anomaly]:
        """Streams that reached their end seqno with no STREAM_END although the producer sent more.

        The end is reached once the snapshot that contains the end seqno is
        complete: the producer sends that snapshot whole before STREAM_END(OK).
        """
        out = []
        for st in self._streams:
            if (
                st.end is None
                and st.end_seqno is not None
                and st.last_seqno is not None
                and st.last_seqno >= st.end_seqno
                and (not st.snapshots or st.snapshots[-1].complete)
            ):
                c = self._conns[st.conn]
                later = c.last.get(c.info.producer_dir)
                if st.items and (later is None or later.number <= st.items[-1].frame):
                    continue  # the producer sent nothing after the last item: its STREAM_END may be in flight
                msg = f"end seqno {st.end_seqno} reached but no DCP_STREAM_END"
                out.append(Anomaly(K.STREAM_NEVER_ENDED, requested_frames(st), msg, st.conn, st.vbucket, st.stream_id))
        return out


def _requests() -> dict[int, Handler]:
    """Opcode -> what a request (or a producer stream message) does: every byte has one (an opcode not in the table: an anomaly)."""
    b = TimelineBuilder
    out: dict[int, Handler] = dict.fromkeys(range(256), b._unknown)
    out.update({op: b._ignore if exchange(op) is Exchange.NONE else b._expect for op in spec.COMMANDS})
    out.update(dict.fromkeys(STREAM_MESSAGES, b._stream_message))
    out.update(dict.fromkeys((Opcode.HELLO, Opcode.DCP_OPEN, Opcode.SELECT_BUCKET), b._session_request))
    out.update(dict.fromkeys((Opcode.DCP_GET_FAILOVER_LOG, Opcode.GET_FAILOVER_LOG), b._failover_request))
    out[Opcode.SASL_AUTH] = b._sasl_auth
    out[Opcode.DCP_CONTROL] = b._control
    out[Opcode.DCP_NOOP] = b._noop
    out[Opcode.DCP_BUFFER_ACKNOWLEDGEMENT] = b._buffer_ack
    out[Opcode.DCP_SEQNO_ACKNOWLEDGED] = b._seqno_ack
    out[Opcode.DCP_STREAM_REQ] = b._stream_request
    out[Opcode.DCP_CLOSE_STREAM] = b._close_stream
    return {int(op): h for op, h in out.items()}


def _responses() -> dict[int, Handler]:
    """Opcode -> what a response does: every byte has one (by default: it answers its request, or is an anomaly)."""
    b = TimelineBuilder
    out: dict[int, Handler] = dict.fromkeys(range(256), b._answer)
    out.update(dict.fromkeys((Opcode.HELLO, Opcode.DCP_OPEN, Opcode.SELECT_BUCKET, Opcode.SASL_AUTH), b._session_answer))
    out.update(dict.fromkeys((Opcode.DCP_GET_FAILOVER_LOG, Opcode.GET_FAILOVER_LOG), b._failover_answer))
    out.update(dict.fromkeys((Opcode.DCP_SNAPSHOT_MARKER, Opcode.DCP_SET_VBUCKET_STATE), b._ack))
    out.update(dict.fromkeys((Opcode.DCP_STREAM_REQ, Opcode.DCP_CLOSE_STREAM), b._stream_answer))
    out[Opcode.DCP_CONTROL] = b._control_answer
    out[Opcode.DCP_NOOP] = b._noop_answer
    out[Opcode.GET_ALL_VB_SEQNOS] = b._seqnos_answer
    return {int(op): h for op, h in out.items()}


#: request opcode -> handler (stream messages included)
_REQUEST: dict[int, Handler] = _requests()
#: response opcode -> handler
_RESPONSE: dict[int, Handler] = _responses()


def _thin(kept: list[Any], new: list[Any], seen: int, stride: int, limit: int | None) -> tuple[list[Any], int]:
    """``kept`` + every ``stride``-th of ``new`` (``seen`` before it), the stride doubling while more than ``limit`` remain."""
    if limit is None:
        return kept + new, stride
    out = kept + new[(-seen) % stride :: stride]
    while len(out) > limit:
        stride *= 2
        out = out[::2]
    return out, stride


def build_timeline(records: Iterable[Record], capture_sets: Mapping[str, int] | None = None) -> Timeline:
    """The timeline of records (a capture, in bulk; ``capture_sets``: file -> its capture set)."""
    return TimelineBuilder(capture_sets).feed_all(records).timeline()
