"""Live connections as records (and, optionally, a capture file).

A :class:`LiveCapture` turns the bytes a proxy, a client or a simulator sees
on its sockets into synthesised TCP segments (handshake, data, FIN/RST, with
consistent sequence numbers) and feeds them to one
:class:`~dcpinspect.records.Recorder` - the same reassembly, decoder and
per-connection context as a capture file.  The same segments can be written
as a pcap (``PcapWriter``), so reading that file back gives the same frames
with the same packet numbers, and tshark reads it too.

Nothing here touches a socket: callers hand in bytes as they forward them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .decoder import Frame, FrameDecoder
from .dissect import dissect
from .flows import ACK, FIN, RST, SYN, Segment
from .pcapwrite import PSH, PcapWriter
from .records import CaptureStats, Record, Recorder

__all__ = ["LiveCapture", "LiveConnection"]

#: payload bytes per synthesised segment (IPv4 total length is 16 bits)
SEGMENT = 65_000


class LiveCapture:
    """Records (and optionally a pcap) of live TCP connections.

    Args:
        pcap: write every synthesised packet to this pcap file.
        on_record: called with every record as soon as it is complete.
        label: the ``file`` column of the records (default: the pcap path, or ``live``).
        reveal_secrets: passed to the records' contexts (what displays show).
        keep_secrets: write SASL passwords and SCRAM proofs into the pcap as
            they were; by default their bytes are overwritten with ``*`` in the
            file (same length, so everything else stays byte-exact).  The
            records always hold the bytes that were forwarded.
        server_ports: as for :func:`~dcpinspect.records.read_records`; the
            server side of a live connection is known anyway.
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
    ) -> None:
        self.keep_secrets = keep_secrets
        self.stats = CaptureStats()
        self.recorder = Recorder(server_ports=server_ports, detect=True, stats=self.stats, reveal_secrets=reveal_secrets)
        self.writer = PcapWriter(pcap) if pcap is not None else None
        self.file = label if label is not None else (str(pcap) if pcap is not None else "live")
        self.on_record = on_record
        self.clock = clock
        self.packets = 0
        self.records: list[Record] = []  # kept only when no on_record callback is given
        self._closed = False

    def connection(self, client: tuple[str, int], server: tuple[str, int], ts: int | None = None) -> LiveConnection:
        """A new connection from ``client`` to ``server`` (its handshake is synthesised now)."""
        r = self.recorder.reassembler
        r.server_ports = r.server_ports | {server[1]}  # known to be memcached binary: no guessing
        conn = LiveConnection(self, client, server)
        conn._open(self.clock() if ts is None else ts)
        return conn

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
        masker: _Masker | None = None,
    ) -> None:
        if self._closed:
            return
        self.packets += 1
        if self.writer is not None:
            packet = (ts, src, dst, seq, ack, flags, payload, client)
            for p in masker.add(packet) if masker is not None else (packet,):
                self.writer.tcp(p[0], p[1], p[2], p[3], p[4], p[5], p[6], client=p[7])
        seg = Segment(ts, src[0], src[1], dst[0], dst[1], seq & 0xFFFFFFFF, flags, payload, 0, self.packets, self.file)
        self._emit(self.recorder.feed(seg))

    def _emit(self, records: list[Record]) -> None:
        for r in records:
            if self.on_record is not None:
                self.on_record(r)
            else:
                self.records.append(r)

    def flush(self) -> None:
        """Flush the pcap file (it stays open)."""
        if self.writer is not None:
            self.writer._fh.flush()

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


