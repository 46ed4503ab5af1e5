"""The explorer's and the stepper's models: plain Python state under the notebook widgets (no ipywidgets here).

:class:`FrameStore` holds the frames table as Arrow record batches plus, per
row, the frame's raw bytes (an Arrow binary column, not one Python object per
row) and an index into the few distinct dissection contexts, so one frame is
annotated without re-reading the capture.

:class:`ExplorerModel` is the explorer: filters (connection, vbucket, stream,
opcode, direction, key text, only problems/anomalies) evaluated with Arrow
compute over the whole table, paging (only the visible page becomes Python
rows), selection with the selected frame's annotation (:func:`~dcpinspect.render.annotate_html`),
its stream's timeline and its vbucket's branch tree (:mod:`dcpinspect.plots`),
and live mode (records appended from a proxy, client or capture callback,
folded in at most every ``interval`` seconds).  Listeners registered with
:meth:`ExplorerModel.on_change` hear what changed; the widgets in
:mod:`dcpinspect.widgets` are such listeners.

:class:`StepperModel` is the teaching mode: a session replayed frame by frame
through one :class:`~dcpinspect.timeline.TimelineBuilder`, each step carrying
its frame's annotation and what that frame changed in the stream's state.
"""

from __future__ import annotations

import asyncio
import bisect
import html
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import spec
from .batches import SCHEMA, chunk_batch
from .columns import FrameColumns
from .decoder import Event, Frame, Gap, Garbage, Truncated
from .dissect import DissectContext
from .records import CaptureStats, Record, RecordChunk, read_chunks, read_records
from .render import annotate_html
from .timeline import MAX_SEQNO, Stream, Timeline, TimelineBuilder, stream_label

__all__ = ["Change", "ExplorerModel", "Filters", "FrameStore", "Step", "StepperModel", "records_of"]

#: columns of the frame list (the visible page)
PAGE_COLUMNS = (
    "frame",
    "ts",
    "conn_id",
    "dir",
    "type",
    "name",
    "vbucket",
    "stream_id",
    "status_name",
    "opaque",
    "key",
    "seqno",
    "problems",
)
_U64 = frozenset(f.name for f in SCHEMA if f.type == pa.uint64())


# ---------------------------------------------------------------------------
# frames


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
        self._refetch_map: dict[int, int] | None = None

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

    def add_chunk(self, chunk: RecordChunk) -> pa.RecordBatch:
        """Append a chunk of records (the capture path: the table's vectorised builder)."""
        batch = chunk_batch(chunk)
        self._append(batch, pa.array([_raw_of(e) for e in chunk.events], type=pa.binary()), self._ctx_ids(chunk.context))
        return batch

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
            return self._refetch(int(get(batch.schema.get_field_index("frame"))[i].as_py()), typ, offset, row)
        data = raw[i].as_py() or b""
        context = self.contexts[int(ctx[i])]
        return _event(typ, offset, data, batch, i), context

    def _refetch(self, frame: int, typ: str, offset: int, row: int) -> tuple[Event, DissectContext | None]:
        if not self.files:
            return Gap(offset, 0), None
        if self._refetched is None:  # read the captures once, keeping raw bytes and contexts only
            other = FrameStore()
            for chunk in read_chunks(self.files):
                other.add_chunk(chunk)
            self._refetched = other
        row2 = self._refetched.row_of(frame)
        if row2 is None:
            return Gap(offset, 0), None
        return self._refetched.event(row2)


def _raw_of(ev: Event) -> bytes:
    if ev.__class__ is Frame:
        return bytes(ev[1])
    return getattr(ev, "data", b"")


def _event(typ: str, offset: int, data: bytes, batch: pa.RecordBatch, i: int) -> Event:
    if typ == "frame":
        upr = batch.column(batch.schema.get_field_index("magic"))[i].as_py() is None
        return Frame(offset, data, "upr" if upr else "mcbp")
    problems = batch.column(batch.schema.get_field_index("problems"))[i].as_py() or [""]
    if typ == "gap":
        return Gap(offset, int(batch.column(batch.schema.get_field_index("length"))[i].as_py() or 0))
    return (Garbage if typ == "garbage" else Truncated)(offset, data, problems[0])


# ---------------------------------------------------------------------------
# explorer


