"""The explorer's model: plain Python state under the notebook widget (no widget toolkit here).

:class:`ExplorerModel` holds a :class:`~dcpinspect.views.store.FrameStore`, its
filters (connection, vbucket, stream, opcode, direction, key text, only
problems/anomalies) evaluated with Arrow compute over the whole table, paging
(only the visible page becomes Python rows), a selection with the selected
frame's annotation (:func:`~dcpinspect.wire.render.annotate_html`), and the
pictures shown beside it (:class:`Shown`: the selected stream's timeline and
its vbucket's branch tree from :mod:`dcpinspect.views.plots`, the frames worth
jumping to, and which frame a click on either picture hit), and the question
panels (:mod:`dcpinspect.views.panels`): a key's history
(:meth:`ExplorerModel.key_history`), what the shown stream's rollbacks cost
(:meth:`ExplorerModel.rollback_costs`, marked on the branch tree while that
panel is open), consumer lag (:meth:`ExplorerModel.lag`,
:meth:`ExplorerModel.lag_figure`) and two consumers compared
(:meth:`ExplorerModel.comparison`, :meth:`ExplorerModel.compare_figure`),
each computed only when asked and again after the timeline changed.  Live mode folds
records appended from a proxy, client or capture callback in at most every
``interval`` seconds.  Threads and event loops are reached only through a
:class:`~dcpinspect.views.background.Background`.  Listeners registered with
:meth:`ExplorerModel.on_change` hear what changed; the widgets in
:mod:`dcpinspect.views.widgets` are such listeners.  Memory is bounded by
pieces, not the capture: captures are parsed :data:`READ_WINDOW` bytes at a
time, and after each change the table's pages the listeners read leave the
resident set (:meth:`~dcpinspect.views.store.FrameStore.forget_pages`).
"""

from __future__ import annotations

import gc
import html
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..flows.reassembly import TS_UNKNOWN
from ..flows.records import CaptureStats, Record
from ..tables.columnar import TablePart, read_parts
from ..tables.frames_vector import SCHEMA
from ..tables.timeline_feed import feed_parts
from ..timeline import Stream, Timeline, TimelineBuilder, stream_label
from ..wire.dissect import dissect_truncated
from ..wire.dissection import DissectContext
from ..wire.events import Event, Truncated
from ..wire.render import annotate_html, plural, safe_text
from .background import Background, Runner
from .labels import seqno_label
from .store import FrameStore, plain, release_heap

__all__ = [
    "MAX_ITEMS",
    "MAX_POINTS",
    "PAGE_COLUMNS",
    "PNG_DPI",
    "PNG_WIDTH",
    "READ_WINDOW",
    "ExplorerModel",
    "Filters",
    "Shown",
    "key_frames",
    "notify_after",
]

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
PNG_DPI = 100  # the resolution plots are sent to the browser at (clicks are mapped back at the same one)
PNG_WIDTH = 1100  # the pictures' width in pixels until the view says how wide it is
MAX_ITEMS = 500  # items kept per stream for the pictures (up to twice that; the stream filter knows every one)
MAX_POINTS = 4000  # points drawn per picture in all (shared by its streams): a wide picture is 1,100-1,600 pixels
STREAM_HEIGHT = 4.2  # inches: the stream picture's height at PNG_DPI (text stays 10 pt whatever the width)
BRANCH_HEIGHT = 3.0  # inches per vbucket of the branch tree
#: capture bytes the reader parses at once (``read_parts(window=)``): a window's packet arrays and the
#: temporaries of its decode scale with it (16 MiB windows: about 100 MiB more peak RSS at 1M frames, no faster)
READ_WINDOW = 4 << 20


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
    text: str = ""  # a display filter (dcpinspect.tables.filter's language)


@dataclass
class Shown:
    """The pictures beside the frame list: the selected stream's seqnos and its vbucket's branch tree.

    ``key`` is what they were drawn for (the stream, the timeline, the theme);
    a picture is rendered once per width in pixels, at :data:`PNG_DPI` (so its
    text is 10 pt whatever the width), and a click on one is hit-tested on the
    very figure, at the very size, it shows.
    """

    key: tuple[Any, ...]
    figures: dict[str, Any]  # "stream" / "branch" -> matplotlib Figure, or None
    jumps: list[tuple[str, int]]  # (label, frame) of the stream's key frames
    _png: dict[tuple[str, int], bytes] = field(default_factory=dict)
    _width: dict[str, int] = field(default_factory=dict)  # the width each picture was last rendered at

    def _size(self, which: str, width: int | None) -> Any:
        fig = self.figures.get(which)
        if fig is not None:
            px = width or self._width.get(which) or PNG_WIDTH
            _w, h = fig.get_size_inches()
            fig.set_size_inches(max(px, 200) / PNG_DPI, h)
            self._width[which] = px
        return fig

    def png(self, which: str, width: int | None = None) -> bytes:
        """The picture of figure ``which``, ``width`` pixels wide (default: as last rendered, else :data:`PNG_WIDTH`; empty: none)."""
        px = width or self._width.get(which) or PNG_WIDTH
        if (which, px) not in self._png:
            from .plots import figure_png

            fig = self._size(which, px)
            self._png[(which, px)] = b"" if fig is None else figure_png(fig, PNG_DPI)
        self._width[which] = px
        return self._png[(which, px)]

    def describe(self, which: str) -> str:
        """Picture ``which`` in words (its titles, and the message of an empty plot): the image's alternative text."""
        fig = self.figures.get(which)
        if fig is None:
            return ""
        words = [fig._suptitle.get_text()] if getattr(fig, "_suptitle", None) is not None else []
        for ax in fig.axes:
            words.append(ax.get_title())
            words += [t.get_text() for t in ax.texts if t.get_gid() == "empty"]
        return ". ".join(w for w in words if w)

    def frame_at(self, which: str, x: float, y: float) -> int | None:
        """The frame under a click at pixel (``x``, ``y``) of picture ``which`` as last rendered (``None``: nothing there)."""
        from .plots import frame_at_pixel

        fig = self._size(which, None)
        return None if fig is None else frame_at_pixel(fig, x, y, dpi=PNG_DPI)


