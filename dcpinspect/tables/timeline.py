"""Timelines as pandas DataFrames, and as text (an edge: imports pandas).

:func:`timeline_frames` turns a :class:`~dcpinspect.timeline.model.Timeline` into
one DataFrame per kind of thing - connections, streams, attempts, snapshots,
items, failover entries (with branch ids and their history), rollbacks (with
explanations), flow-control samples, stalls, noops, anomalies - each carrying
the frame numbers that link back to the frames table and its annotations, and
the ``capture_set`` and ``file`` of its connection.  :func:`story` is the
readable per-stream text of ``dcpinspect timeline``: the failover branch tree
of each vbucket per capture set and history (:mod:`dcpinspect.timeline.rollback`).
UUIDs are written as 16 hex digits everywhere (``0x00000000feeddeca``).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

from ..protocol import spec
from ..timeline import MAX_SEQNO, Branch, Stream, Timeline
from ..timeline.rollback import hex_uuid
from ..wire.render import plural

__all__ = ["story", "timeline_frames"]

_U64 = pd.UInt64Dtype()


def _df(rows: list[dict[str, Any]], columns: list[str], uint64: tuple[str, ...] = ()) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=columns)
    for col in uint64:
        if col not in df.columns:
            continue
        df[col] = pd.array([None if v is None or v != v else int(v) for v in df[col]], dtype=_U64)  # noqa: PLR0124 - NaN check
    return df


def _nullable(df: pd.DataFrame, col: str) -> pd.DataFrame:
    """``col`` as nullable int64: a duration is unknown (null) where a packet's time was out of range."""
    df[col] = df[col].astype("Int64")
    return df


def _ts(values: list[int]) -> pd.DatetimeIndex:
    return pd.to_datetime(np.array(values, np.int64), unit="ns", utc=True)


def _where(t: Timeline) -> dict[int | None, tuple[int, str]]:
    """Conn -> (its capture set, its file)."""
    return {c.conn: (c.capture_set, c.file) for c in t.connections.values()}


def _placed(df: pd.DataFrame, where: dict[int | None, tuple[int, str]]) -> pd.DataFrame:
    """``df`` with the ``capture_set`` and ``file`` of each row's connection (set 1 and no file for an unknown one)."""
    conns = df["conn"].tolist() if "conn" in df.columns else [None] * len(df)
    placed = [where.get(c, (1, "")) for c in conns]
    at = df.columns.get_loc("conn") + 1 if "conn" in df.columns else len(df.columns)
    df.insert(at, "capture_set", pd.array([p[0] for p in placed], dtype="int64"))
    df.insert(at + 1, "file", [p[1] for p in placed])
    return df


def _items(streams: list[tuple[int, Stream]], where: dict[int | None, tuple[int, str]]) -> pd.DataFrame:
    """One row per item, built column by column (millions of rows)."""
    if not streams:
        return _df([], ["stream", "capture_set", "file", "seqno"], ("seqno",))
    keys = ("stream", "conn", "capture_set", "file", "vbucket", "frame", "ts", "name", "seqno", "snapshot")
    cols: dict[str, list[Any]] = {k: [] for k in keys}
    names: dict[int, str] = {}
    for i, s in streams:
        n = len(s.items)
        frame, ts, opcode, seqno, snapshot = zip(*s.items, strict=True)
        for op in set(opcode) - names.keys():
            cmd = spec.COMMANDS.get(op)
            names[op] = cmd.name if cmd else hex(op)
        cols["stream"] += [i] * n
        cols["conn"] += [s.conn] * n
        cs, file = where.get(s.conn, (1, ""))
        cols["capture_set"] += [cs] * n
        cols["file"] += [file] * n
        cols["vbucket"] += [s.vbucket] * n
        cols["frame"] += frame
        cols["ts"] += ts
        cols["name"] += map(names.__getitem__, opcode)
        cols["seqno"] += seqno
        cols["snapshot"] += snapshot
    return pd.DataFrame({**cols, "ts": _ts(cols["ts"]), "seqno": pd.array(cols["seqno"], dtype=_U64)})


