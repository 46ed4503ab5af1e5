"""Capture sets: which files of a run are one recording (read as one capture) and which are unrelated.

Theory of operation: a run may name many files.  Files of one recording -
the rotated files of a ring buffer, or files whose TCP connections go on from
one to the next - are read one after the other as one capture: a connection
that crosses them is one connection.  Unrelated files must never share a
history, so every other file is a capture of its own.  :func:`plan_capture_sets`
groups the files into :class:`CaptureSet` objects by looking at the heads and
tails of the files only; :func:`read_sets` runs any single-capture reader once
per set, each with fresh state, numbering frames and connections on across
the sets.

Rules:

1. ``mode="one"``: every file is one set (the files in the order given);
   ``mode="per-file"``: one set per file; ``mode="auto"`` detects sets (rules 2-4).
2. Rotated ring-buffer files (the names dumpcap and ``tshark -b`` give:
   ``PREFIX_NNNNN_YYYYMMDDhhmmss.EXT``) with the same directory, prefix and
   extension and consecutive numbers are one set, ordered by number.
3. Two files continue each other when a TCP 4-tuple among the last
   :data:`EDGE_PACKETS` packets of the earlier one is among the first
   :data:`EDGE_PACKETS` packets of the later one without opening there with
   a SYN (the same connection, not a new one), and the later file starts at
   most :data:`MAX_GAP_NS` (60 s) after the earlier one ends (and no more than
   :data:`MAX_OVERLAP_NS`, 1 s, before).  Continuations join sets
   transitively; a set's files are read in the order of their first packet.
4. Only the first and last :data:`EDGE_BYTES` (4 MiB) or :data:`EDGE_PACKETS`
   packets of a file are read, each at most once (a file smaller than that
   is read once, whole): planning never reads a big file through.  A pcap
   tail starts at the first offset from which record headers chain to the
   end of the file; a pcapng tail is walked back by the blocks' trailing
   lengths.  A tail that cannot be found is not looked at (the file can
   still continue an earlier one by its head).
5. A file that cannot be read as a capture is a set of its own (reading it
   reports why, as for any file); so is a URI (``scheme://...``, cluster
   storage): only local files are looked at.
6. Sets are in the order of their first file in the arguments, numbered from 1.
"""

from __future__ import annotations

import os
import re
import struct
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TypeVar

from ..flows.reassembly import SYN
from ..flows.records import CaptureStats, SetPlace
from .packets import parse_packet
from .pcapfile import PCAP_MAGICS, PCAPNG_BOM, PCAPNG_SHB, CaptureError, CaptureRange, CaptureReader, RawPacket, read_range

__all__ = [
    "EDGE_BYTES",
    "EDGE_PACKETS",
    "MAX_GAP_NS",
    "MAX_OVERLAP_NS",
    "MODES",
    "CaptureSet",
    "Plan",
    "file_sets",
    "plan_capture_sets",
    "planned",
    "read_sets",
    "ring_name",
]

T = TypeVar("T")

#: the capture-set modes: detect, one set of every file, one set per file
MODES = ("auto", "one", "per-file")
EDGE_PACKETS = 4096
EDGE_BYTES = 4 << 20
MAX_GAP_NS = 60 * 10**9
MAX_OVERLAP_NS = 1 * 10**9

_RING = re.compile(r"^(?P<prefix>.+)_(?P<num>\d{5,})_(?P<stamp>\d{14})(?P<ext>\..*)?$")
Tuple4 = tuple[str, int, str, int]


@dataclass(frozen=True)
class CaptureSet:
    """Files read as one capture: ``number`` (1-based), the files in reading order, and why they are one set."""

    number: int
    files: tuple[str, ...]
    reason: str


def ring_name(path: str) -> tuple[str, int] | None:
    """``(directory/prefix + extension, number)`` of a ring-buffer file name (dumpcap's ``PREFIX_NNNNN_YYYYMMDDhhmmss.EXT``), else None."""
    head, name = os.path.split(path)
    m = _RING.match(name)
    if m is None:
        return None
    return os.path.join(head, m["prefix"]) + "\0" + (m["ext"] or ""), int(m["num"])


@dataclass
class _Edges:
    """What planning saw of one file: readable, its first and last packet times, the 4-tuples at its head and tail."""

    ok: bool = False
    first_ts: int | None = None
    last_ts: int | None = None
    head: dict[Tuple4, bool] = field(default_factory=dict)  # 4-tuple (both ways) -> its first packet here was a SYN
    tail: set[Tuple4] = field(default_factory=set)


def _key(seg_src: str, sport: int, dst: str, dport: int) -> Tuple4:
    a, b = (seg_src, sport), (dst, dport)
    return (a + b) if a <= b else (b + a)


