"""A sans-IO DCP consumer: bytes in, events and bytes out, time passed in.

:class:`DcpConsumer` is the client side of one DCP connection as a pure state
machine (no sockets, no asyncio, no clock reads).  It bootstraps the session
(HELLO, SASL, SELECT_BUCKET, GET_CLUSTER_CONFIG when it knows the address it is
connected to, optionally GET_ALL_VB_SEQNOS, DCP_OPEN, DCP_CONTROLs), requests one
stream per vbucket from a
:class:`~dcpinspect.live.resume.ResumeState`, follows the rollback protocol,
tracks snapshots and seqnos per vbucket, acknowledges the flow-control buffer,
answers noops and re-requests streams whose end reason says so (kv_engine's
``docs/dcp``; REFERENCE.md has each message's layout).

Every frame it sends is built with :func:`dcpinspect.wire.encode` and every frame
it receives is read with :class:`~dcpinspect.wire.decoder.FrameDecoder` and
:func:`dcpinspect.wire.dissect`: the protocol table is the only description of
the wire.

1. The connection is in one :class:`~.consumer_states.Phase` and each stream in
   one :class:`~.consumer_states.StreamStatus`; they move only along the tables
   of :mod:`.consumer_states`, and any other move is a bug
   (:class:`~.consumer_states.TransitionError`), never the server's doing.
2. A reply is routed by the kind of request it answers (:data:`REPLY_HANDLERS`,
   matched by opaque); a producer message by its opcode
   (:data:`~.consumer_streams.STREAM_MESSAGE_HANDLERS`); a noop is answered at once.
3. The negotiated context (features, open flags, controls, stream ids) is the one
   tracker :class:`~dcpinspect.flows.session.ConnState`, fed the session frames
   sent and the replies to them.
4. Never raises on server input: malformed frames and unexpected replies become
   ``malformed``/``unexpected`` events; bytes that are not frames, a reply it
   cannot act upon, and silence where a reply is due fail the connection.
5. Flow control: it acknowledges exactly what it received, the sum of
   :func:`~dcpinspect.protocol.rules.flow_control_size` over the stream messages
   read (kv_engine ``docs/dcp/documentation/flow-control.md``), never more.
6. It answers every DCP_NOOP with a reply echoing the opaque and never sends a
   DCP_NOOP request (the producer disconnects a consumer that does); silence for
   two noop intervals is a dead connection.
7. Cluster map (given ``address``, :mod:`.consumer_map`): the vbuckets the map names active on another
   node are handed over (``moved`` events, see :mod:`.consumer_cluster`); a server
   that answers GET_CLUSTER_CONFIG with an error (memcached, an old node) keeps
   every vbucket on this connection.

>>> c = DcpConsumer(ConsumerConfig(bucket="default", user="u", password="p", vbuckets=(0,)))
>>> from dcpinspect import decode, dissect
>>> [dissect(f).name for f in decode(c.data_to_send())]
['HELLO']
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..flows.session import ConnState
from ..protocol import spec
from ..protocol.enums import Feature, Opcode, OpenFlag, Status
from ..protocol.rules import MAX_SEQNO, flow_control_size
from ..protocol.session import DEFAULT_NOOP_INTERVAL, SESSION_OPS, control_on, parse_float
from ..protocol.session import REQUEST_MAGICS as _REQUEST_MAGICS
from ..protocol.session import RESPONSE_MAGICS as _RESPONSE_MAGICS
from ..wire.decoder import FrameDecoder
from ..wire.dissect import dissect
from ..wire.dissection import DissectContext, Dissection
from ..wire.encode import encode
from ..wire.events import Frame
from .clustermap import ClusterMap
from .consumer_map import ClusterMapMixin
from .consumer_states import (
    AWAITS,
    ENDS,
    PHASE_TRANSITIONS,
    ConsumerEvent,
    Phase,
    Request,
    StreamStatus,
    TransitionError,
    server_text,
    status_text,
)
from .consumer_streams import Handoff, StreamInfo, Streams
from .resume import ResumeState, u64
from .sasl import SCRAM_HASHES, SaslError, ScramClient, plain_payload

__all__ = ["DEFAULT_FEATURES", "DEFAULT_MECHANISMS", "MAX_STAT_KEYS", "REPLY_HANDLERS", "ConsumerConfig", "DcpConsumer"]

#: HELLO features asked for by default (REFERENCE.md, "HELLO features")
DEFAULT_FEATURES: tuple[int, ...] = tuple(
    int(f) for f in (Feature.TCP_NO_DELAY, Feature.XATTR, Feature.XERROR, Feature.SELECT_BUCKET, Feature.JSON, Feature.COLLECTIONS)
)
#: strongest first
DEFAULT_MECHANISMS: tuple[str, ...] = ("SCRAM-SHA512", "SCRAM-SHA256", "SCRAM-SHA1", "PLAIN")

_STAT_HIGH = re.compile(r"^vb_(\d{1,5}):high_seqno$")
#: vbucket ids are 16 bits
_MAX_VBUCKET = (1 << 16) - 1
#: STAT vbucket-seqno answers more than this many keys: a server that never ends its STAT reply
MAX_STAT_KEYS = 16 * (_MAX_VBUCKET + 1)
#: stream requests take opaques from here up (bootstrap requests count from 1)
_STREAM_OPAQUE_BASE = 1 << 12

_SUCCESS = int(Status.SUCCESS)
_NOOP = int(Opcode.DCP_NOOP)
_STREAM_REQ = int(Opcode.DCP_STREAM_REQ)


@dataclass
class ConsumerConfig:
    """What a :class:`DcpConsumer` asks for.  The password is never shown in its repr.

    Attributes:
        bucket, user, password: the bucket to stream and the credentials.
        name: the DCP connection name (DCP_OPEN key; reusing a live name kills the older connection).
        agent: the HELLO agent name.
        features: HELLO feature codes wanted.
        mechanisms: SASL mechanisms acceptable, strongest first.
        open_flags: DCP_OPEN flags; ``OpenFlag.PRODUCER`` (the server produces: *we* consume) is always added.
        noop_interval: seconds for ``enable_noop``/``set_noop_interval``; ``None`` disables noops.
        buffer_size: ``connection_buffer_size`` (flow control); 0 disables it.
        ack_ratio: acknowledge once this fraction of the buffer was consumed.
        stream_ids: ``enable_stream_id`` (each stream then carries ``sid`` = vbucket + 1).
        max_marker_version: e.g. ``"2.2"`` (needs collections).
        controls: further ``(key, value)`` DCP_CONTROLs.
        vbuckets: the vbuckets to stream (``None``: every vbucket GET_ALL_VB_SEQNOS lists).
        to_latest: end each stream at the vbucket's high seqno when the connection started.
        end_seqno: end seqno otherwise (2^64-1: open-ended).
        stream_flags: DCP_STREAM_REQ flags.
        stream_value: stream-request JSON value (collections filter), e.g. ``{"collections": ["8"]}``.
        resume: where to resume from (``None``: from the beginning).
        max_rollbacks: rollbacks/re-requests in a row before a vbucket is given up.
        response_timeout: seconds to wait for a bootstrap reply (the connection fails) or a stream
            request's reply (that vbucket fails).
        cluster_map: ask GET_CLUSTER_CONFIG and stream each vbucket from the node the map names
            active (only when the consumer knows the address it is connected to).
    """

    bucket: str
    user: str
    password: str = field(default="", repr=False)
    name: str = "dcpinspect"
    agent: str = "dcpinspect/0.1"
    features: tuple[int, ...] = DEFAULT_FEATURES
    mechanisms: tuple[str, ...] = DEFAULT_MECHANISMS
    open_flags: int = int(OpenFlag.PRODUCER)
    noop_interval: float | None = 10.0
    buffer_size: int = 1 << 20
    ack_ratio: float = 0.5
    stream_ids: bool = False
    max_marker_version: str | None = None
    controls: tuple[tuple[str, str], ...] = ()
    vbuckets: tuple[int, ...] | None = (0,)
    to_latest: bool = False
    end_seqno: int = MAX_SEQNO
    stream_flags: int = 0
    stream_value: Mapping[str, Any] | None = None
    resume: ResumeState | None = None
    max_rollbacks: int = 20
    response_timeout: float = 30.0
    cluster_map: bool = True


ReplyHandler = Callable[["DcpConsumer", Frame, Dissection, Any, float, list[ConsumerEvent]], None]


class DcpConsumer(ClusterMapMixin):
    """A DCP consumer connection as a pure state machine.

    Feed it what the server sent with :meth:`receive`, send what
    :meth:`data_to_send` returns, call :meth:`tick` now and then.  It starts
    by queueing HELLO.  Never raises on server input (rule 4 above).
    """

    def __init__(self, config: ConsumerConfig, now: float = 0.0, *, address: tuple[str, int] | None = None) -> None:
        self.config = config
        #: the (host, port) this connection was made to (``None``: unknown; then the cluster map is not asked)
        self.address = address
        #: the cluster map the server answered (``None``: not asked, or not served)
        self.cluster_map: ClusterMap | None = None
        #: this node's server index in :attr:`cluster_map`
        self.node_index: int | None = None
        self.phase = Phase.HELLO
        self.failure: str | None = None
        #: what the connection negotiated (features, open flags, controls): the one context tracker
        self.session = ConnState()
        self.mechanism: str | None = None
        self.rejected_controls: dict[str, int] = {}
        self.unacked = 0
        #: withhold buffer acknowledgements (a stalled consumer); acks resume when set back to False
        self.hold_acks = False
        self.acked_total = 0
        self.consumed_total = 0
        #: frames decoded from the server's bytes so far
        self.frames_received = 0
        self._out = bytearray()
        self._decoder = FrameDecoder()
        self._opaque = 0
        self._pending: dict[int, tuple[Request, Any, int]] = {}  # opaque -> (what, detail, the request's opcode)
        self._pending_since = now
        self._last_rx = now
        self._now = now  # the latest time passed in
        self._stat_keys = 0
        self._scram: ScramClient | None = None
        self._controls: list[tuple[str, str]] = []
        self._high: dict[int, int] = {}
        self._stat_high: dict[int, int] = {}
        self._done_reported = False
        self._placed = False  # the cluster map chose this connection's vbuckets
        self._config_asked = -1.0  # when a GET_CLUSTER_CONFIG sent while streaming was sent (-1: none pending)
        resume = config.resume.copy() if config.resume is not None else ResumeState(bucket=config.bucket)
        self.tracker = Streams(
            resume,
            self._send,
            stream_ids=config.stream_ids,
            max_rollbacks=config.max_rollbacks,
            to_latest=config.to_latest,
            end_seqno=config.end_seqno,
            flags=config.stream_flags,
            value=config.stream_value,
        )
        for vb in config.vbuckets or ():
            self.tracker.add(vb)
        self._send_hello()

    # --- public API -------------------------------------------------------------
    @property
    def streams(self) -> dict[int, StreamInfo]:
        """The streams, by vbucket (live, not the persisted state)."""
        return self.tracker.streams

    @property
    def state(self) -> ResumeState:
        """The resume state as of each vbucket's last consistent point (a copy; persist this)."""
        return self.tracker.committed.copy()

    @property
    def context(self) -> DissectContext:
        """What the connection negotiated, for dissecting its frames."""
        return self.session.context

    @property
    def features(self) -> tuple[int, ...]:
        """The HELLO features the server accepted."""
        return self.session.features

    @property
    def flow_control(self) -> bool:
        """``connection_buffer_size`` was accepted with a positive size."""
        size = self.session.controls.get("connection_buffer_size", "")
        return size.isdigit() and int(size) > 0

    @property
    def noop(self) -> bool:
        """``enable_noop=true`` was accepted."""
        return control_on("enable_noop", self.session.controls)

    @property
    def noop_interval(self) -> float | None:
        """The noop interval in force: the accepted ``set_noop_interval``, else the producer's default (``None``: noops off)."""
        if not self.noop:
            return None
        interval = parse_float(self.session.controls.get("set_noop_interval", ""))  # as the producer reads it
        return interval if interval is not None and interval > 0 else DEFAULT_NOOP_INTERVAL

    @property
    def end_on_close(self) -> bool:
        """``send_stream_end_on_client_close_stream=true`` was accepted."""
        return control_on("send_stream_end_on_client_close_stream", self.session.controls)

    @property
    def awaiting(self) -> dict[int, Request]:
        """The requests whose reply is still awaited: opaque -> kind (oldest first)."""
        return {opaque: what for opaque, (what, _detail, _op) in self._pending.items()}

    @property
    def done(self) -> bool:
        """True once every stream ended or failed, or the connection failed."""
        return self.phase in ENDS

    @property
    def output_size(self) -> int:
        """Bytes queued for the server (see :meth:`data_to_send`)."""
        return len(self._out)

    def data_to_send(self) -> bytes:
        """The bytes queued for the server (and forget them)."""
        out = bytes(self._out)
        self._out.clear()
        return out

    def receive(self, data: bytes, now: float) -> list[ConsumerEvent]:
        """Bytes from the server -> events (never raises on what the server sent)."""
        events: list[ConsumerEvent] = []
        self._now = now
        if data:
            self._last_rx = now
        for ev in self._decoder.feed(data):
            if not isinstance(ev, Frame):
                reason = server_text(getattr(ev, "reason", ev.type))
                events.append(ConsumerEvent("malformed", f"{ev.type} at offset {ev.offset}: {reason}", data={"offset": ev.offset}))
                if not self.done:  # the frame boundaries are lost: replies and stream ends may be gone (as memcached, drop it)
                    self._fail(events, f"the server sent bytes that are not frames ({ev.type} at offset {ev.offset}: {reason})")
                continue
            if self.phase is Phase.FAILED:
                break  # nothing after a fatal failure is acted upon
            self.frames_received += 1
            try:
                self._frame(ev, now, events)
            except TransitionError:
                raise  # a bug in the consumer, not the server's doing
            except Exception as exc:  # the server's bytes must never crash the client
                events.append(ConsumerEvent("malformed", f"{ev.name} at offset {ev.offset}: {_exc_text(exc)}"))
        self._maybe_ack(events)
        self._check_done(events)
        return events

    def tick(self, now: float) -> list[ConsumerEvent]:
        """Time passes: detect a dead connection (no traffic for two noop intervals) and reply timeouts."""
        events: list[ConsumerEvent] = []
        self._now = now
        if self.done:
            return events
        if self.phase is not Phase.STREAMING:
            if now - self._pending_since > self.config.response_timeout:
                if self._pending:
                    self._fail(events, f"no reply to {next(iter(self._pending.values()))[0]} within {self.config.response_timeout:g} s")
                else:  # cannot happen unless a reply was mishandled; never wait forever
                    self._fail(events, f"bootstrap stalled in phase {self.phase} for {self.config.response_timeout:g} s")
            return events
        for opaque in self.tracker.requests_timed_out(now, self.config.response_timeout, events):
            self._pending.pop(opaque, None)  # a stream request the server never answers fails that vbucket
        self.tracker.closes_timed_out(now, self.config.response_timeout, events)
        if self._config_asked >= 0 and now - self._config_asked > self.config.response_timeout:
            self._fail(events, f"no reply to {Request.CONFIG} within {self.config.response_timeout:g} s")
            return events
        self._check_done(events)
        if self.done:
            return events
        interval = self.noop_interval
        if interval and now - self._last_rx > 2 * interval:
            self._fail(events, f"no traffic from the server for {now - self._last_rx:.1f} s (noop interval {interval:g} s)")
        self._maybe_ack(events)  # acks held back are sent once released, even while nothing arrives
        return events

    def connection_lost(self) -> list[ConsumerEvent]:
        """The transport closed: unless everything ended, that is a failure."""
        events: list[ConsumerEvent] = []
        for ev in self._decoder.close():
            if not isinstance(ev, Frame):
                events.append(ConsumerEvent("malformed", f"{ev.type} at offset {ev.offset}: {getattr(ev, 'reason', '')}"))
        if not self.done:
            self._fail(events, f"server closed the connection during {self.phase}")
        return events

    def connection_failed(self, why: str) -> list[ConsumerEvent]:
        """The transport failed (a send error, a server that stopped reading): unless everything ended, a failure."""
        events: list[ConsumerEvent] = []
        if not self.done:
            self._fail(events, why)
        return events

    def adopt(self, handoff: Handoff, now: float) -> list[ConsumerEvent] | None:
        """Stream the vbucket another connection handed over (it moved to this node); ``None`` if this connection ended.

        Before streaming starts the stream waits with the others; while streaming it is requested at once.
        """
        if self.done:
            return None
        events: list[ConsumerEvent] = []
        self._now = now
        st = self.tracker.adopt(handoff)
        events.append(ConsumerEvent("adopted", f"seqno {st.position.seqno}", st.vbucket, {"seqno": st.position.seqno}))
        if self.phase is Phase.STREAMING:
            self._stream_request(st, events)
        return events

    def close_streams(self, now: float | None = None) -> list[ConsumerEvent]:
        """Stop: ask the server to close every live stream (DCP_CLOSE_STREAM); all streams end as ``Closed``; done.

        When ``send_stream_end_on_client_close_stream`` was accepted, a streaming
        stream stays ``closing`` until the producer's STREAM_END(Closed) arrives
        (messages still in flight are applied meanwhile) or until
        ``response_timeout`` passes (see :meth:`tick`).  Calling it again is harmless.
        """
        events: list[ConsumerEvent] = []
        when = self._last_rx if now is None else now
        self.tracker.close_all(when, events, wait_for_end=self.end_on_close, sids_on=bool(self.context.stream_ids))
        if not self.done and self.phase is not Phase.STREAMING:
            self._finish(events)  # a stop during the bootstrap ends it
        self._check_done(events)
        return events

    # --- sending ------------------------------------------------------------------
    def _next_opaque(self) -> int:
        self._opaque += 1
        return self._opaque

    def _send(self, name: str, **kw: Any) -> None:
        raw = encode(name, **kw)
        self._out += raw
        if raw[1] in SESSION_OPS:  # the context tracker sees what was asked for (it applies it on success)
            self.session.observe("c2s", Frame(0, raw))

    def _await(self, opaque: int, what: Request, detail: Any, opcode: int) -> None:
        if what not in AWAITS[self.phase]:
            raise TransitionError(f"phase {self.phase} does not send {what} requests (AWAITS)")
        self._pending[opaque] = (what, detail, opcode)

    def _request(self, what: Request, name: str, detail: Any = None, now: float | None = None, **kw: Any) -> None:
        opaque = self._next_opaque()
        self._await(opaque, what, detail, spec.OPCODES[name])
        if now is not None:
            self._pending_since = now
        self._send(name, opaque=opaque, **kw)

    def _send_hello(self) -> None:
        feats = list(dict.fromkeys(self.config.features))
        self._request(Request.HELLO, "HELLO", key=self.config.agent, value={"features": [{"feature": f} for f in feats]})

    def _move(self, to: Phase) -> None:
        if to not in PHASE_TRANSITIONS[self.phase]:
            raise TransitionError(f"phase {self.phase} -> {to} is not in PHASE_TRANSITIONS")
        self.phase = to
        if to in ENDS:
            self._pending.clear()  # nothing is awaited any more: a late reply is unexpected

    # --- dispatch -----------------------------------------------------------------
    def _frame(self, frame: Frame, now: float, events: list[ConsumerEvent]) -> None:
        magic = frame.magic
        # what the producer charged for this message, counted before anything else can go wrong with it:
        # the acknowledgements are exactly the sum of these (an uncounted message would stall the producer)
        size = flow_control_size(magic, frame.opcode, frame.length)
        if size and self.flow_control:
            self.unacked += size
            self.consumed_total += size
        d = dissect(frame, self.context)
        if magic in _RESPONSE_MAGICS:
            self._response(frame, d, now, events)
        elif magic in _REQUEST_MAGICS:
            self._server_request(frame, d, events)
        else:
            events.append(ConsumerEvent("unexpected", f"server request {d.name} (magic 0x{magic:02x}) ignored", dissection=d))

    def _response(self, frame: Frame, d: Dissection, now: float, events: list[ConsumerEvent]) -> None:
        pending = self._pending.get(frame.opaque)
        if pending is None or pending[2] != frame.opcode:  # a reply carries its request's opaque and opcode
            how = "matches no request" if pending is None else f"does not answer that {spec.opcode_name(pending[2])} request"
            why = f"{d.name} response with opaque 0x{frame.opaque:08x} {how} (status {status_text(frame.status or 0)})"
            events.append(ConsumerEvent("unexpected", why, dissection=d))
            return
        del self._pending[frame.opaque]
        self._pending_since = now
        what, detail, _opcode = pending
        try:
            self.session.observe("s2c", frame)  # the reply to a request of ours: its effect on the context
            REPLY_HANDLERS[what](self, frame, d, detail, now, events)
        except TransitionError:
            raise
        except Exception as exc:  # the request is answered but not acted upon: nothing would ever time out
            self._fail(events, f"cannot handle the {d.name} reply: {_exc_text(exc)}")

    def _server_request(self, frame: Frame, d: Dissection, events: list[ConsumerEvent]) -> None:
        op = frame.opcode
        if op == _NOOP:
            self._send("DCP_NOOP", response=True, opaque=frame.opaque)  # a mandatory reply, same opaque
            events.append(ConsumerEvent("noop", f"opaque 0x{frame.opaque:08x}"))
            return
        again = self.tracker.message(d, events)
        if again is not None:  # the stream ended with a reason that calls for a new request (here, or where it lives now)
            self._again(again, events)

    # --- bootstrap ------------------------------------------------------------------
    def _on_hello(self, frame: Frame, d: Dissection, detail: Any, now: float, events: list[ConsumerEvent]) -> None:
        if frame.status != _SUCCESS:
            self._fail(events, f"HELLO refused: {status_text(frame.status)}")
            return
        feats = self.features
        names = ", ".join(spec.FEATURES.get(f, f"0x{f:02x}") for f in feats)
        events.append(ConsumerEvent("hello", f"server accepted {names or 'no features'}", data={"features": list(feats)}))
        self._move(Phase.SASL_MECHS)
        self._request(Request.SASL_MECHS, "SASL_LIST_MECHS", now=now)

    def _on_sasl_mechs(self, frame: Frame, d: Dissection, detail: Any, now: float, events: list[ConsumerEvent]) -> None:
        if frame.status != _SUCCESS:
            self._fail(events, f"SASL_LIST_MECHS failed: {status_text(frame.status)}", kind="auth_failed")
            return
        offered = frame.value.decode("ascii", "replace").split()
        mech = next((m for m in self.config.mechanisms if m in offered), None)
        if mech is None:
            shown = server_text(" ".join(offered)) or "none"
            self._fail(events, f"no common SASL mechanism (server offers {shown})", kind="auth_failed")
            return
        self.mechanism = mech
        self._move(Phase.SASL_AUTH)
        if mech in SCRAM_HASHES:
            self._scram = ScramClient(mech, self.config.user, self.config.password)
            payload = self._scram.first()
        else:
            payload = plain_payload(self.config.user, self.config.password)
        self._request(Request.SASL_AUTH, "SASL_AUTH", key=mech, value=payload, now=now)

    def _on_sasl_auth(self, frame: Frame, d: Dissection, detail: Any, now: float, events: list[ConsumerEvent]) -> None:
        status = frame.status
        mech = self.mechanism or ""
        if status == Status.AUTH_CONTINUE and self._scram is not None:
            try:
                payload = self._scram.final(frame.value)
            except SaslError as exc:
                self._fail(events, f"SASL {mech}: {server_text(str(exc))}", kind="auth_failed")
                return
            self._request(Request.SASL_AUTH, "SASL_STEP", key=mech, value=payload, now=now)
            return
        if status != _SUCCESS:
            context = f" ({server_text(frame.value.decode('utf-8', 'replace'))})" if frame.value else ""
            why = f"authentication failed for user {self.config.user!r} with {mech}: {status_text(status)}{context}"
            self._fail(events, why, kind="auth_failed")
            return
        if self._scram is not None:
            try:
                self._scram.check(frame.value)
            except SaslError as exc:
                self._fail(events, f"SASL {mech}: {server_text(str(exc))}", kind="auth_failed")
                return
        self._scram = None
        events.append(ConsumerEvent("authenticated", f"as {self.config.user!r} with {mech}", data={"mechanism": mech}))
        self._move(Phase.SELECT_BUCKET)
        self._request(Request.SELECT_BUCKET, "SELECT_BUCKET", key=self.config.bucket, now=now)

    def _on_select_bucket(self, frame: Frame, d: Dissection, detail: Any, now: float, events: list[ConsumerEvent]) -> None:
        if frame.status != _SUCCESS:
            self._fail(events, f"cannot select bucket {self.config.bucket!r}: {status_text(frame.status)}")
            return
        events.append(ConsumerEvent("bucket_selected", self.config.bucket))
        if self.config.cluster_map and self.address is not None:
            self._move(Phase.CONFIG)
            self._request(Request.CONFIG, "GET_CLUSTER_CONFIG", now=now)
        else:
            self._after_config(now, events)

    def _after_config(self, now: float, events: list[ConsumerEvent]) -> None:
        if self._placed and not self.streams:
            self._finish(events)  # every vbucket lives on other nodes: nothing to stream here
        elif self.config.to_latest or (self.config.vbuckets is None and not self._placed):
            self._move(Phase.SEQNOS)
            self._request(Request.SEQNOS, "GET_ALL_VB_SEQNOS", now=now)
        else:
            self._open(now)

    def _on_seqnos(self, frame: Frame, d: Dissection, detail: Any, now: float, events: list[ConsumerEvent]) -> None:
        if frame.status != _SUCCESS:
            # the same numbers are in STAT "vbucket-seqno" (one response per stat, then an empty one)
            self._stat_high = {}
            self._request(Request.STAT, "STAT", key="vbucket-seqno", now=now)
            return
        high: dict[int, int] = {}
        for e in d.body.get("vb_seqnos", []):
            vb, seqno = int(e["vbucket"]), int(e["high_seqno"])
            if not 0 <= vb <= _MAX_VBUCKET or not 0 <= seqno <= MAX_SEQNO:
                raise ValueError(f"vbucket {vb} high seqno {seqno} out of range")
            high[vb] = seqno
        self._high = high
        self._seqnos_known(now, events)

    def _on_stat(self, frame: Frame, d: Dissection, detail: Any, now: float, events: list[ConsumerEvent]) -> None:
        if frame.status != _SUCCESS:
            self._fail(
                events, f"cannot learn the high seqnos (GET_ALL_VB_SEQNOS and STAT vbucket-seqno failed: {status_text(frame.status)})"
            )
            return
        if not frame.key:  # the empty response ends the STAT reply
            self._high = dict(self._stat_high)
            self._seqnos_known(now, events)
            return
        self._stat_keys += 1
        if self._stat_keys > MAX_STAT_KEYS:
            self._fail(events, f"STAT vbucket-seqno: more than {MAX_STAT_KEYS} keys and no end")
            return
        m = _STAT_HIGH.match(frame.key.decode("ascii", "replace"))
        if m and int(m.group(1)) <= _MAX_VBUCKET:
            try:
                self._stat_high[int(m.group(1))] = u64(int(frame.value.decode("ascii")))
            except (ValueError, UnicodeDecodeError):
                text = server_text(repr(frame.value))
                events.append(ConsumerEvent("malformed", f"STAT {server_text(repr(frame.key))} value {text} is not a seqno", dissection=d))
        self._await(frame.opaque, Request.STAT, detail, frame.opcode)  # more responses follow

    def _seqnos_known(self, now: float, events: list[ConsumerEvent]) -> None:
        if self.config.vbuckets is None and not self._placed:  # every vbucket the server has
            for vb in sorted(self._high):
                self.tracker.add(vb)
        mine = {vb: self._high.get(vb) for vb in self.streams}
        events.append(ConsumerEvent("seqnos", ", ".join(f"vb {vb}: {h}" for vb, h in mine.items()), data={"high_seqnos": mine}))
        for vb, high in mine.items():
            self.streams[vb].high_seqno = high
        self._open(now)

    def _open(self, now: float) -> None:
        self._move(Phase.OPEN)
        flags = self.config.open_flags | OpenFlag.PRODUCER
        self._request(Request.OPEN, "DCP_OPEN", detail=flags, extras={"seqno": 0, "flags": flags}, key=self.config.name, now=now)

    def _on_open(self, frame: Frame, d: Dissection, detail: Any, now: float, events: list[ConsumerEvent]) -> None:
        if frame.status != _SUCCESS:
            self._fail(events, f"DCP_OPEN {self.config.name!r} refused: {status_text(frame.status)}")
            return
        events.append(ConsumerEvent("opened", self.config.name, data={"flags": detail}))
        cfg = self.config
        controls: list[tuple[str, str]] = []
        if cfg.noop_interval is not None:
            controls += [("enable_noop", "true"), ("set_noop_interval", f"{cfg.noop_interval:g}")]
        if cfg.buffer_size:
            controls.append(("connection_buffer_size", str(cfg.buffer_size)))
        if cfg.stream_ids:
            controls.append(("enable_stream_id", "true"))
        if cfg.max_marker_version:
            controls.append(("max_marker_version", cfg.max_marker_version))
        controls += list(cfg.controls)
        self._controls = controls
        self._move(Phase.CONTROLS)
        self._next_control(now, events)

    def _next_control(self, now: float, events: list[ConsumerEvent]) -> None:
        if not self._controls:
            self._start_streaming(now, events)
            return
        key, value = self._controls.pop(0)
        self._request(Request.CONTROL, "DCP_CONTROL", detail=(key, value), key=key, value=value.encode(), now=now)

    def _on_control(self, frame: Frame, d: Dissection, detail: Any, now: float, events: list[ConsumerEvent]) -> None:
        key, value = detail  # an accepted control is in self.session.controls (flow_control, noop, stream ids...)
        if frame.status == _SUCCESS:
            events.append(ConsumerEvent("control", f"{key}={value}", data={"key": key, "value": value}))
        else:
            status = frame.status or 0
            self.rejected_controls[key] = status
            events.append(ConsumerEvent("control_rejected", f"{key}={value}: {status_text(status)}", data={"key": key, "status": status}))
            if key == "enable_noop":  # its interval would be rejected too; do not ask
                self._controls = [(k, v) for k, v in self._controls if k != "set_noop_interval"]
        self._next_control(now, events)

    # --- streams --------------------------------------------------------------------
    def _start_streaming(self, now: float, events: list[ConsumerEvent]) -> None:
        self._move(Phase.STREAMING)
        self._last_rx = now
        for st in self.tracker.startable(events):
            self._stream_request(st, events)

    def _stream_request(self, st: StreamInfo, events: list[ConsumerEvent]) -> None:
        opaque = _STREAM_OPAQUE_BASE + self._next_opaque()
        self._await(opaque, Request.STREAM_REQ, st, _STREAM_REQ)
        self.tracker.request(st, opaque, self._now, bool(self.context.stream_ids), events)

    def _on_stream_req(self, frame: Frame, d: Dissection, st: StreamInfo, now: float, events: list[ConsumerEvent]) -> None:
        if st.opaque == frame.opaque and st.status is StreamStatus.REQUESTED and self.tracker.on_reply(st, d, events):
            self._again(st, events)  # after a rollback, or a not-my-vbucket

    # --- flow control, completion, failure ---------------------------------------------
    def _maybe_ack(self, events: list[ConsumerEvent]) -> None:
        if not self.flow_control or self.done or self.hold_acks:
            return
        threshold = max(1, int(self.config.buffer_size * self.config.ack_ratio))
        if self.unacked >= threshold:
            n = self.unacked
            self._send("DCP_BUFFER_ACKNOWLEDGEMENT", extras={"buffer_bytes": n})
            self.unacked = 0
            self.acked_total += n
            events.append(ConsumerEvent("buffer_ack", str(n), data={"bytes": n}))

    def _check_done(self, events: list[ConsumerEvent]) -> None:
        if self.phase is not Phase.STREAMING:
            return
        if all(st.finished for st in self.streams.values()):
            self._finish(events)
        else:
            self.tracker.note_progress()

    def _finish(self, events: list[ConsumerEvent]) -> None:
        self._move(Phase.DONE)
        if not self._done_reported:
            self._done_reported = True
            failed = [vb for vb, st in self.streams.items() if st.status is StreamStatus.FAILED]
            events.append(ConsumerEvent("done", f"all streams ended ({len(failed)} failed)", data={"failed": failed}))

    def _fail(self, events: list[ConsumerEvent], why: str, *, kind: str = "error") -> None:
        if self.done:  # a connection that ended cannot fail any more
            return
        self._move(Phase.FAILED)
        self.failure = why
        events.append(ConsumerEvent(kind, why))
        if kind != "error":
            events.append(ConsumerEvent("error", why))


#: the reply handler of each kind of request
REPLY_HANDLERS: dict[Request, ReplyHandler] = {
    Request.HELLO: DcpConsumer._on_hello,
    Request.SASL_MECHS: DcpConsumer._on_sasl_mechs,
    Request.SASL_AUTH: DcpConsumer._on_sasl_auth,
    Request.SELECT_BUCKET: DcpConsumer._on_select_bucket,
    Request.CONFIG: DcpConsumer._on_config,
    Request.SEQNOS: DcpConsumer._on_seqnos,
    Request.STAT: DcpConsumer._on_stat,
    Request.OPEN: DcpConsumer._on_open,
    Request.CONTROL: DcpConsumer._on_control,
    Request.STREAM_REQ: DcpConsumer._on_stream_req,
}


def _exc_text(exc: BaseException) -> str:
    """An exception raised while reading the server's bytes, as one safe line."""
    return server_text(f"{type(exc).__name__}: {exc}")
