r"""A sans-IO DCP producer that behaves like a Couchbase data node: the session half.

No sockets, no asyncio, no clock reads: bytes go in with :meth:`ProducerConnection.receive`,
bytes come out of :meth:`ProducerConnection.data_to_send`, time is passed in.
Frames are built only with :func:`dcpinspect.wire.encode` and requests read only
with :class:`~dcpinspect.wire.decoder.FrameDecoder` + :func:`dcpinspect.wire.dissect`.
The data served lives in a :class:`~dcpinspect.live.cluster.Cluster`; the
streams are :class:`~dcpinspect.live.producer_streams.StreamingMixin`'s, the KV,
cluster-map, collections and stat commands :class:`~dcpinspect.live.kv.DataNodeMixin`'s.

1. Requests are handled in order, one at a time, each by the handler its opcode
   names in the dispatch table; an opcode without one is answered UnknownCommand.
   Before the handler: the magic (responses go to :meth:`ProducerConnection._handle_response`,
   anything but a request closes the connection), flexible framing (needs HELLO
   AltRequestSupport; unknown frame infos are refused), the extras length the
   table allows, and authentication (only HELLO, SASL, GET_ERROR_MAP, NOOP and
   QUIT before it).
2. Every request is answered except: DCP_BUFFER_ACKNOWLEDGEMENT, and
   DCP_SEQNO_ACKNOWLEDGED when it succeeds.  A DCP command on a connection
   without DCP_OPEN is EINVAL and the connection stays open (GET_FAILOVER_LOG
   0x96 works on any connection).  QUIT, garbage, a DCP_NOOP *request*, a noop
   reply with an opaque the producer never sent, or a DCP name reused on another
   connection close the connection (:attr:`ProducerConnection.close_reason` says which).
3. What the connection negotiated (HELLO features, DCP_OPEN flags, DCP_CONTROL
   keys) is tracked by a :class:`~dcpinspect.flows.session.ConnState` fed the
   requests received and the responses sent, exactly as a capture's connection is.
4. DCP_CONTROL is answered by the table's rule
   (:func:`~dcpinspect.protocol.session.control_status`); the value kept
   (:func:`~dcpinspect.protocol.session.control_value`: a one-way switch stays on)
   and its effect on this connection (noops, flow control) come from the table too.
5. Noops (kv_engine engines/ep/src/dcp/producer.cc ``maybeSendNoop``,
   ``maybeDisconnect``): once ``enable_noop`` is on, :meth:`ProducerConnection.tick`
   sends one whenever the noop interval (default 20 s) has passed since the last
   noop sent, whether or not data flows, but never a second while one is
   unanswered; the connection is dropped after the cluster's ``idle_timeout``
   (kv_engine's ``dcp_idle_timeout``, 360 s) with nothing received from the consumer.

>>> from dcpinspect import encode
>>> from dcpinspect.live.cluster import Cluster
>>> cluster = Cluster(seed=1)
>>> bucket = cluster.create_bucket("default", vbuckets=2, items=4)
>>> conn = ProducerConnection(cluster)
>>> conn.receive(encode("SASL_AUTH", key="PLAIN", value=b"\0Administrator\0password", opaque=1), now=0.0)
>>> conn.receive(encode("SELECT_BUCKET", key="default", opaque=2), now=0.0)
>>> conn.receive(encode("DCP_OPEN", key="demo", extras={"flags": 1}, opaque=3), now=0.0)
>>> conn.receive(encode("DCP_STREAM_REQ", extras={"end_seqno": 2**64 - 1}, opaque=4), now=0.0)
>>> from dcpinspect import decode
>>> [f.name for f in decode(conn.data_to_send())][-4:]
['DCP_STREAM_REQ', 'DCP_SNAPSHOT_MARKER', 'DCP_MUTATION', 'DCP_MUTATION']
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from ..flows.session import ConnState
from ..protocol import spec
from ..protocol.enums import Datatype, Feature, Magic, Opcode, OpenFlag, Status, VBucketState
from ..protocol.session import (
    DEFAULT_NOOP_INTERVAL,
    NOOP_OPAQUE_BASE,
    SESSION_OPS,
    control_on,
    control_status,
    control_value,
    parse_float,
    parse_u32,
)
from ..protocol.session import REQUEST_MAGICS as _REQUESTS
from ..protocol.session import RESPONSE_MAGICS as _RESPONSES
from ..wire.decoder import FrameDecoder
from ..wire.dissect import dissect
from ..wire.dissection import DissectContext, Dissection
from ..wire.encode import encode
from ..wire.events import Frame, Garbage
from ..wire.framing import parse_frame_infos
from . import sasl
from .cluster import Bucket, Cluster
from .kv import DataNodeMixin
from .producer_streams import StreamingMixin, json_value

__all__ = ["HANDLED_OPCODES", "NOOP_OPAQUE_BASE", "SUPPORTED_FEATURES", "UNANSWERED", "ProducerConnection"]

#: HELLO features the simulator accepts (each one is implemented), answered in the client's order.
#: Not Duplex, clustermap-change notifications, unordered execution or tracing: it pushes nothing,
#: answers in order and sends no server durations.
SUPPORTED_FEATURES: frozenset[int] = frozenset(
    int(f)
    for f in (
        Feature.TCP_NO_DELAY,
        Feature.MUTATION_SEQNO,
        Feature.XATTR,
        Feature.XERROR,
        Feature.SELECT_BUCKET,
        Feature.SNAPPY,
        Feature.JSON,
        Feature.ALT_REQUEST_SUPPORT,
        Feature.SYNC_REPLICATION,
        Feature.COLLECTIONS,
    )
)

#: the error map's attributes (GET_ERROR_MAP) of the statuses that are not plain internal errors
_ERROR_ATTRS: dict[int, list[str]] = {
    Status.SUCCESS: ["success"],
    Status.AUTH_ERROR: ["auth"],
    Status.AUTH_CONTINUE: ["special-handling"],
    Status.ROLLBACK: ["special-handling"],
    Status.ETMPFAIL: ["temp", "retry-later"],
}
_ALT_REQUEST = int(Magic.ALT_CLIENT_REQUEST)
_MAGICS = frozenset(spec.MAGICS)
_OPEN_INVALID = int(OpenFlag.INVALID | OpenFlag.UNUSED | OpenFlag.REMOVED) | ~int(sum(OpenFlag))
_ANY_STATE = 0  # GET_ALL_VB_SEQNOS: every state but dead
_LIVE_STATES = frozenset(int(s) for s in (VBucketState.ACTIVE, VBucketState.REPLICA, VBucketState.PENDING))
_MAX_STATE = max(VBucketState)


class ProducerConnection(DataNodeMixin, StreamingMixin):
    """One client connection to the simulated data node (sans-IO).

    Feed it the client's bytes with :meth:`receive`; take its output with
    :meth:`data_to_send`; call :meth:`tick` periodically (noops, idle
    disconnect, slow-consumer stream ends).  Never raises on peer input:
    malformed requests get an error status, garbage closes the connection
    (:attr:`closed`, :attr:`close_reason`).
    """

    def __init__(self, cluster: Cluster, *, node: int = 0, peer: str = "", now: float = 0.0) -> None:
        self.cluster = cluster
        #: the data node (server index in the cluster map) this connection was made to
        self.node = node
        self.peer = peer
        self._decoder = FrameDecoder()
        self._pending = bytearray()  # bytes fed to the decoder that are not yet in an event
        self._inbox: deque[Any] = deque()  # decoded client frames not yet handled (the output was backed up)
        self._out = bytearray()
        self.closed = False
        self.close_reason = ""
        #: what the connection negotiated: HELLO features, DCP_OPEN flags and name, DCP_CONTROL keys
        self.session = ConnState()
        self.agent = ""
        self.user: str | None = None
        self.bucket: Bucket | None = None
        self._scram: sasl.ScramServer | None = None
        # noop / liveness
        self.noop_enabled = False
        self.noop_interval = DEFAULT_NOOP_INTERVAL
        self._noop_pending = False
        self._noop_sent_at = now  # kv_engine starts the noop clock when the connection is made
        self._noop_opaque = NOOP_OPAQUE_BASE - 1  # the last noop opaque sent (none yet)
        self.last_receive = now
        self.last_send = now
        self.sent_frames = 0
        #: frames received from the client so far
        self.received_frames = 0
        self._init_streams()
        self.serial = cluster.register(self)

    def __repr__(self) -> str:
        return f"<ProducerConnection {self.dcp_name or self.peer or id(self)} streams={len(self.streams)} closed={self.closed}>"

    @property
    def features(self) -> tuple[int, ...]:
        """The HELLO features accepted, in the client's order."""
        return self.session.features

    @property
    def context(self) -> DissectContext:
        """What this connection negotiated, for dissecting its frames."""
        return self.session.context

    # --- I/O -----------------------------------------------------------------------
    def data_to_send(self) -> bytes:
        """Everything produced since the last call."""
        out = bytes(self._out)
        self._out.clear()
        return out

    @property
    def want_write(self) -> bool:
        """:meth:`pump` has more to do: requests wait, or streams have messages it did not emit yet.

        (Held back by the batch or output limit, not by flow control.)
        """
        return not self.closed and (bool(self._inbox) or self.streams_ready())

    @property
    def want_read(self) -> bool:
        """More client bytes are welcome: every request is handled and the output is below ``output_limit``.

        An edge that reads only then holds at most about that much per connection.
        """
        return not self.closed and not self._inbox and len(self._out) < self.cluster.output_limit

    @property
    def output_size(self) -> int:
        """Bytes produced and not yet taken with :meth:`data_to_send`."""
        return len(self._out)

    def close(self, reason: str) -> None:
        """Close the connection (no more output)."""
        if not self.closed:
            self.closed = True
            self.close_reason = reason
            self.disconnect_streams(reason)  # each stream ends Disconnected: journaled, never on the wire
            self._inbox.clear()
        self.cluster.unregister(self)

    def _send(self, frame: bytes, now: float | None = None) -> None:
        self._out += frame
        self.sent_frames += 1
        if now is not None:
            self.last_send = now

    def _reply(self, d: Dissection, status: int = Status.SUCCESS, *, now: float, **kw: Any) -> None:
        f = d.frame
        try:
            raw = encode(f.opcode, response=True, status=status, opaque=f.opaque, **kw)
        except Exception:  # never let a reply we cannot build escape: status only
            raw = encode(f.opcode, response=True, status=status, opaque=f.opaque)
        if f.opcode in SESSION_OPS:
            self.session.observe("s2c", Frame(0, raw))
        self._send(raw, now)

    def receive(self, data: bytes, now: float) -> None:
        """Feed bytes from the client; replies and stream data become available in :meth:`data_to_send`.

        Requests are handled in order while the output stays below the cluster's ``output_limit``;
        the rest wait (:attr:`want_read` false) for the next :meth:`pump` after the output was taken.
        """
        if self.closed:
            return
        self.last_receive = now
        self._pending += data
        events = self._decoder.feed(data)
        for ev in events:
            del self._pending[: ev.length]
            self.received_frames += ev.type == "frame"
        if self._pending and self._pending[0] not in _MAGICS:
            # the decoder holds garbage back until it resynchronises; the server drops the connection at once
            events.append(Garbage(0, bytes(self._pending[:1]), "invalid magic"))
        self._inbox.extend(events)
        self.pump(now)

    def _handle_inbox(self, now: float) -> None:
        """Handle received requests in order while the output is below the limit."""
        while self._inbox and not self.closed and len(self._out) < self.cluster.output_limit:
            ev = self._inbox.popleft()
            if ev.type != "frame":
                self.close(f"invalid data from the client ({ev.type})")
                return
            try:
                d = dissect(ev, self.context)
                self.session.observe("c2s", ev)
                self._handle(d, now)
            except Exception as exc:  # a bug here must not kill the server: drop the connection
                self.close(f"internal error handling {ev.name}: {type(exc).__name__}: {exc}")
                return

    def pump(self, now: float) -> None:
        """Handle waiting requests, then move stream messages to the output.

        Round robin, respecting flow control and the cluster's ``output_limit``.
        """
        self._handle_inbox(now)
        if self.closed or self.bucket is None:
            return
        self.pump_streams(now)

    def tick(self, now: float) -> None:
        """Time passes: idle disconnect, noops, slow stream ends, then :meth:`pump`."""
        if self.closed:
            return
        if self.noop_enabled and now - self.last_receive > self.cluster.idle_timeout:
            self.close(f"nothing received from the consumer for {self.cluster.idle_timeout:g} s (dcp_idle_timeout, noop on)")
            return
        self._maybe_send_noop(now)
        self.end_slow_streams(now)
        self.pump(now)

    def _maybe_send_noop(self, now: float) -> None:
        """kv_engine engines/ep/src/dcp/producer.cc ``maybeSendNoop``: periodic, one outstanding at a time.

        A noop goes out once the interval has passed since the last noop sent, whether or not
        data flowed meanwhile, unless the previous one is still unanswered.
        """
        if self.noop_enabled and not self._noop_pending and now - self._noop_sent_at >= self.noop_interval:
            self._noop_opaque += 1
            self._send(encode("DCP_NOOP", opaque=self._noop_opaque), now)
            self._noop_pending = True
            self._noop_sent_at = now

    @property
    def next_noop_at(self) -> float | None:
        """When :meth:`tick` sends the next noop (``None``: noops off, or one is unanswered)."""
        if not self.noop_enabled or self._noop_pending or self.closed:
            return None
        return self._noop_sent_at + self.noop_interval

    # --- request dispatch ---------------------------------------------------------------
    def _handle(self, d: Dissection, now: float) -> None:
        f = d.frame
        magic = f.magic
        if magic in _RESPONSES:
            self._handle_response(d, now)
            return
        if magic not in _REQUESTS:
            self.close(f"unexpected magic 0x{magic:02x} from the client")
            return
        if magic == _ALT_REQUEST:
            if Feature.ALT_REQUEST_SUPPORT not in self.features and f.opcode != Opcode.DCP_CLOSE_STREAM:
                self._reply(d, Status.EINVAL, now=now)
                return
            infos, problem = parse_frame_infos(f.framing)
            if problem is not None or any(i.id not in spec.REQUEST_FRAME_INFOS for i in infos):
                self._reply(d, Status.UNKNOWN_FRAME_INFO, now=now)
                return
        handler = _HANDLERS.get(f.opcode)
        if handler is None:
            self._reply(d, Status.UNKNOWN_COMMAND, now=now)
        elif not _shape_ok(f):
            self._reply(d, Status.EINVAL, now=now)
        elif f.opcode not in _PRE_AUTH and self.user is None:
            self._reply(d, Status.EACCESS, now=now)  # choice: unauthenticated connections have no privileges
        else:
            handler(self, d, now)

    def _handle_response(self, d: Dissection, now: float) -> None:
        op = d.frame.opcode
        if op == Opcode.DCP_NOOP:
            self._noop_response(d, now)
            return
        self._stream_response(d, now)  # takeover and snapshot-marker acks, stream-end replies

    def _noop_response(self, d: Dissection, now: float) -> None:
        """A noop reply must carry the opaque of the last noop sent (producer.cc ``handleResponse``)."""
        if d.frame.opaque == self._noop_opaque and d.frame.status == Status.SUCCESS:
            self._noop_pending = False
        elif self.dcp_name is not None:
            self.close(f"unexpected DCP_NOOP response (opaque {d.frame.opaque}, status 0x{d.frame.status:02x}) from the consumer")

    # --- session -----------------------------------------------------------------
    def _hello(self, d: Dissection, now: float) -> None:
        self.agent = d.key_text
        accepted: list[int] = []
        for e in d.body.get("features", []):
            code = e["feature"]
            if code in SUPPORTED_FEATURES and code not in accepted:
                accepted.append(code)
        self._reply(d, value=[(c,) for c in accepted], now=now)  # the session takes the features from this reply

    def _list_mechs(self, d: Dissection, now: float) -> None:
        self._reply(d, value=" ".join(sasl.MECHANISMS), now=now)

    def _sasl_auth(self, d: Dissection, now: float) -> None:
        mech = d.key_text.upper()
        payload = d.frame.value
        self.user = None
        self._scram = None
        if mech == "PLAIN":
            self.user = sasl.check_plain(payload, self.cluster.users)
            self._reply(d, Status.AUTH_ERROR if self.user is None else Status.SUCCESS, now=now)
            return
        if mech not in sasl.SCRAM_HASHES:
            self._reply(d, Status.AUTH_ERROR, now=now)
            return
        server = sasl.ScramServer(mech, self.cluster.users)
        try:
            first = server.first(payload)
        except sasl.SaslError:
            self._reply(d, Status.AUTH_ERROR, now=now)
            return
        self._scram = server
        self._reply(d, Status.AUTH_CONTINUE, value=first, now=now)

    def _sasl_step(self, d: Dissection, now: float) -> None:
        server, self._scram = self._scram, None
        if server is None or server.mech != d.key_text.upper():
            self._reply(d, Status.EINVAL, now=now)
            return
        try:
            final = server.final(d.frame.value)
        except sasl.SaslError:
            self._reply(d, Status.AUTH_ERROR, now=now)
            return
        self.user = server.user
        self._reply(d, value=final, now=now)

    def _error_map(self, d: Dissection, now: float) -> None:
        version = min(max(int(d.body.get("version", 1)), 1), 2)
        errors = {
            f"{code:x}": {"name": name, "desc": name, "attrs": _ERROR_ATTRS.get(code, ["internal"])} for code, name in spec.STATUS.items()
        }
        self._reply(d, value={"version": version, "revision": 1, "errors": errors}, now=now)

    def _select_bucket(self, d: Dissection, now: float) -> None:
        """SELECT_BUCKET as kv_engine daemon/protocol/mcbp/select_bucket_executor.cc answers it.

        An unknown bucket is KeyEnoent for a user allowed every bucket (the simulator's users
        are); NotSupported on a DCP connection.
        """
        name = d.key_text
        if self.dcp_name is not None:
            self._reply(d, Status.NOT_SUPPORTED, now=now)
        elif name == "@no bucket@":
            self.bucket = None
            self._reply(d, now=now)
        elif name in self.cluster.buckets:
            self.bucket = self.cluster.buckets[name]
            self._reply(d, now=now)
        else:
            self._reply(d, Status.KEY_ENOENT, now=now)

    def _noop_kv(self, d: Dissection, now: float) -> None:
        self._reply(d, now=now)

    def _quit(self, d: Dissection, now: float) -> None:
        self._reply(d, now=now)
        self.close("client sent QUIT")

    def _need_bucket(self, d: Dissection, now: float) -> Bucket | None:
        if self.bucket is None:
            self._reply(d, Status.NO_BUCKET, now=now)
        return self.bucket

    def _all_vb_seqnos(self, d: Dissection, now: float) -> None:
        b = self._need_bucket(d, now)
        if b is None:
            return
        state = int(d.extras.get("state", _ANY_STATE))
        cid = d.extras.get("collection_id")
        if state > _MAX_STATE or (cid is not None and cid not in b.manifest.collections):
            self._reply(d, Status.EINVAL if state > _MAX_STATE else Status.UNKNOWN_COLLECTION, now=now)
            return
        rows = [
            (vb.id, vb.high_seqno if cid is None else vb.collection_high_seqno([cid]))
            for vb in b.vbuckets
            for here in (self.vbucket_state(b, vb.id),)  # its state on this connection's node
            if (state == _ANY_STATE and here in _LIVE_STATES) or here == state
        ]
        self._reply(d, value=rows, now=now)

    def _failover_log(self, d: Dissection, now: float) -> None:
        b = self._need_bucket(d, now)
        if b is None:
            return
        vbid = d.frame.vbucket or 0
        if not self.holds_vbucket(b, vbid):  # only a vbucket this node has no copy of; a dead one returns its log
            self._reply(d, Status.NOT_MY_VBUCKET, now=now)
            return
        self._reply(d, value=list(b.vbuckets[vbid].failover_log), now=now)

    # --- DCP session ----------------------------------------------------------------
    def _dcp_conn(self, d: Dissection, now: float) -> bool:
        """A DCP command needs a DCP connection: before DCP_OPEN it is EINVAL and the connection stays open.

        (kv_engine daemon/mcbp_validators.cc ``verify_common_dcp_restrictions``: "The command can
        only be sent on a DCP connection"; GET_FAILOVER_LOG 0x96 is exempt.)
        """
        if self.dcp_name is None:
            context = {"error": {"context": "The command can only be sent on a DCP connection"}}
            self._reply(d, Status.EINVAL, value=context, datatype=Datatype.JSON, now=now)
            return False
        return True

    def _dcp_open(self, d: Dissection, now: float) -> None:
        if self._need_bucket(d, now) is None:
            return
        flags = int(d.extras.get("flags", 0))
        if not _open_ok(d, flags) or self.dcp_name is not None:
            self._reply(d, Status.EINVAL, now=now)
            return
        if not flags & OpenFlag.PRODUCER:
            self._reply(d, Status.NOT_SUPPORTED, now=now)  # simulator limit: it only plays the producer side
            return
        name = d.key_text
        for other in list(self.cluster.connections):  # a name is unique per bucket on one node (kv_engine's DcpConnMap)
            same_node = getattr(other, "node", 0) == self.node
            if other is not self and other.dcp_name == name and other.bucket is self.bucket and same_node:
                other.close(f"DCP connection name {name!r} reused by a new connection")
        self._reply(d, now=now)  # the session takes the name and flags from this reply

    def _dcp_control(self, d: Dissection, now: float) -> None:
        if not self._dcp_conn(d, now):
            return
        key = d.key_text
        value = d.frame.value.decode("utf-8", "surrogateescape")  # kv_engine compares bytes: any bytes are "any value"
        previous = self.controls.get(key)
        status = control_status(
            key,
            value,
            features=frozenset(self.features),
            open_flags=self.open_flags,
            controls=self.controls,
            stream_ids=self.stream_ids,
        )
        self._reply(d, status, now=now)  # the session records an accepted key from this reply
        if status == Status.SUCCESS:
            kept = control_value(key, value, previous)
            self.session.controls[key] = kept  # a one-way setting that is on stays on
            effect = _CONTROL_EFFECTS.get(key)
            if effect is not None:
                effect(self, kept)

    def _get_failover_log_dcp(self, d: Dissection, now: float) -> None:
        if self._dcp_conn(d, now):
            self._failover_log(d, now)

    def _dcp_noop_req(self, d: Dissection, now: float) -> None:
        """A DCP_NOOP *request* from the consumer: the producer disconnects.

        (kv_engine engines/ep/src/connhandler.cc ``ConnHandler::noop``: a producer does not support it.)
        """
        if self._dcp_conn(d, now):
            self.close("DCP_NOOP request from the consumer (a producer disconnects)")

    def _consumer_only(self, d: Dissection, now: float) -> None:
        if self._dcp_conn(d, now):
            self._reply(d, Status.EINVAL, now=now)  # producer-side messages sent to a producer

    # --- scenario controls ------------------------------------------------------------
    def pause(self, until: float) -> None:
        """Stall this connection's streams until ``until`` (noops still flow)."""
        self.paused_until = until


