"""Reading pcap and pcapng files (the I/O edge), record by record, bounded memory.

Why not scapy's raw readers: ``RawPcapReader`` cuts every packet to 1,500
bytes by default and reads at most 6,000 bytes of a record (loopback
captures carry 64 KiB segments), and it returns a truncated last record as if
it were whole.  This reader walks the records itself with ``struct``, keeps
every byte, and reports a truncated or corrupt record as a problem with its
byte offset after yielding everything before it.  scapy stays the writer of
test captures.

Hostile files: every declared length (pcap record, any pcapng block) is
checked against :data:`MAX_RECORD` and against what is left of the file
*before* anything is read, and large reads go in pieces, so a few corrupt
bytes never make the reader reserve more memory than the file holds.  A
packet time that no ``timestamp[ns]`` column can hold (after 2262-04-11, e.g.
a flipped bit in a pcapng timestamp or ``if_tsresol``) becomes
:data:`TS_UNKNOWN` - a null ``ts`` in every table - and one problem per file
counts such packets.

Many readers of one big file (Spark's tasks): :func:`split_ranges` walks the
record headers only and cuts the file at record boundaries into
:class:`CaptureRange` pieces, each with the header bytes that make it a
capture of its own; :func:`read_range` reads one piece with the same record
loop, numbering its packets and placing every offset as the whole-file reader
would.

Gzip'ed captures (``.pcap.gz``, ``.pcapng.gz``; found by the magic bytes
``1f 8b``, never the name) are read as tshark reads them: decompressed as a
stream (:class:`Gunzip`: bounded buffers, concatenated members joined), every
offset then a position in the decompressed capture.  A corrupt or cut gzip
stream ends the file with a problem, keeping every packet before it.  A
gzip'ed file cannot be cut into ranges: :func:`split_ranges` gives it as one
range, which :func:`read_range` decompresses whole.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, Protocol

from ..flows.reassembly import TS_MAX, TS_UNKNOWN  # the latest time a table holds; the time of a packet past it

__all__ = [
    "EPB",
    "GZIP_MAGIC",
    "IDB",
    "IF_TSRESOL",
    "MAX_RECORD",
    "OPB",
    "PCAPNG_BOM",
    "PCAPNG_SHB",
    "PCAP_MAGICS",
    "SHB",
    "SHB_MIN",
    "SPB",
    "TS_MAX",
    "TS_UNKNOWN",
    "CaptureError",
    "CaptureRange",
    "CaptureReader",
    "Gunzip",
    "RawPacket",
    "Seekable",
    "gunzip_all",
    "is_gzip",
    "read_range",
    "split_ranges",
    "time_problem",
    "ts_scale",
]

MAX_RECORD = 256 * 1024 * 1024  # a record claiming more is corrupt
_PIECE = 1 << 20  # reads longer than this go in pieces of at least this size (see ``_read``)
PCAP_MAGICS = {
    b"\xd4\xc3\xb2\xa1": ("<", 1_000),  # little-endian, microseconds (ns factor)
    b"\xa1\xb2\xc3\xd4": (">", 1_000),
    b"\x4d\x3c\xb2\xa1": ("<", 1),  # nanoseconds
    b"\xa1\xb2\x3c\x4d": (">", 1),
}
PCAPNG_SHB = b"\x0a\x0d\x0d\x0a"
PCAPNG_BOM = {b"\x4d\x3c\x2b\x1a": "<", b"\x1a\x2b\x3c\x4d": ">"}  # pcapng byte-order magic, as read
# pcapng block types
IDB = 1  # interface description
OPB = 2  # packet (obsolete)
SPB = 3  # simple packet
EPB = 6  # enhanced packet
SHB = 0x0A0D0D0A  # section header
SHB_MIN = 28  # type, length, byte-order magic, version, section length, trailing length
IF_TSRESOL = 9  # interface option: timestamp resolution


GZIP_MAGIC = b"\x1f\x8b"  # the first two bytes of a gzip member (RFC 1952)
_RAW = 1 << 16  # compressed bytes read at a time
_OUT = 1 << 20  # decompressed bytes made at a time


def is_gzip(head: bytes) -> bool:
    """Whether a file starting with ``head`` is gzip'ed (its magic bytes, never its name)."""
    return head[:2] == GZIP_MAGIC