def _flow(t: Timeline, where: dict[int | None, tuple[int, str]]) -> pd.DataFrame:
    if not t.flow:
        return _df([], ["conn", "capture_set", "file", "frame", "outstanding"])
    conn, frame, ts, outstanding, event, size = zip(*t.flow, strict=True)
    placed = {c: where.get(c, (1, "")) for c in set(conn)}
    return pd.DataFrame(
        {
            "conn": conn,
            "capture_set": pd.array([placed[c][0] for c in conn], dtype="int64"),
            "file": [placed[c][1] for c in conn],
            "frame": frame,
            "ts": _ts(list(ts)),
            "outstanding": outstanding,
            "event": event,
            "size": size,
        }
    )


def timeline_frames(t: Timeline, *, items: bool = True) -> dict[str, pd.DataFrame]:
    """The timeline's DataFrames (uint64 seqnos and UUIDs as nullable ``UInt64``); ``items=False`` leaves out items and flow.

    Every table has the ``capture_set`` and ``file`` of its rows' connection
    (the failover table: of the logs that showed the branch, and its ``history``).
    """
    where = _where(t)
    tables = {
        "connections": _connections(t),
        "streams": _placed(_streams(t), where),
        "attempts": _placed(_attempts(t), where),
        "snapshots": _placed(_snapshots(t), where),
        "items": _items([(i, s) for i, s in enumerate(t.streams) if s.items], where) if items else None,
        "failover": _failover(t),
        "rollbacks": _placed(_rollbacks(t), where),
        "flow": _flow(t, where) if items else None,
        "noops": _placed(_nullable(_df(t.noops, ["conn", "frame", "reply_frame", "rtt_ns"]), "rtt_ns"), where),
        "stalls": _placed(_nullable(_df(t.stalls, ["conn", "frame", "ack_frame", "duration_ns"]), "duration_ns"), where),
        "anomalies": _placed(_anomalies(t), where),
    }
    return {k: v for k, v in tables.items() if v is not None}


def _connections(t: Timeline) -> pd.DataFrame:
    rows = [
        {
            "conn": c.conn,
            "capture_set": c.capture_set,
            "file": c.file,
            "label": c.label,
            "name": c.name,
            "side": c.side,
            "open_flags": c.open_flags,
            "features": ", ".join(c.features),
            "controls": "; ".join(f"{k}={v} ({st})" for k, (v, st) in c.controls.items()),
            "buffer_size": c.buffer_size,
            "noop_interval": c.noop_interval,
            "sasl_mechanism": c.sasl_mechanism,
            "sasl_user": c.sasl_user,
            "bucket": c.bucket,
            "bytes_lost": c.lost,
        }
        for c in t.connections.values()
    ]
    return _df(rows, list(rows[0]) if rows else ["conn", "capture_set", "file"])


def _streams(t: Timeline) -> pd.DataFrame:
    rows = [
        {
            "stream": i,
            "conn": s.conn,
            "vbucket": s.vbucket,
            "stream_id": s.stream_id,
            "segment": s.segment,
            "attempts": len(s.attempts),
            "snapshots": len(s.snapshots),
            "items": len(s.items),
            "last_seqno": s.last_seqno,
            "end_status": None if s.end is None else s.end["name"],
            "end_frame": None if s.end is None else s.end["frame"],
            "anomalies": len(s.anomalies),
        }
        for i, s in enumerate(t.streams)
    ]
    return _df(rows, list(rows[0]) if rows else ["stream"], ("last_seqno",))


_ATTEMPT_SEQNOS = ("start", "end", "uuid", "snap_start", "snap_end", "rollback_seqno", "predicted_rollback")


