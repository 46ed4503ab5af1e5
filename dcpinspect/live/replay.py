r"""Replay a capture's producer to a new client (sans-IO): "can I reproduce what the server did to my client?".

:class:`ReplayConnection` is the simulator's :class:`~dcpinspect.live.producer.ProducerConnection`
(bytes in with :meth:`~ReplayConnection.receive`, bytes out of
:meth:`~ReplayConnection.data_to_send`, time passed in, never read) whose
answers come from a :class:`~dcpinspect.live.replay_script.Script` recorded
from one connection of a capture (:func:`~dcpinspect.live.replay_script.extract_script`).
The rules:

1. A request equal to one the recorded client sent (opcode, key, extras,
   value, vbucket; a DCP_OPEN's name aside; each recorded request answers once) gets the recorded
   responses, byte for byte but for the opaque, which is the new client's.
   HELLO, DCP_OPEN, DCP_CONTROL, GET_ALL_VB_SEQNOS, failover logs and any other
   recorded command are answered so; what the answers negotiate (features,
   noops, the flow-control window) takes effect as the simulator's would.
2. Authentication is the new client's: SASL is the simulator's (PLAIN and
   SCRAM against ``users``, default ``Administrator:password``), because a
   recorded SCRAM exchange cannot be replayed (nonces and proofs are per
   connection) and captures mask SASL secrets.  SELECT_BUCKET accepts the
   recorded bucket's name.  GET_CLUSTER_CONFIG is the simulator's map of a
   one-node cluster at the replay's address with the recorded bucket's
   vbuckets (the recorded map names the recorded server, where a client
   following it would go).
3. A DCP_STREAM_REQ equal to a recorded one gets its recorded response
   (Success with the failover log, Rollback with its seqno, or the error);
   after a Success the recorded stream messages follow with the new opaque:
   ``pace="captured"`` each at its recorded delay after the response,
   ``pace="fast"`` as fast as the client's flow control allows.  Messages the
   recorded server sent after the recorded client's DCP_CLOSE_STREAM wait for
   the new client's close.
4. A request that differs is answered by the simulator's rules from the
   recorded state and reported as a :class:`Divergence` (what the client
   asked, what was recorded, what was answered): a stream request by the
   producer's checks, then :func:`~dcpinspect.protocol.rules.rollback_decision`
   on the vbucket's recorded failover log and high seqno (purge seqno 0: a
   capture does not show it); a Success streams the recorded snapshots and
   items above the requested start (up to its end seqno, then STREAM_END OK;
   the recorded end if the recording's stream ended first).  A vbucket the
   recording never streamed is the simulator's empty vbucket.  Other
   requests get the simulator's answer.
5. Flow control, buffer acks, noops (``enable_noop``; :meth:`tick`), stream
   closes and idle disconnects are the simulator's (:mod:`.producer_streams`),
   so the recorded stream is paced by the new client's window; the recorded
   server noops are not replayed.
6. :meth:`ReplayConnection.next_wakeup` says when :meth:`tick` has something
   to do (the next captured message, the next noop): an edge sleeps until
   then or until bytes arrive (fake clocks in tests).

>>> from dcpinspect.capture.read import read_records
>>> from dcpinspect.live.replay_script import extract_script
>>> script = extract_script(read_records("captures/live-plain.pcap"))
>>> script.conn, script.name, len(script.streams)
(1, 'live-plain', 4)
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ..protocol import spec
from ..protocol.enums import Opcode, Status, StreamEndStatus, StreamReqFlag
from ..protocol.rules import rollback_decision
from ..protocol.session import REQUEST_MAGICS, SESSION_OPS, control_on, parse_float, parse_u32
from ..wire.dissection import Dissection
from ..wire.encode import encode
from ..wire.events import Frame
from ..wire.render import safe_text
from .cluster import Cluster
from .producer import ProducerConnection
from .producer_snapshots import ProducerStream
from .producer_streams import StreamRequest
from .replay_script import Exchange, RecordedMessage, RecordedStream, Script, VbState, request_identity

__all__ = ["PACES", "Divergence", "Pace", "ReplayConnection", "ReplayStream"]

Pace = Literal["captured", "fast"]
#: how recorded stream messages are paced
PACES: tuple[str, ...] = ("captured", "fast")
#: requests answered only by the simulator's rules, never reported as divergences
_RULES_ONLY = frozenset(
    int(op)
    for op in (
        Opcode.SASL_LIST_MECHS,
        Opcode.SASL_AUTH,
        Opcode.SASL_STEP,
        Opcode.GET_CLUSTER_CONFIG,
        Opcode.NOOP,
        Opcode.QUIT,
        Opcode.DCP_NOOP,
        Opcode.DCP_BUFFER_ACKNOWLEDGEMENT,
        Opcode.DCP_SEQNO_ACKNOWLEDGED,
        Opcode.GET_ERROR_MAP,
    )
)
_PRE_AUTH = frozenset(int(op) for op in (Opcode.HELLO, Opcode.SASL_LIST_MECHS, Opcode.SASL_AUTH, Opcode.SASL_STEP, Opcode.GET_ERROR_MAP))
_OK = int(StreamEndStatus.OK)


@dataclass(frozen=True)
class Divergence:
    """A request that differs from the recording: what the client asked, what was recorded, what the replay answered."""

    #: seconds since the connection started (the edge's clock)
    at: float
    kind: str
    asked: str
    recorded: str
    answered: str

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (``--json``)."""
        return {"event": "divergence", **asdict(self)}

    def line(self) -> str:
        """One line: ``divergence: KIND: asked ...; recorded ...; answered ...``."""
        return f"divergence: {self.kind}: asked {self.asked}; recorded {self.recorded}; answered {self.answered}"