def gunzip_all(raw: _Readable) -> bytes:
    """All the decompressed bytes of a gzip'ed file open as ``raw`` (up to a fault), for readers that need offsets into them."""
    g = Gunzip(raw)
    parts = []
    try:
        while chunk := g.read(_OUT):
            parts.append(chunk)
    except GzipDataError:
        pass
    return b"".join(parts)


class CaptureError(Exception):
    """The file is not a capture, or its header is corrupt (nothing could be read).

    The text names the file once, then what is wrong, then where - unless
    ``offset`` is None: the system refused the file (it cannot be opened or
    read), and no byte of it is to blame.
    """

    def __init__(self, path: str, offset: int | None, message: str) -> None:
        super().__init__(f"{path}: {message}" + ("" if offset is None else f" (at byte offset {offset})"))
        self.path = path
        self.offset = offset
        self.message = message


class GzipDataError(OSError):
    """The gzip stream is corrupt (raised while reading: what was read before it is kept)."""


class Gunzip:
    """A gzip'ed file read as its decompressed bytes, in bounded pieces (``read``, ``tell``).

    Members written one after another are one stream (as ``gzip -c a b``
    and tshark read them); zero bytes after the last member are padding.
    ``cut`` says the compressed data ended inside a member (the file was cut
    short), ``trailing`` how many bytes after the last member were not gzip
    and were ignored.  Corrupt data raises :class:`GzipDataError` (an
    :class:`OSError`: the readers keep what came before it).
    """

    def __init__(self, raw: _Readable) -> None:
        self.raw = raw
        self._d = zlib.decompressobj(31)
        self._buf = bytearray()
        self._pos = 0  # decompressed bytes handed out
        self._done = False
        self._error: GzipDataError | None = None
        self.cut = False
        self.trailing = 0

    def _more(self) -> bool:
        """Decompress some more into the buffer; False at the end of the data."""
        if self._done:
            if self._error is not None:  # raised once the bytes before it are read
                exc, self._error = self._error, None
                raise exc
            return False
        d = self._d
        if d.eof:
            rest = d.unused_data.lstrip(b"\0")
            while not rest:
                chunk = self.raw.read(_RAW)
                if not chunk:
                    self._done = True
                    return False
                rest = chunk.lstrip(b"\0")
            if not is_gzip(rest):
                self.trailing = len(rest)
                while chunk := self.raw.read(_RAW):  # counted, never kept
                    self.trailing += len(chunk)
                self._done = True
                return False
            self._d = d = zlib.decompressobj(31)
            data = rest
        else:
            data = d.unconsumed_tail or self.raw.read(_RAW)
            if not data:  # the file ends inside a member
                self.cut = True
                self._done = True
                return False
        saved = d.copy()
        try:
            self._buf += d.decompress(data, _OUT)
        except zlib.error as exc:
            self._done = True
            self._salvage(saved, data)
            self._error = GzipDataError(f"gzip data corrupt after {self._pos + len(self._buf)} decompressed bytes ({exc})")
        return True

    def _salvage(self, d: Any, data: bytes) -> None:
        """The bytes a corrupt piece still gives before its error: it is fed again, a little at a time."""
        try:
            for at in range(0, len(data), 256):
                self._buf += d.decompress(data[at : at + 256], _OUT)
        except zlib.error:
            pass

    def read(self, n: int, /) -> bytes:
        """Up to ``n`` decompressed bytes (fewer at the end)."""
        while len(self._buf) < n and self._more():
            pass
        out = bytes(self._buf[:n])
        del self._buf[:n]
        self._pos += len(out)
        return out

    def tell(self) -> int:
        """Decompressed bytes read so far."""
        return self._pos


class RawPacket(NamedTuple):
    """One captured packet: link type, captured bytes, original length, time in ns (:data:`TS_UNKNOWN` if out of range), 1-based number.

    ``offset`` is where its record (pcap) or block (pcapng) starts in the file,
    ``data_offset`` where its captured bytes do.
    """

    linktype: int
    data: bytes
    wirelen: int
    ts: int
    number: int
    offset: int
    data_offset: int


