"""Writing pcap files (an edge: file I/O; struct only, fast).

:class:`RawPcapWriter` writes link-layer packets as captured (the sniffer's
file).  :class:`PcapWriter` synthesises Ethernet/IPv4 (or IPv6)/TCP headers
around payloads with correct sequence numbers, lengths and IPv4 header
checksums, so tshark and ``dcpinspect frames`` read the file back; it writes
the shipped sample captures, the benchmarks' and the live tools' captures.

:func:`copy_packets` writes a slice of existing captures back out (``frames
--pcap``): the packets a :class:`PacketSelection` keeps, as captured - the
same bytes, original lengths, times and link type - in capture order.  Rules:

1. A packet is named by its capture set and its position there (the packets
   of the set's files before it plus its number in its file), as the frames
   table's ``capture_set``, ``packet`` and ``packet_first`` columns name it.
2. A selected frame keeps the packets of its connection and direction from
   ``packet_first`` to ``packet`` that carry payload; a selected connection
   keeps every packet of its 4-tuple in its set (handshake, acks, close)
   captured between its first and last packet's times.
3. One link type per pcap file: packets of another are not written, and
   counted.
"""

from __future__ import annotations

import bisect
import ipaddress
import struct
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import BinaryIO, NamedTuple, Self

from ..flows.reassembly import TS_UNKNOWN, Segment
from .packets import parse_packet
from .pcapfile import CaptureError, CaptureReader

__all__ = [
    "LINKTYPE_ETHERNET",
    "CopyResult",
    "PacketSelection",
    "PcapWriter",
    "RawPcapWriter",
    "TcpConversation",
    "copy_packets",
    "sum16",
]

FIN, SYN, RST, PSH, ACK = 0x01, 0x02, 0x04, 0x08, 0x10
LINKTYPE_ETHERNET = 1
_MAC_C = b"\x02\x00\x00\x00\x00\x01"
_MAC_S = b"\x02\x00\x00\x00\x00\x02"


def sum16(data: bytes) -> int:
    """Ones' complement sum of ``data`` as big-endian 16-bit words (zero-padded), folded: the internet checksum is its complement (RFC 1071)."""
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f">{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


class RawPcapWriter:
    """A pcap file of link-layer packets as captured (nanosecond timestamps by default)."""

    def __init__(
        self, path: str | Path | BinaryIO, linktype: int = LINKTYPE_ETHERNET, *, nanosecond: bool = True, snaplen: int = 262_144
    ) -> None:
        # a path is opened here; an open binary file is taken over (closed by close())
        self._fh: BinaryIO = Path(path).open("wb") if isinstance(path, (str, Path)) else path  # noqa: SIM115
        self.nanosecond = nanosecond
        magic = 0xA1B23C4D if nanosecond else 0xA1B2C3D4
        self._fh.write(struct.pack("<IHHiIII", magic, 2, 4, 0, 0, snaplen, linktype))
        self.packets = 0

    def write(self, ts_ns: int, data: bytes, wirelen: int | None = None) -> None:
        """Write one packet captured at ``ts_ns`` (``wirelen``: its length on the wire, if more was sent than captured).

        A time a pcap record cannot hold (before 1970, after 2106) is written as 0.
        """
        sec, frac = divmod(ts_ns, 1_000_000_000)
        if not 0 <= sec < 1 << 32:
            sec = frac = 0
        if not self.nanosecond:
            frac //= 1000
        self._fh.write(struct.pack("<IIII", sec, frac, len(data), len(data) if wirelen is None else wirelen) + data)
        self.packets += 1

    def flush(self) -> None:
        """Push what was written to the file (a reader sees every packet so far)."""
        self._fh.flush()

    def close(self) -> None:
        """Flush and close the file."""
        self._fh.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PcapWriter(RawPcapWriter):
    """A pcap file of Ethernet frames synthesised around TCP payloads (nanosecond timestamps by default)."""

    def __init__(self, path: str | Path, *, nanosecond: bool = True, snaplen: int = 262_144) -> None:
        super().__init__(path, LINKTYPE_ETHERNET, nanosecond=nanosecond, snaplen=snaplen)
        self._ip_id = 0

    def tcp(
        self,
        ts_ns: int,
        src: tuple[str, int],
        dst: tuple[str, int],
        seq: int,
        ack: int,
        flags: int,
        payload: bytes = b"",
        *,
        client: bool = True,
    ) -> None:
        """Write one TCP segment from ``src`` to ``dst``."""
        s_ip = ipaddress.ip_address(src[0])
        d_ip = ipaddress.ip_address(dst[0])
        tcp = struct.pack(">HHIIBBHHH", src[1], dst[1], seq & 0xFFFFFFFF, ack & 0xFFFFFFFF, 0x50, flags, 65535, 0, 0)
        if s_ip.version == 4:
            self._ip_id = (self._ip_id + 1) & 0xFFFF
            ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 40 + len(payload), self._ip_id, 0x4000, 64, 6, 0, s_ip.packed, d_ip.packed)
            ip = ip[:10] + struct.pack(">H", ~sum16(ip) & 0xFFFF) + ip[12:]
            etype = b"\x08\x00"
        else:
            ip = struct.pack(">IHBB16s16s", 0x60000000, 20 + len(payload), 6, 64, s_ip.packed, d_ip.packed)
            etype = b"\x86\xdd"
        macs = (_MAC_S + _MAC_C) if client else (_MAC_C + _MAC_S)
        self.write(ts_ns, macs + etype + ip + tcp + payload)


