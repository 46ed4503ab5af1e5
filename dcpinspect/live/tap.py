"""Live connections as records (and, optionally, a capture file).

A :class:`LiveCapture` turns the bytes a proxy, a client or a simulator sees
on its sockets into synthesised TCP segments (handshake, data, FIN/RST, with
consistent sequence numbers) and feeds them to one
:class:`~dcpinspect.flows.records.Recorder` - the same reassembly, decoder and
per-connection context as a capture file.  The same segments can be written
as a pcap (``PcapWriter``), so reading that file back gives the same frames
with the same packet numbers, and tshark reads it too.

A connection that is plainly not memcached binary is not decoded past a
bound: TLS (its first bytes are a TLS handshake record) is not decoded at
all, other bytes only until :data:`JUNK_LIMIT` bytes came with no frame.
:attr:`LiveConnection.undecoded` says why, once (``on_notice``); its bytes
still go to the pcap, exactly.  A closed connection leaves nothing behind
in the capture but its counters.

Nothing here touches a socket: callers hand in bytes as they forward them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Generic, TypeVar

from ..capture.pcapwrite import PSH, PcapWriter
from ..flows.reassembly import ACK, FIN, RST, SYN, Reassembler, Segment
from ..flows.records import CaptureStats, Record, Recorder
from ..protocol import spec
from ..protocol.session import REQUEST_MAGICS, SASL_REQUESTS
from ..wire.decoder import FrameDecoder, plausible_header
from ..wire.dissect import dissect
from ..wire.events import Frame

__all__ = ["JUNK_LIMIT", "KEEP_CLOSED", "LiveCapture", "LiveConnection", "SecretMasker", "StatePruner", "counted", "format_endpoint"]

#: payload bytes per synthesised segment (IPv4 total length is 16 bits)
SEGMENT = 65_000
#: bytes of one direction that decode to no frame before the connection is no longer decoded
JUNK_LIMIT = 64 * 1024
#: ``stats.states`` entries of closed connections tolerated before they are pruned (amortised)
STATE_SLACK = 256
#: closed connections a live source keeps in ``stats.connections`` (older ones are only counted)
KEEP_CLOSED = 1024


def counted(n: int, noun: str) -> str:
    """``1 connection``, ``2 connections``: a count and its noun, plural when it is not 1 (a noun in ``ed`` or ``s`` stays: ``2 seqno_advanced``)."""
    return f"{n} {noun if n == 1 or noun.endswith(('ed', 's')) else noun + 's'}"


def format_endpoint(ep: tuple[Any, ...]) -> str:
    """``(host, port)`` -> ``host:port``, an IPv6 address in brackets (``[::1]:11210``)."""
    host, port = ep[0], ep[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


class StatePruner:
    """Forgets the per-connection session state (``stats.states``) of connections that ended.

    A closed connection emits no more records, so its :class:`~dcpinspect.flows.session.ConnState`
    is never needed again.  Amortised: :meth:`__call__` sweeps only when
    ``stats.states`` grew by ``slack`` entries (or doubled) since the last sweep.
    """

    def __init__(self, stats: CaptureStats, reassembler: Reassembler, *, slack: int = STATE_SLACK) -> None:
        self.stats = stats
        self.reassembler = reassembler
        self.slack = slack
        self._next = slack
        self.pruned = 0

    def __call__(self) -> int:
        """Sweep when due; returns how many states were forgotten."""
        states = self.stats.states
        if len(states) < self._next:
            return 0
        open_ids = {c.id for c in self.reassembler.connections if not c.closed}
        gone = [cid for cid in states if cid not in open_ids]
        for cid in gone:
            del states[cid]
        self.pruned += len(gone)
        self._next = len(states) + max(self.slack, len(states))
        return len(gone)


class LiveCapture:
    """Records (and optionally a pcap) of live TCP connections.

    Args:
        pcap: write every synthesised packet to this pcap file.
        on_record: called with every record as soon as it is complete.
        label: the ``file`` column of the records (default: the pcap path, or ``live``).
        reveal_secrets: passed to the records' contexts (what displays show).
        keep_secrets: write SASL payloads into the pcap as they were; by
            default the secret bytes of every SASL request, in either
            direction, are overwritten with ``*`` in the file (same length, so
            everything else stays byte-exact).  The records always hold the
            bytes that were forwarded.
        server_ports: as for :func:`~dcpinspect.capture.read.read_records`; the
            server side of a live connection is known anyway.
        on_notice: called once per connection that is no longer decoded, with
            the connection and why (``"TLS"``, ``"not memcached binary"``).
    """

    def __init__(
        self,
        *,
        pcap: str | Path | None = None,
        on_record: Callable[[Record], None] | None = None,
        label: str | None = None,
        reveal_secrets: bool = False,
        keep_secrets: bool = False,
        server_ports: Iterable[int] = (),
        clock: Callable[[], int] = time.time_ns,
        on_notice: Callable[[LiveConnection, str], None] | None = None,
    ) -> None:
        self.keep_secrets = keep_secrets
        self.stats = CaptureStats()
        # no TLS ports: a live connection's TLS is recognised by its first bytes, whatever its ports (a client may get 11207)
        self.recorder = Recorder(server_ports=server_ports, detect=True, tls_ports=(), stats=self.stats, reveal_secrets=reveal_secrets)
        self.writer = PcapWriter(pcap) if pcap is not None else None
        self.file = label if label is not None else (str(pcap) if pcap is not None else "live")
        self.on_record = on_record
        self.on_notice = on_notice
        self.clock = clock
        self.packets = 0
        self.records: list[Record] = []  # kept only when no on_record callback is given
        #: connections opened, open now, and not decoded (TLS, not memcached binary)
        self.opened = 0
        self.open = 0
        self.undecoded = 0
        self.recorder.reassembler.keep_closed = KEEP_CLOSED  # a long-running source: closed connections are summarised
        self.recorder.reassembler.compare_window = 0  # bytes a proxy or client saw once: nothing is ever retransmitted
        self.prune = StatePruner(self.stats, self.recorder.reassembler)
        self._closed = False

    def connection(self, client: tuple[str, int], server: tuple[str, int], ts: int | None = None) -> LiveConnection:
        """A new connection from ``client`` to ``server`` (its handshake is synthesised now)."""
        r = self.recorder.reassembler
        if server[1] not in r.server_ports:
            r.server_ports = r.server_ports | {server[1]}  # known to be memcached binary: no guessing
        conn = LiveConnection(self, client, server)
        self.opened += 1
        self.open += 1
        conn._open(self.clock() if ts is None else ts)
        return conn

    def _write(
        self, ts: int, src: tuple[str, int], dst: tuple[str, int], seq: int, ack: int, flags: int, payload: bytes, client: bool
    ) -> None:
        if self.writer is not None and not self._closed:
            self.writer.tcp(ts, src, dst, seq, ack, flags, payload, client=client)

    def _segment(
        self,
        ts: int,
        src: tuple[str, int],
        dst: tuple[str, int],
        seq: int,
        ack: int,
        flags: int,
        payload: bytes,
        client: bool,
        masker: SecretMasker[tuple[Any, ...]] | None = None,
        *,
        decode: bool = True,
        rseq: int | None = None,
    ) -> list[Record]:
        """Write one segment to the pcap (through ``masker``) and, with ``decode``, feed it (at ``rseq``) to the recorder."""
        if self._closed:
            return []
        self.packets += 1
        if self.writer is not None:
            packet = (ts, src, dst, seq, ack, flags, payload, client)
            for p, data in masker.add(packet, payload) if masker is not None else ((packet, payload),):
                self.writer.tcp(p[0], p[1], p[2], p[3], p[4], p[5], data, client=p[7])
        if not decode:
            return []
        s = seq if rseq is None else rseq
        seg = Segment(ts, src[0], src[1], dst[0], dst[1], s & 0xFFFFFFFF, flags, payload, 0, self.packets, self.file)
        records = self.recorder.feed(seg)
        self._emit(records)
        return records

    def _emit(self, records: list[Record]) -> None:
        for r in records:
            if self.on_record is not None:
                self.on_record(r)
            else:
                self.records.append(r)

    def _ended(self, conn: LiveConnection) -> None:
        self.open -= 1
        self.prune()

    def flush(self) -> None:
        """Flush the pcap file (it stays open)."""
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        """End of the capture: records still held are emitted and the pcap is closed."""
        if self._closed:
            return
        self._emit(self.recorder.close())
        self._closed = True
        if self.writer is not None:
            self.writer.close()

    def __enter__(self) -> LiveCapture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_TLS_HANDSHAKE = b"\x16"  # a TLS record of type handshake (then version 0x03 0xNN)
_ISN = {"c2s": 1_000, "s2c": 5_000}  # the synthesised initial sequence numbers


class LiveConnection:
    """One live TCP connection of a :class:`LiveCapture`: hand it the bytes of each direction.

    Decoding stops (the pcap still gets every byte) when the connection is
    plainly not memcached binary: its first bytes are a TLS handshake record,
    or one direction gave :data:`JUNK_LIMIT` bytes of garbage with no frame.
    :attr:`undecoded` then says why.
    """

    def __init__(self, capture: LiveCapture, client: tuple[str, int], server: tuple[str, int]) -> None:
        self.capture = capture
        self.client = client
        self.server = server
        self.seq = dict(_ISN)
        self.closed = False
        #: why this connection is no longer decoded (``None``: it is)
        self.undecoded: str | None = None
        self._rseq: dict[str, int] | None = None  # the recorder's sequence numbers once decoding stopped
        self._junk = {"c2s": 0, "s2c": 0}  # garbage bytes since the last frame
        self._fed = {"c2s": 0, "s2c": 0}  # bytes decoded
        self._framed = {"c2s": False, "s2c": False}  # a frame was seen
        self._suspect = {"c2s": False, "s2c": False}  # the first bytes are no memcached-binary header
        self._maskers: dict[str, SecretMasker[tuple[Any, ...]]] | None = None
        if not capture.keep_secrets and capture.writer is not None:
            self._maskers = {"c2s": SecretMasker(), "s2c": SecretMasker()}

    def _ends(self, direction: str) -> tuple[tuple[str, int], tuple[str, int], str]:
        return (self.client, self.server, "s2c") if direction == "c2s" else (self.server, self.client, "c2s")

    def _open(self, ts: int) -> None:
        cap, c, s = self.capture, self.client, self.server
        cap._segment(ts, c, s, self.seq["c2s"], 0, SYN, b"", True)
        cap._segment(ts, s, c, self.seq["s2c"], self.seq["c2s"] + 1, SYN | ACK, b"", False)
        self.seq["c2s"] += 1
        self.seq["s2c"] += 1
        cap._segment(ts, c, s, self.seq["c2s"], self.seq["s2c"], ACK, b"", True)

    def data(self, direction: str, data: bytes, ts: int | None = None) -> None:
        """Bytes sent in ``direction`` ("c2s" or "s2c")."""
        if self.closed or not data:
            return
        ts = self.capture.clock() if ts is None else ts
        src, dst, other = self._ends(direction)
        if self._rseq is None and not self._fed[direction]:
            self._first(direction, data)
        masker = self._maskers[direction] if self._maskers is not None else None
        view = memoryview(data)
        for off in range(0, len(data), SEGMENT):
            chunk = bytes(view[off : off + SEGMENT])
            decode = self._rseq is None
            records = self.capture._segment(
                ts,
                src,
                dst,
                self.seq[direction],
                self.seq[other],
                PSH | ACK,
                chunk,
                direction == "c2s",
                masker,
                decode=decode,
            )
            self.seq[direction] += len(chunk)
            if decode:
                self._fed[direction] += len(chunk)
                self._watch(direction, records)

    def skip(self, direction: str, n: int) -> None:
        """``n`` bytes went by in ``direction`` that the capture does not get: a hole in the pcap, a gap in the records."""
        if self.closed or n <= 0:
            return
        self.seq[direction] += n
        if self._rseq is None:
            self._fed[direction] += n  # the recorder's stream has the hole too
        if self._maskers is not None:  # what the masker held is released masked; it is blind until a frame boundary
            for p, payload in self._maskers[direction].gap(n):
                self.capture._write(p[0], p[1], p[2], p[3], p[4], p[5], payload, p[7])

    def _first(self, direction: str, data: bytes) -> None:
        """The first bytes of a direction: TLS is not decoded; no plausible header makes the direction suspect."""
        if data[:1] == _TLS_HANDSHAKE and data[1:2] in (b"\x03", b""):
            self._stop("TLS")
        elif len(data) >= spec.HEADER_SIZE and not plausible_header(data):
            self._suspect[direction] = True

    def _watch(self, direction: str, records: list[Record]) -> None:
        """Stop decoding after :data:`JUNK_LIMIT` bytes of garbage with no frame (or a suspect start with no frame)."""
        for r in records:
            if r.direction != direction:
                continue
            ev = r.event
            if ev.__class__ is Frame:
                self._framed[direction] = True
                self._junk[direction] = 0
            elif ev.type == "garbage":
                self._junk[direction] += ev.length
        if self._junk[direction] >= JUNK_LIMIT or (
            self._suspect[direction] and not self._framed[direction] and self._fed[direction] >= JUNK_LIMIT
        ):
            self._stop("not memcached binary")

    def _stop(self, why: str) -> None:
        """No more decoding on this connection: the recorder's sequence numbers stay where its bytes ended."""
        self.undecoded = why
        self._rseq = {"c2s": _ISN["c2s"] + 1 + self._fed["c2s"], "s2c": _ISN["s2c"] + 1 + self._fed["s2c"]}
        self.capture.undecoded += 1
        if self.capture.on_notice is not None:
            self.capture.on_notice(self, why)

    def close(self, ts: int | None = None, *, reset: bool = False, by: str = "c2s") -> None:
        """The connection ended: FIN both ways (or an RST from the ``by`` side)."""
        if self.closed:
            return
        self.closed = True
        cap = self.capture
        ts = cap.clock() if ts is None else ts
        if self._maskers is not None:  # an unfinished SASL frame: written masked
            for m in self._maskers.values():
                for p, payload in m.flush():
                    cap._write(p[0], p[1], p[2], p[3], p[4], p[5], payload, p[7])
            self._maskers = None
        src, dst, other = self._ends(by)
        seq = self.seq
        r = self._rseq if self._rseq is not None else seq
        c = by == "c2s"
        try:
            if reset:
                cap._segment(ts, src, dst, seq[by], seq[other], RST | ACK, b"", c, rseq=r[by])
                return
            cap._segment(ts, src, dst, seq[by], seq[other], FIN | ACK, b"", c, rseq=r[by])
            cap._segment(ts, dst, src, seq[other], seq[by] + 1, FIN | ACK, b"", not c, rseq=r[other])
            cap._segment(ts, src, dst, seq[by] + 1, seq[other] + 1, ACK, b"", c, rseq=r[by] + 1)
            seq[by] += 1
            seq[other] += 1
        finally:
            cap._ended(self)


