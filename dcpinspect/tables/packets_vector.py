"""Capture files -> TCP segments as numpy arrays: the packet stage of the columnar path (edge: numpy, mmap).

Theory of operation
-------------------
:func:`segment_windows` gives what :func:`dcpinspect.capture.read.capture_segments`
gives - the TCP segments of capture files, the same ``stats`` - but as
:class:`SegmentWindow` arrays over a memory map of each file, never copying
a packet:

1. **Record walk.**  A tight ``struct`` loop steps over the record headers
   (pcap: 16 bytes; pcapng: the blocks) of one window of the file, keeping
   only their offsets; the header fields are then gathered for all records
   at once and checked with array operations.  pcapng enhanced packet blocks
   take the fast loop; every other block (section and interface blocks,
   simple and obsolete packet blocks, anything that looks wrong) takes a
   block-at-a-time walk that mirrors
   :class:`~dcpinspect.capture.pcapfile.CaptureReader` line for line, so the
   problems (messages, byte offsets), errors, times, numbers, ``format``,
   ``linktypes`` and ``bad_times`` are the reader's.
2. **Header parse.**  The link, IPv4/IPv6 and TCP headers of a batch of
   packets are gathered into small 2-D byte arrays (fancy indexing on the
   map) and decoded column-wise: Ethernet with up to two VLAN tags, SLL,
   SLL2, raw IP, BSD null and OpenBSD loop.  The common reasons to skip a
   packet (not IP, not TCP, an IPv4 fragment, short IP or TCP headers, a bad
   TCP header length) are counted with the strings
   :func:`~dcpinspect.capture.packets.locate_segment` uses.
3. **The exact path.**  Any packet the arrays do not settle simply (a short
   link header, an unknown link type, more VLAN tags, IPv6 extension
   headers) goes through :func:`~dcpinspect.capture.packets.locate_segment`
   on its own bytes, so a segment is what the per-packet path makes of it
   by construction.
4. **Windows.**  A window holds the records of at most ``window`` file bytes
   (one record more when a single record is larger) and never spans two
   files; addresses are interned once per call (``addresses`` only grows).
5. **No map, no problem.**  A file that cannot be mapped (empty, a pipe, not
   there) is read by :class:`~dcpinspect.capture.pcapfile.CaptureReader`
   itself, its payloads copied into one ``bytes`` per window.

:func:`range_window` does the same for one :class:`~dcpinspect.capture.pcapfile.CaptureRange`
of a file held in memory (Spark's tasks), as :func:`~dcpinspect.capture.pcapfile.read_range` would.
"""

from __future__ import annotations

import mmap
import os
import socket
import stat
import struct
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..capture.packets import ETH_VLAN, locate_segment
from ..capture.pcapfile import (
    EPB,
    IDB,
    MAX_RECORD,
    OPB,
    PCAP_MAGICS,
    PCAPNG_BOM,
    PCAPNG_SHB,
    SHB_MIN,
    SPB,
    TS_MAX,
    TS_UNKNOWN,
    CaptureError,
    CaptureRange,
    CaptureReader,
    is_gzip,
    time_problem,
    ts_scale,
)
from ..flows.records import CaptureStats

__all__ = ["SegmentWindow", "forget_pages", "range_window", "segment_windows"]

_EPB_MIN = 32  # block header, 20 bytes of packet fields, trailing length
# link and network layers, as capture.packets reads them
_ETHERNET, _SLL, _SLL2 = 1, 113, 276
_RAW = (12, 14, 101, 228, 229)
_LOOP = (0, 108)
_VLAN = np.array(sorted(ETH_VLAN))
_VLAN_TAGS = 2  # stacked tags read with arrays; more go to the exact path
_IPV4, _IPV6 = 0x0800, 0x86DD
_AF6 = (10, 24, 28, 30)
_V6_EXACT = np.array([0, 43, 60, 51, 44])  # extension headers and fragments: the exact path
_TCP = 6
_BATCH = 16384  # packets parsed at once (bounds the gathers' index arrays)


