"""The HTML report of an analysis: one self-contained page, one section per capture set (an edge: imports matplotlib).

Theory of operation
-------------------
:func:`render_report` takes what ``dcpinspect analyze`` computed - the merged
timeline, the frames table (or a sample of it), the per-file status - and
returns one page that needs no script and no file beside it:

* a header with the run's counts and a table of contents;
* the capture sets (:mod:`dcpinspect.capture.sets`), the files and every
  connection - those with no memcached frames decoded (TLS) too - each with its
  file and set;
* one section per capture set (:mod:`.report_sets`), its time counted from
  the set's own first frame: its anomalies, frames per opcode, one small plot
  per stream (each with its own seqno scale: a stream at seqno 16 million
  leaves the others readable), the failover branch tree of each history of
  each vbucket, flow control, and noop round trips;
* the frames the anomalies name, each with an anchor (``#frame-N``, N the
  run's frame number) that the anomaly tables link to, its file, its number
  within its set and the ``dcpinspect show FILE --frame N`` that shows it.

:func:`report_from_captures` makes the same page from capture files in this
process (no Spark): the columnar reader's frames table and the timeline fed from it.

Rules:

1. Everything from the wire or the file system is escaped
   (:func:`~.report_html.esc`); plots are PNG data URIs.
2. Bounded whatever the capture: at most :data:`MAX_STREAM_PLOTS` stream
   plots per set (those with anomalies or rollbacks first, then the busiest:
   :func:`~dcpinspect.views.plots.pick_streams`), at most
   :data:`MAX_SET_SECTIONS` set sections, :data:`MAX_TREES` branch trees per
   set, :data:`MAX_NAMED` frames linked per anomaly, :data:`MAX_ROWS` rows per
   table.  Whatever is left out is said in a sentence (``showing 24 of 33
   streams; the rest are in the table below``) and listed in a table.
3. Words agree with numbers (``1 connection``, ``2 connections``).
4. A plot that fails is a line saying so; the rest of the page is still written.
"""

from __future__ import annotations

import datetime as _dt
import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..flows.reassembly import TS_UNKNOWN
from ..timeline import Stream, Timeline, stream_label
from .report_html import STYLE, Cell, esc, figure_img, plural, table
from .report_sets import SetPart, history_timeline, locate, split_sets

if TYPE_CHECKING:
    from .drawing import Clock

__all__ = [
    "FRAME_COLUMNS",
    "MAX_CELL",
    "MAX_NAMED",
    "MAX_ROWS",
    "MAX_SET_SECTIONS",
    "MAX_STREAM_PLOTS",
    "MAX_TREES",
    "named_frames",
    "render_report",
    "report_from_captures",
    "set_clock",
    "stream_figure",
]

from .report_html import MAX_CELL

MAX_ROWS = 2000  # rows of a table of things not drawn (streams, sets)
MAX_STREAM_PLOTS = 24  # small seqno plots per capture set
MAX_SET_SECTIONS = 40  # capture sets given a section of their own (the rest: a table)
MAX_TREES = 8  # branch trees (vbucket, history) drawn per capture set
MAX_NAMED = 5  # frames linked per anomaly
MAX_ANOMALY_ROWS = 200  # anomaly rows per set
#: the frames-table columns the report reads (those present)
FRAME_COLUMNS = (
    "frame",
    "capture_set",
    "set_frame",
    "file",
    "conn_id",
    "dir",
    "ts",
    "type",
    "name",
    "vbucket",
    "opaque",
    "status_name",
    "problems",
)
_STREAM_SIZE = (4.8, 2.8)  # inches at 96 dpi: 461 x 269 px, shown at the grid's width
_DPI = 80


# ---------------------------------------------------------------------------
# the frames table