def _attempts(t: Timeline) -> pd.DataFrame:
    rows = []
    for i, s in enumerate(t.streams):
        for a in s.attempts:
            row = {"stream": i, "conn": s.conn, "vbucket": s.vbucket, "stream_id": s.stream_id, **a.as_dict()}
            row["failover_log"] = [tuple(e) for e in row["failover_log"]]
            row["response_frame"] = a.response_frame
            row["status_name"] = a.status_name
            row["predicted_rollback"] = a.predicted
            row["filter"] = _request_value(a.value)
            rows.append(row)
    return _df(rows, list(rows[0]) if rows else ["stream", *_ATTEMPT_SEQNOS], _ATTEMPT_SEQNOS if rows else ())


def _request_value(value: Any) -> str | None:
    """A stream request's JSON value as text (its collections/scope filter, sid, purge_seqno), None without one."""
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _rollbacks(t: Timeline) -> pd.DataFrame:
    rows = [
        {
            "stream": i,
            "conn": s.conn,
            "vbucket": s.vbucket,
            "frame": a.frame,
            "response_frame": a.response_frame,
            "uuid": a.uuid,
            "start": a.start,
            "snap_start": a.snap_start,
            "snap_end": a.snap_end,
            "rollback_seqno": a.rollback_seqno,
            "predicted": a.predicted,
            "explanation": a.explanation,
        }
        for i, s in enumerate(t.streams)
        for a in s.attempts
        if a.outcome == "rollback"
    ]
    seqnos = ("uuid", "start", "snap_start", "snap_end", "rollback_seqno", "predicted")
    return _df(rows, list(rows[0]) if rows else ["stream"], seqnos if rows else ())


def _snapshots(t: Timeline) -> pd.DataFrame:
    rows = [
        {
            "stream": i,
            "snapshot": k,
            "conn": s.conn,
            "vbucket": s.vbucket,
            "frame": sn.frame,
            "start": sn.start,
            "end": sn.end,
            "flags": sn.flags,
            "type": _snap_type(sn.flags),
            "version": sn.version,
            "max_visible": sn.max_visible,
            "high_completed": sn.high_completed,
            "purge_seqno": sn.purge_seqno,
            "high_prepared": sn.high_prepared,
            "items": sn.items,
            "first_seqno": sn.first_seqno,
            "last_seqno": sn.last_seqno,
            "complete": sn.complete,
        }
        for i, s in enumerate(t.streams)
        for k, sn in enumerate(s.snapshots)
    ]
    seqnos = ("start", "end", "max_visible", "high_completed", "purge_seqno", "high_prepared", "first_seqno", "last_seqno")
    return _df(rows, list(rows[0]) if rows else ["stream"], seqnos if rows else ())


def _failover(t: Timeline) -> pd.DataFrame:
    where = _where(t)
    rows = [
        {
            "capture_set": b.capture_set,
            "file": where.get(b.conn, (1, ""))[1],  # of the connection whose log first showed it
            "vbucket": vb,
            "history": b.history,
            "branch": b.order,
            "uuid": b.uuid,
            "seqno": b.seqno,
            "first_frame": b.first_frame,
            "cut_frame": b.cut_frame,
            "cut_by": b.cut_by,
        }
        for vb, branches in t.branches.items()
        for b in branches
    ]
    return _df(rows, list(rows[0]) if rows else ["capture_set", "file", "vbucket", "history", "uuid", "seqno"], ("uuid", "seqno", "cut_by"))


def _anomalies(t: Timeline) -> pd.DataFrame:
    rows = [
        {
            "kind": str(a.kind),
            "conn": a.conn,
            "vbucket": a.vbucket,
            "stream_id": a.stream_id,
            "frames": a.frames,
            "first_frame": a.frames[0] if a.frames else None,
            "count": a.count,
            "uncertain": a.uncertain,
            "message": a.message,
        }
        for a in t.anomalies
    ]
    return _df(rows, list(rows[0]) if rows else ["kind", "frames", "message"])