def _open_ok(d: Dissection, flags: int) -> bool:
    """The DCP_OPEN validator: known flags, no contradictory pairs, a name, a JSON value only for consumers."""
    if (
        not d.key
        or flags & _OPEN_INVALID
        or (flags & OpenFlag.NO_VALUE and flags & OpenFlag.NO_VALUE_WITH_UNDERLYING_DATATYPE)
        or (flags & OpenFlag.INCLUDE_DELETED_USER_XATTRS and not flags & OpenFlag.INCLUDE_XATTRS)
        or (flags & OpenFlag.SKIP_DELETES_IN_INITIAL_BACKFILL and not flags & OpenFlag.PRODUCER)
    ):
        return False
    value = d.frame.value
    if not value:
        return True
    # a JSON value needs the JSON datatype and may only hold consumer_name (consumer connections only)
    obj = json_value(value)
    return (
        bool(d.frame.datatype & Datatype.JSON)
        and isinstance(obj, dict)
        and not set(obj) - {"consumer_name"}
        and not flags & OpenFlag.PRODUCER
    )


def _set_noop(conn: ProducerConnection, value: str) -> None:
    conn.noop_enabled = control_on("enable_noop", {"enable_noop": value})


def _set_noop_interval(conn: ProducerConnection, value: str) -> None:
    interval = parse_float(value)
    if interval is not None:
        conn.noop_interval = interval


