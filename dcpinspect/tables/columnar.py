"""The columnar capture path: pcap/pcapng files -> the frames table, a window of packets at a time.

Theory of operation
-------------------
The exact path (:func:`~dcpinspect.capture.read.read_chunks`) turns every
packet into a :class:`~dcpinspect.flows.reassembly.Segment`, reassembles it
and decodes it in Python, one object per packet and per frame.  Most TCP
connections of a capture need none of that care: each direction is a run of
segments in order, with no loss, retransmission or overlap, and its bytes are
frames back to back.  This module proves that with array operations and reads
those connections as arrays; every other connection goes, whole, through the
exact path, and its rows are merged in their place.

Two passes over the files, each a window of packets at a time
(:func:`~dcpinspect.tables.packets_vector.segment_windows`: the link, IP and
TCP headers parsed with numpy over an mmap):

1. **The proof** (:class:`_Proof`).  A 4-tuple is *simple* when its first
   packet is a SYN - to a memcached server port, or to another port whose
   first payload is a plausible header (as the reassembler detects one) -
   each direction opens with its SYN (the server's with SYN-ACK) and has no
   other SYN, no byte the snaplen cut, every payload segment and FIN at
   exactly the next sequence number (so no retransmission, overlap, gap or
   reordering), at most one FIN and nothing after it, no payload after a RST,
   and the first payload is not a TLS record.  Every other 4-tuple (and all
   traffic that is not memcached binary) is *exact*.
2. **The decode** (:class:`_Decode`).  A simple direction's payloads are
   joined and walked frame by frame with one precompiled ``struct`` loop (the
   decoder's own plausibility rules); each frame's first and last byte find
   their packets by binary search.  From the first header the walk does not
   accept, that direction is fed to a real
   :class:`~dcpinspect.wire.decoder.FrameDecoder` packet by packet (at a frame
   boundary a fresh aligned decoder is in the very state the exact path's
   is), and so are a direction's last bytes at its FIN or at the end.  Exact
   4-tuples feed one :class:`~dcpinspect.flows.records.Recorder`.  The
   session commands of each simple connection are followed by the one
   :class:`~dcpinspect.flows.session.ConnState`, in order, for the contexts.
   The rows of both kinds are sorted by what emitted them - the packet (its
   position in the capture) and their order within it, or the end of the
   capture - and numbered; connections are numbered in the order they became
   known.  That is exactly the order and numbering of the exact path.
   The columns are then built by :func:`~dcpinspect.tables.frames_vector.value_columns`
   (the protocol table's layouts and rules, over arrays).

Rules:

1. The table equals the exact path's, row for row and column for column,
   and so do the capture's statistics (files, skipped packets, connections
   and their counters, what each connection negotiated).  A differential
   test holds it to that on every capture we have.
2. One odd connection never slows the others: the proof is per 4-tuple.
3. Memory is bounded by the window (and a frame's bytes per direction held
   across windows), not by the capture: the packet arrays of a window and the
   rows it completed, never the whole capture.  (A capture of up to 256 MiB
   keeps its packet arrays between the passes, so it is parsed once.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa

from ..capture.sets import Plan, read_sets
from ..flows.reassembly import (
    ACK,
    CLOSE_BASE,
    DEFAULT_SERVER_PORTS,
    FIN,
    RST,
    SYN,
    TLS_PORTS,
    Connection,
    HalfStream,
    Segment,
    plausible_start,
    tls_record,
)
from ..flows.records import FIRST_SET, CaptureStats, Record, Recorder, SetPlace, gc_paused
from ..flows.session import Sessions
from ..protocol import spec
from ..protocol.session import SESSION_OPS
from ..wire.decoder import DEFAULT_MAX_BODY, FrameDecoder, chain_frames, plausible_header
from ..wire.dissection import DissectContext
from ..wire.events import Event, Frame
from .columns import FrameColumns
from .frames_vector import SCHEMA, FrameRows, header_array, set_columns, ts_array, value_columns

if TYPE_CHECKING:
    from .packets_vector import SegmentWindow

__all__ = [
    "CLOSE_BASE",
    "DIRECTIONS",
    "SET_SHIFT",
    "PartArrays",
    "TablePart",
    "decode_windows",
    "frame_walk",
    "read_batches",
    "read_parts",
    "set_keys",
]

#: a numbering key of a run of several capture sets: ``set << SET_SHIFT | key within the set`` (see :func:`set_keys`)
SET_SHIFT = 48
_SET_CLOSE = 1 << (SET_SHIFT - 1)


def set_keys(k1: np.ndarray, ck: np.ndarray, capture_set: int) -> tuple[np.ndarray, np.ndarray]:
    """Numbering keys ``k1`` and ``ck`` of one capture set made keys of the run: every key of a set sorts before the next set's.

    Within a set the order is kept: capture positions, then the rows held to
    the set's end (``k1`` at or past :data:`CLOSE_BASE`) in connection order.
    Positions within a set stay below ``2**47`` and sets below ``2**15``.
    """
    top = np.int64(capture_set) << SET_SHIFT
    held = k1 >= CLOSE_BASE
    k = np.where(held, (k1 - CLOSE_BASE) | _SET_CLOSE, k1) if held.any() else k1
    return k | top, ck | top


_MASK32 = 0xFFFFFFFF
_WINDOW = 16 << 20
_CACHE_BYTES = 256 << 20  # captures up to this size are parsed once (their packet arrays kept between the passes) ...
_CACHE_SEGMENTS = 1 << 21  # ... unless they hold more segments than this


_HS = spec.HEADER_SIZE


_ALT_MAGICS = np.array(sorted(spec.ALT_MAGICS), np.uint8)
_CLASSIC_MAGICS = np.array(sorted(set(spec.MAGICS) - set(spec.ALT_MAGICS)), np.uint8)


def frame_walk(buf: bytes | memoryview, max_body: int = DEFAULT_MAX_BODY) -> tuple[np.ndarray, int, bool]:
    """The mcbp frames back to back from ``buf[0]``, as the aligned loop of :class:`~dcpinspect.wire.decoder.FrameDecoder` frames them.

    Returns (the frames' starts, where the walk stopped, whether it stopped at
    an implausible header); stopping short of the end otherwise means the rest
    starts a frame not yet complete.  The chain of body lengths is followed in
    Python (:func:`~dcpinspect.wire.decoder.chain_frames`), then every header
    is judged at once by the decoder's rule - a known magic,
    framing+extras+key within the body, the body within ``max_body`` - and
    the chain cut at the first it does not accept (tested equal to the
    decoder on any bytes).
    """
    chain, stop = chain_frames(buf)
    s = np.array(chain, np.int64)
    if len(s):
        h = header_array(np.frombuffer(buf, np.uint8), s)
        m, kl, body = h["magic"], h["keylen"].astype(np.int64), h["bodylen"].astype(np.int64)
        alt = np.isin(m, _ALT_MAGICS)
        sections = np.where(alt, (kl >> 8) + (kl & 0xFF), kl) + h["extlen"]
        ok = (alt | np.isin(m, _CLASSIC_MAGICS)) & (sections <= body) & (body <= max_body)
        if not ok.all():
            j = int(np.argmin(ok))
            return s[:j], int(s[j]), True
    if stop + spec.HEADER_SIZE <= len(buf) and not plausible_header(buf[stop : stop + spec.HEADER_SIZE], max_body=max_body, strict=False):
        return s, stop, True
    return s, stop, False


# --------------------------------------------------------------------------- tuples


def _tuple_ids(w: SegmentWindow, index: dict[tuple[str, int, str, int], int]) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Each segment's 4-tuple id (numbered in order of first sight), its first index in the window, and the new ids."""
    a = (w.src.astype(np.int64) << 16) | w.sport.astype(np.int64)
    b = (w.dst.astype(np.int64) << 16) | w.dport.astype(np.int64)
    pair = np.empty(len(a), dtype=[("lo", "i8"), ("hi", "i8")])
    pair["lo"] = np.minimum(a, b)
    pair["hi"] = np.maximum(a, b)
    uniq, first, inv = np.unique(pair, return_index=True, return_inverse=True)
    addrs = w.addresses
    ids = np.empty(len(uniq), np.int64)
    new: list[int] = []
    for j in np.argsort(first, kind="stable").tolist():  # in order of first sight
        lo, hi = int(uniq[j]["lo"]), int(uniq[j]["hi"])
        key = (addrs[lo >> 16], lo & 0xFFFF, addrs[hi >> 16], hi & 0xFFFF)
        t = index.get(key)
        if t is None:
            t = index[key] = len(index)
            new.append(t)
        ids[j] = t
    return ids[inv.reshape(-1)], first, new