@dataclass(frozen=True)
class Filters:
    """What the frame list shows (``None``/empty: no constraint)."""

    conn: int | None = None
    vbucket: int | None = None
    stream: int | None = None  # index into the timeline's streams
    opcode: str | None = None  # command name, e.g. "DCP_MUTATION"
    direction: str | None = None  # "c2s" | "s2c"
    key: str = ""  # case-insensitive substring of the key
    problems: bool = False  # only frames with problems or in an anomaly


class ExplorerModel:
    """The explorer's state: a frames table, filters, a page, a selection, a timeline; no widgets.

    Build one with :meth:`open` (capture paths, a frames DataFrame or Arrow
    table, records) or :meth:`live`; ``background=True`` reads a capture in a
    thread, the first page is there after the first chunk.
    """

    def __init__(self, store: FrameStore | None = None, *, page_size: int = 50, timeline: bool = True, interval: float = 0.5) -> None:
        self.store = store if store is not None else FrameStore()
        self.page_size = page_size
        self.interval = interval  # live: seconds between refreshes
        self.filters = Filters()
        self.page = 0
        self.selected: int | None = None  # frame number
        self.builder: TimelineBuilder | None = TimelineBuilder() if timeline else None
        self.stats = CaptureStats()
        self.loading = False
        self.error: str | None = None
        self._tl_lock = threading.RLock()
        self._timeline: Timeline | None = None
        self._indices: tuple[Any, np.ndarray] | None = None
        self._listeners: list[Callable[[str], None]] = []
        self._pending: list[Record] = []
        self._pending_lock = threading.Lock()
        self._flush_scheduled = False
        self._loader: threading.Thread | None = None

    # --- construction ---------------------------------------------------------
    @classmethod
    def open(cls, source: Any, *, background: bool = False, timeline: bool = True, page_size: int = 50) -> ExplorerModel:
        """A model over capture path(s), a frames DataFrame / Arrow table, or records."""
        m = cls(page_size=page_size, timeline=timeline)
        if isinstance(source, (str, Path)) or (isinstance(source, (list, tuple)) and source and isinstance(source[0], (str, Path))):
            paths = [str(source)] if isinstance(source, (str, Path)) else [str(p) for p in source]
            m.load(paths, background=background)
        elif isinstance(source, pa.Table):
            m.store.add_table(source.cast(SCHEMA) if source.schema != SCHEMA and set(source.column_names) == set(SCHEMA.names) else source)
        elif hasattr(source, "columns") and hasattr(source, "iloc"):  # pandas
            m.store.add_table(_from_pandas(source))
            m.builder = None if not m.store.files else m.builder
            if m.builder is not None:
                m.builder.feed_all(read_records(m.store.files))
        else:
            m.feed_many(list(source))
            m.flush()
        return m

    def load(self, paths: Sequence[str], *, background: bool = False, rows: int = 16384) -> None:
        """Read captures into the model (``background``: the first chunk now, the rest in a thread)."""
        chunks = read_chunks(paths, rows=rows, stats=self.stats)
        self.loading = True
        first = next(chunks, None)
        if first is not None:
            self._take_chunk(first)

        def rest() -> None:
            try:
                for chunk in chunks:
                    self._take_chunk(chunk)
                    self._notify("rows")
            except Exception as exc:  # surfaced in the view, never lost in a thread
                self.error = f"{type(exc).__name__}: {exc}"
            finally:
                self.loading = False
                self._notify("rows")

        if background:
            self._loader = threading.Thread(target=rest, name="dcpinspect-explorer-load", daemon=True)
            self._loader.start()
        else:
            rest()

    def wait(self, timeout: float | None = None) -> ExplorerModel:
        """Wait for a background load to finish."""
        if self._loader is not None:
            self._loader.join(timeout)
        return self

    def _take_chunk(self, chunk: RecordChunk) -> None:
        self.store.add_chunk(chunk)
        if self.builder is not None:
            with self._tl_lock:
                self.builder.feed_all(chunk.records())
                self._timeline = None

    # --- live -------------------------------------------------------------------
    @classmethod
    def live(cls, source: Any = None, *, interval: float = 0.5, page_size: int = 50) -> ExplorerModel:
        """A live model; attached to ``source`` (a LiveCapture, TapProxy or DcpClient) when given, else use :meth:`on_record`."""
        m = cls(page_size=page_size, interval=interval)
        if source is not None:
            m.attach(source)
        return m

    def attach(self, source: Any) -> None:
        """Chain :meth:`on_record` onto a LiveCapture's, TapProxy's or DcpClient's record callback."""
        target = source
        if hasattr(source, "capture") and source.capture is not None and hasattr(source.capture, "on_record"):
            target = source.capture  # a TapProxy, or a client sharing a capture
        if not hasattr(target, "on_record"):
            raise TypeError(f"cannot follow {type(source).__name__}: it has no on_record callback")
        old = target.on_record

        def both(rec: Record) -> None:
            if old is not None:
                old(rec)
            self.on_record(rec)

        target.on_record = both
        if isinstance(getattr(target, "records", None), list) and target.records:  # a LiveCapture that kept records so far
            self.feed_many(target.records)

    def on_record(self, rec: Record) -> None:
        """The live callback: cheap (an append); the model folds records in at most every ``interval`` s."""
        with self._pending_lock:
            self._pending.append(rec)
            if self._flush_scheduled:
                return
            self._flush_scheduled = True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            timer = threading.Timer(self.interval, self.flush)
            timer.daemon = True
            timer.start()
        else:
            loop.call_later(self.interval, self.flush)

    def feed_many(self, records: Iterable[Record]) -> None:
        """Queue records (folded in by :meth:`flush`)."""
        with self._pending_lock:
            self._pending.extend(records)

    def flush(self) -> int:
        """Fold queued live records into the table and the timeline; returns how many."""
        with self._pending_lock:
            recs, self._pending = self._pending, []
            self._flush_scheduled = False
        if not recs:
            return 0
        self.store.add_records(recs)
        if self.builder is not None:
            with self._tl_lock:
                self.builder.feed_all(recs)
                self._timeline = None
        self._notify("rows")
        return len(recs)

    # --- listeners ----------------------------------------------------------------
    def on_change(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(what)`` on every change: ``rows``, ``filters``, ``page``, ``selection``."""
        self._listeners.append(callback)

    def _notify(self, what: str) -> None:
        for cb in list(self._listeners):
            cb(what)

    # --- timeline -----------------------------------------------------------------
    @property
    def timeline(self) -> Timeline | None:
        """The timeline so far (``None`` when the model has none: a DataFrame without readable files)."""
        if self.builder is None:
            return None
        with self._tl_lock:
            if self._timeline is None:
                self._timeline = self.builder.timeline(final=not self.loading and not self._pending)
            return self._timeline

    def streams(self) -> list[tuple[int, str]]:
        """(index, label) of every stream, for the stream filter."""
        t = self.timeline
        return [] if t is None else [(i, stream_label(s)) for i, s in enumerate(t.streams)]

    def stream_frames(self, i: int) -> np.ndarray:
        """Every frame number of stream ``i``: requests, responses, markers, items, end."""
        t = self.timeline
        if t is None or not 0 <= i < len(t.streams):
            return np.zeros(0, dtype=np.int64)
        s = t.streams[i]
        out = [f for a in s.attempts for f in (a.frame, a.response_frame) if f is not None]
        out += [sn.frame for sn in s.snapshots]
        out += [it.frame for it in s.items]
        if s.end is not None:
            out.append(s.end["frame"])
        return np.unique(np.asarray(out, dtype=np.int64))

    def stream_of(self, frame: int) -> int | None:
        """The index of the stream a frame belongs to (``None``: none)."""
        t = self.timeline
        row = self.store.row_of(frame)
        if t is None or row is None:
            return None
        r = self.store.table.slice(row, 1).select(["conn_id", "vbucket", "stream_id"]).to_pylist()[0]
        for i, s in enumerate(t.streams):
            if s.conn != r["conn_id"]:
                continue
            if any(frame in (a.frame, a.response_frame) for a in s.attempts):
                return i
            if r["vbucket"] != s.vbucket or r["stream_id"] != s.stream_id:
                continue
            lo = s.attempts[0].frame if s.attempts else (s.items[0].frame if s.items else frame)
            hi = s.end["frame"] if s.end is not None else None
            if lo <= frame and (hi is None or frame <= hi):
                return i
        return None

    # --- filters and paging -------------------------------------------------------
    def set_filters(self, **changes: Any) -> None:
        """Change filters (fields of :class:`Filters`); back to the first page."""
        new = replace(self.filters, **changes)
        if new != self.filters:
            self.filters = new
            self.page = 0
            self._notify("filters")

    def clear_filters(self) -> None:
        """No filter."""
        self.set_filters(**{f.name: f.default for f in fields(Filters)})

    def indices(self) -> np.ndarray:
        """Rows (positions in the table) that pass the filters."""
        key = (self.filters, self.store.rows, id(self._timeline))
        if self._indices is not None and self._indices[0] == key:
            return self._indices[1]
        table = self.store.table
        f = self.filters
        masks: list[Any] = []
        if f.conn is not None:
            masks.append(pc.equal(table.column("conn_id"), f.conn))
        if f.vbucket is not None:
            masks.append(pc.equal(table.column("vbucket"), f.vbucket))
        if f.opcode:
            masks.append(pc.equal(table.column("name"), f.opcode))
        if f.direction:
            masks.append(pc.equal(table.column("dir"), f.direction))
        if f.key:
            masks.append(pc.match_substring(table.column("key"), f.key, ignore_case=True))
        mask = None
        for m in masks:
            mask = m if mask is None else pc.and_(mask, m)
        sel = np.ones(table.num_rows, dtype=bool) if mask is None else pc.fill_null(mask, False).to_numpy(zero_copy_only=False)
        if f.stream is not None:
            sel &= np.isin(self.store.frames(), self.stream_frames(f.stream))
        if f.problems:
            probs = pc.greater(pc.fill_null(pc.list_value_length(table.column("problems")), 0), 0).to_numpy(zero_copy_only=False)
            t = self.timeline
            if t is not None and t.anomalies:
                probs = probs | np.isin(self.store.frames(), np.asarray([n for a in t.anomalies for n in a.frames], dtype=np.int64))
            sel &= probs
        idx = np.flatnonzero(sel)
        self._indices = ((self.filters, self.store.rows, id(self._timeline)), idx)
        return idx

    @property
    def total(self) -> int:
        """Rows that pass the filters."""
        return len(self.indices())

    @property
    def pages(self) -> int:
        """Number of pages (at least 1)."""
        return max(1, -(-self.total // self.page_size))

    def goto_page(self, page: int) -> None:
        """Show page ``page`` (clamped)."""
        page = min(max(0, page), self.pages - 1)
        if page != self.page:
            self.page = page
            self._notify("page")

    def next_page(self) -> None:
        """The next page."""
        self.goto_page(self.page + 1)

    def previous_page(self) -> None:
        """The previous page."""
        self.goto_page(self.page - 1)

    def page_table(self) -> pa.Table:
        """The visible page as a small Arrow table (only these rows are materialised)."""
        idx = self.indices()[self.page * self.page_size : (self.page + 1) * self.page_size]
        return self.store.table.take(pa.array(idx, type=pa.int64())).select(list(PAGE_COLUMNS))

    def page_rows(self) -> list[dict[str, Any]]:
        """The visible page as dicts (the columns of :data:`PAGE_COLUMNS`)."""
        rows: list[dict[str, Any]] = self.page_table().to_pylist()
        return rows

    def page_df(self) -> Any:
        """The visible page as a pandas DataFrame."""
        from .tables import _PANDAS

        return self.page_table().to_pandas(types_mapper=_PANDAS.get)

    # --- selection ---------------------------------------------------------------------
    def select(self, frame: int | None) -> None:
        """Select a frame by number (``None``: nothing)."""
        if frame is not None and self.store.row_of(frame) is None:
            raise KeyError(f"no frame {frame}")
        if frame != self.selected:
            self.selected = frame
            self._notify("selection")

    def select_pick(self, event: Any) -> int | None:
        """Select the frame of a matplotlib pick event on one of :mod:`dcpinspect.plots`' artists."""
        from .plots import frame_at

        frame = frame_at(event)
        if frame is not None and self.store.row_of(frame) is not None:
            self.select(frame)
        return frame

    def selected_event(self) -> tuple[Event, DissectContext | None] | None:
        """The selected frame's event and context."""
        if self.selected is None:
            return None
        row = self.store.row_of(self.selected)
        return None if row is None else self.store.event(row)

    def annotation_html(self) -> str:
        """The selected frame's coloured grid and breakdown (escaped HTML); empty without a selection."""
        got = self.selected_event()
        if got is None:
            return ""
        ev, ctx = got
        return f"<div><b>frame {self.selected}</b></div>" + annotate_html(ev, context=ctx)

    def stream_figure(self, *, theme: str = "light") -> Any:
        """The selected frame's stream (or every stream) as :func:`~dcpinspect.plots.plot_seqnos`."""
        from .plots import plot_seqnos

        t = self.timeline
        if t is None:
            return None
        i = self.stream_of(self.selected) if self.selected is not None else self.filters.stream
        return plot_seqnos(t, streams=None if i is None else [i], clock=self._clock(), theme=theme)

    def branch_figure(self, *, theme: str = "light") -> Any:
        """The branch tree of the selected stream's vbucket (or the filtered vbucket)."""
        from .plots import plot_branches

        t = self.timeline
        if t is None:
            return None
        i = self.stream_of(self.selected) if self.selected is not None else self.filters.stream
        vb = t.streams[i].vbucket if i is not None else self.filters.vbucket
        if vb is None and not t.branches:
            return None
        return plot_branches(t, vb, theme=theme)

    def _clock(self) -> tuple[Any, Any]:
        table = self.store.table
        return self.store.frames(), table.column("ts").cast(pa.int64()).to_numpy(zero_copy_only=False)

    # --- choices for the filter widgets ---------------------------------------------
    def choices(self, column: str, limit: int = 500) -> list[Any]:
        """Distinct values of a column (sorted; at most ``limit``)."""
        vals = [v for v in pc.unique(self.store.table.column(column)).to_pylist() if v is not None]
        return sorted(vals)[:limit]

    # --- static display ---------------------------------------------------------------
    def summary(self) -> str:
        """One line: rows, filtered rows, page."""
        state = " (loading...)" if self.loading else ""
        active = {f.name: getattr(self.filters, f.name) for f in fields(Filters) if getattr(self.filters, f.name) != f.default}
        filt = ", ".join(f"{k}={v!r}" for k, v in active.items()) or "none"
        return f"{self.store.rows:,} frames{state}; filters: {filt}; {self.total:,} shown; page {self.page + 1}/{self.pages}"

    def page_html(self) -> str:
        """The visible page as an escaped HTML table."""
        rows = self.page_rows()
        head = "".join(f"<th>{html.escape(c)}</th>" for c in PAGE_COLUMNS)
        body = []
        for r in rows:
            cls = ' style="background:#d55e0022"' if r.get("problems") else ""
            sel = ' style="outline:2px solid #0072b2"' if r["frame"] == self.selected else cls
            body.append(f"<tr{sel}>" + "".join(f"<td>{html.escape(_cell(c, r[c]))}</td>" for c in PAGE_COLUMNS) + "</tr>")
        return f'<table class="dcpinspect-frames"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'

    def _repr_html_(self) -> str:
        return f"<div class='dcpinspect-explorer'><p>{html.escape(self.summary())}</p>{self.page_html()}{self.annotation_html()}</div>"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.text())

    def text(self) -> str:
        """The summary and the visible page as plain text."""
        lines = [self.summary()]
        for r in self.page_rows():
            lines.append("  ".join(_cell(c, r[c]) for c in ("frame", "dir", "name", "vbucket", "status_name", "key", "seqno", "problems")))
        return "\n".join(lines)


