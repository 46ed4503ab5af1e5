"""Consumer lag: per vbucket and consumer, the consumer's seqno against the producer's high seqno over time (``dcpinspect lag``).

Theory of operation: :func:`progress` is a pure function of the frames table
(only its ``frame``, ``capture_set`` and ``ts`` columns: the time of each
frame) and the timeline's tables (:func:`~dcpinspect.tables.timeline.timeline_frames`:
connections, streams, attempts, snapshots, items), plus, when present, the
``high_seqnos`` table of :func:`high_seqnos` (what GET_ALL_VB_SEQNOS and STAT
``vbucket-seqno`` answers said; the frames table keeps neither answer's
values, so it is read from the records by the one dissector).

1. A *series* is one consumer's view of one vbucket: (capture set,
   connection, vbucket, stream id); every segment of that stream (a stream
   re-requested after its end or a rollback) continues the same series.  The
   consumer is named by its connection's DCP_OPEN name.
2. The *consumer seqno* is what the consumer has: a successful stream request
   sets it to the request's start seqno (at the response); a request answered
   Rollback sets it to its start seqno (at the request: what the consumer
   said it had), then to the rollback seqno (at the response); an item
   (mutation, deletion, expiration, prepare, commit, abort, system event) or
   a SEQNO_ADVANCED raises it to its seqno (the largest so far: an OSO
   snapshot's items come in key order).  Before
   any of them (a capture starting mid-stream, at a snapshot marker) it is
   unknown (null).
3. The *producer high seqno* is kept per scope - (capture set, server
   address, vbucket): the server a connection went to (the right side of its
   label), so two nodes' copies of a vbucket are never mixed - and read from
   every connection of the scope, in frame order.  Exact reports set it, even
   lower (a failover):

   * a GET_ALL_VB_SEQNOS answer (``high_seqno`` of each vbucket listed);
   * a STAT ``vbucket-seqno`` answer (``vb_N:high_seqno``).

   Lower bounds raise it, never lower it (the producer has at least them):

   * a snapshot marker's end seqno;
   * a SEQNO_ADVANCED's or an item's seqno;
   * a successful stream request's start seqno (a start above the
     producer's high seqno is refused).

   ``high_source`` and ``high_frame`` say which frame last changed it.
   Stream-request responses carry no high seqno (their body is the failover
   log) and a request's end seqno is what the consumer asked for, not what
   the producer has: neither is read.
4. ``lag_items = max(0, producer_high - consumer_seqno)``.
5. ``lag_seconds`` at a row is the row's time minus the time the producer's
   high seqno rose above the row's consumer seqno and stayed above it up to the
   row (the first frame of the scope after which every high seqno seen
   was greater): how long the consumer has been missing something the
   producer had.  It is 0 when ``producer_high <= consumer_seqno``.  When the
   high seqno was above it from the first frame of the scope (a capture
   starting mid-stream) that frame's time is used: a lower bound.
6. Rows: one per change of a series' (consumer seqno, producer high), in
   frame order: the series' own frames, and every frame of its scope that
   changes the producer's high seqno while the series is open (from its first
   frame to its stream's end; a new request opens it again).  A stream end
   adds an ``end`` row; a series still open at the end of its capture set adds
   an ``end of capture`` row at the last frame of the set, so the lag at the
   end of the capture is always the series' last row.
7. :func:`lag_summary` reduces the rows per series: the worst lag in items
   and in seconds, when, and the lag at the series' last row; worst first.

Without the records (the report, Spark's tables) :func:`timeline_high_seqnos`
gives the ``high_seqnos`` table the timeline kept: the last GET_ALL_VB_SEQNOS
high seqno of each vbucket.  :func:`consumer_lag` reads capture paths once
(or takes a live session's records) and returns both tables.

Layers: tables (pandas, numpy); the records are only dissected, never decoded anew.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ..protocol.enums import Opcode, Status
from ..protocol.session import RESPONSE_MAGICS
from ..wire.events import Frame

if TYPE_CHECKING:
    import pandas as pd

    from ..flows.records import CaptureStats, Record
    from .columnar import TablePart

__all__ = [
    "HIGH_SEQNO_COLUMNS",
    "PROGRESS_COLUMNS",
    "PROGRESS_TEXT",
    "SUMMARY_COLUMNS",
    "SUMMARY_TEXT",
    "ConsumerLag",
    "consumer_lag",
    "high_seqnos",
    "lag_summary",
    "part_high_seqnos",
    "progress",
    "text_table",
    "timeline_high_seqnos",
]

#: the ``high_seqnos`` table: one row per vbucket a GET_ALL_VB_SEQNOS or STAT vbucket-seqno answer reported
HIGH_SEQNO_COLUMNS = ("frame", "capture_set", "conn", "vbucket", "high_seqno", "source")
#: the progress table's columns, in order
PROGRESS_COLUMNS = (
    "capture_set",
    "conn",
    "consumer",
    "vbucket",
    "stream_id",
    "frame",
    "ts",
    "event",
    "consumer_seqno",
    "producer_high",
    "high_source",
    "high_frame",
    "lag_items",
    "lag_seconds",
)
#: the summary's columns, in order
SUMMARY_COLUMNS = (
    "capture_set",
    "conn",
    "consumer",
    "vbucket",
    "stream_id",
    "rows",
    "max_lag_items",
    "max_lag_items_at",
    "max_lag_seconds",
    "max_lag_seconds_at",
    "end_consumer_seqno",
    "end_producer_high",
    "end_lag_items",
    "end_lag_seconds",
)
#: the frames-table columns :func:`progress` reads
FRAME_COLUMNS = ("frame", "capture_set", "ts")

GET_ALL_VB_SEQNOS = "GET_ALL_VB_SEQNOS"
STAT_SEQNO = "STAT vbucket-seqno"
_STAT_KEY = re.compile(r"vb_(\d+):high_seqno")
_SEQNO_ADVANCED = Opcode.DCP_SEQNO_ADVANCED.name
_REPORTED = (int(Opcode.GET_ALL_VB_SEQNOS), int(Opcode.STAT))
_SUCCESS = int(Status.SUCCESS)
_NAT = -(2**63)  # int64 minimum: NaT as datetime64[ns]


# --- rule 3: the exact reports, from the records ---------------------------------------------------


def _report_rows(rec: Record) -> list[dict[str, Any]]:
    """The high seqnos one record reports (none unless it is a successful GET_ALL_VB_SEQNOS or STAT vbucket-seqno answer)."""
    from ..wire.dissect import dissect

    ev = rec.event
    if not isinstance(ev, Frame) or ev.header[0] not in RESPONSE_MAGICS or ev.header[1] not in _REPORTED or ev.header[5] != _SUCCESS:
        return []  # not a frame, a request, another command, or a failure
    d = dissect(ev, rec.context)
    where = {"frame": rec.number, "capture_set": rec.capture_set, "conn": rec.conn}
    if ev.header[1] == Opcode.GET_ALL_VB_SEQNOS:
        return [
            {**where, "vbucket": e["vbucket"], "high_seqno": e["high_seqno"], "source": GET_ALL_VB_SEQNOS}
            for e in d.body.get("vb_seqnos", ())
            if isinstance(e, dict) and isinstance(e.get("vbucket"), int) and isinstance(e.get("high_seqno"), int)
        ]
    values = {f.path: f.value for f in d.fields if f.path in ("key", "value")}
    m = _STAT_KEY.fullmatch(str(values.get("key", "")))
    text = str(values.get("value", ""))
    if m is None or not text.isdigit():
        return []
    return [{**where, "vbucket": int(m.group(1)), "high_seqno": int(text), "source": STAT_SEQNO}]


def _high_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    import pandas as pd

    df = pd.DataFrame(rows, columns=list(HIGH_SEQNO_COLUMNS))
    return df.astype({"frame": "int64", "capture_set": "int64", "conn": "int64", "vbucket": "int64", "high_seqno": "UInt64"})


def high_seqnos(records: Iterable[Record]) -> pd.DataFrame:
    """The ``high_seqnos`` table of records: one row per vbucket each GET_ALL_VB_SEQNOS or STAT ``vbucket-seqno`` answer reported."""
    return _high_frame([row for rec in records for row in _report_rows(rec)])


def part_high_seqnos(part: TablePart) -> list[dict[str, Any]]:
    """The ``high_seqnos`` rows of one part of the frames table (only its answers to the two commands are dissected)."""
    import numpy as np
    import pyarrow.compute as pc

    b = part.batch
    names = b.column(b.schema.get_field_index("name"))
    role = b.column(b.schema.get_field_index("role"))
    wanted = pc.and_(pc.is_in(names, value_set=_pa_names()), pc.equal(role, "response"))
    rows = np.flatnonzero(pc.fill_null(wanted, False).to_numpy(zero_copy_only=False))
    if not len(rows):
        return []
    return [row for rec in part.records_at(rows.tolist()) for row in _report_rows(rec)]


def _pa_names() -> Any:
    import pyarrow as pa

    return pa.array([Opcode(op).name for op in _REPORTED])


def timeline_high_seqnos(high: Mapping[int, tuple[int, int]], frames: pd.DataFrame) -> pd.DataFrame:
    """The ``high_seqnos`` table from a timeline's last GET_ALL_VB_SEQNOS high seqno per vbucket (``Timeline.high_seqnos``).

    What a run without the records has (the report, Spark): one row per vbucket,
    its connection and capture set read from ``frames`` (``conn_id``,
    ``capture_set``) at its frame; a frame ``frames`` lacks (a sample) is left out.
    """
    if not high or not {"frame", "conn_id"} <= set(frames.columns):
        return _high_frame([])
    wanted = {f for f, _q in high.values()}
    rows = frames[frames["frame"].isin(wanted)]
    sets = rows["capture_set"].tolist() if "capture_set" in rows.columns else [1] * len(rows)
    where = {int(f): (int(cs), int(c)) for f, cs, c in zip(rows["frame"].tolist(), sets, rows["conn_id"].tolist(), strict=True)}
    out = [
        {"frame": f, "capture_set": where[f][0], "conn": where[f][1], "vbucket": vb, "high_seqno": q, "source": GET_ALL_VB_SEQNOS}
        for vb, (f, q) in sorted(high.items())
        if f in where
    ]
    return _high_frame(out)


# --- rules 1-6: the progress rows ----------------------------------------------------------------------


@dataclass
class _Scope:
    """One (capture set, server, vbucket): its producer high seqno and when each value began (rule 5)."""

    high: int | None = None
    source: str = ""
    frame: int | None = None
    first_ts: int | None = None  # the time of the scope's first frame
    stack_high: list[int] = field(default_factory=list)  # strictly increasing: a value and ...
    stack_next: list[int | None] = field(default_factory=list)  # ... the time of the first change after it (None: none yet)
    open: dict[int, bool] = field(default_factory=dict)  # series -> open

    def set(self, value: int, exact: bool, source: str, frame: int, ts: int | None) -> bool:
        """Take a report (exact) or a lower bound; True when the high seqno changed."""
        if self.first_ts is None:
            self.first_ts = ts
        new = value if exact or self.high is None else max(self.high, value)
        if new == self.high:
            return False
        if self.stack_next and self.stack_next[-1] is None:
            self.stack_next[-1] = ts  # the value before this one ended now
        while self.stack_high and self.stack_high[-1] >= new:
            self.stack_high.pop()
            self.stack_next.pop()
        self.stack_high.append(new)
        self.stack_next.append(None)
        self.high, self.source, self.frame = new, source, frame
        return True

    def above_since(self, seqno: int) -> int | None:
        """The time since which every high seqno seen was above ``seqno`` (rule 5)."""
        i = bisect.bisect_right(self.stack_high, seqno) - 1
        if i < 0:
            return self.first_ts
        return self.stack_next[i]


class _Event(NamedTuple):
    frame: int
    order: int  # within a frame: reports and markers before items before ends
    scope: tuple[int, str, int]
    series: int  # -1: none (a report)
    kind: str  # the row's event
    consumer: int | None  # the consumer seqno it gives
    reset: bool  # the consumer seqno is set (a stream request), not raised
    high: int | None  # the producer high seqno it gives
    exact: bool


def _col(df: pd.DataFrame | None, name: str) -> list[Any]:
    """A column as a list, nulls (None, NA, NaN) as None; empty when the table or the column is missing."""
    import pandas as pd

    if df is None or name not in df.columns:
        return []
    values = df[name].tolist()
    nulls = pd.isna(df[name]).tolist()
    return [None if n else v for v, n in zip(values, nulls, strict=True)]


def _server(label: Any) -> str:
    text = "" if label is None else str(label)
    return text.rpartition(" -> ")[2] if " -> " in text else text


def _events(tables: Mapping[str, pd.DataFrame], series_of: dict[tuple[int, int, int, int], int], scope_of: Any) -> list[_Event]:
    """Every event of rules 2, 3 and 6, in frame order."""
    streams = tables["streams"]
    stream_key: dict[int, tuple[int, int, int, int]] = {}
    ends: list[tuple[int, int]] = []
    for s, cs, conn, vb, sid, end in zip(
        *(_col(streams, c) for c in ("stream", "capture_set", "conn", "vbucket", "stream_id", "end_frame")), strict=True
    ):
        key = (int(cs), int(conn), int(vb), -1 if sid is None else int(sid))
        stream_key[int(s)] = key
        series_of.setdefault(key, len(series_of))
        if end is not None:
            ends.append((int(end), int(s)))
    out: list[_Event] = []

    placed = {s: (scope_of(k[0], k[1], k[2]), series_of[k]) for s, k in stream_key.items()}

    def add(frame: Any, order: int, stream: Any, kind: str, consumer: Any, reset: bool, high: Any) -> None:
        where = placed.get(int(stream))
        if where is None or frame is None:
            return
        c = None if consumer is None else int(consumer)
        h = None if high is None else int(high)
        out.append(_Event(int(frame), order, where[0], where[1], kind, c, reset, h, False))

    at = tables.get("attempts")
    cols = ("stream", "frame", "response_frame", "start", "outcome", "rollback_seqno")
    for s, f, rf, start, outcome, back in zip(*(_col(at, c) for c in cols), strict=True):
        if outcome == "success":
            add(rf, 0, s, "stream request", start, True, start)
        elif outcome == "rollback":
            add(f, 0, s, "stream request", start, True, None)
            add(rf, 0, s, "rollback", back, True, None)
    snaps = tables.get("snapshots")
    for s, f, end in zip(*(_col(snaps, c) for c in ("stream", "frame", "end")), strict=True):
        add(f, 1, s, "snapshot marker", None, False, end)
    items = tables.get("items")
    if items is not None and len(items):
        names = items["name"].tolist()
        for s, f, q, n in zip(items["stream"].tolist(), items["frame"].tolist(), items["seqno"].tolist(), names, strict=True):
            kind = _SEQNO_ADVANCED if n == _SEQNO_ADVANCED else "item"
            add(f, 2, s, kind, q, False, q)
    for f, s in ends:
        add(f, 3, s, "end", None, False, None)
    highs = tables.get("high_seqnos")
    for f, cs, conn, vb, q, src in zip(*(_col(highs, c) for c in HIGH_SEQNO_COLUMNS), strict=True):
        out.append(_Event(int(f), 1, scope_of(int(cs), int(conn), int(vb)), -1, src, None, False, int(q), True))
    out.sort(key=lambda e: (e.frame, e.order, e.series))
    return out


class _Rows:
    """The progress rows, column by column."""

    def __init__(self) -> None:
        self.series: list[int] = []
        self.frame: list[int] = []
        self.ts: list[int | None] = []
        self.event: list[str] = []
        self.consumer: list[int | None] = []
        self.high: list[int | None] = []
        self.source: list[str | None] = []
        self.high_frame: list[int | None] = []
        self.lag: list[int | None] = []
        self.secs: list[float | None] = []

    def add(self, series: int, frame: int, ts: int | None, event: str, consumer: int | None, sc: _Scope) -> None:
        high = sc.high
        lag: int | None = None
        secs: float | None = None
        if consumer is not None and high is not None:
            lag = high - consumer if high > consumer else 0
            if lag == 0:
                secs = 0.0
            else:
                since = sc.above_since(consumer)
                secs = None if since is None or ts is None else max(0.0, (ts - since) / 1e9)
        self.series.append(series)
        self.frame.append(frame)
        self.ts.append(ts)
        self.event.append(event)
        self.consumer.append(consumer)
        self.high.append(high)
        self.source.append(sc.source or None)
        self.high_frame.append(sc.frame)
        self.lag.append(lag)
        self.secs.append(secs)


def _frame_times(frames: pd.DataFrame, wanted: list[int]) -> tuple[list[int | None], dict[int, tuple[int, int | None]]]:
    """The time (ns; None unknown) of each ``wanted`` frame, and capture set -> (its last frame, its last known time)."""
    import numpy as np

    f = frames["frame"].to_numpy(dtype=np.int64)
    ts = frames["ts"]
    # int64 ns with the int64 minimum (NaT's value) for unknown (the report's table), or timestamps
    ns = ts.to_numpy(dtype=np.int64) if ts.dtype.kind in "iu" else ts.to_numpy(dtype="datetime64[ns]").astype(np.int64)
    known = ts.notna().to_numpy() & (ns != _NAT)
    last: dict[int, tuple[int, int | None]] = {}
    sets = frames["capture_set"].to_numpy(dtype=np.int64) if "capture_set" in frames.columns else np.ones(len(f), np.int64)
    for cs in np.unique(sets).tolist():
        mine = sets == cs
        ok = mine & known
        last[int(cs)] = (int(f[mine].max()), int(ns[ok].max()) if ok.any() else None)
    if not len(f):
        return [None] * len(wanted), last
    order = np.argsort(f, kind="stable")
    fs, nss, ks = f[order], ns[order], known[order]
    w = np.asarray(wanted, np.int64)
    at = np.minimum(np.searchsorted(fs, w), len(fs) - 1)
    hit = (fs[at] == w) & ks[at]
    return [int(v) if h else None for v, h in zip(nss[at].tolist(), hit.tolist(), strict=True)], last


def progress(frames: pd.DataFrame, tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """The progress table: per series (rule 1), one row per change of its consumer seqno or producer high seqno (rules 2-6).

    ``frames``: the frames table (its :data:`FRAME_COLUMNS` suffice; ``ts``
    as timestamps, or as int64 ns with the int64 minimum for unknown);
    ``tables``: :func:`~dcpinspect.tables.timeline.timeline_frames`'s
    tables (connections, streams, attempts, snapshots, items), and
    ``high_seqnos`` (:func:`high_seqnos`) when the exact reports are wanted.
    Columns: :data:`PROGRESS_COLUMNS`.
    """
    conns = tables["connections"]
    where = {
        int(c): (_server(lab), name or None) for c, lab, name in zip(*(_col(conns, k) for k in ("conn", "label", "name")), strict=True)
    }
    scopes: dict[tuple[int, str, int], _Scope] = {}

    def scope_of(cs: int, conn: int, vb: int) -> tuple[int, str, int]:
        return (cs, where.get(conn, ("", None))[0], vb)

    series_of: dict[tuple[int, int, int, int], int] = {}
    events = _events(tables, series_of, scope_of)
    times, last = _frame_times(frames, [e.frame for e in events])
    consumer: dict[int, int | None] = {}
    shown: dict[int, tuple[int | None, int | None]] = {}
    scope_series: dict[tuple[int, str, int], list[int]] = {}
    last_row: dict[int, int] = {}  # series -> the frame of its last row
    rows = _Rows()
    for e, ts in zip(events, times, strict=True):
        sc = scopes.get(e.scope)
        if sc is None:
            sc = scopes[e.scope] = _Scope()
        changed = e.high is not None and sc.set(e.high, e.exact, e.kind, e.frame, ts)
        if e.series >= 0:
            if not sc.open.get(e.series) and e.kind != "end":
                sc.open[e.series] = True
                if e.series not in consumer:
                    scope_series.setdefault(e.scope, []).append(e.series)
            mine = consumer.get(e.series)
            if e.consumer is not None:
                mine = e.consumer if e.reset or mine is None else max(mine, e.consumer)
            consumer[e.series] = mine
            if e.kind == "end" or shown.get(e.series) != (mine, sc.high):
                rows.add(e.series, e.frame, ts, e.kind, mine, sc)
                shown[e.series] = (mine, sc.high)
                last_row[e.series] = e.frame
            if e.kind == "end":
                sc.open[e.series] = False
        if changed:
            for other in scope_series.get(e.scope, ()):
                if other != e.series and sc.open.get(other) and shown.get(other) != (consumer.get(other), sc.high):
                    rows.add(other, e.frame, ts, e.kind, consumer.get(other), sc)
                    shown[other] = (consumer.get(other), sc.high)
                    last_row[other] = e.frame
    for key, sc in scopes.items():
        end_frame, end_ts = last.get(key[0], (None, None))
        for s in scope_series.get(key, ()):
            if sc.open.get(s) and end_frame is not None and last_row.get(s) != end_frame:
                rows.add(s, end_frame, end_ts, "end of capture", consumer.get(s), sc)
    return _assemble(rows, series_of, where)


def _assemble(rows: _Rows, series_of: dict[tuple[int, int, int, int], int], where: dict[int, tuple[str, Any]]) -> pd.DataFrame:
    import numpy as np
    import pandas as pd

    keys = {v: k for k, v in series_of.items()}
    ser = [keys[s] for s in rows.series]
    df = pd.DataFrame(
        {
            "capture_set": pd.array([k[0] for k in ser], dtype="int64"),
            "conn": pd.array([k[1] for k in ser], dtype="int64"),
            "consumer": [where.get(k[1], ("", None))[1] for k in ser],
            "vbucket": pd.array([k[2] for k in ser], dtype="int64"),
            "stream_id": pd.array([None if k[3] < 0 else k[3] for k in ser], dtype="Int64"),
            "frame": pd.array(rows.frame, dtype="int64"),
            "ts": pd.to_datetime(np.array([_NAT if v is None else v for v in rows.ts], np.int64).view("datetime64[ns]"), utc=True),
            "event": rows.event,
            "consumer_seqno": pd.array(rows.consumer, dtype="UInt64"),
            "producer_high": pd.array(rows.high, dtype="UInt64"),
            "high_source": rows.source,
            "high_frame": pd.array(rows.high_frame, dtype="Int64"),
            "lag_items": pd.array(rows.lag, dtype="UInt64"),
            "lag_seconds": pd.array(rows.secs, dtype="Float64"),
        },
        columns=list(PROGRESS_COLUMNS),
    )
    order = ["capture_set", "conn", "vbucket", "stream_id", "frame"]
    return df.sort_values(order, kind="stable", ignore_index=True)


# --- rule 7: the summary -------------------------------------------------------------------------------

_SERIES = ["capture_set", "conn", "consumer", "vbucket", "stream_id"]


def lag_summary(progress_df: pd.DataFrame, top: int | None = 10) -> pd.DataFrame:
    """Per series (vbucket and consumer): the worst lag in items and in seconds, when, and the lag at its last row; worst first.

    ``top`` keeps the first rows (None: all).  Columns: :data:`SUMMARY_COLUMNS`.
    """
    import pandas as pd

    if progress_df.empty:
        return pd.DataFrame(columns=list(SUMMARY_COLUMNS))
    df = progress_df.copy()
    df["_lag"] = df["lag_items"].astype("Float64").fillna(-1.0)
    df["_secs"] = df["lag_seconds"].fillna(-1.0)
    rows = []
    for key, g in df.groupby(_SERIES, sort=False, dropna=False):
        worst_items = g.loc[g["_lag"].idxmax()]
        worst_secs = g.loc[g["_secs"].idxmax()]
        end = g.iloc[-1]
        rows.append(
            {
                **dict(zip(_SERIES, key, strict=True)),
                "rows": len(g),
                "max_lag_items": worst_items["lag_items"],
                "max_lag_items_at": worst_items["ts"] if worst_items["_lag"] >= 0 else pd.NaT,
                "max_lag_seconds": worst_secs["lag_seconds"],
                "max_lag_seconds_at": worst_secs["ts"] if worst_secs["_secs"] >= 0 else pd.NaT,
                "end_consumer_seqno": end["consumer_seqno"],
                "end_producer_high": end["producer_high"],
                "end_lag_items": end["lag_items"],
                "end_lag_seconds": end["lag_seconds"],
            }
        )
    out = pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))
    for c in ("max_lag_items", "end_consumer_seqno", "end_producer_high", "end_lag_items"):
        out[c] = pd.array([None if v is pd.NA or v is None else int(v) for v in out[c]], dtype="UInt64")
    for c in ("max_lag_seconds", "end_lag_seconds"):
        out[c] = out[c].astype("Float64")
    for c in ("max_lag_items_at", "max_lag_seconds_at"):
        out[c] = pd.to_datetime(out[c], utc=True)
    out["stream_id"] = out["stream_id"].astype("Int64")
    out["_k1"] = out["max_lag_items"].astype("Float64").fillna(-1.0)
    out["_k2"] = out["max_lag_seconds"].fillna(-1.0)
    out = out.sort_values(["_k1", "_k2", "capture_set", "conn", "vbucket"], ascending=[False, False, True, True, True], kind="stable")
    out = out.drop(columns=["_k1", "_k2"]).reset_index(drop=True)
    return out if top is None else out.head(top).reset_index(drop=True)


# --- text (``dcpinspect lag``) ----------------------------------------------------------------------------

#: summary column -> its header in text
SUMMARY_TEXT = {
    "consumer": "consumer",
    "conn": "conn",
    "vbucket": "vbucket",
    "stream_id": "stream_id",
    "max_lag_items": "max_items",
    "max_lag_items_at": "at_s",
    "max_lag_seconds": "max_seconds",
    "end_consumer_seqno": "end_seqno",
    "end_producer_high": "end_high",
    "end_lag_items": "end_items",
    "end_lag_seconds": "end_seconds",
}
#: progress column -> its header in text
PROGRESS_TEXT = {
    "frame": "frame",
    "ts": "at_s",
    "consumer": "consumer",
    "conn": "conn",
    "stream_id": "stream_id",
    "event": "event",
    "consumer_seqno": "seqno",
    "producer_high": "high",
    "high_source": "high_from",
    "lag_items": "lag_items",
    "lag_seconds": "lag_seconds",
}
_TIMES = ("ts", "max_lag_items_at", "max_lag_seconds_at")


def _since(v: Any, t0: Any) -> str:
    import pandas as pd

    return "" if v is None or v is pd.NaT or t0 is None else f"{(v - t0).total_seconds():.3f}"


def _secs(v: Any) -> str:
    import pandas as pd

    return "" if v is None or pd.isna(v) else f"{float(v):.3f}"


def text_table(df: pd.DataFrame, columns: Mapping[str, str], t0: Any, escape: Any = str) -> str:
    """``columns`` of ``df`` as aligned text under their headers: times as seconds since ``t0``, seconds to 3 decimals, text through ``escape``."""
    out = df[list(columns)].copy()
    for c in out.columns:
        if c in _TIMES:
            out[c] = [_since(v, t0) for v in out[c]]
        elif c.endswith("_seconds"):
            out[c] = [_secs(v) for v in out[c]]
        elif out[c].dtype == object:
            out[c] = [escape(v) if isinstance(v, str) else "" for v in out[c]]
    out = out.astype(object).where(out.notna(), "")
    return str(out.rename(columns=dict(columns)).to_string(index=False))


# --- the convenience: captures or records, read once ----------------------------------------------------


class ConsumerLag(NamedTuple):
    """What :func:`consumer_lag` gives: the progress table and its summary."""

    progress: pd.DataFrame
    summary: pd.DataFrame


def _kept_parts(parts: Iterable[TablePart], batches: list[Any], highs: list[dict[str, Any]]) -> Iterator[TablePart]:
    for part in parts:
        batches.append(part.batch.select(list(FRAME_COLUMNS)))
        highs.extend(part_high_seqnos(part))
        yield part


def lag_tables(parts: Iterable[TablePart], builder: Any) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """The frames (only :data:`FRAME_COLUMNS`) and the tables :func:`progress` reads, from one pass over ``parts`` feeding ``builder``."""
    import pyarrow as pa

    from .schema import pandas_dtype
    from .timeline import timeline_frames
    from .timeline_feed import feed_parts

    batches: list[Any] = []
    highs: list[dict[str, Any]] = []
    t = feed_parts(_kept_parts(parts, batches, highs), builder).timeline()
    table = pa.Table.from_batches(batches) if batches else None
    frames = table.to_pandas(types_mapper=pandas_dtype) if table is not None else _empty_frames()
    tables = timeline_frames(t)
    tables["high_seqnos"] = _high_frame(highs)
    return frames, tables


def _empty_frames() -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(
        {"frame": pd.array([], dtype="int64"), "capture_set": pd.array([], dtype="int64"), "ts": pd.to_datetime([], utc=True)}
    )


def consumer_lag(
    source: str | Path | Iterable[str | Path] | Iterable[Record], *, top: int | None = 10, stats: CaptureStats | None = None, **options: Any
) -> ConsumerLag:
    """The progress table and its worst-first summary of capture paths (read once) or records (a live session's).

    ``options`` go to :func:`~dcpinspect.tables.columnar.read_parts` (paths only).
    """
    from ..flows.records import CaptureStats, Record
    from ..timeline import build_timeline
    from .export import frames_df
    from .timeline import timeline_frames

    items = [source] if isinstance(source, (str, Path)) else list(source)
    if items and isinstance(items[0], Record):
        recs: list[Record] = items  # type: ignore[assignment]
        frames = frames_df(recs)
        tables = timeline_frames(build_timeline(recs))
        tables["high_seqnos"] = high_seqnos(recs)
    else:
        from ..capture.sets import file_sets, planned
        from ..timeline import TimelineBuilder
        from .columnar import read_parts

        paths = [str(p) for p in items]
        plan = planned(paths, options.pop("capture_sets", "auto"))
        st = stats if stats is not None else CaptureStats()
        parts = read_parts(paths, stats=st, capture_sets=plan, **options)
        frames, tables = lag_tables(parts, TimelineBuilder(file_sets(plan)))
    p = progress(frames, tables)
    return ConsumerLag(p, lag_summary(p, top))
