"""Record keys and the global numbering: what each frames task decodes, and how its rows get the single-process numbers.

Global frame numbers follow completion order over the whole capture, but each
task sees only its connections.  Each segment carries its capture position
(``file_index << 40 | packet number``), so every row knows what completed
it: ``k1``, that position (or :data:`CLOSE_BASE` plus its connection's for
the rows held to the end of the capture), and ``k2``, its order among the
rows of that ``k1``; a connection is known by ``ck``, the position that
made it known.  A first pass (the keys pass) counts the rows per ``k1``
and lists the connections; that small table, collected, is the
:class:`Numbering`: frame numbers follow ``(k1, k2)`` order, connection ids
``ck`` order.  One row is named by one integer, ``k1 << KSHIFT | k2``.

A task decodes with the columnar path (:func:`~dcpinspect.tables.columnar.decode_windows`),
which gives exactly these keys (:attr:`~dcpinspect.tables.columnar.TablePart.keys`):

1. The task's segment metadata is held in memory as arrays
   (:class:`TaskSegments`: some 70 bytes a segment, no payload) - the decode
   reads its segments twice (the proof, then the decode) and Spark's input
   iterator can be read once.  Each pass cuts it into windows of one file and
   at most :data:`WINDOW` bytes of file; a window's payload bytes are read
   from the file then (:meth:`Payloads.gather`: a few large reads through
   ``pyarrow.fs``), so memory is bounded by the window, not by the task.
2. The capture's last segment ends the task's segments: the exact path ends
   its connections (gaps, truncated frames) there, as a read of the whole
   capture does.
3. A connection that emitted no row still has an id: the decode reports
   every connection's ``ck`` (``decode_windows(known_at=...)``).
4. Capture sets (:mod:`dcpinspect.capture.sets`): the files of a set are
   contiguous in the file list and each set is read as a capture of its own:
   positions count from its first file (:attr:`CaptureEnd.bases`), its
   connections end at its own last segment, and a task decodes the segments
   of each set apart (the same 4-tuple in two sets is two connections).
   With more than one set the keys are the run's keys
   (:func:`~dcpinspect.tables.columnar.set_keys`: every key of a set sorts
   before the next set's), so one numbering covers the run.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from ..capture.pcapfile import gunzip_all, is_gzip
from ..flows.reassembly import DEFAULT_SERVER_PORTS, TLS_PORTS
from ..flows.records import FIRST_SET, CaptureStats, SetPlace
from ..tables.columnar import CLOSE_BASE, SET_SHIFT, TablePart, decode_windows
from ..tables.packets_vector import SegmentWindow
from .session import filesystem
from .stages import GPOS_SHIFT, PACKED, PACKED_INPUT, SEG_INPUT

__all__ = [
    "CLOSE_BASE",
    "COUNT_BLOCK",
    "DEFAULT_OPTIONS",
    "KEYS_DDL",
    "KEYS_SCHEMA",
    "KSHIFT",
    "WINDOW",
    "CaptureEnd",
    "Counts",
    "Keyed",
    "Numbering",
    "Options",
    "Payloads",
    "TaskSegments",
    "keys_batch",
    "uncount",
]

KSHIFT = 24  # rows completed by one packet (or at the end of one connection) per k1: < 2**24
WINDOW = 32 << 20  # file bytes a frames task decodes at once (per window of segments)
GAP = 64 << 10  # payloads closer than this in a file are read in one piece (the bytes between included)
COUNT_BLOCK = 1 << 18  # capture positions per packed row of the keys table
_MASK = (1 << GPOS_SHIFT) - 1
_SENTINEL = "0.0.0.0"  # the end-of-capture segment's endpoints (port 0: never a connection)


class CaptureEnd(NamedTuple):
    """Where the capture ends (``ts`` and stage 2's ``gpos`` of its last TCP segment) and where each file starts.

    ``bases[i]`` is the number of packets in the files before file ``i`` in
    its capture set: a segment's position in its set, what numbers rows and
    times the reassembler's holes
    (:attr:`~dcpinspect.flows.reassembly.Segment.pos`), is ``bases[file] +
    packet``, as a single-process read of the set counts it.  With several
    capture sets, ``file_set[i]`` is the set of file ``i`` and ``set_ends``
    the ``(ts, gpos)`` of each set's last TCP segment (set ``s`` at ``s - 1``).
    """

    ts: int
    gpos: int
    bases: tuple[int, ...] = ()
    file_set: tuple[int, ...] = ()
    set_ends: tuple[tuple[int, int], ...] = ()

    @property
    def sets(self) -> int:
        """How many capture sets the run has (1 without a plan)."""
        return max(self.file_set, default=1)

    def of_set(self, capture_set: int) -> CaptureEnd:
        """Where one capture set ends (its last segment), with the bases."""
        ts, gpos = self.set_ends[capture_set - 1] if self.set_ends else (self.ts, self.gpos)
        return CaptureEnd(ts, gpos, self.bases, self.file_set, self.set_ends)

    def base(self, file_index: int) -> int:
        """The packets of the files before ``file_index``."""
        return self.bases[file_index] if file_index < len(self.bases) else 0

    @staticmethod
    def file_bases(status: list[tuple[Any, ...]], file_set: tuple[int, ...] = ()) -> tuple[int, ...]:
        """``bases`` from the per-file status rows (:data:`~dcpinspect.spark.stages.STATUS_DDL`: file index, ..., packets at 4).

        With ``file_set`` (each file's capture set) the count starts again at each set's first file.
        """
        packets = {int(r[0]): int(r[4] or 0) for r in status}
        out, total = [], 0
        for fi in range(max(packets, default=-1) + 1):
            if fi and fi < len(file_set) and file_set[fi] != file_set[fi - 1]:
                total = 0
            out.append(total)
            total += packets.get(fi, 0)
        return tuple(out)

    @staticmethod
    def set_ends_of(ends: dict[int, tuple[int, int]], file_set: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
        """``set_ends`` from each file's last TCP segment (file index -> ``(gpos, ts)``)."""
        best: dict[int, tuple[int, int]] = {}
        for fi, (g, t) in ends.items():
            s = file_set[fi]
            best[s] = max(best.get(s, (0, 0)), (g, t))
        return tuple((best[s][1], best[s][0]) if s in best else (0, 0) for s in range(1, max(file_set, default=0) + 1))


@dataclass(frozen=True)
class Options:
    """What the decode takes besides the captures."""

    server_ports: tuple[int, ...] = tuple(sorted(DEFAULT_SERVER_PORTS))
    detect: bool = True
    tls_ports: tuple[int, ...] = tuple(sorted(TLS_PORTS))
    reveal_secrets: bool = False
    rows: int = 65536
    json_check: bool = True
    hole_wait: int | None = None  # packets a hole in a TCP stream is waited for (None: the reassembler's default)


DEFAULT_OPTIONS = Options()


class Payloads:
    """Payload bytes read from the files (``pyarrow.fs``), one file open at a time."""

    def __init__(self) -> None:
        self.fi = -1
        self.f: Any = None

    def _file(self, fi: int, path: str) -> Any:
        if fi != self.fi:
            self.close()
            fs, p = filesystem(path)
            f = fs.open_input_file(p)
            if is_gzip(f.read_at(2, 0)):  # a gzip'ed capture's offsets are positions in its decompressed bytes
                f.seek(0)
                f = pa.BufferReader(gunzip_all(f))
            self.f, self.fi = f, fi
        return self.f

    def gather(self, fi: int, path: str, off: np.ndarray, n: np.ndarray) -> tuple[bytes, np.ndarray]:
        """The payloads ``n`` bytes at file offsets ``off`` of file ``fi``: one buffer, and each payload's offset in it.

        Payloads less than :data:`GAP` apart are read in one piece, so a
        window takes a few large reads, never one per segment.
        """
        rel = np.zeros(len(off), np.int64)
        has = np.flatnonzero(n > 0)
        if not len(has):
            return b"", rel
        o, e = off[has], off[has] + n[has]
        reach = np.maximum.accumulate(e)
        new = np.ones(len(o), bool)
        new[1:] = o[1:] > reach[:-1] + GAP
        starts = np.flatnonzero(new)
        lo, hi = np.minimum.reduceat(o, starts), np.maximum.reduceat(e, starts)
        sizes = hi - lo
        base = np.cumsum(sizes) - sizes
        span = np.cumsum(new) - 1
        rel[has] = o - lo[span] + base[span]
        f = self._file(fi, path)
        pieces = [f.read_at(size, at) for at, size in zip(lo.tolist(), sizes.tolist(), strict=True)]
        return (pieces[0] if len(pieces) == 1 else b"".join(pieces)), rel

    def close(self) -> None:
        """Close the file open now."""
        if self.f is not None:
            self.f.close()
        self.f, self.fi = None, -1


@dataclass
class TaskSegments:
    """A task's segment metadata (:data:`~dcpinspect.spark.stages.SEG_INPUT`) as arrays, in capture order; endpoints as indexes into ``addresses``."""

    cols: dict[str, np.ndarray]
    addresses: list[str]

    @classmethod
    def of(cls, batches: Iterable[pa.RecordBatch]) -> TaskSegments:
        """Read Spark's input batches (once): rows of :data:`~dcpinspect.spark.stages.PACKED_INPUT`, a connection's segments of one range each."""
        bs = [b for b in batches if b.num_rows]
        if not bs:
            return cls({k: np.zeros(0, np.int64) for k in SEG_INPUT}, [])
        t = pa.Table.from_batches(bs).select(list(PACKED_INPUT))
        blobs = t.column("blob").to_pylist()
        rec = np.frombuffer(b"".join(blobs), PACKED)
        per_row = np.array([len(x) // PACKED.itemsize for x in blobs], np.int64)
        row = np.repeat(np.arange(t.num_rows), per_row)
        both = pa.concat_arrays([*t.column("src").chunks, *t.column("dst").chunks]).dictionary_encode()
        idx = both.indices.to_numpy(zero_copy_only=False).astype(np.int32)
        n = t.num_rows
        lo, hi = idx[:n][row], idx[n:][row]
        lo_port = t.column("sport").to_numpy().astype(np.int64)[row]
        hi_port = t.column("dport").to_numpy().astype(np.int64)[row]
        swap = rec["swap"].astype(bool)
        cols = {
            "file_index": t.column("file_index").to_numpy()[row],
            "gpos": rec["gpos"].copy(),
            "ts": rec["ts"].copy(),
            "src": np.where(swap, hi, lo),
            "sport": np.where(swap, hi_port, lo_port),
            "dst": np.where(swap, lo, hi),
            "dport": np.where(swap, lo_port, hi_port),
            "seq": rec["seq"].copy(),
            "flags": rec["flags"].astype(np.int64),
            "poff": rec["poff"].copy(),
            "plen": rec["plen"].astype(np.int64),
            "missing": rec["missing"].copy(),
        }
        g = cols["gpos"]
        if len(g) > 1 and bool((g[1:] < g[:-1]).any()):  # the connections of a task interleave: put them in capture order
            order = np.argsort(g, kind="stable")
            cols = {k: v[order] for k, v in cols.items()}
        return cls(cols, both.dictionary.to_pylist())

    def __len__(self) -> int:
        return len(self.cols["gpos"])

    def by_set(self, file_set: tuple[int, ...]) -> Iterator[tuple[int, TaskSegments]]:
        """The segments of each capture set (``file_set``: each file's set), in set order: slices, as sets are contiguous in capture order."""
        fi = self.cols["file_index"]
        if not len(fi):
            return
        sets = np.asarray(file_set, np.int64)[fi]
        cuts = np.flatnonzero(sets[1:] != sets[:-1]) + 1
        for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(fi)], strict=True):
            yield int(sets[a]), TaskSegments({k: v[a:b] for k, v in self.cols.items()}, self.addresses)

    def windows(self, paths: list[str], last: CaptureEnd) -> Iterator[SegmentWindow]:
        """The segments as windows of one file and at most :data:`WINDOW` file bytes, payloads read; then the end of the capture."""
        c = self.cols
        n = len(self)
        if not n:
            return
        fi, poff, plen = c["file_index"], c["poff"], c["plen"].astype(np.int64)
        cuts = np.flatnonzero(fi[1:] != fi[:-1]) + 1
        payloads = Payloads()
        try:
            for a0, b0 in zip([0, *cuts.tolist()], [*cuts.tolist(), n], strict=True):
                a = a0
                reach = np.maximum.accumulate(poff[a0:b0] + plen[a0:b0])  # where the file's payloads so far end
                while a < b0:
                    b = max(a + 1, int(np.searchsorted(reach[a - a0 :], int(poff[a]) + WINDOW, "right")) + a)
                    yield self._window(paths, payloads, a, b, last)
                    a = b
        finally:
            payloads.close()
        yield self._end(paths, last)

    def _window(self, paths: list[str], payloads: Payloads, a: int, b: int, last: CaptureEnd) -> SegmentWindow:
        c = self.cols
        f = int(c["file_index"][a])
        plen = c["plen"][a:b].astype(np.int64)
        data, rel = payloads.gather(f, paths[f], c["poff"][a:b], plen)
        return SegmentWindow(
            f,
            paths[f],
            data,
            False,
            number=c["gpos"][a:b] & _MASK,
            ts=c["ts"][a:b],
            src=c["src"][a:b],
            dst=c["dst"][a:b],
            sport=c["sport"][a:b].astype(np.int32),
            dport=c["dport"][a:b].astype(np.int32),
            seq=c["seq"][a:b],
            flags=c["flags"][a:b].astype(np.int32),
            poff=rel,
            plen=plen,
            missing=c["missing"][a:b],
            addresses=self.addresses,
            end=int(c["poff"][b - 1] + plen[-1]),
            base=last.base(f),
        )

    def _end(self, paths: list[str], last: CaptureEnd) -> SegmentWindow:
        """The capture's last segment, with no endpoints: where a read of the whole capture ends its connections."""
        ts, gpos = last.ts, last.gpos
        if _SENTINEL not in self.addresses:
            self.addresses.append(_SENTINEL)
        z = self.addresses.index(_SENTINEL)
        f = gpos >> GPOS_SHIFT
        one = np.ones(1, np.int64)
        i32 = np.zeros(1, np.int32)
        return SegmentWindow(
            f,
            paths[f] if f < len(paths) else "",
            b"",
            False,
            number=one * (gpos & _MASK),
            ts=one * ts,
            src=i32 + z,
            dst=i32 + z,
            sport=i32,
            dport=i32,
            seq=one * 0,
            flags=i32,
            poff=one * 0,
            plen=one * 0,
            missing=one * 0,
            addresses=self.addresses,
            end=0,
            base=last.base(f),
        )


class Keyed:
    """The rows of one frames task with their numbering keys (shared by the frames and timelines stages).

    :meth:`parts` decodes the task's segments (capture order) with the
    columnar path; each :class:`~dcpinspect.tables.columnar.TablePart` carries
    its rows' keys.  Once it is done, ``adopted`` maps every connection of the
    task (by its id in ``stats.connections``) to its ``ck``, ``labels`` to its label,
    ``files`` to the file of its first segment and ``tls`` to whether it is TLS.
    """

    def __init__(self, batches: Iterable[pa.RecordBatch], paths: list[str], last: CaptureEnd, options: Options) -> None:
        self.paths, self.last, self.options = paths, last, options
        self.segments = TaskSegments.of(batches)
        self.stats = CaptureStats()
        self.adopted: dict[int, int] = {}
        self.labels: dict[int, str] = {}
        self.files: dict[int, str] = {}
        self.tls: dict[int, bool] = {}
        self._known: dict[int, int] = {}  # connection id -> ck, every connection (from the decode)

    def parts(self) -> Iterator[TablePart]:
        """The task's rows, in parts of at most ``options.rows`` (each of one capture set)."""
        last = self.last
        if last.sets <= 1:
            yield from self._decode(self.segments, last, self.stats, FIRST_SET, 0)
        else:
            for s, segs in self.segments.by_set(last.file_set):
                sub = CaptureStats()
                conn_base = max((c.id for c in self.stats.connections), default=0)
                yield from self._decode(segs, last.of_set(s), sub, SetPlace(s, 0, conn_base), s)
                self.stats.add_set(sub)
        self._connections()

    def _decode(self, segs: TaskSegments, last: CaptureEnd, stats: CaptureStats, place: SetPlace, key_set: int) -> Iterator[TablePart]:
        o = self.options
        yield from decode_windows(
            lambda _first: segs.windows(self.paths, last),
            self.paths,
            stats=stats,
            rows=o.rows,
            server_ports=o.server_ports,
            detect=o.detect,
            tls_ports=o.tls_ports,
            reveal_secrets=o.reveal_secrets,
            json_check=o.json_check,
            known_at=self._known,
            hole_wait=o.hole_wait,
            place=place,
            key_set=key_set,
        )

    def _connections(self) -> None:
        """Every connection of the task: its ``ck``, label, first file and whether it is TLS."""
        for c in self.stats.connections:
            self.adopted[c.id] = self._known[c.id]
            self.labels[c.id] = c.label
            self.files[c.id] = c.file
            self.tls[c.id] = c.tls


KEYS_DDL = "kind byte, k1 bigint, n bigint, label string, blob binary"
KEYS_SCHEMA = pa.schema([("kind", pa.int8()), ("k1", pa.int64()), ("n", pa.int64()), ("label", pa.string()), ("blob", pa.binary())])


def keys_batch(kind: int, k1: Any, n: Any = None, label: list[str] | None = None, blob: list[bytes] | None = None) -> pa.RecordBatch:
    """Rows of the keys table (:data:`KEYS_DDL`): one ``kind``, and per row ``k1`` and optionally ``n``, ``label``, ``blob``."""
    m = len(k1)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.full(m, kind, np.int8)),
            pa.array(k1, pa.int64()),
            pa.nulls(m, pa.int64()) if n is None else pa.array(n, pa.int64()),
            pa.nulls(m, pa.string()) if label is None else pa.array(label, pa.string()),
            pa.nulls(m, pa.binary()) if blob is None else pa.array(blob, pa.binary()),
        ],
        schema=KEYS_SCHEMA,
    )


