"""The explorer's question panels: a key's history, what the shown stream's rollbacks cost, consumer lag, two consumers compared (no widget toolkit here).

Theory of operation: the answers are the pure functions of
:mod:`dcpinspect.tables.history` , :mod:`dcpinspect.tables.progress` and
:mod:`dcpinspect.tables.compare`, run
on tables this module cuts out of an :class:`~dcpinspect.views.explorer.ExplorerModel`:
its :class:`~dcpinspect.views.store.FrameStore` (Arrow) and its timeline
(``timeline_frames(t, items=False)``).  The timeline the explorer keeps has
its items thinned (``MAX_ITEMS`` per stream), so the items table is rebuilt
from the frames every item had (the model's ``on_items`` sink) and the
store's columns.

1. Bounded: only the rows a question needs become pandas rows.  A key's
   history takes the frames of that key (an Arrow ``equal`` over the key
   column) and the answers to their requests (same connection and opaque: a
   write's status), with :data:`~dcpinspect.tables.history.COLUMNS` only;
   with each stream's first item and its last before each stream request
   of its vbucket (what finds a consumer resuming another's state); the
   rollback cost takes the items of the streams of one vbucket; the lag
   takes, per stream and snapshot, the items that decide a lag (rule 2);
   the comparison takes every item of the two consumers' streams (a
   difference is any one item) and, of the frames table, only ``frame``,
   ``conn_id``, ``key`` and ``cid`` of those items' rows and of each
   connection's last row (what says a connection closed below a seqno), cut
   in Arrow (:func:`compare_frames_table`).
2. The lag's items: the producer's high seqno of a vbucket only takes
   values its snapshot markers, stream requests and reports name (an item is
   at most its snapshot's end), and between two such values the time the high
   rose above a consumer seqno is one.  So of each (stream, snapshot) the last
   item in each band between two values is kept (its lag in seconds is the
   band's largest), with the one of the highest seqno (an OSO snapshot's items
   come in key order) and every SEQNO_ADVANCED.  Items before a stream's
   first marker (a capture starting mid-stream) raise the high seqno
   themselves: their seqnos are values of the other streams of the vbucket too,
   up to :data:`MAX_LOOSE_HIGHS` of them (beyond, another consumer's lag they
   caused is seen at the kept items only: bounded, not exact).  The consumer's
   seqno is then exact at every marker and report, so
   :func:`~dcpinspect.tables.progress.lag_summary` (the worst lag in items and
   in seconds, and at the end) is the full table's (a test checks it on every
   shipped capture); the progress table has fewer rows (none for an item that
   changed neither).
3. An item's snapshot is the last marker of its stream before it (the
   timeline's ``Item.snapshot``; -1 before any).
4. Lazy: each answer is cached under the model's timeline and row count and
   computed only when asked (a panel the user opened); a live fold makes a
   new timeline, so the next look computes it again.
5. Text off the wire (keys, consumer names) is escaped in every HTML
   rendering here (:func:`html_table`, :func:`story_html`).
6. The consumers a comparison may pick (:func:`consumer_choices`): each
   DCP_OPEN name once (every connection that opened with it), then every
   connection by number (two connections of one name, or one that never
   opened DCP in the capture).
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..flows.records import Record
from ..protocol.enums import Opcode
from ..wire.render import safe_text

if TYPE_CHECKING:
    import pandas as pd

    from ..timeline import Timeline
    from .store import FrameStore

__all__ = [
    "COMPARE_SHOWN",
    "HISTORY_SHOWN",
    "LAG_SHOWN",
    "LOSS_SHOWN",
    "MAX_LOOSE_HIGHS",
    "PANELS",
    "SEQNO_ADVANCED",
    "compare_frames_table",
    "consumer_choices",
    "difference_label",
    "first_evidence",
    "high_values",
    "html_table",
    "item_table",
    "key_frames_table",
    "lag_frames",
    "lag_items",
    "parse_collection",
    "resume_witnesses",
    "rows_of_frames",
    "story_html",
]

#: the panels a view may open (the model computes a panel's answer only while it is open)
PANELS = ("key", "rollback", "lag", "compare")
#: columns of a key's history shown in a table
HISTORY_SHOWN = (
    "frame",
    "conn",
    "consumer",
    "vbucket",
    "stream",
    "name",
    "seqno",
    "cas",
    "cas_time",
    "rev_seqno",
    "snap_type",
    "fate",
    "fate_frame",
)
#: columns of the rollback costs shown
LOSS_SHOWN = ("frame", "response_frame", "stream", "vbucket", "rollback_seqno", "items", "redelivered", "possibly_lost", "lost_keys")
#: columns of the lag summary shown
LAG_SHOWN = ("consumer", "conn", "vbucket", "stream_id", "max_lag_items", "max_lag_seconds", "end_lag_items", "end_lag_seconds")
#: columns of a comparison's differences shown
COMPARE_SHOWN = ("vbucket", "only_in", "seqno_from", "seqno_to", "items", "keys", "reason", "explanation", "evidence_a", "evidence_b")
#: the frames table's columns a comparison reads (:func:`~dcpinspect.tables.compare.compare_consumers`)
COMPARE_FRAME_COLUMNS = ["frame", "conn_id", "key", "cid"]
_ITEM_COLUMNS = ["stream", "conn", "capture_set", "file", "vbucket", "frame", "ts", "name", "seqno", "snapshot"]
#: the command name of a SEQNO_ADVANCED (kept whole by the lag, rule 2)
SEQNO_ADVANCED = Opcode.DCP_SEQNO_ADVANCED.name
_REPORTS = (Opcode.GET_ALL_VB_SEQNOS.name, Opcode.STAT.name)
#: seqnos of other streams' items before a first marker a stream's lag bands use at most (rule 2)
MAX_LOOSE_HIGHS = 1024
_MAX_ROWS = 200  # rows of a table rendered as HTML (the title says how many more)


class ExplorerModel(Protocol):
    """What the panels read of an :class:`~dcpinspect.views.explorer.ExplorerModel` (no import of it: it imports this module)."""

    @property
    def timeline(self) -> Timeline | None: ...

    store: FrameStore

    def item_frames(self, i: int) -> np.ndarray: ...


def parse_collection(text: str) -> int | None:
    """A collection id as typed: ``8``, ``0x8`` (hex with 0x, else decimal); empty: any. Raises ValueError."""
    text = text.strip()
    if not text:
        return None
    value = int(text, 16) if text.lower().startswith("0x") else int(text)
    if not 0 <= value < 1 << 32:
        raise ValueError(f"collection id {text} is out of range")
    return value


def _where(t: Timeline) -> dict[int | None, tuple[int, str]]:
    """Conn -> (its capture set, its file), as the timeline's tables place rows."""
    return {c.conn: (c.capture_set, c.file) for c in t.connections.values()}