def _cell(col: str, v: Any) -> str:
    if v is None:
        return ""
    if col == "problems":
        return "; ".join(v)
    if col in _U64 and v == MAX_SEQNO:
        return "max"
    if col == "opaque":
        return f"0x{v:08x}"
    if col == "ts":
        return str(v)[11:26] if not isinstance(v, int) else str(v)
    return str(v)


def _from_pandas(df: Any) -> pa.Table:
    table = pa.Table.from_pandas(df, preserve_index=False)
    if set(SCHEMA.names) <= set(table.column_names):
        table = table.select(SCHEMA.names).cast(SCHEMA)
    return table


# ---------------------------------------------------------------------------
# step-through


@dataclass(frozen=True)
class Change:
    """One thing a frame changed: a ``kind`` and a sentence.

    Kinds: request, accepted, rollback, error, snapshot, item, end,
    failover-log, branch, ack, sent, stall, noop, anomaly, session.
    """

    kind: str
    text: str


@dataclass
class Step:
    """One frame of a replayed session and its effect."""

    index: int
    record: Record
    changes: list[Change]
    stream: int | None  # index into the final timeline's streams of the stream this frame touched
    state: dict[str, Any] = field(default_factory=dict)  # that stream's state after the frame

    @property
    def frame(self) -> int:
        """The frame (record) number."""
        return self.record.number

    def annotation_html(self) -> str:
        """The frame's grid and breakdown."""
        return annotate_html(self.record.event, context=self.record.context)