@dataclass
class SegmentWindow:
    """The TCP segments of consecutive packets of one file (numpy arrays, one entry per segment, capture order).

    ``poff`` are file offsets when ``mapped`` (``data`` is the whole file) and
    for :func:`range_window` (there ``data`` holds the file from the range's
    start: payload ``k`` is ``data[poff[k] - start : ...]``); for a file read
    without a map they index the ``bytes`` in ``data``.
    """

    file_index: int  # index of the file in `paths`
    path: str
    data: Any  # buffer (mmap / bytes / memoryview): payload k is data[poff[k] : poff[k] + plen[k]]
    mapped: bool  # True when data is the whole file (then poff are file offsets)
    number: np.ndarray  # int64: packet number in its file (1-based, as CaptureReader numbers them)
    ts: np.ndarray  # int64 ns (flows.reassembly.TS_UNKNOWN when out of range)
    src: np.ndarray  # int32: index into `addresses` (the text socket.inet_ntop gives, as Segment.src)
    dst: np.ndarray  # int32
    sport: np.ndarray  # int32
    dport: np.ndarray  # int32
    seq: np.ndarray  # int64 (the 32-bit TCP sequence number)
    flags: np.ndarray  # int32 (TCP flags byte, as Segment.flags)
    poff: np.ndarray  # int64
    plen: np.ndarray  # int64 (captured payload bytes)
    missing: np.ndarray  # int64 (as Segment.missing)
    addresses: list[str]  # shared by all windows of one call (only grows)
    end: int  # file offset reached (for progress)
    base: int = 0  # the packets of the files before this one: a segment's position in the capture is base + number


class _Records(NamedTuple):
    """Captured packets as arrays (file offsets): what :class:`~dcpinspect.capture.pcapfile.RawPacket` holds, but the bytes."""

    roff: np.ndarray  # record (pcap) or block (pcapng) offset
    doff: np.ndarray  # offset of the captured bytes
    caplen: np.ndarray
    wirelen: np.ndarray  # as RawPacket.wirelen
    ts: np.ndarray
    linktype: np.ndarray
    number: np.ndarray


_FIELDS = len(_Records._fields)


def _records(rows: list[tuple[int, ...]] | list[np.ndarray]) -> _Records:
    return _Records(*(np.asarray(c, np.int64) for c in rows))


def _concat(pieces: list[_Records]) -> _Records:
    if len(pieces) == 1:
        return pieces[0]
    if not pieces:
        return _Records(*(np.zeros(0, np.int64) for _ in range(_FIELDS)))
    return _Records(*(np.concatenate([p[i] for p in pieces]) for i in range(_FIELDS)))