class _Grow:
    """Per-id numpy state that grows as ids appear."""

    def __init__(self, dtype: Any, fill: Any = 0) -> None:
        self.a = np.full(64, fill, dtype)
        self.fill = fill

    def need(self, n: int) -> np.ndarray:
        if n > len(self.a):
            b = np.full(max(n, 2 * len(self.a)), self.fill, self.a.dtype)
            b[: len(self.a)] = self.a
            self.a = b
        return self.a


@dataclass
class _Proof:
    """Pass 1: which 4-tuples are simple (see the module docstring)."""

    server_ports: frozenset[int]
    tls_ports: frozenset[int]
    detect: bool
    index: dict[tuple[str, int, str, int], int] = field(default_factory=dict)
    client: list[tuple[str, int]] = field(default_factory=list)  # per tuple: the SYN's sender
    bad: _Grow = field(default_factory=lambda: _Grow(bool))
    started: _Grow = field(default_factory=lambda: _Grow(bool))  # per direction (2 * tuple + dir): its SYN seen
    expected: _Grow = field(default_factory=lambda: _Grow(np.int64))  # per direction: the next sequence number
    fin: _Grow = field(default_factory=lambda: _Grow(bool))  # per direction: FIN seen
    sniffed: _Grow = field(default_factory=lambda: _Grow(bool))  # per tuple: first payload looked at
    rst: _Grow = field(default_factory=lambda: _Grow(bool))  # per tuple: reset
    known: _Grow = field(default_factory=lambda: _Grow(bool))  # per tuple: its SYN went to a server port
    adopt: _Grow = field(default_factory=lambda: _Grow(np.int64, -1))  # per tuple: the position of the packet that made it known
    _addresses: list[str] = field(default_factory=list, repr=False)
    _index_of: dict[str, int] = field(default_factory=dict, repr=False)

    def window(self, w: SegmentWindow) -> None:
        """Take one window's segments."""
        n = len(w.number)
        if not n:
            return
        tid, first, new = _tuple_ids(w, self.index)
        nt = len(self.index)
        bad = self.bad.need(nt)
        known = self.known.need(nt)
        adopt = self.adopt.need(nt)
        self.sniffed.need(nt)
        self.rst.need(nt)
        gpos = _gpos(w)
        firsts = {int(tid[i]): int(i) for i in first.tolist()}
        for t in new:
            i = firsts[t]
            flags = int(w.flags[i])
            self.client.append((w.addresses[int(w.src[i])], int(w.sport[i])))
            dport = int(w.dport[i])
            known[t] = dport in self.server_ports
            if known[t]:
                adopt[t] = gpos[i]  # a SYN to a server port: known at once
            if not (flags & SYN and not flags & ACK) or dport in self.tls_ports or not (known[t] or self.detect):
                bad[t] = True
        d = self._directions(w, tid)
        after_rst = self._resets(w, tid)
        self._check(w, tid, d, after_rst)
        self._sniff(w, tid, gpos)

    def _where(self, addresses: list[str]) -> dict[str, int]:
        """Address -> its index in ``addresses`` (a list that only grows, shared by the windows of one read)."""
        if addresses is not self._addresses:
            self._addresses, self._index_of = addresses, {}
        where = self._index_of
        for i in range(len(where), len(addresses)):
            where[addresses[i]] = i
        return where

    def _resets(self, w: SegmentWindow, tid: np.ndarray) -> np.ndarray:
        """Segments after their connection's first RST (the RST itself included when it carries nothing)."""
        rst = (w.flags & RST) != 0
        order = np.argsort(tid, kind="stable")
        g = tid[order]
        r = rst[order].astype(np.int64)
        head = np.ones(len(g), bool)
        head[1:] = g[1:] != g[:-1]
        gstart = np.flatnonzero(head)
        group = np.cumsum(head) - 1
        cs = np.cumsum(r)
        before = (cs - r) - (cs - r)[gstart][group]
        after = np.empty(len(g), bool)
        after[order] = (before > 0) | self.rst.a[g]
        # payload after a reset is not decoded by the exact path (counted as after the end): not simple
        self.bad.a[tid[after & (w.plen > 0)]] = True
        seen = np.zeros(len(self.index), bool)
        seen[tid[rst]] = True
        self.rst.a[: len(seen)] |= seen
        return after | (rst & (w.plen == 0))

    def _directions(self, w: SegmentWindow, tid: np.ndarray) -> np.ndarray:
        """Each segment's direction: 0 from the client, 1 from the server."""
        where = self._where(w.addresses)
        active = np.unique(tid)
        code = np.full(len(self.index), -1, np.int64)
        for t in active.tolist():
            host, port = self.client[t]
            k = where.get(host)
            code[t] = -2 if k is None else (k << 16) | port
        src = (w.src.astype(np.int64) << 16) | w.sport.astype(np.int64)
        return (src != code[tid]).astype(np.int64)

    def _check(self, w: SegmentWindow, tid: np.ndarray, d: np.ndarray, after_rst: np.ndarray) -> None:
        dirid = tid * 2 + d
        nd = 2 * len(self.index)
        started = self.started.need(nd)
        expected = self.expected.need(nd)
        fin_seen = self.fin.need(nd)
        bad = self.bad.a
        order = np.argsort(dirid, kind="stable")
        g = dirid[order]
        flags = w.flags[order]
        seq = w.seq[order]
        plen = w.plen[order]
        n = len(g)
        head = np.ones(n, bool)
        head[1:] = g[1:] != g[:-1]
        gstart = np.flatnonzero(head)
        gid = g[gstart]
        group = np.cumsum(head) - 1
        syn = (flags & SYN) != 0
        ack = (flags & ACK) != 0
        fin = (flags & FIN) != 0
        wrong = w.missing[order] != 0
        quiet = after_rst[order]  # after a reset only payload matters (and is refused above)
        # a direction not yet started must open with its SYN (the server's with ACK), carrying nothing
        fresh = ~started[gid]
        first_ok = syn[gstart] & (ack[gstart] == (gid & 1).astype(bool)) & (plen[gstart] == 0) & ~fin[gstart]
        opened = np.zeros(n, bool)
        opened[gstart] = fresh
        wrong[gstart] |= fresh & ~first_ok
        wrong |= syn & ~opened  # any other SYN
        base = np.where(fresh, seq[gstart] + 1, expected[gid]) & _MASK32
        cs = np.cumsum(plen)
        before = cs - plen - (cs - plen)[gstart][group]  # payload bytes earlier in the same direction, this window
        want = (base[group] + before) & _MASK32
        relevant = ((plen > 0) | fin) & ~opened & ~quiet
        wrong |= relevant & (seq != want)
        # at most one FIN per direction, and nothing after it
        fin = fin & ~quiet
        fins_before = np.cumsum(fin) - fin - (np.cumsum(fin) - fin)[gstart][group] + fin_seen[gid][group]
        wrong |= (fins_before > 0) & relevant
        wrong_dir = np.zeros(len(gid), bool)
        np.logical_or.at(wrong_dir, group, wrong)
        bad[gid[wrong_dir] >> 1] = True
        total = np.add.reduceat(plen, gstart)
        expected[gid] = (base + total) & _MASK32
        started[gid] = True
        fin_seen[gid] |= np.logical_or.reduceat(fin, gstart)

    def _sniff(self, w: SegmentWindow, tid: np.ndarray, gpos: np.ndarray) -> None:
        """The first payload decides, as the reassembler does: a TLS record is not decoded; on another port it must look like memcached binary."""
        sniffed = self.sniffed.a
        with_payload = np.flatnonzero(w.plen > 0)
        if not len(with_payload):
            return
        t, at = np.unique(tid[with_payload], return_index=True)
        for tt, i in zip(t.tolist(), with_payload[at].tolist(), strict=True):
            if sniffed[tt]:
                continue
            sniffed[tt] = True
            p = int(w.poff[i])
            head = bytes(w.data[p : p + min(_HS, int(w.plen[i]))])
            if tls_record(head):
                self.bad.a[tt] = True
            elif not self.known.a[tt]:
                if plausible_start(head):
                    self.adopt.a[tt] = gpos[i]
                else:
                    self.bad.a[tt] = True