def _snapshot_of(t: Timeline, i: int, frames: np.ndarray) -> np.ndarray:
    """Rule 3: the index of the last marker of stream ``i`` before each frame (-1: none)."""
    markers = np.asarray([sn.frame for sn in t.streams[i].snapshots], dtype=np.int64)
    return np.searchsorted(markers, frames, side="left") - 1


def item_table(model: ExplorerModel, streams: Iterable[int], keep: Callable[[int, np.ndarray], np.ndarray] | None = None) -> pd.DataFrame:
    """The timeline's ``items`` table (as ``timeline_frames`` builds it) for ``streams``, every item, read from the store.

    ``keep(stream, frames)`` returns the frames of the stream to keep (default: all).
    """
    import pandas as pd

    from ..tables.schema import pandas_dtype

    t = model.timeline
    store = model.store
    cols: dict[str, list[Any]] = {k: [] for k in ("stream", "frame", "snapshot")}
    if t is not None:
        for i in streams:
            frames = model.item_frames(i)
            if keep is not None:
                frames = keep(i, frames)
            cols["stream"].append(np.full(len(frames), i, np.int64))
            cols["frame"].append(frames)
            cols["snapshot"].append(_snapshot_of(t, i, frames))
    frames = np.concatenate(cols["frame"]) if cols["frame"] else np.zeros(0, np.int64)
    stream = np.concatenate(cols["stream"]) if cols["stream"] else np.zeros(0, np.int64)
    snapshot = np.concatenate(cols["snapshot"]) if cols["snapshot"] else np.zeros(0, np.int64)
    rows = rows_of_frames(model, frames)
    got = store.take(rows, ["frame", "ts", "name", "seqno"]).to_pandas(types_mapper=pandas_dtype)
    where = _where(t) if t is not None else {}
    conn = [t.streams[int(s)].conn for s in stream] if t is not None else []
    placed = [where.get(c, (1, "")) for c in conn]
    out = pd.DataFrame(
        {
            "stream": stream,
            "conn": pd.array(conn, dtype="int64"),
            "capture_set": pd.array([p[0] for p in placed], dtype="int64"),
            "file": [p[1] for p in placed],
            "vbucket": pd.array([t.streams[int(s)].vbucket for s in stream] if t is not None else [], dtype="int64"),
            "frame": frames,
            "ts": got["ts"].to_numpy() if len(got) else pd.to_datetime([], utc=True),
            "name": got["name"].astype(object).to_numpy() if len(got) else [],
            "seqno": got["seqno"].to_numpy() if len(got) else pd.array([], dtype="UInt64"),
            "snapshot": snapshot,
        },
        columns=_ITEM_COLUMNS,
    )
    out["seqno"] = out["seqno"].astype("UInt64")
    return out


