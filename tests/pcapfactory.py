"""Write deterministic capture files of TCP conversations, with their ground truth.

Tests describe conversations as :class:`Conn` objects (a client, a server and
the application messages each side writes), and :func:`write_capture` turns
them into a pcap or pcapng file: handshake, data segments cut every ``mss``
bytes (with no regard to frame boundaries), correct sequence numbers (wrapping
at 2**32), plausible ACKs, valid checksums, and the close.  Capture faults are
injected on request (lost, reordered, duplicated or conflicting segments,
snaplen cuts, a capture that starts mid-connection) and reported back in the
returned :class:`Written` record, so a test knows exactly which bytes a
reassembler should recover and which it cannot.

Packets are built with scapy layers; classic pcap files are written with
scapy's ``PcapWriter``.  pcapng files are written by hand with ``struct``,
because scapy's pcapng writer has a fixed microsecond resolution, takes float
timestamps, only writes little-endian sections and cannot name an interface's
``if_tsresol``.

Example::

    conn = Conn(msgs=[Msg("c2s", request), Msg("s2c", response)])
    w = write_capture(tmp_path / "x.pcapng", [conn], fmt="pcapng", drop=[1])
    assert w.stream(0, "s2c") == response and w.missing[0, "s2c"] == [(0, len(response))]
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import ipaddress
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.inet6 import ICMPv6EchoRequest, IPv6
from scapy.layers.l2 import ARP, CookedLinux, CookedLinuxV2, Dot1Q, Ether
from scapy.packet import Packet, Raw
from scapy.utils import PcapWriter

__all__ = [
    "DIRECTIONS",
    "FORMATS",
    "LINKTYPES",
    "Conn",
    "Msg",
    "PacketInfo",
    "Segment",
    "Written",
    "pcap_records",
    "write_bad_files",
    "write_capture",
    "write_hostile_headers",
]

#: Link-layer names accepted by :func:`write_capture` and their LINKTYPE_ numbers.
LINKTYPES: dict[str, int] = {
    "ether": 1,  # Ethernet II
    "ether-vlan": 1,  # Ethernet II with an 802.1Q tag (VLAN 100)
    "sll": 113,  # Linux cooked capture v1
    "sll2": 276,  # Linux cooked capture v2
    "raw": 101,  # raw IPv4/IPv6, no link header
    "null": 0,  # BSD loopback, 4-byte address family in the file's byte order
    "loop": 108,  # OpenBSD loopback, 4-byte address family in network byte order
}
FORMATS = ("pcap", "pcapng")
DIRECTIONS = ("c2s", "s2c")

_SEQ_MOD = 2**32
_NS = 1_000_000_000
_AF_INET = 2
_AF_INET6 = 24  # the BSD value; libpcap/Wireshark also accept 28 and 30
_VLAN_ID = 100
#: extra pcapng interfaces cycle through these (linktype name, if_tsresol byte)
_EXTRA_IFACES = (("ether", 9), ("raw", 0x80 | 20), ("sll", 3), ("ether-vlan", 6))


@dataclass
class Msg:
    """One application write: ``data`` sent in ``direction`` ("c2s" or "s2c").

    The bytes are cut into segments of at most ``mss`` bytes; consecutive
    messages are never coalesced, so put several protocol frames in one
    ``Msg`` to have segments carry several frames or split frames anywhere.
    ``ts`` (seconds since the epoch) pins the timestamp of the message's first
    segment; it must not go back in time within its connection.
    """

    direction: str
    data: bytes
    ts: float | None = None


@dataclass
class Conn:
    """A TCP connection: endpoints, messages in sending order, and its opening and close.

    ``handshake`` writes SYN, SYN-ACK, ACK first; ``close`` is ``"fin"`` (client
    FIN, server FIN, client ACK), ``"rst"`` (client RST) or ``None`` (the
    capture ends with the connection open).  ``isn_c``/``isn_s`` are the
    initial sequence numbers of client and server (the SYNs' seq).
    Addresses may be IPv4 or IPv6 text; with ``ipv6=True`` an IPv4 address
    ``a.b.c.d`` becomes ``fd00::a.b.c.d``.
    """

    client: tuple[str, int] = ("10.0.0.1", 50000)
    server: tuple[str, int] = ("10.0.0.2", 11210)
    msgs: list[Msg] = field(default_factory=list)
    handshake: bool = True
    close: str | None = "fin"
    isn_c: int = 1000
    isn_s: int = 5000


@dataclass
class Segment:
    """Ground truth for one data segment, numbered in sending order across all connections.

    ``index`` is the number the fault lists (``drop``, ``reorder``, ...) refer
    to: data segments of all connections in the order they would be written
    without faults.  ``offset`` is the stream offset of the first payload byte
    (0 = first byte after the SYN) and ``seq`` the TCP sequence number, both
    after a ``start_offset`` cut.  ``fate`` is ``"sent"``, ``"dropped"`` or
    ``"before-start"`` (entirely before ``start_offset``).  ``frames`` are the
    1-based frame numbers of every copy in the file (original first, then a
    duplicate and/or the conflicting retransmission); ``captured`` is how many
    payload bytes of the original copy the file holds (less than ``length``
    when snaplen cut the packet).  ``conflict`` holds the different bytes
    retransmitted for ``overlap_conflict``.  ``ts``/``ts_ns`` are the
    timestamp written for the original (at the file's resolution).
    """

    index: int
    conn: int
    direction: str
    seq: int
    offset: int
    length: int
    ts: float
    ts_ns: int
    fate: str = "sent"
    frames: list[int] = field(default_factory=list)
    captured: int = 0
    reordered: bool = False
    duplicated: bool = False
    conflict: bytes | None = None

    @property
    def end(self) -> int:
        """Stream offset just past the segment."""
        return self.offset + self.length


@dataclass
class PacketInfo:
    """One record of the file: what it is, where it went, how long it was."""

    number: int  # 1-based frame number, as tshark counts
    interface: int  # pcapng interface id (0 for pcap)
    kind: str  # syn, syn-ack, ack, data, dup, conflict, fin, rst, udp, icmp, arp
    conn: int | None  # index into the conns list; None for non-TCP packets
    direction: str | None  # "c2s"/"s2c" for TCP packets
    ts_ns: int
    caplen: int
    wirelen: int
    segment: int | None = None  # Segment.index for data/dup/conflict records


@dataclass
class Written:
    """What :func:`write_capture` wrote: the file, its packets, and the truth about each stream.

    ``streams[conn, direction]`` is every byte the side sent (full stream,
    whatever was captured).  ``missing[conn, direction]`` lists the half-open
    stream-offset ranges ``(start, end)`` that no packet in the file carries
    (dropped segments, snaplen cuts, ``start_offset``); conflicting
    retransmissions do not count as carrying the original bytes.
    ``addresses[conn]`` is ``((client_ip, port), (server_ip, port))`` as written.
    """

    path: Path
    fmt: str
    linktype: str
    dlt: int
    packets: int
    streams: dict[tuple[int, str], bytes]
    missing: dict[tuple[int, str], list[tuple[int, int]]]
    segments: list[Segment]
    frames: list[PacketInfo]
    addresses: list[tuple[tuple[str, int], tuple[str, int]]]
    resolution_ns: int

    def stream(self, conn: int, direction: str) -> bytes:
        """The full byte stream one side of a connection sent."""
        return self.streams[conn, direction]

    def captured_bytes(self, conn: int, direction: str) -> int:
        """How many distinct bytes of the stream the file carries."""
        return len(self.streams[conn, direction]) - sum(b - a for a, b in self.missing[conn, direction])

    def complete(self, conn: int, direction: str) -> bool:
        """True when the whole stream of that side is in the file."""
        return not self.missing[conn, direction]

    def tcp_stream_order(self) -> list[int]:
        """Connection indices in order of first appearance (tshark's ``tcp.stream`` numbering)."""
        seen: list[int] = []
        for p in self.frames:
            if p.conn is not None and p.conn not in seen:
                seen.append(p.conn)
        return seen

    def data_segments(self, conn: int | None = None, direction: str | None = None) -> list[Segment]:
        """Segments, optionally restricted to one connection and direction."""
        return [s for s in self.segments if (conn is None or s.conn == conn) and (direction is None or s.direction == direction)]


# --------------------------------------------------------------------------- internals


@dataclass
class _Pkt:
    """A packet before it is built: TCP fields or a non-TCP kind, timestamp in ns."""

    kind: str
    ts: int
    conn: int | None = None
    direction: str | None = None
    seq: int = 0
    ack: int = 0
    flags: str = ""
    payload: bytes = b""
    segment: Segment | None = None
    iface: int = 0
    extra_no: int = 0


def _ns(seconds: float) -> int:
    """Seconds (float) to integer nanoseconds, via the float's shortest repr (no binary noise)."""
    return int(Decimal(repr(float(seconds))) * _NS)


def _address(addr: str, ipv6: bool) -> str:
    ip = ipaddress.ip_address(addr)
    if ipv6 and ip.version == 4:
        return str(ipaddress.IPv6Address(0xFD00 << 112 | int(ip)))
    return str(ip)


def _mac(addr: str) -> str:
    digest = hashlib.sha1(addr.encode()).digest()
    return "02:00:" + ":".join(f"{b:02x}" for b in digest[:4])


def _per_second(tsresol: int) -> int:
    """Timestamp units per second for a pcapng ``if_tsresol`` byte (bit 7 set: power of 2)."""
    return 1 << (tsresol & 0x7F) if tsresol & 0x80 else int(10**tsresol)


def _units(ts_ns: int, tsresol: int) -> int:
    return ts_ns * _per_second(tsresol) // _NS


def _quantize(ts_ns: int, tsresol: int) -> int:
    """The timestamp a reader gets back after ``ts_ns`` was written at that resolution.

    Rounded up to the next ns so that converting back gives the same units.
    """
    return -(-_units(ts_ns, tsresol) * _NS // _per_second(tsresol))


def _check_indices(name: str, values: Iterable[int], count: int) -> list[int]:
    out = [int(v) for v in values]
    for v in out:
        if not 0 <= v < count:
            raise ValueError(f"{name}: data segment index {v} out of range (0..{count - 1})")
    return out


def _conn_packets(ci: int, conn: Conn, *, mss: int, base: int, step: int, start_offset: int) -> list[_Pkt]:
    """One connection's packets in order, with pre-fault timestamps (ns) and ACKs."""
    for m in conn.msgs:
        if m.direction not in DIRECTIONS:
            raise ValueError(f"conn {ci}: direction must be 'c2s' or 's2c', not {m.direction!r}")
    if conn.close not in ("fin", "rst", None):
        raise ValueError(f"conn {ci}: close must be 'fin', 'rst' or None, not {conn.close!r}")
    isn = {"c2s": conn.isn_c % _SEQ_MOD, "s2c": conn.isn_s % _SEQ_MOD}
    sent = {"c2s": 0, "s2c": 0}
    other = {"c2s": "s2c", "s2c": "c2s"}
    pkts: list[_Pkt] = []
    clock = [base - step]

    def tick(pinned: int | None = None) -> int:
        if pinned is not None:
            if pinned < clock[0]:
                raise ValueError(f"conn {ci}: Msg.ts goes back in time")
            clock[0] = pinned
        else:
            clock[0] += step
        return clock[0]

    def seq(d: str, extra: int = 0) -> int:
        return (isn[d] + 1 + sent[d] + extra) % _SEQ_MOD

    if conn.handshake and start_offset == 0:
        pkts.append(_Pkt("syn", tick(), ci, "c2s", isn["c2s"], 0, "S"))
        pkts.append(_Pkt("syn-ack", tick(), ci, "s2c", isn["s2c"], seq("c2s"), "SA"))
        pkts.append(_Pkt("ack", tick(), ci, "c2s", seq("c2s"), seq("s2c"), "A"))
    for m in conn.msgs:
        d = m.direction
        data = bytes(m.data)
        pinned = _ns(m.ts) if m.ts is not None else None
        for i in range(0, len(data), mss):
            chunk = data[i : i + mss]
            last = i + mss >= len(data)
            seg = Segment(index=-1, conn=ci, direction=d, seq=seq(d), offset=sent[d], length=len(chunk), ts=0.0, ts_ns=0)
            pkts.append(_Pkt("data", tick(pinned if i == 0 else None), ci, d, seq(d), seq(other[d]), "PA" if last else "A", chunk, seg))
            sent[d] += len(chunk)
    if conn.close == "fin":
        pkts.append(_Pkt("fin", tick(), ci, "c2s", seq("c2s"), seq("s2c"), "FA"))
        pkts.append(_Pkt("fin", tick(), ci, "s2c", seq("s2c"), seq("c2s", 1), "FA"))
        pkts.append(_Pkt("ack", tick(), ci, "c2s", seq("c2s", 1), seq("s2c", 1), "A"))
    elif conn.close == "rst":
        pkts.append(_Pkt("rst", tick(), ci, "c2s", seq("c2s"), seq("s2c"), "RA"))
    return pkts


def _l3(src: str, dst: str, ip_id: int, upper: Packet) -> Packet:
    if ":" in src:
        return IPv6(src=src, dst=dst, hlim=64) / upper
    return IP(src=src, dst=dst, id=ip_id & 0xFFFF, flags="DF", ttl=64) / upper


@functools.lru_cache(maxsize=256)
def _link_header(linktype: str, ethertype: int, src: str, dst: str, outgoing: bool, byteorder: str) -> bytes:
    """The link-layer header (built once with scapy) for a packet of ``ethertype`` from ``src`` to ``dst``."""
    mac = bytes.fromhex(_mac(src).replace(":", "")) + b"\0\0"
    pkttype = 4 if outgoing else 0  # Linux PACKET_OUTGOING / PACKET_HOST: the capture runs on the client
    if linktype == "ether":
        return bytes(Ether(src=_mac(src), dst=_mac(dst) if ethertype != 0x0806 else "ff:ff:ff:ff:ff:ff", type=ethertype))
    if linktype == "ether-vlan":
        return bytes(Ether(src=_mac(src), dst=_mac(dst), type=0x8100) / Dot1Q(vlan=_VLAN_ID, type=ethertype))
    if linktype == "sll":
        return bytes(CookedLinux(pkttype=pkttype, lladdrtype=1, lladdrlen=6, src=mac, proto=ethertype))
    if linktype == "sll2":
        return bytes(CookedLinuxV2(proto=ethertype, ifindex=2, lladdrtype=1, pkttype=pkttype, lladdrlen=6, src=mac))
    family = _AF_INET6 if ethertype == 0x86DD else _AF_INET
    if linktype == "null":
        return struct.pack(byteorder + "I", family)  # host byte order of the capturing machine
    if linktype == "loop":
        return struct.pack(">I", family)
    return b""  # raw


def _link(linktype: str, l3: Packet, src: str, dst: str, outgoing: bool, byteorder: str) -> bytes:
    """``l3`` (IP, IPv6 or ARP) with the link header of ``linktype`` in front."""
    ethertype = 0x86DD if isinstance(l3, IPv6) else 0x0806 if isinstance(l3, ARP) else 0x0800
    return _link_header(linktype, ethertype, src, dst, outgoing, byteorder) + bytes(l3)


def _build_tcp(p: _Pkt, addrs: tuple[tuple[str, int], tuple[str, int]], ip_id: int, linktype: str, byteorder: str, mss: int) -> bytes:
    (cip, cport), (sip, sport) = addrs
    src, dst, sp, dp = (cip, sip, cport, sport) if p.direction == "c2s" else (sip, cip, sport, cport)
    options = [("MSS", mss)] if "S" in p.flags else []
    tcp = TCP(sport=sp, dport=dp, seq=p.seq, ack=p.ack if "A" in p.flags else 0, flags=p.flags, window=65535, options=options)
    upper = tcp / Raw(p.payload) if p.payload else tcp
    return _link(linktype, _l3(src, dst, ip_id, upper), src, dst, p.direction == "c2s", byteorder)


def _build_other(kind: str, n: int, linktype: str, v6: bool, byteorder: str) -> bytes:
    """A non-TCP packet (UDP, ICMP echo, or ARP on Ethernet links) between two bystander hosts."""
    src, dst = ("fd00::a00:63", "fd00::a00:2") if v6 else ("10.0.0.99", "10.0.0.2")
    if kind == "arp":
        return _link(linktype, ARP(op=1, hwsrc=_mac(src), psrc="10.0.0.99", pdst="10.0.0.2"), src, dst, True, byteorder)
    if kind == "udp":
        upper: Packet = UDP(sport=40000 + n, dport=53) / Raw(
            b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03com\x00\x00\x01\x00\x01"
        )
    elif v6:
        upper = ICMPv6EchoRequest(id=0x4242, seq=n, data=b"pcapfactory")
    else:
        upper = ICMP(type=8, id=0x4242, seq=n) / Raw(b"pcapfactory")
    return _link(linktype, _l3(src, dst, 0x100 + n, upper), src, dst, True, byteorder)


def _subtract(length: int, covered: list[tuple[int, int]]) -> list[tuple[int, int]]:
    gaps: list[tuple[int, int]] = []
    pos = 0
    for a, b in sorted(covered):
        if a > pos:
            gaps.append((pos, min(a, length)))
        pos = max(pos, b)
    if pos < length:
        gaps.append((pos, length))
    return [(a, b) for a, b in gaps if b > a]


def _insert_by_time(order: list[_Pkt], extra: list[_Pkt]) -> list[_Pkt]:
    """Merge ``extra`` packets into the time-ordered list (after packets with the same timestamp)."""
    out = list(order)
    for p in sorted(extra, key=lambda q: q.ts):
        pos = bisect.bisect_right([q.ts for q in out], p.ts)
        out.insert(pos, p)
    return out


class _PcapNg:
    """A minimal pcapng writer: SHB, IDBs with if_name/if_tsresol, EPBs."""

    def __init__(self, path: Path, byteorder: str) -> None:
        self.f = path.open("wb")
        self.e = byteorder
        body = struct.pack(self.e + "IHHq", 0x1A2B3C4D, 1, 0, -1) + self._options([(4, b"dcpinspect tests/pcapfactory.py")])
        self._block(0x0A0D0D0A, body)

    def _options(self, opts: Sequence[tuple[int, bytes]]) -> bytes:
        if not opts:
            return b""
        out = b""
        for code, value in opts:
            out += struct.pack(self.e + "HH", code, len(value)) + value + b"\0" * (-len(value) % 4)
        return out + struct.pack(self.e + "HH", 0, 0)

    def _block(self, btype: int, body: bytes) -> None:
        body += b"\0" * (-len(body) % 4)
        n = len(body) + 12
        self.f.write(struct.pack(self.e + "II", btype, n) + body + struct.pack(self.e + "I", n))

    def interface(self, dlt: int, snaplen: int, name: str, tsresol: int) -> None:
        opts = [(2, name.encode())]
        if tsresol != 6:
            opts.append((9, bytes([tsresol])))
        self._block(1, struct.pack(self.e + "HHI", dlt, 0, snaplen) + self._options(opts))

    def packet(self, iface: int, units: int, data: bytes, wirelen: int) -> None:
        self._block(6, struct.pack(self.e + "IIIII", iface, units >> 32, units & 0xFFFFFFFF, len(data), wirelen) + data)

    def close(self) -> None:
        self.f.close()


# --------------------------------------------------------------------------- public API


def write_capture(
    path: str | Path,
    conns: list[Conn],
    *,
    fmt: str = "pcap",
    linktype: str = "ether",
    ipv6: bool = False,
    mss: int = 1460,
    nanosecond: bool = False,
    big_endian: bool = False,
    snaplen: int = 65535,
    reorder: Iterable[int] = (),
    drop: Iterable[int] = (),
    duplicate: Iterable[int] = (),
    overlap_conflict: Iterable[int] = (),
    start_offset: int = 0,
    interleave: bool = True,
    ts0: float = 1_700_000_000.0,
    step: float = 0.001,
    extra_interfaces: int = 0,
    non_tcp: int = 0,
) -> Written:
    """Write ``conns`` to ``path`` as a pcap or pcapng capture and return the ground truth.

    * ``fmt``: ``"pcap"`` (scapy's writer; ``nanosecond`` selects magic
      0xa1b23c4d) or ``"pcapng"`` (``nanosecond`` sets ``if_tsresol`` 9 on
      the capture interface).  ``big_endian`` writes the file (pcap header and
      records, or the pcapng section) big-endian.
    * ``linktype``: one of :data:`LINKTYPES`.  ``ipv6`` maps IPv4 addresses
      into ``fd00::/96``.
    * ``mss``: payload bytes per segment; each :class:`Msg` is cut every
      ``mss`` bytes regardless of frame boundaries.
    * ``snaplen``: packets longer than this are cut in the file (caplen <
      wirelen), as tcpdump does.
    * Fault lists take data-segment indices (see :class:`Segment`):
      ``drop`` omits them; ``reorder`` swaps each with the next data segment
      of the same connection and direction (timestamps stay with file
      positions, so the file remains time-ordered); ``duplicate`` writes a
      second identical copy right after; ``overlap_conflict`` writes a
      retransmission with the same seq and length but every byte different.
      Lists are applied in that order (drop, reorder, duplicate, conflict).
    * ``start_offset``: the capture starts mid-connection: no handshake, and
      the first ``start_offset`` bytes of each direction are absent (a
      segment straddling the cut is written from the cut on).
    * ``interleave``: packets of several connections alternate by timestamp
      (connection ``c`` runs ``c * step / len(conns)`` behind the first);
      otherwise each connection starts after the previous one ended.
    * ``ts0``/``step``: first timestamp and spacing, in seconds.
    * ``non_tcp``: add that many UDP and ICMP echo packets (alternating) on
      the capture interface, spread over the capture.
    * ``extra_interfaces`` (pcapng only): add interfaces with other
      linktypes and ``if_tsresol`` values (ns, 2^-20 s, ms, us), each
      carrying two non-TCP packets (ARP on Ethernet ones, else UDP).
    """
    path = Path(path)
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, not {fmt!r}")
    if linktype not in LINKTYPES:
        raise ValueError(f"linktype must be one of {sorted(LINKTYPES)}, not {linktype!r}")
    if extra_interfaces and fmt != "pcapng":
        raise ValueError("extra_interfaces needs fmt='pcapng'")
    if mss <= 0 or snaplen <= 0 or start_offset < 0 or non_tcp < 0 or extra_interfaces < 0:
        raise ValueError("mss and snaplen must be positive; start_offset, non_tcp and extra_interfaces not negative")
    byteorder = ">" if big_endian else "<"
    tsresol = 9 if nanosecond else 6
    step_ns = max(1, _ns(step))
    t0 = _ns(ts0)
    resolution_ns = _NS // 10**tsresol

    # 1. every connection's packets, merged by time
    addresses = [((_address(c.client[0], ipv6), c.client[1]), (_address(c.server[0], ipv6), c.server[1])) for c in conns]
    per_conn: list[list[_Pkt]] = []
    base = t0
    for ci, conn in enumerate(conns):
        if interleave:
            base = t0 + ci * (step_ns // max(1, len(conns)))
        pkts = _conn_packets(ci, conn, mss=mss, base=base, step=step_ns, start_offset=start_offset)
        per_conn.append(pkts)
        if not interleave and pkts:
            base = pkts[-1].ts + step_ns
    keyed = [(p.ts, ci, k, p) for ci, pkts in enumerate(per_conn) for k, p in enumerate(pkts)]
    order = [p for _, _, _, p in sorted(keyed, key=lambda t: t[:3])]
    segments: list[Segment] = []
    for p in order:
        p.ts = _quantize(p.ts, tsresol)
        if p.segment is not None:
            p.segment.index = len(segments)
            segments.append(p.segment)
    streams: dict[tuple[int, str], bytes] = {}
    for ci, conn in enumerate(conns):
        for d in DIRECTIONS:
            streams[ci, d] = b"".join(bytes(m.data) for m in conn.msgs if m.direction == d)

    # 2. faults
    drop_l = _check_indices("drop", drop, len(segments))
    reorder_l = _check_indices("reorder", reorder, len(segments))
    dup_l = _check_indices("duplicate", duplicate, len(segments))
    conflict_l = _check_indices("overlap_conflict", overlap_conflict, len(segments))
    if start_offset:
        kept: list[_Pkt] = []
        for p in order:
            seg = p.segment
            if seg is not None and seg.end <= start_offset:
                seg.fate = "before-start"
                continue
            if seg is not None and seg.offset < start_offset:
                cut = start_offset - seg.offset
                p.payload = p.payload[cut:]
                p.seq = (p.seq + cut) % _SEQ_MOD
                seg.seq, seg.offset, seg.length = p.seq, start_offset, len(p.payload)
            kept.append(p)
        order = kept
    for i in drop_l:
        if segments[i].fate == "sent":
            segments[i].fate = "dropped"
    order = [p for p in order if p.segment is None or p.segment.fate == "sent"]
    for i in reorder_l:
        seg = segments[i]
        if seg.fate != "sent":
            raise ValueError(f"reorder: segment {i} is not in the capture ({seg.fate})")
        pos = next(k for k, p in enumerate(order) if p.segment is seg)
        nxt = next(
            (
                k
                for k in range(pos + 1, len(order))
                if order[k].kind == "data" and order[k].conn == seg.conn and order[k].direction == seg.direction
            ),
            None,
        )
        if nxt is None:
            raise ValueError(f"reorder: segment {i} has no later segment in its direction to swap with")
        a, b = order[pos], order[nxt]
        a.ts, b.ts = b.ts, a.ts
        order[pos], order[nxt] = b, a
        seg.reordered = True
        assert b.segment is not None
        b.segment.reordered = True
    for kind, idx in (("dup", dup_l), ("conflict", conflict_l)):
        for i in idx:
            seg = segments[i]
            if seg.fate != "sent":
                raise ValueError(f"{kind}: segment {i} is not in the capture ({seg.fate})")
            pos = next(k for k, p in enumerate(order) if p.segment is seg and p.kind == "data")
            while pos + 1 < len(order) and order[pos + 1].segment is seg:
                pos += 1  # after an earlier copy
            orig = order[pos]
            nxt_ts = order[pos + 1].ts if pos + 1 < len(order) else orig.ts + step_ns
            copy = _Pkt(
                kind,
                _quantize((orig.ts + nxt_ts) // 2, tsresol),
                orig.conn,
                orig.direction,
                orig.seq,
                orig.ack,
                orig.flags,
                orig.payload,
                seg,
            )
            if kind == "conflict":
                copy.payload = bytes(b ^ 0xFF for b in orig.payload)
                seg.conflict = copy.payload
            else:
                seg.duplicated = True
            order.insert(pos + 1, copy)

    # 3. bystander packets
    first = order[0].ts if order else t0
    last = order[-1].ts if order else t0
    span = max(last - first, step_ns)
    others = [
        _Pkt("udp" if n % 2 == 0 else "icmp", _quantize(first + (n + 1) * span // (non_tcp + 1), tsresol), extra_no=n)
        for n in range(non_tcp)
    ]
    ifaces: list[tuple[str, int]] = [(linktype, tsresol)]
    for j in range(extra_interfaces):
        lt, res = _EXTRA_IFACES[j % len(_EXTRA_IFACES)]
        ifaces.append((lt, res))
        for n in range(2):
            ts = first + (2 * j + n + 1) * span // (2 * extra_interfaces + 1)
            kind = "arp" if lt == "ether" and n == 0 else "udp"
            others.append(_Pkt(kind, _quantize(ts, res), iface=j + 1, extra_no=100 + 2 * j + n))
    order = _insert_by_time(order, others)

    # 4. build and write
    ip_ids: dict[tuple[int, str], int] = {}
    frames: list[PacketInfo] = []
    covered: dict[tuple[int, str], list[tuple[int, int]]] = {k: [] for k in streams}
    pcap: PcapWriter | None = None
    ng: _PcapNg | None = None
    if fmt == "pcap":
        pcap = PcapWriter(str(path), linktype=LINKTYPES[linktype], endianness=byteorder, nano=nanosecond, snaplen=snaplen)
        pcap.linktype = LINKTYPES[linktype]  # scapy ignores a falsy linktype (DLT_NULL is 0)
        pcap.write_header(None)
    else:
        ng = _PcapNg(path, byteorder)
        for j, (lt, res) in enumerate(ifaces):
            ng.interface(LINKTYPES[lt], snaplen, "cap0" if j == 0 else f"extra{j}", res)
    try:
        for number, p in enumerate(order, start=1):
            lt, res = ifaces[p.iface]
            if p.conn is not None:
                assert p.direction is not None
                key = (p.conn, p.direction)
                ip_ids[key] = ip_ids.get(key, (p.conn * 4096 + (0 if p.direction == "c2s" else 2048))) + 1
                raw = _build_tcp(p, addresses[p.conn], ip_ids[key], lt, byteorder, mss)
            else:
                raw = _build_other(p.kind, p.extra_no, lt, ipv6, byteorder)
            data = raw[:snaplen]
            seg = p.segment
            info = PacketInfo(number, p.iface, p.kind, p.conn, p.direction, p.ts, len(data), len(raw), seg.index if seg else None)
            frames.append(info)
            if seg is not None:
                seg.frames.append(number)
                got = max(0, min(len(p.payload), len(p.payload) - (len(raw) - len(data))))
                if p.kind == "data":
                    seg.captured = got
                    seg.ts_ns = p.ts
                    seg.ts = p.ts / _NS
                if p.kind != "conflict":
                    covered[seg.conn, seg.direction].append((seg.offset, seg.offset + got))
            if pcap is not None:
                frac = p.ts % _NS // resolution_ns
                pcap.write_packet(data, sec=p.ts // _NS, usec=frac, caplen=len(data), wirelen=len(raw))
            else:
                assert ng is not None
                ng.packet(p.iface, _units(p.ts, res), data, len(raw))
    finally:
        if pcap is not None:
            pcap.close()
        if ng is not None:
            ng.close()
    for seg in segments:
        if seg.fate != "sent":
            seg.ts, seg.ts_ns = 0.0, 0
    missing = {k: _subtract(len(streams[k]), covered[k]) for k in streams}
    return Written(path, fmt, linktype, LINKTYPES[linktype], len(frames), streams, missing, segments, frames, addresses, resolution_ns)


def _noop(opaque: int) -> bytes:
    """A 24-byte memcached binary DCP_NOOP request (magic 0x80, opcode 0x5c)."""
    return struct.pack(">BBHBBHIIQ", 0x80, 0x5C, 0, 0, 0, 0, 0, opaque, 0)


def _file_set(directory: str | Path) -> tuple[Path, dict[str, Path], Callable[[str, str, bytes], None]]:
    """A directory made ready, the ``{name: path}`` of what is written there, and ``put(name, filename, data)``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}

    def put(name: str, filename: str, data: bytes) -> None:
        out[name] = directory / filename
        out[name].write_bytes(data)

    return directory, out, put


def write_bad_files(directory: str | Path) -> dict[str, Path]:
    """Write files a capture reader must reject or stop reading cleanly; returns ``{name: path}``.

    * ``text``: a plain text file, no capture magic.
    * ``empty``: zero bytes.
    * ``bad_global_header``: pcap magic followed by a corrupt global header
      (version 0x4242.0x4242, snaplen 0, linktype 0xFFFFFFF0).
    * ``short_global_header``: pcap magic and 10 bytes, less than a header.
    * ``truncated_record``: a valid pcap whose last record stops half way
      through its packet data.
    * ``corrupt_record_length``: a 14-record pcap whose 8th record claims a
      caplen of 0x7FFFFFF0 (more than the snaplen and the file), with more
      records after it.
    * ``bad_pcapng_block_length``: a pcapng whose 8th packet block (of 14) has
      a total length that is not a multiple of 4 and overruns the file.
    """
    directory, out, put = _file_set(directory)
    conn = Conn(msgs=[Msg("c2s" if i % 2 else "s2c", _noop(i)) for i in range(8)])  # 14 records
    good = write_capture(directory / "good.pcap", [conn]).path.read_bytes()
    good_ng = write_capture(directory / "good.pcapng", [conn], fmt="pcapng").path.read_bytes()
    put("text", "not-a-capture.txt", b"This is not a capture file.\nJust some text, e.g. a README.\n" * 4)
    put("empty", "empty.pcap", b"")
    put("bad_global_header", "bad-global-header.pcap", good[:4] + struct.pack("<HHiIII", 0x4242, 0x4242, 0, 0, 0, 0xFFFFFFF0) + good[24:])
    put("short_global_header", "short-global-header.pcap", good[:14])
    # records: 16-byte header each; find the last one to cut it half way through its data
    offsets = []
    pos = 24
    while pos < len(good):
        offsets.append(pos)
        caplen = struct.unpack_from("<I", good, pos + 8)[0]
        pos += 16 + caplen
    last_len = struct.unpack_from("<I", good, offsets[-1] + 8)[0]
    put("truncated_record", "truncated-record.pcap", good[: offsets[-1] + 16 + last_len // 2])
    bad = bytearray(good)
    # mid-file: libwiretap sniffs the first records to tell pcap variants apart, and a
    # corrupt record among them makes tshark misread the whole file as another variant
    struct.pack_into("<I", bad, offsets[len(offsets) // 2] + 8, 0x7FFFFFF0)
    put("corrupt_record_length", "corrupt-record-length.pcap", bytes(bad))
    # pcapng blocks: type, total length, ..., total length
    blocks = []
    pos = 0
    while pos < len(good_ng):
        blocks.append(pos)
        pos += struct.unpack_from("<I", good_ng, pos + 4)[0]
    epbs = [b for b in blocks if struct.unpack_from("<I", good_ng, b)[0] == 6]
    bad_ng = bytearray(good_ng)
    struct.pack_into("<I", bad_ng, epbs[len(epbs) // 2] + 4, 0x00FFFFF3)
    put("bad_pcapng_block_length", "bad-block-length.pcapng", bytes(bad_ng))
    (directory / "good.pcap").unlink()
    (directory / "good.pcapng").unlink()
    return out


def write_hostile_headers(directory: str | Path) -> dict[str, Path]:
    """Write captures whose headers declare absurd lengths or times; returns ``{name: path}``.

    The reader must report each (a problem, or an error for the first
    header), keep every record before, and never reserve what the file does
    not hold.  Built from the 14-record captures of :func:`write_bad_files`:

    * ``pcapng_shb_4gib``: 32 bytes: a pcapng section header block claiming
      a length of 4 GiB - 4.
    * ``pcap_record_256mib``: the pcap with snaplen 0 (no limit) and a 15th
      record header claiming 256 MiB, with 16 bytes after it.
    * ``pcapng_ts_out_of_range``: the pcapng whose 8th packet has a timestamp
      past 2262 (its high word all ones).
    * ``pcapng_bad_tsresol``: the pcapng with nanosecond ``if_tsresol`` and
      one bit of it flipped (9 -> 1: 10^-1 s per tick), so every packet time
      is past 2262.
    """
    directory, out, put = _file_set(directory)
    conn = Conn(msgs=[Msg("c2s" if i % 2 else "s2c", _noop(i)) for i in range(8)])  # 14 records
    good = write_capture(directory / "good.pcap", [conn]).path.read_bytes()
    shb = struct.pack("<IIIHHq", 0x0A0D0D0A, 0xFFFFFFFC, 0x1A2B3C4D, 1, 0, -1)
    put("pcapng_shb_4gib", "shb-4gib.pcapng", shb + bytes(32 - len(shb)))
    huge = bytearray(good)
    struct.pack_into("<I", huge, 16, 0)  # snaplen 0: no limit from the header
    huge += struct.pack("<IIII", 1_700_000_100, 0, 256 << 20, 256 << 20) + bytes(16)
    put("pcap_record_256mib", "record-256mib.pcap", bytes(huge))
    good_ng = write_capture(directory / "good.pcapng", [conn], fmt="pcapng").path.read_bytes()
    epbs = []
    pos = 0
    while pos < len(good_ng):
        btype, blen = struct.unpack_from("<II", good_ng, pos)
        if btype == 6:
            epbs.append(pos)
        pos += blen
    late = bytearray(good_ng)
    struct.pack_into("<I", late, epbs[len(epbs) // 2] + 12, 0xFFFFFFFF)  # EPB: type, length, interface, ts high, ts low
    put("pcapng_ts_out_of_range", "ts-out-of-range.pcapng", bytes(late))
    ns_ng = write_capture(directory / "good.pcapng", [conn], fmt="pcapng", nanosecond=True).path.read_bytes()
    at = ns_ng.index(struct.pack("<HHB3x", 9, 1, 9))  # if_tsresol 9, padded
    put("pcapng_bad_tsresol", "bad-tsresol.pcapng", ns_ng[: at + 4] + bytes([9 ^ 0x08]) + ns_ng[at + 5 :])
    (directory / "good.pcap").unlink()
    (directory / "good.pcapng").unlink()
    return out


def pcap_records(data: bytes) -> list[tuple[int, int]]:
    """``(offset, captured length)`` of each record of a little-endian pcap file."""
    out = []
    pos = 24
    while pos + 16 <= len(data):
        caplen = struct.unpack_from("<I", data, pos + 8)[0]
        out.append((pos, caplen))
        pos += 16 + caplen
    return out


def rotate(path: Path, parts: int) -> list[str]:
    """Cut a little-endian microsecond pcap into ``parts`` files at record boundaries, as tcpdump -C does."""
    data = path.read_bytes()
    head, pos, offsets = data[:24], 24, []
    while pos < len(data):
        offsets.append(pos)
        pos += 16 + struct.unpack_from("<I", data, pos + 8)[0]
    cuts = [offsets[len(offsets) * i // parts] for i in range(parts)] + [len(data)]
    out = []
    for i in range(parts):
        q = path.with_name(f"{path.stem}.{i}.pcap")
        q.write_bytes((head if i else b"") + data[cuts[i] if i else 0 : cuts[i + 1]])
        out.append(str(q))
    return out
