"""A document's history and what each rollback cost, as pure functions of the frames table and the timeline's tables.

Theory of operation: the timeline's ``items`` table says which stream and
snapshot every item belongs to; the frames table (joined on ``frame``, a
frame number being global within a read) gives its key, collection id, CAS
and rev seqno.  :func:`key_versions` lists every item (a version of a
document) with its snapshot and its *fate*, found by replaying, per
consumer, what it received and every rollback it was told; :func:`key_history`
is the rows of one key; :func:`rollback_losses` (one row per rollback) and
:func:`rollback_lost_keys` (one row per rollback and document) say what each
rollback cost.  The same functions run on a single-process read
(:func:`read_tables`) and on ``analyze``'s parquet tables.

Rules:

1. A *document* is (collection id, key): the frames table splits the
   collection id out of the key wherever HELLO Collections was negotiated, so
   ``k1`` in collection 8 and ``k1`` in ``_default`` are two documents.  A
   connection without collections streams the default collection only: its
   keys count as collection 0.
2. *The same consumer* is (capture set, DCP_OPEN name, vbucket, stream id):
   a failover moves a consumer to a new connection, usually to another node,
   under the same name, and what it received on the old connection is what it
   holds when the new one rolls it back.  A connection whose DCP_OPEN was not
   captured is a consumer of its own (``conn N``).  Items received before any
   captured stream request (a capture that starts mid-stream) count as
   received.
3. A version's fate, replaying the consumer's items and rollbacks in frame
   order (a rollback takes effect at its response): ``superseded in
   snapshot`` (a later item of the document in the same snapshot: with
   ``dedup_violation`` true unless the marker allows duplicates, History or
   MayContainDuplicates, or the two are in different key spaces, a prepare and
   a committed item), ``superseded`` (a later item of the document with
   another seqno, in a later snapshot or stream), ``re-delivered`` (the same
   seqno received again, e.g. after a stream was re-requested from lower),
   ``rolled back`` (a rollback to a seqno below it while the consumer held it:
   the version it held before becomes current again), ``current`` (what the
   consumer holds at the end of the capture).  ``fate_frame``/``fate_seqno``
   name the item or rollback that decided it.
4. A rollback's cost: every item the consumer had received above the
   rollback seqno and not already lost to an earlier rollback (all of them
   above 0 for a rollback to 0).  Each of their documents is ``redelivered``
   when a later item of it reached the same consumer after the rollback (a
   mutation or commit: ``new_seqno``, and ``same_version`` when its CAS is the
   lost version's), else ``possibly lost``: deleted or expired on the new
   branch, only a prepare or abort re-sent, or nothing re-sent before the
   capture ended (``reason`` says which).
5. A key never seen gets a reason (:func:`key_absence`): its collection
   filtered out by every stream request (:func:`stream_filters`, from the
   attempts table's ``filter``), a KV write of it on a vbucket no stream
   covered, or streams that ended before / started after that write.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..protocol.enums import Opcode, Status
from ..protocol.rules import DUPLICATES_ALLOWED, KEY_SPACES
from ..timeline import Timeline
from ..wire.render import plural

__all__ = [
    "COLUMNS",
    "FATES",
    "ITEM_KINDS",
    "KeyTables",
    "collection_ids",
    "doc_label",
    "frames_of",
    "item_batch",
    "key_absence",
    "key_history",
    "key_versions",
    "read_tables",
    "rollback_losses",
    "rollback_lost_keys",
    "stream_filters",
]

#: item command name -> its kind (what ``key_versions`` lists: the document-carrying items)
ITEM_KINDS: dict[str, str] = {
    Opcode.DCP_MUTATION.name: "mutation",
    Opcode.DCP_DELETION.name: "deletion",
    Opcode.DCP_EXPIRATION.name: "expiration",
    Opcode.DCP_PREPARE.name: "prepare",
    Opcode.DCP_COMMIT.name: "commit",
    Opcode.DCP_ABORT.name: "abort",
}
_SPACE = {Opcode(op).name: space for op, space in KEY_SPACES.items()}
_SYNC = frozenset((Opcode.DCP_PREPARE.name, Opcode.DCP_COMMIT.name, Opcode.DCP_ABORT.name))
_GONE = frozenset((Opcode.DCP_DELETION.name, Opcode.DCP_EXPIRATION.name))
_WRITES = frozenset((Opcode.DCP_MUTATION.name, Opcode.DCP_COMMIT.name))
#: the fates of a version (rule 3)
FATES = ("superseded in snapshot", "superseded", "re-delivered", "rolled back", "current")
_HLC_LOGICAL = 0xFFFF  # as dcpinspect.wire.render.hlc_text (kv_engine hlc.h): the low 16 bits count, the rest are ns
_HLC_FROM = 10**18  # a CAS below it is no time (a counter, a test's CAS)
_U64 = pd.UInt64Dtype()
_VERSION_COLUMNS = [
    "capture_set",
    "file",
    "conn",
    "consumer",
    "lineage",
    "stream",
    "vbucket",
    "stream_id",
    "frame",
    "ts",
    "name",
    "sync_write",
    "key",
    "cid",
    "seqno",
    "cas",
    "cas_time",
    "rev_seqno",
    "snapshot",
    "snap_type",
    "snap_start",
    "snap_end",
    "fate",
    "fate_frame",
    "fate_seqno",
    "dedup_violation",
]
_ROLLBACK_ID = [
    "capture_set",
    "file",
    "conn",
    "consumer",
    "stream",
    "vbucket",
    "stream_id",
    "frame",
    "response_frame",
    "uuid",
    "rollback_seqno",
]
_LOSS_COLUMNS = [*_ROLLBACK_ID, "items", "keys", "first_seqno", "last_seqno", "redelivered", "possibly_lost", "lost_keys"]
_LOST_KEY_COLUMNS = [
    *_ROLLBACK_ID,
    "key",
    "cid",
    "versions",
    "lost_seqno",
    "lost_cas",
    "lost_frame",
    "status",
    "new_seqno",
    "new_frame",
    "new_name",
    "same_version",
    "reason",
]
_FRAME_COLUMNS = ["frame", "key", "cid", "cas", "rev_seqno"]


def doc_label(key: str, cid: int | None) -> str:
    """A document as text: the key, and its collection when not the default one (``k1 (cid 0x8)``)."""
    return key if cid is None or pd.isna(cid) or not int(cid) else f"{key} (cid {int(cid):#x})"


def _consumers(tables: Mapping[str, pd.DataFrame]) -> dict[int, str]:
    """Connection -> its consumer name (the DCP_OPEN name; ``conn N`` when it was not captured)."""
    conns = tables["connections"]
    if not len(conns) or "name" not in conns.columns:
        return {}
    return {int(c): (n if isinstance(n, str) and n else f"conn {int(c)}") for c, n in zip(conns["conn"], conns["name"], strict=True)}


def _stream_ids(tables: Mapping[str, pd.DataFrame]) -> dict[int, int | None]:
    streams = tables["streams"]
    if not len(streams) or "stream_id" not in streams.columns:
        return {}
    return {int(s): (None if pd.isna(i) else int(i)) for s, i in zip(streams["stream"], streams["stream_id"], strict=True)}


def _cas_time(cas: pd.Series) -> pd.Series:
    """A CAS as its HLC time (UTC; NaT when it is none), as ``hlc_text`` reads it."""
    ns = [int(c) & ~_HLC_LOGICAL if not pd.isna(c) and int(c) >= _HLC_FROM else None for c in cas]
    return pd.Series(pd.to_datetime(pd.array(ns, dtype="Int64"), unit="ns", utc=True), index=cas.index)


def _frame_part(frames: pd.DataFrame, key: str | None, cid: int | None) -> pd.DataFrame:
    """The item frames' key columns (of ``key``, in collection ``cid``, when given)."""
    mask = frames["name"].isin(ITEM_KINDS)
    if key is not None:
        mask &= frames["key"] == key
    if cid is not None:
        mask &= frames["cid"].fillna(0) == cid
    part = frames.loc[mask.fillna(False).astype(bool), _FRAME_COLUMNS].copy()
    part["frame"] = part["frame"].astype("int64")
    return part