def notify_after(chunks: int) -> bool:
    """Whether a load tells its listeners after its ``chunks``-th chunk: the 1st, 2nd, 4th, 8th... (O(log n) redraws)."""
    return chunks > 0 and chunks & (chunks - 1) == 0


def key_frames(s: Stream) -> list[tuple[str, int]]:
    """The frames worth jumping to in a stream, by frame: requests, answers, snapshots (first 100), end, anomalies (first 50)."""
    out: list[tuple[str, int]] = []
    for a in s.attempts:
        out.append((f"frame {a.frame}: stream request from {a.start}", a.frame))
        if a.response_frame is not None:
            what = f"rollback to {a.rollback_seqno}" if a.outcome == "rollback" else (a.status_name or a.outcome or "")
            out.append((f"frame {a.response_frame}: {what}", a.response_frame))
    for sn in s.snapshots[:100]:
        out.append((f"frame {sn.frame}: snapshot {sn.start}-{sn.end}", sn.frame))
    if s.end is not None:
        out.append((f"frame {s.end['frame']}: stream end {s.end.get('name')}", s.end["frame"]))
    for an in s.anomalies[:50]:
        if an.frames:
            out.append((f"frame {an.frames[-1]}: {an.kind}", an.frames[-1]))
    seen: set[int] = set()
    unique = []
    for label, f in sorted(out, key=lambda x: x[1]):
        if f not in seen:
            seen.add(f)
            unique.append((label, f))
    return unique


