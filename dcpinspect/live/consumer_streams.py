"""The consumer's streams: each vbucket's stream state, and what the producer's stream messages do to it.

:class:`Streams` is the streaming half of :class:`~dcpinspect.live.consumer.DcpConsumer`:
it holds one :class:`StreamInfo` per vbucket, builds the stream requests, follows
the rollback protocol, tracks snapshots and seqnos, and commits a vbucket's
position to the :class:`~dcpinspect.live.resume.ResumeState` at each consistent
point (kv_engine's ``docs/dcp``; REFERENCE.md has each message's layout).

1. A stream is in one :class:`~.consumer_states.StreamStatus` and moves only along
   :data:`~.consumer_states.STREAM_TRANSITIONS` (:meth:`StreamInfo.move`).
2. A producer message is routed by its opcode through
   :data:`STREAM_MESSAGE_HANDLERS`, which covers every stream message of
   :data:`~dcpinspect.protocol.session.STREAM_MESSAGES`.
3. The position is committed only where the stream could resume without losing
   anything: a complete snapshot, an OSO end, a stream end, a rollback.
4. Each stream-end reason has its documented action, read from
   :data:`~dcpinspect.protocol.session.STREAM_END_REREQUEST` (request again from the
   resume point) and :data:`~dcpinspect.protocol.session.STREAM_END_NORMAL` (stop).
   When the connection follows the cluster map, a StateChanged end (a Rollback arrives
   as one) and a NOT_MY_VBUCKET reply first ask where the vbucket lives now
   (:attr:`~.consumer_states.StreamStatus.LOCATING`); a vbucket active on another node
   is handed over (:class:`Handoff`) to the connection to that node.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..protocol import spec
from ..protocol.enums import Opcode, OsoFlag, SnapshotFlag, Status
from ..protocol.rules import MAX_SEQNO
from ..protocol.session import SEQNO_FIELD, STREAM_END_NEVER_SENT, STREAM_END_NORMAL, STREAM_END_RELOCATE, STREAM_END_REREQUEST
from ..wire.dissection import Dissection
from .consumer_states import FINISHED, STREAM_TRANSITIONS, ConsumerEvent, StreamStatus, TransitionError, server_text, status_text
from .resume import ResumeState, VbState
from .tap import format_endpoint

__all__ = ["STREAM_MESSAGE_HANDLERS", "Handoff", "StreamInfo", "Streams", "need"]

_ = Opcode
#: the event kind of each item message
_ITEM_KIND: Mapping[int, str] = {
    int(op): op.name.removeprefix("DCP_").lower()
    for op in (_.DCP_MUTATION, _.DCP_DELETION, _.DCP_EXPIRATION, _.DCP_PREPARE, _.DCP_SYSTEM_EVENT, _.DCP_COMMIT, _.DCP_ABORT)
}
_ACK = int(SnapshotFlag.ACK)
_SUCCESS = int(Status.SUCCESS)
_SET_VBUCKET_STATE = int(Opcode.DCP_SET_VBUCKET_STATE)
_ROLLBACK = int(Status.ROLLBACK)
_OSO_START = int(OsoFlag.START)
_OSO_END = int(OsoFlag.END)
_NOT_MY_VBUCKET = int(Status.NOT_MY_VBUCKET)


@dataclass
class StreamInfo:
    """One vbucket's stream as the consumer sees it (live, not the persisted state)."""

    vbucket: int
    position: VbState
    status: StreamStatus = StreamStatus.PENDING
    opaque: int = 0
    sid: int | None = None
    end_seqno: int = MAX_SEQNO
    high_seqno: int | None = None
    start_seqno: int = 0
    end_reason: str | None = None
    error: str | None = None
    rollbacks: int = 0
    rerequests: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    # snapshot being received: (start, end, flags), and the opaque of a marker that wants an ack
    marker: tuple[int, int, int] | None = None
    marker_ack: int | None = None
    oso: bool = False
    oso_before: int = 0
    oso_max: int = 0
    retries_in_a_row: int = 0
    requested_at: float = 0.0  # when the pending stream request was sent
    moves: int = 0  # times the stream moved to another node

    @property
    def finished(self) -> bool:
        """Ended or failed."""
        return self.status in FINISHED

    def move(self, to: StreamStatus) -> None:
        """Change the status (only along :data:`STREAM_TRANSITIONS`)."""
        if to not in STREAM_TRANSITIONS[self.status]:
            raise TransitionError(f"vb {self.vbucket}: stream {self.status} -> {to} is not in STREAM_TRANSITIONS")
        self.status = to


