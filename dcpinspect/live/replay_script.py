"""The recorded script of one producer connection of a capture: what :mod:`.replay` plays back.

:func:`extract_script` reads the records of a capture (from
:func:`~dcpinspect.capture.read.read_records`, never a decoder of its own) and keeps,
for one connection, what its server did:

1. The connection: ``conn`` when asked for, else the first connection with a
   DCP_OPEN request and a DCP_STREAM_REQ (the first DCP producer connection);
   :attr:`Script.why` says how it was chosen.
2. Every request the client sent that was answered (other than stream
   requests) is an :class:`Exchange`: the request's identity (opcode, key,
   extras, value) and the raw responses that carried its opaque, in order.
3. Every DCP_STREAM_REQ is a :class:`RecordedStream`: its fields, the raw
   response (Success with the failover log, Rollback with its seqno, or an
   error), then the stream's messages (server requests with the stream's
   opaque and vbucket: markers, items, system events, seqno-advanced, OSO,
   the stream end), each with its time after the response.  Messages the
   server sent after the client's DCP_CLOSE_STREAM of that stream are marked
   ``after_close`` (the close caused them).
4. The number of vbuckets is the recorded cluster map's (else the highest
   vbucket seen, plus one).  Each vbucket's recorded state (:class:`VbState`): the newest failover log
   a response carried, the highest seqno seen (GET_ALL_VB_SEQNOS, stream
   responses, markers, items, seqno-advanced) and the stream that went
   furthest (the items a differing request is served from).
5. A capture that starts mid-stream holds messages of streams whose request
   it does not have: they are counted (:attr:`Script.orphans`), never replayed.
6. Server DCP_NOOPs, buffer acks and noop replies are not part of the script:
   the replayer sends its own noops and honours the new client's acks.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..flows.records import Record
from ..protocol.enums import Opcode, Status
from ..protocol.session import REQUEST_MAGICS, RESPONSE_MAGICS
from ..wire.dissect import dissect
from ..wire.dissection import Dissection
from ..wire.events import Frame

__all__ = ["Exchange", "RecordedMessage", "RecordedStream", "Script", "ScriptError", "VbState", "extract_script", "request_identity"]

_NS = 1e-9
#: requests the script does not keep (the replayer answers them by the simulator's rules, or not at all)
_NOT_SCRIPTED = frozenset(
    int(op) for op in (Opcode.DCP_BUFFER_ACKNOWLEDGEMENT, Opcode.DCP_NOOP, Opcode.DCP_STREAM_REQ, Opcode.DCP_SEQNO_ACKNOWLEDGED)
)

#: requests whose key is the client's own name (left out when comparing requests)
_OWN_KEYS = frozenset(int(op) for op in (Opcode.DCP_OPEN, Opcode.HELLO))


class ScriptError(ValueError):
    """The capture has no connection to replay (one line, for the CLI)."""


@dataclass
class Exchange:
    """One answered request of the recorded client (not a stream request)."""

    frame: int
    opcode: int
    name: str
    #: what identifies the request (:func:`request_identity`)
    identity: tuple[Any, ...]
    key: str
    #: the raw responses with its opaque, in order
    responses: list[bytes] = field(default_factory=list)
    used: bool = False


@dataclass
class RecordedMessage:
    """One stream message the recorded server sent."""

    #: seconds after the stream request's response
    at: float
    frame: int
    raw: bytes
    name: str
    seqno: int | None
    #: sent after the client's DCP_CLOSE_STREAM of the stream
    after_close: bool = False


@dataclass
class RecordedStream:
    """One recorded DCP_STREAM_REQ: the request, the answer and what followed."""

    frame: int
    vb: int
    sid: int | None
    flags: int
    start: int
    end: int
    uuid: int
    snap_start: int
    snap_end: int
    value: bytes
    opaque: int
    status: int | None = None
    response: bytes = b""
    rollback_seqno: int | None = None
    failover_log: list[tuple[int, int]] = field(default_factory=list)
    messages: list[RecordedMessage] = field(default_factory=list)
    #: the client's DCP_CLOSE_STREAM (its raw response, if answered)
    close_response: bytes | None = None
    closed: bool = False
    ended: bool = False
    used: bool = False
    t0: int = 0  # ns of the response

    @property
    def identity(self) -> tuple[Any, ...]:
        """What a new client's request must equal to get this stream's recorded answer."""
        return (self.vb, self.sid, self.flags, self.start, self.end, self.uuid, self.snap_start, self.snap_end, self.value)

    @property
    def last_seqno(self) -> int:
        """The highest seqno its items reached (its start without any)."""
        return max((m.seqno for m in self.messages if m.seqno is not None and m.name != "DCP_SNAPSHOT_MARKER"), default=self.start)

    def describe(self) -> str:
        """``vb 0 start 12 end 12 uuid 0x... snap 12-12`` (and the sid, flags)."""
        sid = f" sid {self.sid}" if self.sid is not None else ""
        flags = f" flags 0x{self.flags:x}" if self.flags else ""
        return f"vb {self.vb}{sid} start {self.start} end {self.end} uuid {self.uuid:016x} snap {self.snap_start}-{self.snap_end}{flags}"


@dataclass
class VbState:
    """What the recording says of one vbucket."""

    failover_log: list[tuple[int, int]] = field(default_factory=list)
    high_seqno: int = 0
    #: the Success stream whose items went furthest
    source: RecordedStream | None = None


@dataclass
class Script:
    """The recorded producer side of one connection."""

    conn: int
    why: str
    name: str | None = None
    bucket: str | None = None
    exchanges: list[Exchange] = field(default_factory=list)
    streams: list[RecordedStream] = field(default_factory=list)
    vbuckets: dict[int, VbState] = field(default_factory=dict)
    #: the recorded HELLO's accepted features (``None``: no HELLO recorded)
    features: list[int] | None = None
    #: the number of vbuckets the recording names (cluster map, seqnos, streams)
    vbucket_count: int = 1
    #: stream messages of no recorded stream (requested before the capture began): not replayed
    orphans: int = 0

    def describe(self) -> str:
        """One line: which connection, its DCP name, what it holds."""
        n_items = sum(1 for s in self.streams for m in s.messages if m.seqno is not None and m.name != "DCP_SNAPSHOT_MARKER")
        name = f" {self.name!r}" if self.name else ""
        orphans = f", {self.orphans} messages of streams requested before the capture began (not replayed)" if self.orphans else ""
        return (
            f"connection {self.conn}{name} ({self.why}): {len(self.exchanges)} answered requests, "
            f"{len(self.streams)} stream requests, {n_items} stream messages with a seqno{orphans}"
        )


def request_identity(d: Any) -> tuple[Any, ...]:
    """(opcode, key, extras, value, vbucket) of a request's dissection: two requests with equal identities ask the same.

    The key of a DCP_OPEN (the connection's name) and of a HELLO (the agent's name and
    connection id) is left out: a new client names itself.
    """
    f = d.frame
    key = b"" if f.opcode in _OWN_KEYS else bytes(f.key)  # a DCP name, an agent name: the client's own
    return (f.opcode, key, bytes(f.extras), bytes(f.value), f.vbucket or 0)


def _value_sid(value: bytes) -> int | None:
    """The ``sid`` of a stream request's JSON value (the stream id its messages carry), or ``None``."""
    try:
        obj = json.loads(value) if value else None
    except (ValueError, UnicodeDecodeError):
        return None
    sid = obj.get("sid") if isinstance(obj, dict) else None
    return sid if isinstance(sid, int) and not isinstance(sid, bool) else None


