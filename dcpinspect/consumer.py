"""A sans-IO DCP consumer: bytes in, events and bytes out, time passed in.

:class:`DcpConsumer` is the client side of one DCP connection as a pure state
machine (no sockets, no asyncio, no clock reads).  It bootstraps the session
(HELLO, SASL, SELECT_BUCKET, optionally GET_ALL_VB_SEQNOS, DCP_OPEN,
DCP_CONTROLs), requests one stream per vbucket from a :class:`ResumeState`,
follows the rollback protocol (FACTS §7.4), tracks snapshots and seqnos per
vbucket (§7.2), acknowledges the flow-control buffer (§7.5), answers noops
(§7.6) and re-requests streams whose end reason says so (§6.6, §7.7).

Every frame it sends is built with :func:`dcpinspect.encode` and every frame
it receives is read with :class:`~dcpinspect.decoder.FrameDecoder` and
:func:`dcpinspect.dissect`: the protocol table is the only description of
the wire.

>>> c = DcpConsumer(ConsumerConfig(bucket="default", user="u", password="p", vbuckets=(0,)))
>>> from dcpinspect import decode, dissect
>>> [dissect(f).name for f in decode(c.data_to_send())]
['HELLO']
"""

from __future__ import annotations

import copy
import json
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from . import spec
from .decoder import Frame, FrameDecoder
from .dissect import DissectContext, Dissection, dissect
from .encode import encode
from .render import safe_text
from .sasl import SCRAM_HASHES, SaslError, ScramClient, plain_payload

__all__ = [
    "MAX_SEQNO",
    "ConsumerConfig",
    "ConsumerEvent",
    "DcpConsumer",
    "Phase",
    "ResumeState",
    "StreamInfo",
    "VbState",
    "flow_control_size",
]

MAX_SEQNO = 2**64 - 1

#: HELLO features asked for by default: TcpNoDelay, XATTR, XERROR, SELECT_BUCKET, JSON, Collections (FACTS §4.1)
DEFAULT_FEATURES: tuple[int, ...] = (0x03, spec.FEATURE_XATTR, 0x07, 0x08, spec.FEATURE_JSON, spec.FEATURE_COLLECTIONS)
#: strongest first (FACTS §4.2)
DEFAULT_MECHANISMS: tuple[str, ...] = ("SCRAM-SHA512", "SCRAM-SHA256", "SCRAM-SHA1", "PLAIN")

# producer messages that count against the flow-control buffer (FACTS §7.5)
_FLOW_CONTROLLED = frozenset({0x55, 0x56, 0x57, 0x58, 0x59, 0x5B, 0x5F, 0x60, 0x62, 0x63, 0x64, 0x65, 0x66, 0x67})
_OP = spec.OPCODES
_STAT_HIGH = re.compile(r"^vb_(\d{1,5}):high_seqno$")
#: vbucket ids are 16 bits
_MAX_VBUCKET = 0xFFFF
#: STAT vbucket-seqno answers more than this many keys: a server that never ends its STAT reply
_MAX_STAT_KEYS = 16 * (_MAX_VBUCKET + 1)
#: characters of server-provided text kept in a message (escaped, see :func:`~dcpinspect.render.safe_text`)
_TEXT_LIMIT = 200

# stream-end statuses (FACTS §6.6): re-request the stream for these ...
_REREQUEST_END = frozenset({2, 4, 5, 6})  # StateChanged, Slow, BackfillFail, Rollback (sent as StateChanged)
# ... these end it normally
_NORMAL_END = frozenset({0, 1, 7})  # OK, Closed, FilterEmpty


def flow_control_size(frame: Frame) -> int:
    """Bytes a producer charges to the flow-control buffer for ``frame`` (FACTS §7.5).

    The full packet length for every stream message (markers, items, system
    events, seqno-advanced, OSO, stream-end, set-vbucket-state, cache transfer),
    plus 2 for a DCP_PREPARE (MB-46634); 0 for noops, responses and anything else.
    """
    if frame.dialect != "mcbp" or frame.is_response or frame.magic not in (0x80, 0x08):
        return 0
    op = frame.opcode
    if op not in _FLOW_CONTROLLED:
        return 0
    return frame.length + (2 if op == 0x60 else 0)


# ---------------------------------------------------------------------------
# resume state