def time_problem(count: int) -> str:
    """The problem reported for ``count`` packets whose timestamp is out of range (one per file, at the first)."""
    if count == 1:
        return "timestamp out of range (after 2262-04-11): the packet's time is unknown (null ts)"
    return f"timestamp out of range (after 2262-04-11) in {count} packets from here on: their times are unknown (null ts)"


class _Readable(Protocol):
    def read(self, n: int, /) -> bytes: ...  # pragma: no cover - a protocol


@dataclass
class _Iface:
    linktype: int
    snaplen: int
    ns_mul: int = 1_000  # ns = ticks * ns_mul // ns_div (integers: no float rounding); default 10^-6 s
    ns_div: int = 1


@dataclass
class CaptureReader:
    """Iterate the packets of a pcap or pcapng file.

    ``problems`` collects ``(offset, message)`` for a truncated last record, a
    corrupt record or a read error (reading stops there, after yielding
    everything before), and - once per file, counting them - for packets
    whose timestamp is out of range (yielded with ``ts`` :data:`TS_UNKNOWN`;
    reading goes on).  A file that is not a capture, or whose header is
    corrupt, raises :class:`CaptureError` naming the file and byte offset.
    """

    path: str
    format: str = ""
    problems: list[tuple[int, str]] = field(default_factory=list)
    packets: int = 0
    linktypes: set[int] = field(default_factory=set)
    size: int = 0  # bytes in the file when it was opened (0: not known, e.g. a pipe or gzip'ed data)
    compression: str = ""  # "gzip" for a gzip'ed capture
    bad_times: int = 0  # packets whose timestamp is out of range
    _time_problem: int = field(default=-1, repr=False)  # its index in ``problems``
    _base: int = field(default=0, repr=False)  # the file offset of the stream's first byte (see :func:`read_range`)

    def __iter__(self) -> Iterator[RawPacket]:
        p = Path(self.path)
        try:
            fh = p.open("rb")
        except OSError as exc:
            raise CaptureError(self.path, None, f"cannot open: {exc.strerror or exc}") from exc
        with fh:
            src: BinaryIO | Gunzip = fh
            try:
                self.size = os.fstat(fh.fileno()).st_size
                head = fh.read(4)
                if is_gzip(head):
                    self.compression, self.size = "gzip", 0  # the decompressed size is not known
                    fh.seek(0)
                    src = Gunzip(fh)
                    head = src.read(4)
                if head in PCAP_MAGICS:
                    self.format = "pcap"
                    yield from self._pcap(src, head)
                elif head == PCAPNG_SHB:
                    self.format = "pcapng"
                    fh.seek(0)
                    src = Gunzip(fh) if self.compression else fh
                    yield from self._pcapng(src)
                else:
                    raise CaptureError(self.path, 0, self._not_capture(head))
            except GzipDataError as exc:
                if not self.format:
                    raise CaptureError(self.path, 0, str(exc)) from exc
                self._problem(self._tell(src), f"{exc}; reading stopped")
            except OSError as exc:  # the disk, not the data: what was read is kept
                if not self.format:
                    raise CaptureError(self.path, None, f"cannot read: {exc.strerror or exc}") from exc
                self._problem(self._tell(src), f"read error ({exc.strerror or exc}); reading stopped")
            if isinstance(src, Gunzip):
                self._gzip_end(src)

    def _not_capture(self, head: bytes) -> str:
        if self.compression:
            return f"gzip'ed, but not a pcap or pcapng capture (starts with {head.hex()})" if head else "empty gzip'ed data: not a capture"
        return f"not a pcap or pcapng capture (starts with {head.hex()})" if head else "empty file: not a pcap or pcapng capture"

    def _gzip_end(self, src: Gunzip) -> None:
        """The problems of a gzip stream that was cut short, or followed by bytes that are not gzip."""
        if src.cut:
            self._problem(src.tell(), "gzip data cut short (no end of stream): the capture was cut short")
        if src.trailing:
            self._problem(src.tell(), f"{src.trailing} bytes after the gzip data are not gzip: ignored")

    @staticmethod
    def _tell(fh: BinaryIO | Gunzip) -> int:
        try:
            return fh.tell()
        except OSError:
            return 0

    def _problem(self, offset: int, message: str) -> None:
        self.problems.append((offset, message))

    def _left(self, offset: int, need: int) -> int | None:
        """Bytes the file holds from ``offset`` if fewer than ``need`` (else, or when the size is not known, None)."""
        if self.size and offset + need > self.size:
            return max(0, self.size - offset)
        return None

    @staticmethod
    def _read(fh: _Readable, n: int) -> bytes:
        """Up to ``n`` bytes (fewer at the end of the file).

        Long reads go in pieces, so a corrupt length in a file whose size is
        not known (a pipe) never reserves more memory than the file holds.
        """
        if n <= _PIECE:
            return fh.read(n)
        parts = []
        step = _PIECE + n % _PIECE
        while n:
            got = fh.read(step)
            parts.append(got)
            n -= len(got)
            if len(got) < step:
                break
            step = _PIECE
        return b"".join(parts)

    def _bad_time(self, offset: int) -> int:
        """A packet time out of range: counted in one problem per file; the packet's time is unknown."""
        self.bad_times += 1
        if self._time_problem < 0:
            self._time_problem = len(self.problems)
            self.problems.append((offset, time_problem(1)))
        else:
            self.problems[self._time_problem] = (self.problems[self._time_problem][0], time_problem(self.bad_times))
        return TS_UNKNOWN

    def _pcap(self, fh: _Readable, magic: bytes) -> Iterator[RawPacket]:
        endian, ns = PCAP_MAGICS[magic]
        hdr = fh.read(20)
        if len(hdr) < 20:
            raise CaptureError(self.path, 4, "pcap global header truncated")
        vmaj, _vmin, _tz, _sig, snaplen, linktype = struct.unpack(endian + "HHiIII", hdr)
        if vmaj != 2:
            raise CaptureError(self.path, 4, f"pcap global header corrupt (version {vmaj})")
        linktype &= 0x0FFFFFFF  # the top bits may carry FCS information
        self.linktypes.add(linktype)
        rec = struct.Struct(endian + "IIII")
        offset = self._base + 24
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
            left = self._left(offset + 16, caplen)
            if left is not None:
                self._problem(offset, f"truncated record: {left} of {caplen} bytes: the capture was cut short")
                return
            data = self._read(fh, caplen)
            if len(data) < caplen:
                self._problem(offset, f"truncated record: {len(data)} of {caplen} bytes: the capture was cut short")
                return
            self.packets += 1
            # at most (2^32 - 1) s + (2^32 - 1) us: before 2107, always in range
            yield RawPacket(linktype, data, max(wirelen, caplen), sec * 1_000_000_000 + frac * ns, self.packets, offset, offset + 16)
            offset += 16 + caplen

    def _pcapng(self, fh: _Readable) -> Iterator[RawPacket]:
        endian = "<"
        ifaces: list[_Iface] = []
        offset = self._base
        first = True
        while True:
            h = fh.read(8)
            if not h:
                return
            if len(h) < 8:
                self._problem(offset, f"truncated block header ({len(h)} of 8 bytes): the capture was cut short")
                return
            head = b""
            if h[:4] == PCAPNG_SHB:
                head = fh.read(4)
                if head in PCAPNG_BOM:
                    endian = PCAPNG_BOM[head]
                else:
                    if first:
                        raise CaptureError(self.path, offset + 8, "pcapng section header corrupt (byte-order magic)")
                    self._problem(offset, "corrupt section header block; reading stopped")
                    return
                ifaces = []
            btype, blen = struct.unpack(endian + "II", h)
            # every length is checked before anything is read
            if blen < (SHB_MIN if head else 12) or blen % 4 or blen > MAX_RECORD:
                if first:
                    raise CaptureError(self.path, offset, f"pcapng section header corrupt (block length {blen})")
                self._problem(offset, f"corrupt block: length {blen}; reading stopped")
                return
            left = self._left(offset, blen)
            if left is not None:
                self._problem(offset, f"truncated block ({left} of {blen} bytes): the capture was cut short")
                return
            body = head + self._read(fh, blen - 12 - len(head))
            trailer = fh.read(4)
            if len(body) < blen - 12 or len(trailer) < 4:
                self._problem(offset, f"truncated block ({8 + len(body) + len(trailer)} of {blen} bytes): the capture was cut short")
                return
            if struct.unpack(endian + "I", trailer)[0] != blen:
                self._problem(offset, "corrupt block: trailing length differs; reading stopped")
                return
            first = False
            if btype == IDB and len(body) >= 8:
                linktype, _res, snaplen = struct.unpack(endian + "HHI", body[:8])
                iface = _Iface(linktype, snaplen)
                self._iface_options(iface, body[8:], endian)
                ifaces.append(iface)
                self.linktypes.add(linktype)
            elif btype in (EPB, OPB) and len(body) >= 20:
                if btype == EPB:
                    iid, tsh, tsl, caplen, wirelen = struct.unpack(endian + "IIIII", body[:20])
                else:
                    iid, _drops, tsh, tsl, caplen, wirelen = struct.unpack(endian + "HHIIII", body[:20])
                if iid >= len(ifaces) or caplen > len(body) - 20:
                    self._problem(offset, f"corrupt packet block (interface {iid}, captured length {caplen}); reading stopped")
                    return
                iface = ifaces[iid]
                ts = ((tsh << 32) | tsl) * iface.ns_mul // iface.ns_div
                self.packets += 1
                yield RawPacket(
                    iface.linktype,
                    body[20 : 20 + caplen],
                    max(wirelen, caplen),
                    ts if ts <= TS_MAX else self._bad_time(offset),
                    self.packets,
                    offset,
                    offset + 28,
                )
            elif btype == SPB and len(body) >= 4 and ifaces:
                (wirelen,) = struct.unpack(endian + "I", body[:4])
                caplen = min(wirelen, len(body) - 4, ifaces[0].snaplen or wirelen)
                self.packets += 1
                yield RawPacket(ifaces[0].linktype, body[4 : 4 + caplen], wirelen, 0, self.packets, offset, offset + 12)
            offset += blen

    @staticmethod
    def _iface_options(iface: _Iface, opts: bytes, endian: str) -> None:
        iface.ns_mul, iface.ns_div = ts_scale(opts, endian)