_HEADER = spec.HEADER_SIZE
_BODY_LENGTH = slice(8, 12)  # the header's total body length (big-endian)
#: a SASL request with a larger body is not held back: its whole body is masked as it passes
HOLD_LIMIT = 1 << 20
#: secret spans remembered per stream (for retransmitted bytes); bytes before a forgotten one are masked wholesale
SPANS_KEPT = 64

T = TypeVar("T")


class SecretMasker(Generic[T]):
    """Overwrites SASL secrets in the packets of one byte stream before they are written to a pcap.

    Every SASL request (SASL_AUTH, SASL_STEP) is masked, in either direction
    (a server-to-client stream may carry one reflected by an upstream): what
    :func:`dissect` does not positively know to be safe is a secret.

    Shared by :class:`LiveCapture` (proxy, client) and the sniffer.  Each packet
    is an opaque ``item`` with its TCP ``payload`` at stream offset ``at``;
    :meth:`add` returns the packets that may be written now, each with its
    payload as it should be written (same length, secret bytes set to ``*``).

    Frames are found with the one :class:`FrameDecoder` and the secrets with
    :func:`dissect` (its ``secrets`` spans, kept as stream offsets).  A packet
    that holds part of a SASL request not yet complete is held back until
    the frame completes; every other packet is released at once, masked
    where it overlaps a known secret span.  ``at`` may be below
    :attr:`offset` (a retransmission: only its new tail is decoded, its old
    bytes are masked by the spans already known, and it is held with the
    frame when it reaches into an unfinished SASL request).

    Bounded: only an unfinished SASL request is held (one whose declared body
    exceeds ``hold_limit`` is masked whole instead); :meth:`give_up` releases
    what is held with everything that may be secret masked; :meth:`gap`
    reports bytes that will never be seen.  A stream that does not start on a
    frame boundary (``aligned=False``) or continues after a gap is *blind*
    until the decoder finds a frame again: those bytes (which may be the body
    of a SASL request whose header was not seen) are masked.
    """

    def __init__(self, *, aligned: bool = True, hold_limit: int = HOLD_LIMIT) -> None:
        self.decoder = FrameDecoder(aligned=aligned)
        self.hold_limit = hold_limit
        self.offset = 0  # stream bytes decoded so far
        self.pending: list[list[Any]] = []  # [stream offset, item, payload bytearray], held back
        self.spans: list[tuple[int, int]] = []  # [start, end) of secret bytes, stream offsets
        self.forgotten = 0  # bytes below this may hold the secret of a span no longer kept
        self.blind_from: int | None = None if aligned else 0
        self.sasl_from: int | None = None  # start of the unfinished SASL request held back
        self._covered: int | None = None  # a SASL request whose whole body is already a secret span

    @property
    def held(self) -> int:
        """Payload bytes held back."""
        return sum(len(p[2]) for p in self.pending)

    def add(self, item: T, payload: bytes, at: int | None = None) -> list[tuple[T, bytes]]:
        """One packet whose payload starts at stream offset ``at`` (default: :attr:`offset`, the next byte)."""
        at = self.offset if at is None else at
        if not 0 <= at <= self.offset:
            raise ValueError(f"payload at {at} is not placeable (stream offset {self.offset})")
        self.pending.append([at, item, bytearray(payload)])
        new = at + len(payload) - self.offset
        if new > 0:
            for ev in self.decoder.feed(payload[len(payload) - new :]):
                if not isinstance(ev, Frame):
                    continue
                if self.blind_from is not None:  # in sync again: what came before may be a secret's tail
                    self._secret(self.blind_from, ev.offset)
                    self.blind_from = None
                if ev.dialect == "mcbp" and ev.opcode in SASL_REQUESTS and not ev.is_response:
                    for off, n in dissect(ev).secrets:
                        self._secret(ev.offset + off, ev.offset + off + n)
            self.offset = self.decoder.offset
        return self._settle()

    def gap(self, length: int) -> list[tuple[T, bytes]]:
        """``length`` bytes of the stream will never be seen: the unfinished SASL request is masked and released."""
        if length <= 0:
            return []
        self._abandon(0)
        self.decoder.feed_gap(length)
        self.offset = self.decoder.offset
        self.blind_from = self.offset
        return self._settle()

    def give_up(self) -> list[tuple[T, bytes]]:
        """Release everything held: the unfinished SASL request's body (and blind bytes) masked, now and later."""
        self._abandon(self.decoder.max_body)
        return self._release(None)

    flush = give_up  # the end of the stream

    def _abandon(self, unknown_body: int) -> None:
        if self.sasl_from is not None:
            start, inc = self.sasl_from, self.decoder.incomplete
            head = inc[1] if inc is not None and inc[0] == start else b""
            body = int.from_bytes(head[_BODY_LENGTH], "big") if len(head) >= _HEADER else unknown_body
            self._secret(start + _HEADER, max(self.offset, start + _HEADER + body))  # the header is kept: no secret there
            self._covered = start
            self.sasl_from = None
        if self.blind_from is not None:
            self._secret(self.blind_from, self.offset)
            self.blind_from = self.offset

    def _settle(self) -> list[tuple[T, bytes]]:
        self.sasl_from = None
        inc = self.decoder.incomplete
        if inc is not None:
            start, head = inc
            # with only the magic byte seen, the packets so far hold no secret (it starts after the header)
            if len(head) >= 2 and head[0] in REQUEST_MAGICS and head[1] in SASL_REQUESTS and start != self._covered:
                body = int.from_bytes(head[_BODY_LENGTH], "big") if len(head) >= _HEADER else 0
                if body > self.hold_limit:
                    self._secret(start + _HEADER, start + _HEADER + body)
                    self._covered = start
                else:
                    self.sasl_from = start
        if self.blind_from is not None and self.offset - self.blind_from > self.hold_limit:
            self._secret(self.blind_from, self.offset)
            self.blind_from = self.offset
        marks = [m for m in (self.sasl_from, self.blind_from) if m is not None]
        return self._release(min(marks) if marks else None)

    def _secret(self, start: int, end: int) -> None:
        if end <= start:
            return
        self.spans.append((start, end))
        if len(self.spans) > SPANS_KEPT:
            self.forgotten = max(self.forgotten, self.spans.pop(0)[1])

    def _release(self, upto: int | None) -> list[tuple[T, bytes]]:
        """The held packets that end at or before ``upto`` (all with ``None``), masked."""
        out: list[tuple[T, bytes]] = []
        keep: list[list[Any]] = []
        for p in self.pending:
            at, buf = p[0], p[2]
            if upto is not None and at + len(buf) > upto:
                keep.append(p)
                continue
            end = at + len(buf)
            for a, b in self.spans:
                if a < end and at < b:
                    lo, hi = max(a, at) - at, min(b, end) - at
                    buf[lo:hi] = b"*" * (hi - lo)
            if at < self.forgotten:
                hi = min(self.forgotten, end) - at
                buf[:hi] = b"*" * hi
            out.append((p[1], bytes(buf)))
        self.pending = keep
        return out
