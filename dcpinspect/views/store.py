"""The frame store: the frames table as compact Arrow batches in a memory-mapped spill file, each row's raw bytes in another, so any frame is annotated again in O(1).

:class:`FrameStore` keeps the frames table
(:data:`~dcpinspect.tables.frames_vector.SCHEMA`) as Arrow record batches,
and holds no Python object per row:

1. **Compact batches.**  The few-valued text columns (:data:`DICTIONARY_COLUMNS`:
   file, connection label, direction, type, name, role, status, JSON check)
   are dictionary-encoded, and a column that is null on every row of a batch
   shares one buffer of nulls with every other such column of its type and
   length: :attr:`FrameStore.compact`.  :attr:`FrameStore.table` is the
   frames table with the schema's own types (decoded on each call);
   :func:`plain` decodes any table.
2. **Batches spilled.**  Each compact batch is written to an unnamed
   temporary file (an Arrow IPC stream) and read back zero-copy from a
   memory map of it (:class:`_BatchSpill`): the table's bytes live in the
   page cache, and only the pages a filter or a page of the list reads are
   in the process's memory.  ``FrameStore(spill=False)`` keeps them in memory.
3. **Raw bytes spilled.**  Frames' bytes go to another temporary file, a
   window's frame buffer at a time (:meth:`~dcpinspect.tables.columnar.TablePart.arrays`,
   no event object per row); the store keeps each row's position and length
   (two int64 per row).  :meth:`FrameStore.event` reads one row's bytes back
   (``pread``) and rebuilds its event; a table added without them (a
   DataFrame, a parquet file) has its captures re-read once, on demand.
4. Per row, an index into the few distinct dissection contexts seen.
5. **Pages let go.**  The pages of the spill file a scan read stay mapped
   into the process (its resident set) until :meth:`FrameStore.forget_pages`
   lets them go (``MADV_DONTNEED``: the bytes stay in the file and the page
   cache, a later read maps them again); the explorer calls it after each
   action, so the resident set holds what one action reads, not what every
   action so far read.  :func:`release_heap` hands the allocators' free
   memory back to the system (Arrow's pool, then glibc's ``malloc_trim``).
"""

from __future__ import annotations

import bisect
import ctypes
import mmap
import os
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..flows.records import Record
from ..tables.columnar import TablePart, read_parts
from ..tables.columns import FrameColumns
from ..tables.frames_vector import SCHEMA
from ..wire.dissection import DissectContext
from ..wire.events import Event, Frame, Gap, Garbage, Truncated

__all__ = ["DICTIONARY_COLUMNS", "FrameStore", "compact_schema", "plain", "release_heap"]

#: text columns with few distinct values, held dictionary-encoded
DICTIONARY_COLUMNS = frozenset(("file", "conn", "dir", "type", "name", "role", "status_name", "json_check"))


def plain(table: pa.Table) -> pa.Table:
    """``table`` with its dictionary-encoded columns decoded (the frames table's own types)."""
    if not any(pa.types.is_dictionary(f.type) for f in table.schema):
        return table
    fields = [pa.field(f.name, f.type.value_type, metadata=f.metadata) if pa.types.is_dictionary(f.type) else f for f in table.schema]
    return table.cast(pa.schema(fields, metadata=table.schema.metadata))