def ts_scale(opts: bytes, endian: str) -> tuple[int, int]:
    """An interface's ``if_tsresol`` as (mul, div): ns = ticks * mul // div (any 7-bit exponent of 10 or 2 is exact; default 10^-6 s)."""
    mul, div = 1_000, 1
    pos = 0
    while pos + 4 <= len(opts):
        code, length = struct.unpack(endian + "HH", opts[pos : pos + 4])
        if code == 0:
            break
        value = opts[pos + 4 : pos + 4 + length]
        if code == IF_TSRESOL and length >= 1:
            r = value[0]
            if r & 0x80:  # 2^-n seconds per tick
                mul, div = 1_000_000_000, 1 << (r & 0x7F)
            elif r <= 9:  # 10^-n
                mul, div = 10 ** (9 - r), 1
            else:
                mul, div = 1, 10 ** (r - 9)
        pos += 4 + length + (-length % 4)
    return mul, div


# --------------------------------------------------------------------------- byte ranges (many readers of one big file)


class Seekable(Protocol):
    """A binary file that can seek: a Python file, or a ``pyarrow`` input file."""

    def seek(self, offset: int, whence: int = 0, /) -> int:
        """Move to ``offset`` (from the start, or the end with ``whence`` 2); the new position."""
        ...  # pragma: no cover - a protocol

    def read(self, n: int, /) -> bytes:
        """Up to ``n`` bytes."""
        ...  # pragma: no cover - a protocol