def rows_of_frames(model: ExplorerModel, frames: np.ndarray) -> np.ndarray:
    """The store rows of frame numbers (a frame the store lacks is left out; ``item_table`` keeps only stored ones)."""
    col = model.store.frames()
    if not len(frames) or not len(col):
        return np.zeros(0, np.int64)
    at = np.minimum(np.searchsorted(col, frames), len(col) - 1)
    if bool(np.all(col[at] == frames)):
        return at.astype(np.int64)
    rows = [model.store.row_of(int(f)) for f in frames.tolist()]  # frame numbers not ascending in the table: searched
    if any(r is None for r in rows):
        raise ValueError("an item frame is not in the frames table")
    return np.asarray(rows, np.int64)


def key_frames_table(model: ExplorerModel, key: str, columns: Iterable[str]) -> pd.DataFrame:
    """Rule 1: the frames of ``key`` (exact, any collection) and the answers to their requests, ``columns`` only, as pandas."""
    from ..tables.schema import pandas_dtype

    table = model.store.compact
    hit = pc.fill_null(pc.equal(table.column("key"), pa.scalar(key, pa.string())), False)
    rows = np.flatnonzero(hit.to_numpy(zero_copy_only=False))
    if len(rows):
        asked = model.store.take(rows, ["conn_id", "opaque", "role"]).to_pylist()
        pairs = {(r["conn_id"], r["opaque"]) for r in asked if r["role"] == "request" and r["opaque"] is not None}
        if pairs:
            ops = pa.array(sorted({o for _c, o in pairs}), pa.uint32())
            maybe = pc.and_(pc.equal(table.column("role"), "response"), pc.is_in(table.column("opaque"), value_set=ops))
            extra = np.flatnonzero(pc.fill_null(maybe, False).to_numpy(zero_copy_only=False))
            if len(extra):
                who = model.store.take(extra, ["conn_id", "opaque"]).to_pylist()
                extra = np.asarray([r for r, w in zip(extra.tolist(), who, strict=True) if (w["conn_id"], w["opaque"]) in pairs], np.int64)
                rows = np.union1d(rows, extra)
    return model.store.take(rows.astype(np.int64), list(columns)).to_pandas(types_mapper=pandas_dtype)


def lag_items(t: Timeline, i: int, frames: np.ndarray, seqnos: np.ndarray, advanced: np.ndarray, highs: np.ndarray) -> np.ndarray:
    """Rule 2: the positions (into ``frames``, sorted) of stream ``i``'s items the lag needs.

    ``highs``: every value the producer's high seqno of the vbucket may hold
    (sorted): between two of them the time the high rose above a consumer
    seqno is one, so of a snapshot's items in one such band the last has the
    largest lag in seconds.  ``advanced``: which items are SEQNO_ADVANCED (all kept).
    """
    n = len(frames)
    if n == 0:
        return np.zeros(0, np.int64)
    snap = _snapshot_of(t, i, frames)
    band = np.searchsorted(highs, seqnos, side="right")
    keep = advanced.astype(bool, copy=True)
    group = np.ones(n, bool)
    group[:-1] = (snap[:-1] != snap[1:]) | (band[:-1] != band[1:])  # the last of its (snapshot, band) run, in frame order
    keep |= group
    order = np.lexsort((seqnos, snap))  # by snapshot, then seqno: the last of each run is its highest
    s_sorted = snap[order]
    top = np.ones(n, bool)
    top[:-1] = s_sorted[:-1] != s_sorted[1:]
    keep[order[top]] = True
    return np.flatnonzero(keep)