def _seqno(d: Any) -> int | None:
    x = d.extras
    for k in ("by_seqno", "seqno", "end_seqno"):
        if k in x:
            return int(x[k])
    return None


def _choose(records: list[Record], conn: int | None) -> tuple[int, str]:
    conns = sorted({r.conn for r in records})
    if conn is not None:
        if conn not in conns:
            raise ScriptError(f"no connection {conn} in the capture (connections: {', '.join(map(str, conns)) or 'none'})")
        return conn, "asked for"
    opened: set[int] = set()
    for r in records:
        if isinstance(r.event, Frame) and r.direction == "c2s":
            op = r.event.opcode
            if op == Opcode.DCP_OPEN:
                opened.add(r.conn)
            elif op == Opcode.DCP_STREAM_REQ and r.conn in opened:
                return r.conn, "the first DCP producer connection: DCP_OPEN and stream requests"
    raise ScriptError("no DCP producer connection in the capture (none has DCP_OPEN and a DCP_STREAM_REQ); choose one with --conn")


def extract_script(records: Iterable[Record], conn: int | None = None) -> Script:
    """The recorded script of connection ``conn`` (default: the first DCP producer connection)."""
    recs = list(records)
    chosen, why = _choose(recs, conn)
    script = Script(chosen, why)
    pending: dict[int, Exchange | RecordedStream] = {}
    active: dict[tuple[int, int], RecordedStream] = {}  # (opaque, vb) -> a stream that was answered Success
    for r in recs:
        if r.conn != chosen or not isinstance(r.event, Frame):
            continue
        d = dissect(r.event, r.context)
        f = d.frame
        magic = f.magic
        if r.direction == "c2s" and magic in REQUEST_MAGICS:
            _client_request(script, d, r, pending, active)
        elif r.direction == "s2c" and magic in RESPONSE_MAGICS:
            _server_response(script, d, r, pending, active)
        elif r.direction == "s2c" and magic in REQUEST_MAGICS and f.opcode != Opcode.DCP_NOOP:
            st = active.get((f.opaque, f.vbucket or 0))
            if st is None:
                script.orphans += 1  # a stream requested before the capture began (or not answered Success in it)
                continue
            st.messages.append(RecordedMessage((r.ts - st.t0) * _NS, r.number, bytes(r.event.raw), d.name, _seqno(d), st.closed))
            _saw(script, st.vb, _seqno(d))
            if f.opcode == Opcode.DCP_STREAM_END:
                st.ended = True
                del active[(f.opaque, f.vbucket or 0)]
    _finish(script)
    return script