def _frames_df(frames: Any) -> Any:
    """The report's columns of a frames table (Arrow or pandas) as pandas, ``ts`` as int64 ns (unknown: ``TS_UNKNOWN``)."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.compute as pc

    if frames is None:
        return pd.DataFrame({"ts": pd.Series([], dtype="int64")})
    tab = frames if hasattr(frames, "column_names") else pa.Table.from_pandas(frames, preserve_index=False)
    cols = [c for c in FRAME_COLUMNS if c in tab.column_names]
    tab = tab.select(cols)
    if "ts" in cols:
        ts = tab.column("ts")
        if pa.types.is_timestamp(ts.type):
            ts = pc.cast(pc.cast(ts, pa.timestamp("ns", ts.type.tz)), pa.int64())
        ts = pc.fill_null(pc.cast(ts, pa.int64()), TS_UNKNOWN)
        tab = tab.set_column(cols.index("ts"), "ts", ts)
    df = tab.to_pandas()
    if "ts" not in df:
        df["ts"] = np.full(len(df), TS_UNKNOWN, np.int64)
    return df


def _add_sets(df: Any, t: Timeline) -> Any:
    """``capture_set``/``set_frame`` columns where the table has none (from the timeline's set starts)."""
    if "frame" not in df or ("capture_set" in df and "set_frame" in df):
        return df
    firsts = sorted((int(f), int(cs)) for cs, f in (getattr(t, "set_first", {}) or {}).items())
    frame = df["frame"].to_numpy(np.int64)
    if not firsts:
        cs, sf = np.ones(len(df), np.int64), frame
    else:
        starts = np.array([f for f, _c in firsts], np.int64)
        numbers = np.array([c for _f, c in firsts], np.int64)
        i = np.searchsorted(starts, frame, side="right") - 1
        cs = np.where(i >= 0, numbers[np.maximum(i, 0)], 1)
        sf = np.where(i >= 0, frame - starts[np.maximum(i, 0)] + 1, frame)
    df = df.copy()
    df["capture_set"], df["set_frame"] = cs, sf
    return df


def named_frames(t: Timeline, per_anomaly: int = MAX_NAMED) -> list[int]:
    """The run frame numbers the report links to: the first ``per_anomaly`` frames of each anomaly, sorted."""
    return sorted({f for a in t.anomalies for f in a.frames[:per_anomaly]})


# ---------------------------------------------------------------------------
# the page


def render_report(
    timeline: Timeline,
    frames: Any,
    status: Sequence[Mapping[str, Any]],
    *,
    counts: Mapping[str, Any],
    title: str = "dcpinspect analysis",
    sampled: bool = False,
    stream_items: Mapping[int, int] | None = None,
    sets: Sequence[Any] | None = None,
    connections: Sequence[Mapping[str, Any]] = (),
    named: Any = None,
) -> str:
    """The report page (a string of HTML).

    Args:
        timeline: the merged :class:`~dcpinspect.timeline.model.Timeline` of the run.
        frames: the frames table, or a sample of it (Arrow or pandas; the
            columns of :data:`FRAME_COLUMNS` that are present are read; ``ts``, ``type`` and ``name`` at least).
        status: the per-file status rows (``path``, ``status``, ``format``,
            ``packets``, ``error``, ``problems``; ``capture_set`` where known).
        counts: the run's numbers shown in the header (name -> value).
        title: the page title.
        sampled: whether ``frames`` is a sample (said under the opcode plots).
        stream_items: each stream's true item count (by index) where the timeline's items were thinned.
        sets: the reader's capture sets (objects with ``number``, ``files``,
            ``reason``); without them the sets are gathered from the timeline and ``status``.
        connections: rows (``conn``, ``label``, ``file``, ``capture_set``,
            ``note``) of connections the timeline does not hold, e.g. TLS ones.
        named: the frames-table rows of :func:`named_frames` (Arrow or pandas)
            when ``frames`` is a sample that may lack them.
    """
    t = timeline
    df = _add_sets(_frames_df(frames), t)
    nf = _add_sets(_frames_df(named), t) if named is not None else df
    parts = split_sets(t, sets, status)
    starts = _set_starts(parts, df, nf)
    _set_ends(parts, df, counted=not sampled)
    page = _Page(t, parts, starts, nf, stream_items or {})
    page.unplaced = len(df) > 0 and "capture_set" not in df and len(parts) > 1
    sections = [
        ("sets", "Capture sets", page.sets_table()),
        ("files", "Files", page.files_table(status)),
        ("connections", "Connections", page.connections_table(connections)),
    ]
    drawn = parts[:MAX_SET_SECTIONS]
    body = [f"<section id='{sid}'><h2>{esc(h)}</h2>{html}</section>" for sid, h, html in sections]
    toc = [f"<li><a href='#{sid}'>{esc(h)}</a></li>" for sid, h, _ in sections]
    for p in drawn:
        body.append(page.set_section(p, df, sampled))
        toc.append(f"<li><a href='#set-{p.number}'>{esc(page.set_title(p))}</a></li>")
    if len(parts) > len(drawn):
        body.append(
            f"<p class='subset'>showing {len(drawn):,} of {plural(len(parts), 'capture set')}; "
            "the rest are in the capture sets table above.</p>"
        )
    body.append(f"<section id='lag'><h2>Consumer lag</h2>{lag_section(t, df)}</section>")
    toc.append("<li><a href='#lag'>Consumer lag</a></li>")
    body.append(page.frames_section())
    toc.append("<li><a href='#frames'>Frames named by anomalies</a></li>")
    return "\n".join(
        [
            "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
            "<meta name='viewport' content='width=device-width, initial-scale=1'>",
            f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>",
            f"<header class='top'><h1>{esc(title)}</h1>{_counts(counts, len(parts))}</header><main>",
            f"<nav class='toc' id='contents'><b>Contents</b><ol>{''.join(toc)}</ol></nav>",
            *body,
            "</main></body></html>",
        ]
    )


_COUNT_WORDS = {
    "files": "file",
    "frames": "frame",
    "connections": "connection",
    "streams": "stream",
    "anomalies": ("anomaly", "anomalies"),
    "sets": "capture set",
}


def _counts(counts: Mapping[str, Any], sets: int) -> str:
    items: dict[str, Any] = {}
    for name, value in counts.items():
        items[name] = value
        if name == "files":
            items["sets"] = sets
    items.setdefault("sets", sets)
    out = []
    for name, value in items.items():
        word = _COUNT_WORDS.get(name)
        cls = "count bad" if name == "anomalies" and value else "count"
        if isinstance(value, int) and word is not None:
            one, many = word if isinstance(word, tuple) else (word, None)
            text = plural(value, one, many)
            num, _, rest = text.partition(" ")
            out.append(f"<span class='{cls}'><b>{esc(num)}</b>{esc(rest)}</span>")
        else:
            out.append(f"<span class='{cls}'><b>{esc(value)}</b>{esc(name)}</span>")
    return f"<div class='counts'>{''.join(out)}</div>"


def _set_starts(parts: Sequence[SetPart], *tables: Any) -> dict[int, int]:
    """Each set's first time (ns): the earliest of its frames in ``tables``, else the earliest its timeline knows."""
    from .drawing import timeline_clock

    out: dict[int, int] = {}
    for df in tables:
        if "capture_set" in df and len(df):
            known = df[df["ts"] != TS_UNKNOWN]
            for cs, ts in known.groupby("capture_set")["ts"].min().items():
                out[int(cs)] = min(int(ts), out.get(int(cs), int(ts)))
        elif len(parts) == 1 and len(df):
            known = df["ts"][df["ts"] != TS_UNKNOWN]
            if len(known):
                out[parts[0].number] = min(int(known.min()), out.get(parts[0].number, int(known.min())))
    for p in parts:
        if p.number not in out:
            clk = timeline_clock(p.timeline)
            if clk:
                out[p.number] = min(clk.values())
        p.start_ts = out.get(p.number)
    return out


def _set_ends(parts: Sequence[SetPart], df: Any, *, counted: bool) -> None:
    """Each set's last time (ns) and, when ``df`` is the whole frames table, its number of rows."""
    from .drawing import timeline_clock

    for p in parts:
        rows = _rows_of(df, p.number, len(parts))
        known = rows["ts"][rows["ts"] != TS_UNKNOWN]
        clk = timeline_clock(p.timeline)
        ends = ([int(known.max())] if len(known) else []) + ([max(clk.values())] if clk else [])
        p.end_ts = max(ends) if ends else None
        p.frames = len(rows) if counted and ("capture_set" in df or len(parts) == 1) else None


def _rows_of(df: Any, number: int, sets: int) -> Any:
    """The rows of ``df`` in set ``number``; rows that do not say their set belong to a set only when there is one."""
    if "capture_set" in df:
        return df[df["capture_set"] == number]
    return df if sets == 1 else df.iloc[:0]


def _length(p: SetPart) -> str:
    return _secs(p.end_ts - p.start_ts) if p.start_ts is not None and p.end_ts is not None else ""


def _when(ns: int | None) -> str:
    if ns is None or ns == TS_UNKNOWN:
        return "time unknown"
    when = _dt.datetime.fromtimestamp(ns / 1e9, tz=_dt.UTC)
    return when.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _secs(ns: int) -> str:
    s = ns / 1e9
    return f"{s:.3f} s" if s < 100 else f"{s:,.0f} s"


class _Page:
    """What the sections share: the timeline, its sets, the frames named, the anchors made."""

    def __init__(self, t: Timeline, parts: list[SetPart], starts: dict[int, int], named: Any, items: Mapping[int, int]) -> None:
        self.t = t
        self.parts = parts
        self.starts = starts
        self.items = items
        self.by_set = {p.number: p for p in parts}
        self.named = self._named_rows(named)
        self.file_set = {f: p.number for p in parts for f in p.files}
        self.conn_set = {c: p.number for p in parts for c in p.timeline.connections}
        self.unplaced = False  # frames that do not say their set, with more than one set
        every = [f for p in parts for f in p.files] + [str(getattr(i, "file", "") or "") for i in t.connections.values()]
        every = [f for f in every if f]
        self.prefix = _common_dir(every)

    def short(self, path: Any) -> str:
        """A file's path without the directory every file shares (the files table gives it whole)."""
        text = str(path or "")
        return text[len(self.prefix) :] if self.prefix and text.startswith(self.prefix) else text

    # -- frames named by anomalies

    def _named_rows(self, df: Any) -> dict[int, dict[str, Any]]:
        wanted = named_frames(self.t)
        rows: dict[int, dict[str, Any]] = {f: {} for f in wanted}
        if "frame" in df and len(df) and wanted:
            hit = df[df["frame"].isin(wanted)]
            for r in hit.to_dict("records"):
                rows[int(r["frame"])] = r
        return rows

    def where(self, frame: int, conn: int | None = None) -> tuple[int, int, str]:
        """(set, frame within the set, file) of a run frame number."""
        r = self.named.get(frame) or {}
        cs, sf = locate(self.t, frame)
        if r.get("capture_set") is not None and r.get("set_frame") is not None:
            cs, sf = int(r["capture_set"]), int(r["set_frame"])
        file = r.get("file") or ""
        if not file and conn is not None and conn in self.t.connections:
            file = getattr(self.t.connections[conn], "file", "")
        if not file and cs in self.by_set and len(self.by_set[cs].files) == 1:
            file = self.by_set[cs].files[0]
        return cs, sf, str(file or "")

    def frame_link(self, frame: int, conn: int | None = None) -> str:
        cs, sf, file = self.where(frame, conn)
        base = file.rsplit("/", 1)[-1] if file else f"set {cs}"
        return f"<a href='#frame-{frame}' title='{esc(file)}, frame {sf} of capture set {cs}'>{esc(base)} #{sf:,}</a>"

    def frames_section(self) -> str:
        head = "<section id='frames'><h2>Frames named by anomalies</h2>"
        if not self.named:
            return head + "<p>No anomalies, so no frames to name.</p></section>"
        note = (
            "<p class='note'>Each row is a frame an anomaly names (its first "
            f"{plural(MAX_NAMED, 'frame')} at most). <i>frame in set</i> is the number "
            "<code>dcpinspect show FILE --frame N</code> takes, whatever other files were in the run.</p>"
        )
        rows, ids = [], []
        for frame in sorted(self.named):
            r = self.named[frame]
            conn = r.get("conn_id")
            cs, sf, file = self.where(frame, _int(conn) or None)
            start = self.starts.get(cs)
            ts = r.get("ts")
            rel = _secs(int(ts) - start) if ts is not None and ts != TS_UNKNOWN and start is not None else ""
            problems = r.get("problems")
            problems = "; ".join(map(str, problems)) if problems is not None and not isinstance(problems, str) else problems
            show = Cell(f"<code>dcpinspect show {esc(file or 'FILE')} --frame {sf}</code>", f"show {file} --frame {sf}")
            rows.append(
                (
                    cs,
                    sf,
                    self.short(file),
                    _int(conn),
                    rel,
                    r.get("dir") or "",
                    r.get("name") or r.get("type") or "",
                    _int(r.get("vbucket")),
                    r.get("status_name") or "",
                    problems or "",
                    show,
                )
            )
            ids.append(f"frame-{frame}")
        header = ["set", "frame in set", "file", "conn", "time in set", "dir", "what", "vbucket", "status", "problems", "show it"]
        return head + note + table(header, rows, limit=MAX_ROWS, row_ids=ids) + "</section>"

    # -- the run

    def set_title(self, p: SetPart) -> str:
        names = [f.rsplit("/", 1)[-1] for f in p.files]
        shown = ", ".join(names[:3]) + (f" and {plural(len(names) - 3, 'more file')}" if len(names) > 3 else "")
        return f"Capture set {p.number}" + (f": {shown}" if shown else "")

    def sets_table(self) -> str:
        rows = []
        for p in self.parts:
            sub = p.timeline
            link = Cell(f"<a href='#set-{p.number}'>{p.number}</a>", str(p.number)) if p in self.parts[:MAX_SET_SECTIONS] else p.number
            rows.append(
                (
                    link,
                    ", ".join(map(self.short, p.files)),
                    p.reason,
                    _when(p.start_ts),
                    _length(p),
                    "" if p.frames is None else p.frames,
                    len(sub.connections),
                    len(sub.streams),
                    Cell(f"<a class='bad' href='#set-{p.number}-anomalies'>{len(sub.anomalies):,}</a>", str(len(sub.anomalies)))
                    if sub.anomalies and p in self.parts[:MAX_SET_SECTIONS]
                    else len(sub.anomalies),
                )
            )
        intro = (
            "<p class='note'>A capture set is the files of one recording (rotated files, or files a connection "
            "continues across). Histories never cross sets; each set below has its own time axis, from its first frame.</p>"
        )
        header = ["set", "files", "why one set", "starts", "length", "frames", "connections", "streams", "anomalies"]
        return intro + table(header, rows, limit=MAX_ROWS)

    def files_table(self, status: Sequence[Mapping[str, Any]]) -> str:
        rows = []
        for s in status:
            path = s.get("path")
            cs = s.get("capture_set")
            cs = cs if cs is not None else self.file_set.get(str(path), "")
            reason = s.get("error") or "; ".join(map(str, s.get("problems") or []))
            state = s.get("status") or ""
            cell = Cell(f"<span class='{'bad' if state == 'error' else 'warn' if state == 'problems' else ''}'>{esc(state)}</span>", state)
            rows.append((path, cs, cell, s.get("format"), s.get("packets"), reason))
        note = (
            f"<p class='note'>Elsewhere in this page the paths are given from <code>{esc(self.prefix)}</code>.</p>" if self.prefix else ""
        )
        return note + table(["path", "set", "status", "format", "packets", "reason"], rows, limit=MAX_ROWS)

    def connections_table(self, extra: Sequence[Mapping[str, Any]]) -> str:
        rows: list[tuple[Any, ...]] = []
        keys: list[tuple[int, int]] = []
        for c, info in self.t.connections.items():
            cs = self.conn_set.get(c, 1)
            note = f"{info.lost:,} bytes lost to capture gaps" if info.lost else ""
            rows.append(
                (
                    c,
                    cs,
                    self.short(getattr(info, "file", "")),
                    info.label,
                    info.side,
                    info.name,
                    info.bucket,
                    ", ".join(info.features),
                    info.buffer_size,
                    note,
                )
            )
            keys.append((cs, c))
        known = set(self.t.connections)
        for r in extra:
            c = int(r["conn"])
            if c in known:
                continue
            file = str(r.get("file") or "")
            known_set = r.get("capture_set") or self.file_set.get(file)
            note = r.get("note") or "no memcached frames decoded"
            rows.append((c, int(known_set) if known_set else "", self.short(file), r.get("label") or "", "", "", "", "", None, note))
            keys.append((int(known_set) if known_set else 1 << 30, c))  # a set not known: listed last
        if not rows:
            return "<p>No connections.</p>"
        order = sorted(range(len(rows)), key=keys.__getitem__)
        header = ["conn", "set", "file", "endpoints", "side", "DCP_OPEN name", "bucket", "features", "buffer", "note"]
        intro = f"<p class='note'>{plural(len(rows), 'connection')}, every one the capture holds (those with no memcached frames too).</p>"
        return intro + table(header, [rows[i] for i in order], limit=MAX_ROWS, row_ids=[f"conn-{rows[i][0]}" for i in order])

    # -- one set

    def set_section(self, p: SetPart, df: Any, sampled: bool) -> str:
        sub = p.timeline
        frames = _rows_of(df, p.number, len(self.parts))
        span = f", {_length(p)} long" if _length(p) else ""
        meta = (
            f"<p class='meta'>Starts {esc(_when(p.start_ts))}{esc(span)} · {plural(len(p.files), 'file')} · "
            f"{plural(len(sub.connections), 'connection')} · {plural(len(sub.streams), 'stream')} · "
            f"{plural(len(sub.anomalies), 'anomaly', 'anomalies')}" + (f" · why one set: {esc(p.reason)}" if p.reason else "") + "</p>"
        )
        from .drawing import Clock

        clock = Clock(set_clock(p), "time")  # converted once: every plot of the set reads it
        up = "<a class='up' href='#contents'>contents ↑</a>"
        out = [f"<section class='set' id='set-{p.number}'><h2>{esc(self.set_title(p))}{up}</h2>", meta]
        out.append(f"<h3 id='set-{p.number}-anomalies'>Anomalies</h3>" + self._anomalies(p))
        out.append(f"<h3 id='set-{p.number}-activity'>Activity</h3>")
        out.append(self._activity(p, frames, clock, sampled))
        out.append(f"<h3 id='set-{p.number}-streams'>Seqnos per stream</h3>" + self._streams(p, clock))
        out.append(f"<h3 id='set-{p.number}-branches'>Failover branches</h3>" + self._branches(p))
        out.append("</section>")
        return "\n".join(out)

    def _anomalies(self, p: SetPart) -> str:
        anomalies = p.timeline.anomalies
        if not anomalies:
            return "<p>None.</p>"
        rows = []
        for a in anomalies:
            links = ", ".join(self.frame_link(f, a.conn) for f in a.frames[:MAX_NAMED])
            if len(a.frames) > MAX_NAMED:
                links += f" and {len(a.frames) - MAX_NAMED:,} more"
            conn = Cell(f"<a href='#conn-{a.conn}'>{a.conn}</a>", str(a.conn)) if a.conn is not None else ""
            rows.append((a.kind, conn, _int(a.vbucket), a.count, a.uncertain, Cell(links, ""), a.message))
        return table(
            ["kind", "conn", "vbucket", "count", "maybe the capture's fault", "frames (file #frame in set)", "message"],
            rows,
            limit=MAX_ANOMALY_ROWS,
            more="in the anomalies table",
        )

    def _activity(self, p: SetPart, frames: Any, clock: Clock, sampled: bool) -> str:
        from .plots import plot_flow, plot_noops, plot_opcodes

        sub = p.timeline
        figs = []
        if not len(frames) and self.unplaced:
            figs.append("<p class='note'>No frames-per-opcode plot: the sample of frames does not say which set each frame is in.</p>")
        if len(frames) and {"ts", "type", "name"} <= set(frames.columns):
            figs.append(figure_img(lambda: _wide(lambda ax: plot_opcodes(frames, ax=ax)), f"frames per opcode, set {p.number}", dpi=_DPI))
        if sub.flow:
            flow = figure_img(
                lambda: _wide(lambda ax: plot_flow(sub, ax=ax, noops=False, clock=clock)), f"flow control, set {p.number}", dpi=_DPI
            )
            figs.append(flow)
        if sub.noops:
            figs.append(figure_img(lambda: _wide(lambda ax: plot_noops(sub, ax=ax, clock=clock)), f"noops, set {p.number}", dpi=_DPI))
        none = []
        if not sub.flow:
            none.append("no flow control (no buffer size negotiated)")
        if not sub.noops:
            none.append("no noops answered")
        note = f"<p class='note'>{esc('; '.join(none))}.</p>" if none else ""
        sample = "<p class='note'>Frames per opcode from a sample of the frames table.</p>" if sampled else ""
        return f"<div class='pair'>{''.join(figs)}</div>{sample}{note}"

    def _streams(self, p: SetPart, clock: Clock) -> str:
        from .plots import pick_streams

        sub = p.timeline
        n = len(sub.streams)
        if not n:
            return "<p>No streams in this set.</p>"
        items = {k: self.items[i] for k, i in enumerate(p.streams) if i in self.items}
        chosen = set(pick_streams(sub, MAX_STREAM_PLOTS, items=items))
        shown = [k for k in range(n) if k in chosen]
        rest = [k for k in pick_streams(sub, n, items=items) if k not in chosen]
        key = (
            "<p class='key'>One plot per stream, each with its own seqno scale; x: seconds since the set's first frame. "
            "Line: items by seqno; shaded: snapshots; ● stream request (○ a retry); "
            "<span class='bad'>▼</span> rollback target; ■ stream end.</p>"
        )
        subset = ""
        if rest:
            subset = (
                f"<p class='subset'>showing {len(shown):,} of {plural(n, 'stream')} "
                "(those with anomalies or rollbacks first, then the busiest); the rest are in the table below.</p>"
            )
        cells = [self._stream_cell(p, k, items, clock) for k in shown]
        out = key + subset + f"<div class='grid'>{''.join(cells)}</div>"
        if rest:
            out += table(_STREAM_HEADER, (self._stream_row(p, k, items) for k in rest), limit=MAX_ROWS, more="in the streams table")
        return out

    def _stream_cell(self, p: SetPart, k: int, items: Mapping[int, int], clock: Clock) -> str:
        s = p.timeline.streams[k]
        i = p.streams[k]
        rollbacks = sum(a.outcome == "rollback" for a in s.attempts)
        count = items.get(k, len(s.items))
        flags = ""
        if s.anomalies:
            flags += f"<span class='tag'>{plural(len(s.anomalies), 'anomaly', 'anomalies')}</span>"
        if rollbacks:
            flags += f"<span class='tag'>{plural(rollbacks, 'rollback')}</span>"
        end = f" · ended {s.end.get('name')}" if s.end is not None else ""
        caption = f"{esc(stream_label(s))} · {esc(plural(count, 'item'))}{esc(end)}{flags}"
        img = figure_img(lambda: _stream_figure(p.timeline, k, s, clock), f"seqnos of {stream_label(s)}", dpi=96, cls="stream")
        cls = "stream flag" if s.anomalies or rollbacks else "stream"
        return f"<figure class='{cls}' id='stream-{i}'>{img}<figcaption>{caption}</figcaption></figure>"

    def _stream_row(self, p: SetPart, k: int, items: Mapping[int, int]) -> tuple[Any, ...]:
        s = p.timeline.streams[k]
        return (
            p.streams[k],
            s.conn,
            s.vbucket,
            _int(s.stream_id),
            s.segment,
            len(s.attempts),
            sum(a.outcome == "rollback" for a in s.attempts),
            len(s.snapshots),
            items.get(k, len(s.items)),
            _int(s.last_seqno),
            s.end["name"] if s.end is not None else "",
            len(s.anomalies),
        )

    def _branches(self, p: SetPart) -> str:
        sub = p.timeline
        trees: dict[tuple[int, int], list[Any]] = {}
        for vb, branches in sorted(sub.branches.items()):
            for b in branches:
                trees.setdefault((vb, int(getattr(b, "history", 1))), []).append(b)
        if not trees:
            return "<p>No failover logs seen in this set.</p>"
        keys = sorted(trees)
        drawn = keys[:MAX_TREES]
        vbs = {vb for vb, _h in keys}
        intro = (
            f"<p class='note'>{plural(len(keys), 'branch tree')} on {plural(len(vbs), 'vbucket')}: one per failover history "
            "(failover logs merge only when they share an entry). Lanes: branches (uuid @ the seqno it starts at); "
            "○ where a consumer resumed; <span class='bad'>▼</span> rollback targets.</p>"
        )
        figs = []
        for vb, h in drawn:
            branches = trees[(vb, h)]
            sub_h = history_timeline(sub, vb, h, branches)
            lanes = len(branches) + 1
            many = sum(1 for k in keys if k[0] == vb) > 1
            name = f"vbucket {vb}" + (f", history {h}" if many else "")
            figs.append(figure_img(functools.partial(_branch_figure, sub_h, vb, lanes, name), name, dpi=_DPI))
        more = ""
        if len(keys) > len(drawn):
            more = f"<p class='subset'>showing {len(drawn):,} of {plural(len(keys), 'branch tree')}; every branch is in the failover table.</p>"
        return intro + more + f"<div class='pair'>{''.join(figs)}</div>"


_STREAM_HEADER = [
    "stream",
    "conn",
    "vbucket",
    "stream id",
    "segment",
    "attempts",
    "rollbacks",
    "snapshots",
    "items",
    "last seqno",
    "end",
    "anomalies",
]


def _common_dir(paths: Sequence[str]) -> str:
    """The directory (with its trailing ``/``) that every path is in, or ``""``."""
    import os.path

    if not paths:
        return ""
    try:
        common = os.path.commonpath([os.path.dirname(p) or "." for p in paths])
    except ValueError:  # absolute and relative paths mixed
        return ""
    return common + "/" if common not in ("", ".") and all(p.startswith(common + "/") for p in paths) else ""


def _int(v: Any) -> Any:
    if v is None:
        return ""
    try:
        return "" if np.isnan(v) else int(v)
    except (TypeError, ValueError):
        return v


def _figure(size: tuple[float, float], margins: tuple[float, float, float, float] = (0.09, 0.98, 0.16, 0.88)) -> tuple[Any, Any]:
    """A figure of one axes with fixed margins (left, right, bottom, top): a layout engine would draw it twice."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, facecolor="white")
    left, right, bottom, top = margins
    fig.subplots_adjust(left=left, right=right, bottom=bottom, top=top)
    return fig, fig.subplots()


def _wide(draw: Any) -> Any:
    """A full-width report figure drawn by ``draw(ax)``, its x label saying the time is the set's."""
    fig, ax = _figure((7.2, 3.4), (0.15, 0.96, 0.16, 0.9))
    draw(ax)
    _plain(ax.xaxis)
    if ax.get_xlabel().startswith("seconds since"):
        ax.set_xlabel("seconds since the set's first frame")
    ax.title.set_fontsize("medium")
    return fig


def set_clock(p: SetPart) -> dict[int, int]:
    """Frame number -> time (ns) of what set ``p``'s timeline knows, with its first frame at its start: its plots count from there."""
    from .drawing import timeline_clock

    known = timeline_clock(p.timeline)
    if p.start_ts is not None:
        known[p.first_frame] = min(p.start_ts, known.get(p.first_frame, p.start_ts))
    return known


def stream_figure(p: SetPart, k: int, clock: Mapping[int, int] | Clock | None = None) -> Any:
    """The small plot of stream ``k`` of set ``p`` (an index into ``p.timeline.streams``): its own seqno scale, time since the set's start."""
    from .drawing import Clock

    return _stream_figure(p.timeline, k, p.timeline.streams[k], Clock(clock if clock is not None else set_clock(p), "time"))


def _stream_figure(t: Timeline, k: int, s: Stream, clock: Clock) -> Any:
    from matplotlib.ticker import MaxNLocator

    from .plots import plot_seqnos

    fig, ax = _figure(_STREAM_SIZE, (0.2, 0.93, 0.17, 0.87))
    plot_seqnos(t, ax=ax, streams=[k], clock=clock, max_streams=None)
    leg = ax.get_legend()
    if leg is not None:
        leg.remove()
    ax.set_title(stream_label(s), fontsize="medium")
    if ax.get_xlabel():
        ax.set_xlabel("seconds since the set's first frame", fontsize="small")
    ax.set_ylabel("seqno", fontsize="small")
    ax.tick_params(labelsize="small")
    ax.xaxis.set_major_locator(MaxNLocator(nbins=4))
    _plain(ax.xaxis)
    ax.yaxis.get_major_locator().set_params(nbins=5)
    return fig


def _plain(axis: Any) -> None:
    """Ticks as plain numbers: no ``1e-6+1.13e-1`` offset a reader must add in their head."""
    fmt = axis.get_major_formatter()
    if hasattr(fmt, "set_useOffset"):
        fmt.set_useOffset(False)


def _branch_figure(t: Timeline, vb: int, lanes: int, name: str) -> Any:
    from .plots import plot_branches

    height = max(2.4, 0.42 * lanes + 1.4)
    fig, ax = _figure((7.2, height), (0.3, 0.97, 0.9 / height, 1 - 0.4 / height))
    plot_branches(t, vb, ax=ax)
    ax.set_title(name, fontsize="medium")
    ax.xaxis.get_major_locator().set_params(nbins=6)
    lo, hi = ax.get_xlim()
    if hi - lo < 2:  # one branch at one seqno and nothing else: a readable unit range, not ticks of -0
        mid = (lo + hi) / 2
        ax.set_xlim(mid - 1, mid + 1)
    for label in ax.get_xticklabels():
        label.set_rotation(20)
        label.set_horizontalalignment("right")
    leg = ax.get_legend()
    if leg is not None:
        leg.set_loc("upper left") if hasattr(leg, "set_loc") else None
    return fig


# ---------------------------------------------------------------------------
# without Spark


def report_from_captures(paths: Iterable[str], *, title: str = "dcpinspect analysis", **options: Any) -> str:
    """The report of capture files read in this process (no Spark): what ``analyze`` writes as ``report.html``.

    ``options`` go to :func:`~dcpinspect.tables.columnar.read_parts`.
    """
    import pyarrow as pa

    from ..flows.records import CaptureStats
    from ..tables.columnar import read_parts
    from ..tables.timeline_feed import feed_parts
    from ..timeline import TimelineBuilder

    paths = [str(p) for p in paths]
    stats = CaptureStats()
    batches: list[Any] = []

    def keep(parts: Iterable[Any]) -> Iterable[Any]:
        for part in parts:
            batches.append(part.batch)
            yield part

    t = feed_parts(keep(read_parts(paths, stats=stats, **options)), TimelineBuilder()).timeline()
    if stats.set_first and not t.set_first:
        t.set_first = dict(stats.set_first)
    frames = pa.Table.from_batches(batches) if batches else None
    status = [{"path": path, "status": _file_state(info), **info} for path, info in stats.files.items()]
    extra = [
        {
            "conn": c.id,
            "label": c.label,
            "file": c.file,
            "capture_set": getattr(c, "capture_set", None),
            "note": "TLS: not decoded" if c.tls else "no memcached frames decoded",
        }
        for c in stats.connections
        if c.id not in t.connections
    ]
    conns = {c.id for c in stats.connections} | set(t.connections)
    counts = {
        "files": len(paths),
        "frames": int(frames.num_rows) if frames is not None else 0,
        "connections": len(conns),
        "streams": len(t.streams),
        "anomalies": len(t.anomalies),
    }
    return render_report(t, frames, status, counts=counts, title=title, sets=stats.sets or None, connections=extra)


MAX_LAG_ROWS = 10  # consumer series in the lag table (the furthest behind)


def _lag_frames(t: Timeline, df: Any) -> Any:
    """Frame, capture set and time (int64 ns) of the report's frames, and of the frames only the timeline knows the time of (a sample)."""
    import pandas as pd

    from .drawing import timeline_clock

    have = df[[c for c in ("frame", "capture_set", "ts") if c in df.columns]] if "frame" in df.columns else df.iloc[0:0]
    known = {f: ts for f, ts in timeline_clock(t).items() if ts != TS_UNKNOWN}
    seen = set(have["frame"].tolist()) if "frame" in have.columns else set()
    missing = {f: ts for f, ts in known.items() if f not in seen}
    extra = pd.DataFrame({"frame": list(missing), "ts": list(missing.values())}, dtype="int64")
    extra = _add_sets(extra, t).drop(columns=["set_frame"], errors="ignore")
    return pd.concat([x for x in (have, extra) if len(x)] or [extra], ignore_index=True)


def lag_section(t: Timeline, df: Any) -> str:
    """The "Consumer lag" section: the :data:`MAX_LAG_ROWS` series furthest behind and a plot of the worst one's vbucket.

    From :func:`dcpinspect.tables.progress.progress` of the timeline's tables;
    GET_ALL_VB_SEQNOS as the timeline last saw it (the answers' other values are
    not in the frames table: ``dcpinspect lag`` reads them all).
    """
    from ..tables.progress import lag_summary, progress, timeline_high_seqnos
    from ..tables.timeline import timeline_frames
    from .plots_lag import plot_lag

    try:
        tables = timeline_frames(t)
        tables["high_seqnos"] = timeline_high_seqnos(t.high_seqnos, df)
        rows = progress(_lag_frames(t, df), tables)
        every = lag_summary(rows, None)
    except Exception as exc:  # the rest of the report is still written (rule 4)
        return f"<p class='bad'>consumer lag failed: {esc(type(exc).__name__)}: {esc(exc)}</p>"
    if every.empty:
        return "<p>No DCP stream: no consumer to measure.</p>"
    worst = every.head(MAX_LAG_ROWS)

    import pandas as pd

    def num(v: Any) -> Any:
        return "" if pd.isna(v) else int(v)

    def secs(v: Any) -> Any:
        return "" if pd.isna(v) else f"{float(v):.3f}"

    body = [
        (r.capture_set, "" if pd.isna(r.consumer) else r.consumer, r.conn, r.vbucket, num(r.stream_id), num(r.max_lag_items), *more)
        for r in worst.itertuples(index=False)
        for more in [(secs(r.max_lag_seconds), num(r.end_lag_items), secs(r.end_lag_seconds))]
    ]
    head = ["set", "consumer", "conn", "vbucket", "stream id", "worst lag (items)", "worst lag (s)"]
    head += ["lag at the end (items)", "lag at the end (s)"]
    shown = f"the {len(worst):,} furthest behind of" if len(every) > len(worst) else "all"
    note = (
        f"<p class='note'>Showing {shown} {plural(len(every), 'series', 'series')} (a consumer's view of one vbucket), "
        "furthest behind first; <code>dcpinspect lag</code> lists each one's progress.</p>"
    )
    vb = int(worst["vbucket"].iloc[0])
    fig = figure_img(lambda: _wide(lambda ax: plot_lag(rows, vb, ax=ax, max_series=4)), f"consumer lag, vbucket {vb}", dpi=_DPI)
    ids = [f"lag-{k}" for k in range(len(body))]  # anchors to link a series to
    return note + table(head, body, limit=MAX_LAG_ROWS, row_ids=ids) + fig


def _file_state(info: Mapping[str, Any]) -> str:
    return "error" if info.get("error") else "problems" if info.get("problems") else "ok"