def lag_frames(model: ExplorerModel, tables: Mapping[str, pd.DataFrame]) -> dict[int, np.ndarray]:
    """Rule 2 over every stream of the model: stream -> the frames of its items the lag needs."""
    t = model.timeline
    if t is None:
        return {}
    store = model.store
    cols: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    loose: dict[int, list[tuple[int, np.ndarray]]] = {}  # vbucket -> (stream, seqnos of its items before a first marker)
    for i, s in enumerate(t.streams):
        f = model.item_frames(i)
        got = store.take(rows_of_frames(model, f), ["seqno", "name"])
        seqnos = pc.fill_null(got.column("seqno"), 0).to_numpy(zero_copy_only=False).astype(np.uint64)
        advanced = pc.fill_null(pc.equal(got.column("name"), SEQNO_ADVANCED), False).to_numpy(zero_copy_only=False)
        cols[i] = (f, seqnos, advanced)
        before = _snapshot_of(t, i, f) < 0
        if before.any():
            loose.setdefault(s.vbucket, []).append((i, seqnos[before]))
    base: dict[int, np.ndarray] = {}
    out: dict[int, np.ndarray] = {}
    for i, (f, seqnos, advanced) in cols.items():
        vb = t.streams[i].vbucket
        if vb not in base:
            base[vb] = high_values(tables, vb)
        others = [q for j, q in loose.get(vb, []) if j != i]
        extra = sum(len(q) for q in others)
        highs = np.union1d(base[vb], np.concatenate(others)) if others and extra <= MAX_LOOSE_HIGHS else base[vb]
        out[i] = f[lag_items(t, i, f, seqnos, advanced, highs)]
    return out


def high_values(tables: Mapping[str, pd.DataFrame], vbucket: int) -> np.ndarray:
    """Rule 2's ``highs`` of ``vbucket``: its snapshots' starts and ends, its requests' starts and rollback seqnos, the reports (sorted)."""
    values: list[Any] = []
    for name, cols in (("snapshots", ("start", "end")), ("attempts", ("start", "rollback_seqno")), ("high_seqnos", ("high_seqno",))):
        df = tables.get(name)
        if df is None or "vbucket" not in df.columns or not len(df):
            continue
        mine = df[df["vbucket"] == vbucket]
        for c in cols:
            if c in mine.columns:
                values += [int(v) for v in mine[c].dropna()]
    return np.unique(np.asarray(values, dtype=np.uint64))


def resume_witnesses(t: Timeline, i: int, frames: np.ndarray) -> np.ndarray:
    """Rule 1's other items of stream ``i`` (``frames``, sorted) a key's history needs: its first, and its last before each request on its vbucket.

    What :func:`~dcpinspect.tables.history.key_versions` reads to find a
    consumer that resumed where another left the vbucket (history rule 2).
    """
    if not len(frames):
        return frames
    vb = t.streams[i].vbucket
    asks = np.asarray(sorted({a.frame for s in t.streams if s.vbucket == vb for a in s.attempts}), dtype=np.int64)
    at = np.searchsorted(frames, asks, side="left") - 1
    return np.unique(np.concatenate([frames[:1], frames[at[at >= 0]]]))


def high_seqno_table(model: ExplorerModel) -> pd.DataFrame:
    """The ``high_seqnos`` table (:func:`~dcpinspect.tables.progress.high_seqnos`) of the store's GET_ALL_VB_SEQNOS and STAT answers."""
    from ..tables.progress import high_seqnos

    table = model.store.compact
    wanted = pc.and_(pc.is_in(table.column("name"), value_set=pa.array(_REPORTS)), pc.equal(table.column("role"), "response"))
    rows = np.flatnonzero(pc.fill_null(wanted, False).to_numpy(zero_copy_only=False))
    recs = []
    if len(rows):
        where = model.store.take(rows, ["frame", "conn_id", "dir", "capture_set"]).to_pylist()
        for row, w in zip(rows.tolist(), where, strict=True):
            ev, ctx = model.store.event(int(row))
            recs.append(Record(w["frame"], "", w["conn_id"], "", w["dir"], 0, 0, 0, 0, ev, ctx, w["capture_set"] or 1))  # type: ignore[arg-type]
    return high_seqnos(recs)