class TcpConversation:
    """One TCP connection written through a :class:`PcapWriter`: handshake, data cut at ``mss``, close."""

    def __init__(
        self,
        writer: PcapWriter,
        client: tuple[str, int],
        server: tuple[str, int],
        *,
        isn_c: int = 1_000,
        isn_s: int = 5_000,
        mss: int = 1448,
    ) -> None:
        self.w = writer
        self.client = client
        self.server = server
        self.seq = {"c2s": isn_c, "s2c": isn_s}
        self.mss = mss

    def _ends(self, direction: str) -> tuple[tuple[str, int], tuple[str, int], str]:
        return (self.client, self.server, "s2c") if direction == "c2s" else (self.server, self.client, "c2s")

    def open(self, ts_ns: int) -> None:
        """SYN, SYN-ACK, ACK."""
        self.w.tcp(ts_ns, self.client, self.server, self.seq["c2s"], 0, SYN)
        self.w.tcp(ts_ns + 1000, self.server, self.client, self.seq["s2c"], self.seq["c2s"] + 1, SYN | ACK, client=False)
        self.seq["c2s"] += 1
        self.seq["s2c"] += 1
        self.w.tcp(ts_ns + 2000, self.client, self.server, self.seq["c2s"], self.seq["s2c"], ACK)

    def send(self, direction: str, data: bytes, ts_ns: int, *, step_ns: int = 1000, skip: tuple[int, ...] = ()) -> int:
        """Send ``data`` cut every ``mss`` bytes; segments whose index is in ``skip`` are lost. Returns the next ts."""
        src, dst, other = self._ends(direction)
        for i, off in enumerate(range(0, len(data), self.mss)):
            chunk = data[off : off + self.mss]
            if i not in skip:
                self.w.tcp(ts_ns, src, dst, self.seq[direction], self.seq[other], PSH | ACK, chunk, client=direction == "c2s")
            self.seq[direction] += len(chunk)
            ts_ns += step_ns
        return ts_ns

    def close(self, ts_ns: int) -> None:
        """FIN from both sides and the last ACK."""
        self.w.tcp(ts_ns, self.client, self.server, self.seq["c2s"], self.seq["s2c"], FIN | ACK)
        self.seq["c2s"] += 1
        self.w.tcp(ts_ns + 1000, self.server, self.client, self.seq["s2c"], self.seq["c2s"], FIN | ACK, client=False)
        self.seq["s2c"] += 1
        self.w.tcp(ts_ns + 2000, self.client, self.server, self.seq["c2s"], self.seq["s2c"], ACK)


Flow = tuple[str, int, str, int]  # source address, port, destination address, port