@dataclass
class VbState:
    """Where a vbucket's stream stands: enough to resume it (FACTS §7.2, §7.3).

    ``seqno`` is the last seqno received, ``snap_start``/``snap_end`` the
    bounds of the snapshot it belongs to (equal to ``seqno`` once that
    snapshot is complete), ``vb_uuid`` the newest failover-log entry's uuid,
    ``failover_log`` the log as ``(uuid, seqno)`` pairs, newest first.
    """

    vb_uuid: int = 0
    seqno: int = 0
    snap_start: int = 0
    snap_end: int = 0
    failover_log: list[tuple[int, int]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "vb_uuid": self.vb_uuid,
            "seqno": self.seqno,
            "snap_start": self.snap_start,
            "snap_end": self.snap_end,
            "failover_log": [[u, s] for u, s in self.failover_log],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> VbState:
        """Inverse of :meth:`to_dict` (raises ``ValueError`` on a malformed entry)."""
        try:
            st = cls(
                vb_uuid=_u64(d.get("vb_uuid", 0)),
                seqno=_u64(d.get("seqno", 0)),
                snap_start=_u64(d.get("snap_start", d.get("seqno", 0))),
                snap_end=_u64(d.get("snap_end", d.get("seqno", 0))),
                failover_log=[(_u64(u), _u64(s)) for u, s in d.get("failover_log", [])],
            )
        except (TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed vbucket state: {exc}") from None
        if not st.snap_start <= st.seqno <= st.snap_end:
            raise ValueError(f"snapshot {st.snap_start}..{st.snap_end} does not contain seqno {st.seqno}")
        return st


def _u64(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_SEQNO:
        raise ValueError(f"{v!r} is not an unsigned 64-bit integer")
    return v


@dataclass
class ResumeState:
    """Per-vbucket resume points of a consumer; JSON-serialisable.

    >>> s = ResumeState(bucket="default", vbuckets={0: VbState(vb_uuid=7, seqno=3, snap_start=3, snap_end=3, failover_log=[(7, 0)])})
    >>> ResumeState.from_json(s.to_json()) == s
    True
    """

    bucket: str = ""
    vbuckets: dict[int, VbState] = field(default_factory=dict)

    def to_json(self) -> str:
        """The state as a JSON document."""
        return json.dumps(
            {"version": 1, "bucket": self.bucket, "vbuckets": {str(vb): st.to_dict() for vb, st in sorted(self.vbuckets.items())}},
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> ResumeState:
        """Parse :meth:`to_json` output (raises ``ValueError`` if it is not one)."""
        try:
            doc = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"resume state is not JSON: {exc}") from None
        if not isinstance(doc, dict) or doc.get("version") != 1 or not isinstance(doc.get("vbuckets"), dict):
            raise ValueError("not a dcpinspect resume state (version 1)")
        vbs: dict[int, VbState] = {}
        for k, v in doc["vbuckets"].items():
            if not str(k).isdigit() or not isinstance(v, dict):
                raise ValueError(f"bad vbucket entry {k!r}")
            vbs[int(k)] = VbState.from_dict(v)
        return cls(bucket=str(doc.get("bucket", "")), vbuckets=vbs)

    def copy(self) -> ResumeState:
        """A deep copy."""
        return copy.deepcopy(self)


# ---------------------------------------------------------------------------
# configuration, events, per-stream info


@dataclass
class ConsumerConfig:
    """What a :class:`DcpConsumer` asks for.  The password is never shown in its repr.

    Attributes:
        bucket, user, password: the bucket to stream and the credentials.
        name: the DCP connection name (DCP_OPEN key; reusing a live name kills the older connection).
        agent: the HELLO agent name.
        features: HELLO feature codes wanted (FACTS §4.1).
        mechanisms: SASL mechanisms acceptable, strongest first.
        open_flags: DCP_OPEN flags; 0x01 (producer: *we* consume) is always added.
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
        stream_value: stream-request JSON value (collections filter, FACTS §6.4), e.g. ``{"collections": ["8"]}``.
        resume: where to resume from (``None``: from the beginning).
        max_rollbacks: rollbacks/re-requests in a row before a vbucket is given up.
        response_timeout: seconds to wait for a bootstrap reply (the connection fails) or a stream
            request's reply (that vbucket fails).
    """

    bucket: str
    user: str
    password: str = field(default="", repr=False)
    name: str = "dcpinspect"
    agent: str = "dcpinspect/0.1"
    features: tuple[int, ...] = DEFAULT_FEATURES
    mechanisms: tuple[str, ...] = DEFAULT_MECHANISMS
    open_flags: int = spec.OPEN_PRODUCER
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


@dataclass(frozen=True)
class ConsumerEvent:
    """Something that happened on the connection.

    ``kind`` is one of: ``hello``, ``authenticated``, ``auth_failed``,
    ``bucket_selected``, ``seqnos``, ``opened``, ``control``,
    ``control_rejected``, ``stream_requested``, ``stream_started``,
    ``rollback``, ``stream_failed``, ``stream_end``, ``rerequest``,
    ``snapshot``, ``mutation``, ``deletion``, ``expiration``, ``prepare``,
    ``commit``, ``abort``, ``system_event``, ``seqno_advanced``, ``oso``,
    ``set_vbucket_state``, ``cache_transfer``, ``checkpoint`` (a consistent
    point: persist :attr:`DcpConsumer.state`), ``noop``, ``buffer_ack``,
    ``malformed``, ``unexpected``, ``error`` (a fatal failure; the consumer
    is done), ``done`` (all streams ended).
    """

    kind: str
    message: str = ""
    vbucket: int | None = None
    data: Mapping[str, Any] = field(default_factory=dict)
    dissection: Dissection | None = field(default=None, repr=False, compare=False)

    def __str__(self) -> str:
        where = f"vb {self.vbucket}: " if self.vbucket is not None else ""
        return f"{self.kind}: {where}{self.message}" if self.message else f"{self.kind}: {where}".rstrip(": ")


class Phase:
    """Connection phases (string constants)."""

    HELLO = "hello"
    SASL_MECHS = "sasl_mechs"
    SASL_AUTH = "sasl_auth"
    SELECT_BUCKET = "select_bucket"
    SEQNOS = "seqnos"
    OPEN = "open"
    CONTROLS = "controls"
    STREAMING = "streaming"
    DONE = "done"
    FAILED = "failed"


@dataclass
class StreamInfo:
    """One vbucket's stream as the consumer sees it (live, not the persisted state).

    ``status`` is ``pending``, ``requested``, ``streaming``, ``ended`` or ``failed``.
    """

    vbucket: int
    position: VbState
    status: str = "pending"
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
    # snapshot being received: (start, end, flags, opaque of a marker that wants an ack)
    marker: tuple[int, int, int] | None = None
    marker_ack: int | None = None
    oso: bool = False
    oso_before: int = 0
    oso_max: int = 0
    retries_in_a_row: int = 0
    requested_at: float = 0.0  # when the pending stream request was sent

    @property
    def finished(self) -> bool:
        """Ended or failed."""
        return self.status in ("ended", "failed")


# ---------------------------------------------------------------------------
# the consumer


class DcpConsumer:
    """A DCP consumer connection as a pure state machine.

    Feed it what the server sent with :meth:`receive`, send what
    :meth:`data_to_send` returns, call :meth:`tick` now and then.  It starts
    by queueing HELLO.  Never raises on server input: malformed frames and
    unexpected replies become ``malformed``/``unexpected`` events; bytes that
    are not frames at all (the framing is lost), a reply it cannot act upon,
    and silence where a reply is due (``response_timeout``) fail the connection.
    """

    def __init__(self, config: ConsumerConfig, now: float = 0.0) -> None:
        self.config = config
        self.phase = Phase.HELLO
        self.failure: str | None = None
        self.context = DissectContext()
        self.features: tuple[int, ...] = ()
        self.mechanism: str | None = None
        self.rejected_controls: dict[str, int] = {}
        self.end_on_close = False  # send_stream_end_on_client_close_stream accepted
        self._closing_since = 0.0
        self.flow_control = False
        self.noop = False
        self.unacked = 0
        #: withhold buffer acknowledgements (a stalled consumer, FACTS §7.5); acks resume when set back to False
        self.hold_acks = False
        self.acked_total = 0
        self.consumed_total = 0
        self._out = bytearray()
        self._decoder = FrameDecoder()
        self._opaque = 0
        self._pending: dict[int, tuple[str, Any]] = {}  # opaque -> (what, detail)
        self._pending_since = now
        self._last_rx = now
        self._now = now  # the latest time passed in
        self._stat_keys = 0
        self._scram: ScramClient | None = None
        self._controls: list[tuple[str, str]] = []
        self._high: dict[int, int] = {}
        self._stat_high: dict[int, int] = {}
        resume = config.resume.copy() if config.resume is not None else ResumeState(bucket=config.bucket)
        self._committed = resume
        self.streams: dict[int, StreamInfo] = {}
        for vb in config.vbuckets or ():
            self._add_stream(vb)
        self._by_opaque: dict[int, StreamInfo] = {}
        self._done_reported = False
        self._send_hello()

    def _add_stream(self, vb: int) -> None:
        pos = copy.deepcopy(self._committed.vbuckets.get(vb, VbState()))
        self.streams[vb] = StreamInfo(vb, pos, sid=vb + 1 if self.config.stream_ids else None)

    # --- public API -------------------------------------------------------------
    @property
    def state(self) -> ResumeState:
        """The resume state as of each vbucket's last consistent point (a copy; persist this)."""
        return self._committed.copy()

    @property
    def done(self) -> bool:
        """True once every stream ended or failed, or the connection failed."""
        return self.phase in (Phase.DONE, Phase.FAILED)

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
                reason = _server_text(getattr(ev, "reason", ev.type))
                events.append(ConsumerEvent("malformed", f"{ev.type} at offset {ev.offset}: {reason}", data={"offset": ev.offset}))
                if not self.done:  # the frame boundaries are lost: replies and stream ends may be gone (as memcached, drop it)
                    self._fail(events, f"the server sent bytes that are not frames ({ev.type} at offset {ev.offset}: {reason})")
                continue
            if self.phase == Phase.FAILED:
                break  # nothing after a fatal failure is acted upon
            try:
                self._frame(ev, now, events)
            except Exception as exc:  # the server's bytes must never crash the client
                events.append(ConsumerEvent("malformed", f"{ev.name} at offset {ev.offset}: {_exc_text(exc)}"))
        self._maybe_ack(events)
        self._check_done(events)
        return events

    def tick(self, now: float) -> list[ConsumerEvent]:
        """Time passes: detect a dead connection (FACTS §7.6) and bootstrap timeouts."""
        events: list[ConsumerEvent] = []
        self._now = now
        if self.done:
            return events
        if self.phase == Phase.STREAMING:
            timeout = self.config.response_timeout
            for st in self.streams.values():  # a stream request the server never answers fails that vbucket
                if st.status == "requested" and now - st.requested_at > timeout:
                    self._pending.pop(st.opaque, None)
                    self._fail_stream(st, f"no reply to the stream request within {timeout:g} s", events)
            self._check_done(events)
            if self.done:
                return events
            closing = [st for st in self.streams.values() if st.status == "closing"]
            if closing and now - self._closing_since > self.config.response_timeout:
                for st in closing:  # the producer never confirmed: closed all the same
                    self._end_stream(st, "Closed (by client; no STREAM_END within the response timeout)", events)
                self._check_done(events)
                if self.done:
                    return events
            if self.noop and self.config.noop_interval and now - self._last_rx > 2 * self.config.noop_interval:
                self._fail(
                    events, f"no traffic from the server for {now - self._last_rx:.1f} s (noop interval {self.config.noop_interval:g} s)"
                )
            self._maybe_ack(events)  # acks held back are sent once released, even while nothing arrives
        elif now - self._pending_since > self.config.response_timeout:
            if self._pending:
                self._fail(events, f"no reply to {next(iter(self._pending.values()))[0]} within {self.config.response_timeout:g} s")
            else:  # cannot happen unless a reply was mishandled; never wait forever
                self._fail(events, f"bootstrap stalled in phase {self.phase} for {self.config.response_timeout:g} s")
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

    def close_streams(self, now: float | None = None) -> list[ConsumerEvent]:
        """Stop: ask the server to close every live stream (DCP_CLOSE_STREAM); all streams end as ``Closed``; done.

        When ``send_stream_end_on_client_close_stream`` was accepted, a streaming
        stream stays ``closing`` until the producer's STREAM_END(Closed) arrives
        (FACTS §6.3) - messages still in flight are applied meanwhile - or until
        ``response_timeout`` passes (see :meth:`tick`).  Calling it again is harmless.
        """
        events: list[ConsumerEvent] = []
        for st in self.streams.values():
            if st.finished or st.status == "closing":
                continue
            if st.status in ("streaming", "requested"):
                self._send("DCP_CLOSE_STREAM", vbucket=st.vbucket, stream_id=st.sid if self._sids_on else None)
                if self.end_on_close and st.status == "streaming":
                    st.status = "closing"
                    self._closing_since = self._last_rx if now is None else now
                    continue
            self._end_stream(st, "Closed (by client)", events)
        if not self.done:
            self.phase = Phase.STREAMING  # a stop during the bootstrap ends it too
            self._check_done(events)
        return events

    # --- sending ------------------------------------------------------------------
    def _next_opaque(self) -> int:
        self._opaque += 1
        return self._opaque

    def _send(self, name: str, **kw: Any) -> None:
        self._out += encode(name, **kw)

    def _request(self, what: str, name: str, detail: Any = None, now: float | None = None, **kw: Any) -> int:
        opaque = self._next_opaque()
        self._pending[opaque] = (what, detail)
        if now is not None:
            self._pending_since = now
        self._send(name, opaque=opaque, **kw)
        return opaque

    def _send_hello(self) -> None:
        feats = list(dict.fromkeys(self.config.features))
        self._request("HELLO", "HELLO", key=self.config.agent, value={"features": [{"feature": f} for f in feats]})

    @property
    def _sids_on(self) -> bool:
        return bool(self.context.stream_ids)

    # --- dispatch -----------------------------------------------------------------
    def _frame(self, frame: Frame, now: float, events: list[ConsumerEvent]) -> None:
        d = dissect(frame, self.context)
        size = flow_control_size(frame)
        if size and self.flow_control:
            self.unacked += size
            self.consumed_total += size
        if d.role == "response":
            self._response(frame, d, now, events)
        else:
            self._server_request(frame, d, events)

    def _response(self, frame: Frame, d: Dissection, now: float, events: list[ConsumerEvent]) -> None:
        pending = self._pending.pop(frame.opaque, None)
        if pending is None:
            status = frame.status or 0
            events.append(
                ConsumerEvent(
                    "unexpected",
                    f"{d.name} response with opaque 0x{frame.opaque:08x} matches no request (status {_status(status)})",
                    dissection=d,
                )
            )
            return
        self._pending_since = now
        what, detail = pending
        handler = getattr(self, f"_on_{what.lower()}")
        try:
            handler(frame, d, detail, now, events)
        except Exception as exc:  # the request is answered but not acted upon: nothing would ever time out
            self._fail(events, f"cannot handle the {d.name} reply: {_exc_text(exc)}")

    # --- bootstrap ------------------------------------------------------------------
    def _on_hello(self, frame: Frame, d: Dissection, detail: Any, now: float, events: list[ConsumerEvent]) -> None:
        if frame.status != spec.SUCCESS:
            self._fail(events, f"HELLO refused: {_status(frame.status)}")
            return
        feats = tuple(int(f["feature"]) for f in d.body.get("features", []))
        self.features = feats
        self.context = self.context.with_features(feats)
        names = ", ".join(spec.FEATURES.get(f, f"0x{f:02x}") for f in feats)
        events.append(ConsumerEvent("hello", f"server accepted {names or 'no features'}", data={"features": list(feats)}))
        self.phase = Phase.SASL_MECHS
        self._request("SASL_MECHS", "SASL_LIST_MECHS", now=now)

    def _on_sasl_mechs(self, frame: Frame, d: Dissection, detail: Any, now: float, events: list[ConsumerEvent]) -> None:
        if frame.status != spec.SUCCESS:
            self._fail(events, f"SASL_LIST_MECHS failed: {_status(frame.status)}", kind="auth_failed")
            return
        offered = frame.value.decode("ascii", "replace").split()
        mech = next((m for m in self.config.mechanisms if m in offered), None)
        if mech is None:
            shown = _server_text(" ".join(offered)) or "none"
            self._fail(events, f"no common SASL mechanism (server offers {shown})", kind="auth_failed")
            return
        self.mechanism = mech
        self.phase = Phase.SASL_AUTH
        if mech in SCRAM_HASHES:
            self._scram = ScramClient(mech, self.config.user, self.config.password)
            payload = self._scram.first()
        else:
            payload = plain_payload(self.config.user, self.config.password)
        self._request("SASL_AUTH", "SASL_AUTH", key=mech, value=payload, now=now)

    def _on_sasl_auth(self, frame: Frame, d: Dissection, detail: Any, now: float, events: list[ConsumerEvent]) -> None:
        status = frame.status
        mech = self.mechanism or ""
        if status == spec.AUTH_CONTINUE and self._scram is not None:
            try:
                payload = self._scram.final(frame.value)
            except SaslError as exc:
                self._fail(events, f"SASL {mech}: {_server_text(str(exc))}", kind="auth_failed")
                return
            self._request("SASL_AUTH", "SASL_STEP", key=mech, value=payload, now=now)
            return
        if status != spec.SUCCESS:
            context = f" ({_server_text(frame.value.decode('utf-8', 'replace'))})" if frame.value else ""
            self._fail(
                events,
                f"authentication failed for user {self.config.user!r} with {mech}: {_status(status)}{context}",
                kind="auth_failed",
            )
            return
        if self._scram is not None:
            try:
                self._scram.check(frame.value)
            except SaslError as exc:
                self._fail(events, f"SASL {mech}: {_server_text(str(exc))}", kind="auth_failed")
                return
        self._scram = None
        events.append(ConsumerEvent("authenticated", f"as {self.config.user!r} with {mech}", data={"mechanism": mech}))
        self.phase = Phase.SELECT_BUCKET
        self._request("SELECT_BUCKET", "SELECT_BUCKET", key=self.config.bucket, now=now)

    def _on_select_bucket(self, frame: Frame, d: Dissection, detail: Any, now: float, events: list[ConsumerEvent]) -> None:
        if frame.status != spec.SUCCESS:
            self._fail(events, f"cannot select bucket {self.config.bucket!r}: {_status(frame.status)}")
            return
        events.append(ConsumerEvent("bucket_selected", self.config.bucket))
        if self.config.to_latest or self.config.vbuckets is None:
            self.phase = Phase.SEQNOS
            self._request("SEQNOS", "GET_ALL_VB_SEQNOS", now=now)
        else:
            self._open(now)

    def _on_seqnos(self, frame: Frame, d: Dissection, detail: Any, now: float, events: list[ConsumerEvent]) -> None:
        if frame.status != spec.SUCCESS:
            # FACTS §4.3: the same numbers are in STAT "vbucket-seqno" (one response per stat, then an empty one)
            self._stat_high = {}
            self._request("STAT", "STAT", key="vbucket-seqno", now=now)
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
        if frame.status != spec.SUCCESS:
            self._fail(events, f"cannot learn the high seqnos (GET_ALL_VB_SEQNOS and STAT vbucket-seqno failed: {_status(frame.status)})")
            return
        if frame.key:
            self._stat_keys += 1
            if self._stat_keys > _MAX_STAT_KEYS:
                self._fail(events, f"STAT vbucket-seqno: more than {_MAX_STAT_KEYS} keys and no end")
                return
            m = _STAT_HIGH.match(frame.key.decode("ascii", "replace"))
            if m and int(m.group(1)) <= _MAX_VBUCKET:
                try:
                    self._stat_high[int(m.group(1))] = _u64(int(frame.value.decode("ascii")))
                except (ValueError, UnicodeDecodeError):
                    text = _server_text(repr(frame.value))
                    events.append(
                        ConsumerEvent("malformed", f"STAT {_server_text(repr(frame.key))} value {text} is not a seqno", dissection=d)
                    )
            self._pending[frame.opaque] = ("STAT", detail)  # more responses follow
            return
        self._high = dict(self._stat_high)
        self._seqnos_known(now, events)

    def _seqnos_known(self, now: float, events: list[ConsumerEvent]) -> None:
        if self.config.vbuckets is None:  # every vbucket the server has
            for vb in sorted(self._high):
                self._add_stream(vb)
        mine = {vb: self._high.get(vb) for vb in self.streams}
        events.append(ConsumerEvent("seqnos", ", ".join(f"vb {vb}: {h}" for vb, h in mine.items()), data={"high_seqnos": mine}))
        for vb, high in mine.items():
            self.streams[vb].high_seqno = high
        self._open(now)

    def _open(self, now: float) -> None:
        self.phase = Phase.OPEN
        flags = self.config.open_flags | spec.OPEN_PRODUCER
        self._request("OPEN", "DCP_OPEN", detail=flags, extras={"seqno": 0, "flags": flags}, key=self.config.name, now=now)

    def _on_open(self, frame: Frame, d: Dissection, detail: Any, now: float, events: list[ConsumerEvent]) -> None:
        if frame.status != spec.SUCCESS:
            self._fail(events, f"DCP_OPEN {self.config.name!r} refused: {_status(frame.status)}")
            return
        self.context = self.context.with_open_flags(int(detail))
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
        self.phase = Phase.CONTROLS
        self._next_control(now, events)

    def _next_control(self, now: float, events: list[ConsumerEvent]) -> None:
        if not self._controls:
            self._start_streaming(now, events)
            return
        key, value = self._controls.pop(0)
        self._request("CONTROL", "DCP_CONTROL", detail=(key, value), key=key, value=value.encode(), now=now)

    def _on_control(self, frame: Frame, d: Dissection, detail: Any, now: float, events: list[ConsumerEvent]) -> None:
        key, value = detail
        if frame.status == spec.SUCCESS:
            events.append(ConsumerEvent("control", f"{key}={value}", data={"key": key, "value": value}))
            if key == "connection_buffer_size":
                self.flow_control = int(value) > 0
            elif key == "enable_noop":
                self.noop = value == "true"
            elif key == "enable_stream_id":
                self.context = replace(self.context, stream_ids=True)
            elif key == "send_stream_end_on_client_close_stream":
                self.end_on_close = value == "true"
        else:
            status = frame.status or 0
            self.rejected_controls[key] = status
            events.append(ConsumerEvent("control_rejected", f"{key}={value}: {_status(status)}", data={"key": key, "status": status}))
            if key == "enable_noop":  # its interval would be rejected too; do not ask
                self._controls = [(k, v) for k, v in self._controls if k != "set_noop_interval"]
        self._next_control(now, events)

    # --- streams --------------------------------------------------------------------
    def _start_streaming(self, now: float, events: list[ConsumerEvent]) -> None:
        self.phase = Phase.STREAMING
        self._last_rx = now
        if not self.streams:
            self._check_done(events)
            return
        for st in self.streams.values():
            if self.config.to_latest and st.high_seqno is None:
                self._fail_stream(st, "vbucket not listed by the server (not on this node?)", events)
                continue
            self._stream_request(st, events)

    def _stream_request(self, st: StreamInfo, events: list[ConsumerEvent]) -> None:
        pos = st.position
        end = self.config.end_seqno
        if self.config.to_latest and st.high_seqno is not None:
            # the producer checks start <= end before the rollback check (FACTS §6.4), so never ask for end < start
            end = max(st.high_seqno, pos.seqno)
        # FACTS §7.2: snap_start <= start <= snap_end; a complete snapshot is start = snap_start = snap_end
        snap_start, snap_end = pos.snap_start, pos.snap_end
        if not snap_start <= pos.seqno <= snap_end:
            snap_start = snap_end = pos.seqno
        value: dict[str, Any] = dict(self.config.stream_value or {})
        if self._sids_on and st.sid is not None:
            value["sid"] = st.sid
        opaque = 0x1000 + self._next_opaque()
        st.opaque = opaque
        st.status = "requested"
        st.end_seqno = end
        st.start_seqno = pos.seqno
        st.marker = None
        st.marker_ack = None
        st.oso = False
        st.requested_at = self._now
        self._by_opaque[opaque] = st
        self._pending[opaque] = ("STREAM_REQ", st)
        extras = {
            "flags": self.config.stream_flags,
            "reserved": 0,
            "start_seqno": pos.seqno,
            "end_seqno": end,
            "vb_uuid": pos.vb_uuid,
            "snap_start_seqno": snap_start,
            "snap_end_seqno": snap_end,
        }
        self._send("DCP_STREAM_REQ", extras=extras, vbucket=st.vbucket, opaque=opaque, value=json.dumps(value).encode() if value else None)
        events.append(
            ConsumerEvent(
                "stream_requested",
                f"start {pos.seqno} end {end} uuid 0x{pos.vb_uuid:x} snapshot {snap_start}..{snap_end}",
                st.vbucket,
                extras,
            )
        )

    def _on_stream_req(self, frame: Frame, d: Dissection, st: StreamInfo, now: float, events: list[ConsumerEvent]) -> None:
        if st.opaque != frame.opaque or st.finished:
            return
        status = frame.status
        if status == spec.SUCCESS:
            log = [(int(e["vb_uuid"]), int(e["vb_seqno"])) for e in d.body.get("failover_log", [])]
            if log:
                st.position.failover_log = log
                st.position.vb_uuid = log[0][0]  # FACTS §7.3: resume with the newest entry's uuid
            else:
                events.append(ConsumerEvent("malformed", "stream accepted with an empty failover log", st.vbucket, dissection=d))
            st.status = "streaming"
            self._commit(st, events)
            events.append(
                ConsumerEvent(
                    "stream_started",
                    f"{len(log)} failover entries, newest uuid 0x{st.position.vb_uuid:x}",
                    st.vbucket,
                    {"failover_log": log},
                )
            )
            return
        if status == spec.ROLLBACK:
            r = d.body.get("rollback_seqno")
            if not isinstance(r, int):
                self._fail_stream(st, "rollback response without a rollback seqno", events, d)
                return
            self._rollback(st, r, events)
            return
        context = _server_text(frame.value.decode("utf-8", "replace")) if frame.value else ""
        self._fail_stream(st, f"stream request refused: {_status(status)}" + (f" ({context})" if context else ""), events, d)

    def _rollback(self, st: StreamInfo, r: int, events: list[ConsumerEvent]) -> None:
        """FACTS §7.4: roll back to ``r``, trim the failover log, retry with its newest uuid."""
        pos = st.position
        before = (pos.seqno, pos.vb_uuid, pos.snap_start, pos.snap_end)
        st.rollbacks += 1
        st.retries_in_a_row += 1
        if r > pos.seqno:
            events.append(ConsumerEvent("malformed", f"rollback to {r}, above the requested start {pos.seqno}", st.vbucket))
        seqno = min(r, pos.seqno)
        log = [(u, s) for u, s in pos.failover_log if s <= seqno]
        if seqno == 0:
            log = []  # nothing left: ask as a fresh client (uuid 0 = no history, FACTS §7.2/§7.3)
        pos.failover_log = log
        pos.vb_uuid = log[0][0] if log else 0
        pos.seqno = pos.snap_start = pos.snap_end = seqno
        self._commit(st, events)
        events.append(
            ConsumerEvent(
                "rollback",
                f"to {r} (from {before[0]}); retrying with uuid 0x{pos.vb_uuid:x}",
                st.vbucket,
                {"rollback_seqno": r, "from_seqno": before[0], "vb_uuid": pos.vb_uuid, "failover_log": list(log)},
            )
        )
        if st.retries_in_a_row > self.config.max_rollbacks:
            self._fail_stream(st, f"gave up after {st.retries_in_a_row - 1} rollbacks in a row", events)
            return
        self._stream_request(st, events)

    def _fail_stream(self, st: StreamInfo, why: str, events: list[ConsumerEvent], d: Dissection | None = None) -> None:
        st.status = "failed"
        st.error = why
        self._by_opaque.pop(st.opaque, None)
        events.append(ConsumerEvent("stream_failed", why, st.vbucket, dissection=d))

    def _end_stream(self, st: StreamInfo, reason: str, events: list[ConsumerEvent]) -> None:
        st.status = "ended"
        st.end_reason = reason
        self._by_opaque.pop(st.opaque, None)
        self._commit(st, events)

    def _commit(self, st: StreamInfo, events: list[ConsumerEvent]) -> None:
        self._committed.vbuckets[st.vbucket] = copy.deepcopy(st.position)
        events.append(ConsumerEvent("checkpoint", f"seqno {st.position.seqno}", st.vbucket, {"seqno": st.position.seqno}))

    # --- producer messages ---------------------------------------------------------------
    def _server_request(self, frame: Frame, d: Dissection, events: list[ConsumerEvent]) -> None:
        op = frame.opcode
        if frame.magic not in (0x80, 0x08):
            events.append(ConsumerEvent("unexpected", f"server request {d.name} (magic 0x{frame.magic:02x}) ignored", dissection=d))
            return
        if op == _OP["DCP_NOOP"]:
            self._send("DCP_NOOP", response=True, opaque=frame.opaque)  # FACTS §6.12: mandatory reply, same opaque
            events.append(ConsumerEvent("noop", f"opaque 0x{frame.opaque:08x}"))
            return
        st = self._by_opaque.get(frame.opaque)
        if st is None or (frame.vbucket is not None and frame.vbucket != st.vbucket):
            events.append(
                ConsumerEvent(
                    "unexpected",
                    f"{d.name} for no live stream (opaque 0x{frame.opaque:08x}, vb {frame.vbucket})",
                    frame.vbucket,
                    dissection=d,
                )
            )
            if op == _OP["DCP_SET_VBUCKET_STATE"]:
                self._send("DCP_SET_VBUCKET_STATE", response=True, opaque=frame.opaque)
            return
        if d.problems:
            events.append(ConsumerEvent("malformed", "; ".join(p.message for p in d.problems), st.vbucket, dissection=d))
        if st.status == "requested":  # messages before the stream-req response: the stream exists (full duplex)
            events.append(ConsumerEvent("unexpected", f"{d.name} before the stream request was answered", st.vbucket, dissection=d))
        ex = d.extras
        if op == _OP["DCP_SNAPSHOT_MARKER"]:
            self._marker(st, d, events)
        elif op in (_OP["DCP_MUTATION"], _OP["DCP_DELETION"], _OP["DCP_EXPIRATION"], _OP["DCP_PREPARE"], _OP["DCP_SYSTEM_EVENT"]):
            kind = {0x57: "mutation", 0x58: "deletion", 0x59: "expiration", 0x60: "prepare", 0x5F: "system_event"}[op]
            self._item(st, kind, _need(ex, "by_seqno"), d, events)
        elif op in (_OP["DCP_COMMIT"], _OP["DCP_ABORT"]):
            kind = "commit" if op == _OP["DCP_COMMIT"] else "abort"
            self._item(st, kind, _need(ex, f"{kind}_seqno"), d, events)
        elif op == _OP["DCP_SEQNO_ADVANCED"]:
            self._seqno_advanced(st, _need(ex, "seqno"), d, events)
        elif op == _OP["DCP_OSO_SNAPSHOT"]:
            self._oso(st, _need(ex, "flags"), d, events)
        elif op == _OP["DCP_STREAM_END"]:
            self._stream_end(st, _need(ex, "status"), d, events)
        elif op == _OP["DCP_SET_VBUCKET_STATE"]:
            self._send("DCP_SET_VBUCKET_STATE", response=True, opaque=frame.opaque)  # FACTS §6.11: the producer waits for it
            events.append(
                ConsumerEvent(
                    "set_vbucket_state", str(spec.VBUCKET_STATES.get(ex.get("state", 0), ex.get("state"))), st.vbucket, dissection=d
                )
            )
        elif op in (_OP["DCP_CACHE_TRANSFER"], _OP["DCP_CACHE_TRANSFER_END"]):
            st.counts["cache_transfer"] += 1
            events.append(ConsumerEvent("cache_transfer", d.name, st.vbucket, dissection=d))
        else:
            events.append(ConsumerEvent("unexpected", f"{d.name} request from the server ignored", st.vbucket, dissection=d))

    def _marker(self, st: StreamInfo, d: Dissection, events: list[ConsumerEvent]) -> None:
        src = d.extras if "start_seqno" in d.extras else d.body  # v1: extras; v2.x: value (FACTS §6.7)
        start, end, flags = _need(src, "start_seqno"), _need(src, "end_seqno"), _need(src, "flags")
        if end < start:
            events.append(ConsumerEvent("malformed", f"snapshot marker {start}..{end} ends before it starts", st.vbucket, dissection=d))
        if st.marker is not None:
            # the previous snapshot is over (the producer moved on): a consistent point
            self._snapshot_complete(st, events)
        st.marker = (start, end, flags)
        st.marker_ack = d.frame.opaque if flags & 0x08 else None
        st.counts["snapshot"] += 1
        names = "|".join(n for bit, n in spec.SNAPSHOT_FLAGS.items() if flags & bit) or "0"
        events.append(ConsumerEvent("snapshot", f"{start}..{end} ({names})", st.vbucket, {"start": start, "end": end, "flags": flags}, d))
        if end == st.position.seqno and start <= end:  # nothing in it we do not have (e.g. first marker of an empty range)
            self._snapshot_complete(st, events)

    def _item(self, st: StreamInfo, kind: str, seqno: int, d: Dissection, events: list[ConsumerEvent]) -> None:
        st.counts[kind] += 1
        pos = st.position
        if st.oso:
            st.oso_max = max(st.oso_max, seqno)  # FACTS §6.20: key order inside; remember the highest
            events.append(ConsumerEvent(kind, d.key_text, st.vbucket, {"seqno": seqno}, d))
            return
        if seqno <= pos.seqno:
            events.append(
                ConsumerEvent("malformed", f"{kind} seqno {seqno} not above the last seqno {pos.seqno}", st.vbucket, dissection=d)
            )
        events.append(ConsumerEvent(kind, d.key_text, st.vbucket, {"seqno": seqno}, d))
        self._advance(st, seqno, events, d)

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
            pos.snap_start = pos.snap_end = pos.seqno  # FACTS §7.2: after a complete snapshot start = snap_start = snap_end
        if st.marker_ack is not None:  # FACTS §6.7 Ack flag: reply once the whole snapshot is in
            self._send("DCP_SNAPSHOT_MARKER", response=True, opaque=st.marker_ack)
            st.marker_ack = None
        st.marker = None
        self._commit(st, events)

    def _seqno_advanced(self, st: StreamInfo, seqno: int, d: Dissection, events: list[ConsumerEvent]) -> None:
        st.counts["seqno_advanced"] += 1
        events.append(ConsumerEvent("seqno_advanced", str(seqno), st.vbucket, {"seqno": seqno}, d))
        if st.oso:
            st.oso_max = max(st.oso_max, seqno)
            return
        if st.marker is None:
            # outside a snapshot (e.g. after an OSO backfill, FACTS §6.20): a resume point of its own
            st.position.seqno = st.position.snap_start = st.position.snap_end = max(st.position.seqno, seqno)
            self._commit(st, events)
            return
        self._advance(st, seqno, events, d)

    def _oso(self, st: StreamInfo, flags: int, d: Dissection, events: list[ConsumerEvent]) -> None:
        st.counts["oso"] += 1
        events.append(
            ConsumerEvent("oso", "start" if flags & 1 else "end" if flags & 2 else f"flags 0x{flags:x}", st.vbucket, {"flags": flags}, d)
        )
        if flags & 0x01:
            st.oso = True
            st.oso_before = st.position.seqno  # Y: resume point if the stream breaks inside
            st.oso_max = st.position.seqno
        elif flags & 0x02 and st.oso:
            st.oso = False
            pos = st.position
            pos.seqno = pos.snap_start = pos.snap_end = max(st.oso_max, pos.seqno)  # X
            st.marker = None
            self._commit(st, events)

    def _stream_end(self, st: StreamInfo, status: int, d: Dissection, events: list[ConsumerEvent]) -> None:
        name = spec.STREAM_END_STATUS.get(status, f"unknown {status}")
        closing = st.status == "closing"
        if st.oso:  # broke inside an OSO snapshot: resume from before it (FACTS §6.20)
            st.oso = False
            st.position.seqno = st.position.snap_start = st.position.snap_end = st.oso_before
        elif st.marker is not None and st.position.seqno >= st.marker[1]:
            self._snapshot_complete(st, events)
        st.marker = None
        events.append(ConsumerEvent("stream_end", name, st.vbucket, {"status": status, "seqno": st.position.seqno}, d))
        if closing:  # the end of a stream we closed (Closed, or whatever ended it first): never re-requested
            self._end_stream(st, f"{name} (closed by client)", events)
            self._check_done(events)
            return
        if status in _REREQUEST_END:
            st.rerequests += 1
            st.retries_in_a_row += 1
            self._by_opaque.pop(st.opaque, None)
            self._commit(st, events)
            if st.retries_in_a_row > self.config.max_rollbacks:
                self._fail_stream(st, f"stream ended {name} {st.retries_in_a_row - 1} times in a row; giving up", events)
                return
            events.append(ConsumerEvent("rerequest", f"after {name}", st.vbucket))
            self._stream_request(st, events)
            return
        if status in _NORMAL_END:
            self._end_stream(st, name, events)
            return
        self._end_stream(st, name, events)
        st.status = "failed"
        st.error = f"stream ended: {name}"
        events.append(ConsumerEvent("stream_failed", st.error, st.vbucket))

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
        if self.phase != Phase.STREAMING:
            return
        if all(st.finished for st in self.streams.values()):
            self.phase = Phase.DONE
            if not self._done_reported:
                self._done_reported = True
                failed = [vb for vb, st in self.streams.items() if st.status == "failed"]
                events.append(ConsumerEvent("done", f"all streams ended ({len(failed)} failed)", data={"failed": failed}))
        else:
            for st in self.streams.values():
                if st.status == "streaming" and st.retries_in_a_row and st.position.seqno > st.start_seqno:
                    st.retries_in_a_row = 0  # progress: the retry budget starts again

    def _fail(self, events: list[ConsumerEvent], why: str, *, kind: str = "error") -> None:
        self.phase = Phase.FAILED
        self.failure = why
        self._pending.clear()
        events.append(ConsumerEvent(kind, why))
        if kind != "error":
            events.append(ConsumerEvent("error", why))


def _need(values: Mapping[str, Any], name: str) -> int:
    v = values.get(name)
    if not isinstance(v, int):
        raise ValueError(f"field {name} missing (frame too short)")
    return v


def _server_text(text: str) -> str:
    """Text the server sent, made safe to show: control characters escaped, shortened."""
    return safe_text(text, _TEXT_LIMIT)


def _exc_text(exc: BaseException) -> str:
    """An exception raised while reading the server's bytes, as one safe line."""
    return _server_text(f"{type(exc).__name__}: {exc}")


def _status(status: int | None) -> str:
    if status is None:
        return "no status"
    return f"0x{status:02x} {spec.STATUS.get(status, 'unknown')}"