def _set_buffer_size(conn: ProducerConnection, value: str) -> None:
    size = parse_u32(value)
    if size is not None:
        conn.buffer_size = size


#: what an accepted DCP_CONTROL key does to the connection beyond being recorded in its session
_CONTROL_EFFECTS: dict[str, Callable[[ProducerConnection, str], None]] = {
    "enable_noop": _set_noop,
    "set_noop_interval": _set_noop_interval,
    "connection_buffer_size": _set_buffer_size,
}


#: DCP and failover-log commands whose request must not carry a key
_NO_KEY = frozenset(
    int(op)
    for op in (
        Opcode.DCP_STREAM_REQ,
        Opcode.DCP_CLOSE_STREAM,
        Opcode.DCP_GET_FAILOVER_LOG,
        Opcode.DCP_BUFFER_ACKNOWLEDGEMENT,
        Opcode.DCP_NOOP,
        Opcode.DCP_SEQNO_ACKNOWLEDGED,
        Opcode.GET_FAILOVER_LOG,
    )
)


def _shape_ok(frame: Any) -> bool:
    """The request's extras length is one the table allows for its command (validator rule)."""
    cmd = spec.COMMANDS.get(frame.opcode)
    if cmd is None:
        return True
    lens = {v.extras_len for v in cmd.request if not v.any_extras}
    if lens and frame.extras_length not in lens:
        return False
    if frame.opcode in _NO_KEY:
        return not frame.key
    return True


