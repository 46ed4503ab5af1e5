"""Statistics of a capture as pandas DataFrames (``dcpinspect stats``; an edge module: pandas).

Theory of operation: every table is a pure function of the frames table
(:func:`~dcpinspect.tables.export.frames_df`, or only the :data:`STATS_COLUMNS`
of it), plus, for two of them, what the read saw besides frames (the
connections) or the timeline.  Like tshark's ``-z`` statistics:

1. :func:`response_times` - request/response times per command (``srt``):
   a response is paired with the latest earlier request on the same
   connection with the same opaque and opcode, in the other direction; a
   request answered several times (STAT) counts its first answer.  The time
   is response ``ts`` minus request ``ts`` (each the time of the packet that
   completed the frame), in milliseconds.  Only commands with at least one
   response are listed; ``unanswered`` counts their requests that got none.
2. :func:`status_counts` - responses per status (and per command).
3. :func:`conversations` - per connection: frames and bytes each way (the
   bytes of its frames, garbage and truncated frames; bytes lost to capture
   gaps apart), first and last time, duration.  A connection with no frames
   (TLS, nothing decoded) is listed from the read's connections.
4. :func:`vbucket_progress` - per vbucket and stream (connection, stream id),
   from the timeline: ``last_seqno`` is the last item seqno the stream
   delivered (seqno-advanced included; the requested start seqno when no item
   came), ``high_seqno`` the highest seqno the producer was seen to have:
   the largest of that seqno, the end of the stream's latest snapshot marker,
   and the vbucket's last GET_ALL_VB_SEQNOS high seqno when it was seen while
   the stream's latest segment was open (after its request, before its end).  ``lag = high_seqno - last_seqno``: items the
   producer had announced that the capture never saw delivered.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from ..timeline import Timeline

__all__ = [
    "STATS_COLUMNS",
    "TABLES",
    "conversations",
    "json_records",
    "response_times",
    "stats_frame",
    "status_counts",
    "text_table",
    "vbucket_progress",
]

#: the frames-table columns the statistics read
STATS_COLUMNS = (
    "frame",
    "file",
    "conn_id",
    "conn",
    "dir",
    "ts",
    "type",
    "length",
    "opcode",
    "name",
    "role",
    "status",
    "status_name",
    "opaque",
)
#: the tables ``dcpinspect stats`` can print, in its order
TABLES = ("rtt", "status", "conversations", "vbuckets")

_PERCENTILES = (50, 90, 99)
_RTT_COLUMNS = ["name", "opcode", "requests", "answered", "unanswered", "min_ms", "avg_ms", "max_ms", "p50_ms", "p90_ms", "p99_ms"]


def _frames_only(frames: pd.DataFrame) -> pd.DataFrame:
    return frames[frames["type"] == "frame"]


def response_times(frames: pd.DataFrame) -> pd.DataFrame:
    """Request/response times per command: counts and min/avg/max/p50/p90/p99 in ms (rule 1)."""
    import numpy as np
    import pandas as pd

    f = _frames_only(frames)
    key = ["conn_id", "opaque", "opcode"]
    cols = [*key, "frame", "ts", "dir", "name"]
    req = f.loc[f["role"] == "request", cols].dropna(subset=key).sort_values("frame")
    resp = f.loc[f["role"] == "response", cols].dropna(subset=key).sort_values("frame")
    if req.empty or resp.empty:
        return pd.DataFrame(columns=_RTT_COLUMNS)
    req = req.astype({k: "int64" for k in key}).rename(columns={"frame": "req_frame", "ts": "req_ts", "dir": "req_dir"})
    resp = resp.astype({k: "int64" for k in key}).rename(columns={"ts": "resp_ts", "name": "resp_name"})
    req["match"] = req["req_frame"]
    resp["match"] = resp["frame"]
    pairs = pd.merge_asof(resp, req, on="match", by=key, direction="backward", allow_exact_matches=False)
    pairs = pairs[pairs["req_frame"].notna() & (pairs["req_dir"] != pairs["dir"])]
    pairs = pairs.drop_duplicates(subset="req_frame", keep="first")
    pairs["ms"] = (pairs["resp_ts"] - pairs["req_ts"]).dt.total_seconds() * 1e3
    answered_ops = set(pairs["opcode"])
    rows = []
    for op, group in req[req["opcode"].isin(answered_ops)].groupby("opcode", sort=True):
        got = pairs[pairs["opcode"] == op]
        ms = got["ms"].dropna().to_numpy(dtype=float)
        stats: dict[str, Any] = {f"{k}_ms": None for k in ("min", "avg", "max", *(f"p{p}" for p in _PERCENTILES))}
        if len(ms):
            stats.update(min_ms=ms.min(), avg_ms=ms.mean(), max_ms=ms.max())
            stats.update({f"p{p}_ms": float(np.percentile(ms, p)) for p in _PERCENTILES})
        rows.append(
            {
                "name": str(group["name"].iloc[0]),
                "opcode": int(op),
                "requests": len(group),
                "answered": len(got),
                "unanswered": len(group) - len(got),
                **stats,
            }
        )
    out = pd.DataFrame(rows, columns=_RTT_COLUMNS)
    return out.sort_values(["requests", "name"], ascending=[False, True], ignore_index=True)


def status_counts(frames: pd.DataFrame) -> pd.DataFrame:
    """Responses per status: ``status``, ``status_name``, ``responses``, and the commands answered with it (most first)."""
    import pandas as pd

    f = _frames_only(frames)
    r = f[f["role"] == "response"]
    if r.empty:
        return pd.DataFrame(columns=["status", "status_name", "responses", "commands"])
    rows = []
    for (status, name), group in r.groupby(["status", "status_name"], sort=True, dropna=False):
        per = group["name"].value_counts()
        rows.append(
            {
                "status": None if pd.isna(status) else int(status),
                "status_name": name,
                "responses": len(group),
                "commands": ", ".join(f"{op} {n}" for op, n in per.items()),
            }
        )
    return pd.DataFrame(rows).sort_values(["responses", "status"], ascending=[False, True], ignore_index=True)


_CONV_COLUMNS = [
    "conn_id",
    "conn",
    "file",
    "frames_c2s",
    "frames_s2c",
    "bytes_c2s",
    "bytes_s2c",
    "bytes_lost",
    "first",
    "last",
    "duration_s",
    "note",
]


def conversations(frames: pd.DataFrame, connections: Iterable[Any] = ()) -> pd.DataFrame:
    """Per connection: frames and bytes each way, bytes lost, first and last time, duration (rule 3).

    ``connections`` are the read's :class:`~dcpinspect.flows.reassembly.Connection` objects
    (``CaptureStats.connections``): connections without frames are listed from them, and TLS is noted.
    """
    import pandas as pd

    rows: dict[int, dict[str, Any]] = {}
    for conn_id, group in frames.groupby("conn_id", sort=True):
        data = group[group["type"] != "gap"]
        row: dict[str, Any] = {"conn_id": int(conn_id), "conn": group["conn"].iloc[0], "file": group["file"].iloc[0]}
        for d in ("c2s", "s2c"):
            mine = data[data["dir"] == d]
            row[f"frames_{d}"] = int((mine["type"] == "frame").sum())
            row[f"bytes_{d}"] = int(mine["length"].sum())
        row["bytes_lost"] = int(group.loc[group["type"] == "gap", "length"].sum())
        ts = group["ts"].dropna()
        row["first"], row["last"] = (ts.min(), ts.max()) if len(ts) else (pd.NaT, pd.NaT)
        row["note"] = ""
        rows[int(conn_id)] = row
    for c in connections:
        if c.id in rows:
            rows[c.id]["note"] = "TLS, not decoded" if c.tls else ""
            continue
        rows[c.id] = {
            "conn_id": c.id,
            "conn": c.label,
            "file": c.file,
            "frames_c2s": 0,
            "frames_s2c": 0,
            "bytes_c2s": 0,
            "bytes_s2c": 0,
            "bytes_lost": int(c.lost),
            "first": pd.Timestamp(c.first_ts, unit="ns", tz="UTC") if c.first_ts else pd.NaT,
            "last": pd.Timestamp(c.last_ts, unit="ns", tz="UTC") if c.last_ts else pd.NaT,
            "note": "TLS, not decoded" if c.tls else "no frames",
        }
    if not rows:
        return pd.DataFrame(columns=_CONV_COLUMNS)
    out = pd.DataFrame([rows[k] for k in sorted(rows)])
    out["first"] = pd.to_datetime(out["first"], utc=True)
    out["last"] = pd.to_datetime(out["last"], utc=True)
    out["duration_s"] = (out["last"] - out["first"]).dt.total_seconds()
    return out[_CONV_COLUMNS]


_VB_COLUMNS = [
    "vbucket",
    "conn_id",
    "stream_id",
    "segments",
    "items",
    "last_seqno",
    "high_seqno",
    "high_from",
    "lag",
    "state",
    "end",
]


def vbucket_progress(timeline: Timeline, items_seen: Any = None) -> pd.DataFrame:
    """Per vbucket and stream: items delivered, last seqno, the highest seqno seen, and the lag between them (rule 4).

    ``items_seen(index)`` gives a stream's true item count when the timeline
    kept only some of its items (``TimelineBuilder.items_seen``).
    """
    import pandas as pd

    groups: dict[tuple[int, int, int | None], list[tuple[int, Any]]] = {}
    for i, s in enumerate(timeline.streams):
        groups.setdefault((s.vbucket, s.conn, s.stream_id), []).append((i, s))
    rows = []
    for (vb, conn, sid), segs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], -1 if kv[0][2] is None else kv[0][2])):
        count = sum(items_seen(i) if items_seen is not None else len(s.items) for i, s in segs)
        live = [s for _i, s in segs if s.attempts or s.items]
        s = live[-1] if live else segs[-1][1]
        last = s.last_seqno
        if last is None:
            ok = [a for a in s.attempts if a.outcome == "success"]
            last = ok[-1].start if ok else None
        high, source = (last, "items") if last is not None else (None, "")
        if s.snapshots and (high is None or s.snapshots[-1].end > high):
            high, source = s.snapshots[-1].end, "snapshot marker"
        begun = min([a.frame for a in s.attempts] + [it.frame for it in s.items[:1]], default=0)
        ended = None if s.end is None else s.end.get("frame")
        seen = timeline.high_seqnos.get(vb)
        if seen is not None and seen[0] >= begun and (ended is None or seen[0] <= ended) and (high is None or seen[1] > high):
            high, source = seen[1], "GET_ALL_VB_SEQNOS"
        rows.append(
            {
                "vbucket": vb,
                "conn_id": conn,
                "stream_id": sid,
                "segments": len(segs),
                "items": count,
                "last_seqno": last,
                "high_seqno": high,
                "high_from": source,
                "lag": None if high is None or last is None else high - last,
                "state": str(s.state),
                "end": None if s.end is None else s.end.get("name"),
            }
        )
    out = pd.DataFrame(rows, columns=_VB_COLUMNS)
    for col in ("last_seqno", "high_seqno", "lag"):
        out[col] = out[col].astype("UInt64")
    out["stream_id"] = out["stream_id"].astype("Int64")
    return out


def stats_frame(batches: Iterable[Any]) -> pd.DataFrame:
    """The :data:`STATS_COLUMNS` of parts of the frames table (Arrow batches or tables) as one DataFrame (nullable integers)."""
    import pyarrow as pa

    from .frames_vector import SCHEMA
    from .schema import pandas_dtype

    tables = [b if isinstance(b, pa.Table) else pa.Table.from_batches([b]) for b in batches]
    tables = [t.select(list(STATS_COLUMNS)) for t in tables]
    table = pa.concat_tables(tables) if tables else SCHEMA.empty_table().select(list(STATS_COLUMNS))
    return table.to_pandas(types_mapper=pandas_dtype)


def _json_value(v: Any) -> Any:
    import math

    import pandas as pd

    if v is None or v is pd.NA or v is pd.NaT:
        return None
    if isinstance(v, pd.Timestamp):
        return round(v.value / 1e9, 6)
    if hasattr(v, "item"):  # numpy scalars
        v = v.item()
    if isinstance(v, float):
        return None if math.isnan(v) else round(v, 6)
    return v


def json_records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows of a statistics table, JSON-ready: times as seconds since the epoch, missing values None, floats to 6 digits."""
    cols = list(df.columns)
    return [{c: _json_value(v) for c, v in zip(cols, row, strict=True)} for row in df.itertuples(index=False)]


def text_table(df: pd.DataFrame, escape: Any = str) -> str:
    """A statistics table as aligned text: times in ms/s with three decimals, dates to the microsecond, opcodes in hex.

    ``escape`` makes a text cell printable (wire text: keys, labels).
    """
    import math

    import pandas as pd

    if df.empty:
        return "  (none)"
    shown = df.copy()
    for c in shown.columns:
        if c.endswith("_ms") or c == "duration_s":
            shown[c] = shown[c].map(lambda v: "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}")
        elif c in ("first", "last"):
            shown[c] = shown[c].map(lambda v: "" if v is None or v is pd.NaT else v.strftime("%Y-%m-%d %H:%M:%S.%f"))
        elif c == "opcode":
            shown[c] = shown[c].map(lambda v: f"0x{v:02x}")
        elif shown[c].dtype == object:
            shown[c] = shown[c].map(lambda v: escape(v) if isinstance(v, str) else v)
    shown = shown.astype(object).where(shown.notna(), "")
    return str(shown.to_string(index=False))