def _snap_type(flags: int) -> str:
    names = [name for bit, name in spec.SNAPSHOT_FLAGS.items() if flags & bit]
    return "|".join(names) if names else "none"


def _seq(v: int | None) -> str:
    return "-" if v is None else ("max" if v == MAX_SEQNO else str(v))


def story(t: Timeline, *, vbucket: int | None = None, conn: int | None = None, losses: pd.DataFrame | None = None) -> str:
    """The timeline as text: per connection what was negotiated, per stream what happened.

    ``losses`` (:func:`~dcpinspect.tables.history.rollback_losses` of the same read) adds under each rollback what it cost.
    """
    costs = _costs(losses)
    out: list[str] = []
    files = {c.file for c in t.connections.values()}
    sets = _sets(t)
    for c in t.connections.values():
        if conn is not None and c.conn != conn:
            continue
        bits = [f"conn {c.conn} {c.label}"]
        if len(files) > 1 or len(sets) > 1:
            bits[0] += f" ({'capture set ' + str(c.capture_set) + ', ' if len(sets) > 1 else ''}{c.file})"
        if c.name:
            bits.append(f"DCP_OPEN {c.name!r} ({c.side}, flags 0x{c.open_flags or 0:x})")
        if c.features:
            bits.append("HELLO " + ", ".join(c.features))
        if c.buffer_size is not None:
            bits.append(f"buffer {c.buffer_size}")
        if c.noop_interval is not None:
            bits.append(f"noop every {c.noop_interval:g}s")
        if c.sasl_user:
            bits.append(f"SASL {c.sasl_mechanism} as {c.sasl_user}")
        if c.lost:
            bits.append(f"{c.lost} bytes lost to capture gaps")
        out.append(" | ".join(bits))
    for s in t.streams:
        if (vbucket is not None and s.vbucket != vbucket) or (conn is not None and s.conn != conn):
            continue
        out.append("")
        out.append(_stream_story(s, costs))
    out.extend(_branch_story(t, vbucket, conn))
    loose = [a for a in t.anomalies if a.vbucket is None and (conn is None or a.conn == conn)]
    if loose and vbucket is None:
        out.append("")
        out.append("connection anomalies:")
        out.extend(
            f"  [{a.kind}] {a.message} (frames {_frames(a.frames)}){' (uncertain: bytes lost)' if a.uncertain else ''}" for a in loose
        )
    return "\n".join(out).strip() + "\n"


def _sets(t: Timeline) -> set[int]:
    return {c.capture_set for c in t.connections.values()} | {b.capture_set for bs in t.branches.values() for b in bs}


def _branch_story(t: Timeline, vbucket: int | None, conn: int | None) -> list[str]:
    """The failover branch tree of each vbucket, per capture set and history (each named only where there is more than one).

    With ``conn``, only the histories that connection showed or asked for (a
    log of it, or a uuid of its requests and logs).
    """
    histories = t.histories()
    sets = _sets(t)
    per_vb: dict[tuple[int, int], int] = {}
    for cs, vb, _h in histories:
        per_vb[(cs, vb)] = per_vb.get((cs, vb), 0) + 1
    seen: set[tuple[int, int]] = set()  # (vbucket, uuid) the connection asked for or was told
    if conn is not None:
        for s in t.streams:
            if s.conn == conn:
                seen.update((s.vbucket, u) for a in s.attempts for u in [a.uuid, *(e[0] for e in a.failover_log)])
    out: list[str] = []
    for (cs, vb, h), branches in histories.items():
        if vbucket is not None and vb != vbucket:
            continue
        if conn is not None and not any(b.conn == conn or (vb, b.uuid) in seen for b in branches):
            continue
        where = f"vbucket {vb}" + (f", capture set {cs}" if len(sets) > 1 else "") + (f", history {h}" if per_vb[(cs, vb)] > 1 else "")
        out += ["", f"{where} failover branches (oldest first):"]
        out += [_branch_line(b) for b in sorted(branches, key=lambda b: (b.seqno, b.order))]
    return out