#: commands allowed before authentication
_PRE_AUTH = frozenset(
    int(op)
    for op in (Opcode.HELLO, Opcode.SASL_LIST_MECHS, Opcode.SASL_AUTH, Opcode.SASL_STEP, Opcode.GET_ERROR_MAP, Opcode.NOOP, Opcode.QUIT)
)

_HANDLERS: dict[int, Callable[[ProducerConnection, Dissection, float], None]] = {
    Opcode.QUIT: ProducerConnection._quit,
    Opcode.NOOP: ProducerConnection._noop_kv,
    Opcode.STAT: ProducerConnection._stat,
    Opcode.GET: ProducerConnection._kv_get,
    Opcode.SET: ProducerConnection._kv_store,
    Opcode.ADD: ProducerConnection._kv_store,
    Opcode.REPLACE: ProducerConnection._kv_store,
    Opcode.DELETE: ProducerConnection._kv_delete,
    Opcode.GET_CLUSTER_CONFIG: ProducerConnection._cluster_config,
    Opcode.COLLECTIONS_GET_MANIFEST: ProducerConnection._collections_manifest,
    Opcode.COLLECTIONS_GET_ID: ProducerConnection._collection_id,
    Opcode.HELLO: ProducerConnection._hello,
    Opcode.SASL_LIST_MECHS: ProducerConnection._list_mechs,
    Opcode.SASL_AUTH: ProducerConnection._sasl_auth,
    Opcode.SASL_STEP: ProducerConnection._sasl_step,
    Opcode.GET_ALL_VB_SEQNOS: ProducerConnection._all_vb_seqnos,
    Opcode.SELECT_BUCKET: ProducerConnection._select_bucket,
    Opcode.GET_FAILOVER_LOG: ProducerConnection._failover_log,
    Opcode.GET_ERROR_MAP: ProducerConnection._error_map,
    Opcode.DCP_OPEN: ProducerConnection._dcp_open,
    Opcode.DCP_ADD_STREAM: ProducerConnection._consumer_only,
    Opcode.DCP_CLOSE_STREAM: ProducerConnection._close_stream,
    Opcode.DCP_STREAM_REQ: ProducerConnection._stream_req,
    Opcode.DCP_GET_FAILOVER_LOG: ProducerConnection._get_failover_log_dcp,
    Opcode.DCP_NOOP: ProducerConnection._dcp_noop_req,
    Opcode.DCP_BUFFER_ACKNOWLEDGEMENT: ProducerConnection._buffer_ack,
    Opcode.DCP_CONTROL: ProducerConnection._dcp_control,
    Opcode.DCP_SEQNO_ACKNOWLEDGED: ProducerConnection._seqno_ack,
}
#: the request opcodes the producer handles (every other one is answered UnknownCommand)
HANDLED_OPCODES: frozenset[int] = frozenset(int(op) for op in _HANDLERS)
#: requests the producer may leave unanswered: a buffer ack always, a seqno ack when it succeeds
UNANSWERED: frozenset[int] = frozenset(int(op) for op in (Opcode.DCP_BUFFER_ACKNOWLEDGEMENT, Opcode.DCP_SEQNO_ACKNOWLEDGED))