class CaptureRange(NamedTuple):
    """Bytes ``[start, end)`` of a capture, cut at record boundaries, read as a capture of its own.

    ``prefix`` is the header that makes it one (the pcap global header; the
    pcapng section header and interface blocks in force), ``first_packet`` the
    number of its first packet in the whole file.
    """

    start: int
    end: int
    first_packet: int
    prefix: bytes


class _Blocks:
    """Random reads through a bounded buffer (headers are walked, payloads skipped)."""

    def __init__(self, f: Seekable, block: int = 1 << 20) -> None:
        self.f, self.block = f, block
        self.lo, self.buf = 0, b""

    def get(self, pos: int, n: int) -> bytes:
        if not (self.lo <= pos and pos + n <= self.lo + len(self.buf)):
            self.f.seek(pos)
            self.lo, self.buf = pos, self.f.read(max(n, self.block))
        return self.buf[pos - self.lo : pos - self.lo + n]


def split_ranges(source: str | os.PathLike[str] | Seekable, split_size: int) -> list[CaptureRange]:
    """The ranges of one file (a path, or a seekable binary file open on it), each of about ``split_size`` bytes.

    Rules: the walk reads record headers (pcap) or block headers (pcapng)
    only; it stops at the first record that looks wrong, so the last range
    runs to the end of the file and the reader of that range reports the
    problem exactly as :class:`CaptureReader` would; a file that is not a
    readable capture is one range from byte 0, and a file that cannot be opened
    one empty range (its reader then says why).
    """
    if isinstance(source, (str, os.PathLike)):
        try:
            f: BinaryIO = Path(source).open("rb")  # noqa: SIM115 - closed just below
        except OSError:
            return [CaptureRange(0, 0, 1, b"")]
        with f:
            return split_ranges(f, split_size)
    size = source.seek(0, 2)
    whole = [CaptureRange(0, size, 1, b"")]
    b = _Blocks(source)
    head = b.get(0, 4)
    if head in PCAP_MAGICS:
        return _split_pcap(b, size, head, split_size) or whole
    if head == PCAPNG_SHB:
        return _split_pcapng(b, size, split_size) or whole
    return whole