def _gpos(w: SegmentWindow) -> np.ndarray:
    """Each segment's position in the capture (:attr:`~dcpinspect.flows.reassembly.Segment.pos`: the packets of the files before it plus its number)."""
    return w.number + np.int64(w.base)


# --------------------------------------------------------------------------- pass 2


@dataclass
class _Half:
    """One direction of a simple connection while it is decoded."""

    conn: _Conn
    d: str
    end: int = 0  # stream offset after the bytes delivered so far
    base: int = 0  # stream offset of ``leftover[0]``
    leftover: bytes = b""
    decoder: FrameDecoder | None = None  # from the first header the walk did not accept
    dec_base: int = 0  # stream offset of the decoder's offset 0
    runs: np.ndarray = field(default_factory=lambda: np.zeros((0, 5), np.int64))  # (stream offset, gpos, ts, file index, number)
    finished: bool = False
    segments: int = 0
    half: HalfStream | None = None


@dataclass
class _Conn:
    """A simple connection while it is decoded."""

    tid: int
    gpos: int  # where it became known
    conn: Connection
    halves: dict[str, _Half] = field(default_factory=dict)
    gid: int = 0
    reset: bool = False


@dataclass
class _Rows:
    """Rows of a window before they are sorted: (k1, k2) and what they are."""

    k1: list[np.ndarray] = field(default_factory=list)
    k2: list[np.ndarray] = field(default_factory=list)
    kind: list[np.ndarray] = field(default_factory=list)  # 0 a walked frame, 1 an event, 2 a record
    ref: list[np.ndarray] = field(default_factory=list)  # index into walked frames / events / records
    # walked frames: where their bytes are, their stream offsets, connection, direction and packets
    bufs: list[bytes] = field(default_factory=list)
    w_buf: list[np.ndarray] = field(default_factory=list)
    w_start: list[np.ndarray] = field(default_factory=list)
    w_len: list[np.ndarray] = field(default_factory=list)
    w_off: list[np.ndarray] = field(default_factory=list)
    w_half: list[np.ndarray] = field(default_factory=list)
    w_first: list[np.ndarray] = field(default_factory=list)  # (gpos, ts, file, number) of the packet holding the first byte
    w_last: list[np.ndarray] = field(default_factory=list)
    w_count = 0
    # events of the decoders: (event, half, first run, last run, file) ...
    events: list[tuple[Event, _Half, np.ndarray, np.ndarray, int]] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    halves: list[_Half] = field(default_factory=list)
    half_index: dict[int, int] = field(default_factory=dict)

    def half(self, h: _Half) -> int:
        """``h``'s index in :attr:`halves`."""
        i = self.half_index.get(id(h))
        if i is None:
            i = self.half_index[id(h)] = len(self.halves)
            self.halves.append(h)
        return i

    def add(self, k1: np.ndarray, k2: np.ndarray, kind: int, ref: np.ndarray) -> None:
        self.k1.append(k1)
        self.k2.append(k2)
        self.kind.append(np.full(len(k1), kind, np.int8))
        self.ref.append(ref)