def _segments(packets: Iterable[RawPacket], path: str) -> Iterator[tuple[Tuple4, int, bool]]:
    skipped: Counter[str] = Counter()
    for p in packets:
        seg = parse_packet(p.linktype, p.data, p.wirelen, p.ts, p.number, path, skipped)
        if seg is not None:
            yield _key(seg.src, seg.sport, seg.dst, seg.dport), seg.ts, bool(seg.flags & SYN)


def _edges(path: str) -> _Edges:
    e = _Edges()
    reader = CaptureReader(path)
    last: deque[RawPacket] = deque(maxlen=EDGE_PACKETS)
    whole = True
    first_offset = 0
    try:
        for n, p in enumerate(reader):
            if n == 0:
                first_offset = p.offset
            if n < EDGE_PACKETS and p.offset < EDGE_BYTES:
                last.append(p)
                continue
            whole = False
            break
    except CaptureError:
        return e
    e.ok = True
    head = list(last)
    for k, ts, syn in _segments(head, path):
        if e.first_ts is None or (ts > 0 and ts < e.first_ts):
            e.first_ts = ts
        e.head.setdefault(k, syn)
    tail = head if whole else _tail(reader, path, first_offset)
    for k, ts, _syn in _segments(tail, path):
        e.tail.add(k)
        if e.last_ts is None or ts > e.last_ts:
            e.last_ts = ts
    return e