class Counts:
    """Records per capture position, packed for the driver: ``kind`` 0 rows of at most :data:`COUNT_BLOCK` positions each.

    ``k1`` is the number of positions, ``blob`` the positions (delta-coded:
    they rise within a task) then their counts, as int64, zlib-compressed -
    a few bytes per position instead of a row of its own (a capture has about
    0.7 million positions with records per GiB).
    """

    def __init__(self) -> None:
        self.k1: list[np.ndarray] = []
        self.n: list[np.ndarray] = []
        self.size = 0

    def add(self, k1: np.ndarray, n: np.ndarray) -> Iterator[pa.RecordBatch]:
        """Take positions ``k1`` with ``n`` records each; the rows that filled up."""
        self.k1.append(k1)
        self.n.append(n)
        self.size += len(k1)
        if self.size >= COUNT_BLOCK:
            yield from self.flush()

    def flush(self) -> Iterator[pa.RecordBatch]:
        """The row of what is held."""
        if not self.size:
            return
        import zlib

        k1, n = np.concatenate(self.k1).astype(np.int64), np.concatenate(self.n).astype(np.int64)
        self.k1, self.n, self.size = [], [], 0
        yield keys_batch(0, [len(k1)], blob=[zlib.compress(np.concatenate((np.diff(k1, prepend=0), n)).tobytes(), 1)])