def _signature(t: Timeline) -> dict[str, Any]:
    streams = {
        id(s): (
            len(s.attempts),
            s.attempts[-1].outcome if s.attempts else None,
            len(s.snapshots),
            len(s.items),
            s.end is not None,
            s.snapshots[-1].complete if s.snapshots else None,
        )
        for s in t.streams
    }
    return {
        "streams": streams,
        "logs": {vb: len(v) for vb, v in t.logs.items()},
        "branches": {vb: [(b.uuid, b.cut_frame) for b in v] for vb, v in t.branches.items()},
        "flow": len(t.flow),
        "stalls": len(t.stalls),
        "noops": len(t.noops),
        "anomalies": len(t.anomalies),
        "conns": {c: (i.name, tuple(i.features), tuple(i.controls.items()), i.buffer_size, i.bucket) for c, i in t.connections.items()},
    }


def _snap_kind(flags: int) -> str:
    names = [name for bit, name in spec.SNAPSHOT_FLAGS.items() if flags & bit]
    return "|".join(names) or "none"


def _seq(v: int | None) -> str:
    return "-" if v is None else ("max" if v == MAX_SEQNO else str(v))


def _diff(before: dict[str, Any], t: Timeline) -> tuple[list[Change], Stream | None]:
    after = _signature(t)
    out: list[Change] = []
    touched: Stream | None = None
    for s in t.streams:
        old = before["streams"].get(id(s))
        new = after["streams"][id(s)]
        if old == new:
            continue
        touched = s
        label = stream_label(s)
        o_att, o_out, o_snap, o_items, o_end, o_done = old if old is not None else (0, None, 0, 0, False, None)
        if new[0] > o_att:
            a = s.attempts[-1]
            retry = " (retry)" if len(s.attempts) > 1 else ""
            out.append(
                Change("request", f"{label}: stream requested{retry} from seqno {_seq(a.start)} to {_seq(a.end)}, uuid 0x{a.uuid:x}")
            )
        if new[1] != o_out and new[0] == len(s.attempts) and s.attempts:
            a = s.attempts[-1]
            if a.outcome == "success":
                out.append(Change("accepted", f"{label}: stream accepted"))
                log = ", ".join(f"0x{u:x}@{q}" for u, q in a.failover_log)
                out.append(Change("failover-log", f"vbucket {s.vbucket}: failover log replaced: [{log}]"))
            elif a.outcome == "rollback":
                why = f" - {a.explanation}" if a.explanation else ""
                out.append(Change("rollback", f"{label}: rollback to seqno {_seq(a.rollback_seqno)}{why}"))
            elif a.outcome == "error":
                out.append(Change("error", f"{label}: refused ({a.status_name})"))
        if new[2] > o_snap:
            sn = s.snapshots[-1]
            out.append(
                Change("snapshot", f"{label}: snapshot {_seq(sn.start)}-{_seq(sn.end)} opened ({_snap_kind(sn.flags)}, {sn.version})")
            )
        if new[3] > o_items:
            it = s.items[-1]
            cmd = spec.COMMANDS.get(it.opcode)
            snap = s.snapshots[it.snapshot] if it.snapshot >= 0 else None
            where = f" in snapshot {_seq(snap.start)}-{_seq(snap.end)}" if snap is not None else ""
            out.append(Change("item", f"{label}: {cmd.name if cmd else hex(it.opcode)} seqno {_seq(it.seqno)} applied{where}"))
            if new[5] and not o_done and new[2] == o_snap:
                out.append(Change("snapshot", f"{label}: snapshot complete"))
        if new[4] and not o_end and s.end is not None:
            out.append(Change("end", f"{label}: stream ended ({s.end.get('name')})"))
    for vb, n in after["logs"].items():
        if n > before["logs"].get(vb, 0) and not any(c.kind == "failover-log" for c in out):
            entries = t.logs[vb][-1][1]
            out.append(Change("failover-log", f"vbucket {vb}: failover log replaced: [{', '.join(f'0x{u:x}@{q}' for u, q in entries)}]"))
    for vb, bs in after["branches"].items():
        old_b = dict(before["branches"].get(vb, []))
        for uuid, cut in bs:
            if uuid not in old_b:
                b = next(x for x in t.branches[vb] if x.uuid == uuid)
                out.append(Change("branch", f"vbucket {vb}: new branch 0x{uuid:x} from seqno {_seq(b.seqno)}"))
            elif cut is not None and old_b[uuid] is None:
                out.append(Change("branch", f"vbucket {vb}: branch 0x{uuid:x} cut from the history"))
    for f in t.flow[before["flow"] :]:
        size = t.connections[f.conn].buffer_size if f.conn in t.connections else None
        if f.event == "ack":
            out.append(Change("ack", f"conn {f.conn}: buffer acked {f.size:,} bytes, {f.outstanding:,} of {size or '?'} outstanding"))
        else:
            out.append(
                Change(
                    "sent", f"conn {f.conn}: {f.size:,} bytes counted against the buffer, {f.outstanding:,} of {size or '?'} outstanding"
                )
            )
    for st in t.stalls[before["stalls"] :]:
        took = "an unknown time" if st["duration_ns"] is None else f"{st['duration_ns'] / 1e9:.3f} s"
        out.append(Change("stall", f"conn {st['conn']}: stall since frame {st['frame']} ended after {took}"))
    for n in t.noops[before["noops"] :]:
        took = "an unknown time" if n["rtt_ns"] is None else f"{n['rtt_ns'] / 1e6:.3f} ms"
        out.append(Change("noop", f"conn {n['conn']}: noop answered in {took}"))
    for an in t.anomalies[before["anomalies"] :]:
        out.append(Change("anomaly", f"{an.kind}: {an.message}"))
    for c, sig in after["conns"].items():
        if before["conns"].get(c) != sig:
            info = t.connections[c]
            old = before["conns"].get(c)
            if old is None and not any(sig[:2]) and not sig[2] and sig[3] is None and not sig[4]:
                continue
            bits = [f"DCP_OPEN {info.name!r}" if info.name else "", f"buffer {info.buffer_size}" if info.buffer_size else ""]
            if info.controls:
                k, (v, status) = list(info.controls.items())[-1]
                bits.append(f"control {k}={v} ({status})")
            if info.features:
                bits.append("features " + ", ".join(info.features))
            out.append(Change("session", f"conn {c}: " + "; ".join(b for b in bits if b)))
    return out, touched