def _split_pcap(b: _Blocks, size: int, magic: bytes, split_size: int) -> list[CaptureRange]:
    endian, _ns = PCAP_MAGICS[magic]
    hdr = b.get(0, 24)
    if len(hdr) < 24:
        return []
    vmaj, _vmin, _tz, _sig, snaplen, _lt = struct.unpack(endian + "HHiIII", hdr[4:])
    if vmaj != 2:
        return []
    limit = max(snaplen, 262_144) if 0 < snaplen <= MAX_RECORD else MAX_RECORD  # as the reader checks
    rec = struct.Struct(endian + "IIII")
    out: list[CaptureRange] = []
    start, first, pos, number = 24, 1, 24, 0
    while pos + 16 <= size:
        _s, _f, caplen, wirelen = rec.unpack(b.get(pos, 16))
        if caplen > limit or (wirelen and caplen > wirelen and caplen > snaplen) or pos + 16 + caplen > size:
            break
        if pos - start >= split_size:
            out.append(CaptureRange(start, pos, first, hdr))
            start, first = pos, number + 1
        number += 1
        pos += 16 + caplen
    out.append(CaptureRange(start, size, first, hdr))
    return out


def _split_pcapng(b: _Blocks, size: int, split_size: int) -> list[CaptureRange]:
    out: list[CaptureRange] = []
    endian = "<"
    prefix: list[bytes] = []  # the section header and interface blocks in force
    ifaces = 0
    start, first, pos, number, head = 0, 1, 0, 0, b""
    while pos + 12 <= size:
        h = b.get(pos, 12)
        if h[:4] == PCAPNG_SHB:
            if h[8:12] not in PCAPNG_BOM:
                break
            endian = PCAPNG_BOM[h[8:12]]
        btype, blen = struct.unpack(endian + "II", h[:8])
        if blen < 12 or blen % 4 or blen > MAX_RECORD or pos + blen > size:
            break
        if struct.unpack(endian + "I", b.get(pos + blen - 4, 4))[0] != blen:
            break
        if btype == SHB:
            prefix, ifaces = [b.get(pos, blen)], 0
        elif btype == IDB:
            prefix.append(b.get(pos, blen))
            ifaces += 1
        elif btype in (EPB, OPB) and blen - 12 >= 20:
            body = b.get(pos + 8, 20)
            iid = struct.unpack(endian + ("H" if btype == OPB else "I"), body[: 2 if btype == OPB else 4])[0]
            caplen = struct.unpack(endian + "I", body[12:16])[0]
            if iid >= ifaces or caplen > blen - 12 - 20:
                break
            if pos - start >= split_size:
                out.append(CaptureRange(start, pos, first, head))
                start, first, head = pos, number + 1, b"".join(prefix)
            number += 1
        elif btype == SPB and blen - 12 >= 4 and ifaces:
            number += 1
        pos += blen
    out.append(CaptureRange(start, size, first, head))
    return out