def _versions(frames: pd.DataFrame, tables: Mapping[str, pd.DataFrame], key: str | None = None, cid: int | None = None) -> pd.DataFrame:
    """Every item of a document (``key``: of that key only) with its stream, snapshot and consumer; no fate yet."""
    items = tables.get("items")
    if items is None or not len(items) or "name" not in items.columns:
        return pd.DataFrame(columns=_VERSION_COLUMNS)
    items = items[items["name"].isin(ITEM_KINDS)].copy()
    items["frame"] = items["frame"].astype("int64")
    rows = items.merge(_frame_part(frames, key, cid), on="frame", how="inner")
    if not len(rows):
        return pd.DataFrame(columns=_VERSION_COLUMNS)
    snaps = tables["snapshots"]
    if len(snaps) and "type" in snaps.columns:
        snaps = snaps[["stream", "snapshot", "type", "flags", "start", "end"]].rename(
            columns={"type": "snap_type", "flags": "snap_flags", "start": "snap_start", "end": "snap_end"}
        )
        rows = rows.merge(snaps, on=["stream", "snapshot"], how="left")
    else:
        rows = rows.assign(snap_type=None, snap_flags=None, snap_start=None, snap_end=None)
    consumers = _consumers(tables)
    sids = _stream_ids(tables)
    rows["consumer"] = [consumers.get(int(c), f"conn {int(c)}") for c in rows["conn"]]
    rows["lineage"] = rows["consumer"]
    rows["stream_id"] = pd.array([sids.get(int(s)) for s in rows["stream"]], dtype="Int64")
    rows["sync_write"] = rows["name"].isin(_SYNC)
    rows["cas_time"] = _cas_time(rows["cas"])
    rows["cid"] = rows["cid"].astype("UInt32")
    for col in ("seqno", "cas", "rev_seqno", "snap_start", "snap_end"):
        rows[col] = pd.array([None if pd.isna(v) else int(v) for v in rows[col]], dtype=_U64)
    rows = rows.sort_values("frame", kind="stable").reset_index(drop=True)
    rows["fate"] = None
    rows["fate_frame"] = pd.array([None] * len(rows), dtype="Int64")
    rows["fate_seqno"] = pd.array([None] * len(rows), dtype=_U64)
    rows["dedup_violation"] = False
    return rows