def _rows(u8: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """``width`` bytes from each position: rows of a sliding window view (one copy per row, not per byte).

    Near the end of the buffer a row is cut short, its missing bytes zero:
    callers check a packet's length before they use any byte of its row.
    """
    size = len(u8)
    inside = pos <= size - width
    if size >= width and inside.all():
        return sliding_window_view(u8, width)[pos]
    out = np.zeros((len(pos), width), np.uint8)
    if size >= width:
        out[inside] = sliding_window_view(u8, width)[pos[inside]]
    for i in np.flatnonzero(~inside).tolist():  # the last few packets of the buffer
        a = min(int(pos[i]), size)
        out[i, : size - a] = u8[a:]
    return out


def _be16(a: np.ndarray, i: int) -> np.ndarray:
    return (a[:, i].astype(np.int64) << 8) | a[:, i + 1]


def _be32(a: np.ndarray, i: int) -> np.ndarray:
    return (_be16(a, i) << 16) | _be16(a, i + 2)


def _u32(a: np.ndarray, endian: str) -> np.ndarray:
    """Rows of 4-byte groups as int64 words in ``endian`` byte order."""
    return np.ascontiguousarray(a).view(np.dtype(endian + "u4")).astype(np.int64)


# --------------------------------------------------------------------------- 1. record walk


class _Iface(NamedTuple):
    linktype: int
    snaplen: int
    ns_mul: int
    ns_div: int


def _iface_options(linktype: int, snaplen: int, opts: bytes, endian: str) -> _Iface:
    """An interface with its ``if_tsresol`` applied (as CaptureReader reads it)."""
    return _Iface(linktype, snaplen, *ts_scale(opts, endian))


def _ticks_ns(ticks: np.ndarray, mul: int, div: int) -> tuple[np.ndarray, np.ndarray]:
    """Timestamps of pcapng (uint64 ticks) -> (ns as int64 with TS_UNKNOWN, out-of-range mask), exactly ``ticks * mul // div``."""
    if div == 1:
        bad = ticks > np.uint64(TS_MAX // mul)
        ts = np.where(bad, 0, ticks).astype(np.int64) * mul
    elif mul == 1 and div < 2**63:
        ts = (ticks // np.uint64(div)).astype(np.int64)  # at most (2^64 - 1) / 10: always in range
        bad = np.zeros(len(ticks), bool)
    else:  # 2^-n resolutions (and absurd ones): Python's integers
        vals = [t * mul // div for t in ticks.tolist()]
        bad = np.array([v > TS_MAX for v in vals], bool)
        ts = np.array([0 if v > TS_MAX else v for v in vals], np.int64)
    ts[bad] = TS_UNKNOWN
    return ts, bad


class _Walk:
    """The record walk of one file (or range) over a buffer holding file bytes ``[base, base + len)``.

    Every offset kept is the file's; ``end`` is where reading stops (the
    file's size, or the range's end).  Problems and counts go to ``r``, the
    reader whose results this walk reproduces.
    """

    def __init__(self, path: str, reader: CaptureReader) -> None:
        self.path, self.r = path, reader
        self.done = False
        self.pos = 0  # file offset of the next record or block
        self.time_problem = -1  # index in r.problems
        # pcap
        self.endian, self.ns, self.snaplen, self.limit, self.linktype = "<", 1_000, 0, 0, 0
        # pcapng
        self.first = True
        self.ifaces: list[_Iface] = []
        self.use(b"", 0, 0)

    def use(self, buf: Any, base: int, end: int) -> None:
        """Read ``buf`` (file bytes from ``base``) up to file offset ``end``."""
        self.buf, self.base = buf, base
        self.u8 = np.frombuffer(buf, np.uint8)
        self.end = min(end, base + len(self.u8))

    def _problem(self, offset: int, message: str) -> None:
        self.r.problems.append((offset, message))
        self.done = True

    def _bad_times(self, offset: int, count: int) -> None:
        """``count`` packet times out of range, the first at ``offset``: one problem per file counts them."""
        r = self.r
        if self.time_problem < 0:
            self.time_problem = len(r.problems)
            r.problems.append((offset, time_problem(1)))
            r.bad_times += 1
            count -= 1
        if count:
            r.bad_times += count
            r.problems[self.time_problem] = (r.problems[self.time_problem][0], time_problem(r.bad_times))

    def begin(self) -> None:
        """Read the file header at the start of the buffer."""
        head = bytes(self.u8[:4])
        if head in PCAP_MAGICS:
            self.r.format = "pcap"
            self._pcap_header(head, bytes(self.u8[4:24]))
            self.pos = self.base + 24
        elif head == PCAPNG_SHB:
            self.r.format = "pcapng"
            self.pos = self.base
        elif not head:
            raise CaptureError(self.path, 0, "empty file: not a pcap or pcapng capture")
        else:
            raise CaptureError(self.path, 0, f"not a pcap or pcapng capture (starts with {head.hex()})")

    def window(self, window: int) -> _Records:
        """The records of the next ``window`` bytes (at least one record, unless the file ends)."""
        if self.r.format == "pcap":
            return self._pcap_window(window)
        return self._pcapng_window(window)

    # pcap

    def _pcap_header(self, magic: bytes, hdr: bytes) -> None:
        self.endian, self.ns = PCAP_MAGICS[magic]
        if len(hdr) < 20:
            raise CaptureError(self.path, 4, "pcap global header truncated")
        vmaj, _vmin, _tz, _sig, snaplen, linktype = struct.unpack(self.endian + "HHiIII", hdr)
        if vmaj != 2:
            raise CaptureError(self.path, 4, f"pcap global header corrupt (version {vmaj})")
        self.linktype = linktype & 0x0FFFFFFF
        self.r.linktypes.add(self.linktype)
        self.snaplen = snaplen
        self.limit = max(snaplen, 262_144) if 0 < snaplen <= MAX_RECORD else MAX_RECORD

    def _pcap_window(self, window: int) -> _Records:
        buf, base = self.buf, self.base
        end = self.end - base
        pos = self.pos - base
        wend = min(pos + window, end)
        caplen_at = struct.Struct(self.endian + "I").unpack_from
        offs: list[int] = []
        keep = offs.append
        # The hot loop keeps q = the offset of a record's caplen field, and
        # stops at the first record not whole in the window: one whose header
        # is not (then q + 16 > wend + 8 already) or whose data is not.
        q, stop = pos + 8, wend + 8
        try:
            while True:
                nq = q + 16 + caplen_at(buf, q)[0]
                if nq > stop:
                    break
                keep(q)
                q = nq
        except struct.error:  # past the buffer: the end of the file
            pass
        pos = q - 8
        if not offs and pos + 16 <= end:  # one record larger than the window (or a bad one)
            keep(q)
            pos += 16 + caplen_at(buf, q)[0]
        o = np.array(offs, np.int64) - 8
        sec, frac, caplen, wirelen = _u32(_rows(self.u8, o, 16), self.endian).reshape(-1, 4).T
        corrupt = (caplen > self.limit) | ((wirelen != 0) & (caplen > wirelen) & (caplen > self.snaplen))
        bad = corrupt | (o + 16 + caplen > end)
        if bad.any():
            i = int(bad.argmax())
            at, c, w = int(o[i]), int(caplen[i]), int(wirelen[i])
            if corrupt[i]:
                self._problem(base + at, f"corrupt record: captured length {c} (snaplen {self.snaplen}, original {w}); reading stopped")
            else:
                self._problem(base + at, f"truncated record: {max(0, end - at - 16)} of {c} bytes: the capture was cut short")
            o, sec, frac, caplen, wirelen = o[:i], sec[:i], frac[:i], caplen[:i], wirelen[:i]
            pos = at
        elif pos + 16 > end:
            self.done = True
            if pos < end:
                self._problem(base + pos, f"truncated record header ({end - pos} of 16 bytes): the capture was cut short")
        self.pos = base + pos
        n = len(o)
        number = np.arange(self.r.packets + 1, self.r.packets + 1 + n, dtype=np.int64)
        self.r.packets += n
        return _Records(
            base + o,
            base + o + 16,
            caplen,
            np.maximum(wirelen, caplen),
            sec * 1_000_000_000 + frac * self.ns,
            np.full(n, self.linktype, np.int64),
            number,
        )

    # pcapng

    def _pcapng_window(self, window: int) -> _Records:
        wstart = self.pos
        wend = min(wstart + window, self.end)
        pieces: list[_Records] = []
        slow: list[tuple[int, ...]] = []  # records of blocks walked one at a time, not yet in pieces
        while not self.done:
            fast = self._epbs(wend)
            if fast is not None:
                if slow:
                    pieces.append(_records(list(zip(*slow, strict=True))))
                    slow = []
                pieces.append(fast)
            if not self._block(wstart, wend, slow):
                break
        if slow:
            pieces.append(_records(list(zip(*slow, strict=True))))
        return _concat(pieces)

    def _epbs(self, wend: int) -> _Records | None:
        """A run of plain enhanced packet blocks from ``pos`` up to ``wend``: walked with offsets only, checked with arrays.

        The run stops before any other block or anything that looks wrong;
        :meth:`_block` then reads that block as the reader would.
        """
        buf, base = self.buf, self.base
        pos, lim = self.pos - base, wend - base
        head = struct.Struct(self.endian + "II").unpack_from
        offs: list[int] = []
        keep = offs.append
        while pos + 8 <= lim:
            btype, blen = head(buf, pos)
            if btype != EPB or blen < _EPB_MIN or blen & 3 or blen > MAX_RECORD or pos + blen > lim:
                break
            keep(pos)
            pos += blen
        if not offs:
            return None
        o = np.array(offs, np.int64)
        blen, iid, tsh, tsl, caplen, wirelen = _u32(_rows(self.u8, o + 4, 24), self.endian).reshape(-1, 6).T
        trailer = _u32(_rows(self.u8, o + blen - 4, 4), self.endian).ravel()
        ok = (trailer == blen) & (iid < len(self.ifaces)) & (caplen <= blen - _EPB_MIN)
        if not ok.all():
            i = int(ok.argmin())
            o, blen, iid, tsh, tsl, caplen, wirelen = (a[:i] for a in (o, blen, iid, tsh, tsl, caplen, wirelen))
            if not len(o):
                return None
        self.pos = base + int(o[-1] + blen[-1])
        n = len(o)
        ticks = (tsh.astype(np.uint64) << np.uint64(32)) | tsl.astype(np.uint64)
        ts = np.empty(n, np.int64)
        bad = np.zeros(n, bool)
        linktype = np.empty(n, np.int64)
        for k in np.unique(iid).tolist():
            m = iid == k
            iface = self.ifaces[k]
            ts[m], bad[m] = _ticks_ns(ticks[m], iface.ns_mul, iface.ns_div)
            linktype[m] = iface.linktype
        if bad.any():
            self._bad_times(base + int(o[bad.argmax()]), int(bad.sum()))
        number = np.arange(self.r.packets + 1, self.r.packets + 1 + n, dtype=np.int64)
        self.r.packets += n
        return _Records(base + o, base + o + 28, caplen, np.maximum(wirelen, caplen), ts, linktype, number)

    def _block(self, wstart: int, wend: int, out: list[tuple[int, ...]]) -> bool:
        """Read one block as CaptureReader does (records to ``out``); False when it belongs to the next window."""
        buf, base, offset = self.buf, self.base, self.pos
        p, end = offset - base, self.end - base
        avail = end - p
        if avail <= 0:
            self.done = True
            return True
        if avail < 8:
            self._problem(offset, f"truncated block header ({avail} of 8 bytes): the capture was cut short")
            return True
        h = bytes(buf[p : p + 8])
        head = b""
        endian = self.endian
        if h[:4] == PCAPNG_SHB:
            head = bytes(buf[p + 8 : min(p + 12, end)])
            if head not in PCAPNG_BOM:
                if self.first:
                    raise CaptureError(self.path, offset + 8, "pcapng section header corrupt (byte-order magic)")
                self._problem(offset, "corrupt section header block; reading stopped")
                return True
            endian = PCAPNG_BOM[head]
        btype, blen = struct.unpack(endian + "II", h)
        if blen < (SHB_MIN if head else 12) or blen % 4 or blen > MAX_RECORD:
            if self.first:
                raise CaptureError(self.path, offset, f"pcapng section header corrupt (block length {blen})")
            self._problem(offset, f"corrupt block: length {blen}; reading stopped")
            return True
        if p + blen > end:
            self._problem(offset, f"truncated block ({max(0, end - p)} of {blen} bytes): the capture was cut short")
            return True
        if offset > wstart and offset + blen > wend:
            return False
        if struct.unpack_from(endian + "I", buf, p + blen - 4)[0] != blen:
            self._problem(offset, "corrupt block: trailing length differs; reading stopped")
            return True
        if head:
            self.endian, self.ifaces = endian, []
        self.first = False
        self.pos = offset + blen
        body = blen - 12
        if btype == IDB and body >= 8:
            linktype, _res, snaplen = struct.unpack_from(endian + "HHI", buf, p + 8)
            self.ifaces.append(_iface_options(linktype, snaplen, bytes(buf[p + 16 : p + blen - 4]), endian))
            self.r.linktypes.add(linktype)
        elif btype in (EPB, OPB) and body >= 20:
            if btype == EPB:
                iid, tsh, tsl, caplen, wirelen = struct.unpack_from(endian + "IIIII", buf, p + 8)
            else:
                iid, _drops, tsh, tsl, caplen, wirelen = struct.unpack_from(endian + "HHIIII", buf, p + 8)
            if iid >= len(self.ifaces) or caplen > body - 20:
                self.pos = offset
                self._problem(offset, f"corrupt packet block (interface {iid}, captured length {caplen}); reading stopped")
                return True
            iface = self.ifaces[iid]
            ts = ((tsh << 32) | tsl) * iface.ns_mul // iface.ns_div
            if ts > TS_MAX:
                self._bad_times(offset, 1)
                ts = TS_UNKNOWN
            self.r.packets += 1
            out.append((offset, offset + 28, caplen, max(wirelen, caplen), ts, iface.linktype, self.r.packets))
        elif btype == SPB and body >= 4 and self.ifaces:
            (wirelen,) = struct.unpack_from(endian + "I", buf, p + 8)
            iface = self.ifaces[0]
            caplen = min(wirelen, body - 4, iface.snaplen or wirelen)
            self.r.packets += 1
            out.append((offset, offset + 12, caplen, wirelen, 0, iface.linktype, self.r.packets))
        return True


# --------------------------------------------------------------------------- 2. headers


class _Names:
    """Addresses as indices into one growing list of their text (as ``socket.inet_ntop`` gives it)."""

    def __init__(self) -> None:
        self.addresses: list[str] = []
        self.index: dict[str, int] = {}
        self.v4: dict[int, int] = {}
        self.v6: dict[bytes, int] = {}
        self.v4_keys = np.zeros(0, np.int64)  # sorted, with their indices
        self.v4_table = np.zeros(0, np.int32)

    def text(self, address: str) -> int:
        i = self.index.get(address)
        if i is None:
            i = self.index[address] = len(self.addresses)
            self.addresses.append(address)
        return i

    def ipv4(self, words: np.ndarray) -> np.ndarray:
        """IPv4 addresses (big-endian words) -> indices: a search among the known ones; only new ones are sorted out."""
        keys, table = self.v4_keys, self.v4_table
        if not len(words):
            return np.zeros(0, np.int32)
        if len(keys):
            at = np.minimum(np.searchsorted(keys, words), len(keys) - 1)
            hit = keys[at] == words
            if hit.all():
                return table[at]
            words_new = words[~hit]
        else:
            words_new = words
        for k in np.unique(words_new).tolist():
            if k not in self.v4:
                self.v4[k] = self.text(socket.inet_ntop(socket.AF_INET, k.to_bytes(4, "big")))
        self.v4_keys = np.array(sorted(self.v4), np.int64)
        self.v4_table = np.array([self.v4[k] for k in self.v4_keys.tolist()], np.int32)
        return self.ipv4(words)

    def ipv6(self, rows: np.ndarray) -> np.ndarray:
        keys, inverse = np.unique(np.ascontiguousarray(rows).view("V16").ravel(), return_inverse=True)
        table = np.empty(len(keys), np.int32)
        for j, k in enumerate(keys):
            raw = k.tobytes()
            i = self.v6.get(raw)
            if i is None:
                i = self.v6[raw] = self.text(socket.inet_ntop(socket.AF_INET6, raw))
            table[j] = i
        return table[inverse.ravel()]


_COLUMNS = ("number", "ts", "src", "dst", "sport", "dport", "seq", "flags", "poff", "plen", "missing")
_DTYPES = (np.int64, np.int64, np.int32, np.int32, np.int32, np.int32, np.int64, np.int32, np.int64, np.int64, np.int64)


def _count(skipped: Counter[str], reason: str, mask: np.ndarray) -> None:
    n = int(np.count_nonzero(mask))
    if n:
        skipped[reason] += n


def _link(link: np.ndarray, lt: np.ndarray, cl: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ether type, offset of the IP header) per packet; ether type -1 sends it to the exact path."""
    n = len(lt)
    etype = np.full(n, -1, np.int64)
    off = np.zeros(n, np.int64)
    for kind in np.unique(lt).tolist():
        m = lt == kind
        if kind == _ETHERNET:
            e = _be16(link, 12)
            o = np.full(n, 14, np.int64)
            ok = m & (cl >= 14)
            for tag in range(_VLAN_TAGS):
                v = np.isin(e, _VLAN)
                ok &= ~(v & (cl < o + 4))  # a short tag: the exact path
                e = np.where(v, _be16(link, 16 + 4 * tag), e)
                o = np.where(v, o + 4, o)
            ok &= ~np.isin(e, _VLAN)
        elif kind == _SLL:
            e, o, ok = _be16(link, 14), np.full(n, 16, np.int64), m & (cl >= 16)
        elif kind == _SLL2:
            e, o, ok = _be16(link, 0), np.full(n, 20, np.int64), m & (cl >= 20)
        elif kind in _RAW:
            version = link[:, 0] >> 4
            e = np.where(version == 4, _IPV4, np.where(version == 6, _IPV6, 0))
            o, ok = np.zeros(n, np.int64), m & (cl >= 1)
        elif kind in _LOOP:
            big = _be32(link, 0)
            family = big
            if kind == 0:  # host byte order: little-endian unless that is too large
                little = link[:, :4].copy().view("<u4").ravel().astype(np.int64)
                family = np.where(little > 0xFFFF, big, little)
            e = np.where(family == 2, _IPV4, np.where(np.isin(family, _AF6), _IPV6, 0))
            o, ok = np.full(n, 4, np.int64), m & (cl >= 4)
        else:
            continue
        etype[ok] = e[ok]
        off[ok] = o[ok]
    return etype, off


def _parse(u8: np.ndarray, base: int, rec: _Records, path: str, skipped: Counter[str], names: _Names) -> dict[str, np.ndarray]:
    """The segment columns of a batch of packets (``base``: the file offset of ``u8[0]``)."""
    d = rec.doff - base  # buffer index of each packet's bytes
    cl, lt = rec.caplen, rec.linktype
    cut = rec.wirelen - cl
    n = len(d)
    etype, off = _link(_rows(u8, d, 24), lt, cl)
    exact = etype < 0
    v4, v6 = etype == _IPV4, etype == _IPV6
    _count(skipped, "not IP", ~exact & ~v4 & ~v6)
    short = v4 & (cl < off + 20)
    _count(skipped, "short IPv4 header", short)
    v4 &= ~short
    short = v6 & (cl < off + 40)
    _count(skipped, "short IPv6 header", short)
    v6 &= ~short

    tcp = np.zeros(n, np.int64)
    ip_end = np.zeros(n, np.int64)
    src = np.zeros(n, np.int32)
    dst = np.zeros(n, np.int32)
    tcp_ok = np.zeros(n, bool)
    i4 = np.flatnonzero(v4)
    if len(i4):
        ip = _rows(u8, d[i4] + off[i4], 20)
        proto, total = ip[:, 9], _be16(ip, 2)
        not_tcp = proto != _TCP
        frag = ~not_tcp & ((_be16(ip, 6) & 0x3FFF) != 0)
        _count(skipped, "not TCP", not_tcp)
        _count(skipped, "IPv4 fragment", frag)
        o = off[i4]
        tcp[i4] = o + (ip[:, 0] & 0x0F).astype(np.int64) * 4
        ip_end[i4] = np.where(total != 0, o + total, cl[i4] + cut[i4])
        keep = ~not_tcp & ~frag
        tcp_ok[i4] = keep
        both = names.ipv4(np.concatenate([_be32(ip, 12)[keep], _be32(ip, 16)[keep]]))
        src[i4[keep]], dst[i4[keep]] = both[: int(keep.sum())], both[int(keep.sum()) :]
    i6 = np.flatnonzero(v6)
    if len(i6):
        ip = _rows(u8, d[i6] + off[i6], 40)
        nxt, plen = ip[:, 6], _be16(ip, 4)
        ext = np.isin(nxt, _V6_EXACT)
        exact[i6[ext]] = True
        not_tcp = ~ext & (nxt != _TCP)
        _count(skipped, "not TCP", not_tcp)
        o = off[i6]
        tcp[i6] = o + 40
        ip_end[i6] = np.where(plen != 0, o + 40 + plen, cl[i6] + cut[i6])
        keep = nxt == _TCP
        tcp_ok[i6] = keep
        both = names.ipv6(np.concatenate([ip[keep, 8:24], ip[keep, 24:40]]))
        src[i6[keep]], dst[i6[keep]] = both[: int(keep.sum())], both[int(keep.sum()) :]

    short = tcp_ok & (cl < tcp + 20)
    _count(skipped, "short TCP header", short)
    tcp_ok &= ~short
    it = np.flatnonzero(tcp_ok)
    th = _rows(u8, d[it] + tcp[it], 14)
    start = tcp[it] + (th[:, 12] >> 4).astype(np.int64) * 4
    end_ip = ip_end[it]
    bad = start > end_ip
    _count(skipped, "bad TCP header length", bad)
    seg = np.zeros(n, bool)
    seg[it[~bad]] = True
    have_end = np.minimum(end_ip, cl[it])
    cols = {name: np.zeros(n, dt) for name, dt in zip(_COLUMNS, _DTYPES, strict=True)}
    cols["number"], cols["ts"], cols["src"], cols["dst"] = rec.number, rec.ts, src, dst
    cols["sport"][it] = _be16(th, 0)
    cols["dport"][it] = _be16(th, 2)
    cols["seq"][it] = _be32(th, 4)
    cols["flags"][it] = th[:, 13]
    cols["poff"][it] = rec.doff[it] + start  # file offsets
    cols["plen"][it] = np.maximum(0, have_end - start)
    cols["missing"][it] = np.maximum(0, end_ip - np.maximum(have_end, start))

    for i in np.flatnonzero(exact).tolist():  # the exact path, one packet at a time
        a = int(d[i])
        found = locate_segment(
            int(lt[i]), u8[a : a + int(cl[i])].tobytes(), int(rec.wirelen[i]), int(rec.ts[i]), int(rec.number[i]), path, skipped
        )
        if found is None:
            continue
        s, _tcp, payload = found
        seg[i] = True
        cols["src"][i], cols["dst"][i] = names.text(s.src), names.text(s.dst)
        cols["sport"][i], cols["dport"][i], cols["seq"][i], cols["flags"][i] = s.sport, s.dport, s.seq, s.flags
        cols["poff"][i], cols["plen"][i], cols["missing"][i] = int(rec.doff[i]) + payload, len(s.payload), s.missing
    return {k: v[seg] for k, v in cols.items()}


def _segments(u8: np.ndarray, base: int, rec: _Records, path: str, skipped: Counter[str], names: _Names) -> dict[str, np.ndarray]:
    """The segment columns of a window's packets (batches of ``_BATCH``)."""
    parts = [_parse(u8, base, _Records(*(a[s : s + _BATCH] for a in rec)), path, skipped, names) for s in range(0, len(rec.doff), _BATCH)]
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return {name: np.zeros(0, dt) for name, dt in zip(_COLUMNS, _DTYPES, strict=True)}
    return {name: np.concatenate([p[name] for p in parts]) for name in _COLUMNS}


# --------------------------------------------------------------------------- 3. files and windows


def _map(path: str) -> mmap.mmap | None:
    """The whole file, mapped read-only; None when it cannot be (not there, empty, not a regular file) or must not be (gzip'ed: its reader decompresses it)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # never opened here: a pipe has one reader
            return None
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0 or is_gzip(f.read(2)):
                return None
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None


def _info(reader: CaptureReader, info: dict[str, Any]) -> None:
    info["format"] = reader.format or None
    info["packets"] = reader.packets
    info["problems"] = [f"{msg} (at byte offset {off})" for off, msg in reader.problems]
    info["linktypes"] = sorted(reader.linktypes)


def _window(file_index: int, path: str, data: Any, mapped: bool, cols: dict[str, np.ndarray], names: _Names, end: int) -> SegmentWindow:
    return SegmentWindow(file_index, path, data, mapped, **cols, addresses=names.addresses, end=end, base=0)


def _reader_windows(
    file_index: int, reader: CaptureReader, stats: CaptureStats, names: _Names, window: int, progress: Callable[[str, int], None] | None
) -> Iterator[SegmentWindow]:
    """A file that cannot be mapped: CaptureReader and locate_segment themselves, payloads copied per window."""
    path = reader.path
    rows: list[tuple[int, ...]] = []
    payload = bytearray()
    wstart = -1
    reached = 0

    def flush() -> SegmentWindow:
        cols = {name: np.array([r[k] for r in rows], dt) for k, (name, dt) in enumerate(zip(_COLUMNS, _DTYPES, strict=True))}
        if progress is not None:
            progress(path, reached)
        return _window(file_index, path, bytes(payload), False, cols, names, reached)

    for pkt in reader:
        if wstart >= 0 and pkt.data_offset + len(pkt.data) - wstart > window:
            yield flush()
            rows, payload, wstart = [], bytearray(), -1
        if wstart < 0:
            wstart = pkt.offset
        stats.packets += 1
        reached = pkt.data_offset + len(pkt.data)
        found = locate_segment(pkt.linktype, pkt.data, pkt.wirelen, pkt.ts, pkt.number, path, stats.skipped)
        if found is not None:
            s = found[0]
            rows.append(
                (
                    s.packet,
                    s.ts,
                    names.text(s.src),
                    names.text(s.dst),
                    s.sport,
                    s.dport,
                    s.seq,
                    s.flags,
                    len(payload),
                    len(s.payload),
                    s.missing,
                )
            )
            payload += s.payload
    reached = max(reached, reader.size)
    yield flush()


def segment_windows(
    paths: Iterable[str], stats: CaptureStats, *, window: int = 32 << 20, progress: Callable[[str, int], None] | None = None
) -> Iterator[SegmentWindow]:
    """Like capture.read.capture_segments, as windows of at most ``window`` file bytes, never spanning two files.

    The same files info in ``stats.files[path]``, ``stats.packets`` and
    ``stats.skipped`` reasons; ``progress(path, offset)`` at least once per window.
    """
    names = _Names()
    base = 0
    for file_index, p in enumerate(paths):
        path = str(p)
        reader = CaptureReader(path)
        info: dict[str, Any] = {"format": None, "packets": 0, "problems": [], "error": None}
        stats.files[path] = info
        try:
            data = _map(path)
            if data is None:
                for w in _reader_windows(file_index, reader, stats, names, window, progress):
                    w.base = base
                    yield w
            else:
                reader.size = len(data)
                walk = _Walk(path, reader)
                walk.use(data, 0, len(data))
                walk.begin()
                dropped = 0
                while not walk.done:
                    rec = walk.window(window)
                    stats.packets += len(rec.doff)
                    cols = _segments(walk.u8, 0, rec, path, stats.skipped, names)
                    if progress is not None:
                        progress(path, walk.pos)
                    w = _window(file_index, path, data, True, cols, names, walk.pos)
                    w.base = base
                    yield w
                    dropped = forget_pages(data, dropped, walk.pos)
        except CaptureError as exc:
            info["error"] = str(exc)
        _info(reader, info)
        base += reader.packets


def forget_pages(data: Any, start: int, end: int) -> int:
    """Let the kernel drop the mapped pages of ``[start, end)`` the caller is done with (file-backed: read again if touched).

    Without it every page read stays in the process's resident set, so the
    peak RSS would grow with the capture; the data itself is unchanged.
    """
    end -= end % mmap.PAGESIZE
    if end > start and isinstance(data, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
        data.madvise(mmap.MADV_DONTNEED, start, end - start)
        return end
    return start


def range_window(path: str, file_index: int, data: Any, rng: CaptureRange, skipped: Counter[str]) -> tuple[SegmentWindow, CaptureReader]:
    """The segments of one range of a file, from ``data`` = the file's bytes ``[rng.start, rng.end)``.

    Equal to :func:`~dcpinspect.capture.pcapfile.read_range` and
    :func:`~dcpinspect.capture.packets.locate_segment`: packets numbered from
    ``rng.first_packet``, ``poff`` file offsets (payload ``k`` is
    ``data[poff[k] - rng.start : ...]``), and the returned reader holds the
    ``problems``, ``format``, ``packets``, ``linktypes`` and ``bad_times``
    read_range leaves.  ``rng`` comes from
    :func:`~dcpinspect.capture.pcapfile.split_ranges` (its prefix is whole
    header blocks).  Raises :class:`~dcpinspect.capture.pcapfile.CaptureError` as read_range does.
    """
    start, end, first, prefix = rng
    reader = CaptureReader(path)
    reader.packets = first - 1
    reader.size = end
    walk = _Walk(path, reader)
    names = _Names()
    if prefix:
        walk.use(prefix, start - len(prefix), start)
        walk.begin()
        if reader.format == "pcapng":
            while not walk.done and walk.pos < start:  # the section and interface blocks in force
                walk._block(walk.pos, start, [])
    walk.use(data, start, end)
    if not prefix:
        walk.begin()
    pieces = []
    while not walk.done:
        pieces.append(walk.window(max(1, end - walk.pos)))
    rec = _concat(pieces)
    cols = _segments(walk.u8, start, rec, path, skipped, names)
    return _window(file_index, path, data, False, cols, names, walk.pos), reader