class StepperModel:
    """A session replayed frame by frame (play/next/previous at a speed) with what each frame changed.

    The changes come from one :class:`~dcpinspect.timeline.TimelineBuilder` fed
    the records one at a time (the state after frame *n* is what the builder
    knew then), not from a second parser.  Meant for teaching-size sessions
    (thousands of frames): every step is computed up front.
    """

    def __init__(self, records: Iterable[Record], *, speed: float = 2.0) -> None:
        self.records = list(records)
        self.speed = speed  # frames per second while playing
        self.position = 0
        self.playing = False
        self._listeners: list[Callable[[str], None]] = []
        self.steps = self._replay()

    def _replay(self) -> list[Step]:
        b = TimelineBuilder()
        steps: list[Step] = []
        before = _signature(b.timeline(final=False))
        index: dict[int, int] = {}
        for i, rec in enumerate(self.records):
            b.feed(rec)
            t = b.timeline(final=False)
            changes, touched = _diff(before, t)
            before = _signature(t)
            state: dict[str, Any] = {}
            stream = None
            if touched is not None:
                stream = index.setdefault(id(touched), next(k for k, s in enumerate(t.streams) if s is touched))
                state = _stream_state(touched, t)
            steps.append(Step(i, rec, changes, stream, state))
        return steps

    @classmethod
    def open(cls, source: Any, *, speed: float = 2.0) -> StepperModel:
        """From capture path(s), records, or a LiveCapture that kept its records."""
        return cls(records_of(source), speed=speed)

    # --- navigation ---------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.steps)

    @property
    def current(self) -> Step | None:
        """The step shown."""
        return self.steps[self.position] if self.steps else None

    def on_change(self, callback: Callable[[str], None]) -> None:
        """Call ``callback("position")`` when the position moves."""
        self._listeners.append(callback)

    def goto(self, i: int) -> None:
        """Show step ``i`` (clamped)."""
        i = min(max(0, i), max(0, len(self.steps) - 1))
        if i != self.position:
            self.position = i
            for cb in list(self._listeners):
                cb("position")

    def next(self) -> Step | None:
        """One frame forward (stops playing at the end)."""
        if self.position >= len(self.steps) - 1:
            self.playing = False
        self.goto(self.position + 1)
        return self.current

    def previous(self) -> Step | None:
        """One frame back."""
        self.goto(self.position - 1)
        return self.current

    def play(self) -> None:
        """Start playing (the view's timer calls :meth:`tick`)."""
        self.playing = True

    def pause(self) -> None:
        """Stop playing."""
        self.playing = False

    def tick(self) -> None:
        """A timer tick: one frame forward while playing."""
        if self.playing:
            self.next()

    def run(self, *, sleep: Callable[[float], None] = time.sleep) -> Iterator[Step]:
        """Play synchronously (plain terminals): yield each step, waiting 1/speed between them."""
        self.play()
        while self.playing and self.current is not None:
            yield self.current
            if self.position >= len(self.steps) - 1:
                break
            sleep(1.0 / max(self.speed, 1e-3))
            self.next()
        self.playing = False

    # --- display ------------------------------------------------------------------
    def changes_html(self) -> str:
        """What the current frame changed, as an escaped HTML list, and the stream's state."""
        st = self.current
        if st is None:
            return "<p>(no frames)</p>"
        items = (
            "".join(f"<li><b>{html.escape(c.kind)}</b>: {html.escape(c.text)}</li>" for c in st.changes)
            or "<li>no change to any stream's state</li>"
        )
        state = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in st.state.items())
        return f"<ul>{items}</ul>" + (f"<table>{state}</table>" if state else "")

    def text(self) -> str:
        """The current step as plain text."""
        st = self.current
        if st is None:
            return "(no frames)"
        from .render import annotate

        ev = st.record.event
        head = f"step {st.index + 1}/{len(self.steps)}: frame {st.frame} ({st.record.direction})"
        body = annotate(ev, context=st.record.context)
        changes = "\n".join(f"  * {c.kind}: {c.text}" for c in st.changes) or "  (no change)"
        return f"{head}\n{body}\nchanges:\n{changes}"

    def _repr_html_(self) -> str:
        st = self.current
        if st is None:
            return "<p>(no frames)</p>"
        head = f"<p>step {st.index + 1}/{len(self.steps)}: frame {st.frame} ({html.escape(st.record.direction)})</p>"
        return f"<div class='dcpinspect-stepper'>{head}{st.annotation_html()}{self.changes_html()}</div>"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.text())


