"""The frame store: the frames table as Arrow batches, with each row's raw bytes, so any frame is annotated again in O(1).

:class:`FrameStore` keeps, beside every record batch of the frames table
(:data:`~dcpinspect.tables.frames_vector.SCHEMA`), the frames' raw bytes as one
Arrow binary column (not one Python object per row) and, per row, an index
into the few distinct dissection contexts seen.  :meth:`FrameStore.event`
rebuilds a row's event from those bytes; a table added without them (a
DataFrame, a parquet file) has its captures re-read once, on demand.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..flows.records import Record
from ..tables.columnar import TablePart, read_parts
from ..tables.columns import FrameColumns
from ..tables.frames_vector import SCHEMA
from ..wire.dissection import DissectContext
from ..wire.events import Event, Frame, Gap, Garbage, Truncated

__all__ = ["FrameStore"]


class FrameStore:
    """The frames table (Arrow) with each row's raw bytes and context: any frame re-annotated in O(1).

    Thread-safe for one writer (a loader thread or a live feed) and readers.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._batches: list[pa.RecordBatch] = []
        self._raw: list[pa.Array | None] = []
        self._ctx: list[np.ndarray | None] = []
        self._starts: list[int] = []  # first row of each batch
        self.contexts: list[DissectContext] = []
        self._ctx_index: dict[DissectContext, int] = {}
        self.rows = 0
        self._table: pa.Table | None = None
        self._frame_col: np.ndarray | None = None
        self.files: list[str] = []  # captures to re-read for raw bytes of rows added without them
        self._refetched: FrameStore | None = None

    # --- input ----------------------------------------------------------------
    def _append(self, batch: pa.RecordBatch, raw: pa.Array | None, ctx: np.ndarray | None) -> None:
        with self._lock:
            self._starts.append(self.rows)
            self._batches.append(batch)
            self._raw.append(raw)
            self._ctx.append(ctx)
            self.rows += batch.num_rows
            self._table = None
            self._frame_col = None

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
        self._append(part.batch, pa.array([_raw_of(e) for e in part.events()], type=pa.binary()), self._ctx_ids(part.contexts()))
        return part.batch

    def add_records(self, records: Sequence[Record]) -> pa.RecordBatch:
        """Append records (the live path)."""
        cols = FrameColumns().extend(records)
        batch = pa.record_batch([pa.array(cols.cols[f.name], type=f.type) for f in SCHEMA], schema=SCHEMA)
        self._append(batch, pa.array([_raw_of(r.event) for r in records], type=pa.binary()), self._ctx_ids([r.context for r in records]))
        return batch

    def add_table(self, table: pa.Table) -> None:
        """Append a frames table without raw bytes (from a DataFrame or parquet); its files are re-read on demand."""
        for batch in table.to_batches():
            self._append(batch, None, None)
        if "file" in table.column_names:
            for f in pc.unique(table.column("file")).to_pylist():
                if isinstance(f, str) and f not in self.files and Path(f).is_file():
                    self.files.append(f)

    # --- output ---------------------------------------------------------------
    @property
    def table(self) -> pa.Table:
        """Every row so far as one Arrow table (zero-copy over the batches)."""
        t = self._table
        if t is None:
            with self._lock:
                batches = list(self._batches)
            t = pa.Table.from_batches(batches, schema=batches[0].schema) if batches else SCHEMA.empty_table()
            self._table = t
        return t

    def frames(self) -> np.ndarray:
        """The ``frame`` column as numpy (record numbers)."""
        col = self._frame_col
        if col is None or len(col) != self.rows:
            col = self._frame_col = self.table.column("frame").to_numpy().astype(np.int64)
        return col

    def row_of(self, frame: int) -> int | None:
        """The row of a frame number (record numbers are ascending in a capture; searched otherwise)."""
        col = self.frames()
        i = int(np.searchsorted(col, frame))
        if i < len(col) and col[i] == frame:
            return i
        hits = np.flatnonzero(col == frame)
        return int(hits[0]) if len(hits) else None

    def event(self, row: int) -> tuple[Event, DissectContext | None]:
        """The event of a row rebuilt from its raw bytes, and the context it was dissected with."""
        with self._lock:
            b = bisect.bisect_right(self._starts, row) - 1
            start, batch, raw, ctx = self._starts[b], self._batches[b], self._raw[b], self._ctx[b]
        i = row - start
        get = batch.column
        typ = get(batch.schema.get_field_index("type"))[i].as_py()
        offset = get(batch.schema.get_field_index("offset"))[i].as_py() or 0
        if raw is None or ctx is None:
            return self._refetch(int(get(batch.schema.get_field_index("frame"))[i].as_py()), offset)
        data = raw[i].as_py() or b""
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