@dataclass
class ReplayStream(ProducerStream):
    """A stream whose messages come from the recording (:attr:`pending`, released as paced)."""

    pending: deque[RecordedMessage] = field(default_factory=deque)
    opened_at: float = 0.0
    #: the new client closed it: messages recorded after the recorded close may go
    client_closed: bool = False
    #: served by the rules (a differing request), not the recorded stream
    by_rule: bool = False


def with_opaque(raw: bytes, opaque: int) -> bytes:
    """``raw`` with the header's opaque replaced (the new client's)."""
    return raw[:12] + (opaque & 0xFFFFFFFF).to_bytes(4, "big") + raw[16:]


def _status_name(status: int) -> str:
    return spec.STATUS.get(status, f"0x{status:02x}")


class ReplayConnection(ProducerConnection):
    """One new client served from a recorded script (sans-IO; see the module's rules).

    Args:
        script: the recorded producer side of one connection.
        pace: ``captured`` (recorded delays) or ``fast`` (flow control only).
        users: user name -> password for SASL (default ``Administrator:password``).
        address: where the replay listens (the cluster map names it).
        now: the connection's start on the edge's clock.
        serial: the connection's number (a server counts its clients; default: the cluster's own, 1).
    """

    def __init__(
        self,
        script: Script,
        *,
        pace: Pace = "captured",
        users: dict[str, str] | None = None,
        address: tuple[str, int] | None = None,
        peer: str = "",
        now: float = 0.0,
        serial: int | None = None,
    ) -> None:
        if pace not in PACES:
            raise ValueError(f"pace must be one of {', '.join(PACES)}, not {pace!r}")
        cluster = Cluster(users if users is not None else {"Administrator": "password"})
        bucket = cluster.create_bucket(script.bucket or "default", vbuckets=script.vbucket_count, items=0)
        for vb, state in script.vbuckets.items():  # GET_ALL_VB_SEQNOS, GET_FAILOVER_LOG, STAT answer from the recorded state
            if vb < len(bucket.vbuckets):
                bucket.vbuckets[vb].high_seqno = state.high_seqno
                if state.failover_log:
                    bucket.vbuckets[vb].failover_log = list(state.failover_log)
        if address is not None:
            cluster.addresses[0] = address
        super().__init__(cluster, peer=peer, now=now)
        if serial is not None:  # the server's count of its clients (each replay has a cluster of its own)
            self.serial = serial
        self.script = script
        self.pace: Pace = pace
        self.started = now
        #: every divergence so far, in order
        self.divergences: list[Divergence] = []
        #: streams served from the recording, and by the rules
        self.replayed_streams = 0
        self.rule_streams = 0
        self._used_exchanges: set[int] = set()
        self._used_streams: set[int] = set()

    # --- dispatch -------------------------------------------------------------------
    def _handle(self, d: Dissection, now: float) -> None:
        f = d.frame
        op = f.opcode
        if f.magic not in REQUEST_MAGICS or (self.user is None and op not in _PRE_AUTH) or op in _RULES_ONLY:
            super()._handle(d, now)
        elif op == Opcode.HELLO:
            self._replay_hello(d, now)
        elif op == Opcode.SELECT_BUCKET:
            self._replay_select(d, now)
        elif op == Opcode.DCP_STREAM_REQ:
            self._replay_stream_req(d, now)
        elif op == Opcode.DCP_CLOSE_STREAM:
            self._replay_close(d, now)
        else:
            ex = self._take_exchange(d)
            if ex is not None:
                self._play(d, ex, now)
            else:
                self._by_rule(d, now, "request", self._recorded_like(d))

    def _take_exchange(self, d: Dissection) -> Exchange | None:
        ident = request_identity(d)
        for i, ex in enumerate(self.script.exchanges):
            if i not in self._used_exchanges and ex.identity == ident and ex.responses:
                self._used_exchanges.add(i)
                return ex
        return None

    def _recorded_like(self, d: Dissection) -> str:
        """What the recording holds of this command: the first recorded request with its opcode, or nothing."""
        same = [ex for ex in self.script.exchanges if ex.opcode == d.frame.opcode]
        if not same:
            return f"no {d.name}"
        ex = same[0]
        key = f" key {safe_text(ex.key)!r}" if ex.key else ""
        return f"{ex.name}{key} (frame {ex.frame})" + (f" and {len(same) - 1} more" if len(same) > 1 else "")

    def _play(self, d: Dissection, ex: Exchange, now: float) -> None:
        """Send the recorded responses with the new opaque; what they negotiate takes effect."""
        for raw in ex.responses:
            out = with_opaque(raw, d.frame.opaque)
            if d.frame.opcode in SESSION_OPS:
                self.session.observe("s2c", Frame(0, out))
            self._send(out, now)
        status = int.from_bytes(ex.responses[0][6:8], "big")
        if d.frame.opcode == Opcode.DCP_CONTROL and status == Status.SUCCESS:
            key = d.key_text
            value = d.frame.value.decode("utf-8", "surrogateescape")
            self.session.controls[key] = value
            self._control_effect(key, value)

    def _control_effect(self, key: str, value: str) -> None:
        """What an accepted DCP_CONTROL does to the connection beyond its session: noops and the flow-control window."""
        if key == "enable_noop":
            self.noop_enabled = control_on("enable_noop", {"enable_noop": value})
        elif key == "set_noop_interval" and (interval := parse_float(value)) is not None:
            self.noop_interval = interval
        elif key == "connection_buffer_size" and (size := parse_u32(value)) is not None:
            self.buffer_size = size

    def _by_rule(self, d: Dissection, now: float, kind: str, recorded: str, asked: str | None = None) -> None:
        """Answer with the simulator's rule and report the divergence with what it answered."""
        before = len(self._out)
        super()._handle(d, now)
        self._diverge(now, kind, asked or self._asked(d), recorded, self._answered(before))

    def _asked(self, d: Dissection) -> str:
        key = f" key {safe_text(d.key_text)!r}" if d.key else ""
        vb = f" vb {d.frame.vbucket}" if d.frame.vbucket else ""
        return f"{d.name}{key}{vb}"

    def _answered(self, before: int) -> str:
        """The first response produced since ``before`` (status and name), or what happened instead."""
        out = bytes(self._out[before:])
        if len(out) >= 24:
            op, status = out[1], int.from_bytes(out[6:8], "big")
            return f"{spec.COMMANDS[op].name if op in spec.COMMANDS else hex(op)} {_status_name(status)}"
        return f"connection closed ({self.close_reason})" if self.closed else "no response"

    def _diverge(self, now: float, kind: str, asked: str, recorded: str, answered: str) -> None:
        div = Divergence(round(now - self.started, 6), kind, asked, recorded, answered)
        self.divergences.append(div)
        self.cluster.note("divergence", conn=self.serial, **asdict(div))

    # --- session ----------------------------------------------------------------------
    def _replay_hello(self, d: Dissection, now: float) -> None:
        ex = self._take_exchange(d)
        if ex is not None:
            self.agent = d.key_text
            self._play(d, ex, now)
            return
        recorded = self.script.features
        if recorded is None:
            self._by_rule(d, now, "hello", "no HELLO")
            return
        asked = [int(e["feature"]) for e in d.body.get("features", [])]
        accepted = list(dict.fromkeys(c for c in asked if c in recorded))
        self.agent = d.key_text
        before = len(self._out)
        self._reply(d, value=[(c,) for c in accepted], now=now)
        self._diverge(
            now,
            "hello",
            f"HELLO features {_features(asked)}",
            f"HELLO accepting {_features(recorded)}",
            f"{self._answered(before)}: the recorded features asked for, {_features(accepted)}",
        )

    def _replay_select(self, d: Dissection, now: float) -> None:
        if self.script.bucket is not None and d.key_text != self.script.bucket:
            self._by_rule(d, now, "select_bucket", f"SELECT_BUCKET {safe_text(self.script.bucket)!r}")
        else:
            super()._handle(d, now)

    # --- streams ------------------------------------------------------------------------
    def _replay_stream_req(self, d: Dissection, now: float) -> None:
        if not self._dcp_conn(d, now):
            return
        req = self._stream_request(d)
        sid = req.obj.get("sid")
        sid_ = sid if isinstance(sid, int) else None
        ident = (req.vbid, sid_, req.flags, req.start, req.end, req.uuid, req.snap_start, req.snap_end, bytes(d.frame.value))
        for i, rec in enumerate(self.script.streams):
            if i not in self._used_streams and rec.identity == ident and rec.status is not None:
                self._used_streams.add(i)
                self._play_stream(d, rec, now)
                return
        self._rule_stream(d, req, now)

    def _play_stream(self, d: Dissection, rec: RecordedStream, now: float) -> None:
        self._send(with_opaque(rec.response, d.frame.opaque), now)
        if rec.status != Status.SUCCESS:
            return
        self._open(rec.vb, rec.sid, d.frame.opaque, rec.flags, rec.start, rec.end, rec.messages, now, by_rule=False)
        self.replayed_streams += 1

    def _open(
        self,
        vb: int,
        sid: int | None,
        opaque: int,
        flags: int,
        start: int,
        end: int,
        messages: list[RecordedMessage],
        now: float,
        *,
        by_rule: bool,
    ) -> None:
        b = self.bucket
        assert b is not None
        old = self.streams.get((vb, sid))
        if old is not None:
            old.queue.clear()
            self._finish(old)
        st = ReplayStream(vb, sid, opaque, flags, start, end, b.vbuckets[vb].generation, None, False, 0, last_queued=start)
        st.pending, st.opened_at, st.by_rule = deque(messages), now, by_rule
        self.streams[st.key] = st
        self.streams_opened += 1

    def _rule_stream(self, d: Dissection, req: StreamRequest, now: float) -> None:
        """A stream request the recording does not hold: the producer's checks, then the rollback rule on the recorded state."""
        state = self.script.vbuckets.get(req.vbid)
        recorded = self._recorded_streams(req.vbid)
        asked = f"DCP_STREAM_REQ {_request_text(req)}"
        if state is None or not state.failover_log or self.bucket is None:
            before = len(self._out)
            self._stream_req(d, now)  # the simulator's empty vbucket (or NotMyVbucket)
            self._diverge(now, "stream_request", asked, recorded, self._answered(before) + " (the simulator's empty vbucket)")
            return
        before = len(self._out)
        status = self._validate(req)
        if status is not None:
            self._reply(d, status, now=now)
            self._diverge(now, "stream_request", asked, recorded, self._answered(before))
            return
        decision = rollback_decision(
            start=req.start,
            snap_start=req.snap_start,
            snap_end=req.snap_end,
            vb_uuid=req.uuid,
            failover_log=state.failover_log,
            high_seqno=state.high_seqno,
            purge_seqno=0,
            flags=req.flags,
            client_purge_seqno=req.client_purge,
        )
        if decision.rollback:
            self._reply(d, Status.ROLLBACK, value={"rollback_seqno": decision.seqno}, now=now)
            answer = f"Rollback to {decision.seqno} ({decision.reason})"
            self._diverge(now, "stream_request", asked, recorded, answer)
            return
        end = state.high_seqno if req.flags & StreamReqFlag.TO_LATEST else req.end
        if req.start > end or req.start > state.high_seqno:
            self._reply(d, Status.ERANGE, now=now)
            self._diverge(now, "stream_request", asked, recorded, self._answered(before))
            return
        self._reply(d, value=list(state.failover_log), now=now)
        messages = _served(state, req.start, end, req.vbid, req.sid)
        self._open(req.vbid, req.sid, d.frame.opaque, req.flags, req.start, end, messages, now, by_rule=True)
        self.rule_streams += 1
        items = sum(1 for m in messages if _is_item(m))
        ended = " then STREAM_END" if messages and messages[-1].name == "DCP_STREAM_END" else ""
        answer = f"Success ({decision.reason}): {items} recorded items above {req.start}{ended}"
        first = min((m.seqno for m in messages if _is_item(m) and m.seqno is not None), default=None)
        if first is not None and first > req.start + 1:  # the recording began above the request: say what it never held
            answer += f"; seqnos {req.start + 1}-{first - 1} were never recorded, so never sent"
        self._diverge(now, "stream_request", asked, recorded, answer)

    def _recorded_streams(self, vb: int) -> str:
        recs = [r for r in self.script.streams if r.vb == vb]
        if not recs:
            return f"no stream request of vb {vb}"
        return "; ".join(f"{r.describe()} -> {_outcome(r)}" for r in recs)

    def _replay_close(self, d: Dissection, now: float) -> None:
        st = self.streams.get((d.frame.vbucket or 0, d.stream_id))
        rec = self._stream_of(st)
        if isinstance(st, ReplayStream) and rec is not None and rec.close_response is not None and not st.dead:
            self._send(with_opaque(rec.close_response, d.frame.opaque), now)
            status = int.from_bytes(rec.close_response[6:8], "big")
            if status == Status.SUCCESS and not any(m.after_close for m in st.pending):
                st.queue.clear()
                self._finish(st)
            st.client_closed = True
            return
        if isinstance(st, ReplayStream) and not st.by_rule:
            recs = [
                self.script.streams[i]
                for i in self._used_streams
                if self.script.streams[i].vb == st.vb and self.script.streams[i].sid == st.sid
            ]
            closed = any(r.closed for r in recs)
            recorded = "the recorded client's DCP_CLOSE_STREAM, its answer not captured" if closed else "no DCP_CLOSE_STREAM of this stream"
            self._by_rule(d, now, "close_stream", recorded)
        else:
            super()._handle(d, now)

    def _stream_of(self, st: ProducerStream | None) -> RecordedStream | None:
        if not isinstance(st, ReplayStream) or st.by_rule:
            return None
        for i in self._used_streams:
            rec = self.script.streams[i]
            if rec.vb == st.vb and rec.sid == st.sid and rec.close_response is not None:
                return rec
        return None

    # --- moving recorded messages ---------------------------------------------------------
    def _fill(self, st: ProducerStream, now: float) -> None:
        if not isinstance(st, ReplayStream):
            super()._fill(st, now)
            return
        while st.pending and not st.dead:
            m = st.pending[0]
            if (m.after_close and not st.client_closed) or (self.pace == "captured" and st.opened_at + m.at > now):
                return
            st.pending.popleft()
            self._queue_recorded(st, m)

    def _queue_recorded(self, st: ReplayStream, m: RecordedMessage) -> None:
        raw = with_opaque(m.raw, st.opaque)
        if m.name == "DCP_STREAM_END":
            st.dead = True
            st.end_status = int.from_bytes(raw[24:28], "big") if len(raw) >= 28 else _OK
            self._queue(st, raw, "end")
        else:
            self._queue(st, raw, "item" if _is_item(m) else "marker")

    def next_wakeup(self, now: float) -> float | None:
        """When :meth:`tick` has something to do: the next captured message or noop (``None``: only bytes from the client)."""
        if self.closed:
            return None
        times = [t for t in (self.next_noop_at,) if t is not None]
        if not self._window_full():
            for st in self.streams.values():
                if isinstance(st, ReplayStream) and st.pending and not st.dead and not st.queue:
                    m = st.pending[0]
                    if not m.after_close or st.client_closed:
                        times.append(now if self.pace == "fast" else st.opened_at + m.at)
        return min(times, default=None)

    # --- the end ------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        """Every stream opened has ended and nothing recorded is left to send."""
        return not any(not s.ended for s in self.streams.values())

    def divergence_rows(self) -> list[dict[str, Any]]:
        """One row per divergence: conn (serial), at (seconds since the connection began), kind, asked, recorded, answered."""
        return [{"conn": self.serial, **asdict(d)} for d in self.divergences]

    def summary(self) -> dict[str, Any]:
        """What this client got: frames each way, streams (recorded, by rule), items, divergences, why it closed."""
        return {
            "event": "summary",
            "conn": self.serial,
            "peer": self.peer,
            "name": self.dcp_name,
            "frames_in": self.received_frames,
            "frames_out": self.sent_frames,
            "streams_replayed": self.replayed_streams,
            "streams_by_rule": self.rule_streams,
            "items": self.items_sent,
            "divergences": len(self.divergences),
            "closed": self.close_reason,
        }