class PacketSelection:
    """Which packets of a run to copy: per capture set and flow (one direction of a 4-tuple), spans of positions or of times.

    A frame's span (:meth:`add`) keeps the packets with payload at positions
    ``first`` to ``last`` of its set; a connection (:meth:`add_connection`)
    keeps every packet of its 4-tuple, both ways, captured in its time span.
    """

    def __init__(self) -> None:
        self._spans: dict[tuple[int, Flow], list[tuple[int, int]]] = defaultdict(list)
        self._times: dict[tuple[int, Flow], list[tuple[int, int]]] = defaultdict(list)
        self._merged: dict[tuple[int, Flow], tuple[list[int], list[int]]] | None = None

    def add(self, flow: Flow, first: int, last: int, *, capture_set: int = 1) -> None:
        """Keep the packets with payload of ``flow`` at positions ``first`` to ``last`` (inclusive) of set ``capture_set``."""
        self._spans[(capture_set, flow)].append((first, last))
        self._merged = None

    def add_connection(
        self, client: tuple[str, int], server: tuple[str, int], first_ts: int, last_ts: int, *, capture_set: int = 1
    ) -> None:
        """Keep every packet of a connection, both directions, captured from ``first_ts`` to ``last_ts`` (ns, inclusive)."""
        self._times[(capture_set, (client[0], client[1], server[0], server[1]))].append((first_ts, last_ts))
        self._times[(capture_set, (server[0], server[1], client[0], client[1]))].append((first_ts, last_ts))

    def __bool__(self) -> bool:
        return bool(self._spans or self._times)

    def _index(self) -> dict[tuple[int, Flow], tuple[list[int], list[int]]]:
        if self._merged is None:
            merged = {}
            for key, spans in self._spans.items():
                starts: list[int] = []
                ends: list[int] = []
                for a, b in sorted(spans):
                    if ends and a <= ends[-1] + 1:
                        ends[-1] = max(ends[-1], b)
                    else:
                        starts.append(a)
                        ends.append(b)
                merged[key] = (starts, ends)
            self._merged = merged
        return self._merged

    def keeps(self, pos: int, seg: Segment, capture_set: int = 1) -> bool:
        """Whether the packet at position ``pos`` of set ``capture_set``, carrying ``seg``, is selected."""
        key = (capture_set, (seg.src, seg.sport, seg.dst, seg.dport))
        times = self._times.get(key)
        if times is not None and any(a <= seg.ts <= b for a, b in times):
            return True
        spans = self._index().get(key)
        if spans is None or not (seg.payload or seg.missing):
            return False
        i = bisect.bisect_right(spans[0], pos) - 1
        return i >= 0 and pos <= spans[1][i]


class CopyResult(NamedTuple):
    """What :func:`copy_packets` wrote: packets, their link type, packets left out for another link type, files' errors."""

    packets: int
    linktype: int | None
    other_linktype: int
    errors: list[str]


def copy_packets(sets: Iterable[tuple[int, Sequence[str]]], selection: PacketSelection, out: str | Path) -> CopyResult:
    """Write the packets that ``selection`` keeps to the pcap file ``out``: each capture set's files read in order, the sets in turn.

    ``sets`` are ``(set number, its files in reading order)``: a packet's
    position is counted from its set's start.  The file is created first (an
    :class:`OSError` if it cannot be); a file that cannot be read is skipped
    and its error returned.
    """
    writer: RawPcapWriter | None = None
    fh = Path(out).open("wb")  # noqa: SIM115 - handed to the writer, closed below
    linktype: int | None = None
    written = other = 0
    errors: list[str] = []
    skipped: Counter[str] = Counter()
    try:
        for number, paths in sets:
            base = 0
            for path in paths:
                reader = CaptureReader(str(path))
                try:
                    for pkt in reader:
                        pos = base + pkt.number
                        seg = parse_packet(pkt.linktype, pkt.data, pkt.wirelen, pkt.ts, pkt.number, str(path), skipped, pos)
                        if seg is None or not selection.keeps(pos, seg, number):
                            continue
                        if writer is None:
                            linktype = pkt.linktype
                            writer = RawPcapWriter(fh, linktype)
                        if pkt.linktype != linktype:
                            other += 1
                            continue
                        writer.write(0 if pkt.ts == TS_UNKNOWN else pkt.ts, pkt.data, pkt.wirelen)
                        written += 1
                except CaptureError as exc:
                    errors.append(str(exc))
                base += reader.packets
        if writer is None:
            writer = RawPcapWriter(fh, LINKTYPE_ETHERNET)
    finally:
        if writer is not None:
            writer.close()
        else:
            fh.close()
    return CopyResult(written, linktype, other, errors)
