"""Records: decoded events with their connection, direction, time and context.

:func:`iter_records` turns segments (from a capture, a proxy, a sniffer) into
:class:`Record` objects through the one :class:`~dcpinspect.flows.Reassembler`
and :class:`~dcpinspect.decoder.FrameDecoder`, and follows what each connection
negotiated (HELLO features, DCP_OPEN flags, DCP_CONTROL enable_stream_id) so
every frame is dissected with the context of *its* connection: a key carries a
collection id only where collections were negotiated.  A connection whose
start was not captured has an unknown context (nothing is guessed).  Pure: no
I/O.  :func:`read_records` is the capture-file edge on top.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from . import spec
from .decoder import DEFAULT_MAX_BODY, Event, Frame
from .dissect import DissectContext, Dissection, dissect
from .flows import DEFAULT_SERVER_PORTS, TLS_PORTS, Connection, FlowEvent, Reassembler, Segment

__all__ = ["CaptureStats", "ConnState", "Record", "iter_records", "read_records"]

#: the context of a connection whose start (SYN) was captured but negotiated nothing yet
FRESH = DissectContext(collections=False, xattr=False, snappy=False, json=False, delete_times=False, include_xattrs=False, stream_ids=False)


@dataclass(frozen=True, slots=True)
class Record:
    """One decoded event in its capture: frame (or garbage/truncated/gap) + where and when."""

    number: int  # 1-based, in order of completion
    file: str
    conn: int
    conn_label: str
    direction: str  # "c2s" | "s2c"
    ts: int  # ns: the packet that completed it
    ts_first: int  # ns: the packet its first byte arrived in
    packet: int
    packet_first: int
    event: Event
    context: DissectContext


@dataclass
class ConnState:
    """What a connection negotiated so far (fed one frame at a time)."""

    context: DissectContext
    features: tuple[int, ...] = ()
    open_flags: int | None = None
    open_name: str = ""
    controls: dict[str, str] = field(default_factory=dict)
    bucket: str = ""
    sasl_mechanism: str = ""
    _pending: dict[tuple[str, int, int], Dissection] = field(default_factory=dict)

    def observe(self, direction: str, frame: Frame) -> None:
        """Update the context with a frame seen in ``direction`` (c2s/s2c).

        Only the few session commands that change what later frames mean are
        looked at, and they are read through :func:`dissect` (the table), not
        parsed here: HELLO, SASL_AUTH, SELECT_BUCKET, DCP_OPEN, DCP_CONTROL.
        A request takes effect when its success response arrives.
        """
        if frame.dialect != "mcbp" or frame.opcode not in _SESSION_OPS:
            return
        magic = frame.magic
        if magic in (0x80, 0x08):
            d = dissect(frame, self.context)
            if frame.opcode == 0x21:
                self.sasl_mechanism = d.key_text
                return
            self._pending[(direction, frame.opcode, frame.opaque)] = d
            if len(self._pending) > 1024:  # requests never answered: forget the oldest
                del self._pending[next(iter(self._pending))]
        elif magic in (0x81, 0x18):
            other = "c2s" if direction == "s2c" else "s2c"
            req = self._pending.pop((other, frame.opcode, frame.opaque), None)
            if req is None or frame.status != spec.SUCCESS:
                return
            op = frame.opcode
            if op == 0x1F:
                resp = dissect(frame, self.context)
                self.features = tuple(f["feature"] for f in resp.body.get("features", ()))
                self.context = self.context.with_features(self.features)
            elif op == 0x50 and isinstance(req.extras.get("flags"), int):
                self.open_name = req.key_text
                self.open_flags = req.extras["flags"]
                self.context = self.context.with_open_flags(self.open_flags)
            elif op == 0x5E:
                key, value = req.key_text, str(req.document) if req.document is not None else ""
                self.controls[key] = value
                if key == "enable_stream_id" and value == "true":
                    self.context = replace(self.context, stream_ids=True)
            elif op == 0x89:
                self.bucket = req.key_text


#: HELLO, SASL_AUTH, DCP_OPEN, DCP_CONTROL, SELECT_BUCKET
_SESSION_OPS = frozenset((0x1F, 0x21, 0x50, 0x5E, 0x89))


@dataclass
class CaptureStats:
    """What a read saw besides frames: per-file problems, skipped packets, connections."""

    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: Counter[str] = field(default_factory=Counter)
    connections: list[Connection] = field(default_factory=list)
    states: dict[int, ConnState] = field(default_factory=dict)
    packets: int = 0
    records: int = 0


def iter_records(
    segments: Iterable[Segment],
    *,
    server_ports: Iterable[int] = DEFAULT_SERVER_PORTS,
    detect: bool = True,
    tls_ports: Iterable[int] = TLS_PORTS,
    max_body: int = DEFAULT_MAX_BODY,
    stats: CaptureStats | None = None,
    reveal_secrets: bool = False,
) -> Iterator[Record]:
    """Reassemble, decode and contextualise ``segments``; yield records in completion order."""
    r = Reassembler(server_ports=server_ports, detect=detect, tls_ports=tls_ports, max_body=max_body)
    st = stats if stats is not None else CaptureStats()
    st.connections = r.connections
    states = st.states
    number = 0

    def convert(fes: list[FlowEvent]) -> Iterator[Record]:
        nonlocal number
        for fe in fes:
            conn = fe.conn
            state = states.get(conn.id)
            if state is None:
                base = FRESH if conn.syn_seen else DissectContext()
                if reveal_secrets:
                    base = replace(base, reveal_secrets=True)
                state = states[conn.id] = ConnState(base)
            number += 1
            ev = fe.event
            yield Record(
                number,
                fe.file or conn.file,
                conn.id,
                conn.label,
                fe.direction,
                fe.ts_last,
                fe.ts_first,
                fe.packet_last,
                fe.packet_first,
                ev,
                state.context,
            )
            if ev.type == "frame":
                state.observe(fe.direction, ev)  # type: ignore[arg-type]

    for seg in segments:
        fes = r.feed(seg)
        if fes:
            yield from convert(fes)
    yield from convert(r.close())
    st.records = number
    st.skipped["not memcached-binary TCP"] += r.skipped_segments


def read_records(
    paths: Iterable[str],
    *,
    server_ports: Iterable[int] = DEFAULT_SERVER_PORTS,
    detect: bool = True,
    stats: CaptureStats | None = None,
    reveal_secrets: bool = False,
    progress: Callable[[str, int], None] | None = None,
) -> Iterator[Record]:
    """Records of one or more capture files, read in order as one capture (rotated files join up).

    A file that is not a capture is reported in ``stats.files[path]["error"]``
    and skipped; a truncated or corrupt record ends that file with a problem,
    keeping everything before it.
    """
    from .capture import CaptureError, CaptureReader
    from .packets import parse_packet

    st = stats if stats is not None else CaptureStats()

    def segments() -> Iterator[Segment]:
        for path in paths:
            reader = CaptureReader(str(path))
            info: dict[str, Any] = {"format": None, "packets": 0, "problems": [], "error": None}
            st.files[str(path)] = info
            try:
                for pkt in reader:
                    st.packets += 1
                    if progress is not None and not pkt.number % 1024:
                        progress(str(path), pkt.offset)
                    seg = parse_packet(pkt.linktype, pkt.data, pkt.wirelen, pkt.ts, pkt.number, str(path), st.skipped)
                    if seg is not None:
                        yield seg
            except CaptureError as exc:
                info["error"] = str(exc)
            info["format"] = reader.format or None
            info["packets"] = reader.packets
            info["problems"] = [f"{msg} (at byte offset {off})" for off, msg in reader.problems]
            info["linktypes"] = sorted(reader.linktypes)

    yield from iter_records(segments(), server_ports=server_ports, detect=detect, stats=st, reveal_secrets=reveal_secrets)