def compact_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with the text columns of :data:`DICTIONARY_COLUMNS` dictionary-encoded."""
    dict_of = pa.dictionary(pa.int32(), pa.string())
    fields = [f.with_type(dict_of) if f.name in DICTIONARY_COLUMNS and pa.types.is_string(f.type) else f for f in schema]
    return pa.schema(fields, metadata=schema.metadata)


_TRIM: list[Any] = []  # glibc's malloc_trim, or None: looked up once


def release_heap() -> None:
    """Give the allocators' free memory back to the system: Arrow's pool's, then the C heap's (``malloc_trim``, glibc only)."""
    pa.default_memory_pool().release_unused()
    if not _TRIM:
        fn = None
        if sys.platform.startswith("linux"):
            try:
                fn = ctypes.CDLL(None).malloc_trim
                fn.argtypes = [ctypes.c_size_t]
                fn.restype = ctypes.c_int
            except (OSError, AttributeError):  # not glibc
                fn = None
        _TRIM.append(fn)
    if _TRIM[0] is not None:
        _TRIM[0](0)


class _Nulls:
    """One all-null array per (type, length), shared by every all-null column of every batch."""

    def __init__(self) -> None:
        self._made: dict[tuple[pa.DataType, int], pa.Array] = {}

    def __call__(self, typ: pa.DataType, n: int) -> pa.Array:
        got = self._made.get((typ, n))
        if got is None:
            got = self._made[(typ, n)] = pa.nulls(n, typ)
        return got


_SEGMENT = 256 << 20  # bytes of the batch spill file mapped at once
COALESCE_ROWS = 1 << 15  # rows gathered into one batch before it is spilled (held twice while merged: 8 MiB a batch at 1M frames)
_PAGE = mmap.ALLOCATIONGRANULARITY


class _BatchSpill:
    """Record batches written to an unnamed temporary file and read back zero-copy from a memory map of it.

    The file is sparse and mapped in segments of :data:`_SEGMENT` bytes (one
    map each, made once); a batch is written as a small Arrow IPC stream at the
    next free offset of the last segment, and the batch read back from the map
    references the file's pages: they are in the page cache, not the heap, and
    only those read (a filtered column, a page's rows) are ever in memory.
    A batch spilled holds :data:`COALESCE_ROWS` rows, so that each column is
    one long run of the file: the page cache hands a mapping whole large
    folios, and a column read in short runs between its neighbours would map
    them too.
    """

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile(prefix="dcpinspect-table-")  # noqa: SIM115  # open as long as the store
        self._maps: list[tuple[int, mmap.mmap, pa.Buffer]] = []  # (start, map, its buffer)
        self._end = 0  # the end of the last segment
        self._at = 0  # the next free byte

    def forget(self) -> None:
        """Let the kernel unmap every page read so far (the data stays in the file; a later read maps it again)."""
        for _start, m, _buf in self._maps:
            if hasattr(m, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
                m.madvise(mmap.MADV_DONTNEED)

    def put(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """Write ``batch`` (straight to the file, no copy in memory) and read it back from the map."""
        room = int(batch.nbytes * 1.25) + (1 << 20)  # the stream's size at most: the buffers, padding, the schema, dictionaries
        if self._at + room > self._end:  # a new segment, from the next aligned offset
            start = -(-self._at // _PAGE) * _PAGE
            size = max(_SEGMENT, -(-room // _PAGE) * _PAGE)
            self._file.truncate(start + size)
            m = mmap.mmap(self._file.fileno(), size, offset=start)
            if hasattr(m, "madvise") and hasattr(mmap, "MADV_RANDOM"):
                m.madvise(mmap.MADV_RANDOM)  # a column is read, not its neighbours: no read-around into the process
            self._maps.append((start, m, pa.py_buffer(m)))
            self._at, self._end = start, start + size
        start, _m, buf = self._maps[-1]
        self._file.seek(self._at)
        sink = pa.PythonFile(self._file, mode="w")
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        self._file.flush()
        size = self._file.tell() - self._at
        got = pa.ipc.open_stream(buf.slice(self._at - start, size)).read_next_batch()
        self._at += size
        return got


class FrameStore:
    """The frames table (compact Arrow) with each row's raw bytes (spilled) and context: any frame re-annotated in O(1).

    Thread-safe for one writer (a loader thread or a live feed) and readers.
    ``spill=False`` keeps the batches in memory (the raw bytes are spilled always).
    """

    def __init__(self, *, spill: bool = True) -> None:
        self._lock = threading.Lock()
        self._batches: list[pa.RecordBatch] = []
        self._pos: list[np.ndarray | None] = []  # per batch: each row's bytes in the spill file ...
        self._len: list[np.ndarray | None] = []  # ... and their length
        self._ctx: list[np.ndarray | None] = []
        self._starts: list[int] = []  # first row of each batch
        self.contexts: list[DissectContext] = []
        self._ctx_index: dict[DissectContext, int] = {}
        self.rows = 0
        self._table: pa.Table | None = None
        self._frame_col: np.ndarray | None = None
        self.files: list[str] = []  # captures to re-read for raw bytes of rows added without them
        self._refetched: FrameStore | None = None
        self._spill: IO[bytes] | None = None
        self._spilled = 0  # bytes written to the spill file
        self._joined: tuple[Any, int] | None = None  # the last frame buffer written, and where
        self._nulls = _Nulls()
        self._schemas: dict[pa.Schema, pa.Schema] = {}
        self._batch_spill: _BatchSpill | None = None
        self.spill = spill
        self._unspilled = 0  # the first batch not spilled yet (the batches before it are in the spill file)

    # --- input ----------------------------------------------------------------
    def _compact(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        n = batch.num_rows
        schema = self._schemas.get(batch.schema)
        if schema is None:
            schema = self._schemas[batch.schema] = compact_schema(batch.schema)
        cols = []
        for f, given in zip(schema, batch.columns, strict=True):
            if pa.types.is_dictionary(f.type) and not pa.types.is_dictionary(given.type):
                cols.append(given.dictionary_encode())
            elif n and given.null_count == n:
                cols.append(self._nulls(f.type, n))
            else:
                cols.append(given)
        return pa.RecordBatch.from_arrays(cols, schema=schema)

    def _append(self, batch: pa.RecordBatch, pos: np.ndarray | None, length: np.ndarray | None, ctx: np.ndarray | None) -> None:
        batch = self._compact(batch)
        with self._lock:
            self._starts.append(self.rows)
            self._batches.append(batch)
            self._pos.append(pos)
            self._len.append(length)
            self._ctx.append(ctx)
            self.rows += batch.num_rows
            self._table = None
            self._frame_col = None
        if self.spill and self.rows - self._starts[self._unspilled] >= COALESCE_ROWS:
            self.flush()

    def flush(self) -> None:
        """Spill the batches added since the last spill, as one batch (a load calls it at its end)."""
        with self._lock:
            first, last = self._unspilled, len(self._batches)
            pos, length, ctx = self._pos[first:last], self._len[first:last], self._ctx[first:last]
            if not self.spill or last - first < 1 or any(p is None for p in pos) or any(c is None for c in ctx):
                return
            batches = self._batches[first:last]
        try:
            if self._batch_spill is None:
                self._batch_spill = _BatchSpill()
            merged = pa.Table.from_batches(batches).combine_chunks().to_batches()  # one batch, dictionaries unified
            if len(merged) != 1:
                return
            spilled = self._batch_spill.put(merged[0])
        except OSError:  # no room for a temporary file: kept in memory
            self.spill = False
            return
        with self._lock:  # readers holding the old batches keep them; the rows and their numbers are the same
            self._batches[first:last] = [pa.RecordBatch.from_arrays(spilled.columns, schema=batches[0].schema)]
            del self._starts[first + 1 : last]
            self._pos[first:last] = [np.concatenate(pos)]  # type: ignore[arg-type]
            self._len[first:last] = [np.concatenate(length)]  # type: ignore[arg-type]
            self._ctx[first:last] = [np.concatenate(ctx)]  # type: ignore[arg-type]
            self._unspilled = len(self._batches)
            self._table = None
        pa.default_memory_pool().release_unused()  # the merged copy, back to the system

    def forget_pages(self) -> None:
        """Drop the spill file's pages read so far from the process's resident set (rule 5; nothing changes for readers)."""
        with self._lock:
            if self._batch_spill is not None:
                self._batch_spill.forget()

    def _write(self, data: bytes | memoryview) -> int:
        """Append ``data`` to the spill file; where it starts."""
        if self._spill is None:
            self._spill = tempfile.TemporaryFile(prefix="dcpinspect-frames-")  # noqa: SIM115  # open as long as the store
        at = self._spilled
        self._spill.seek(at)
        self._spill.write(data)
        self._spilled += len(data)
        return at

    def _joined_at(self, joined: Any) -> int:
        """Where a part's frame buffer is in the spill file (written once for all the parts that share it)."""
        if self._joined is not None and self._joined[0] is joined:
            return self._joined[1]
        at = self._write(joined)
        self._joined = (joined, at)
        return at

    def _ctx_ids(self, contexts: Sequence[DissectContext]) -> np.ndarray:
        by_id: dict[int, int] = {}
        out = np.empty(len(contexts), dtype=np.int32)
        for i, c in enumerate(contexts):
            k = by_id.get(id(c))
            if k is None:
                k = self._ctx_index.get(c)
                if k is None:
                    k = self._ctx_index[c] = len(self.contexts)
                    self.contexts.append(c)
                by_id[id(c)] = k
            out[i] = k
        return out

    def add_part(self, part: TablePart) -> pa.RecordBatch:
        """Append a part of the frames table (the capture path: :func:`~dcpinspect.tables.columnar.read_parts`)."""
        arr = part.arrays()
        n = len(part)
        pos = np.zeros(n, np.int64)
        length = np.zeros(n, np.int64)
        framed = np.asarray(arr.framed, bool)
        with self._lock:
            if framed.any():
                base = self._joined_at(arr.joined)
                pos[framed] = base + arr.start[framed]
                length[framed] = arr.length[framed]
            others = np.flatnonzero(~framed)
            if len(others):  # gaps, garbage, truncated frames: rare, their events made one by one
                events = part.events()
                for i in others.tolist():
                    data = _raw_of(events[i])
                    pos[i], length[i] = self._write(data), len(data)
        batch = part.batch
        self._append(batch, pos, length, self._ctx_ids(part.contexts()))
        return batch

    def add_records(self, records: Sequence[Record]) -> pa.RecordBatch:
        """Append records (the live path)."""
        cols = FrameColumns().extend(records)
        batch = pa.record_batch([pa.array(cols.cols[f.name], type=f.type) for f in SCHEMA], schema=SCHEMA)
        pos = np.zeros(len(records), np.int64)
        length = np.zeros(len(records), np.int64)
        with self._lock:
            for i, r in enumerate(records):
                data = _raw_of(r.event)
                pos[i], length[i] = self._write(data), len(data)
        self._append(batch, pos, length, self._ctx_ids([r.context for r in records]))
        return batch

    def add_table(self, table: pa.Table) -> None:
        """Append a frames table without raw bytes (from a DataFrame or parquet); its files are re-read on demand."""
        for batch in table.to_batches():
            self._append(batch, None, None, None)
        if "file" in table.column_names:
            for f in pc.unique(table.column("file")).to_pylist():
                if isinstance(f, str) and f not in self.files and Path(f).is_file():
                    self.files.append(f)

    # --- output ---------------------------------------------------------------
    @property
    def table(self) -> pa.Table:
        """Every row so far as the frames table, with its own column types (decoded from :attr:`compact` on each call)."""
        return plain(self.compact)

    @property
    def compact(self) -> pa.Table:
        """Every row so far as one Arrow table, zero-copy over the compact batches (what the explorer filters; :func:`plain` decodes it)."""
        t = self._table
        if t is None:
            with self._lock:
                batches = list(self._batches)
            if not batches:
                t = pa.Table.from_batches([], schema=compact_schema(SCHEMA))
            elif all(b.schema == batches[0].schema for b in batches):
                t = pa.Table.from_batches(batches, schema=batches[0].schema)
            else:  # parts of other schemas (a table added with more columns): unified
                t = pa.concat_tables([pa.Table.from_batches([b]) for b in batches], promote_options="permissive")
            self._table = t
        return t

    def take(self, rows: np.ndarray, columns: Sequence[str] | None = None) -> pa.Table:
        """Rows ``rows`` (positions in the table, in that order) as a small plain table, read from their own batches only.

        (``Table.take`` over many chunks concatenates whole columns first: every
        page of the spill file read for a page of 50 rows.)
        """
        with self._lock:
            batches, starts = list(self._batches), np.asarray(self._starts, dtype=np.int64)
        rows = np.asarray(rows, dtype=np.int64)
        if not batches or not len(rows):
            empty = self.compact.slice(0, 0)
            return plain(empty.select(list(columns)) if columns is not None else empty)
        which = np.searchsorted(starts, rows, side="right") - 1
        parts = []
        for b in np.unique(which).tolist():
            batch = batches[b] if columns is None else batches[b].select(list(columns))
            parts.append((np.flatnonzero(which == b), plain(pa.Table.from_batches([batch.take(pa.array(rows[which == b] - starts[b]))]))))
        table = pa.concat_tables([t for _at, t in parts], promote_options="permissive")
        order = np.concatenate([at for at, _t in parts])
        return table.take(pa.array(np.argsort(order, kind="stable")))

    def plain_table(self) -> pa.Table:
        """Every row so far with the frames table's own column types (dictionary columns decoded): :attr:`table`."""
        return plain(self.compact)

    def frames(self) -> np.ndarray:
        """The ``frame`` column as numpy (record numbers)."""
        col = self._frame_col
        if col is None or len(col) != self.rows:
            col = self._frame_col = self.compact.column("frame").to_numpy().astype(np.int64)
        return col

    def row_of(self, frame: int) -> int | None:
        """The row of a frame number (record numbers are ascending in a capture; searched otherwise)."""
        col = self.frames()
        i = int(np.searchsorted(col, frame))
        if i < len(col) and col[i] == frame:
            return i
        hits = np.flatnonzero(col == frame)
        return int(hits[0]) if len(hits) else None

    def raw(self, row: int) -> bytes | None:
        """Row ``row``'s raw bytes (``None``: the store has none for it)."""
        with self._lock:
            b = bisect.bisect_right(self._starts, row) - 1
            pos, length = self._pos[b], self._len[b]
            i = row - self._starts[b]
            if pos is None or length is None:
                return None
            n = int(length[i])
            if not n or self._spill is None:
                return b""
            self._spill.flush()
            return os.pread(self._spill.fileno(), n, int(pos[i]))

    def event(self, row: int) -> tuple[Event, DissectContext | None]:
        """The event of a row rebuilt from its raw bytes, and the context it was dissected with."""
        with self._lock:
            b = bisect.bisect_right(self._starts, row) - 1
            start, batch, ctx = self._starts[b], self._batches[b], self._ctx[b]
        i = row - start
        get = batch.column
        typ = get(batch.schema.get_field_index("type"))[i].as_py()
        offset = get(batch.schema.get_field_index("offset"))[i].as_py() or 0
        data = self.raw(row)
        if data is None or ctx is None:
            return self._refetch(int(get(batch.schema.get_field_index("frame"))[i].as_py()), offset)
        context = self.contexts[int(ctx[i])]
        return _event(typ, offset, data, batch, i), context

    def _refetch(self, frame: int, offset: int) -> tuple[Event, DissectContext | None]:
        if not self.files:
            return Gap(offset, 0), None
        if self._refetched is None:  # read the captures once, keeping raw bytes and contexts only
            other = FrameStore()
            for part in read_parts(self.files):
                other.add_part(part)
            self._refetched = other
        row = self._refetched.row_of(frame)
        if row is None:
            return Gap(offset, 0), None
        return self._refetched.event(row)

    def close(self) -> None:
        """Drop the spill file (the store keeps its table; raw bytes are gone)."""
        with self._lock:
            if self._spill is not None:
                self._spill.close()
                self._spill = None
                self._pos = [None] * len(self._pos)
                self._len = [None] * len(self._len)


def _raw_of(ev: Event) -> bytes:
    """The bytes an event stands for: a frame's whole message, garbage's or a truncated frame's bytes (none for a gap)."""
    if ev.__class__ is Frame:
        return bytes(ev[1])
    return getattr(ev, "data", b"")


def _event(typ: str, offset: int, data: bytes, batch: pa.RecordBatch, i: int) -> Event:
    """Row ``i`` of ``batch`` as the event it was made from: its ``type``, ``offset`` and raw ``data``."""
    if typ == "frame":
        upr = batch.column(batch.schema.get_field_index("magic"))[i].as_py() is None
        return Frame(offset, data, "upr" if upr else "mcbp")
    problems = batch.column(batch.schema.get_field_index("problems"))[i].as_py() or [""]
    if typ == "gap":
        return Gap(offset, int(batch.column(batch.schema.get_field_index("length"))[i].as_py() or 0))
    return (Garbage if typ == "garbage" else Truncated)(offset, data, problems[0])
