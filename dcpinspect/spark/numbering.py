"""Record keys and the global numbering: what each frames task decodes, and how its records get the single-process numbers.

Global frame numbers follow completion order over the whole capture, but each
task sees only its connections.  Each segment carries its capture position
(``file_index << 40 | packet number``), so every record knows what completed
it: ``k1``, that position (or :data:`CLOSE_BASE` plus its connection's for
the records held to the end of the capture), and ``k2``, its order among the
records of that ``k1``; a connection is known by ``ck``, the position that
made it known.  A first pass (the keys pass) counts the records per ``k1``
and lists the connections; that small table, collected, is the
:class:`Numbering`: frame numbers follow ``(k1, k2)`` order, connection ids
``ck`` order.  One record is named by one integer, ``k1 << KSHIFT | k2``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ..flows.reassembly import DEFAULT_SERVER_PORTS, TLS_PORTS, Segment
from ..flows.records import CaptureStats, RecordChunk, iter_chunks
from .session import filesystem
from .stages import GPOS_SHIFT, SEG_INPUT

__all__ = [
    "CLOSE_BASE",
    "COUNT_BLOCK",
    "DEFAULT_OPTIONS",
    "KEYS_DDL",
    "KEYS_SCHEMA",
    "KSHIFT",
    "Counts",
    "Keyed",
    "Numbering",
    "Options",
    "Payloads",
    "RecordKeys",
    "keys_batch",
    "uncount",
]

CLOSE_BASE = 1 << 61  # records emitted at the end of the capture sort after every packet
KSHIFT = 24  # records completed by one packet (or at the end of one connection) per k1: < 2**24
WINDOW = 256 * 1024  # payload bytes read at once per file in a frames task
COUNT_BLOCK = 1 << 18  # capture positions per packed row of the keys table


@dataclass(frozen=True)
class Options:
    """What the decode takes besides the captures."""

    server_ports: tuple[int, ...] = tuple(sorted(DEFAULT_SERVER_PORTS))
    detect: bool = True
    tls_ports: tuple[int, ...] = tuple(sorted(TLS_PORTS))
    reveal_secrets: bool = False
    rows: int = 65536


DEFAULT_OPTIONS = Options()


_CLOSE = "C"


class Payloads:
    """Payload bytes read from the files (``pyarrow.fs``) through one bounded window."""

    def __init__(self, window: int = WINDOW) -> None:
        self.window = window
        self.fi = -1
        self.f: Any = None
        self.lo, self.buf = 0, b""

    def get(self, fi: int, path: str, off: int, n: int) -> bytes:
        """``n`` bytes at ``off`` of file ``fi`` (``path``)."""
        if not n:
            return b""
        if fi != self.fi:
            self.close()
            fs, p = filesystem(path)
            self.f, self.fi, self.lo, self.buf = fs.open_input_file(p), fi, 0, b""
        lo = self.lo
        if lo <= off and off + n <= lo + len(self.buf):
            return self.buf[off - lo : off - lo + n]
        self.buf = self.f.read_at(max(n, self.window), off)
        self.lo = off
        return self.buf[:n]

    def close(self) -> None:
        """Close the file open now."""
        if self.f is not None:
            self.f.close()
        self.f, self.fi, self.buf = None, -1, b""


class Keyed:
    """The records of one frames task with their numbering keys (shared by the frames and timelines stages).

    Each segment's ``file`` carries its capture position, so every run of a
    chunk knows which packet (or the end of the capture) completed it: a
    record's ``k1`` is that position, ``k2`` its order within it, and ``ck``
    the position that made its connection known.  Global frame numbers follow
    (k1, k2) order, connection ids ``ck`` order.
    """

    def __init__(self, batches: Iterable[pa.RecordBatch], paths: list[str], last: tuple[int, int], options: Options) -> None:
        self.batches, self.paths, self.last, self.options = batches, paths, last, options
        self.stats = CaptureStats()
        self.adopted: dict[int, int] = {}
        self.labels: dict[int, str] = {}
        self._cur = 0
        self._seen = 0

    def _sync(self) -> None:
        conns = self.stats.connections
        while self._seen < len(conns):
            c = conns[self._seen]
            self.adopted[c.id] = self._cur
            self.labels[c.id] = c.label
            self._seen += 1

    def _segs(self) -> Iterator[Segment]:
        payloads = Payloads()
        paths = self.paths
        mask = (1 << GPOS_SHIFT) - 1
        for batch in self.batches:
            cols = [batch.column(k).to_numpy(zero_copy_only=False).tolist() for k in SEG_INPUT]
            cols[3] = batch.column("src").to_pylist()
            cols[5] = batch.column("dst").to_pylist()
            for fi, gpos, ts, src, sport, dst, dport, seq, flags, poff, plen, missing in zip(*cols, strict=True):
                path = paths[fi]
                payload = payloads.get(fi, path, poff, plen)
                if self._seen < len(self.stats.connections):
                    self._sync()
                self._cur = gpos
                yield Segment(ts, src, sport, dst, dport, seq, flags, payload, missing, gpos & mask, f"{path}\0{gpos}")
        self._sync()
        payloads.close()
        ts, gpos = self.last
        path = paths[gpos >> GPOS_SHIFT] if paths else ""
        # the sentinel sets the reassembler's end of capture
        yield Segment(ts, "0.0.0.0", 0, "0.0.0.0", 0, 0, 0, b"", 0, gpos & mask, f"{path}\0{_CLOSE}")
        # what follows are the records held to the end: each names the file its connection was last seen in,
        # tagged here as emitted at the end (so they number after every packet)
        for c in self.stats.connections:
            last_file = getattr(c, "last_file", "")
            if last_file:
                c.last_file = f"{last_file.rpartition(chr(0))[0]}\0{_CLOSE}"

    def chunks(self) -> Iterator[tuple[RecordChunk, list[int], list[int]]]:
        """(chunk with real file names, ``k1`` per run, ``ck`` per run) - see :class:`RecordKeys` for ``k2``."""
        o = self.options
        for chunk in iter_chunks(
            self._segs(),
            rows=o.rows,
            server_ports=o.server_ports,
            detect=o.detect,
            tls_ports=o.tls_ports,
            stats=self.stats,
            reveal_secrets=o.reveal_secrets,
        ):
            self._sync()
            files, k1s = [], []
            adopted = self.adopted
            for run, tagged in enumerate(chunk.file):
                path, _, token = tagged.rpartition("\0")
                files.append(path)
                k1s.append(CLOSE_BASE + adopted[chunk.conn[run]] if token == _CLOSE else int(token))
            chunk.file = files
            yield chunk, k1s, [adopted[c] for c in chunk.conn]
        self._sync()


class RecordKeys:
    """Per record ``k1`` (what completed it) and ``k2`` (its order among the records of that ``k1``), across chunks."""

    def __init__(self) -> None:
        self.k1, self.n = -1, 0

    def keys(self, run_k1: list[int], counts: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """``k1`` and ``k2`` of every record of a chunk (``k1`` and the record count of each run)."""
        k1 = np.repeat(np.array(run_k1, np.int64), np.array(counts, np.int64))
        n = len(k1)
        if not n:
            return k1, k1.copy()
        change = np.empty(n, bool)
        change[0] = True
        np.not_equal(k1[1:], k1[:-1], out=change[1:])
        starts = np.flatnonzero(change)
        k2 = np.arange(n, dtype=np.int64) - np.repeat(starts, np.diff(np.append(starts, n)))
        if k1[0] == self.k1:  # the run of the previous chunk goes on
            k2[: starts[1] if len(starts) > 1 else n] += self.n
        self.k1, self.n = int(k1[-1]), int(k2[-1]) + 1
        return k1, k2


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

    @classmethod
    def from_rows(cls, k1: np.ndarray, n: np.ndarray, cks: list[int], labels: list[str]) -> Numbering:
        """From the keys table's rows: records per ``k1`` (repeats add up), connections' ``ck`` and labels."""
        keys, inv = np.unique(k1, return_inverse=True)
        counts = np.zeros(len(keys), np.int64)
        np.add.at(counts, inv, n)
        base = np.cumsum(counts) - counts
        order = sorted(range(len(cks)), key=cks.__getitem__)
        conn_ids = {cks[j]: i + 1 for i, j in enumerate(order)}
        return cls(keys, base, conn_ids, {i + 1: labels[j] for i, j in enumerate(order)}, int(counts.sum()))

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