class _Decode:
    """Pass 2: simple connections as arrays, the rest through a :class:`Recorder`; rows in the exact path's order."""

    def __init__(
        self,
        proof: _Proof,
        paths: list[str],
        stats: CaptureStats,
        *,
        server_ports: Iterable[int],
        detect: bool,
        tls_ports: Iterable[int],
        max_body: int,
        reveal_secrets: bool,
        json_check: bool,
        rows: int,
        hole_wait: int | None,
        place: SetPlace = FIRST_SET,
        key_set: int = 0,
    ) -> None:
        self.proof = proof
        self.place = place
        self.key_set = key_set
        self.paths = paths
        self.file_index = {p: i for i, p in enumerate(paths)}
        self.stats = stats
        self.max_body = max_body
        self.json_check = json_check
        self.rows = rows
        self.exact = Recorder(
            server_ports=server_ports,
            detect=detect,
            tls_ports=tls_ports,
            max_body=max_body,
            reveal_secrets=reveal_secrets,
            hole_wait=hole_wait,
        )
        self.exact_seen = 0
        self.held: _Table | None = None  # rows whose place is not final yet (an exact connection holds segments before them)
        self._fi = 0  # the file index of the window being decoded
        self.exact_gid: dict[int, int] = {}  # the recorder's connection id -> the capture's
        self.sessions = Sessions({}, reveal_secrets)
        self.conns: dict[int, _Conn] = {}  # tuple -> its connection
        self.by_gid: dict[int, Connection] = {}
        self.next_gid = place.conn_base + 1
        self.number = place.frame_base
        self.last: tuple[int, int, str] | None = None  # (ts, number, path) of the capture's last segment
        self.pending: dict[int, _Conn] = {}  # simple connections not yet known (waiting for their first payload)
        self._k2: dict[int, int] = {}  # a packet's position -> the next k2 of the rows it emitted (this window)
        self.labels: dict[int, str] = {}  # connection id -> label
        self.known_at: dict[int, int] = {}  # connection id -> the position of the packet that made it known
        self.last_gpos = 0  # the capture's last segment's position

    # --- one window ---------------------------------------------------------------
    def window(self, w: SegmentWindow) -> Iterator[TablePart]:
        n = len(w.number)
        if not n:
            return
        fi = w.file_index
        gpos = _gpos(w)
        tid, _first, _new = _tuple_ids(w, self.proof.index)
        simple = ~self.proof.bad.a[tid]
        rows = _Rows()
        self._k2 = {}
        self._fi = fi
        adopted: list[tuple[int, int, Any]] = []  # (gpos, kind, what) of connections that became known
        self._exact(w, np.flatnonzero(~simple), gpos, rows, adopted)
        self._simple(w, np.flatnonzero(simple), tid, gpos, fi, rows, adopted)
        self.last = (int(w.ts[-1]), int(w.number[-1]), w.path)
        self.last_gpos = int(gpos[-1])
        # holes of exact connections given up up to here; what they held waits no more than the watermark says
        self._records(rows, self.exact.advance, self.last_gpos)
        self._adopt(adopted)
        yield from self._emit(rows, self.exact.reassembler.watermark())

    def _exact(self, w: SegmentWindow, idx: np.ndarray, gpos: np.ndarray, rows: _Rows, adopted: list[tuple[int, int, Any]]) -> None:
        """Feed the segments of exact 4-tuples to the recorder; note the records and connections they made."""
        if not len(idx):
            return
        rec = self.exact
        conns = rec.reassembler.connections
        addrs = w.addresses
        data = w.data
        path = w.path
        out = rows.records
        keys: tuple[list[int], list[int]] = ([], [])
        n0 = len(out)
        cols = [a[idx].tolist() for a in (w.ts, w.src, w.sport, w.dst, w.dport, w.seq, w.flags, w.poff, w.plen, w.missing, w.number, gpos)]
        for ts, src, sport, dst, dport, seq, flags, poff, plen, missing, number, g in zip(*cols, strict=True):
            got = rec.feed(
                Segment(ts, addrs[src], sport, addrs[dst], dport, seq, flags, bytes(data[poff : poff + plen]), missing, number, path, g),
                keys,
            )
            if len(conns) > self.exact_seen:
                for c in conns[self.exact_seen :]:
                    adopted.append((g, 1, c))
                self.exact_seen = len(conns)
            if got:
                out += got
        self._keyed(rows, keys, n0)

    def _records(self, rows: _Rows, take: Callable[..., list[Record]], *args: Any) -> None:
        """The recorder's records from ``take(*args, keys)`` as rows, with their keys."""
        keys: tuple[list[int], list[int]] = ([], [])
        n0 = len(rows.records)
        rows.records += take(*args, keys)
        self._keyed(rows, keys, n0)

    @staticmethod
    def _keyed(rows: _Rows, keys: tuple[list[int], list[int]], n0: int) -> None:
        if keys[0]:
            m = len(keys[0])
            rows.add(np.array(keys[0], np.int64), np.array(keys[1], np.int64), 2, np.arange(n0, n0 + m, dtype=np.int64))

    def _simple(
        self,
        w: SegmentWindow,
        idx: np.ndarray,
        tid: np.ndarray,
        gpos: np.ndarray,
        fi: int,
        rows: _Rows,
        adopted: list[tuple[int, int, Any]],
    ) -> None:
        """The segments of simple 4-tuples: connections, directions, frames."""
        if not len(idx):
            return
        t = tid[idx]
        # connections seen for the first time: known at their first packet (a SYN to a server port)
        ut, at = np.unique(t, return_index=True)
        for tt, i in zip(ut.tolist(), idx[at].tolist(), strict=True):
            c = self.conns.get(tt)
            if c is None:
                client = self.proof.client[tt]
                src = (w.addresses[int(w.src[i])], int(w.sport[i]))
                dst = (w.addresses[int(w.dst[i])], int(w.dport[i]))
                server = dst if src == client else src
                conn = Connection(0, client, server, file=w.path, syn_seen=True, role_source="syn", first_ts=int(w.ts[i]))
                c = self.conns[tt] = _Conn(tt, int(self.proof.adopt.a[tt]), conn)
                self.pending[tt] = c
        # connections known from this window on: at their SYN (a server port) or their first payload (detected)
        top = int(gpos[-1])
        for tt, c in list(self.pending.items()):
            if 0 <= c.gpos <= top:
                adopted.append((c.gpos, 0, c))
                del self.pending[tt]
        # per connection: packets, latest time and file
        counts = np.bincount(np.searchsorted(ut, t), minlength=len(ut))
        last = idx[len(idx) - 1 - np.unique(t[::-1], return_index=True)[1]]
        for tt, k, li in zip(ut.tolist(), counts.tolist(), last.tolist(), strict=True):
            conn = self.conns[tt].conn
            conn.packets += k
            conn.last_ts = int(w.ts[li])
            conn.last_file = w.path
        # per direction, in capture order
        client_src = self._client_mask(w, idx, t)
        dirid = t * 2 + (~client_src)
        order = np.argsort(dirid, kind="stable")
        sidx = idx[order]
        sd = dirid[order]
        head = np.ones(len(sd), bool)
        head[1:] = sd[1:] != sd[:-1]
        bounds = np.append(np.flatnonzero(head), len(sd))
        walks: list[tuple[_Half, list[Any], int]] = []
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            did = int(sd[a])
            c = self.conns[did >> 1]
            d = "s2c" if did & 1 else "c2s"
            h = c.halves.get(d)
            if h is None:
                h = c.halves[d] = _Half(c, d)
                c.conn.halves[d] = h.half = HalfStream(aligned=True, max_body=self.max_body, window=0)
            self._direction(w, h, sidx[a:b], gpos, fi, rows, walks)
        self._walk_all(walks, rows)
        # a reset ends every direction at its packet, after the payloads before it (none may follow it)
        rst = idx[(w.flags[idx] & RST) != 0]
        if len(rst):
            rt, at = np.unique(tid[rst], return_index=True)
            for tt, i in zip(rt.tolist(), rst[at].tolist(), strict=True):
                c = self.conns[tt]
                if not c.reset:
                    c.reset = True
                    for h in c.halves.values():
                        self._finish(h, int(gpos[i]), rows)
                    c.conn.closed = True

    def _client_mask(self, w: SegmentWindow, idx: np.ndarray, t: np.ndarray) -> np.ndarray:
        where = self.proof._where(w.addresses)
        ut = np.unique(t)
        code = {}
        for tt in ut.tolist():
            host, port = self.conns[tt].conn.client
            code[tt] = (where[host] << 16) | port
        cc = np.array([code[x] for x in ut.tolist()], np.int64)[np.searchsorted(ut, t)]
        src = (w.src[idx].astype(np.int64) << 16) | w.sport[idx].astype(np.int64)
        return src == cc

    def _direction(
        self, w: SegmentWindow, h: _Half, pk: np.ndarray, gpos: np.ndarray, fi: int, rows: _Rows, walks: list[tuple[_Half, list[Any], int]]
    ) -> None:
        """One direction's segments of this window (capture order): deliver payloads (walked later, all at once), finish at FIN."""
        flags = w.flags[pk]
        if flags[0] & SYN:
            h.conn.conn.isn[h.d] = int(w.seq[pk[0]])
        pay = pk[w.plen[pk] > 0]
        fins = pk[(flags & FIN) != 0]
        fin = int(gpos[fins[0]]) if len(fins) else -1
        if len(pay):
            h.conn.conn.sniffed = True
            plen = w.plen[pay]
            offs = h.end + np.concatenate(([0], np.cumsum(plen)[:-1]))
            runs = np.stack([offs, gpos[pay], w.ts[pay], np.full(len(pay), fi, np.int64), w.number[pay]], 1)
            h.runs = np.concatenate((h.runs, runs)) if len(h.runs) else runs
            total = int(plen.sum())
            h.segments += len(pay)
            assert h.half is not None
            h.half.segments += len(pay)
            h.half.bytes += total
            data = memoryview(w.data)  # views: the bytes are copied once, into the window's buffer
            pieces = [data[p : p + q] for p, q in zip(w.poff[pay].tolist(), plen.tolist(), strict=True)]
            h.end += total
            if h.decoder is None:
                walks.append((h, [h.leftover, *pieces], fin))  # a FIN waits for the walk
                return
            self._feed(h, [bytes(p) for p in pieces], len(h.runs) - len(pay), rows)
        if fin >= 0:
            self._finish(h, fin, rows)

    def _walk_all(self, walks: list[tuple[_Half, list[Any], int]], rows: _Rows) -> None:
        """The directions' new bytes joined into one buffer (the window's), each walked in its own region."""
        if not walks:
            return
        sizes = [sum(map(len, pieces)) for _h, pieces, _fin in walks]
        buf = b"".join([p for _h, pieces, _fin in walks for p in pieces])
        j = len(rows.bufs)
        rows.bufs.append(buf)
        mv = memoryview(buf)
        at = 0
        for (h, _pieces, fin), size in zip(walks, sizes, strict=True):
            self._walk(h, mv, j, at, at + size, rows)
            at += size
            if fin >= 0:
                self._finish(h, fin, rows)

    def _walk(self, h: _Half, mv: memoryview, j: int, a: int, b: int, rows: _Rows) -> None:
        """Frames back to back from ``mv[a]`` (stream offset ``h.base``) to ``mv[b]``; the rest waits, or goes to a decoder."""
        starts, stop, implausible = frame_walk(mv[a:b], self.max_body)
        base = h.base
        if len(starts):
            ends = np.append(starts[1:], stop)
            lens = ends - starts
            off = base + starts
            first = np.searchsorted(h.runs[:, 0], off, "right") - 1
            last = np.searchsorted(h.runs[:, 0], off + lens - 1, "right") - 1
            k1 = h.runs[last, 1]
            k2 = _rank(last)
            k2[k1 == k1[0]] += self._k2_start(h, int(k1[0]))
            m = len(starts)
            rows.w_buf.append(np.full(m, j, np.int64))
            rows.w_start.append(starts + a)
            rows.w_len.append(lens)
            rows.w_off.append(off)
            rows.w_half.append(np.full(m, rows.half(h), np.int64))
            rows.w_first.append(h.runs[first])
            rows.w_last.append(h.runs[last])
            ref = np.arange(rows.w_count, rows.w_count + m, dtype=np.int64)
            rows.w_count += m
            rows.add(k1, k2, 0, ref)
            self._note_k2(h, int(k1[-1]), int(k2[-1]) + 1)
        h.base = base + stop
        rest = bytes(mv[a + stop : b])
        if implausible:
            # from here on the decoder itself, packet by packet (at a frame boundary: a fresh aligned decoder's state)
            h.decoder = FrameDecoder(max_body=self.max_body)
            h.dec_base = h.base
            r = int(np.searchsorted(h.runs[:, 0], h.base, "right") - 1)
            offs = h.runs[r:, 0] - h.base
            offs[0] = 0
            pieces = [rest[x:y] for x, y in zip(offs.tolist(), [*offs[1:].tolist(), len(rest)], strict=True)]
            h.leftover = b""
            self._feed(h, pieces, r, rows)
        else:
            h.leftover = rest
            self._trim_runs(h, h.base)

    def _feed(self, h: _Half, pieces: list[bytes], r0: int, rows: _Rows) -> None:
        """Feed the decoder one packet's bytes at a time (``pieces[i]`` belongs to run ``r0 + i``)."""
        dec = h.decoder
        assert dec is not None
        for i, piece in enumerate(pieces):
            evs = dec.feed(piece)
            if evs:
                self._events(h, evs, h.runs[r0 + i], rows)
        self._trim_runs(h, h.dec_base + dec.offset - dec.buffered)

    def _events(self, h: _Half, evs: list[Event], emitted_by: np.ndarray, rows: _Rows) -> None:
        """Decoder events emitted at run ``emitted_by`` (a packet; or the end of the capture)."""
        g = int(emitted_by[1])
        k2 = self._k2_start(h, g)
        base = len(rows.events)
        rows.events += [(ev, h, first, last, -1) for ev, first, last in _placed(h, evs)]
        m = len(evs)
        rows.add(np.full(m, g, np.int64), np.arange(k2, k2 + m, dtype=np.int64), 1, np.arange(base, base + m, dtype=np.int64))
        self._note_k2(h, g, k2 + m)

    def _finish(self, h: _Half, g: int, rows: _Rows) -> None:
        """The direction's FIN (everything before it delivered): what the decoder still holds, as at the end of a stream."""
        if h.finished:
            return
        h.finished = True
        evs = self._close_events(h)
        if evs:
            base = len(rows.events)
            k2 = self._k2_start(h, g)
            file_i = self._fi  # the file of the packet that ended it (this window's)
            for ev, first, last in evs:
                rows.events.append((ev, h, first, last, file_i))
            m = len(evs)
            rows.add(np.full(m, g, np.int64), np.arange(k2, k2 + m, dtype=np.int64), 1, np.arange(base, base + m, dtype=np.int64))
            self._note_k2(h, g, k2 + m)
        if h.half is not None:
            h.half.closed = True

    def _close_events(self, h: _Half) -> list[tuple[Event, np.ndarray, np.ndarray]]:
        if h.decoder is None:
            if not h.leftover:
                return []
            h.decoder = FrameDecoder(max_body=self.max_body)
            h.dec_base = h.base
            pre = h.decoder.feed(h.leftover)
            h.leftover = b""
        else:
            pre = []
        return _placed(h, pre + h.decoder.close())

    # k2: a row's order among the rows emitted by one packet (one direction's: a packet has one)
    def _k2_start(self, h: _Half, g: int) -> int:
        return self._k2.get(g, 0)

    def _note_k2(self, h: _Half, g: int, nxt: int) -> None:
        self._k2[g] = nxt

    @staticmethod
    def _trim_runs(h: _Half, keep_from: int) -> None:
        """Forget the runs wholly before stream offset ``keep_from`` (no byte still held is in them)."""
        runs = h.runs
        if len(runs) > 1:
            r = int(np.searchsorted(runs[:, 0], keep_from, "right") - 1)
            if r > 0:
                h.runs = runs[r:]

    def _adopt(self, adopted: list[tuple[int, int, Any]]) -> None:
        """Number the connections that became known in this window, in that order."""
        adopted.sort(key=lambda x: (x[0], x[1]))
        for g, kind, what in adopted:
            gid = self.next_gid
            self.next_gid += 1
            self.known_at[gid] = g
            if kind == 0:
                what.gid = gid
                what.conn.id = gid
                self.by_gid[gid] = what.conn
            else:
                self.exact_gid[what.id] = gid
                self.by_gid[gid] = what

    # --- rows out -------------------------------------------------------------------
    def _emit(self, rows: _Rows, watermark: int) -> Iterator[TablePart]:
        """The rows of a window in the exact path's order, as record batches of at most ``self.rows`` rows.

        Rows at or above ``watermark`` (an exact connection still holds
        segments from that position on, whose rows would go before them)
        are held, with their bytes, until a later window passes them.
        """
        t = self.held
        self.held = None
        if rows.k1:
            k1 = np.concatenate(rows.k1)
            # the rows of one k1 were added in k2 order: a stable sort by k1 is the (k1, k2) order, and cheap on these few sorted runs
            order = np.argsort(k1, kind="stable")
            kind = np.concatenate(rows.kind)[order]
            ref = np.concatenate(rows.ref)[order]
            new = self._table(kind, ref, rows)
            new.k1 = k1[order]
            new.k2 = np.concatenate(rows.k2)[order]
            new.ck = np.array([self.known_at.get(g, 0) for g in range(max(self.known_at, default=0) + 1)], np.int64)[new.gid]
            if t is None:
                t = new
            else:
                t = t.concat(new, self.labels)
                order = np.lexsort((t.k2, t.k1))
                if (np.diff(order) != 1).any():
                    t = t.take(order)
        if t is None:
            return
        n = len(t.k1)
        m = n if not n or int(t.k1[-1]) < watermark else int(np.searchsorted(t.k1, watermark, "left"))
        if m < n:
            self.held = t.take(np.arange(m, n), compact=True)
        for a in range(0, m, self.rows):
            b = min(m, a + self.rows)
            first = self.number + 1
            self.number += b - a
            yield TablePart(t, a, b, self.paths, first, self._batch, place=self.place, key_set=self.key_set)

    def _table(self, kind: np.ndarray, ref: np.ndarray, rows: _Rows) -> _Table:
        """Every row's record columns, bytes and context as arrays (walked frames at once; events and records one by one)."""
        n = len(kind)
        w = _Walked.of(rows)
        t = _Table(n)
        halves = rows.halves
        half_gid = np.array([h.conn.gid for h in halves], np.int64)
        half_dir = np.array([h.d == "s2c" for h in halves], np.int64)
        for h in halves:
            self.labels[h.conn.gid] = h.conn.conn.label
        sizes = np.fromiter(map(len, rows.bufs), np.int64, len(rows.bufs))
        bufbase = np.zeros(len(sizes), np.int64)
        if len(sizes):
            np.cumsum(sizes[:-1], out=bufbase[1:])
        w0 = np.flatnonzero(kind == 0)
        r0 = ref[w0]
        if len(w0):
            hw = w.half_ids[r0]
            first, last = w.first[r0], w.last[r0]
            t.gid[w0] = half_gid[hw]
            t.dir[w0] = half_dir[hw]
            t.file[w0] = last[:, 3]
            t.ts[w0], t.ts_first[w0] = last[:, 2], first[:, 2]
            t.packet[w0], t.packet_first[w0] = last[:, 4], first[:, 4]
            t.is_frame[w0] = True
            t.start[w0] = bufbase[w.buf[r0]] + w.start[r0]
            t.length[w0] = w.length[r0]
            t.offset[w0] = w.off[r0]
        extra: list[bytes] = []
        at = int(sizes.sum())
        for i in np.flatnonzero(kind != 0).tolist():
            r = int(ref[i])
            if kind[i] == 1:
                ev, h, first_run, last_run, file_i = rows.events[r]
                t.gid[i], t.dir[i] = h.conn.gid, h.d == "s2c"
                self.labels[h.conn.gid] = h.conn.conn.label
                t.file[i] = int(last_run[3]) if file_i < 0 else file_i
                t.ts[i], t.ts_first[i] = int(last_run[2]), int(first_run[2])
                t.packet[i], t.packet_first[i] = int(last_run[4]), int(first_run[4])
            else:
                rec = rows.records[r]
                ev = rec.event
                gid = self.exact_gid.get(rec.conn, 0)  # 0: a connection the reassembler never adopted (its rows say 0 there too)
                self.labels[gid] = rec.conn_label
                t.gid[i], t.dir[i], t.file[i] = gid, rec.direction == "s2c", self.file_index[rec.file]
                t.ts[i], t.ts_first[i], t.packet[i], t.packet_first[i] = rec.ts, rec.ts_first, rec.packet, rec.packet_first
                t.fixed[i] = rec.context
            t.events[i] = ev
            if ev.__class__ is Frame and ev[2] == "mcbp":
                raw = ev[1]
                t.is_frame[i] = True
                t.start[i], t.length[i], t.offset[i] = at, len(raw), ev[0]
                extra.append(raw)
                at += len(raw)
        t.joined = rows.bufs[0] if len(rows.bufs) == 1 and not extra else b"".join([*rows.bufs, *extra])
        t.labels = _labels(t.gid, self.labels)
        self._contexts(t, kind)
        return t

    def _contexts(self, t: _Table, kind: np.ndarray) -> None:
        """Each row's dissection context: a record's own; on a simple connection, what its session negotiated before the row."""
        codes: dict[int, int] = {}

        def code(c: DissectContext) -> int:
            k = codes.get(id(c))
            if k is None:
                k = codes[id(c)] = len(t.contexts)
                t.contexts.append(c)
            return k

        ours = np.flatnonzero(kind != 2)
        state = self.sessions.state
        by_gid = self.by_gid
        gids = np.unique(t.gid[ours]).tolist()
        base = np.zeros(max(gids, default=0) + 1, np.int64)
        for g in gids:
            base[g] = code(state(by_gid[g]).context)
        t.ctx[ours] = base[t.gid[ours]]
        for i in np.flatnonzero(kind == 2).tolist():
            t.ctx[i] = code(t.fixed[i])
        # the session commands of simple connections, in order: each changes what the rows after it mean
        buf = np.frombuffer(t.joined, np.uint8)
        framed = ours[t.is_frame[ours]]
        opcode = buf[t.start[framed] + 1] if len(framed) else np.zeros(0, np.uint8)
        session = framed[np.isin(opcode, _SESSION_OPS)]
        changes: dict[int, list[tuple[int, int]]] = {}
        for i in session.tolist():
            g = int(t.gid[i])
            st = state(by_gid[g])
            before = st.context
            st.observe("s2c" if t.dir[i] else "c2s", t.frame(i))
            if st.context is not before:
                changes.setdefault(g, []).append((i, code(st.context)))
        for g, ch in changes.items():
            mine = ours[t.gid[ours] == g]
            pos = np.array([p for p, _c in ch], np.int64)
            after = np.array([base[g]] + [c for _p, c in ch], np.int64)
            t.ctx[mine] = after[np.searchsorted(pos, mine, "left")]

    def _batch(self, t: _Table, a: int, b: int, first_number: int) -> pa.RecordBatch:
        """Rows ``a:b`` of the window as a record batch, numbered from ``first_number``."""
        n = b - a
        is_frame = t.is_frame[a:b]
        fr = np.flatnonzero(is_frame)

        def dissect_rows(which: np.ndarray) -> FrameColumns:
            cols = FrameColumns()
            for i in (which + a).tolist():
                cols.add(Record(0, "", 0, "", "", 0, 0, 0, 0, t.event(i), t.contexts[int(t.ctx[i])]))
            return cols

        rows = FrameRows(
            n,
            fr,
            t.joined,
            t.start[a:b][fr],
            t.length[a:b][fr],
            t.offset[a:b][fr],
            t.ctx[a:b][fr],
            t.contexts,
            dissect_rows,
            self.json_check,
        )
        cols = value_columns(rows)
        gid = t.gid[a:b]
        cols["file"] = pa.array(self.paths, pa.string()).take(pa.array(t.file[a:b]))
        cols["frame"] = pa.array(np.arange(first_number, first_number + n, dtype=np.int64))
        cols.update(set_columns(self.place.capture_set, first_number - self.place.frame_base, n))
        cols["conn_id"] = pa.array(gid.astype(np.int32))
        cols["conn"] = t.labels.take(pa.array(gid))
        cols["dir"] = _DIRS.take(pa.array(t.dir[a:b]))
        tstype = SCHEMA.field("ts").type
        cols["ts"] = ts_array(t.ts[a:b], tstype)
        cols["ts_first"] = ts_array(t.ts_first[a:b], tstype)
        cols["packet"] = pa.array(t.packet[a:b])
        cols["packet_first"] = pa.array(t.packet_first[a:b])
        return pa.RecordBatch.from_arrays([cols[f.name] for f in SCHEMA], schema=SCHEMA)

    # --- the end ------------------------------------------------------------------------
    def close(self) -> Iterator[TablePart]:
        """The end of the capture: what every connection still holds, in connection order."""
        rows = _Rows()
        if self.last is not None:
            ts, number, path = self.last
            # the recorder's end of capture is the capture's last segment, whichever 4-tuple it belonged to
            sentinel = Segment(ts, "0.0.0.0", 0, "0.0.0.0", 0, 0, 0, b"", 0, number, path, self.last_gpos)
            self._records(rows, self.exact.feed, sentinel)
        keys: tuple[list[int], list[int]] = ([], [])
        recs = self.exact.close(keys)
        conns = self.exact.reassembler.connections
        end = self.last_gpos
        adopted: list[tuple[int, int, Any]] = [(end, 1, c) for c in conns[self.exact_seen :]]
        self.exact_seen = len(conns)
        self._adopt(adopted)
        k1: list[int] = []
        kind: list[int] = []
        ref: list[int] = []
        placed: tuple[list[int], list[int]] = ([], [])
        n0 = len(rows.records)
        for r, rk1, rk2 in zip(recs, *keys, strict=True):
            if rk1 < CLOSE_BASE:  # held behind a hole given up at the end: its own place
                rows.records.append(r)
                placed[0].append(rk1)
                placed[1].append(rk2)
        self._keyed(rows, placed, n0)
        for r, rk1 in zip(recs, keys[0], strict=True):
            if rk1 < CLOSE_BASE:
                continue
            rows.records.append(r)
            k1.append(CLOSE_BASE + self.known_at.get(self.exact_gid.get(r.conn, 0), 0))
            kind.append(2)
            ref.append(len(rows.records) - 1)
        for c in self.conns.values():
            if c.gid == 0:
                continue  # never known (its first payload never came): nothing to say
            for h in c.halves.values():
                if h.finished:
                    continue
                h.finished = True
                file_i = self.file_index.get(c.conn.last_file, 0)
                for ev, first, last in self._close_events(h):
                    rows.events.append((ev, h, first, last, file_i))
                    k1.append(CLOSE_BASE + self.known_at[c.gid])
                    kind.append(1)
                    ref.append(len(rows.events) - 1)
                if h.half is not None:
                    h.half.closed = True
            c.conn.closed = True
        if k1:
            k1a = np.array(k1, np.int64)
            order = np.argsort(k1a, kind="stable")  # connection order; within one, as they came
            k2a = np.empty(len(k1a), np.int64)
            k2a[order] = _rank(k1a[order])
            rows.add(k1a, k2a, 0, np.zeros(0, np.int64))
            rows.kind[-1] = np.array(kind, np.int8)
            rows.ref[-1] = np.array(ref, np.int64)
        yield from self._emit(rows, CLOSE_BASE << 1)
        assert self.held is None
        self._stats()

    def _stats(self) -> None:
        st = self.stats
        st.skipped.update(self.exact.stats.skipped)
        st.skipped["not memcached-binary TCP"] -= 1 if self.last is not None else 0
        if not st.skipped["not memcached-binary TCP"]:
            del st.skipped["not memcached-binary TCP"]
        exact_states = self.exact.stats.states
        if 0 in exact_states:  # a connection the reassembler never adopted, yet which emitted rows
            st.states[0] = exact_states[0]
        for c in self.exact.reassembler.connections:
            gid = self.exact_gid[c.id]
            if c.id in exact_states:
                st.states[gid] = exact_states[c.id]
            c.id = gid
        for gid, state in self.sessions.states.items():
            st.states[gid] = state
        st.connections[:] = [self.by_gid[g] for g in sorted(self.by_gid)]
        st.states = dict(sorted(st.states.items()))
        st.records = self.number