class _RangeFile:
    """A file-like view: ``prefix`` bytes, then the file's bytes ``[start, end)``, read in blocks."""

    def __init__(self, f: Seekable, prefix: bytes, start: int, end: int, block: int = 4 << 20) -> None:
        self.f, self.prefix, self.start, self.end, self.block = f, prefix, start, end, block
        self.vpos = 0  # position in the view
        self.buf, self.blo = b"", start

    def read(self, n: int) -> bytes:
        out = b""
        if self.vpos < len(self.prefix):
            out = self.prefix[self.vpos : self.vpos + n]
            self.vpos += len(out)
            n -= len(out)
            if not n:
                return out
        apos = self.start + self.vpos - len(self.prefix)
        n = min(n, self.end - apos)
        if n <= 0:
            return out
        if not (self.blo <= apos and apos + n <= self.blo + len(self.buf)):
            self.f.seek(apos)
            self.blo, self.buf = apos, self.f.read(min(max(n, self.block), self.end - apos))
        got = self.buf[apos - self.blo : apos - self.blo + n]
        self.vpos += len(got)
        return out + got if out else got


def read_range(reader: CaptureReader, f: Seekable, rng: CaptureRange) -> Iterator[RawPacket]:
    """The packets of one range of ``reader.path`` (see :func:`split_ranges`), read from ``f`` open on that file.

    ``reader`` counts and reports as for the whole file: packets are numbered
    from ``rng.first_packet``, and every offset (of a packet, its data, a
    problem) is the file's.
    """
    start, end, first, prefix = rng
    reader.packets = first - 1
    if not prefix and not start:
        f.seek(0)
        if is_gzip(f.read(2)):  # a gzip'ed file is one range (split_ranges): read whole, as the reader does
            yield from _gzip_range(reader, f)
            return
    fh = _RangeFile(f, prefix, start, end)
    reader.size = end  # a record that runs past the range is cut short there, as at the end of a file
    reader._base = start - len(prefix)
    head = prefix[:4] if prefix else fh.read(4)
    if prefix:
        fh.vpos = 4
    if head in PCAP_MAGICS:
        reader.format = "pcap"
        yield from reader._pcap(fh, head)
    elif head == PCAPNG_SHB:
        reader.format = "pcapng"
        fh.vpos = 0
        yield from reader._pcapng(fh)
    else:
        raise CaptureError(reader.path, 0, reader._not_capture(head))


def _gzip_range(reader: CaptureReader, f: Seekable) -> Iterator[RawPacket]:
    """The packets of a whole gzip'ed file open as ``f`` (what :class:`CaptureReader` yields and reports for it)."""
    reader.compression, reader.size = "gzip", 0
    src = Gunzip(_Sought(f))
    try:
        head = src.read(4)
        if head in PCAP_MAGICS:
            reader.format = "pcap"
            yield from reader._pcap(src, head)
        elif head == PCAPNG_SHB:
            reader.format = "pcapng"
            src = Gunzip(_Sought(f))
            yield from reader._pcapng(src)
        else:
            raise CaptureError(reader.path, 0, reader._not_capture(head))
    except GzipDataError as exc:
        if not reader.format:
            raise CaptureError(reader.path, 0, str(exc)) from exc
        reader._problem(src.tell(), f"{exc}; reading stopped")
    reader._gzip_end(src)


class _Sought:
    """A seekable file read from its start (each :class:`Gunzip` over it starts there)."""

    def __init__(self, f: Seekable) -> None:
        f.seek(0)
        self.f = f

    def read(self, n: int, /) -> bytes:
        return self.f.read(n)