class ExplorerModel:
    """The explorer's state: a frames table, filters, a page, a selection, a timeline; no widgets.

    Build one with :meth:`open` (capture paths, a frames DataFrame or Arrow
    table, records) or :meth:`live`; ``background=True`` reads a capture in a
    thread (through :attr:`runner`), the first page is there after the first chunk.
    """

    def __init__(
        self,
        store: FrameStore | None = None,
        *,
        page_size: int = 50,
        timeline: bool = True,
        interval: float = 0.5,
        runner: Runner | None = None,
    ) -> None:
        self.store = store if store is not None else FrameStore()
        self.runner = runner if runner is not None else Background()  # the only way to threads and event loops
        self.page_size = page_size
        self.interval = interval  # live: seconds between refreshes
        self.filters = Filters()
        self.page = 0
        self.selected: int | None = None  # frame number
        self.builder: TimelineBuilder | None = TimelineBuilder(max_items=MAX_ITEMS, on_items=self._on_items) if timeline else None
        self._item_frames: dict[int, list[np.ndarray]] = {}  # stream index -> the frames of its items (every one, not thinned)
        self.plot_stream: int | None = None  # the stream the pictures show (None: every stream)
        self.filter_error: str | None = None  # why the text filter was not applied
        self.chunks = 0  # chunks of the capture read so far
        self.notified = 0  # how many times a load told its listeners ("rows")
        self._clock_cache: tuple[int, Any] | None = None
        self._stream_frames: dict[int, tuple[int, np.ndarray]] = {}
        self._text_mask: tuple[tuple[str, int], np.ndarray] | None = None
        self.stats = CaptureStats()
        self.loading = False
        self.error: str | None = None
        self._tl_lock = threading.RLock()
        self._timeline: Timeline | None = None
        self._indices: tuple[Any, np.ndarray] | None = None
        self._listeners: list[Callable[[str], None]] = []
        self._pending: list[Record] = []
        self._pending_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._flush_scheduled = False
        self._shown: Shown | None = None
        self.panels: frozenset[str] = frozenset()  # the question panels open (their answers are computed only then)
        self.key_query: tuple[str, int | None] | None = None  # the key panel's (key, collection id)
        self._answers: dict[tuple[Any, ...], Any] = {}  # the panels' answers for ``_answers_stamp``
        self._answers_stamp: tuple[int, int] | None = None
        self._lag_shown: Shown | None = None  # the lag picture last shown (what a click on it is hit-tested on)
        self.compare_query: tuple[int | str, int | str, int | None] | None = None  # the compare panel's (a, b, vbucket)
        self._compare_shown: Shown | None = None  # the comparison picture last shown

    # --- construction ---------------------------------------------------------
    @classmethod
    def open(cls, source: Any, *, background: bool = False, timeline: bool = True, page_size: int = 50) -> ExplorerModel:
        """A model over capture path(s), a frames DataFrame / Arrow table, or records.

        A table or DataFrame is held as it was given (not spilled: it is the caller's, in memory or mapped already).
        """
        given = isinstance(source, pa.Table) or (hasattr(source, "columns") and hasattr(source, "iloc"))
        m = cls(FrameStore(spill=not given), page_size=page_size, timeline=timeline)
        if isinstance(source, (str, Path)) or (isinstance(source, (list, tuple)) and source and isinstance(source[0], (str, Path))):
            paths = [str(source)] if isinstance(source, (str, Path)) else [str(p) for p in source]
            m.load(paths, background=background)
        elif isinstance(source, pa.Table):
            m.store.add_table(_as_frames(source))
        elif hasattr(source, "columns") and hasattr(source, "iloc"):  # pandas
            m.store.add_table(_from_pandas(source))
            m.builder = None if not m.store.files else m.builder
            if m.builder is not None:
                feed_parts(read_parts(m.store.files), m.builder)
        else:
            m.feed_many(list(source))
            m.flush()
        return m

    def load(self, paths: Sequence[str], *, background: bool = False, rows: int = 16384) -> None:
        """Read captures into the model (``background``: in a thread; the listeners hear of the first chunk as soon as it is read)."""
        self.loading = True

        def parts() -> Iterator[TablePart]:
            return read_parts(paths, rows=rows, stats=self.stats, window=READ_WINDOW)

        if background:
            self.runner.start(lambda: self._load_rest(parts()), name="dcpinspect-explorer-load")
        else:
            self._load_rest(parts())

    def _load_rest(self, chunks: Iterator[TablePart]) -> None:
        """The rest of a load; listeners hear of it after the 1st, 2nd, 4th, 8th... chunk and at the end (:func:`notify_after`)."""
        try:
            for chunk in chunks:
                self._take_chunk(chunk)
                if notify_after(self.chunks):
                    self._notify_rows()
        except Exception as exc:  # surfaced in the view, never lost in a thread
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.store.flush()  # the last rows to the spill file too
            # the load's objects (the timeline's) examined once now, in the loader: not by the collector
            # in the middle of the user's first clicks (a full collection of them costs a plot's time)
            gc.collect()
            release_heap()  # what the decode's temporaries took, back to the system (the peak is the load's, not the view's)
            self.loading = False
            self._notify_rows()

    def _notify_rows(self) -> None:
        release_heap()  # what the chunks' columns were built in, back to the system
        self.notified += 1
        self._notify("rows")

    def wait(self, timeout: float | None = None) -> ExplorerModel:
        """Wait for a background load to finish."""
        self.runner.join(timeout)
        return self

    def _take_chunk(self, chunk: TablePart) -> None:
        self.store.add_part(chunk)
        self.chunks += 1
        if self.builder is not None:
            with self._tl_lock:
                feed_parts([chunk], self.builder)
                self.builder.flush()  # the items past MAX_ITEMS per stream thinned now: memory stays small
                self._timeline = None

    def _on_items(self, index: int, items: list[Any]) -> None:
        """The builder's sink: every item's frame, before the builder thins the items it keeps."""
        self._item_frames.setdefault(index, []).append(np.fromiter((it.frame for it in items), dtype=np.int64, count=len(items)))

    # --- live -------------------------------------------------------------------
    @classmethod
    def live(cls, source: Any = None, *, interval: float = 0.5, page_size: int = 50, runner: Runner | None = None) -> ExplorerModel:
        """A live model; attached to ``source`` (a LiveCapture, TapProxy or DcpClient) when given, else use :meth:`on_record`."""
        m = cls(page_size=page_size, interval=interval, runner=runner)
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
        self.runner.later(self.interval, self.flush)

    def feed_many(self, records: Iterable[Record]) -> None:
        """Queue records (folded in by :meth:`flush`)."""
        with self._pending_lock:
            self._pending.extend(records)

    def flush(self) -> int:
        """Fold queued live records into the table and the timeline, in order; returns how many."""
        with self._flush_lock:  # two folds (a timer's and the caller's) never interleave their records
            with self._pending_lock:
                recs, self._pending = self._pending, []
                self._flush_scheduled = False
            if not recs:
                return 0
            self.store.add_records(recs)
            if self.builder is not None:
                with self._tl_lock:
                    self.builder.feed_all(recs)
                    self.builder.flush()
                    self._timeline = None
        self._notify("rows")
        return len(recs)

    # --- listeners ----------------------------------------------------------------
    def on_change(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(what)`` on every change: ``rows``, ``filters``, ``page``, ``selection``, ``plot``, ``panels``, ``key``, ``compare``."""
        self._listeners.append(callback)

    def _notify(self, what: str) -> None:
        for cb in list(self._listeners):
            cb(what)
        self.store.forget_pages()  # the table's pages this action read (a filter's columns) leave the resident set

    # --- timeline -----------------------------------------------------------------
    @property
    def timeline(self) -> Timeline | None:
        """The timeline so far (``None`` when the model has none: a DataFrame without readable files)."""
        if self.builder is None:
            return None
        with self._tl_lock:
            if self._timeline is None:
                self._timeline = self.builder.timeline(final=not self.loading and not self._pending)
                self._timeline.set_first = dict(self.stats.set_first)
            return self._timeline

    def items_seen(self) -> dict[int, int]:
        """Every stream's true number of items, by index (the timeline's own lists are thinned to about :data:`MAX_ITEMS`)."""
        t = self.timeline
        if t is None or self.builder is None:
            return {}
        return {i: self.builder.items_seen(i) for i in range(len(t.streams))}

    def streams(self) -> list[tuple[int, str]]:
        """(index, label) of every stream, for the stream filter."""
        t = self.timeline
        return [] if t is None else [(i, stream_label(s)) for i, s in enumerate(t.streams)]

    def stream_frames(self, i: int) -> np.ndarray:
        """Every frame number of stream ``i``: requests, responses, markers, items (every one, thinned or not), end."""
        t = self.timeline
        if t is None or not 0 <= i < len(t.streams):
            return np.zeros(0, dtype=np.int64)
        cached = self._stream_frames.get(i)
        if cached is not None and cached[0] == self.store.rows:
            return cached[1]
        s = t.streams[i]
        out = [f for a in s.attempts for f in (a.frame, a.response_frame) if f is not None]
        out += [sn.frame for sn in s.snapshots]
        if s.end is not None:
            out.append(s.end["frame"])
        frames = np.unique(np.concatenate([np.asarray(out, dtype=np.int64), self.item_frames(i)]))
        self._stream_frames[i] = (self.store.rows, frames)
        return frames

    def item_frames(self, i: int) -> np.ndarray:
        """Every item frame of stream ``i``, sorted (the builder's sink saw every one; the timeline's own list is thinned)."""
        t = self.timeline
        if t is None or not 0 <= i < len(t.streams):
            return np.zeros(0, dtype=np.int64)
        s = t.streams[i]
        seen = self._item_frames.get(i, [])
        if len(seen) > 1:
            seen[:] = [np.concatenate(seen)]
        kept = np.fromiter((it.frame for it in s.items), dtype=np.int64, count=len(s.items))  # items not flushed yet
        return np.unique(np.concatenate([kept, *seen]))

    def stream_of(self, frame: int) -> int | None:
        """The index of the stream a frame belongs to (``None``: none)."""
        t = self.timeline
        row = self.store.row_of(frame)
        if t is None or row is None:
            return None
        r = self.store.compact.slice(row, 1).select(["conn_id", "vbucket", "stream_id"]).to_pylist()[0]
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
            if new.text != self.filters.text:
                self.filter_error = _filter_error(new.text)
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
        table = self.store.compact
        f = self.filters
        masks: list[Any] = []
        if f.text:
            text_mask = self._text_filter(f.text, table)
            if text_mask is not None:
                masks.append(text_mask)
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

    def _text_filter(self, text: str, table: pa.Table) -> Any:
        """The display filter's mask over ``table`` (``None``, and :attr:`filter_error` set: it could not be applied)."""
        key = (text, table.num_rows)
        if self._text_mask is not None and self._text_mask[0] == key:
            return self._text_mask[1]
        try:
            from ..tables.filter import FilterError, compile_filter
        except ImportError:
            self.filter_error = "display filters are not available in this version"
            return None
        try:
            frame_filter = compile_filter(text)
            used = table.select([c for c in table.column_names if c in frame_filter.fields])
            try:
                mask = frame_filter.mask(used)
            except (pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError):  # a kernel without dictionary support
                mask = frame_filter.mask(plain(used))  # only the columns it reads, decoded
        except FilterError as exc:
            self.filter_error = str(exc)
            return None
        self.filter_error = None
        self._text_mask = (key, mask)
        return mask

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
        return self.store.take(idx, PAGE_COLUMNS)

    def page_rows(self) -> list[dict[str, Any]]:
        """The visible page as dicts (the columns of :data:`PAGE_COLUMNS`)."""
        rows: list[dict[str, Any]] = self.page_table().to_pylist()
        return rows

    def page_df(self) -> Any:
        """The visible page as a pandas DataFrame."""
        from ..tables.schema import pandas_dtype

        return self.page_table().to_pandas(types_mapper=pandas_dtype)

    # --- selection ---------------------------------------------------------------------
    def select(self, frame: int | None) -> None:
        """Select a frame by number (``None``: nothing)."""
        if frame is not None and self.store.row_of(frame) is None:
            raise KeyError(f"no frame {frame}")
        if frame != self.selected:
            self.selected = frame
            i = self.stream_of(frame) if frame is not None else None
            if i is not None:
                self.plot_stream = i  # the pictures follow the selected frame's stream
            self._notify("selection")

    def show_stream(self, i: int | None) -> None:
        """Show stream ``i``'s pictures (``None``: every stream), whatever frame is selected."""
        t = self.timeline
        if i is not None and (t is None or not 0 <= i < len(t.streams)):
            raise KeyError(f"no stream {i}")
        if i != self.plot_stream:
            self.plot_stream = i
            self._notify("plot")

    def select_pick(self, event: Any) -> int | None:
        """Select the frame of a matplotlib pick event on one of :mod:`dcpinspect.views.plots`' artists."""
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
        head = f"<div><b>frame {self.selected}</b></div>"
        if isinstance(ev, Truncated):  # dissected as far as its bytes go, the missing part marked
            d = dissect_truncated(ev, ctx)
            if d is not None:
                line = f"truncated: {ev.length:,} bytes at offset {ev.offset} ({safe_text(ev.reason)})"
                return head + f"<div>{html.escape(line)}</div>" + annotate_html(d)
        return head + annotate_html(ev, context=ctx)

    def shown_stream(self) -> int | None:
        """The stream the pictures show: the one picked (:meth:`show_stream`, or the selected frame's), else the filtered one."""
        return self.plot_stream if self.plot_stream is not None else self.filters.stream

    def stream_figure(self, *, theme: str = "light") -> Any:
        """The shown stream (or every stream, the most interesting first) as :func:`~dcpinspect.views.plots.plot_seqnos`."""
        from .plots import plot_seqnos

        t = self.timeline
        if t is None:
            return None
        i = self.shown_stream()
        return plot_seqnos(
            t,
            streams=None if i is None else [i],
            clock=self._clock(),
            theme=theme,
            stream_items=self.items_seen() if i is None else None,
            size=(PNG_WIDTH / PNG_DPI, STREAM_HEIGHT),
            layout="fixed",
            max_points=MAX_POINTS,
        )

    def branch_figure(self, *, theme: str = "light") -> Any:
        """The branch tree of the shown stream's vbucket (or the filtered vbucket)."""
        from .plots import plot_branches

        t = self.timeline
        if t is None:
            return None
        i = self.shown_stream()
        vb = t.streams[i].vbucket if i is not None else self.filters.vbucket
        if vb is None and not t.branches:
            return None
        losses = self.vbucket_losses(vb) if vb is not None and "rollback" in self.panels else None  # the cost only when asked
        size = (PNG_WIDTH / PNG_DPI, BRANCH_HEIGHT)
        return plot_branches(t, vb, theme=theme, max_vbuckets=4, size=size, layout="fixed", losses=losses)

    def shown(self, *, theme: str = "light") -> Shown | None:
        """The pictures for the shown stream, drawn again only when it or the timeline changed."""
        t = self.timeline
        if t is None or (self.loading and not self.store.rows):
            return None  # nothing read yet: no pictures (not one of "no streams")
        i = self.shown_stream()
        key = (i, id(t), "rollback" in self.panels, theme)
        if self._shown is None or self._shown.key != key:
            figures = {"stream": self.stream_figure(theme=theme), "branch": self.branch_figure(theme=theme)}
            self._shown = Shown(key, figures, key_frames(t.streams[i]) if i is not None else [])
        return self._shown

    def select_click(self, which: str, x: float, y: float) -> int | None:
        """Select the frame under a click at pixel (``x``, ``y``) of the picture ``which`` last :meth:`shown` (nothing hit: no change)."""
        frame = self._shown.frame_at(which, x, y) if self._shown is not None else None
        if frame is not None and self.store.row_of(frame) is not None:
            self.select(frame)
        return frame

    def _clock(self) -> Any:
        """The frames' clock for the plots (:class:`~dcpinspect.views.drawing.Clock`), made once per number of rows."""
        from .drawing import Clock

        cached = self._clock_cache
        if cached is None or cached[0] != self.store.rows:
            ts = self.store.compact.column("ts").cast(pa.int64()).fill_null(TS_UNKNOWN).to_numpy(zero_copy_only=False)
            cached = self._clock_cache = (self.store.rows, Clock((self.store.frames(), ts), "time"))
        return cached[1]

    # --- question panels (dcpinspect.views.panels) ----------------------------------------
    def open_panel(self, name: str, is_open: bool = True) -> None:
        """Open (or close) a question panel of :data:`~dcpinspect.views.panels.PANELS`; its answer is computed only while open."""
        from .panels import PANELS

        if name not in PANELS:
            raise KeyError(f"no panel {name!r} (panels: {', '.join(PANELS)})")
        panels = self.panels | {name} if is_open else self.panels - {name}
        if panels != self.panels:
            self.panels = frozenset(panels)
            self._notify("panels")

    def _answer(self, key: tuple[Any, ...], compute: Callable[[], Any]) -> Any:
        """A panel's answer, cached until the timeline or the rows change (a live fold, a load's chunk)."""
        stamp = (id(self.timeline), self.store.rows)
        if stamp != self._answers_stamp:
            self._answers, self._answers_stamp = {}, stamp
        if key not in self._answers:
            self._answers[key] = compute()
        return self._answers[key]

    def _tables(self) -> dict[str, Any]:
        """The timeline's tables without items (:func:`~dcpinspect.tables.timeline.timeline_frames`; the items come from the store)."""
        from ..tables.timeline import timeline_frames

        t = self.timeline
        if t is None:
            raise ValueError("this explorer has no timeline")
        return self._answer(("tables",), lambda: timeline_frames(t, items=False))

    def key_history(self, key: str, collection: int | None = None) -> Any:
        """Every version of ``key`` (in ``collection``; ``None``: any) each consumer received, with its fate (a DataFrame).

        :func:`~dcpinspect.tables.history.key_versions` over the frames of that
        key only (filtered in Arrow) and the items of those frames; with no row,
        ``attrs["absence"]`` says why (:func:`~dcpinspect.tables.history.key_absence`).
        """
        return self._answer(("key", key, collection), lambda: self._key_history(key, collection))

    def _key_history(self, key: str, collection: int | None) -> Any:
        from ..tables.history import COLUMNS, key_absence, key_versions
        from .panels import item_table, key_frames_table, resume_witnesses

        tables = self._tables()
        frames = key_frames_table(self, key, COLUMNS)
        wanted = frames["frame"].to_numpy(dtype=np.int64)
        t = self.timeline
        if t is None:
            raise ValueError("this explorer has no timeline")

        def keep(i: int, f: np.ndarray) -> np.ndarray:
            return np.union1d(f[np.isin(f, wanted)], resume_witnesses(t, i, f))

        items = item_table(self, range(len(t.streams)), keep=keep)
        both = {**tables, "items": items}
        out = key_versions(frames, both, key=key, cid=collection)
        out.attrs["absence"] = "" if len(out) else key_absence(frames, both, key, collection=collection)
        return out

    def set_key(self, key: str, collection: int | None = None) -> None:
        """The key panel's question (empty key: none); its answer is :meth:`key_rows`."""
        query = (key, collection) if key else None
        if query != self.key_query:
            self.key_query = query
            self._notify("key")

    def key_rows(self) -> Any:
        """The key panel's answer (:meth:`key_history` of :attr:`key_query`; ``None``: no question)."""
        return None if self.key_query is None else self.key_history(*self.key_query)

    def vbucket_losses(self, vbucket: int) -> Any:
        """What each rollback on ``vbucket`` cost (:func:`~dcpinspect.tables.history.rollback_losses` over that vbucket's items)."""
        return self._answer(("losses", vbucket), lambda: self._losses(vbucket))

    def _losses(self, vbucket: int) -> Any:
        from ..tables.history import COLUMNS, rollback_losses
        from .panels import item_table, rows_of_frames

        t = self.timeline
        tables = self._tables()
        mine = [i for i, s in enumerate(t.streams) if s.vbucket == vbucket] if t is not None else []
        rb = tables["rollbacks"]
        if "vbucket" in rb.columns:
            tables = {**tables, "rollbacks": rb[rb["vbucket"] == vbucket].reset_index(drop=True)}
        items = item_table(self, mine) if len(tables["rollbacks"]) else item_table(self, [])
        from ..tables.schema import pandas_dtype

        rows = rows_of_frames(self, items["frame"].to_numpy(dtype=np.int64))
        frames = self.store.take(rows, list(COLUMNS)).to_pandas(types_mapper=pandas_dtype)
        return rollback_losses(frames, {**tables, "items": items})

    def rollback_costs(self, stream: int | None = None) -> Any:
        """The rollbacks of ``stream`` (default: the shown stream) and what each cost (rows of :meth:`vbucket_losses`)."""
        t = self.timeline
        i = self.shown_stream() if stream is None else stream
        if t is None or i is None or not 0 <= i < len(t.streams):
            return None
        losses = self.vbucket_losses(t.streams[i].vbucket)
        return losses[losses["stream"] == i].reset_index(drop=True) if len(losses) else losses

    def lag(self) -> Any:
        """The progress table of the capture so far (:func:`~dcpinspect.tables.progress.progress`; the lag's items only, :mod:`.panels` rule 2)."""
        return self._answer(("lag",), self._lag)

    def _lag(self) -> Any:
        from ..tables.progress import FRAME_COLUMNS, progress
        from ..tables.schema import pandas_dtype
        from .panels import high_seqno_table, item_table, lag_frames

        t = self.timeline
        tables = {**self._tables(), "high_seqnos": high_seqno_table(self)}
        kept = lag_frames(self, tables)
        items = item_table(self, range(len(t.streams)) if t is not None else [], keep=lambda i, _f: kept[i])
        frames = self.store.compact.select(list(FRAME_COLUMNS)).to_pandas(types_mapper=pandas_dtype)
        return progress(frames, {**tables, "items": items})

    def lag_summary(self, top: int | None = 10) -> Any:
        """The worst series first (:func:`~dcpinspect.tables.progress.lag_summary` of :meth:`lag`)."""
        from ..tables.progress import lag_summary

        return lag_summary(self.lag(), top)

    def lag_vbucket(self) -> int | None:
        """The vbucket the lag plot shows: the shown stream's, else the vbucket filter's."""
        t = self.timeline
        i = self.shown_stream()
        return t.streams[i].vbucket if t is not None and i is not None else self.filters.vbucket

    def lag_figure(self, *, theme: str = "light") -> Any:
        """:func:`~dcpinspect.views.plots_lag.plot_lag` of :meth:`lag` for the shown stream's vbucket (every vbucket without one)."""
        from .plots_lag import plot_lag

        return plot_lag(self.lag(), self.lag_vbucket(), theme=theme)

    def lag_shown(self, *, theme: str = "light") -> Shown:
        """:meth:`lag_figure` as a picture (``figures["lag"]``), drawn again only when the timeline or the shown vbucket changed."""
        vb = self.lag_vbucket()
        fig = self._answer(("lag figure", vb, theme), lambda: Shown(("lag", vb, theme), {"lag": self.lag_figure(theme=theme)}, []))
        self._lag_shown = fig
        return fig

    def select_lag_click(self, x: float, y: float) -> int | None:
        """Select the frame under a click at pixel (``x``, ``y``) of the lag picture last :meth:`lag_shown` (nothing hit: no change)."""
        shown = getattr(self, "_lag_shown", None)
        frame = shown.frame_at("lag", x, y) if shown is not None else None
        if frame is not None and self.store.row_of(frame) is not None:
            self.select(frame)
        return frame

    def consumers(self) -> list[tuple[str, int | str]]:
        """(label, selector) of the consumers the compare panel may pick: DCP_OPEN names, then connections (:mod:`.panels` rule 6)."""
        from .panels import consumer_choices

        return consumer_choices(self._tables()) if self.timeline is not None else []

    def set_compare(self, a: int | str | None, b: int | str | None, vbucket: int | None = None) -> None:
        """The compare panel's question: consumers ``a`` and ``b`` (a DCP_OPEN name or a connection; ``None``: the default pair)."""
        query = None if a is None or b is None else (a, b, vbucket)
        if query != self.compare_query:
            self.compare_query = query
            self._notify("compare")

    def compare_pair(self) -> tuple[int | str, int | str, int | None] | None:
        """The pair compared: :attr:`compare_query`, else the capture's two DCP_OPEN names (:func:`~dcpinspect.tables.compare.default_pair`)."""
        from ..tables.compare import default_pair

        if self.compare_query is not None:
            return self.compare_query
        if self.timeline is None:
            return None
        try:
            a, b = default_pair(self._tables())
        except ValueError:
            return None
        return a, b, None

    def comparison(self) -> Any:
        """The :class:`~dcpinspect.tables.compare.Comparison` of :meth:`compare_pair` (``None``: no pair picked).

        :func:`~dcpinspect.tables.compare.compare_consumers` over the
        timeline's tables and every item of the two consumers' streams
        rebuilt from the store, with four columns of the frames table
        (:mod:`.panels` rule 1): what :func:`~dcpinspect.tables.compare.compare` answers on the capture.
        A selector that names nothing raises ``ValueError``.
        """
        pair = self.compare_pair()
        return None if pair is None else self._answer(("compare", *pair), lambda: self._comparison(*pair))

    def _comparison(self, a: int | str, b: int | str, vbucket: int | None) -> Any:
        from ..tables.compare import compare_consumers, consumer_conns, describe_consumer, select_consumer
        from .panels import compare_frames_table, item_table

        t = self.timeline
        if t is None:
            raise ValueError("this explorer has no timeline")
        tables = self._tables()
        conns = set()
        for sel in (a, b):
            picked = consumer_conns(tables, sel)
            conns |= set(picked) if picked is not None else {c.conn for c in t.connections.values()}
        mine = [i for i, s in enumerate(t.streams) if s.conn in conns and (vbucket is None or s.vbucket == vbucket)]
        items = item_table(self, mine)
        frames = compare_frames_table(self, items["frame"].to_numpy(dtype=np.int64), (c for c in conns if c is not None))
        both = {**tables, "items": items}
        label = ", ".join([*self.stats.files] or self.store.files) or "explorer"  # as compare() names a capture
        names = {"a": describe_consumer(label, tables, a), "b": describe_consumer(label, tables, b)}
        return compare_consumers(select_consumer(frames, both, a), select_consumer(frames, both, b), vbucket=vbucket, names=names)

    def compare_figure(self, *, theme: str = "light") -> Any:
        """:func:`~dcpinspect.views.plots_compare.plot_compare` of :meth:`comparison` (``None``: no pair picked)."""
        from .plots_compare import plot_compare

        c = self.comparison()
        return None if c is None else plot_compare(c, theme=theme)

    def compare_shown(self, *, theme: str = "light") -> Shown:
        """:meth:`compare_figure` as a picture (``figures["compare"]``), drawn again only when the timeline or the pair changed."""
        pair = self.compare_pair()
        key = ("compare figure", pair, theme)
        fig = self._answer(key, lambda: Shown(key, {"compare": self.compare_figure(theme=theme)}, []))
        self._compare_shown = fig
        return fig

    def select_compare_click(self, x: float, y: float) -> int | None:
        """Select the frame under a click at pixel (``x``, ``y``) of the comparison picture last :meth:`compare_shown`."""
        shown = self._compare_shown
        frame = shown.frame_at("compare", x, y) if shown is not None else None
        if frame is not None and self.store.row_of(frame) is not None:
            self.select(frame)
        return frame

    def select_difference(self, k: int) -> int | None:
        """Select the first evidence frame of row ``k`` of the comparison's table (:func:`~dcpinspect.views.panels.first_evidence`)."""
        from .panels import first_evidence

        c = self.comparison()
        if c is None or not 0 <= k < len(c.table):
            return None
        frame = first_evidence(c.table.iloc[k].to_dict())
        if frame is not None and self.store.row_of(frame) is not None:
            self.select(frame)
        return frame

    def panel_html(self, name: str) -> str:
        """A panel's answer as escaped HTML (the widget's content and the static rendering)."""
        from .panels import COMPARE_SHOWN, HISTORY_SHOWN, LAG_SHOWN, LOSS_SHOWN, html_table, story_html

        if name == "key":
            df = self.key_rows()
            if df is None:
                return "<i>type a key</i>"
            key, cid = self.key_query or ("", None)
            what = html.escape(safe_text(key, 200)) + ("" if cid is None else f" in collection {cid:#x}")
            if not len(df):
                return f"<p><b>{what}</b>: {html.escape(df.attrs.get('absence', ''))}</p>"
            return f"<p><b>{what}</b>: {plural(len(df), 'version')}</p>" + html_table(df, HISTORY_SHOWN, selected=self.selected)
        if name == "rollback":
            df = self.rollback_costs()
            if df is None:
                return "<i>select a frame of a stream: its rollbacks and what they cost show here</i>"
            i = self.shown_stream()
            if not len(df):
                return f"<p>stream {i} had no rollback</p>"
            return f"<p>stream {i}: rollbacks and what they cost</p>" + html_table(df, LOSS_SHOWN)
        if name == "lag":
            return "<p>consumer lag, worst first</p>" + html_table(self.lag_summary(None), LAG_SHOWN)
        if name == "compare":
            try:
                c = self.comparison()
            except ValueError as exc:
                return f"<p>{html.escape(safe_text(str(exc), 300))}</p>"
            if c is None:
                return "<i>pick two consumers to compare</i>"
            return story_html(c.story) + html_table(c.table, COMPARE_SHOWN)
        raise KeyError(f"no panel {name!r}")

    # --- choices for the filter widgets ---------------------------------------------
    def choices(self, column: str, limit: int = 500) -> list[Any]:
        """Distinct values of a column (sorted; at most ``limit``)."""
        vals = [v for v in pc.unique(self.store.compact.column(column)).to_pylist() if v is not None]
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
        panels = "".join(self.panel_html(p) for p in sorted(self.panels)) if self.builder is not None else ""
        return (
            f"<div class='dcpinspect-explorer'><p>{html.escape(self.summary())}</p>{self.page_html()}{self.annotation_html()}{panels}</div>"
        )

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
    if col in _U64:
        return seqno_label(v)
    if col == "opaque":
        return f"0x{v:08x}"
    if col == "ts":
        return str(v)[11:26] if not isinstance(v, int) else str(v)
    return str(v)


def _filter_error(text: str) -> str | None:
    """Why a display filter does not compile (``None``: it does, or there is none)."""
    if not text:
        return None
    try:
        from ..tables.filter import FilterError, compile_filter
    except ImportError:
        return "display filters are not available in this version"
    try:
        compile_filter(text)
    except FilterError as exc:
        return str(exc)
    return None


def _as_frames(table: pa.Table) -> pa.Table:
    """A frames table as the store takes it: as it is when it has the schema's columns (plain or dictionary-encoded), else cast to it."""
    types = [f.type.value_type if pa.types.is_dictionary(f.type) else f.type for f in table.schema]
    if table.column_names == SCHEMA.names and types == SCHEMA.types:
        return table
    if set(table.column_names) == set(SCHEMA.names):
        return table.select(SCHEMA.names).cast(SCHEMA)
    return table


def _from_pandas(df: Any) -> pa.Table:
    table = pa.Table.from_pandas(df, preserve_index=False)
    if set(SCHEMA.names) <= set(table.column_names):
        table = table.select(SCHEMA.names).cast(SCHEMA)
    return table
