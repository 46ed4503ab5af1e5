"""Link, IP and TCP headers -> :class:`~dcpinspect.flows.reassembly.Segment` (pure, struct only).

Link types: Ethernet (802.1Q/802.1ad VLAN tags, stacked), Linux cooked SLL
and SLL2, raw IPv4/IPv6, BSD null and OpenBSD loop.  IPv4 (fragments are
counted and skipped) and IPv6 (extension headers walked).  TCP only: anything
else is counted by kind and skipped.  The TCP payload is bounded by the IP
length (Ethernet padding is not payload); bytes the capture cut (snaplen)
become ``Segment.missing``.
"""

from __future__ import annotations

import socket
import struct
from collections import Counter

from ..flows.reassembly import Segment

__all__ = ["ETH_VLAN", "LINKTYPES", "locate_segment", "parse_packet"]

#: supported link types (pcap LINKTYPE_ values)
LINKTYPES = {
    0: "BSD null",
    1: "Ethernet",
    12: "raw IP",
    14: "raw IP",
    101: "raw IP",
    108: "OpenBSD loop",
    113: "Linux cooked (SLL)",
    228: "raw IPv4",
    229: "raw IPv6",
    276: "Linux cooked v2 (SLL2)",
}
ETH_VLAN = frozenset((0x8100, 0x88A8, 0x9100))
_U16 = struct.Struct(">H")
_TCP = struct.Struct(">HHIIBB")
_V6_EXT = frozenset((0, 43, 60, 51))  # hop-by-hop, routing, destination options, AH (length differs)


def _network(linktype: int, data: bytes) -> tuple[int, int] | str:
    """(ether type 0x0800/0x86DD, offset of the IP header) or why the packet is skipped."""
    if linktype == 1:
        if len(data) < 14:
            return "short Ethernet header"
        etype = _U16.unpack_from(data, 12)[0]
        off = 14
        while etype in ETH_VLAN:
            if len(data) < off + 4:
                return "short VLAN tag"
            etype = _U16.unpack_from(data, off + 2)[0]
            off += 4
        return etype, off
    if linktype == 113:
        return (_U16.unpack_from(data, 14)[0], 16) if len(data) >= 16 else "short SLL header"
    if linktype == 276:
        return (_U16.unpack_from(data, 0)[0], 20) if len(data) >= 20 else "short SLL2 header"
    if linktype in (12, 14, 101, 228, 229):
        if not data:
            return "empty packet"
        version = data[0] >> 4
        return (0x0800 if version == 4 else 0x86DD if version == 6 else 0), 0
    if linktype in (0, 108):
        if len(data) < 4:
            return "short loopback header"
        family = int.from_bytes(data[:4], "big" if linktype == 108 else "little")
        if family > 0xFFFF:  # null headers are host byte order: try the other one
            family = int.from_bytes(data[:4], "big")
        return (0x0800 if family == 2 else 0x86DD if family in (10, 24, 28, 30) else 0), 4
    return f"link type {linktype}"


def parse_packet(
    linktype: int, data: bytes, wirelen: int, ts: int, packet: int, file: str, skipped: Counter[str], pos: int = 0
) -> Segment | None:
    """One captured packet -> a TCP segment, or ``None`` (the reason counted in ``skipped``); ``pos`` as :attr:`Segment.pos`."""
    found = locate_segment(linktype, data, wirelen, ts, packet, file, skipped, pos)
    return None if found is None else found[0]


def locate_segment(
    linktype: int, data: bytes, wirelen: int, ts: int, packet: int, file: str, skipped: Counter[str], pos: int = 0
) -> tuple[Segment, int, int] | None:
    """:func:`parse_packet`, with where the TCP header and its payload start in ``data``.

    Returns ``(segment, tcp_offset, payload_offset)``: ``segment.payload`` is
    ``data[payload_offset : payload_offset + len(segment.payload)]``.
    """
    net = _network(linktype, data)
    if isinstance(net, str):
        skipped[net] += 1
        return None
    etype, off = net
    cut = wirelen - len(data)  # bytes the capture did not keep
    if etype == 0x0800:
        if len(data) < off + 20:
            skipped["short IPv4 header"] += 1
            return None
        ihl = (data[off] & 0x0F) * 4
        total = _U16.unpack_from(data, off + 2)[0]
        frag = _U16.unpack_from(data, off + 6)[0]
        proto = data[off + 9]
        if proto != 6:
            skipped["not TCP"] += 1
            return None
        if frag & 0x3FFF:
            skipped["IPv4 fragment"] += 1
            return None
        src = socket.inet_ntop(socket.AF_INET, data[off + 12 : off + 16])
        dst = socket.inet_ntop(socket.AF_INET, data[off + 16 : off + 20])
        ip_end = off + total if total else len(data) + cut
        tcp = off + ihl
    elif etype == 0x86DD:
        if len(data) < off + 40:
            skipped["short IPv6 header"] += 1
            return None
        plen = _U16.unpack_from(data, off + 4)[0]
        nxt = data[off + 6]
        src = socket.inet_ntop(socket.AF_INET6, data[off + 8 : off + 24])
        dst = socket.inet_ntop(socket.AF_INET6, data[off + 24 : off + 40])
        ip_end = off + 40 + plen if plen else len(data) + cut
        tcp = off + 40
        while nxt in _V6_EXT or nxt == 44:
            if len(data) < tcp + 8:
                skipped["short IPv6 extension header"] += 1
                return None
            if nxt == 44:
                skipped["IPv6 fragment"] += 1
                return None
            step = (data[tcp + 1] + 2) * 4 if nxt == 51 else (data[tcp + 1] + 1) * 8
            nxt = data[tcp]
            tcp += step
        if nxt != 6:
            skipped["not TCP"] += 1
            return None
    else:
        skipped["not IP"] += 1
        return None
    if len(data) < tcp + 20:
        skipped["short TCP header"] += 1
        return None
    sport, dport, seq, _ack, doff, flags = _TCP.unpack_from(data, tcp)
    start = tcp + (doff >> 4) * 4
    if start > ip_end:
        skipped["bad TCP header length"] += 1
        return None
    have_end = min(ip_end, len(data))
    payload = data[start:have_end] if start < have_end else b""
    missing = max(0, ip_end - max(have_end, start))
    return Segment(ts, src, sport, dst, dport, seq, flags, payload, missing, packet, file, pos), tcp, start
