"""What a simulated producer stream sends next: backfills, memory snapshots, OSO, and the stream's end.

:class:`SnapshotsMixin` fills a :class:`ProducerStream`'s queue (its readyQ) one
snapshot at a time when the queue is empty; :mod:`.producer_streams` moves the
queue to the wire.  The rules follow kv_engine's ``ActiveStream``
(engines/ep/src/dcp/active_stream.cc) and its disk backfill
(backfill_by_seqno_disk.cc):

1. A stream starting below the vbucket's high seqno first backfills from disk:
   one disk snapshot up to the high seqno at request time, the *whole* snapshot
   even when the stream's end seqno lies inside it.  Under disk pressure
   (:meth:`~dcpinspect.live.cluster.Bucket.disk_pressure`) a backfill makes no
   progress; an armed failure (:meth:`~dcpinspect.live.cluster.Bucket.fail_backfills`)
   ends the stream BackfillFail; a purge seqno that passed the backfill's start
   ends it Rollback (sent as StateChanged).
2. Memory snapshots follow checkpoints of ``Cluster.checkpoint_items`` seqnos
   (a snapshot never crosses a multiple of it); the first one after a backfill,
   and each that opens a checkpoint, carries the Checkpoint flag.
3. Inside a snapshot each key appears once, in its newest version.  A marker
   ends at the last item sent (a memory marker always; a disk marker for a
   client without collections or sync writes, MB-47437); a collection client's
   disk marker ends at the snapshot end and a SEQNO_ADVANCED closes the gap, as
   it does for prepares hidden from a client without sync writes.  Items a
   collection filter rejects produce neither marker nor SEQNO_ADVANCED.
4. The first marker of a stream starts at min(requested snap_start, its start).
5. Takeover streams' memory markers carry the Ack flag; the producer sends the
   SET_VBUCKET_STATE only once every such marker was acknowledged.
6. A stream ended for any reason keeps what is already queued (except a backfill
   in progress, which is dropped) and then sends STREAM_END; Disconnected is
   never sent.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from ..protocol.enums import OsoFlag, SnapshotFlag, StreamEndStatus, StreamReqFlag, SystemEvent, VBucketState
from ..protocol.rules import flow_control_size
from ..wire.encode import encode
from .cluster import Bucket, HistoryItem, VBucket
from .producer_frames import StreamFormat, item_frame, item_note, marker_frame

if TYPE_CHECKING:
    from .cluster import Cluster

__all__ = ["ProducerStream", "Queued", "SnapshotsMixin"]

_SR = StreamReqFlag
_END = StreamEndStatus
_PENDING = int(VBucketState.PENDING)
_SCOPE_EVENTS = frozenset(int(e) for e in (SystemEvent.CREATE_SCOPE, SystemEvent.DROP_SCOPE))
_DISK_SNAPSHOT = int(SnapshotFlag.DISK | SnapshotFlag.CHECKPOINT)
_MEMORY, _CHECKPOINT, _ACK = int(SnapshotFlag.MEMORY), int(SnapshotFlag.CHECKPOINT), int(SnapshotFlag.ACK)
_OSO_START, _OSO_END = int(OsoFlag.START), int(OsoFlag.END)
_OOO_CONTROL = "enable_out_of_order_snapshots"


class Queued(NamedTuple):
    """One message in a stream's queue."""

    frame: bytes
    #: what it costs against the flow-control window
    size: int
    #: "marker", "item", "sa", "oso", "state" or "end"
    what: str
    #: the journal entry noted when it is sent
    note: tuple[str, dict[str, Any]] | None
    #: part of a backfill (dropped if the stream ends before it is sent)
    disk: bool = False


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
    #: a pending backfill up to this seqno (0: none)
    backfill_end: int
    last_queued: int = 0
    first_marker: bool = True
    #: the request's snapshot start (the first marker starts at min(this, its start))
    snap_start: int = 0
    #: the request's ``purge_seqno`` (the backfill's rollback check compares it too)
    client_purge: int = 0
    #: the stream's collection filter was a ``collections`` list (not a scope)
    collection_filter: bool = False
    queue: deque[Queued] = field(default_factory=deque)
    #: set dead (kv_engine's Dead state): the queue drains, then STREAM_END; a new request replaces it
    dead: bool = False
    #: STREAM_END sent (or never to be sent): gone from the connection
    ended: bool = False
    end_status: int | None = None
    takeover: str = ""  # "", "pending" (waiting for ack 1), "active" (waiting for ack 2), "done"
    #: the next memory snapshot carries the Checkpoint flag (stream start, after a backfill)
    checkpoint_next: bool = True
    #: takeover markers sent with the Ack flag and not acknowledged yet
    marker_acks: int = 0
    #: when the pending backfill was first seen stalled (disk pressure)
    stalled_since: float | None = None
    #: the cursor was dropped: the next data comes from a backfill
    cursor_dropped: bool = False

    @property
    def key(self) -> tuple[int, int | None]:
        """(vbucket, sid)."""
        return (self.vb, self.sid)

    @property
    def backfilling(self) -> bool:
        """A backfill is pending, or its messages are still queued."""
        return self.backfill_end > self.last_queued or any(q.disk for q in self.queue)