def _labels(gid: np.ndarray, labels: dict[int, str]) -> pa.Array:
    """The labels of the connections ``gid`` names, as an array indexed by connection id (nulls between)."""
    ids = np.unique(gid).tolist()
    names: list[str | None] = [None] * (ids[-1] + 1 if ids else 0)
    for g in ids:
        names[g] = labels[g]
    return pa.array(names, pa.string())


def _rank(last: np.ndarray) -> np.ndarray:
    """Each element's index among the equal elements before it (``last`` is non-decreasing)."""
    n = len(last)
    head = np.ones(n, bool)
    head[1:] = last[1:] != last[:-1]
    starts = np.flatnonzero(head)
    return np.arange(n, dtype=np.int64) - np.repeat(starts, np.diff(np.append(starts, n)))


def _placed(h: _Half, evs: list[Event]) -> list[tuple[Event, np.ndarray, np.ndarray]]:
    """Decoder events in their stream, with the runs (packets) of their first and last byte (as the reassembler dates them)."""
    out = []
    at = h.runs[:, 0]
    for raw_ev in evs:
        ev = _shift(raw_ev, h.dec_base)
        off = ev.offset
        first = h.runs[int(np.searchsorted(at, off, "right") - 1)]
        last = h.runs[int(np.searchsorted(at, off + max(ev.length, 1) - 1, "right") - 1)]
        out.append((ev, first, last))
    return out