def _stream_state(s: Stream, t: Timeline) -> dict[str, Any]:
    snap = s.snapshots[-1] if s.snapshots else None
    info = t.connections.get(s.conn)
    flow = next((f for f in reversed(t.flow) if f.conn == s.conn), None)
    state: dict[str, Any] = {
        "stream": stream_label(s),
        "attempts": len(s.attempts),
        "last outcome": s.attempts[-1].outcome if s.attempts else None,
        "snapshot": f"{_seq(snap.start)}-{_seq(snap.end)}" + (" (complete)" if snap.complete else "") if snap else None,
        "items": len(s.items),
        "last seqno": _seq(s.last_seqno),
        "end": None if s.end is None else s.end.get("name"),
    }
    if info is not None and info.buffer_size:
        state["outstanding"] = f"{flow.outstanding if flow else 0:,} of {info.buffer_size:,} bytes"
    return state


def records_of(source: Any) -> list[Record]:
    """Records of capture path(s), a list of records, or an object with a ``records`` list (a LiveCapture)."""
    if isinstance(source, (str, Path)):
        return list(read_records([str(source)]))
    if isinstance(source, (list, tuple)) and source and isinstance(source[0], (str, Path)):
        return list(read_records([str(p) for p in source]))
    if isinstance(getattr(source, "records", None), list):
        return list(source.records)
    return list(source)