class SnapshotsMixin:
    """Filling a stream's queue (mixed into :class:`~dcpinspect.live.producer_streams.StreamingMixin`)."""

    # --- supplied by the connection -------------------------------------------------------
    cluster: Cluster
    bucket: Bucket | None
    serial: int
    user: str | None
    node: int = 0
    streams: dict[tuple[int, int | None], ProducerStream]

    @property
    def dcp_name(self) -> str | None:
        """The DCP_OPEN name."""
        raise NotImplementedError

    @property
    def collections(self) -> bool:
        """HELLO Collections was accepted."""
        raise NotImplementedError

    @property
    def sync_writes(self) -> bool:
        """``enable_sync_writes`` was accepted."""
        raise NotImplementedError

    @property
    def controls(self) -> dict[str, str]:
        """The DCP_CONTROL keys accepted."""
        raise NotImplementedError

    def _format(self) -> StreamFormat:
        raise NotImplementedError

    # --- the stream's end ------------------------------------------------------------------
    def _end_wire(self, status: int) -> int:
        """The status a stream end goes out with (kv_engine ``StreamEndResponse`` / ``mapEndStreamStatus``)."""
        if status == _END.ROLLBACK:
            return int(_END.STATE_CHANGED)
        if not self.collections and status in (_END.FILTER_EMPTY, _END.LOST_PRIVILEGES):
            return int(_END.OK)
        return int(status)

    def _end(self, st: ProducerStream, status: int, **detail: Any) -> None:
        """Set the stream dead: what is queued still goes (a backfill's messages do not), then STREAM_END.

        Disconnected is never sent: the stream is journaled and gone.
        """
        if st.dead:
            return
        st.dead = True
        st.end_status = int(status)
        if st.backfilling:
            st.queue = deque(q for q in st.queue if not q.disk)  # kv_engine clears the readyQ of a backfilling stream
            st.backfill_end = 0
        if status == _END.DISCONNECTED:
            self._journal(st, ("stream_end", {"status": None, "reason": int(status), **detail}))
            st.queue.clear()
            self._finish(st)
            return
        raw = encode("DCP_STREAM_END", extras={"status": self._end_wire(status)}, vbucket=st.vb, opaque=st.opaque, stream_id=st.sid)
        self._queue(st, raw, "end", note=("stream_end", {"status": self._end_wire(status), "reason": int(status), **detail}))

    def _finish(self, st: ProducerStream) -> None:
        st.ended = st.dead = True
        if self.streams.get(st.key) is st:
            del self.streams[st.key]

    def _journal(self, st: ProducerStream, note: tuple[str, dict[str, Any]]) -> None:
        self.cluster.note(note[0], conn=self.serial, name=self.dcp_name, vb=st.vb, sid=st.sid, **note[1])

    def _queue(
        self, st: ProducerStream, raw: bytes, what: str, note: tuple[str, dict[str, Any]] | None = None, *, disk: bool = False
    ) -> None:
        st.queue.append(Queued(raw, flow_control_size(raw[0], raw[1], len(raw)), what, note, disk))

    # --- filling ---------------------------------------------------------------------------
    def _fill(self, st: ProducerStream, now: float) -> None:
        """Queue the stream's next snapshot, or its end, or (takeover) its DCP_SET_VBUCKET_STATE."""
        b = self.bucket
        assert b is not None
        if st.dead:
            return
        vb = b.vbuckets[st.vb]
        if vb.generation != st.generation:
            self._end(st, _END.STATE_CHANGED)
        elif self.user is not None and self.user in b.revoked:
            self._end(st, _END.LOST_PRIVILEGES)
        elif st.takeover in ("pending", "active"):
            return  # waiting for the consumer's SET_VBUCKET_STATE ack
        elif st.backfill_end > st.last_queued:
            self._run_backfill(st, vb, b, now)
        elif st.filtered and st.cids is not None and not st.cids & set(b.manifest.collections) and st.last_queued >= vb.high_seqno:
            self._end(st, _END.FILTER_EMPTY)
        elif st.last_queued >= st.end:
            self._end(st, _END.OK)
        elif vb.high_seqno <= st.last_queued:
            self._takeover_state(st)
        elif st.cursor_dropped:
            st.cursor_dropped = False
            st.backfill_end = vb.high_seqno
            self._run_backfill(st, vb, b, now)
        else:
            c = max(1, self.cluster.checkpoint_items)
            lo = st.last_queued
            self._memory_snapshot(st, vb, lo, min(vb.high_seqno, (lo // c + 1) * c), new_checkpoint=lo % c == 0)

    def _takeover_state(self, st: ProducerStream) -> None:
        """A takeover stream that sent everything: DCP_SET_VBUCKET_STATE(pending) once every Ack marker was acknowledged."""
        if not st.flags & _SR.TAKEOVER or st.marker_acks or st.takeover:
            return
        raw = encode("DCP_SET_VBUCKET_STATE", extras={"state": _PENDING}, vbucket=st.vb, opaque=st.opaque)
        self._queue(st, raw, "state", note=("set_vbucket_state", {"state": _PENDING}))
        st.takeover = "pending"

    def _run_backfill(self, st: ProducerStream, vb: VBucket, b: Bucket, now: float) -> None:
        """The pending backfill: stalled (disk pressure), failed, overtaken by a purge (Rollback), or scanned."""
        if b.disk_pressure_on:
            if st.stalled_since is None:
                st.stalled_since = now
            return
        st.stalled_since = None
        if b.take_backfill_failure(st.vb):
            self._journal(st, ("backfill_failed", {"start": st.last_queued + 1, "end": st.backfill_end}))
            self._end(st, _END.BACKFILL_FAIL)
            return
        start = st.last_queued + 1  # the backfill's start seqno (a stream from 0 backfills from 1)
        purge = 0 if st.flags & _SR.IGNORE_PURGED_TOMBSTONES else vb.purge_seqno
        exempt = False
        if st.cids is not None and st.start < purge:
            high = vb.collection_high_seqno(st.cids)
            exempt = st.start >= high and high <= purge
        if start != 1 and start <= purge and not exempt and st.client_purge != purge:
            self._end(st, _END.ROLLBACK, purge_seqno=purge)  # backfill_by_seqno_disk.cc: "startSeqno < purgeSeqno"
            return
        self._backfill(st, vb, b)

    def _visible(self, st: ProducerStream, r: HistoryItem) -> bool:
        """Whether the stream sends this item."""
        if r.kind == "system":
            if not self.collections:
                return False
            if r.event in _SCOPE_EVENTS:
                return not st.filtered
            return st.cids is None or r.cid in st.cids
        if st.cids is not None and r.cid not in st.cids:
            return False
        if r.kind in ("prepare", "abort"):
            return self.sync_writes
        return True

    def _hidden_for(self, st: ProducerStream, r: HistoryItem) -> bool:
        """An item of the stream's collections it does not send (a prepare/abort without sync writes): SEQNO_ADVANCED covers it."""
        return r.kind in ("prepare", "abort") and not self.sync_writes and (st.cids is None or r.cid in st.cids)

    def _dedup(self, recs: list[HistoryItem]) -> list[HistoryItem]:
        latest: dict[tuple[Any, ...], HistoryItem] = {}
        for r in recs:
            latest[r.dedup_key] = r  # each key at most once per snapshot, in its newest version
        return sorted(latest.values(), key=lambda r: r.seqno)

    def _first_start(self, st: ProducerStream, start: int) -> int:
        """The first marker of a stream starts at min(requested snap_start, its start) (active_stream.cc ``adjustStartIfFirstSnapshot``)."""
        if st.first_marker:
            st.first_marker = False
            return min(st.snap_start, start)
        return start

    def _backfill(self, st: ProducerStream, vb: VBucket, b: Bucket) -> None:
        """Queue the disk snapshot (last_queued, backfill_end]."""
        lo, hi = st.last_queued, st.backfill_end
        live = set(b.manifest.collections)
        recs = [r for r in vb.records(lo, hi) if r.kind == "system" or r.cid in live]
        recs = self._dedup(recs)
        items = [r for r in recs if self._visible(st, r)]
        st.last_queued, st.backfill_end, st.checkpoint_next = hi, 0, True
        initial = st.first_marker
        ooo = self.controls.get(_OOO_CONTROL)
        if initial and st.start == 0 and ooo in ("true", "true_with_seqno_advanced") and st.filtered and len(st.cids or ()) == 1:
            if items:
                st.first_marker = False
                self._oso_snapshot(st, items, hi, seqno_advanced=ooo == "true_with_seqno_advanced")
            return
        if self.collections:
            if st.cids is not None and vb.collection_high_seqno(st.cids) <= lo:
                return  # nothing of the filter's collections: no backfill at all
            end = hi
        elif self.sync_writes:
            if b.manifest.uid != 0:
                # markLegacyDiskSnapshot: sync writes + legacy filtering cannot find the snapshot's end
                self._end(st, _END.BACKFILL_FAIL, why="sync writes on a legacy stream of a bucket with collections")
                return
            end = hi
        else:
            end = items[-1].seqno if items else lo  # MB-47437: a legacy client's disk snapshot ends at what it can reach
            if not items:
                return  # nothing visible: no marker at all
        fmt = self._format()
        start = self._first_start(st, lo + 1)
        raw, version = marker_frame(fmt, vb, start, end, _DISK_SNAPSHOT, disk=True, vbucket=st.vb, opaque=st.opaque, stream_id=st.sid)
        note = ("marker", {"start": start, "end": end, "flags": _DISK_SNAPSHOT, "version": version})
        self._queue(st, raw, "marker", note=note, disk=True)
        for r in items:
            self._item(st, fmt, r, disk=True)
        if self.collections and (not items or items[-1].seqno < end):
            self._seqno_advanced(st, end, disk=True)  # the snapshot ends on seqnos this stream does not see

    def _memory_snapshot(self, st: ProducerStream, vb: VBucket, lo: int, hi: int, *, new_checkpoint: bool) -> None:
        """Queue one memory snapshot of the items in (lo, hi]: it ends at the last item sent."""
        recs = self._dedup(vb.records(lo, hi))
        items = [r for r in recs if self._visible(st, r)]
        hidden = [r.seqno for r in recs if self._hidden_for(st, r)] if self.collections else []
        st.last_queued = hi
        checkpoint = st.checkpoint_next or new_checkpoint
        if not items and not hidden:
            return  # nothing for this stream (the Checkpoint flag waits for the next marker)
        st.checkpoint_next = False
        fmt = self._format()
        if items:
            start = lo + 1 if checkpoint else items[0].seqno  # a checkpoint's marker starts at the checkpoint's start
            end = items[-1].seqno
        else:
            start = end = hidden[-1]  # only items it does not see: marker + SEQNO_ADVANCED (MB-48368)
        gap = bool(hidden) and hidden[-1] > end
        if gap:
            end = hidden[-1]
        start = self._first_start(st, start)
        flags = _MEMORY | (_CHECKPOINT if checkpoint else 0)
        if st.flags & _SR.TAKEOVER:
            flags |= _ACK
            st.marker_acks += 1
        raw, version = marker_frame(fmt, vb, start, end, flags, disk=False, vbucket=st.vb, opaque=st.opaque, stream_id=st.sid)
        self._queue(st, raw, "marker", note=("marker", {"start": start, "end": end, "flags": flags, "version": version}))
        for r in items:
            self._item(st, fmt, r)
        if gap or not items:
            self._seqno_advanced(st, end)

    def _oso_snapshot(self, st: ProducerStream, items: list[HistoryItem], hi: int, *, seqno_advanced: bool) -> None:
        """An out-of-order backfill of one collection: OSO start, the items in key order, [SEQNO_ADVANCED], OSO end."""
        fmt = self._format()
        common: dict[str, Any] = {"vbucket": st.vb, "opaque": st.opaque, "stream_id": st.sid}
        start = encode("DCP_OSO_SNAPSHOT", extras={"flags": _OSO_START}, **common)
        self._queue(st, start, "oso", note=("oso", {"flags": _OSO_START}), disk=True)
        for r in sorted(items, key=lambda r: r.key):
            self._item(st, fmt, r, disk=True)
        if seqno_advanced and max(r.seqno for r in items) < hi:
            self._seqno_advanced(st, hi, disk=True)  # before the end marker (active_stream.cc completeBackfillInner)
        end = encode("DCP_OSO_SNAPSHOT", extras={"flags": _OSO_END}, **common)
        self._queue(st, end, "oso", note=("oso", {"flags": _OSO_END}), disk=True)

    def _seqno_advanced(self, st: ProducerStream, seqno: int, *, disk: bool = False) -> None:
        raw = encode("DCP_SEQNO_ADVANCED", extras={"seqno": seqno}, vbucket=st.vb, opaque=st.opaque, stream_id=st.sid)
        self._queue(st, raw, "sa", note=("item", {"opcode": "DCP_SEQNO_ADVANCED", "seqno": seqno}), disk=disk)

    def _item(self, st: ProducerStream, fmt: StreamFormat, r: HistoryItem, *, disk: bool = False) -> None:
        name, raw = item_frame(fmt, r, vbucket=st.vb, opaque=st.opaque, sid=st.sid)
        self._queue(st, raw, "item", note=item_note(name, r), disk=disk)