def _rollback_rows(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """The rollbacks table with each row's consumer and stream id."""
    rb = tables.get("rollbacks")
    if rb is None or not len(rb) or "rollback_seqno" not in rb.columns:
        return pd.DataFrame(columns=_ROLLBACK_ID)
    rb = rb.copy()
    consumers = _consumers(tables)
    sids = _stream_ids(tables)
    rb["consumer"] = [consumers.get(int(c), f"conn {int(c)}") for c in rb["conn"]]
    rb["stream_id"] = pd.array([sids.get(int(s)) for s in rb["stream"]], dtype="Int64")
    return rb[_ROLLBACK_ID].reset_index(drop=True)


def _who(capture_set: Any, consumer: Any, vbucket: Any, stream_id: Any) -> tuple[int, str, int, int]:
    """The consumer identity of rule 2 (stream id -1: none)."""
    return (int(capture_set), str(consumer), int(vbucket), -1 if pd.isna(stream_id) else int(stream_id))


@dataclass
class _Loss:
    """One rollback's replay result: the items it cut (row indices of the versions)."""

    rollback: int  # row of the rollbacks
    at: int  # the frame it took effect at
    items: list[int] = field(default_factory=list)


def _doc(v: pd.DataFrame, i: int) -> tuple[int, str]:
    cid = v.at[i, "cid"]
    return (0 if pd.isna(cid) else int(cid), str(v.at[i, "key"]))


class _Cols:
    """The columns the replay reads (Python lists) and the fate columns it writes."""

    def __init__(self, v: pd.DataFrame) -> None:
        def col(name: str) -> list[Any]:
            nulls = v[name].isna().tolist()
            return [None if n else x for x, n in zip(v[name].tolist(), nulls, strict=True)]

        self.seqno = [int(x) for x in v["seqno"].tolist()]
        self.frame = [int(x) for x in v["frame"].tolist()]
        self.stream, self.snapshot, self.name = v["stream"].tolist(), v["snapshot"].tolist(), v["name"].tolist()
        self.flags = col("snap_flags")
        cid = col("cid")
        self.doc = [(0 if c is None else int(c), str(k)) for c, k in zip(cid, v["key"].tolist(), strict=True)]
        self.fate: list[Any] = col("fate")
        self.fate_frame: list[Any] = col("fate_frame")
        self.fate_seqno: list[Any] = col("fate_seqno")
        self.dedup: list[bool] = [bool(x) for x in v["dedup_violation"].tolist()]

    def store(self, v: pd.DataFrame) -> None:
        v["fate"] = pd.array(self.fate, dtype=object)
        v["fate_frame"] = pd.array(self.fate_frame, dtype="Int64")
        v["fate_seqno"] = pd.array(self.fate_seqno, dtype=_U64)
        v["dedup_violation"] = self.dedup


def _replay(v: pd.DataFrame, rb: pd.DataFrame, tables: Mapping[str, pd.DataFrame], *, only_rollbacks: bool = False) -> list[_Loss]:
    """Rule 3 and 4: set each version's fate in ``v`` (in place) and return what each rollback cut.

    ``only_rollbacks``: replay only the consumers with a rollback (what the losses need; the others keep no fate).
    The replay runs on Python lists (:class:`_Cols`), never cell by cell on the frame.
    """
    events: dict[Any, list[tuple[int, int, int]]] = {}
    alias = _resumes(tables)
    cs, con, vb, sid = (v[c].tolist() for c in ("capture_set", "consumer", "vbucket", "stream_id"))
    sids = v["stream_id"].isna().tolist()
    frames = [int(x) for x in v["frame"].tolist()]
    lineage = []
    for i in range(len(v)):
        who = (int(cs[i]), str(con[i]), int(vb[i]), -1 if sids[i] else int(sid[i]))
        who = alias.get(who, who)
        events.setdefault(who, []).append((frames[i], 0, i))
        lineage.append(who[1])
    v["lineage"] = lineage
    losses: list[_Loss] = []
    for j in range(len(rb)):
        who = _who(rb.at[j, "capture_set"], rb.at[j, "consumer"], rb.at[j, "vbucket"], rb.at[j, "stream_id"])
        at = rb.at[j, "response_frame"]
        at = int(rb.at[j, "frame"]) if pd.isna(at) else int(at)
        losses.append(_Loss(j, at))
        events.setdefault(alias.get(who, who), []).append((at, 1, j))
    c = _Cols(v)
    backs = [None if pd.isna(x) else int(x) for x in rb["rollback_seqno"].tolist()] if len(rb) else []
    for evs in events.values():
        if only_rollbacks and not any(kind for _f, kind, _r in evs):
            continue
        _replay_one(c, backs, sorted(evs), losses)
    c.store(v)
    return losses


def _resumes(tables: Mapping[str, pd.DataFrame]) -> dict[Any, Any]:
    """Rule 2's resume: consumer -> the consumer whose history it continues (a resume state saved under another name).

    A consumer whose first stream request of the vbucket, with nothing received
    before it, asks (start S > 0, uuid U) exactly where another consumer of the
    capture set left the vbucket - its last item before that request at seqno
    S, on the branch U its last successful request was given - continues it.
    """
    att = tables.get("attempts")
    if att is None or not len(att) or "failover_log" not in att.columns:
        return {}
    consumers = _consumers(tables)
    sids = _stream_ids(tables)
    first: dict[Any, tuple[int, int, int]] = {}  # who -> (frame, start, uuid) of its first request
    tops: dict[Any, list[tuple[int, int]]] = {}  # who -> (response frame, newest uuid of the log) of its successes
    for r in att.to_dict("records"):
        who = _who(r["capture_set"], consumers.get(int(r["conn"]), f"conn {int(r['conn'])}"), r["vbucket"], sids.get(int(r["stream"])))
        if who not in first or int(r["frame"]) < first[who][0]:
            first[who] = (int(r["frame"]), 0 if pd.isna(r["start"]) else int(r["start"]), 0 if pd.isna(r["uuid"]) else int(r["uuid"]))
        if r["outcome"] == "success" and r["failover_log"] and not pd.isna(r["response_frame"]):
            tops.setdefault(who, []).append((int(r["response_frame"]), int(r["failover_log"][0][0])))
    received: dict[Any, list[tuple[int, int]]] = {}  # who -> (frame, seqno) of its items (every item: not only this key's)
    items = tables.get("items")
    if items is not None and len(items) and "seqno" in items.columns:
        pos = items[items["seqno"].notna()]
        for cs, conn, vb, stream, frame, seqno in zip(
            pos["capture_set"], pos["conn"], pos["vbucket"], pos["stream"], pos["frame"], pos["seqno"], strict=True
        ):
            who = _who(cs, consumers.get(int(conn), f"conn {int(conn)}"), vb, sids.get(int(stream)))
            received.setdefault(who, []).append((int(frame), int(seqno)))
    alias: dict[Any, Any] = {}
    for who, (frame, start, uuid) in sorted(first.items(), key=lambda kv: kv[1][0]):
        if start == 0 or any(f < frame for f, _ in received.get(who, [])):
            continue
        for other, got in received.items():
            if other == who or other[0] != who[0] or other[2] != who[2]:
                continue
            before = [(f, q) for f, q in got if f < frame]
            logs = [u for f, u in tops.get(other, []) if f < frame]
            if before and max(before)[1] == start and (not logs or logs[-1] == uuid):
                alias[who] = alias.get(other, other)
    return alias


def _replay_one(c: _Cols, backs: list[int | None], evs: list[tuple[int, int, int]], losses: list[_Loss]) -> None:
    held: dict[tuple[int, str], list[int]] = {}  # document -> the versions received, oldest first (the top one is held)
    live: list[int] = []  # versions received and not cut by a rollback
    q = c.seqno
    for frame, kind, row in evs:
        if kind == 0:
            _receive(c, held.setdefault(c.doc[row], []), row)
            live.append(row)
            continue
        to = backs[row]
        if to is None:
            continue
        losses[row].items = [i for i in live if q[i] > to]
        live = [i for i in live if q[i] <= to]
        for stack in held.values():
            if not stack or q[stack[-1]] <= to:
                continue
            top = stack[-1]
            c.fate[top], c.fate_frame[top], c.fate_seqno[top] = "rolled back", frame, to
            stack[:] = [i for i in stack if q[i] <= to]
            if stack:
                b = stack[-1]
                c.fate[b], c.fate_frame[b], c.fate_seqno[b] = None, None, None
                c.dedup[b] = False
    for stack in held.values():
        if stack:
            c.fate[stack[-1]] = "current"


def _receive(c: _Cols, stack: list[int], row: int) -> None:
    """A new item of a document: the version held before it gets its fate."""
    if stack:
        prev = stack[-1]
        seqno, before = c.seqno[row], c.seqno[prev]
        same_snapshot = c.stream[prev] == c.stream[row] and c.snapshot[prev] == c.snapshot[row]
        if same_snapshot and seqno != before:
            flags = c.flags[row]
            allowed = flags is not None and int(flags) & DUPLICATES_ALLOWED
            one_space = _SPACE.get(c.name[prev]) == _SPACE.get(c.name[row])
            c.fate[prev] = "superseded in snapshot"
            c.dedup[prev] = bool(one_space and not allowed and int(c.snapshot[row]) >= 0)
        else:
            c.fate[prev] = "re-delivered" if seqno == before else "superseded"
        c.fate_frame[prev], c.fate_seqno[prev] = c.frame[row], seqno
    stack.append(row)


def key_versions(
    frames: pd.DataFrame, tables: Mapping[str, pd.DataFrame], *, key: str | None = None, cid: int | None = None
) -> pd.DataFrame:
    """Every version of every document (``key``/``cid``: of those only) each consumer received, with its fate (rules 1-3).

    ``frames`` is the frames table (``frames_df``; at least ``frame``,
    ``name``, ``key``, ``cid``, ``cas``, ``rev_seqno``), ``tables`` the
    timeline's (``timeline_frames``: connections, streams, snapshots, items,
    rollbacks).  One row per item frame (mutation, deletion, expiration, and
    the sync writes prepare, commit, abort: ``sync_write``), in frame order.
    """
    v = _versions(frames, tables, key, cid)
    if len(v):
        _replay(v, _rollback_rows(tables), tables)
    return v[_VERSION_COLUMNS].reset_index(drop=True)


def rollback_losses(frames: pd.DataFrame, tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """What each rollback cost its consumer (rule 4): one row per row of the rollbacks table, in its order.

    ``items``: the items received above ``rollback_seqno`` on the branch
    abandoned (``uuid``, the one the request sent), ``keys`` their documents
    (text, :func:`doc_label`), ``first_seqno``/``last_seqno`` their range;
    ``redelivered`` and ``possibly_lost`` count the documents, ``lost_keys``
    names the possibly lost.  :func:`rollback_lost_keys` has one row per document.
    """
    per_key = _lost_keys(frames, tables)
    rb = _rollback_rows(tables)
    rows = []
    for j in range(len(rb)):
        mine = per_key[per_key["_rollback"] == j] if len(per_key) else per_key
        base = {c: rb.at[j, c] for c in _ROLLBACK_ID}
        lost = mine[mine["status"] == "possibly lost"] if len(mine) else mine
        seqnos = [int(s) for s in mine["_seqnos"].explode().dropna()] if len(mine) else []
        rows.append(
            {
                **base,
                "items": int(mine["versions"].sum()) if len(mine) else 0,
                "keys": [doc_label(k, c) for k, c in zip(mine["key"], mine["cid"], strict=True)] if len(mine) else [],
                "first_seqno": min(seqnos, default=None),
                "last_seqno": max(seqnos, default=None),
                "redelivered": int((mine["status"] == "redelivered").sum()) if len(mine) else 0,
                "possibly_lost": len(lost),
                "lost_keys": [doc_label(k, c) for k, c in zip(lost["key"], lost["cid"], strict=True)] if len(lost) else [],
            }
        )
    out = pd.DataFrame(rows, columns=_LOSS_COLUMNS)
    for col in ("uuid", "rollback_seqno", "first_seqno", "last_seqno"):
        out[col] = pd.array([None if v is None or pd.isna(v) else int(v) for v in out[col]], dtype=_U64)
    return out


def rollback_lost_keys(frames: pd.DataFrame, tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per (rollback, document) it cut (rule 4): the version lost, and whether the new branch re-delivered it.

    ``lost_seqno``/``lost_cas``/``lost_frame``: the last version cut
    (``versions``: how many items of it were); ``status``, ``new_*``,
    ``same_version`` and ``reason``: what came of it after the rollback.
    """
    return _lost_keys(frames, tables)[_LOST_KEY_COLUMNS].reset_index(drop=True)


def _lost_keys(frames: pd.DataFrame, tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """:func:`rollback_lost_keys` with the row of the rollback (``_rollback``) and the seqnos cut (``_seqnos``)."""
    v = _versions(frames, tables)
    rb = _rollback_rows(tables)
    if not len(v) or not len(rb):
        return pd.DataFrame(columns=[*_LOST_KEY_COLUMNS, "_rollback", "_seqnos"])
    losses = _replay(v, rb, tables, only_rollbacks=True)
    by_doc: dict[tuple[int, str], list[int]] = {}  # document -> its rows, in frame order
    for i in range(len(v)):
        by_doc.setdefault(_doc(v, i), []).append(i)
    rows = []
    for loss in losses:
        docs: dict[tuple[int, str], list[int]] = {}
        for i in loss.items:
            docs.setdefault(_doc(v, i), []).append(i)
        who = _who(
            rb.at[loss.rollback, "capture_set"],
            rb.at[loss.rollback, "consumer"],
            rb.at[loss.rollback, "vbucket"],
            rb.at[loss.rollback, "stream_id"],
        )
        for doc, rows_of in docs.items():
            last = rows_of[-1]
            rows.append(
                {
                    **{c: rb.at[loss.rollback, c] for c in _ROLLBACK_ID},
                    "key": doc[1],
                    "cid": v.at[last, "cid"],
                    "versions": len(rows_of),
                    "lost_seqno": int(v.at[last, "seqno"]),
                    "lost_cas": v.at[last, "cas"],
                    "lost_frame": int(v.at[last, "frame"]),
                    **_redelivery(v, by_doc[doc], who, loss.at, v.at[last, "cas"]),
                    "_rollback": loss.rollback,
                    "_seqnos": [int(v.at[i, "seqno"]) for i in rows_of],
                }
            )
    out = pd.DataFrame(rows, columns=[*_LOST_KEY_COLUMNS, "_rollback", "_seqnos"])
    for col in ("uuid", "rollback_seqno", "lost_seqno", "lost_cas", "new_seqno"):
        out[col] = pd.array([None if x is None or pd.isna(x) else int(x) for x in out[col]], dtype=_U64)
    out["new_frame"] = out["new_frame"].astype("Int64")
    return out


def _redelivery(v: pd.DataFrame, of_doc: list[int], who: tuple[int, str, int, int], after: int, cas: Any) -> dict[str, Any]:
    """The first item of the document (its rows ``of_doc``) the consumer ``who`` received after frame ``after``, and what it means (rule 4)."""
    for i in of_doc:
        if int(v.at[i, "frame"]) <= after:
            continue
        if _who(v.at[i, "capture_set"], v.at[i, "consumer"], v.at[i, "vbucket"], v.at[i, "stream_id"]) != who:
            continue
        name, seqno, frame = str(v.at[i, "name"]), int(v.at[i, "seqno"]), int(v.at[i, "frame"])
        new = {"new_seqno": seqno, "new_frame": frame, "new_name": name, "same_version": bool(v.at[i, "cas"] == cas)}
        if name in _WRITES:
            return {
                **new,
                "status": "redelivered",
                "reason": "re-sent at seqno " + str(seqno) + (" (same CAS)" if new["same_version"] else " (changed)"),
            }
        what = "deleted" if name == Opcode.DCP_DELETION.name else "expired" if name in _GONE else f"only a {ITEM_KINDS[name]} re-sent"
        return {**new, "status": "possibly lost", "reason": f"{what} on the new branch (seqno {seqno}, frame {frame})"}
    return {
        "new_seqno": None,
        "new_frame": None,
        "new_name": None,
        "same_version": False,
        "status": "possibly lost",
        "reason": "not re-sent before the capture ended",
    }


# --------------------------------------------------------------------------- filters, collections, absence


def stream_filters(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Each stream request's collections filter (what :func:`key_absence` reads): ``collections`` null = every collection.

    A ``filters`` table given in ``tables`` is used as is; otherwise it is read
    from the attempts table's ``filter`` (the request's JSON value:
    ``{"collections": ["8"]}``, ids in hex; ``{"scope": "8"}``: a scope, named
    in ``scope``).  A request without HELLO Collections streams the default
    collection only (``[0]``).
    """
    given = tables.get("filters")
    if given is not None:
        return given
    attempts = tables.get("attempts")
    columns = ["stream", "conn", "vbucket", "frame", "collections", "scope"]
    if attempts is None or "filter" not in attempts.columns:
        return pd.DataFrame(columns=columns)
    conns = tables.get("connections")
    legacy: set[int] = set()
    if conns is not None and "features" in conns.columns:
        legacy = {
            int(c) for c, f in zip(conns["conn"], conns["features"], strict=True) if isinstance(f, str) and f and "Collections" not in f
        }
    rows = []
    for stream, conn, vb, frame, value in zip(
        attempts["stream"], attempts["conn"], attempts["vbucket"], attempts["frame"], attempts["filter"], strict=True
    ):
        try:
            doc = json.loads(value) if isinstance(value, str) else None
        except ValueError:
            doc = None
        cols = doc.get("collections") if isinstance(doc, dict) else None
        ids = [int(str(x), 16) for x in cols if _hex(x)] if isinstance(cols, list) else None
        scope = doc.get("scope") if isinstance(doc, dict) else None
        rows.append(
            {
                "stream": int(stream),
                "conn": int(conn),
                "vbucket": int(vb),
                "frame": int(frame),
                "collections": [0] if int(conn) in legacy and ids is None else ids,
                "scope": None if scope is None else str(scope),
            }
        )
    return pd.DataFrame(rows, columns=columns)


def _hex(x: Any) -> bool:
    try:
        int(str(x), 16)
    except ValueError:
        return False
    return True


def collection_ids(records: Iterable[Any]) -> dict[str, int]:
    """Collection name -> id, from the BeginCollection system events among ``records`` (the one dissector reads them)."""
    from ..wire.dissect import dissect

    out: dict[str, int] = {"_default": 0}
    for r in records:
        ev = r.event
        if ev.type != "frame" or ev.opcode != Opcode.DCP_SYSTEM_EVENT:
            continue
        d = dissect(ev, r.context)
        cid = d.get("collection_id")
        if d.key and isinstance(cid, int):
            out.setdefault(d.key.decode("utf-8", "replace"), cid)
    return out


def key_absence(frames: pd.DataFrame, tables: Mapping[str, pd.DataFrame], key: str, *, collection: int | None = None) -> str:
    """Why ``key`` (in ``collection``) is on no stream: ``""`` when it was seen, else ``never seen on any stream`` and what is known (rule 5)."""
    if len(key_versions(frames, tables, key=key, cid=collection)):
        return ""
    streams = tables["streams"]
    if not len(streams) or "vbucket" not in streams.columns:
        return "never seen on any stream: the capture has no DCP stream"
    why = [
        f"{plural(len(streams), 'stream')} of vbucket{'s' if streams['vbucket'].nunique() != 1 else ''} "
        + ", ".join(str(int(x)) for x in sorted(streams["vbucket"].unique()))
    ]
    filters = stream_filters(tables)
    if collection is not None and len(filters):
        out = [c for c in filters["collections"] if c is not None and collection not in c]
        if len(out) == len(filters):
            why.append(f"collection {collection:#x} was filtered out by every stream request (filters {_filters_text(filters)})")
    why += _writes(frames, tables, key, collection)
    return "never seen on any stream (" + "; ".join(why) + ")"


def _filters_text(filters: pd.DataFrame) -> str:
    kept = sorted({tuple(c) for c in filters["collections"] if c is not None})
    return ", ".join("[" + ", ".join(f"{x:#x}" for x in c) + "]" for c in kept)


def _writes(frames: pd.DataFrame, tables: Mapping[str, pd.DataFrame], key: str, collection: int | None) -> list[str]:
    """What the capture's KV traffic says of the key: a successful write and whether a stream of its vbucket covered that time."""
    mask = (frames["key"] == key) & (frames["role"] == "request") & ~frames["name"].isin(ITEM_KINDS) & frames["vbucket"].notna()
    if collection is not None:
        mask &= frames["cid"].fillna(0) == collection
    kv = frames.loc[mask.fillna(False).astype(bool)]
    if not len(kv):
        return []
    first = kv.iloc[0]
    vb, frame = int(first["vbucket"]), int(first["frame"])
    out = [f"the capture has {first['name']} of it at frame {frame} on vbucket {vb}"]
    streams = tables["streams"]
    on = streams[streams["vbucket"] == vb]
    if not len(on):
        return [*out, f"no stream of vbucket {vb} was captured"]
    items = tables.get("items")
    spans = []
    if items is not None and len(items):
        mine = items[items["stream"].isin(on["stream"])]
        if len(mine):
            spans = [int(mine["frame"].min()), int(mine["frame"].max())]
    if spans and spans[1] < frame:
        out.append(f"the streams of vbucket {vb} received their last item at frame {spans[1]}, before it")
    elif spans and spans[0] > frame:
        out.append(f"the streams of vbucket {vb} received their first item at frame {spans[0]}, after it")
    statuses = frames.loc[(frames["role"] == "response") & (frames["opaque"] == first["opaque"]) & (frames["frame"] > frame), "status"]
    if len(statuses) and not pd.isna(statuses.iloc[0]) and int(statuses.iloc[0]) != Status.SUCCESS:
        out.append(f"that write failed (status {int(statuses.iloc[0]):#x})")
    return out


# --------------------------------------------------------------------------- one read, one key


@dataclass
class KeyTables:
    """The frames table (item and KV columns) and the timeline's tables of one read, and its timeline."""

    frames: pd.DataFrame
    tables: dict[str, pd.DataFrame]
    timeline: Timeline | None = None
    collections: dict[str, int] = field(default_factory=dict)


#: the frames columns these questions read
COLUMNS = ("frame", "name", "role", "vbucket", "status", "opaque", "key", "cid", "cas", "rev_seqno", "seqno")


def read_tables(source: str | Path | Iterable[Any], *, capture_sets: str = "auto", names: bool = False, **options: Any) -> KeyTables:
    """Read capture paths (once) or records: the frames table's :data:`COLUMNS` and the timeline's tables.

    ``names``: also read the collection names of the system events (records
    only: one more pass over them).  ``options`` are ``read_parts``'s.
    """
    from .timeline import timeline_frames

    if isinstance(source, (str, Path)):
        source = [source]
    items = list(source)
    collections: dict[str, int] = {"_default": 0}
    if items and not isinstance(items[0], (str, Path)):
        from ..timeline import build_timeline
        from .export import frames_table

        t = build_timeline(items)
        frames = frames_table(items).select(list(COLUMNS)).to_pandas(types_mapper=_pandas_dtype())
        if names:
            collections = collection_ids(items)
    else:
        from ..capture.sets import file_sets, planned
        from ..flows.records import CaptureStats
        from ..timeline import TimelineBuilder
        from .columnar import read_parts
        from .timeline_feed import feed_parts

        paths = [str(p) for p in items]
        plan = planned(paths, capture_sets)
        stats = CaptureStats()
        batches: list[Any] = []

        def keep(parts: Iterable[Any]) -> Iterable[Any]:
            for part in parts:
                batches.append(part.batch.select(list(COLUMNS)))
                if names:
                    collections.update({k: v for k, v in collection_ids(part.records()).items() if k not in collections})
                yield part

        builder = feed_parts(keep(read_parts(paths, stats=stats, capture_sets=plan, **options)), TimelineBuilder(file_sets(plan)))
        t = builder.timeline()
        t.set_first = dict(stats.set_first)
        frames = frames_of(batches)
    tables = timeline_frames(t)
    return KeyTables(frames, tables, t, collections)


def _pandas_dtype() -> Any:
    from .schema import pandas_dtype

    return pandas_dtype


def item_batch(batch: Any) -> Any:
    """A frames batch cut to what the losses need: the :data:`COLUMNS` of its item frames (DCP mutations, deletions ...) only."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kept = batch.select(list(COLUMNS))
    names = pc.cast(kept.column(COLUMNS.index("name")), pa.string())
    return kept.filter(pc.is_in(names, value_set=pa.array(list(ITEM_KINDS))))


def frames_of(batches: list[Any]) -> pd.DataFrame:
    """The kept batches as one pandas frame (nullable dtypes, uint64 exact)."""
    import pyarrow as pa

    if not batches:
        from .frames_vector import SCHEMA

        return pa.Table.from_batches([], schema=pa.schema([SCHEMA.field(c) for c in COLUMNS])).to_pandas(types_mapper=_pandas_dtype())
    return pa.Table.from_batches(batches).to_pandas(types_mapper=_pandas_dtype())


def key_history(
    source: str | Path | Iterable[Any] | None,
    key: str,
    *,
    collection: int | None = None,
    frames: pd.DataFrame | None = None,
    tables: Mapping[str, pd.DataFrame] | None = None,
) -> pd.DataFrame:
    """The versions of one key (:func:`key_versions` rows), from capture paths or records, or from ``frames`` and ``tables``.

    ``collection`` (an id) keeps one document; without it every collection's
    document of that key is listed (``cid`` tells them apart).  The result's
    ``attrs["absence"]`` is :func:`key_absence`'s reason when there is no row.
    """
    if frames is None or tables is None:
        if source is None:
            raise ValueError("key_history needs a source (capture paths or records) or frames= and tables=")
        read = read_tables(source)
        frames, tables = read.frames, read.tables
    out = key_versions(frames, tables, key=key, cid=collection)
    out.attrs["absence"] = "" if len(out) else key_absence(frames, tables, key, collection=collection)
    return out
