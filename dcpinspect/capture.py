"""Reading pcap and pcapng files (the I/O edge), record by record, bounded memory.

Why not scapy's raw readers: ``RawPcapReader`` cuts every packet to 1,500
bytes by default and reads at most 6,000 bytes of a record (loopback
captures carry 64 KiB segments), and it returns a truncated last record as if
it were whole.  This reader walks the records itself with ``struct``, keeps
every byte, and reports a truncated or corrupt record as a problem with its
byte offset after yielding everything before it.  scapy stays the writer of
test captures.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, NamedTuple

__all__ = ["CaptureError", "CaptureReader", "RawPacket"]

MAX_RECORD = 256 * 1024 * 1024  # a record claiming more is corrupt
_PCAP_MAGICS = {
    b"\xd4\xc3\xb2\xa1": ("<", 1_000),  # little-endian, microseconds (ns factor)
    b"\xa1\xb2\xc3\xd4": (">", 1_000),
    b"\x4d\x3c\xb2\xa1": ("<", 1),  # nanoseconds
    b"\xa1\xb2\x3c\x4d": (">", 1),
}
_PCAPNG_SHB = b"\x0a\x0d\x0d\x0a"


class CaptureError(Exception):
    """The file is not a capture, or its header is corrupt (nothing could be read)."""

    def __init__(self, path: str, offset: int, message: str) -> None:
        super().__init__(f"{path}: {message} (at byte offset {offset})")
        self.path = path
        self.offset = offset
        self.message = message


class RawPacket(NamedTuple):
    """One captured packet: link type, captured bytes, original length, time in ns, 1-based number."""

    linktype: int
    data: bytes
    wirelen: int
    ts: int
    number: int
    offset: int


@dataclass
class _Iface:
    linktype: int
    snaplen: int
    ns_mul: int = 1_000  # ns = ticks * ns_mul // ns_div (integers: no float rounding); default 10^-6 s
    ns_div: int = 1


@dataclass
class CaptureReader:
    """Iterate the packets of a pcap or pcapng file.

    ``problems`` collects ``(offset, message)`` for a truncated last record or
    a corrupt record (reading stops there, after yielding everything before).
    A file that is not a capture, or whose header is corrupt, raises
    :class:`CaptureError` naming the file and byte offset.
    """

    path: str
    format: str = ""
    problems: list[tuple[int, str]] = field(default_factory=list)
    packets: int = 0
    linktypes: set[int] = field(default_factory=set)
    size: int = 0

    def __iter__(self) -> Iterator[RawPacket]:
        p = Path(self.path)
        try:
            fh = p.open("rb")
        except OSError as exc:
            raise CaptureError(self.path, 0, f"cannot open: {exc.strerror}") from exc
        with fh:
            self.size = p.stat().st_size
            head = fh.read(4)
            if head in _PCAP_MAGICS:
                self.format = "pcap"
                yield from self._pcap(fh, head)
            elif head == _PCAPNG_SHB:
                self.format = "pcapng"
                fh.seek(0)
                yield from self._pcapng(fh)
            elif not head:
                raise CaptureError(self.path, 0, "empty file: not a pcap or pcapng capture")
            else:
                raise CaptureError(self.path, 0, f"not a pcap or pcapng capture (starts with {head.hex()})")

    def _problem(self, offset: int, message: str) -> None:
        self.problems.append((offset, message))

    def _pcap(self, fh: BinaryIO, magic: bytes) -> Iterator[RawPacket]:
        endian, ns = _PCAP_MAGICS[magic]
        hdr = fh.read(20)
        if len(hdr) < 20:
            raise CaptureError(self.path, 4, "pcap global header truncated")
        vmaj, _vmin, _tz, _sig, snaplen, linktype = struct.unpack(endian + "HHiIII", hdr)
        if vmaj != 2:
            raise CaptureError(self.path, 4, f"pcap global header corrupt (version {vmaj})")
        linktype &= 0x0FFFFFFF  # the top bits may carry FCS information
        self.linktypes.add(linktype)
        rec = struct.Struct(endian + "IIII")
        offset = 24
        limit = max(snaplen, 262_144) if 0 < snaplen <= MAX_RECORD else MAX_RECORD
        while True:
            h = fh.read(16)
            if not h:
                return
            if len(h) < 16:
                self._problem(offset, f"truncated record header ({len(h)} of 16 bytes): the capture was cut short")
                return
            sec, frac, caplen, wirelen = rec.unpack(h)
            if caplen > limit or (wirelen and caplen > wirelen and caplen > snaplen):
                self._problem(offset, f"corrupt record: captured length {caplen} (snaplen {snaplen}, original {wirelen}); reading stopped")
                return
            data = fh.read(caplen)
            if len(data) < caplen:
                self._problem(offset, f"truncated record: {len(data)} of {caplen} bytes: the capture was cut short")
                return
            self.packets += 1
            yield RawPacket(linktype, data, max(wirelen, caplen), sec * 1_000_000_000 + frac * ns, self.packets, offset)
            offset += 16 + caplen

    def _pcapng(self, fh: BinaryIO) -> Iterator[RawPacket]:
        endian = "<"
        ifaces: list[_Iface] = []
        offset = 0
        first = True
        while True:
            h = fh.read(8)
            if not h:
                return
            if len(h) < 8:
                self._problem(offset, f"truncated block header ({len(h)} of 8 bytes): the capture was cut short")
                return
            if h[:4] == _PCAPNG_SHB:
                bom = fh.read(4)
                if bom == b"\x4d\x3c\x2b\x1a":
                    endian = "<"
                elif bom == b"\x1a\x2b\x3c\x4d":
                    endian = ">"
                else:
                    if first:
                        raise CaptureError(self.path, offset + 8, "pcapng section header corrupt (byte-order magic)")
                    self._problem(offset, "corrupt section header block; reading stopped")
                    return
                btype, blen = struct.unpack(endian + "II", h)
                body = bom + fh.read(max(0, blen - 16))
                ifaces = []
            else:
                btype, blen = struct.unpack(endian + "II", h)
                body = b""
            if blen < 12 or blen % 4 or blen > MAX_RECORD:
                if first:
                    raise CaptureError(self.path, offset, f"pcapng section header corrupt (block length {blen})")
                self._problem(offset, f"corrupt block: length {blen}; reading stopped")
                return
            if btype != 0x0A0D0D0A:
                body = fh.read(blen - 12)
            trailer = fh.read(4)
            if len(body) < blen - 12 or len(trailer) < 4:
                self._problem(offset, f"truncated block ({8 + len(body) + len(trailer)} of {blen} bytes): the capture was cut short")
                return
            if struct.unpack(endian + "I", trailer)[0] != blen:
                self._problem(offset, "corrupt block: trailing length differs; reading stopped")
                return
            first = False
            if btype == 1 and len(body) >= 8:  # interface description
                linktype, _res, snaplen = struct.unpack(endian + "HHI", body[:8])
                iface = _Iface(linktype, snaplen)
                self._iface_options(iface, body[8:], endian)
                ifaces.append(iface)
                self.linktypes.add(linktype)
            elif btype in (6, 2) and len(body) >= 20:  # enhanced (and obsolete) packet block
                if btype == 6:
                    iid, tsh, tsl, caplen, wirelen = struct.unpack(endian + "IIIII", body[:20])
                else:
                    iid, _drops, tsh, tsl, caplen, wirelen = struct.unpack(endian + "HHIIII", body[:20])
                if iid >= len(ifaces) or caplen > len(body) - 20:
                    self._problem(offset, f"corrupt packet block (interface {iid}, captured length {caplen}); reading stopped")
                    return
                iface = ifaces[iid]
                self.packets += 1
                yield RawPacket(
                    iface.linktype,
                    body[20 : 20 + caplen],
                    max(wirelen, caplen),
                    ((tsh << 32) | tsl) * iface.ns_mul // iface.ns_div,
                    self.packets,
                    offset,
                )
            elif btype == 3 and len(body) >= 4 and ifaces:  # simple packet block
                (wirelen,) = struct.unpack(endian + "I", body[:4])
                caplen = min(wirelen, len(body) - 4, ifaces[0].snaplen or wirelen)
                self.packets += 1
                yield RawPacket(ifaces[0].linktype, body[4 : 4 + caplen], wirelen, 0, self.packets, offset)
            offset += blen

    @staticmethod
    def _iface_options(iface: _Iface, opts: bytes, endian: str) -> None:
        pos = 0
        while pos + 4 <= len(opts):
            code, length = struct.unpack(endian + "HH", opts[pos : pos + 4])
            if code == 0:
                return
            value = opts[pos + 4 : pos + 4 + length]
            if code == 9 and length >= 1:  # if_tsresol
                r = value[0]
                if r & 0x80:  # 2^-n seconds per tick
                    iface.ns_mul, iface.ns_div = 1_000_000_000, 1 << (r & 0x7F)
                elif (r & 0x7F) <= 9:  # 10^-n
                    iface.ns_mul, iface.ns_div = 10 ** (9 - r), 1
                else:
                    iface.ns_mul, iface.ns_div = 1, 10 ** ((r & 0x7F) - 9)
            pos += 4 + length + (-length % 4)