def _tail(reader: CaptureReader, path: str, first_offset: int) -> list[RawPacket]:
    """The last packets of a file too big to read whole (at most :data:`EDGE_BYTES` of it), or none if no record boundary is found."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(0)
            prefix = f.read(first_offset) if reader.format == "pcapng" else f.read(24)
            lo = max(first_offset, size - EDGE_BYTES)
            f.seek(lo)
            buf = f.read(size - lo)
            start = _pcap_start(prefix, buf, size) if reader.format == "pcap" else _pcapng_start(prefix, buf)
            if start is None:
                return []
            rng = CaptureRange(lo + start, size, 1, prefix)
            out: deque[RawPacket] = deque(read_range(CaptureReader(path), f, rng), maxlen=EDGE_PACKETS)
            return list(out)
    except (OSError, CaptureError):
        return []


def _pcap_start(header: bytes, buf: bytes, size: int) -> int | None:
    """The first offset in ``buf`` (the file's last bytes) from which pcap record headers chain to its end."""
    if len(header) < 24 or header[:4] not in PCAP_MAGICS:
        return None
    endian, ns = PCAP_MAGICS[header[:4]]
    snaplen = struct.unpack(endian + "I", header[16:20])[0]
    limit = max(snaplen, 262_144)
    frac = 10**9 if ns else 10**6
    rec = struct.Struct(endian + "IIII")
    n = len(buf)
    for start in range(min(n, limit + 16)):
        pos, prev, count, ok = start, -1, 0, True
        while pos + 16 <= n:
            sec, sub, caplen, wirelen = rec.unpack_from(buf, pos)
            if sub >= frac or caplen > limit or (wirelen and caplen > wirelen) or (prev >= 0 and abs(sec - prev) > 86400):
                ok = False
                break
            prev, count = sec, count + 1
            pos += 16 + caplen
        # records that chain exactly to the end (or, the last one cut short, many that chain to it): the boundary
        if ok and ((pos == n and count >= min(3, n // 16)) or (pos > n - 16 and count >= 8)):
            return start
    return None


def _pcapng_start(prefix: bytes, buf: bytes) -> int | None:
    """The offset in ``buf`` (the file's last bytes) of the earliest whole block reached walking back by trailing lengths."""
    if len(prefix) < 12 or prefix[:4] != PCAPNG_SHB or prefix[8:12] not in PCAPNG_BOM:
        return None
    endian = PCAPNG_BOM[prefix[8:12]]
    u32 = struct.Struct(endian + "I")
    pos = len(buf)
    while pos >= 12:
        blen = u32.unpack_from(buf, pos - 4)[0]
        if blen < 12 or blen % 4 or blen > pos or u32.unpack_from(buf, pos - blen + 4)[0] != blen:
            break
        pos -= blen
    return pos if pos < len(buf) else None


def _continues(a: _Edges, b: _Edges) -> bool:
    """File ``b`` goes on with a connection of ``a`` (rule 3)."""
    if a.last_ts is None or b.first_ts is None:
        return False
    gap = b.first_ts - a.last_ts
    if gap > MAX_GAP_NS or gap < -MAX_OVERLAP_NS:
        return False
    return any(k in a.tail and not syn for k, syn in b.head.items())


class _Union:
    def __init__(self, n: int) -> None:
        self.up = list(range(n))
        self.why: dict[int, str] = {}

    def find(self, i: int) -> int:
        while self.up[i] != i:
            self.up[i] = self.up[self.up[i]]
            i = self.up[i]
        return i

    def join(self, i: int, j: int, why: str) -> None:
        a, b = self.find(i), self.find(j)
        if a != b:
            lo, hi = min(a, b), max(a, b)
            self.up[hi] = lo
            reasons = [r for r in (self.why.pop(hi, ""), self.why.get(lo, ""), why) if r]
            self.why[lo] = " + ".join(dict.fromkeys(reasons))


def plan_capture_sets(paths: Sequence[str] | Iterable[str], mode: str = "auto") -> list[CaptureSet]:
    """The capture sets of ``paths`` (see the module's rules); ``mode`` is ``auto``, ``one`` or ``per-file``."""
    files = list(dict.fromkeys(str(p) for p in paths))
    if mode not in MODES:
        raise ValueError(f"capture sets: unknown mode {mode!r} (expected one of {', '.join(MODES)})")
    if not files:
        return []
    if mode == "one":
        return [CaptureSet(1, tuple(files), "one file" if len(files) == 1 else "--one-capture")]
    if mode == "per-file" or len(files) == 1:
        return [CaptureSet(i, (p,), "one file" if len(files) == 1 else "--per-file") for i, p in enumerate(files, 1)]
    edges = [_Edges() if "://" in p else _edges(p) for p in files]
    u = _Union(len(files))
    rings: dict[str, list[tuple[int, int]]] = {}
    for i, p in enumerate(files):
        r = ring_name(p)
        if r is not None and edges[i].ok:
            rings.setdefault(r[0], []).append((r[1], i))
    for numbered in rings.values():
        numbered.sort()
        for (n1, i1), (n2, i2) in pairwise(numbered):
            if n2 == n1 + 1:
                u.join(i1, i2, "rotated ring buffer (dumpcap names)")
    timed = sorted((e.first_ts, i) for i, e in enumerate(edges) if e.ok and e.first_ts is not None)
    for x, (_t, i) in enumerate(timed):
        for _t2, j in timed[x + 1 :]:
            if _continues(edges[i], edges[j]):
                u.join(i, j, "connections continue across files")
    groups: dict[int, list[int]] = {}
    for i in range(len(files)):
        groups.setdefault(u.find(i), []).append(i)
    out: list[CaptureSet] = []
    for root in sorted(groups):
        members = groups[root]
        if len(members) == 1:
            only = files[members[0]]
            reason = "one file" if edges[members[0]].ok else "not a local file" if "://" in only else "unreadable: a set of its own"
        else:
            reason = u.why.get(root, "")
            ring = {i: ring_name(files[i]) for i in members}
            members.sort(key=lambda i: (edges[i].first_ts if edges[i].first_ts is not None else 0, (ring[i] or ("", 0))[1], i))
        out.append(CaptureSet(len(out) + 1, tuple(files[i] for i in members), reason))
    return out


#: what the readers' ``capture_sets`` take: a mode of :data:`MODES`, or a plan already made for the same files
Plan = str | Sequence[CaptureSet]


def file_sets(plan: Iterable[CaptureSet]) -> dict[str, int]:
    """File -> the number of its capture set (what a timeline builder takes)."""
    return {f: cs.number for cs in plan for f in cs.files}


def planned(paths: Iterable[str], capture_sets: Plan) -> list[CaptureSet]:
    """The plan: ``capture_sets`` itself when it is one, else :func:`plan_capture_sets` in that mode."""
    if isinstance(capture_sets, str):
        return plan_capture_sets(list(paths), capture_sets)
    return list(capture_sets)


def read_sets(
    paths: Iterable[str],
    mode: Plan,
    stats: CaptureStats,
    read_one: Callable[[list[str], CaptureStats, SetPlace], Iterable[T]],
) -> Iterator[T]:
    """Run ``read_one(files, stats, place)`` once per capture set of ``paths``, each with fresh statistics merged into ``stats``.

    ``mode`` is a mode of :data:`MODES` or a plan made before (then
    ``paths`` is not looked at).  ``stats.sets`` gets the plan and
    ``stats.set_first`` each set's first frame number; frames and
    connections are numbered on across the sets (``place``).  A plan of one
    set is read exactly as before sets existed.
    """
    plan = planned(paths, mode)
    stats.sets = plan
    stats.set_first = {}
    frame_base = conn_base = 0
    for cs in plan:
        stats.set_first[cs.number] = frame_base + 1
        sub = CaptureStats()
        yield from read_one(list(cs.files), sub, SetPlace(cs.number, frame_base, conn_base))
        stats.add_set(sub)
        frame_base = max(frame_base, sub.records)
        conn_base = max([conn_base, *(c.id for c in sub.connections)])
    stats.records = frame_base