def _shift(ev: Event, by: int) -> Event:
    """A decoder event moved ``by`` bytes along its stream."""
    if not by:
        return ev
    if ev.__class__ is Frame:
        return Frame(ev[0] + by, ev[1], ev[2])
    from dataclasses import replace

    return replace(ev, offset=ev.offset + by)  # type: ignore[type-var]


@dataclass
class _Walked:
    """The walked frames of a window, by their index."""

    bufs: list[bytes]
    buf: np.ndarray
    start: np.ndarray
    length: np.ndarray
    off: np.ndarray
    half_ids: np.ndarray
    first: np.ndarray
    last: np.ndarray

    @classmethod
    def of(cls, rows: _Rows) -> _Walked:
        def cat(xs: list[np.ndarray], shape: tuple[int, ...] = (0,)) -> np.ndarray:
            return np.concatenate(xs) if xs else np.zeros(shape, np.int64)

        return cls(
            rows.bufs,
            cat(rows.w_buf),
            cat(rows.w_start),
            cat(rows.w_len),
            cat(rows.w_off),
            cat(rows.w_half),
            cat(rows.w_first, (0, 5)),
            cat(rows.w_last, (0, 5)),
        )


class _Table:
    """A window's rows in order: record columns as arrays, frame bytes in one buffer, contexts by code."""

    def __init__(self, n: int) -> None:
        self.gid = np.zeros(n, np.int64)
        self.dir = np.zeros(n, np.int64)
        self.file = np.zeros(n, np.int64)
        self.ts = np.zeros(n, np.int64)
        self.ts_first = np.zeros(n, np.int64)
        self.packet = np.zeros(n, np.int64)
        self.packet_first = np.zeros(n, np.int64)
        self.is_frame = np.zeros(n, bool)
        self.start = np.zeros(n, np.int64)
        self.length = np.zeros(n, np.int64)
        self.offset = np.zeros(n, np.int64)
        self.ctx = np.zeros(n, np.int64)
        self.contexts: list[DissectContext] = []
        self.events: dict[int, Event] = {}  # rows that are not walked frames
        self.fixed: dict[int, DissectContext] = {}  # the records' own contexts
        self.joined = b""
        self.k1 = self.k2 = self.ck = np.zeros(0, np.int64)
        self.labels = pa.array([], pa.string())  # connection id -> label

    _ARRAYS = (
        "gid",
        "dir",
        "file",
        "ts",
        "ts_first",
        "packet",
        "packet_first",
        "is_frame",
        "start",
        "length",
        "offset",
        "ctx",
        "k1",
        "k2",
        "ck",
    )

    def take(self, idx: np.ndarray, *, compact: bool = False) -> _Table:
        """Rows ``idx``, in that order (``compact``: with only their own bytes and contexts, to be kept for long)."""
        u = _Table(0)
        for name in self._ARRAYS:
            setattr(u, name, getattr(self, name)[idx])
        if self.events:
            at = {i: j for j, i in enumerate(idx.tolist())}
            u.events = {at[i]: ev for i, ev in self.events.items() if i in at}
        u.labels, u.contexts, u.joined = self.labels, self.contexts, self.joined
        if compact:
            framed = np.flatnonzero(u.is_frame)
            starts, lengths = u.start[framed].tolist(), u.length[framed].tolist()
            joined = self.joined
            u.joined = b"".join([joined[a : a + n] for a, n in zip(starts, lengths, strict=True)])
            u.start = np.zeros(len(idx), np.int64)
            if len(framed):
                u.start[framed[1:]] = np.cumsum(u.length[framed])[:-1]
            codes, u.ctx = np.unique(u.ctx, return_inverse=True)
            u.ctx = u.ctx.astype(np.int64)
            u.contexts = [self.contexts[c] for c in codes.tolist()]
        return u

    def concat(self, other: _Table, labels: dict[int, str]) -> _Table:
        """These rows, then ``other``'s (``labels``: every connection's, by id)."""
        u = _Table(0)
        n = len(self.gid)
        for name in self._ARRAYS:
            setattr(u, name, np.concatenate((getattr(self, name), getattr(other, name))))
        u.start[n:] += len(self.joined)
        u.ctx[n:] += len(self.contexts)
        u.contexts = self.contexts + other.contexts
        u.events = dict(self.events)
        u.events.update({i + n: ev for i, ev in other.events.items()})
        u.joined = self.joined + other.joined
        u.labels = _labels(u.gid, labels)
        return u

    def frame(self, i: int) -> Frame:
        """Row ``i``'s frame (an mcbp frame row)."""
        ev = self.events.get(i)
        if ev is not None:
            return ev  # type: ignore[return-value]
        s = int(self.start[i])
        return Frame(int(self.offset[i]), self.joined[s : s + int(self.length[i])])

    def event(self, i: int) -> Event:
        """Row ``i``'s event."""
        ev = self.events.get(i)
        return ev if ev is not None else self.frame(i)