def _client_request(
    script: Script, d: Dissection, r: Record, pending: dict[int, Any], active: dict[tuple[int, int], RecordedStream]
) -> None:
    f = d.frame
    if f.opcode == Opcode.DCP_STREAM_REQ:
        x = d.extras
        st = RecordedStream(
            r.number,
            f.vbucket or 0,
            _value_sid(bytes(f.value)),
            int(x.get("flags", 0)),
            int(x.get("start_seqno", 0)),
            int(x.get("end_seqno", 0)),
            int(x.get("vb_uuid", 0)),
            int(x.get("snap_start_seqno", 0)),
            int(x.get("snap_end_seqno", 0)),
            bytes(f.value),
            f.opaque,
        )
        script.streams.append(st)
        pending[f.opaque] = st
        return
    if f.opcode == Opcode.DCP_CLOSE_STREAM:
        for st in active.values():
            if st.vb == (f.vbucket or 0) and st.sid == d.stream_id:
                st.closed = True
    if f.opcode == Opcode.DCP_OPEN:
        script.name = d.key_text
    elif f.opcode == Opcode.SELECT_BUCKET:
        script.bucket = d.key_text
    if f.opcode not in _NOT_SCRIPTED:
        ex = Exchange(r.number, f.opcode, d.name, request_identity(d), d.key_text)
        script.exchanges.append(ex)
        pending[f.opaque] = ex


def _server_response(
    script: Script, d: Dissection, r: Record, pending: dict[int, Any], active: dict[tuple[int, int], RecordedStream]
) -> None:
    f = d.frame
    got = pending.get(f.opaque)
    raw = bytes(d.frame.raw)
    if isinstance(got, RecordedStream) and f.opcode == Opcode.DCP_STREAM_REQ:
        del pending[f.opaque]
        got.status, got.response, got.t0 = f.status, raw, r.ts
        if f.status == Status.ROLLBACK:
            got.rollback_seqno = int(d.body.get("rollback_seqno", 0))
        elif f.status == Status.SUCCESS:
            got.failover_log = [(int(e["vb_uuid"]), int(e["vb_seqno"])) for e in d.body.get("failover_log", [])]
            script.vbuckets.setdefault(got.vb, VbState()).failover_log = got.failover_log
            active[(got.opaque, got.vb)] = got
        return
    if isinstance(got, Exchange) and f.opcode == got.opcode:
        got.responses.append(raw)
        if f.opcode == Opcode.DCP_CLOSE_STREAM:
            for st in list(script.streams):
                if st.closed and st.close_response is None and st.vb == got.identity[4]:
                    st.close_response = raw
        if f.opcode == Opcode.HELLO and f.status == Status.SUCCESS:
            script.features = [int(e["feature"]) for e in d.body.get("features", [])]
        if f.opcode == Opcode.GET_CLUSTER_CONFIG and f.status == Status.SUCCESS:
            script.vbucket_count = max(script.vbucket_count, _map_size(bytes(f.value)))
        if f.opcode == Opcode.GET_ALL_VB_SEQNOS:
            for e in d.body.get("vb_seqnos", []):
                _saw(script, int(e["vbucket"]), int(e["high_seqno"]))
        if f.opcode in (Opcode.GET_FAILOVER_LOG, Opcode.DCP_GET_FAILOVER_LOG) and f.status == Status.SUCCESS:
            log = [(int(e["vb_uuid"]), int(e["vb_seqno"])) for e in d.body.get("failover_log", [])]
            script.vbuckets.setdefault(got.identity[4], VbState()).failover_log = log


def _map_size(value: bytes) -> int:
    """How many vbuckets a cluster map names (0 if it is not one)."""
    try:
        cfg = json.loads(value)
        return len(cfg["vBucketServerMap"]["vBucketMap"])
    except (ValueError, UnicodeDecodeError, KeyError, TypeError):
        return 0


def _saw(script: Script, vb: int, seqno: int | None) -> None:
    state = script.vbuckets.setdefault(vb, VbState())
    if seqno is not None and seqno > state.high_seqno:
        state.high_seqno = seqno


def _finish(script: Script) -> None:
    """Each vbucket's source stream, and how many vbuckets the recording names."""
    for st in script.streams:
        if st.status != Status.SUCCESS:
            continue
        state = script.vbuckets.setdefault(st.vb, VbState())
        if state.source is None or st.last_seqno >= state.source.last_seqno:
            state.source = st
    top = max(script.vbuckets, default=0)
    script.vbucket_count = max(script.vbucket_count, top + 1)