@dataclass(frozen=True)
class Handoff:
    """A vbucket's stream leaving this connection for ``address``, the node the cluster map names active.

    ``position`` is where it resumes there (the last consistent point); the rest
    carries the stream's history on (counters, the retry budget, a to-latest end).
    """

    vbucket: int
    address: tuple[str, int]
    position: VbState
    high_seqno: int | None = None
    counts: Counter[str] = field(default_factory=Counter)
    rollbacks: int = 0
    rerequests: int = 0
    retries_in_a_row: int = 0
    moves: int = 0


class Streams:
    """The streams of one consumer connection and their committed resume state.

    ``send(name, **fields)`` queues a frame for the server (built with :func:`~dcpinspect.wire.encode`).
    """

    def __init__(
        self,
        committed: ResumeState,
        send: Callable[..., None],
        *,
        stream_ids: bool = False,
        max_rollbacks: int = 20,
        to_latest: bool = False,
        end_seqno: int = MAX_SEQNO,
        flags: int = 0,
        value: Mapping[str, Any] | None = None,
    ) -> None:
        self.committed = committed
        self.streams: dict[int, StreamInfo] = {}
        self.by_opaque: dict[int, StreamInfo] = {}
        self.max_rollbacks = max_rollbacks
        self._send = send
        self._stream_ids = stream_ids
        self._to_latest = to_latest
        self._end_seqno = end_seqno
        self._flags = flags
        self._value = dict(value or {})
        self._closing_since = 0.0
        #: the connection follows the cluster map: StateChanged and NOT_MY_VBUCKET locate the vbucket first
        self.follow_map = False

    def add(self, vb: int) -> None:
        """A stream for vbucket ``vb``, starting where the committed state says."""
        pos = copy.deepcopy(self.committed.vbuckets.get(vb, VbState()))
        self.streams[vb] = StreamInfo(vb, pos, sid=vb + 1 if self._stream_ids else None)

    def adopt(self, h: Handoff) -> StreamInfo:
        """Take over the stream ``h`` hands over (from the connection to the node it left): it starts pending."""
        self.committed.vbuckets[h.vbucket] = copy.deepcopy(h.position)
        st = StreamInfo(h.vbucket, copy.deepcopy(h.position), sid=h.vbucket + 1 if self._stream_ids else None)
        st.high_seqno, st.counts = h.high_seqno, Counter(h.counts)
        st.rollbacks, st.rerequests, st.retries_in_a_row, st.moves = h.rollbacks, h.rerequests, h.retries_in_a_row, h.moves
        old = self.streams.get(h.vbucket)
        if old is not None:
            self.by_opaque.pop(old.opaque, None)
        self.streams[h.vbucket] = st
        return st

    def hand_over(self, st: StreamInfo, address: tuple[str, int], events: list[ConsumerEvent]) -> Handoff:
        """``st`` moves to the connection to ``address``: it is MOVED here and leaves the committed state."""
        st.move(StreamStatus.MOVED)
        self.by_opaque.pop(st.opaque, None)
        self.committed.vbuckets.pop(st.vbucket, None)
        h = Handoff(
            st.vbucket,
            address,
            copy.deepcopy(st.position),
            st.high_seqno,
            Counter(st.counts),
            st.rollbacks,
            st.rerequests,
            st.retries_in_a_row + 1,
            st.moves + 1,
        )
        host, port = address
        events.append(ConsumerEvent("moved", f"now active on {format_endpoint((host, port))}", st.vbucket, {"handoff": h}))
        return h

    def locate(self, st: StreamInfo) -> None:
        """``st`` waits for the cluster map to say where its vbucket lives."""
        st.move(StreamStatus.LOCATING)
        self.by_opaque.pop(st.opaque, None)
        st.marker = None
        st.marker_ack = None
        st.oso = False

    # --- the stream's life --------------------------------------------------------
    def startable(self, events: list[ConsumerEvent]) -> Iterator[StreamInfo]:
        """The streams to request as streaming starts, in order (a to-latest stream the server did not list fails)."""
        for st in self.streams.values():
            if self._to_latest and st.high_seqno is None:
                self.fail(st, "vbucket not listed by the server (not on this node?)", events)
            else:
                yield st

    def request(self, st: StreamInfo, opaque: int, now: float, sids_on: bool, events: list[ConsumerEvent]) -> None:
        """Send ``st``'s stream request from its position (a complete snapshot is start = snap_start = snap_end)."""
        pos = st.position
        if not pos.snap_start <= pos.seqno <= pos.snap_end:
            # a position outside its own snapshot (a damaged state file) is not to be trusted; claiming a finished
            # snapshot (seqno-seqno) could skip a rollback it needs (kv_engine rollback.md), so the safe resume is 0
            why = f"resume position seqno {pos.seqno} lies outside its snapshot {pos.snap_start}-{pos.snap_end}: streaming again from 0"
            events.append(ConsumerEvent("resume_reset", why, st.vbucket, {"was": pos.to_dict()}))
            pos = st.position = VbState()
        end = self._end_seqno
        if self._to_latest and st.high_seqno is not None:
            # the producer checks start <= end before the rollback check, so never ask for end < start
            end = max(st.high_seqno, pos.seqno)
        snap_start, snap_end = pos.snap_start, pos.snap_end
        value = dict(self._value)
        if sids_on and st.sid is not None:
            value["sid"] = st.sid
        st.move(StreamStatus.REQUESTED)
        st.opaque = opaque
        st.end_seqno = end
        st.start_seqno = pos.seqno
        st.marker = None
        st.marker_ack = None
        st.oso = False
        st.requested_at = now
        self.by_opaque[opaque] = st
        extras = {
            "flags": self._flags,
            "reserved": 0,
            "start_seqno": pos.seqno,
            "end_seqno": end,
            "vb_uuid": pos.vb_uuid,
            "snap_start_seqno": snap_start,
            "snap_end_seqno": snap_end,
        }
        self._send("DCP_STREAM_REQ", extras=extras, vbucket=st.vbucket, opaque=opaque, value=json.dumps(value).encode() if value else None)
        what = f"start {pos.seqno} end {end} uuid 0x{pos.vb_uuid:016x} snapshot {snap_start}..{snap_end}"
        events.append(ConsumerEvent("stream_requested", what, st.vbucket, extras))

    def on_reply(self, st: StreamInfo, d: Dissection, events: list[ConsumerEvent]) -> bool:
        """The reply to ``st``'s stream request; whether to request again (after a rollback, or once located)."""
        status = d.frame.status
        if status == _SUCCESS:
            self.accepted(st, d, events)
            return False
        if status == _NOT_MY_VBUCKET and self.follow_map:
            st.retries_in_a_row += 1
            if st.retries_in_a_row > self.max_rollbacks:
                self.fail(st, f"not my vbucket {st.retries_in_a_row - 1} times in a row; giving up", events, d)
                return False
            events.append(ConsumerEvent("rerequest", "not my vbucket: asking the cluster map where it lives", st.vbucket))
            self.locate(st)
            return True
        if status == _ROLLBACK:
            r = d.body.get("rollback_seqno")
            if isinstance(r, int):
                return self.rollback(st, r, events)
            self.fail(st, "rollback response without a rollback seqno", events, d)
            return False
        value = d.frame.value
        context = server_text(value.decode("utf-8", "replace")) if value else ""
        self.fail(st, f"stream request refused: {status_text(status)}" + (f" ({context})" if context else ""), events, d)
        return False

    def accepted(self, st: StreamInfo, d: Dissection, events: list[ConsumerEvent]) -> None:
        """The stream request succeeded: keep the server's failover log and resume with its newest uuid."""
        log = [(int(e["vb_uuid"]), int(e["vb_seqno"])) for e in d.body.get("failover_log", [])]
        if log:
            st.position.failover_log = log
            st.position.vb_uuid = log[0][0]
        else:
            events.append(ConsumerEvent("malformed", "stream accepted with an empty failover log", st.vbucket, dissection=d))
        st.move(StreamStatus.STREAMING)
        self.commit(st, events)
        events.append(
            ConsumerEvent(
                "stream_started",
                f"{len(log)} failover {'entry' if len(log) == 1 else 'entries'}, newest uuid 0x{st.position.vb_uuid:016x}",
                st.vbucket,
                {"failover_log": log},
            )
        )

    def rollback(self, st: StreamInfo, r: int, events: list[ConsumerEvent]) -> bool:
        """Roll back to ``r``, trim the failover log, take its newest remaining uuid; whether to request again."""
        pos = st.position
        before = pos.seqno
        st.rollbacks += 1
        st.retries_in_a_row += 1
        if r > pos.seqno:
            events.append(ConsumerEvent("malformed", f"rollback to {r}, above the requested start {pos.seqno}", st.vbucket))
        seqno = min(r, pos.seqno)
        log = [(u, s) for u, s in pos.failover_log if s <= seqno]
        if seqno == 0:
            log = []  # nothing left: ask as a fresh client (uuid 0 = no history)
        pos.failover_log = log
        pos.vb_uuid = log[0][0] if log else 0
        pos.seqno = pos.snap_start = pos.snap_end = seqno
        self.commit(st, events)
        data = {"rollback_seqno": r, "from_seqno": before, "vb_uuid": pos.vb_uuid, "failover_log": list(log)}
        events.append(ConsumerEvent("rollback", f"to {r} (from {before}); retrying with uuid 0x{pos.vb_uuid:016x}", st.vbucket, data))
        if st.retries_in_a_row > self.max_rollbacks:
            self.fail(st, f"gave up after {st.retries_in_a_row - 1} rollbacks in a row", events)
            return False
        return True

    def fail(self, st: StreamInfo, why: str, events: list[ConsumerEvent], d: Dissection | None = None) -> None:
        """That vbucket's stream failed (the others go on)."""
        st.move(StreamStatus.FAILED)
        st.error = why
        self.by_opaque.pop(st.opaque, None)
        events.append(ConsumerEvent("stream_failed", why, st.vbucket, dissection=d))

    def end(self, st: StreamInfo, reason: str, events: list[ConsumerEvent]) -> None:
        """The stream ended for good."""
        st.move(StreamStatus.ENDED)
        st.end_reason = reason
        self.by_opaque.pop(st.opaque, None)
        self.commit(st, events)

    def commit(self, st: StreamInfo, events: list[ConsumerEvent]) -> None:
        """``st``'s position is a consistent point: it goes into the resume state."""
        self.committed.vbuckets[st.vbucket] = copy.deepcopy(st.position)
        events.append(ConsumerEvent("checkpoint", f"seqno {st.position.seqno}", st.vbucket, {"seqno": st.position.seqno}))

    def close_all(self, now: float, events: list[ConsumerEvent], *, wait_for_end: bool, sids_on: bool) -> None:
        """Close every live stream (DCP_CLOSE_STREAM); with ``wait_for_end`` a streaming one awaits its STREAM_END."""
        for st in self.streams.values():
            if st.finished or st.status is StreamStatus.CLOSING:
                continue
            if st.status in (StreamStatus.STREAMING, StreamStatus.REQUESTED):
                self._send("DCP_CLOSE_STREAM", vbucket=st.vbucket, stream_id=st.sid if sids_on else None)
                if wait_for_end and st.status is StreamStatus.STREAMING:
                    st.move(StreamStatus.CLOSING)
                    self._closing_since = now
                    continue
            self.end(st, "Closed (by client)", events)

    def requests_timed_out(self, now: float, timeout: float, events: list[ConsumerEvent]) -> list[int]:
        """Fail the streams whose request went unanswered for ``timeout``; their opaques."""
        late = [st for st in self.streams.values() if st.status is StreamStatus.REQUESTED and now - st.requested_at > timeout]
        for st in late:
            self.fail(st, f"no reply to the stream request within {timeout:g} s", events)
        return [st.opaque for st in late]

    def closes_timed_out(self, now: float, timeout: float, events: list[ConsumerEvent]) -> None:
        """Closing streams whose STREAM_END did not come within ``timeout`` are closed all the same."""
        closing = [st for st in self.streams.values() if st.status is StreamStatus.CLOSING]
        if closing and now - self._closing_since > timeout:
            for st in closing:
                self.end(st, "Closed (by client; no STREAM_END within the response timeout)", events)

    def note_progress(self) -> None:
        """A streaming stream past its start made progress: its retry budget starts again."""
        for st in self.streams.values():
            if st.status is StreamStatus.STREAMING and st.retries_in_a_row and st.position.seqno > st.start_seqno:
                st.retries_in_a_row = 0

    # --- producer messages (STREAM_MESSAGE_HANDLERS) ----------------------------------
    def message(self, d: Dissection, events: list[ConsumerEvent]) -> StreamInfo | None:
        """A producer message (not a noop) for one of the streams; returns a stream to request again, if any."""
        frame = d.frame
        st = self.by_opaque.get(frame.opaque)
        if st is None or (frame.vbucket is not None and frame.vbucket != st.vbucket):
            why = f"{d.name} for no live stream (opaque 0x{frame.opaque:08x}, vb {frame.vbucket})"
            events.append(ConsumerEvent("unexpected", why, frame.vbucket, dissection=d))
            if frame.opcode == _SET_VBUCKET_STATE:  # the producer waits for the reply
                self._send("DCP_SET_VBUCKET_STATE", response=True, opaque=frame.opaque)
            return None
        if d.problems:
            events.append(ConsumerEvent("malformed", "; ".join(p.message for p in d.problems), st.vbucket, dissection=d))
        if st.status is StreamStatus.REQUESTED:  # messages before the stream-req response: the stream exists (full duplex)
            events.append(ConsumerEvent("unexpected", f"{d.name} before the stream request was answered", st.vbucket, dissection=d))
        handler = STREAM_MESSAGE_HANDLERS.get(frame.opcode)
        if handler is None:
            events.append(ConsumerEvent("unexpected", f"{d.name} request from the server ignored", st.vbucket, dissection=d))
            return None
        return handler(self, st, d, events)

    def on_marker(self, st: StreamInfo, d: Dissection, events: list[ConsumerEvent]) -> StreamInfo | None:
        """A snapshot starts: the previous one (if any) is over."""
        src = d.extras if "start_seqno" in d.extras else d.body  # v1: extras; v2.x: value
        start, end, flags = need(src, "start_seqno"), need(src, "end_seqno"), need(src, "flags")
        if end < start:
            events.append(ConsumerEvent("malformed", f"snapshot marker {start}..{end} ends before it starts", st.vbucket, dissection=d))
        if st.marker is not None:
            self._snapshot_complete(st, events)  # the producer moved on: a consistent point
        st.marker = (start, end, flags)
        st.marker_ack = d.frame.opaque if flags & _ACK else None
        st.counts["snapshot"] += 1
        names = "|".join(n for bit, n in spec.SNAPSHOT_FLAGS.items() if flags & bit) or "0"
        events.append(ConsumerEvent("snapshot", f"{start}..{end} ({names})", st.vbucket, {"start": start, "end": end, "flags": flags}, d))
        if end == st.position.seqno and start <= end:  # nothing in it we do not have (e.g. first marker of an empty range)
            self._snapshot_complete(st, events)
        return None

    def on_item(self, st: StreamInfo, d: Dissection, events: list[ConsumerEvent]) -> StreamInfo | None:
        """A seqno-carrying item (mutation, deletion, expiration, prepare, system event, commit, abort)."""
        op = d.frame.opcode
        kind, seqno = _ITEM_KIND[op], need(d.extras, SEQNO_FIELD[op])
        st.counts[kind] += 1
        if st.oso:
            st.oso_max = max(st.oso_max, seqno)  # key order inside an OSO snapshot: remember the highest
        elif seqno <= st.position.seqno:
            why = f"{kind} seqno {seqno} not above the last seqno {st.position.seqno}"
            events.append(ConsumerEvent("malformed", why, st.vbucket, dissection=d))
        events.append(ConsumerEvent(kind, d.key_text, st.vbucket, {"seqno": seqno}, d))
        if not st.oso:
            self._advance(st, seqno, events, d)
        return None

    def on_seqno_advanced(self, st: StreamInfo, d: Dissection, events: list[ConsumerEvent]) -> StreamInfo | None:
        """The seqno moved on with nothing to send (filtered out, or the end of an OSO backfill)."""
        seqno = need(d.extras, "seqno")
        st.counts["seqno_advanced"] += 1
        events.append(ConsumerEvent("seqno_advanced", str(seqno), st.vbucket, {"seqno": seqno}, d))
        if st.oso:
            st.oso_max = max(st.oso_max, seqno)
        elif st.marker is None:
            # outside a snapshot (e.g. after an OSO backfill): a resume point of its own
            st.position.seqno = st.position.snap_start = st.position.snap_end = max(st.position.seqno, seqno)
            self.commit(st, events)
        else:
            self._advance(st, seqno, events, d)
        return None

    def on_oso(self, st: StreamInfo, d: Dissection, events: list[ConsumerEvent]) -> StreamInfo | None:
        """An out-of-sequence-order snapshot starts or ends."""
        flags = need(d.extras, "flags")
        st.counts["oso"] += 1
        what = "start" if flags & _OSO_START else "end" if flags & _OSO_END else f"flags 0x{flags:x}"
        events.append(ConsumerEvent("oso", what, st.vbucket, {"flags": flags}, d))
        if flags & _OSO_START:
            st.oso = True
            st.oso_before = st.position.seqno  # the resume point if the stream breaks inside
            st.oso_max = st.position.seqno
        elif flags & _OSO_END and st.oso:
            st.oso = False
            pos = st.position
            pos.seqno = pos.snap_start = pos.snap_end = max(st.oso_max, pos.seqno)
            st.marker = None
            self.commit(st, events)
        return None

    def on_stream_end(self, st: StreamInfo, d: Dissection, events: list[ConsumerEvent]) -> StreamInfo | None:
        """The producer ended the stream; returns it if its reason calls for a new request."""
        status = need(d.extras, "status")
        name = spec.STREAM_END_STATUS.get(status, f"unknown {status}")
        if st.oso:  # broke inside an OSO snapshot: resume from before it
            st.oso = False
            st.position.seqno = st.position.snap_start = st.position.snap_end = st.oso_before
        elif st.marker is not None and st.position.seqno >= st.marker[1]:
            self._snapshot_complete(st, events)
        st.marker = None
        events.append(ConsumerEvent("stream_end", name, st.vbucket, {"status": status, "seqno": st.position.seqno}, d))
        if st.status is StreamStatus.CLOSING:  # the end of a stream we closed (Closed, or whatever ended it first)
            self.end(st, f"{name} (closed by client)", events)
        elif status in STREAM_END_REREQUEST:
            st.rerequests += 1
            st.retries_in_a_row += 1
            self.by_opaque.pop(st.opaque, None)
            self.commit(st, events)
            if st.retries_in_a_row > self.max_rollbacks:
                self.fail(st, f"stream ended {name} {st.retries_in_a_row - 1} times in a row; giving up", events)
                return None
            if self.follow_map and status in STREAM_END_RELOCATE:
                events.append(ConsumerEvent("rerequest", f"after {name}, where the cluster map says the vbucket lives", st.vbucket))
                self.locate(st)
            else:
                events.append(ConsumerEvent("rerequest", f"after {name}", st.vbucket))
            return st
        elif status in STREAM_END_NORMAL:
            self.end(st, name, events)
        elif status in STREAM_END_NEVER_SENT:  # the reason a stream ends when its connection goes: never on the wire
            events.append(ConsumerEvent("malformed", f"stream end {name}, which a server never sends", st.vbucket, dissection=d))
            st.end_reason = name
            self.commit(st, events)
            self.fail(st, f"stream ended: {name} (a reason never sent on the wire)", events)
        else:
            st.end_reason = name
            self.commit(st, events)
            self.fail(st, f"stream ended: {name}", events)
        return None

    def on_set_vbucket_state(self, st: StreamInfo, d: Dissection, events: list[ConsumerEvent]) -> StreamInfo | None:
        """A takeover step: the producer waits for the reply."""
        self._send("DCP_SET_VBUCKET_STATE", response=True, opaque=d.frame.opaque)
        state = d.extras.get("state", 0)
        events.append(ConsumerEvent("set_vbucket_state", str(spec.VBUCKET_STATES.get(state, state)), st.vbucket, dissection=d))
        return None

    def on_cache_transfer(self, st: StreamInfo, d: Dissection, events: list[ConsumerEvent]) -> StreamInfo | None:
        """Cache transfer messages are counted."""
        st.counts["cache_transfer"] += 1
        events.append(ConsumerEvent("cache_transfer", d.name, st.vbucket, dissection=d))
        return None

    def _advance(self, st: StreamInfo, seqno: int, events: list[ConsumerEvent], d: Dissection) -> None:
        pos = st.position
        if st.marker is None:
            events.append(ConsumerEvent("malformed", f"seqno {seqno} outside any snapshot", st.vbucket, dissection=d))
            pos.seqno = pos.snap_start = pos.snap_end = max(pos.seqno, seqno)
            return
        start, end, _flags = st.marker
        if not start <= seqno <= end:
            events.append(ConsumerEvent("malformed", f"seqno {seqno} outside its snapshot {start}..{end}", st.vbucket, dissection=d))
        pos.seqno = max(pos.seqno, seqno)
        pos.snap_start, pos.snap_end = min(start, pos.seqno), max(end, pos.seqno)
        if pos.seqno >= end:
            self._snapshot_complete(st, events)

    def _snapshot_complete(self, st: StreamInfo, events: list[ConsumerEvent]) -> None:
        pos = st.position
        if st.marker is not None and pos.seqno >= st.marker[1]:
            pos.snap_start = pos.snap_end = pos.seqno  # after a complete snapshot start = snap_start = snap_end
        if st.marker_ack is not None:  # the marker's Ack flag: reply once the whole snapshot is in
            self._send("DCP_SNAPSHOT_MARKER", response=True, opaque=st.marker_ack)
            st.marker_ack = None
        st.marker = None
        self.commit(st, events)


StreamMessageHandler = Callable[[Streams, StreamInfo, Dissection, list[ConsumerEvent]], "StreamInfo | None"]
#: the handler of each producer stream message, by opcode
STREAM_MESSAGE_HANDLERS: Mapping[int, StreamMessageHandler] = {
    _.DCP_SNAPSHOT_MARKER: Streams.on_marker,
    **dict.fromkeys(_ITEM_KIND, Streams.on_item),
    _.DCP_SEQNO_ADVANCED: Streams.on_seqno_advanced,
    _.DCP_OSO_SNAPSHOT: Streams.on_oso,
    _.DCP_STREAM_END: Streams.on_stream_end,
    _.DCP_SET_VBUCKET_STATE: Streams.on_set_vbucket_state,
    _.DCP_CACHE_TRANSFER: Streams.on_cache_transfer,
    _.DCP_CACHE_TRANSFER_END: Streams.on_cache_transfer,
}


def need(values: Mapping[str, Any], name: str) -> int:
    """The integer field ``name`` (``ValueError`` if the frame was too short to hold it)."""
    v = values.get(name)
    if not isinstance(v, int):
        raise ValueError(f"field {name} missing (frame too short)")
    return v