def _branch_line(b: Branch) -> str:
    cut = f"  cut at frame {b.cut_frame}" + (f" by {hex_uuid(b.cut_by)}" if b.cut_by is not None else "") if b.cut_frame else ""
    return f"  uuid {hex_uuid(b.uuid)} from seqno {b.seqno} (first seen frame {b.first_frame}){cut}"


def _frames(frames: list[int]) -> str:
    return ", ".join(map(str, frames[:8])) + (", ..." if len(frames) > 8 else "")


def _costs(losses: pd.DataFrame | None) -> dict[tuple[int, int], str]:
    """(conn, request frame) -> the line saying what that rollback cost (from ``rollback_losses``)."""
    if losses is None or not len(losses):
        return {}
    out = {}
    for r in losses.to_dict("records"):
        keys = ", ".join(r["keys"][:8]) + (", ..." if len(r["keys"]) > 8 else "")
        out[(int(r["conn"]), int(r["frame"]))] = (
            f"the rollback cost {plural(int(r['items']), 'item')} above seqno {r['rollback_seqno']}"
            + (f" (keys: {keys}; {r['redelivered']} re-delivered, {r['possibly_lost']} possibly lost)" if r["items"] else "")
        )
    return out


def _stream_story(s: Stream, costs: dict[tuple[int, int], str] | None = None) -> str:
    head = (
        f"stream conn {s.conn} vbucket {s.vbucket}"
        + (f" sid {s.stream_id}" if s.stream_id is not None else "")
        + (f" (segment {s.segment})" if s.segment else "")
    )
    lines = [head]
    for a in s.attempts:
        req = f"  frame {a.frame}: STREAM_REQ start {_seq(a.start)} end {_seq(a.end)} uuid {hex_uuid(a.uuid)} snapshot {_seq(a.snap_start)}-{_seq(a.snap_end)}"
        if a.outcome == "success":
            log = ", ".join(f"{hex_uuid(u)}@{q}" for u, q in a.failover_log)
            req += f" -> success (frame {a.response_frame}), failover log [{log}]"
        elif a.outcome == "rollback":
            req += f" -> ROLLBACK to {_seq(a.rollback_seqno)} (frame {a.response_frame})"
            if a.explanation:
                req += f"\n      why: {a.explanation}"
            if (s.conn, a.frame) in (costs or {}):
                req += f"\n      cost: {(costs or {})[(s.conn, a.frame)]}"
        elif a.outcome == "error":
            req += f" -> {a.status_name} (frame {a.response_frame})"
        else:
            req += " -> no response seen"
        lines.append(req)
    if not s.attempts:
        lines.append("  (stream request not captured)")
    for sn in s.snapshots[:50]:
        lines.append(
            f"  frame {sn.frame}: snapshot {sn.start}-{sn.end} {_snap_type(sn.flags)} {sn.version}: {plural(sn.items, 'item')}"
            + (f" {sn.first_seqno}..{sn.last_seqno}" if sn.items else "")
            + ("" if sn.complete else " (incomplete)")
        )
    if len(s.snapshots) > 50:
        lines.append(f"  ... {len(s.snapshots) - 50} more snapshots")
    lines.append(f"  {plural(len(s.items), 'item')}, last seqno {_seq(s.last_seqno)}")
    if s.end is not None:
        lines.append(f"  frame {s.end['frame']}: STREAM_END {s.end['name']} ({s.end['status']})")
    for an in s.anomalies:
        rep = f" x{an.count}" if an.count > 1 else ""
        lines.append(f"  ! [{an.kind}{rep}] {an.message} (frames {_frames(an.frames)}){' (uncertain: bytes lost)' if an.uncertain else ''}")
    return "\n".join(lines)