_tnew = tuple.__new__
#: the ``direction`` codes of :class:`PartArrays` (and of a window's rows)
DIRECTIONS = ("c2s", "s2c")
_DIRS = pa.array(DIRECTIONS, pa.string())
_SESSION_OPS = np.array(sorted(SESSION_OPS), np.uint8)


def _pick(values: Sequence[int] | np.ndarray, at: np.ndarray) -> list[int]:
    """``values`` at positions ``at``, as Python ints."""
    if isinstance(values, np.ndarray):
        return values[at].tolist()
    return [values[i] for i in at.tolist()]


class PartArrays(NamedTuple):
    """A part's rows as arrays (one entry per row), and the bytes of its frames."""

    conn: np.ndarray  # the connection id
    direction: np.ndarray  # an index into DIRECTIONS
    ts: np.ndarray
    framed: np.ndarray  # an mcbp frame (the others are gaps and other events)
    start: np.ndarray  # where the frame starts in ``joined``
    length: np.ndarray  # its length
    joined: bytes


@dataclass
class TablePart:
    """Rows of the frames table and what made them: each row's event, bytes and dissection context, and its record.

    The Arrow batch is built when first asked for: a reader of records only
    (the timeline) never pays for the columns.
    """

    _t: _Table
    _a: int
    _b: int
    _paths: list[str]
    first: int  # the frame number of the first row
    _make: Callable[[_Table, int, int, int], pa.RecordBatch]
    _batch: pa.RecordBatch | None = None
    place: SetPlace = FIRST_SET  # its capture set, and the frames and connections of the sets before it
    key_set: int = 0  # not 0: :attr:`keys` are the run's keys of this capture set (:func:`set_keys`)

    @property
    def batch(self) -> pa.RecordBatch:
        """The rows as a record batch of the frames table."""
        if self._batch is None:
            self._batch = self._make(self._t, self._a, self._b, self.first)
        return self._batch

    def __len__(self) -> int:
        return self._b - self._a

    @property
    def keys(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each row's numbering keys ``k1``, ``k2`` and its connection's ``ck``.

        ``k1`` is the position of the packet that emitted the row (or
        :data:`CLOSE_BASE` plus its connection's ``ck``), ``k2`` its order
        among the rows of that ``k1``, ``ck`` the position of the packet that
        made its connection known.  Frame numbers follow ``(k1, k2)`` order and connection ids ``ck``
        order, whatever part of a capture was read: how Spark's tasks number
        the rows of the connections each one reads.
        """
        t, a, b = self._t, self._a, self._b
        if self.key_set:
            k1, ck = set_keys(t.k1[a:b], t.ck[a:b], self.key_set)
            return k1, t.k2[a:b], ck
        return t.k1[a:b], t.k2[a:b], t.ck[a:b]

    def events(self) -> list[Event]:
        """Each row's event (frames are rebuilt from the window's bytes)."""
        return self._events_at(np.arange(self._a, self._b))

    def _events_at(self, idx: np.ndarray) -> list[Event]:
        """The events of rows ``idx`` (indices into the window)."""
        t = self._t
        joined, other = t.joined, t.events
        spans = zip(idx.tolist(), t.start[idx].tolist(), t.length[idx].tolist(), t.offset[idx].tolist(), strict=True)
        return [
            other[i] if i in other else _tnew(Frame, (off, joined[s : s + n], "mcbp"))  # the decoder's own way to make one
            for i, s, n, off in spans
        ]

    def contexts(self) -> list[DissectContext]:
        """The context each row was dissected with."""
        t = self._t
        return [t.contexts[c] for c in t.ctx[self._a : self._b].tolist()]

    def arrays(self) -> PartArrays:
        """The part's rows as arrays: what a bulk reader of frames needs besides the columns (see :class:`PartArrays`)."""
        t, a, b = self._t, self._a, self._b
        return PartArrays(t.gid[a:b], t.dir[a:b], t.ts[a:b], t.is_frame[a:b], t.start[a:b], t.length[a:b], t.joined)

    def records_at(
        self, rows: Sequence[int], numbers: Sequence[int] | np.ndarray | None = None, conns: Sequence[int] | np.ndarray | None = None
    ) -> list[Record]:
        """The records of rows ``rows`` (indices into the part), numbered by ``numbers`` and ``conns`` (one per row of the part) if given."""
        t, a = self._t, self._a
        idx = np.asarray(rows, np.int64) + a
        if not len(idx):
            return []
        labels = t.labels.to_pylist()
        paths, contexts = self._paths, t.contexts
        gids = t.gid[idx].tolist()
        rel = idx - a
        num = (rel + self.first).tolist() if numbers is None else _pick(numbers, rel)
        cks = gids if conns is None else _pick(conns, rel)
        cset, base = self.place.capture_set, self.place.frame_base
        return [
            Record(number, paths[f], conn, labels[gid], DIRECTIONS[d], ts, ts_first, packet, packet_first, ev, contexts[ctx], cset, base)
            for number, conn, gid, f, d, ts, ts_first, packet, packet_first, ctx, ev in zip(
                num,
                cks,
                gids,
                t.file[idx].tolist(),
                t.dir[idx].tolist(),
                t.ts[idx].tolist(),
                t.ts_first[idx].tolist(),
                t.packet[idx].tolist(),
                t.packet_first[idx].tolist(),
                t.ctx[idx].tolist(),
                self._events_at(idx),
                strict=True,
            )
        ]

    def records(self) -> Iterator[Record]:
        """The rows as :class:`~dcpinspect.flows.records.Record` objects (what the timeline and the live tools take)."""
        return iter(self.records_at(range(len(self))))


def read_parts(
    paths: Iterable[str],
    *,
    rows: int = 65536,
    server_ports: Iterable[int] = DEFAULT_SERVER_PORTS,
    detect: bool = True,
    tls_ports: Iterable[int] = TLS_PORTS,
    max_body: int = DEFAULT_MAX_BODY,
    stats: CaptureStats | None = None,
    reveal_secrets: bool = False,
    json_check: bool = True,
    progress: Callable[[str, int], None] | None = None,
    window: int = _WINDOW,
    hole_wait: int | None = None,
    capture_sets: Plan = "auto",
) -> Iterator[TablePart]:
    """The frames table of capture files in parts of at most ``rows`` rows, each capture set read in order as one capture.

    ``stats`` gets what the read saw besides frames (per-file reports,
    skipped packets, connections, what each negotiated); ``json_check=False``
    leaves values flagged JSON unchecked (the ``json_check`` column says
    ``not checked``); ``progress(path, offset)`` is called as the files are
    read; ``hole_wait`` is how many packets a hole in a TCP stream is waited
    for (:class:`~dcpinspect.flows.reassembly.Reassembler`).  Unreadable files are reported in ``stats.files``, never raised.
    ``capture_sets`` is ``auto``, ``one`` or ``per-file``
    (:func:`~dcpinspect.capture.sets.plan_capture_sets`): a part holds rows
    of one set (:attr:`TablePart.place`); ``stats.sets`` gets the plan.
    """
    st = stats if stats is not None else CaptureStats()

    def one(files: list[str], sub: CaptureStats, place: SetPlace) -> Iterator[TablePart]:
        return _read_set(
            files,
            sub,
            place,
            rows=rows,
            server_ports=server_ports,
            detect=detect,
            tls_ports=tls_ports,
            max_body=max_body,
            reveal_secrets=reveal_secrets,
            json_check=json_check,
            progress=progress,
            window=window,
            hole_wait=hole_wait,
        )

    return read_sets([str(p) for p in paths], capture_sets, st, one)


def _read_set(
    paths: list[str],
    st: CaptureStats,
    place: SetPlace,
    *,
    rows: int,
    server_ports: Iterable[int],
    detect: bool,
    tls_ports: Iterable[int],
    max_body: int,
    reveal_secrets: bool,
    json_check: bool,
    progress: Callable[[str, int], None] | None,
    window: int,
    hole_wait: int | None,
) -> Iterator[TablePart]:
    """:func:`read_parts` of one capture set."""
    import os

    from .packets_vector import forget_pages, segment_windows

    size = sum(os.path.getsize(p) for p in paths if os.path.isfile(p))
    cache: list[SegmentWindow] | None = [] if size <= _CACHE_BYTES else None

    def windows(first: bool) -> Iterator[SegmentWindow]:
        # small captures: the proof's pass keeps its windows (packet arrays over the mmap) for the decode; big ones are read twice
        nonlocal cache
        if first:
            kept = 0
            for w in segment_windows(paths, st, window=window, progress=progress if cache is not None else None):
                if cache is not None:
                    kept += len(w.number)
                    if kept <= _CACHE_SEGMENTS:
                        cache.append(w)
                    else:
                        cache = None
                yield w
        elif cache is not None:
            done, cache = cache, None
            dropped, path = 0, None
            for w in done:
                if w.path != path:
                    dropped, path = 0, w.path
                yield w
                dropped = forget_pages(w.data, dropped, w.end)  # the pages behind it, as the first pass did
        else:
            yield from segment_windows(paths, CaptureStats(), window=window, progress=progress if size > _CACHE_BYTES else None)

    return decode_windows(
        windows,
        paths,
        stats=st,
        rows=rows,
        server_ports=server_ports,
        detect=detect,
        tls_ports=tls_ports,
        max_body=max_body,
        reveal_secrets=reveal_secrets,
        json_check=json_check,
        hole_wait=hole_wait,
        place=place,
    )


def decode_windows(
    windows: Callable[[bool], Iterable[SegmentWindow]],
    paths: list[str],
    *,
    stats: CaptureStats,
    rows: int = 65536,
    server_ports: Iterable[int] = DEFAULT_SERVER_PORTS,
    detect: bool = True,
    tls_ports: Iterable[int] = TLS_PORTS,
    max_body: int = DEFAULT_MAX_BODY,
    reveal_secrets: bool = False,
    json_check: bool = True,
    known_at: dict[int, int] | None = None,
    hole_wait: int | None = None,
    place: SetPlace = FIRST_SET,
    key_set: int = 0,
) -> Iterator[TablePart]:
    """The frames table of the TCP segments ``windows(first)`` gives (twice: ``first`` is True for the proof's pass).

    The segments may come from anywhere - capture files
    (:func:`~dcpinspect.tables.packets_vector.segment_windows`), or the
    connections one Spark task reads - in capture order; ``paths`` are the
    files their ``file_index`` names.  :attr:`TablePart.keys` number the rows
    as a read of the whole capture would; at the end, ``known_at`` (if given)
    holds every connection's ``ck`` by id, those without rows too.
    ``place`` numbers the rows and connections after the capture sets
    before (a single process); ``key_set`` makes the keys the run's keys of
    that set (Spark: :func:`set_keys`; ``known_at`` too).
    """
    ports = frozenset(server_ports)
    tls = frozenset(tls_ports)
    proof = _Proof(ports, tls, detect)
    for w in windows(True):
        proof.window(w)
    dec = _Decode(
        proof,
        paths,
        stats,
        server_ports=ports,
        detect=detect,
        tls_ports=tls,
        max_body=max_body,
        reveal_secrets=reveal_secrets,
        json_check=json_check,
        rows=rows,
        hole_wait=hole_wait,
        place=place,
        key_set=key_set,
    )

    def made() -> Iterator[TablePart]:
        for w in windows(False):
            yield from dec.window(w)
        yield from dec.close()
        if known_at is not None:
            top = key_set << SET_SHIFT
            known_at.update({g: ck | top for g, ck in dec.known_at.items()} if key_set else dec.known_at)

    return gc_paused(made())


def read_batches(paths: Iterable[str], **options: Any) -> Iterator[pa.RecordBatch]:
    """The frames table of capture files as Arrow record batches (see :func:`read_parts` for the options)."""
    return (part.batch for part in read_parts(paths, **options))