class LiveConnection:
    """One live TCP connection of a :class:`LiveCapture`: hand it the bytes of each direction."""

    def __init__(self, capture: LiveCapture, client: tuple[str, int], server: tuple[str, int]) -> None:
        self.capture = capture
        self.client = client
        self.server = server
        self.seq = {"c2s": 1_000, "s2c": 5_000}
        self.closed = False
        self._masker = None if capture.keep_secrets or capture.writer is None else _Masker()

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
        view = memoryview(data)
        for off in range(0, len(data), SEGMENT):
            chunk = bytes(view[off : off + SEGMENT])
            masker = self._masker if direction == "c2s" else None
            self.capture._segment(ts, src, dst, self.seq[direction], self.seq[other], PSH | ACK, chunk, direction == "c2s", masker)
            self.seq[direction] += len(chunk)

    def close(self, ts: int | None = None, *, reset: bool = False, by: str = "c2s") -> None:
        """The connection ended: FIN both ways (or an RST from the ``by`` side)."""
        if self.closed:
            return
        self.closed = True
        ts = self.capture.clock() if ts is None else ts
        if self._masker is not None and self.capture.writer is not None:  # an unfinished SASL frame: written masked
            for p in self._masker.flush():
                self.capture.writer.tcp(p[0], p[1], p[2], p[3], p[4], p[5], p[6], client=p[7])
        src, dst, other = self._ends(by)
        if reset:
            self.capture._segment(ts, src, dst, self.seq[by], self.seq[other], RST | ACK, b"", by == "c2s")
            return
        self.capture._segment(ts, src, dst, self.seq[by], self.seq[other], FIN | ACK, b"", by == "c2s")
        self.seq[by] += 1
        self.capture._segment(ts, dst, src, self.seq[other], self.seq[by], FIN | ACK, b"", by != "c2s")
        self.seq[other] += 1
        self.capture._segment(ts, src, dst, self.seq[by], self.seq[other], ACK, b"", by == "c2s")


_SASL_REQUESTS = frozenset((0x21, 0x22))  # SASL_AUTH, SASL_STEP


class _Masker:
    """Overwrites SASL secrets in the client's packets before they are written to a pcap.

    Frames are found with the one :class:`FrameDecoder` and the secrets with
    :func:`dissect` (its ``secrets`` spans).  A packet that holds part of a
    SASL request not yet complete is held back until the frame completes
    (the client waits for the answer, so nothing is reordered); every other
    packet is written at once.
    """

    def __init__(self) -> None:
        self.decoder = FrameDecoder()
        self.pending: list[tuple[int, list[Any]]] = []  # (stream offset, packet as a list: payload at [6])
        self.offset = 0

    def add(self, packet: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        payload: bytes = packet[6]
        self.pending.append((self.offset, list(packet)))
        self.offset += len(payload)
        for ev in self.decoder.feed(payload):
            if isinstance(ev, Frame) and ev.dialect == "mcbp" and ev.opcode in _SASL_REQUESTS and not ev.is_response:
                for off, n in dissect(ev).secrets:
                    self._mask(ev.offset + off, n)
        start = self.decoder.offset - self.decoder.buffered  # the first byte of the unfinished frame
        if self.decoder.buffered and self._sasl_at(start):
            # hold the unfinished SASL frame's packets (its first two bytes, magic and opcode, may
            # already be out: a secret starts after the 24-byte header)
            return self._release(start)
        return self._release(self.offset)

    def _release(self, upto: int) -> list[tuple[Any, ...]]:
        out = [tuple(p) for o, p in self.pending if o + len(p[6]) <= upto]
        self.pending = [(o, p) for o, p in self.pending if o + len(p[6]) > upto]
        return out

    def _byte(self, at: int) -> int | None:
        for o, p in self.pending:
            if o <= at < o + len(p[6]):
                return int(p[6][at - o])
        return None

    def _sasl_at(self, start: int) -> bool | None:
        """Whether the frame starting at ``start`` is a SASL request (None: too few bytes to tell)."""
        magic, opcode = self._byte(start), self._byte(start + 1)
        if magic is None or opcode is None:
            return None
        return magic in (0x80, 0x08) and opcode in _SASL_REQUESTS

    def _mask(self, at: int, n: int) -> None:
        for i, (o, p) in enumerate(self.pending):
            payload = p[6]
            a, b = max(at, o), min(at + n, o + len(payload))
            if a < b:
                buf = bytearray(payload)
                buf[a - o : b - o] = b"*" * (b - a)
                p[6] = bytes(buf)
                self.pending[i] = (o, p)

    def flush(self) -> list[tuple[Any, ...]]:
        """Everything still held (the connection ended inside a SASL frame): masked from its first byte on."""
        start = self.decoder.offset - self.decoder.buffered
        if self.decoder.buffered:
            self._mask(start + 24, self.offset - start - 24)  # header kept, body hidden: it may hold the secret
        return self._release(self.offset)