def html_table(df: pd.DataFrame, columns: Iterable[str], *, css: str = "dcpinspect-panel", selected: int | None = None) -> str:
    """``columns`` of ``df`` as an escaped HTML table (at most :data:`_MAX_ROWS` rows; a row whose ``frame`` is ``selected`` outlined)."""
    cols = [c for c in columns if c in df.columns]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = []
    for rec in df.head(_MAX_ROWS)[cols].to_dict("records"):
        style = ' style="outline:2px solid #0072b2"' if selected is not None and rec.get("frame") == selected else ""
        body.append(f"<tr{style}>" + "".join(f"<td>{html.escape(cell_text(rec[c]))}</td>" for c in cols) + "</tr>")
    more = f"<p>({len(df) - _MAX_ROWS:,} more rows)</p>" if len(df) > _MAX_ROWS else ""
    return f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>{more}'


def cell_text(v: Any) -> str:
    """A table cell as plain text (text off the wire made safe: :func:`~dcpinspect.wire.render.safe_text`)."""
    import pandas as pd

    if isinstance(v, (list, tuple, np.ndarray)):
        return ", ".join(cell_text(x) for x in v)
    if v is None or (not isinstance(v, str) and pd.isna(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.3f}"
    return safe_text(str(v), 200)


def merged(tables: Mapping[str, pd.DataFrame], **more: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """``tables`` with ``more`` added (a new dict: the cached tables are never changed)."""
    return {**tables, **more}


def consumer_choices(tables: Mapping[str, pd.DataFrame]) -> list[tuple[str, int | str]]:
    """Rule 6: (label, selector) of every consumer a comparison may pick: DCP_OPEN names (a str), then connections (an int)."""
    from ..tables.compare import consumer_names

    named = consumer_names(tables)
    out: list[tuple[str, int | str]] = []
    for name in dict.fromkeys(n for _c, n in named):
        conns = [c for c, n in named if n == name]
        out.append((safe_text(f"{name!r} (conn {', '.join(map(str, conns))})", 120), name))
    conns_df = tables.get("connections")
    names = dict(named)
    for c in [] if conns_df is None or not len(conns_df) else [int(c) for c in conns_df["conn"]]:
        out.append((safe_text(f"conn {c}" + (f" ({names[c]!r})" if c in names else ""), 120), c))
    return out


def compare_frames_table(model: ExplorerModel, item_frames: np.ndarray, conns: Iterable[int]) -> pd.DataFrame:
    """Rule 1: ``frame, conn_id, key, cid`` of the items' rows and of each of ``conns``' last row, cut in Arrow, as pandas."""
    from ..tables.schema import pandas_dtype

    table = model.store.compact.select(["frame", "conn_id"])
    wanted = pa.array(sorted({int(c) for c in conns}), table.schema.field("conn_id").type)
    mine = table.filter(pc.fill_null(pc.is_in(table.column("conn_id"), value_set=wanted), False))
    last = mine.group_by("conn_id").aggregate([("frame", "max")]).column("frame_max").to_numpy(zero_copy_only=False)
    frames = np.union1d(np.asarray(item_frames, np.int64), np.asarray(last, np.int64))
    rows = rows_of_frames(model, frames)
    return model.store.take(np.sort(rows), COMPARE_FRAME_COLUMNS).to_pandas(types_mapper=pandas_dtype)


def first_evidence(row: Mapping[str, Any]) -> int | None:
    """The frame a difference row is shown by: the first evidence frame of the consumer that has the items, else the other's."""
    side = str(row.get("only_in") or "a")
    for col in (f"evidence_{side}", "evidence_b" if side == "a" else "evidence_a"):
        frames = row.get(col)
        if frames is not None and len(frames):
            return int(frames[0])
    return None


def difference_label(row: Mapping[str, Any]) -> str:
    """One difference of a comparison as a line of a list (text off the wire made safe)."""
    seqnos = f"{row['seqno_from']}" if row["seqno_from"] == row["seqno_to"] else f"{row['seqno_from']}-{row['seqno_to']}"
    keys = cell_text(list(row["keys"])[:3]) + (", ..." if len(row["keys"]) > 3 else "")
    text = f"vb {row['vbucket']}  only in {row['only_in']}  seqnos {seqnos}  ({row['items']} items: {keys})  {row['reason']}: {row['explanation']}"
    return safe_text(text, 300)


def story_html(story: str) -> str:
    """A comparison's story as escaped HTML (each line made safe: it quotes keys and consumer names off the wire)."""
    lines = "\n".join(html.escape(safe_text(line, 1000)) for line in story.splitlines())
    return f'<pre class="dcpinspect-compare-story">{lines}</pre>'
