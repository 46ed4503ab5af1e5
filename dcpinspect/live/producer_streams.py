"""The streaming half of the simulated producer: stream requests, snapshots, flow control.

:class:`StreamingMixin` is mixed into
:class:`~dcpinspect.live.producer.ProducerConnection`, which supplies the
session (what was negotiated, in its :class:`~dcpinspect.flows.session.ConnState`)
and the output (``_send``/``_reply``).  The rules, in the order a stream lives:

1. A DCP_STREAM_REQ is checked in kv_engine's order (``DcpProducer::streamRequest``):
   validator rules, vbucket, FromLatest, noop, ranges, stream id, filter,
   existing stream, then the rollback rule
   (:func:`~dcpinspect.protocol.rules.rollback_decision`), then the end seqno.
2. An open stream is a queue of frames filled a snapshot at a time: a disk
   snapshot up to the high seqno at request time, then memory snapshots of at
   most ``Cluster.checkpoint_items`` seqnos.  Inside a snapshot each key appears
   once (its latest version); :mod:`.producer_frames` says what each frame looks
   like for what the connection negotiated.
3. :meth:`StreamingMixin.pump_streams` moves queued frames to the output round
   robin over the streams, charging each to the flow-control window
   (:func:`~dcpinspect.protocol.rules.flow_control_size`) and stopping when the
   window is full.
4. A stream ends with DCP_STREAM_END: at its end seqno (OK), after a state
   change of its vbucket (StateChanged), when its filter is empty
   (FilterEmpty), after a client close (Closed, if asked for) or when the
   window stayed full too long (Slow).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..flows.session import ConnState
from ..protocol.enums import (
    Feature,
    OpenFlag,
    OsoFlag,
    SnapshotFlag,
    Status,
    StreamEndStatus,
    StreamReqFlag,
    SystemEvent,
    VBucketState,
)
from ..protocol.rules import RollbackDecision, flow_control_size, rollback_decision
from ..wire.dissection import Dissection
from ..wire.encode import encode
from .cluster import Bucket, Cluster, HistoryItem, VBucket
from .producer_frames import StreamFormat, item_frame, item_note, marker_frame

__all__ = ["MAX_STREAM_ID", "ProducerStream", "StreamRequest", "StreamingMixin", "json_value"]

#: the largest stream id (a 16-bit frame info)
MAX_STREAM_ID = (1 << 16) - 1

_ACTIVE, _REPLICA, _PENDING, _DEAD = (int(s) for s in (VBucketState.ACTIVE, VBucketState.REPLICA, VBucketState.PENDING, VBucketState.DEAD))
_SR = StreamReqFlag
_SR_KNOWN = int(sum(_SR))  # every flag the table knows
_SR_CACHE_TRANSFER_ALLOWED = int(_SR.TAKEOVER | _SR.ACTIVE_VB_ONLY | _SR.CACHE_TRANSFER)
_END = StreamEndStatus
_SCOPE_EVENTS = frozenset(int(e) for e in (SystemEvent.CREATE_SCOPE, SystemEvent.DROP_SCOPE))
_DISK_SNAPSHOT = int(SnapshotFlag.DISK | SnapshotFlag.CHECKPOINT)
_MEMORY, _CHECKPOINT = int(SnapshotFlag.MEMORY), int(SnapshotFlag.CHECKPOINT)
_OSO_START, _OSO_END = int(OsoFlag.START), int(OsoFlag.END)
_OOO_CONTROL = "enable_out_of_order_snapshots"
_COLLECTIONS = int(Feature.COLLECTIONS)


@dataclass
class ProducerStream:
    """One DCP stream of a connection, keyed by (vbucket, sid)."""

    vb: int
    sid: int | None
    opaque: int
    flags: int
    start: int
    end: int
    generation: int
    #: ``None``: every collection; a set: the filter (legacy streams: ``{0}``)
    cids: frozenset[int] | None
    filtered: bool
    backfill_end: int
    last_queued: int = 0
    first_marker: bool = True
    #: (frame, flow-control size, kind, journal entry noted when it is sent)
    queue: deque[tuple[bytes, int, str, tuple[str, dict[str, Any]] | None]] = field(default_factory=deque)
    ended: bool = False
    end_status: int | None = None
    takeover: str = ""  # "", "pending" (waiting for ack 1), "active" (waiting for ack 2)

    @property
    def key(self) -> tuple[int, int | None]:
        """(vbucket, sid)."""
        return (self.vb, self.sid)


@dataclass
class StreamRequest:
    """A DCP_STREAM_REQ being checked: its fields (adjusted as the checks go) and what the checks found."""

    d: Dissection
    vbid: int
    flags: int
    start: int
    end: int
    uuid: int
    snap_start: int
    snap_end: int
    #: the request's JSON value (``{}`` without one)
    obj: dict[str, Any]
    #: what the journal notes of the request (as it arrived)
    journal: dict[str, Any]
    vb: VBucket | None = None
    sid: int | None = None
    cids: frozenset[int] | None = None
    filtered: bool = False
    client_purge: int = 0


def json_value(value: bytes) -> Any:
    """A request value read as JSON (``None`` if it is not)."""
    try:
        return json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return None


class StreamingMixin:
    """The streams of a producer connection (mixed into :class:`~dcpinspect.live.producer.ProducerConnection`)."""

    # --- supplied by the connection -------------------------------------------------------
    cluster: Cluster
    bucket: Bucket | None
    session: ConnState
    serial: int
    closed: bool
    noop_enabled: bool

    def _send(self, frame: bytes, now: float | None = None) -> None:
        raise NotImplementedError

    def _reply(self, d: Dissection, status: int = Status.SUCCESS, *, now: float, **kw: Any) -> None:
        raise NotImplementedError

    def _dcp_conn(self, d: Dissection, now: float) -> bool:
        raise NotImplementedError

    @property
    def output_size(self) -> int:
        """Bytes produced and not yet taken by the edge."""
        raise NotImplementedError

    def _init_streams(self) -> None:
        self.streams: dict[tuple[int, int | None], ProducerStream] = {}
        self._rr = 0
        # flow control
        self.buffer_size = 0
        self.bytes_outstanding = 0
        self._blocked_since: float | None = None
        # scenario controls
        self.paused_until = 0.0

    # --- what the connection negotiated --------------------------------------------------
    @property
    def dcp_name(self) -> str | None:
        """The DCP_OPEN name (``None`` before a successful DCP_OPEN)."""
        return self.session.open_name if self.session.open_flags is not None else None

    @property
    def open_flags(self) -> int:
        """The DCP_OPEN flags (0 before DCP_OPEN)."""
        return self.session.open_flags or 0

    @property
    def controls(self) -> dict[str, str]:
        """The DCP_CONTROL keys accepted so far, with their values."""
        return self.session.controls

    @property
    def collections(self) -> bool:
        """HELLO Collections was accepted."""
        return _COLLECTIONS in self.session.features

    @property
    def sync_replication(self) -> bool:
        """``enable_sync_writes`` + ``consumer_name``: prepares, commits and aborts are streamed."""
        return self.session.controls.get("enable_sync_writes") == "true" and bool(self.session.controls.get("consumer_name"))

    @property
    def stream_ids(self) -> bool:
        """``enable_stream_id`` was accepted."""
        return self.session.controls.get("enable_stream_id") == "true"

    @property
    def marker_version(self) -> str:
        """``v1``, ``v2.0`` (sync replication) or ``v2.2`` (``max_marker_version`` 2.2)."""
        if self.session.controls.get("max_marker_version") == "2.2":
            return "v2.2"
        return "v2.0" if self.sync_replication else "v1"

    # --- DCP_STREAM_REQ ------------------------------------------------------------------
    def _stream_req(self, d: Dissection, now: float) -> None:
        if not self._dcp_conn(d, now):
            return
        req = self._stream_request(d)
        status = self._validate(req)
        if status is not None:
            self.cluster.note("stream_request", **req.journal, decision="error", status=int(status))
            self._reply(d, status, now=now)
            return
        decision = self._rollback_check(req)
        if decision.rollback:
            self.cluster.note(
                "stream_request",
                **req.journal,
                decision="rollback",
                status=int(Status.ROLLBACK),
                rollback_seqno=decision.seqno,
                reason=decision.reason,
            )
            self._reply(d, Status.ROLLBACK, value={"rollback_seqno": decision.seqno}, now=now)
            return
        self._open_stream(req, now)

    def _stream_request(self, d: Dissection) -> StreamRequest:
        x = d.extras
        flags = int(x["flags"])
        start, end, uuid = int(x["start_seqno"]), int(x["end_seqno"]), int(x["vb_uuid"])
        ss, se = int(x["snap_start_seqno"]), int(x["snap_end_seqno"])
        parsed = json_value(d.frame.value) if d.frame.value else None
        journal: dict[str, Any] = {
            "conn": self.serial,
            "name": self.dcp_name,
            "vb": d.frame.vbucket or 0,
            "sid": parsed.get("sid") if isinstance(parsed, dict) else None,
            "opaque": d.frame.opaque,
            "flags": flags,
            "start": start,
            "end": end,
            "uuid": uuid,
            "snap_start": ss,
            "snap_end": se,
            "value": parsed,
        }
        obj = parsed if isinstance(parsed, dict) else {}
        return StreamRequest(d, d.frame.vbucket or 0, flags, start, end, uuid, ss, se, obj, journal)

    def _validate(self, req: StreamRequest) -> int | None:
        """The checks before the rollback rule, in kv_engine's order; the first error status, or ``None``."""
        b = self.bucket
        assert b is not None
        for check in _STREAM_REQ_CHECKS:
            status = check(self, req, b)
            if status is not None:
                return status
        return None

    def _check_validator(self, req: StreamRequest, b: Bucket) -> int | None:
        """The request validator's rules (mcbp_validators): known flags, a JSON object value only with collections."""
        flags, value = req.flags, req.d.frame.value
        if flags & ~_SR_KNOWN or flags & _SR.NO_VALUE or (flags & _SR.CACHE_TRANSFER and flags & ~_SR_CACHE_TRANSFER_ALLOWED):
            return Status.EINVAL
        if value and (not self.collections or not isinstance(json_value(value), dict)):
            return Status.EINVAL
        return Status.NOT_SUPPORTED if flags & _SR.CACHE_TRANSFER else None

    def _check_vbucket(self, req: StreamRequest, b: Bucket) -> int | None:
        """The vbucket exists and may stream (ActiveVbOnly: active only); FromLatest moves the start to its high seqno."""
        if req.vbid >= len(b.vbuckets):
            return Status.NOT_MY_VBUCKET
        vb = req.vb = b.vbuckets[req.vbid]
        if vb.state not in (_ACTIVE, _REPLICA) or (req.flags & _SR.ACTIVE_VB_ONLY and vb.state != _ACTIVE):
            return Status.NOT_MY_VBUCKET
        if req.flags & _SR.FROM_LATEST:
            req.start = req.snap_start = req.snap_end = vb.high_seqno
            req.uuid = req.uuid or vb.uuid
        return None

    def _check_ranges(self, req: StreamRequest, b: Bucket) -> int | None:
        """Noops are mandatory for xattrs and collections; start <= end and snap_start <= start <= snap_end."""
        if not self.noop_enabled and (self.open_flags & OpenFlag.INCLUDE_XATTRS or req.d.frame.value):
            return Status.NOT_SUPPORTED
        if req.start > req.end or not req.snap_start <= req.start <= req.snap_end:
            return Status.ERANGE
        return None

    def _check_stream_id(self, req: StreamRequest, b: Bucket) -> int | None:
        """A stream id (1..MAX_STREAM_ID) exactly when ``enable_stream_id`` was accepted."""
        sid = req.obj.get("sid")
        if not self.stream_ids:
            return None if sid is None else Status.DCP_STREAM_ID_INVALID
        if not isinstance(sid, int) or isinstance(sid, bool) or not 1 <= sid <= MAX_STREAM_ID:
            return Status.DCP_STREAM_ID_INVALID
        req.sid = sid
        return None

    def _check_exists(self, req: StreamRequest, b: Bucket) -> int | None:
        """No filtered stream with sync replication, no second live stream per (vbucket, sid), a readable purge seqno."""
        if req.filtered and self.sync_replication:
            return Status.NOT_SUPPORTED
        if (req.vbid, req.sid) in self.streams and not self.streams[(req.vbid, req.sid)].ended:
            return Status.KEY_EEXISTS
        try:
            req.client_purge = int(req.obj.get("purge_seqno", "0"))
        except (TypeError, ValueError):
            return Status.EINVAL
        return None

    def _filter(self, req: StreamRequest, b: Bucket) -> int | None:
        """The collections a stream sees (``req.cids``, ``req.filtered``); the error status, or ``None``."""
        obj = req.obj
        if "collections" in obj and "scope" in obj:
            return Status.EINVAL
        if "collections" in obj:
            try:
                wanted = [int(c, 16) for c in obj["collections"]]
            except (TypeError, ValueError):
                return Status.EINVAL
            if any(c not in b.manifest.collections for c in wanted):
                return Status.UNKNOWN_COLLECTION
            req.cids, req.filtered = frozenset(wanted), True
        elif "scope" in obj:
            try:
                scope = int(obj["scope"], 16)
            except (TypeError, ValueError):
                return Status.EINVAL
            if scope not in b.manifest.scopes:
                return Status.UNKNOWN_SCOPE
            req.cids, req.filtered = frozenset(c for c, (_n, s, _t) in b.manifest.collections.items() if s == scope), True
        elif not self.collections:
            if 0 not in b.manifest.collections:
                return Status.UNKNOWN_COLLECTION  # a legacy stream of a dropped _default
            req.cids = frozenset({0})
        return None

    def _rollback_check(self, req: StreamRequest) -> RollbackDecision:
        vb = req.vb
        assert vb is not None
        return rollback_decision(
            start=req.start,
            snap_start=req.snap_start,
            snap_end=req.snap_end,
            vb_uuid=req.uuid,
            failover_log=vb.failover_log,
            high_seqno=vb.high_seqno,
            purge_seqno=vb.purge_seqno,
            flags=req.flags,
            client_purge_seqno=req.client_purge,
            filtered_max_seqno=vb.collection_high_seqno(req.cids) if req.filtered and req.cids is not None else None,
        )

    def _open_stream(self, req: StreamRequest, now: float) -> None:
        """The end seqno adjustments (ToLatest, DiskOnly), the last range check, then the stream and the Success reply."""
        vb = req.vb
        assert vb is not None
        high, start, end = vb.high_seqno, req.start, req.end
        if req.flags & _SR.TO_LATEST:
            end = vb.collection_high_seqno(req.cids) if req.filtered and req.cids is not None else high
        elif req.flags & _SR.DISK_ONLY:
            end = high  # everything is persisted in the simulator
        if start > end or start > high:
            self.cluster.note("stream_request", **req.journal, decision="error", status=int(Status.ERANGE))
            self._reply(req.d, Status.ERANGE, now=now)
            return
        st = ProducerStream(
            vb=req.vbid,
            sid=req.sid,
            opaque=req.d.frame.opaque,
            flags=req.flags,
            start=start,
            end=end,
            generation=vb.generation,
            cids=req.cids,
            filtered=req.filtered,
            backfill_end=min(high, end) if start < high else 0,
            last_queued=start,
        )
        self.streams[st.key] = st
        self.cluster.note(
            "stream_request",
            **req.journal,
            decision="success",
            status=int(Status.SUCCESS),
            stream_end=end,
            high_seqno=high,
            failover_log=[[u, s] for u, s in vb.failover_log],
        )
        self._reply(req.d, value=list(vb.failover_log), now=now)

    # --- the other stream commands -------------------------------------------------------
    def _close_stream(self, d: Dissection, now: float) -> None:
        if not self._dcp_conn(d, now):
            return
        sid = d.stream_id
        if self.stream_ids != (sid is not None):
            self._reply(d, Status.DCP_STREAM_ID_INVALID, now=now)
            return
        vbid = d.frame.vbucket or 0
        st = self.streams.get((vbid, sid))
        status = Status.KEY_ENOENT if st is None or st.ended else Status.SUCCESS
        self.cluster.note("close_stream", conn=self.serial, name=self.dcp_name, vb=vbid, sid=sid, status=int(status))
        self._reply(d, status, now=now)
        if st is None or status != Status.SUCCESS:
            return
        st.queue.clear()
        if self.controls.get("send_stream_end_on_client_close_stream") == "true":
            self._queue_end(st, _END.CLOSED)
            st.end_status = _END.CLOSED
        else:
            self._finish(st)

    def _buffer_ack(self, d: Dissection, now: float) -> None:
        if not self._dcp_conn(d, now):
            return
        # no response on success
        acked = int(d.extras.get("buffer_bytes", 0))
        self.bytes_outstanding = max(0, self.bytes_outstanding - acked)
        self.cluster.note("buffer_ack", conn=self.serial, name=self.dcp_name, bytes=acked, outstanding=self.bytes_outstanding)

    def _seqno_ack(self, d: Dissection, now: float) -> None:
        if not self._dcp_conn(d, now):
            return
        vbid = d.frame.vbucket or 0
        self.cluster.note("seqno_ack", conn=self.serial, name=self.dcp_name, vb=vbid, prepared_seqno=d.extras.get("prepared_seqno"))
        if not self.sync_replication:
            self._reply(d, Status.EINVAL, now=now)  # answered with errors only
        elif self.bucket is not None and vbid >= len(self.bucket.vbuckets):
            self._reply(d, Status.NOT_MY_VBUCKET, now=now)

    def _takeover_ack(self, st: ProducerStream, now: float) -> None:
        """The consumer acknowledged a takeover DCP_SET_VBUCKET_STATE: pending -> active (the vbucket is dead here) -> end."""
        b = self.bucket
        assert b is not None
        vb = b.vbuckets[st.vb]
        if st.takeover == "pending":
            vb.state = _DEAD
            vb.generation += 1
            st.generation = vb.generation  # the takeover stream itself carries on
            st.takeover = "active"
            self._queue(
                st,
                encode("DCP_SET_VBUCKET_STATE", extras={"state": _ACTIVE}, vbucket=st.vb, opaque=st.opaque),
                "state",
                note=("set_vbucket_state", {"state": _ACTIVE}),
            )
        elif st.takeover == "active":
            st.takeover = "done"
            self._queue_end(st, _END.OK)

    # --- moving frames to the output -----------------------------------------------------
    def _window_full(self) -> bool:
        return self.buffer_size > 0 and self.bytes_outstanding >= self.buffer_size

    def streams_ready(self) -> bool:
        """Some stream has frames queued and the window lets them go."""
        return not self._window_full() and any(s.queue and not s.ended for s in self.streams.values())

    def pump_streams(self, now: float) -> None:
        """Move stream messages to the output: round robin, within flow control and the output limit."""
        if now < self.paused_until:
            return
        budget = min(self.cluster.max_batch, self.cluster.output_limit - self.output_size)
        keys = list(self.streams)
        idle_rounds = 0
        while keys and budget > 0 and idle_rounds < 2:
            progressed = False
            self._rr = (self._rr + 1) % len(keys)
            for key in keys[self._rr :] + keys[: self._rr]:
                st = self.streams.get(key)
                if st is None or st.ended:
                    continue
                if not st.queue:
                    self._fill(st)
                if not st.queue:
                    continue
                if self._window_full():
                    self._note_blocked(now)
                    return
                frame, size, what, note = st.queue.popleft()
                self._send(frame, now)
                if note is not None:
                    self._journal(st, note)
                self.bytes_outstanding += size if self.buffer_size > 0 else 0
                budget -= len(frame)
                progressed = True
                if what == "end":
                    self._finish(st)
            idle_rounds = 0 if progressed else idle_rounds + 1
            keys = [k for k in self.streams if not self.streams[k].ended]
        if not self._window_full():
            self._blocked_since = None

    def _note_blocked(self, now: float) -> None:
        if self._blocked_since is None:
            self._blocked_since = now
            self.cluster.note(
                "flow_blocked", conn=self.serial, name=self.dcp_name, outstanding=self.bytes_outstanding, buffer=self.buffer_size
            )

    def end_slow_streams(self, now: float) -> None:
        """End every stream Slow if the window stayed full for the cluster's ``slow_after``.

        A choice: the cursor is dropped and the STREAM_END(Slow) goes out past the
        full window, else it could never arrive.
        """
        slow = self.cluster.slow_after
        if self._blocked_since is None or slow is None or now - self._blocked_since < slow:
            return
        for st in list(self.streams.values()):
            if not st.ended:
                st.queue.clear()
                frame = self._stream_end_frame(st, _END.SLOW)
                self._send(frame, now)
                self._journal(st, ("stream_end", {"status": self._end_wire(_END.SLOW), "reason": int(_END.SLOW), "past_window": True}))
                self.bytes_outstanding += flow_control_size(frame[0], frame[1], len(frame))
                self._finish(st)
        self._blocked_since = None

    def _finish(self, st: ProducerStream) -> None:
        st.ended = True
        self.streams.pop(st.key, None)

    def _end_wire(self, status: int) -> int:
        """The status a stream end goes out with (kv_engine's ``mapEndStreamStatus``)."""
        if status == _END.ROLLBACK:
            return int(_END.STATE_CHANGED)
        if not self.collections and status in (_END.FILTER_EMPTY, _END.LOST_PRIVILEGES):
            return int(_END.OK)
        return int(status)

    def _stream_end_frame(self, st: ProducerStream, status: int) -> bytes:
        return encode("DCP_STREAM_END", extras={"status": self._end_wire(status)}, vbucket=st.vb, opaque=st.opaque, stream_id=st.sid)

    def _queue_end(self, st: ProducerStream, status: int) -> None:
        note = ("stream_end", {"status": self._end_wire(status), "reason": int(status)})
        self._queue(st, self._stream_end_frame(st, status), "end", note=note)

    def _journal(self, st: ProducerStream, note: tuple[str, dict[str, Any]]) -> None:
        self.cluster.note(note[0], conn=self.serial, name=self.dcp_name, vb=st.vb, sid=st.sid, **note[1])

    def _queue(self, st: ProducerStream, raw: bytes, what: str, note: tuple[str, dict[str, Any]] | None = None) -> None:
        st.queue.append((raw, flow_control_size(raw[0], raw[1], len(raw)), what, note))

    # --- filling a stream's queue --------------------------------------------------------
    def _fill(self, st: ProducerStream) -> None:
        """Queue the stream's next snapshot, or its end, or (takeover) its DCP_SET_VBUCKET_STATE."""
        b = self.bucket
        assert b is not None
        vb = b.vbuckets[st.vb]
        if vb.generation != st.generation:
            self._queue_end(st, _END.STATE_CHANGED)
            return
        if st.takeover:
            return
        if st.filtered and st.cids is not None and not (st.cids & set(b.manifest.collections)) and st.last_queued >= vb.high_seqno:
            self._queue_end(st, _END.FILTER_EMPTY)
            return
        if st.last_queued >= st.end:
            self._queue_end(st, _END.OK)
            return
        target = min(vb.high_seqno, st.end)
        if target <= st.last_queued:
            if st.flags & _SR.TAKEOVER:
                raw = encode("DCP_SET_VBUCKET_STATE", extras={"state": _PENDING}, vbucket=st.vb, opaque=st.opaque)
                self._queue(st, raw, "state", note=("set_vbucket_state", {"state": _PENDING}))
                st.takeover = "pending"
            return
        if st.backfill_end and st.first_marker:
            self._snapshot(st, vb, st.last_queued, st.backfill_end, disk=True)
        else:
            hi = min(target, st.last_queued + max(1, self.cluster.checkpoint_items))
            self._snapshot(st, vb, st.last_queued, hi, disk=False)

    def _visible(self, st: ProducerStream, r: HistoryItem) -> bool:
        if r.kind == "system":
            return self.collections and (st.cids is None or r.cid in st.cids or (r.event in _SCOPE_EVENTS and not st.filtered))
        if st.cids is not None and r.cid not in st.cids:
            return False
        if r.kind in ("prepare", "abort"):
            return self.sync_replication
        return True

    def _snapshot(self, st: ProducerStream, vb: VBucket, lo: int, hi: int, *, disk: bool) -> None:
        """Queue one snapshot (lo, hi]: marker + deduplicated items (+ seqno-advanced)."""
        b = self.bucket
        assert b is not None
        recs = vb.records(lo, hi)
        if disk:
            live = set(b.manifest.collections)
            recs = [r for r in recs if r.kind == "system" or r.cid in live]
        latest: dict[tuple[Any, ...], HistoryItem] = {}
        for r in recs:
            latest[r.dedup_key] = r  # each key at most once per snapshot
        items = sorted((r for r in latest.values() if self._visible(st, r)), key=lambda r: r.seqno)
        if disk and not self.sync_replication:
            # the disk copy of a committed sync write is the commit; hide prepares whose commit is on disk
            items = [r for r in items if r.kind not in ("prepare", "abort")]
        first = st.first_marker
        st.first_marker = False
        st.last_queued = hi
        fmt = self._format()
        ooo = self.controls.get(_OOO_CONTROL)
        if disk and first and st.start == 0 and ooo in ("true", "true_with_seqno_advanced") and st.filtered and len(st.cids or ()) == 1:
            self._oso_snapshot(st, fmt, items, hi, seqno_advanced=ooo == "true_with_seqno_advanced")
            return
        # the marker starts at the requested start for the first marker, else at the first item's seqno
        start = lo if first else (items[0].seqno if items else lo + 1)
        flags = _DISK_SNAPSHOT if disk else (_MEMORY | (_CHECKPOINT if first else 0))
        raw = marker_frame(fmt, vb, start, hi, flags, disk=disk, vbucket=st.vb, opaque=st.opaque, stream_id=st.sid)
        self._queue(st, raw, "marker", note=("marker", {"start": start, "end": hi, "flags": flags, "version": fmt.marker_version}))
        for r in items:
            self._item(st, fmt, r)
        if self.collections and (not items or items[-1].seqno < hi):
            self._seqno_advanced(st, hi)  # the snapshot ends on seqnos this stream does not see

    def _oso_snapshot(self, st: ProducerStream, fmt: StreamFormat, items: list[HistoryItem], hi: int, *, seqno_advanced: bool) -> None:
        """An out-of-order backfill of one collection: OSO start, the items in key order, OSO end."""
        common: dict[str, Any] = {"vbucket": st.vb, "opaque": st.opaque, "stream_id": st.sid}
        self._queue(st, encode("DCP_OSO_SNAPSHOT", extras={"flags": _OSO_START}, **common), "oso", note=("oso", {"flags": _OSO_START}))
        for r in sorted(items, key=lambda r: r.key):
            self._item(st, fmt, r)
        self._queue(st, encode("DCP_OSO_SNAPSHOT", extras={"flags": _OSO_END}, **common), "oso", note=("oso", {"flags": _OSO_END}))
        if seqno_advanced and (not items or max(r.seqno for r in items) < hi):
            self._seqno_advanced(st, hi)

    def _seqno_advanced(self, st: ProducerStream, seqno: int) -> None:
        raw = encode("DCP_SEQNO_ADVANCED", extras={"seqno": seqno}, vbucket=st.vb, opaque=st.opaque, stream_id=st.sid)
        self._queue(st, raw, "sa", note=("item", {"opcode": "DCP_SEQNO_ADVANCED", "seqno": seqno}))

    def _format(self) -> StreamFormat:
        return StreamFormat(self.collections, self.sync_replication, self.open_flags, self.controls, self.marker_version)

    def _item(self, st: ProducerStream, fmt: StreamFormat, r: HistoryItem) -> None:
        name, raw = item_frame(fmt, r, vbucket=st.vb, opaque=st.opaque, sid=st.sid)
        self._queue(st, raw, "item", note=item_note(name, r))


#: the checks of a DCP_STREAM_REQ before the rollback rule, in kv_engine's order
_STREAM_REQ_CHECKS: tuple[Callable[[StreamingMixin, StreamRequest, Bucket], int | None], ...] = (
    StreamingMixin._check_validator,
    StreamingMixin._check_vbucket,
    StreamingMixin._check_ranges,
    StreamingMixin._check_stream_id,
    StreamingMixin._filter,
    StreamingMixin._check_exists,
)
