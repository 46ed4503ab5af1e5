"""The streaming half of the simulated producer: stream requests, stream commands, flow control.

:class:`StreamingMixin` is mixed into
:class:`~dcpinspect.live.producer.ProducerConnection`, which supplies the
session (what was negotiated, in its :class:`~dcpinspect.flows.session.ConnState`)
and the output (``_send``/``_reply``).  The rules, in the order a stream lives:

1. A DCP_STREAM_REQ is checked in kv_engine's order (``DcpProducer::streamRequest``):
   validator rules, privileges, vbucket (its state on this connection's node),
   FromLatest, noop (mandatory on a connection with HELLO Collections or
   xattrs), ranges, stream id and filter (the value's keys), existing stream
   (a dead one is replaced), then the rollback rule
   (:func:`~dcpinspect.protocol.rules.rollback_decision`), then the end seqno.
2. An open stream is a queue of frames filled a snapshot at a time by
   :class:`~dcpinspect.live.producer_snapshots.SnapshotsMixin`.
3. :meth:`StreamingMixin.pump_streams` moves queued frames to the output round
   robin over the streams, charging each to the flow-control window
   (:func:`~dcpinspect.protocol.rules.flow_control_size`) and stopping when the
   window is full: a consumer that stops acking only pauses the producer, and a
   STREAM_END waits behind a full window like any message.
4. A stream ends with DCP_STREAM_END: at the end of the snapshot containing its
   end seqno (OK), after a client close (Closed, if asked for), a state change
   of its vbucket (StateChanged), a backfill stalled under disk pressure
   (Slow), a failed backfill (BackfillFail), a purge that overtook its backfill
   (Rollback, sent as StateChanged), an empty filter (FilterEmpty) or lost
   privileges (LostPrivileges; both sent as OK without collections).  A
   dropped connection ends its streams Disconnected, which is never sent.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..flows.session import ConnState
from ..protocol import spec
from ..protocol.enums import Feature, Opcode, OpenFlag, Status, StreamEndStatus, StreamReqFlag, VBucketState
from ..protocol.rules import RollbackDecision, client_purge_seqno, from_latest, rollback_decision
from ..protocol.session import control_on
from ..wire.dissection import Dissection
from ..wire.encode import encode
from .cluster import Bucket, VBucket
from .producer_frames import StreamFormat
from .producer_snapshots import ProducerStream, SnapshotsMixin

__all__ = ["MAX_STREAM_ID", "STREAM_REQUEST_KEYS", "ProducerStream", "StreamRequest", "StreamingMixin", "json_value"]

#: the largest stream id (a 16-bit frame info)
MAX_STREAM_ID = (1 << 16) - 1
#: the keys a stream request's JSON value may hold (kv_engine collections/vbucket_filter.cc); one at least
STREAM_REQUEST_KEYS = frozenset(spec.STREAM_REQ_JSON_KEYS)

_ACTIVE, _REPLICA, _DEAD = (int(s) for s in (VBucketState.ACTIVE, VBucketState.REPLICA, VBucketState.DEAD))
_SR = StreamReqFlag
_SR_KNOWN = int(sum(_SR))  # every flag the table knows
_SR_CACHE_TRANSFER_ALLOWED = int(_SR.TAKEOVER | _SR.ACTIVE_VB_ONLY | _SR.CACHE_TRANSFER)
_END = StreamEndStatus
_COLLECTIONS = int(Feature.COLLECTIONS)
_CURSOR_DROPPING = ("supports_cursor_dropping", "supports_cursor_dropping_vulcan")


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


class StreamingMixin(SnapshotsMixin):
    """The streams of a producer connection (mixed into :class:`~dcpinspect.live.producer.ProducerConnection`)."""

    # --- supplied by the connection -------------------------------------------------------
    session: ConnState
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
        #: streams opened (stream requests answered Success) and DCP items sent (mutations, deletions, ...) so far
        self.streams_opened = 0
        self.items_sent = 0
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
    def sync_writes(self) -> bool:
        """``enable_sync_writes``: prepares, commits and aborts are streamed; a ``collections`` filter is refused."""
        return control_on("enable_sync_writes", self.session.controls)

    @property
    def sync_replication(self) -> bool:
        """``enable_sync_writes`` + ``consumer_name``: full sync replication (SEQNO_ACKNOWLEDGED, markers with MVS/HCS)."""
        return self.sync_writes and bool(self.session.controls.get("consumer_name"))

    @property
    def stream_ids(self) -> bool:
        """``enable_stream_id`` was accepted."""
        return control_on("enable_stream_id", self.session.controls)

    @property
    def cursor_dropping(self) -> bool:
        """Whether the server may drop this connection's cursors (kv_engine: on unless the name contains ``replication``, or as controlled)."""
        values = [self.session.controls[k] for k in _CURSOR_DROPPING if k in self.session.controls]
        if values:
            return "true" in values
        return "replication" not in (self.dcp_name or "")

    def _format(self) -> StreamFormat:
        return StreamFormat(
            self.collections,
            self.sync_writes,
            self.sync_replication,
            self.open_flags,
            self.controls,
            self.controls.get("max_marker_version") == "2.2",
        )

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
            "node": self.node,
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

    def _check_privileges(self, req: StreamRequest, b: Bucket) -> int | None:
        """The user still has its privileges on the bucket (:meth:`~dcpinspect.live.cluster.Bucket.lose_privileges`)."""
        return Status.EACCESS if self.user is not None and self.user in b.revoked else None

    def _check_vbucket(self, req: StreamRequest, b: Bucket) -> int | None:
        """The vbucket exists and may stream on this node (ActiveVbOnly: active only); FromLatest moves the start to its high seqno."""
        if req.vbid >= len(b.vbuckets):
            return Status.NOT_MY_VBUCKET
        vb = req.vb = b.vbuckets[req.vbid]
        state = b.state_on(req.vbid, self.node)
        if state not in (_ACTIVE, _REPLICA) or (req.flags & _SR.ACTIVE_VB_ONLY and state != _ACTIVE):
            return Status.NOT_MY_VBUCKET
        req.start, req.snap_start, req.snap_end, req.uuid = from_latest(
            flags=req.flags,
            start=req.start,
            snap_start=req.snap_start,
            snap_end=req.snap_end,
            vb_uuid=req.uuid,
            high_seqno=vb.high_seqno,
            latest_uuid=vb.uuid,
        )
        return None

    def _check_ranges(self, req: StreamRequest, b: Bucket) -> int | None:
        """Noops are mandatory with xattrs and on any collections connection; start <= end and snap_start <= start <= snap_end."""
        if not self.noop_enabled and (self.open_flags & OpenFlag.INCLUDE_XATTRS or self.collections):
            return Status.NOT_SUPPORTED  # producer.cc: the executor fills the value of every request on a collections connection
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

    def _filter(self, req: StreamRequest, b: Bucket) -> int | None:
        """The value's keys and the collections a stream sees (``req.cids``, ``req.filtered``); the error status, or ``None``."""
        obj = req.obj
        if req.d.frame.value and not obj.keys() & STREAM_REQUEST_KEYS:
            return Status.EINVAL  # a value with none of the known keys
        if "purge_seqno" in obj:
            client_purge = client_purge_seqno(obj)  # a string read as std::stoull reads it; a JSON number is refused
            if client_purge is None:
                return Status.EINVAL
            req.client_purge = client_purge
        if "collections" in obj and "scope" in obj:
            return Status.EINVAL
        if "collections" in obj:
            try:
                wanted = [int(c, 16) for c in obj["collections"]]
            except (TypeError, ValueError):
                return Status.EINVAL
            if any(c not in b.manifest.collections for c in wanted):
                return Status.UNKNOWN_COLLECTION
            if self.sync_writes:
                return Status.NOT_SUPPORTED  # a collections filter with sync writes (a scope filter is allowed)
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

    def _check_exists(self, req: StreamRequest, b: Bucket) -> int | None:
        """No second live stream per (vbucket, sid); a dead one is replaced (producer.cc ``shouldAddVBToProducerConnection``)."""
        st = self.streams.get((req.vbid, req.sid))
        return Status.KEY_EEXISTS if st is not None and not st.dead else None

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
            # legacy streams (cids {0}) use the default collection's high seqno, as filtered ones theirs
            filtered_max_seqno=vb.collection_high_seqno(req.cids) if req.cids is not None else None,
        )

    def _open_stream(self, req: StreamRequest, now: float) -> None:
        """The end seqno adjustments (ToLatest, DiskOnly), the last range check, then the stream and the Success reply."""
        vb = req.vb
        assert vb is not None
        high, start, end = vb.high_seqno, req.start, req.end
        if req.flags & _SR.TO_LATEST:
            end = vb.collection_high_seqno(req.cids) if req.cids is not None else high
        elif req.flags & _SR.DISK_ONLY:
            end = high  # everything is persisted in the simulator
        if start > end or start > high:
            self.cluster.note("stream_request", **req.journal, decision="error", status=int(Status.ERANGE))
            self._reply(req.d, Status.ERANGE, now=now)
            return
        old = self.streams.get((req.vbid, req.sid))
        if old is not None:  # a dead stream: replaced, with what it still had queued (its STREAM_END too)
            self._journal(old, ("stream_replaced", {"dropped": len(old.queue), "reason": old.end_status}))
            old.queue.clear()
            self._finish(old)
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
            backfill_end=high if start < high else 0,
            last_queued=start,
            snap_start=req.snap_start,
            client_purge=req.client_purge,
            collection_filter="collections" in req.obj,
        )
        self.streams[st.key] = st
        self.streams_opened += 1
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
        if st is None:
            # producer.cc closeStream: an unknown stream id on a vbucket that has streams
            vb_found = any(k[0] == vbid for k in self.streams)
            status = Status.DCP_STREAM_ID_INVALID if sid is not None and vb_found else Status.KEY_ENOENT
        else:
            status = Status.KEY_ENOENT if st.dead else Status.SUCCESS
        self.cluster.note("close_stream", conn=self.serial, name=self.dcp_name, vb=vbid, sid=sid, status=int(status))
        self._reply(d, status, now=now)
        if st is None or status != Status.SUCCESS:
            return
        if control_on("send_stream_end_on_client_close_stream", self.controls):
            self._end(st, _END.CLOSED)  # what is queued still goes, then STREAM_END(Closed)
        else:
            st.queue.clear()  # erased at once: nothing follows the close response
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
            self._reply(d, Status.EINVAL, now=now)  # acks need consumer_name (full sync replication); answered with errors only
        elif self.bucket is not None and vbid >= len(self.bucket.vbuckets):
            self._reply(d, Status.NOT_MY_VBUCKET, now=now)

    def _stream_response(self, d: Dissection, now: float) -> None:
        """A response from the consumer (other than to a noop): a takeover's SET_VBUCKET_STATE ack or a marker ack.

        The stream is found by the response's opaque (producer.cc ``handleResponse``);
        other responses are ignored.
        """
        op = d.frame.opcode
        if op not in (Opcode.DCP_SET_VBUCKET_STATE, Opcode.DCP_SNAPSHOT_MARKER):
            return
        st = next((s for s in self.streams.values() if s.opaque == d.frame.opaque and not s.dead), None)
        if st is None:
            return
        if op == Opcode.DCP_SNAPSHOT_MARKER:
            st.marker_acks = max(0, st.marker_acks - 1)
            self._journal(st, ("marker_ack", {"waiting": st.marker_acks}))
        elif st.takeover in ("pending", "active"):
            self._takeover_ack(st, now)

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
            self.cluster.note("set_state", bucket=b.name, vb=st.vb, state=_DEAD, by="takeover")
            self._queue(
                st,
                encode("DCP_SET_VBUCKET_STATE", extras={"state": _ACTIVE}, vbucket=st.vb, opaque=st.opaque),
                "state",
                note=("set_vbucket_state", {"state": _ACTIVE}),
            )
            self.cluster.changed()
        elif st.takeover == "active":
            st.takeover = "done"
            self._end(st, _END.OK)

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
                    self._fill(st, now)
                if not st.queue:
                    continue
                if self._window_full():
                    self._note_blocked(now)
                    return  # the producer pauses: nothing ends because the consumer stopped acking
                q = st.queue.popleft()
                self._send(q.frame, now)
                if q.what == "item":
                    self.items_sent += 1
                if q.note is not None:
                    self._journal(st, q.note)
                self.bytes_outstanding += q.size if self.buffer_size > 0 else 0
                budget -= len(q.frame)
                progressed = True
                if q.what == "end":
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

    # --- time and scenario controls --------------------------------------------------------
    def end_slow_streams(self, now: float) -> None:
        """End Slow every stream whose backfill made no progress under disk pressure for the cluster's ``backfill_idle_limit``.

        kv_engine ``DCPBackfillDiskToStream::isSlow``; takeover streams are immune.
        The STREAM_END(Slow) is queued like any message (it waits behind a full window).
        """
        b = self.bucket
        if b is None or not b.disk_pressure_on:
            return
        for st in list(self.streams.values()):
            if st.dead or st.flags & _SR.TAKEOVER or st.stalled_since is None or st.backfill_end <= st.last_queued:
                continue
            if now - st.stalled_since >= self.cluster.backfill_idle_limit:
                self._end(st, _END.SLOW, stalled=now - st.stalled_since)

    def drop_cursors(self, vbucket: int | None = None) -> int:
        """Memory pressure dropped the cursors of this connection's in-memory streams (of ``vbucket``, or all).

        Only if the connection allows cursor dropping.  The streams do not end: their
        next data comes from a disk backfill.  Returns how many streams were switched.
        """
        if not self.cursor_dropping:
            return 0
        n = 0
        for st in self.streams.values():
            if st.dead or st.backfilling or st.cursor_dropped or (vbucket is not None and st.vb != vbucket):
                continue
            st.cursor_dropped = True
            self._journal(st, ("cursor_dropped", {"seqno": st.last_queued}))
            n += 1
        return n

    def disconnect_streams(self, reason: str) -> None:
        """The connection is going: every stream ends Disconnected, which is never sent (journaled with ``reason``)."""
        for st in list(self.streams.values()):
            if not st.ended:
                st.dead = False  # a dead stream's pending STREAM_END is lost with the connection too
                self._end(st, _END.DISCONNECTED, why=reason)
        self.streams.clear()


#: the checks of a DCP_STREAM_REQ before the rollback rule, in kv_engine's order
_STREAM_REQ_CHECKS: tuple[Callable[[StreamingMixin, StreamRequest, Bucket], int | None], ...] = (
    StreamingMixin._check_validator,
    StreamingMixin._check_privileges,
    StreamingMixin._check_vbucket,
    StreamingMixin._check_ranges,
    StreamingMixin._check_stream_id,
    StreamingMixin._filter,
    StreamingMixin._check_exists,
)