def _is_item(m: RecordedMessage) -> bool:
    return m.seqno is not None and m.name not in ("DCP_SNAPSHOT_MARKER", "DCP_STREAM_END", "DCP_SEQNO_ADVANCED")


def _served(state: VbState, start: int, end: int, vb: int, sid: int | None) -> list[RecordedMessage]:
    """The recorded messages a differing stream request gets: snapshots and items above ``start`` up to ``end``, then the end."""
    src = state.source
    if src is None:
        return []
    out: list[RecordedMessage] = []
    last = start
    for m in src.messages:
        if m.after_close or m.name == "DCP_STREAM_END":
            continue
        if m.name == "DCP_SNAPSHOT_MARKER":
            if m.seqno is not None and m.seqno > start and last < end:
                out.append(m)
        elif m.seqno is None or start < m.seqno <= end:
            out.append(m)
            last = max(last, m.seqno or last)
    recorded_end = next((m for m in src.messages if m.name == "DCP_STREAM_END" and not m.after_close), None)
    if last >= end:
        at = out[-1].at if out else 0.0
        raw = encode("DCP_STREAM_END", extras={"status": _OK}, vbucket=vb, stream_id=sid)
        out.append(RecordedMessage(at, 0, raw, "DCP_STREAM_END", None))
    elif recorded_end is not None and src.last_seqno <= end:
        out.append(recorded_end)
    return out


def _outcome(rec: RecordedStream) -> str:
    if rec.status == Status.ROLLBACK:
        return f"Rollback to {rec.rollback_seqno}"
    if rec.status is None:
        return "no response"
    return _status_name(rec.status)


def _request_text(req: StreamRequest) -> str:
    sid = f" sid {req.sid}" if req.sid is not None else ""
    flags = f" flags 0x{req.flags:x}" if req.flags else ""
    return f"vb {req.vbid}{sid} start {req.start} end {req.end} uuid {req.uuid:016x} snap {req.snap_start}-{req.snap_end}{flags}"


def _features(codes: list[int]) -> str:
    return "[" + ", ".join(str(spec.FEATURES.get(c, f"0x{c:x}")) for c in codes) + "]"