def uncount(m: int, blob: bytes) -> tuple[np.ndarray, np.ndarray]:
    """The positions and counts of one packed row (``m`` positions; see :class:`Counts`)."""
    import zlib

    a = np.frombuffer(zlib.decompress(blob), np.int64)
    return np.cumsum(a[:m]), a[m:]


@dataclass
class Numbering:
    """Global frame and connection numbers from the keys pass (small: one entry per capture position with records)."""

    keys: np.ndarray  # sorted k1
    base: np.ndarray  # records completed at capture positions before each key
    conn_ids: dict[int, int]  # ck -> connection id (1-based, single-process order)
    labels: dict[int, str]  # connection id -> label
    frames: int  # records in all
    files: dict[int, str] = field(default_factory=dict)  # connection id -> the file of its first segment
    tls: frozenset[int] = frozenset()  # the TLS connections' ids

    @classmethod
    def from_rows(
        cls,
        k1: np.ndarray,
        n: np.ndarray,
        cks: list[int],
        labels: list[str],
        files: list[str] | None = None,
        tls: list[bool] | None = None,
    ) -> Numbering:
        """From the keys table's rows: records per ``k1`` (repeats add up), connections' ``ck``, labels, first files and TLS flags."""
        keys, inv = np.unique(k1, return_inverse=True)
        counts = np.zeros(len(keys), np.int64)
        np.add.at(counts, inv, n)
        base = np.cumsum(counts) - counts
        order = sorted(range(len(cks)), key=cks.__getitem__)
        conn_ids = {cks[j]: i + 1 for i, j in enumerate(order)}
        return cls(
            keys,
            base,
            conn_ids,
            {i + 1: labels[j] for i, j in enumerate(order)},
            int(counts.sum()),
            {i + 1: files[j] for i, j in enumerate(order)} if files is not None else {},
            frozenset(i + 1 for i, j in enumerate(order) if tls is not None and tls[j]),
        )

    def places(self, file_set: Mapping[str, int]) -> dict[int, tuple[int, str]]:
        """Connection id -> (its capture set, the file of its first segment), every connection (``file_set``: file -> set; set 1 for a file not in it)."""
        return {c: (file_set.get(f, 1), f) for c, f in self.files.items()}

    def set_first(self, sets: int) -> dict[int, int]:
        """The number of each capture set's first frame (sets ``1..sets``; keys of the run, :func:`~dcpinspect.tables.columnar.set_keys`)."""
        if sets <= 1:
            return {1: 1}
        total = np.append(self.base, self.frames)
        at = np.searchsorted(self.keys, np.arange(1, sets + 1, dtype=np.int64) << SET_SHIFT, "left")
        return {s: int(total[i]) + 1 for s, i in zip(range(1, sets + 1), at.tolist(), strict=True)}

    def set_frames(self, frame: np.ndarray, capture_set: np.ndarray) -> np.ndarray:
        """The frame numbers within their capture sets of frames ``frame`` of sets ``capture_set``."""
        if not len(frame):
            return np.zeros(0, np.int64)
        cs = np.asarray(capture_set, np.int64)
        firsts = self.set_first(int(cs.max()))
        first = np.array([0, *(firsts[s] for s in range(1, int(cs.max()) + 1))], np.int64)
        return np.asarray(frame, np.int64) - first[cs] + 1

    def frame_numbers(self, k1: np.ndarray, k2: np.ndarray) -> np.ndarray:
        """The 1-based frame numbers of records ``(k1, k2)``."""
        return self.base[np.searchsorted(self.keys, k1)] + k2 + 1

    def frames_of(self, keys: list[int]) -> list[int]:
        """The frame numbers of many record keys ``k1 << KSHIFT | k2``."""
        n = len(keys)
        try:
            k = np.array(keys, np.int64)
            k1, k2 = k >> KSHIFT, k & ((1 << KSHIFT) - 1)
        except OverflowError:  # keys of records held to the end of the capture: past int64
            k1 = np.fromiter((k >> KSHIFT for k in keys), np.int64, n)
            k2 = np.fromiter((k & ((1 << KSHIFT) - 1) for k in keys), np.int64, n)
        out: list[int] = self.frame_numbers(k1, k2).tolist()
        return out

    def frame(self, key: int) -> int:
        """The frame number of one record key ``k1 << KSHIFT | k2``."""
        i = int(np.searchsorted(self.keys, key >> KSHIFT))
        return int(self.base[i]) + (key & ((1 << KSHIFT) - 1)) + 1
