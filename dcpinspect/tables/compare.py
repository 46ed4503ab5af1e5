"""Two consumers compared: what each received per vbucket, where their histories diverge, and why one has what the other has not.

A consumer is a frames table and the timeline's tables
(:func:`~dcpinspect.tables.timeline.timeline_frames`) of its connections: one
capture, or connections of one capture picked by :func:`select_consumer`
(a connection number or a DCP_OPEN name).  :func:`compare_consumers` is a
pure function of those tables (it runs on a single-process read and on
``analyze``'s parquet tables alike); :func:`compare` reads captures and
picks the consumers.

Rules:

1. An item is what the items table lists but a SEQNO_ADVANCED (that only
   moves a stream on); its key and collection come from the frames table
   (joined on ``frame``).  On a connection whose start was not captured
   (no HELLO, no DCP_OPEN: whether collections were negotiated is unknown)
   a key's first character below 0x20 is taken as its collection id (a
   one-byte LEB128 prefix).  Two consumers' items are the same item when
   vbucket, seqno, key and collection agree.  A consumer "received" an item
   when any of its connections did; it "holds" it unless every copy it
   received was dropped by a rollback of the vbucket that came later and
   went below the item's seqno (the rollbacks table).
2. An item only one consumer received, or one holds and the other dropped,
   is explained from the other consumer's frames, first rule that fits:
   ``rollback`` (the consumer that lacks it, or the one that has it, dropped
   it in a rollback), ``branch`` (the other got a different item at that
   seqno, or its failover log diverges below it), ``start`` (the other's
   stream started at or after it: a resume point, or a capture that starts
   mid-stream), ``filter`` (the other's stream request filtered the item's
   collection out: :func:`~dcpinspect.tables.history.stream_filters`, from
   the attempts table's ``filter``, the request's JSON value), ``ended`` (the other's stream ended, was cut
   at its end seqno or its connection closed below it), ``dedup`` (a
   snapshot of the other covered the seqno and it got the same key later:
   deduplicated), else ``unknown`` (not explained by the captured frames).
   Runs of items with the same reason (no common item between them) are one row of
   :attr:`Comparison.table`, with the frames that show it, each consumer's
   own (``evidence_a``, ``evidence_b``: frame numbers of the read each came from).
3. A vbucket's history per consumer is the failover log of its latest
   successful stream request (pairs, or the ``{uuid, seqno}`` structs of
   ``analyze``'s parquet tables); the histories diverge at the first entry
   (oldest first) that differs: the smaller seqno of the two entries (0 when
   they share no entry).  The branches each saw are every entry of every log.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..protocol.enums import Opcode
from ..protocol.spec import COMMANDS
from ..timeline import MAX_SEQNO
from ..timeline.rollback import hex_uuid
from ..wire.render import plural
from .fields import COMPARE_COLUMNS
from .history import stream_filters

__all__ = [
    "COMPARISON_COLUMNS",
    "PER_VBUCKET_COLUMNS",
    "REASONS",
    "Comparison",
    "Consumer",
    "UnreadableCapture",
    "compare",
    "compare_consumers",
    "comparison_records",
    "comparison_text",
    "consumer_conns",
    "consumer_from_records",
    "consumer_names",
    "default_pair",
    "describe_consumer",
    "read_consumer",
    "select_consumer",
]

#: (frames table, timeline tables) of one consumer
Consumer = tuple[pd.DataFrame, Mapping[str, pd.DataFrame]]

#: the reasons a difference is given, in the order they are tried
REASONS = ("rollback", "branch", "start", "filter", "ended", "dedup", "unknown")
#: the columns of :attr:`Comparison.table` and :attr:`Comparison.per_vbucket` (declared, with their meanings, in :mod:`.fields`)
COMPARISON_COLUMNS = tuple(c[0] for c in COMPARE_COLUMNS["comparison"])
PER_VBUCKET_COLUMNS = tuple(c[0] for c in COMPARE_COLUMNS["comparison_vbuckets"])
_ADVANCED = COMMANDS[Opcode.DCP_SEQNO_ADVANCED].name
_SIDES = ("a", "b")


class UnreadableCapture(ValueError):
    """A capture file that could not be read (its message names the file)."""


@dataclass
class Comparison:
    """What :func:`compare_consumers` found: one row per (vbucket, difference), counts per vbucket, and the story."""

    table: pd.DataFrame
    per_vbucket: pd.DataFrame
    story: str
    names: dict[str, str] = field(default_factory=dict)  # 'a'/'b' -> how the consumer was picked, for texts
    items: pd.DataFrame | None = None  # side ('a'/'b'), vbucket, seqno, key, cid, frame, dropped (what the plot draws)


# ---------------------------------------------------------------------------
# picking a consumer


def consumer_names(tables: Mapping[str, pd.DataFrame]) -> list[tuple[int, str]]:
    """(conn, DCP_OPEN name) of every connection of the connections table that opened DCP, in connection order."""
    conns = tables.get("connections")
    if conns is None or conns.empty or "name" not in conns.columns:
        return []
    named = conns[conns["name"].fillna("") != ""]
    return [(int(c), str(n)) for c, n in zip(named["conn"], named["name"], strict=True)]


def consumer_conns(tables: Mapping[str, pd.DataFrame], selector: int | str | None) -> list[int] | None:
    """The connections ``selector`` names (None: all); ``ValueError`` naming what there is when it names none."""
    if selector is None:
        return None
    conns = tables.get("connections")
    known = [] if conns is None else [int(c) for c in conns["conn"]]
    if isinstance(selector, int) or (isinstance(selector, str) and selector.isdigit()):
        if int(selector) in known:
            return [int(selector)]
        raise ValueError(f"no connection {selector} (connections: {', '.join(map(str, known)) or 'none'})")
    picked = [c for c, n in consumer_names(tables) if n == selector]
    if not picked:
        names = sorted({n for _c, n in consumer_names(tables)})
        raise ValueError(f"no consumer named {selector!r} (DCP_OPEN names: {', '.join(map(repr, names)) or 'none'})")
    return picked


def select_consumer(frames: pd.DataFrame, tables: Mapping[str, pd.DataFrame], selector: int | str | None) -> Consumer:
    """The rows of the consumer ``selector`` names: a connection number, or every connection that opened DCP with that name (None: all)."""
    conns = consumer_conns(tables, selector)
    if conns is None:
        return frames, tables
    picked = {name: df[df["conn"].isin(conns)] if "conn" in df.columns else df for name, df in tables.items()}
    return frames[frames["conn_id"].isin(conns)], picked


# ---------------------------------------------------------------------------
# one consumer's view


@dataclass
class _View:
    """One consumer's items, streams and histories, per vbucket."""

    items: pd.DataFrame  # vbucket, seqno, key, cid, name, frame, dropped_by, uuid
    attempts: pd.DataFrame
    snapshots: pd.DataFrame
    streams: pd.DataFrame
    rollbacks: pd.DataFrame
    advanced: pd.DataFrame
    last_frame: dict[int, int]
    filters: pd.DataFrame = field(
        default_factory=pd.DataFrame
    )  # each stream request's filter (:func:`~dcpinspect.tables.history.stream_filters`)
    _parts: dict[str, dict[int, pd.DataFrame]] = field(default_factory=dict)

    def part(self, name: str, vb: int) -> pd.DataFrame:
        """The rows of table ``name`` (items, attempts, snapshots, streams, rollbacks, advanced) of vbucket ``vb``, grouped once."""
        df: pd.DataFrame = getattr(self, name)
        if name not in self._parts:
            self._parts[name] = {int(k): g for k, g in df.groupby("vbucket", sort=False)} if len(df) else {}
        return self._parts[name].get(vb, df.iloc[0:0])


def _table(tables: Mapping[str, pd.DataFrame], name: str, columns: Sequence[str]) -> pd.DataFrame:
    df = tables.get(name)
    if df is None or df.empty:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in columns})
    return df


def _view(frames: pd.DataFrame, tables: Mapping[str, pd.DataFrame]) -> _View:
    items = _table(tables, "items", ("stream", "conn", "vbucket", "frame", "name", "seqno"))
    attempts = _table(tables, "attempts", ("stream", "conn", "vbucket", "frame", "start", "end", "outcome", "failover_log"))
    rollbacks = _table(tables, "rollbacks", ("stream", "conn", "vbucket", "frame", "response_frame", "rollback_seqno"))
    advanced = items[items["name"] == _ADVANCED]
    items = items[items["name"] != _ADVANCED]
    cols = [c for c in ("frame", "key", "cid") if c in frames.columns]
    joined = items[["stream", "conn", "vbucket", "frame", "name", "seqno"]].merge(frames[cols], on="frame", how="left")
    for c in ("key", "cid"):
        if c not in joined.columns:
            joined[c] = None
    joined["key"] = joined["key"].astype("object").where(joined["key"].notna(), "")
    joined["cid"] = pd.array([None if pd.isna(v) else int(v) for v in joined["cid"]], dtype="Int64")
    _split_unseen_cids(joined, _unseen_starts(tables))
    joined["seqno"] = joined["seqno"].astype("UInt64")
    joined["dropped_by"] = _dropped_by(joined, rollbacks)
    joined["uuid"] = _item_uuids(joined, attempts)
    last_frame = {} if frames.empty else {int(c): int(f) for c, f in frames.groupby("conn_id")["frame"].max().items() if pd.notna(c)}
    return _View(
        joined.sort_values(["vbucket", "seqno", "frame"], kind="stable").reset_index(drop=True),
        attempts,
        _table(tables, "snapshots", ("stream", "conn", "vbucket", "frame", "start", "end")),
        _table(tables, "streams", ("stream", "conn", "vbucket", "last_seqno", "end_status", "end_frame")),
        rollbacks,
        advanced,
        last_frame,
        stream_filters(tables),
    )


def _unseen_starts(tables: Mapping[str, pd.DataFrame]) -> set[int]:
    """Connections whose start was not captured: no HELLO features and no DCP_OPEN name (whether collections were negotiated is unknown)."""
    conns = tables.get("connections")
    if conns is None or conns.empty or not {"name", "features"} <= set(conns.columns):
        return set()
    unseen = (conns["name"].fillna("") == "") & (conns["features"].fillna("") == "")
    return {int(c) for c in conns.loc[unseen, "conn"]}


def _split_unseen_cids(items: pd.DataFrame, conns: set[int]) -> None:
    """Rule 1's keys of connections whose start was not captured: a first character below 0x20 is taken as a one-byte collection id."""
    if not conns:
        return
    keys, cids = list(items["key"]), list(items["cid"])
    for i, (conn, key, cid) in enumerate(zip(items["conn"], keys, cids, strict=True)):
        if int(conn) in conns and pd.isna(cid) and key and ord(key[0]) < 0x20:
            keys[i], cids[i] = key[1:], ord(key[0])
    items["key"] = keys
    items["cid"] = pd.array(cids, dtype="Int64")


def _dropped_by(items: pd.DataFrame, rollbacks: pd.DataFrame) -> list[int | None]:
    """Per item: the response frame of the first later rollback of its vbucket that went below its seqno (rule 1)."""
    out: list[int | None] = [None] * len(items)
    if rollbacks.empty or items.empty:
        return out
    by_vb: dict[int, list[tuple[int, int]]] = {}
    for vb, fr, seq in zip(rollbacks["vbucket"], rollbacks["response_frame"], rollbacks["rollback_seqno"], strict=True):
        if pd.notna(fr) and pd.notna(seq):
            by_vb.setdefault(int(vb), []).append((int(fr), int(seq)))
    for i, (vb, fr, seq) in enumerate(zip(items["vbucket"], items["frame"], items["seqno"], strict=True)):
        for rfr, rseq in sorted(by_vb.get(int(vb), ())):
            if rfr > fr and int(seq) > rseq:
                out[i] = rfr
                break
    return out


def _entries(log: Any) -> list[tuple[int, int]]:
    """A failover log cell, newest first, as (uuid, seqno) pairs: pairs (single-process tables) or ``{uuid, seqno}`` structs (Spark's parquet)."""
    if log is None or (not hasattr(log, "__len__") and pd.isna(log)):
        return []
    out = []
    for e in log:
        u, s = (e["uuid"], e["seqno"]) if isinstance(e, Mapping) else (e[0], e[1])
        out.append((int(u), int(s)))
    return out


def _newest_uuid(log: Any) -> int | None:
    entries = _entries(log)
    return entries[0][0] if entries else None


def _item_uuids(items: pd.DataFrame, attempts: pd.DataFrame) -> list[int | None]:
    """Per item: the branch (newest failover-log uuid) of its stream's latest successful request before it."""
    ok = attempts[attempts["outcome"] == "success"] if "outcome" in attempts.columns else attempts.iloc[0:0]
    per_stream: dict[int, list[tuple[int, int | None]]] = {}
    for s, fr, log in zip(ok["stream"], ok["frame"], ok["failover_log"], strict=True):
        per_stream.setdefault(int(s), []).append((int(fr), _newest_uuid(log)))
    ordered = {k: sorted(v) for k, v in per_stream.items()}
    starts = {k: [f for f, _u in v] for k, v in ordered.items()}
    out: list[int | None] = []
    for s, fr in zip(items["stream"], items["frame"], strict=True):
        at = bisect_left(starts.get(int(s), []), int(fr))
        out.append(ordered[int(s)][at - 1][1] if at else None)
    return out


def _log(attempts: pd.DataFrame, vb: int) -> list[tuple[int, int]]:
    """The failover log (oldest first) of the vbucket's latest successful request."""
    ok = attempts[(attempts["vbucket"] == vb) & (attempts["outcome"] == "success")].sort_values("frame")
    if ok.empty:
        return []
    return list(reversed(_entries(ok["failover_log"].iloc[-1])))


def _branches(attempts: pd.DataFrame, vb: int) -> list[tuple[int, int]]:
    ok = attempts[(attempts["vbucket"] == vb) & (attempts["outcome"] == "success")]
    return sorted({e for log in ok["failover_log"] for e in _entries(log)}, key=lambda e: (e[1], e[0]))


def _divergence(log_a: list[tuple[int, int]], log_b: list[tuple[int, int]]) -> tuple[int | None, str]:
    """Rule 3: the seqno the histories diverge at (None: they agree, or a log is missing) and the entries that differ."""
    if not log_a or not log_b or log_a == log_b:
        return None, ""
    if log_a[0] != log_b[0] and not set(log_a) & set(log_b):
        return 0, f"the logs share no entry: a's newest is {_entry(log_a[-1])}, b's {_entry(log_b[-1])}"
    for i in range(max(len(log_a), len(log_b))):
        ea = log_a[i] if i < len(log_a) else None
        eb = log_b[i] if i < len(log_b) else None
        if ea != eb:
            seqno = min(e[1] for e in (ea, eb) if e is not None)
            return seqno, f"{_side_entry('a', ea)}, {_side_entry('b', eb)}"
    return None, ""


def _side_entry(side: str, e: tuple[int, int] | None) -> str:
    return f"{side}'s log has no later entry" if e is None else f"{side}'s has {_entry(e)}"


def _entry(e: tuple[int, int] | None) -> str:
    return "no entry" if e is None else f"{hex_uuid(e[0])}@{e[1]}"


# ---------------------------------------------------------------------------
# why one consumer lacks an item


@dataclass
class _Why:
    reason: str
    text: str
    ev_have: tuple[int, ...] = ()  # frames of the consumer that has the item
    ev_lack: tuple[int, ...] = ()  # frames of the consumer that lacks it
    summary: str = ""  # the text of a run of such items, when ``text`` names this item's own frames and seqnos


class _Lacking:
    """Explains, for items one consumer has, why the other (``lack``) has not (rule 2)."""

    def __init__(self, vb: int, lack: _View, lack_side: str, have: _View, diverge_at: int | None, why_diverge: str) -> None:
        self.side, self.other = lack_side, "b" if lack_side == "a" else "a"
        self.vb = vb
        self.items = lack.part("items", vb)
        self.have_items = have.part("items", vb)
        self.attempts = lack.part("attempts", vb).sort_values("frame")
        self.ok = self.attempts[self.attempts["outcome"] == "success"]
        self.log = _log(lack.part("attempts", vb), vb)
        self.filters = lack.filters
        self.snapshots = lack.part("snapshots", vb)
        self.streams = lack.part("streams", vb)
        self.rollbacks = lack.part("rollbacks", vb)
        self.have_rollbacks = have.part("rollbacks", vb)
        adv = lack.part("advanced", vb)
        self.last_frame = lack.last_frame
        self.diverge_at, self.why_diverge = diverge_at, why_diverge
        self.by_seqno: dict[int, list[tuple[str, int | None, int, int | None]]] = {}
        for s, k, c, f, d in zip(
            self.items["seqno"], self.items["key"], self.items["cid"], self.items["frame"], self.items["dropped_by"], strict=True
        ):
            self.by_seqno.setdefault(int(s), []).append((k, None if pd.isna(c) else int(c), int(f), None if pd.isna(d) else int(d)))
        self.by_key: dict[tuple[str, int | None], list[tuple[int, int]]] = {}
        for s, k, c, f in zip(self.items["seqno"], self.items["key"], self.items["cid"], self.items["frame"], strict=True):
            if k:
                self.by_key.setdefault((k, None if pd.isna(c) else int(c)), []).append((int(s), int(f)))
        seqnos = [int(s) for s in self.items["seqno"]] + [int(s) for s in adv["seqno"]]
        ends = [int(e) for e in self.snapshots["end"] if pd.notna(e)]
        self.covered = max(seqnos + ends, default=None)
        self.first_item = min((int(s) for s in self.items["seqno"]), default=None)

    def explain(self, seqno: int, key: str, cid: int | None, frame: int, dropped_by: int | None, uuid: int | None = None) -> _Why:
        """Why the ``lack`` side has not the item of the other at ``seqno`` (the first reason of rule 2 that fits)."""
        dropped = self._rollback(seqno, key, cid, frame, dropped_by, uuid)
        if dropped is not None:
            return dropped
        for rule in (self._branch, self._start, self._filter, self._ended, self._dedup):
            why = rule(seqno, key, cid, frame, dropped_by)
            if why is not None:
                return why
        return self._unknown(seqno, frame)

    def _replaced(self, seqno: int, uuid: int | None) -> str:
        """`` (received on branch U, which the other's history replaced at seqno S by V)`` as far as its failover log shows."""
        if uuid is None:
            return ""
        newer = [(u, s) for u, s in self.log if u != uuid and s < seqno]
        if not newer:
            return f" (received on branch {hex_uuid(uuid)})"
        u, s = newer[-1]
        return f" (received on branch {hex_uuid(uuid)}, which {self.side}'s history replaced at seqno {s} by {hex_uuid(u)})"

    def _rollback(self, seqno: int, key: str, cid: int | None, frame: int, dropped_by: int | None, uuid: int | None = None) -> _Why | None:
        if dropped_by is not None:  # the side that has it dropped it: it is on an abandoned branch
            rb = self.have_rollbacks[self.have_rollbacks["response_frame"] == dropped_by]
            to = int(rb["rollback_seqno"].iloc[0]) if not rb.empty else None
            text = f"{self.other} received it, then rolled back to {to} (frame {dropped_by}) and dropped it; {self.side} never had it"
            many = text.replace(" it", " them")
            return _Why("rollback", text + self._replaced(seqno, uuid), (frame, dropped_by), (), many + self._replaced(seqno, uuid))
        for k, c, f, d in self.by_seqno.get(seqno, ()):
            if (k, c) == (key, cid) and d is not None:
                rb = self.rollbacks[self.rollbacks["response_frame"] == d]
                to = int(rb["rollback_seqno"].iloc[0]) if not rb.empty else None
                return _Why(
                    "rollback",
                    f"{self.side} received it (frame {f}), then rolled back to {to} (frame {d}) and dropped it",
                    (frame,),
                    (f, d),
                    f"{self.side} received them, then rolled back to {to} (frame {d}) and dropped them",
                )
        return None

    def _branch(self, seqno: int, key: str, cid: int | None, frame: int, dropped_by: int | None) -> _Why | None:
        others = [(k, c, f) for k, c, f, _d in self.by_seqno.get(seqno, ()) if (k, c) != (key, cid)]
        if others:
            k, _c, f = others[0]
            if self.diverge_at is None or seqno <= self.diverge_at:
                return _Why(
                    "branch",
                    f"{self.side} got another item at this seqno ({k or 'no key'!r}, frame {f}): a different branch",
                    (frame,),
                    (f,),
                    f"{self.side} got other items at these seqnos: a different branch",
                )
        if self.diverge_at is not None and seqno > self.diverge_at and self.covered is not None and self.covered >= seqno:
            ev = tuple(int(f) for f in self.ok["response_frame"].tail(1) if pd.notna(f))
            ev += tuple(f for _k, _c, f in others[:1])
            return _Why("branch", f"the histories diverge at seqno {self.diverge_at} ({self.why_diverge})", (frame,), ev)
        return None

    def _start(self, seqno: int, key: str, cid: int | None, frame: int, dropped_by: int | None) -> _Why | None:
        if self.ok.empty:
            if self.first_item is not None and self.first_item > seqno:
                return _Why(
                    "start", f"{self.side}'s capture starts mid-stream: no stream request, first item seqno {self.first_item}", (frame,)
                )
            if self.attempts.empty and self.first_item is None:
                return _Why("start", f"{self.side} never streamed this vbucket", (frame,))
            return None
        starts = [(int(s), int(f)) for s, f in zip(self.ok["start"], self.ok["frame"], strict=True)]
        lo, fr = min(starts)
        if lo >= seqno:
            what = "from 0" if lo == 0 else f"at seqno {lo} (a resume point)"
            return _Why("start", f"{self.side}'s stream started {what} (frame {fr}), at or after this seqno", (frame,), (fr,))
        return None

    def _filter(self, seqno: int, key: str, cid: int | None, frame: int, dropped_by: int | None) -> _Why | None:
        for fr, flt in self._filters():
            if flt is None:
                continue
            text, cids = flt
            if cids is None or cid is None or cid not in cids:
                what = f"collection 0x{cid:x}" if cid is not None else "a system event"
                return _Why("filter", f"{self.side}'s stream request filtered on {text} ({what} filtered out)", (frame,), (fr,))
        return None

    def _filters(self) -> list[tuple[int, tuple[str, set[int] | None] | None]]:
        """(request frame, its filter) of each successful request, from :func:`~dcpinspect.tables.history.stream_filters`."""
        frames = [int(f) for f in self.ok["frame"]]
        f = self.filters
        by_frame = {int(fr): (c, sc) for fr, c, sc in zip(f["frame"], f["collections"], f["scope"], strict=True)}
        out: list[tuple[int, tuple[str, set[int] | None] | None]] = []
        for fr in frames:
            cols, scope = by_frame.get(fr, (None, None))
            if cols is not None and not (isinstance(cols, float) and pd.isna(cols)):
                ids = {int(c) for c in cols}
                out.append((fr, ("collections " + ", ".join(f"0x{c:x}" for c in sorted(ids)), ids)))
            elif isinstance(scope, str):
                out.append((fr, (f"scope 0x{scope}", None)))
            else:
                out.append((fr, None))
        return out

    def _ended(self, seqno: int, key: str, cid: int | None, frame: int, dropped_by: int | None) -> _Why | None:
        if self.covered is not None and self.covered >= seqno:
            return None
        last = self.streams.sort_values("stream").tail(1)
        upto = f"reached seqno {self.covered}" if self.covered is not None else "received nothing"
        if not last.empty and pd.notna(last["end_status"].iloc[0]):
            fr = int(last["end_frame"].iloc[0])
            return _Why("ended", f"{self.side}'s stream {upto} and ended {last['end_status'].iloc[0]} (frame {fr})", (frame,), (fr,))
        ends = [(int(e), int(f)) for e, f in zip(self.ok["end"], self.ok["frame"], strict=True) if pd.notna(e) and int(e) != MAX_SEQNO]
        if ends and max(ends)[0] < seqno:
            e, fr = max(ends)
            return _Why("ended", f"{self.side}'s stream request asked to end at seqno {e} (frame {fr})", (frame,), (fr,))
        conns = [int(c) for c in self.streams["conn"]]
        closed = max((self.last_frame[c] for c in conns if c in self.last_frame), default=None)
        if closed is not None:
            return _Why(
                "ended",
                f"{self.side}'s stream {upto} with no stream end: its connection's last frame is {closed} (closed, or the capture stops there)",
                (frame,),
                (closed,),
            )
        return None

    def _dedup(self, seqno: int, key: str, cid: int | None, frame: int, dropped_by: int | None) -> _Why | None:
        later = [(s, f) for s, f in self.by_key.get((key, cid), ()) if s > seqno] if key else []
        if not later:
            return None
        s2, f2 = later[0]
        snap = self.snapshots[(self.snapshots["start"] <= seqno) & (self.snapshots["end"] >= seqno)]
        ev = tuple(int(f) for f in snap["frame"].head(1))
        where = f"snapshot {int(snap['start'].iloc[0])}-{int(snap['end'].iloc[0])} (frame {ev[0]})" if ev else "its stream"
        return _Why(
            "dedup",
            f"{self.side} got {key!r} only at seqno {s2} (frame {f2}): {where} deduplicated it",
            (frame,),
            (*ev, f2),
            f"{self.side} got these keys only at later seqnos: {where} deduplicated them",
        )

    def _unknown(self, seqno: int, frame: int) -> _Why:
        snap = self.snapshots[(self.snapshots["start"] <= seqno) & (self.snapshots["end"] >= seqno)]
        if not snap.empty:
            s = snap.iloc[0]
            return _Why(
                "unknown",
                f"not explained by the captured frames: {self.side}'s snapshot {int(s['start'])}-{int(s['end'])} (frame {int(s['frame'])}) "
                "covered the seqno without it (a dropped collection or a purged tombstone would do that)",
                (frame,),
                (int(s["frame"]),),
            )
        return _Why("unknown", "not explained by the captured frames", (frame,))


# ---------------------------------------------------------------------------
# the comparison


def _identity(items: pd.DataFrame) -> dict[tuple[int, str, int | None], tuple[int, int | None, int | None]]:
    """(seqno, key, cid) -> (first frame, dropped_by: None when any copy is held, the branch it was received on)."""
    out: dict[tuple[int, str, int | None], tuple[int, int | None, int | None]] = {}
    for s, k, c, f, d, u in zip(
        items["seqno"], items["key"], items["cid"], items["frame"], items["dropped_by"], items["uuid"], strict=True
    ):
        ident = (int(s), str(k), None if pd.isna(c) else int(c))
        dropped = None if pd.isna(d) else int(d)
        uuid = None if u is None or pd.isna(u) else int(u)
        if ident not in out:
            out[ident] = (int(f), dropped, uuid)
        elif dropped is None:
            out[ident] = (out[ident][0], None, out[ident][2])
    return out


def _rows_for(vb: int, side: str, found: list[tuple[tuple[int, str, int | None], _Why]], common: list[int]) -> list[dict[str, Any]]:
    """Runs of items with the same reason and text, and no item both have at a seqno between them -> rows (rule 2)."""
    rows: list[dict[str, Any]] = []
    for (seqno, key, _cid), why in found:
        last = rows[-1] if rows else None
        text = why.summary or why.text
        if (
            last is not None
            and last["reason"] == why.reason
            and last["_text"] == text
            and bisect_left(common, seqno) <= bisect_right(common, last["seqno_to"])
        ):
            last["seqno_to"] = seqno
            last["items"] += 1
            if key:
                last["keys"].append(key)
            last["explanation"] = text
            last["_have"] |= set(why.ev_have)
            last["_lack"] |= set(why.ev_lack)
            continue
        rows.append(
            {
                "vbucket": vb,
                "only_in": side,
                "seqno_from": seqno,
                "seqno_to": seqno,
                "items": 1,
                "keys": [key] if key else [],
                "reason": why.reason,
                "explanation": why.text,
                "_text": text,
                "_have": set(why.ev_have),
                "_lack": set(why.ev_lack),
            }
        )
    for r in rows:
        have, lack = sorted(r.pop("_have")), sorted(r.pop("_lack"))
        r.pop("_text")
        r["evidence_a"], r["evidence_b"] = (have, lack) if side == "a" else (lack, have)
    return rows


def compare_consumers(a: Consumer, b: Consumer, *, vbucket: int | None = None, names: Mapping[str, str] | None = None) -> Comparison:
    """Compare consumer ``a`` with consumer ``b`` (each its frames table and timeline tables): see the module's rules."""
    va, vb_ = _view(*a), _view(*b)
    vbuckets = sorted({int(v) for v in va.items["vbucket"]} | {int(v) for v in vb_.items["vbucket"]} | _requested(va) | _requested(vb_))
    if vbucket is not None:
        vbuckets = [v for v in vbuckets if v == vbucket]
    rows: list[dict[str, Any]] = []
    counts: list[dict[str, Any]] = []
    for vb in vbuckets:
        ia = _identity(va.part("items", vb))
        ib = _identity(vb_.part("items", vb))
        log_a, log_b = _log(va.part("attempts", vb), vb), _log(vb_.part("attempts", vb), vb)
        at, why_div = _divergence(log_a, log_b)
        for side, have, lack, hv, lv in (("a", ia, ib, va, vb_), ("b", ib, ia, vb_, va)):
            explain = _Lacking(vb, lv, "b" if side == "a" else "a", hv, at, why_div)
            found = []
            for ident in sorted(have, key=lambda i: (i[0], i[1], -1 if i[2] is None else i[2])):
                frame, dropped, uuid = have[ident]
                if ident in lack:
                    if dropped is None and lack[ident][1] is not None:  # held here, dropped there
                        found.append((ident, explain.explain(ident[0], ident[1], ident[2], frame, None)))
                    continue
                found.append((ident, explain.explain(ident[0], ident[1], ident[2], frame, dropped, uuid)))
            rows += _rows_for(vb, side, found, sorted(i[0] for i in ia.keys() & ib.keys()))
        common = len(ia.keys() & ib.keys())
        counts.append(
            {
                "vbucket": vb,
                "items_a": len(ia),
                "items_b": len(ib),
                "common": common,
                "only_a": sum(r["items"] for r in rows if r["vbucket"] == vb and r["only_in"] == "a"),
                "only_b": sum(r["items"] for r in rows if r["vbucket"] == vb and r["only_in"] == "b"),
                "last_a": max((k[0] for k in ia), default=None),
                "last_b": max((k[0] for k in ib), default=None),
                "diverge_at": at,
                "branches_a": ", ".join(_entry(e) for e in _branches(va.part("attempts", vb), vb)),
                "branches_b": ", ".join(_entry(e) for e in _branches(vb_.part("attempts", vb), vb)),
                "_why_diverge": why_div,
            }
        )
    table = pd.DataFrame(rows, columns=list(COMPARISON_COLUMNS))
    for c in ("seqno_from", "seqno_to"):
        table[c] = table[c].astype("UInt64")
    per_vb = pd.DataFrame([{k: v for k, v in c.items() if not k.startswith("_")} for c in counts], columns=list(PER_VBUCKET_COLUMNS))
    for c in ("last_a", "last_b", "diverge_at"):
        per_vb[c] = pd.array([None if v is None or pd.isna(v) else int(v) for v in per_vb[c]], dtype="UInt64")
    named = dict(names or {"a": "a", "b": "b"})
    return Comparison(table, per_vb, _story(table, counts, named), named, _both_items(va, vb_, vbuckets))


def _both_items(va: _View, vb_: _View, vbuckets: list[int]) -> pd.DataFrame:
    """Both consumers' items of ``vbuckets``: side, vbucket, seqno, key, cid, frame, dropped (what the plot draws)."""
    cols = ["side", "vbucket", "seqno", "key", "cid", "frame", "dropped"]
    parts = [
        v.items[v.items["vbucket"].isin(vbuckets)].assign(side=side, dropped=lambda d: d["dropped_by"].notna())[cols]
        for side, v in (("a", va), ("b", vb_))
    ]
    parts = [p for p in parts if len(p)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame({c: pd.Series(dtype="object") for c in cols})


def _requested(v: _View) -> set[int]:
    return {int(x) for x in v.attempts["vbucket"]} if "vbucket" in v.attempts.columns else set()


def _keys_text(keys: list[str], n: int = 4) -> str:
    shown = ", ".join(keys[:n])
    return shown + (f", ... ({len(keys) - n} more)" if len(keys) > n else "")


def _story(table: pd.DataFrame, counts: list[dict[str, Any]], names: Mapping[str, str]) -> str:
    """The comparison as a few lines per vbucket."""
    out = [f"a: {names.get('a', 'a')}", f"b: {names.get('b', 'b')}"]
    if not counts:
        out.append("no vbucket was streamed by either consumer")
    for c in counts:
        vb = c["vbucket"]
        head = (
            f"vbucket {vb}: a {plural(c['items_a'], 'item')}, b {plural(c['items_b'], 'item')}, {c['common']} in common; "
            f"{c['only_a']} only in a, {c['only_b']} only in b"
        )
        if c["diverge_at"] is not None:
            head += f"; histories diverge at seqno {c['diverge_at']} ({c['_why_diverge']})"
        out += ["", head]
        if not c["only_a"] and not c["only_b"]:
            out.append("  the same items")
        for r in table[table["vbucket"] == vb].itertuples():
            span = f"seqno {r.seqno_from}" if r.seqno_from == r.seqno_to else f"seqnos {r.seqno_from}-{r.seqno_to}"
            keys = f": {_keys_text(list(r.keys))}" if len(r.keys) else ""
            out.append(f"  only in {r.only_in}: {span} ({plural(int(r.items), 'item')}{keys}) - {r.reason}: {r.explanation}")
    return "\n".join(out) + "\n"


def _plain(v: Any) -> Any:
    """A cell as JSON takes it: lists item by item, nulls as None, numpy scalars as Python's."""
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if v is None or (not isinstance(v, (str, bytes)) and pd.isna(v)):
        return None
    return v.item() if hasattr(v, "item") else v


def comparison_records(c: Comparison) -> list[dict[str, Any]]:
    """``dcpinspect compare --json``'s objects: ``{"consumers"}``, one ``{"vbucket", "per_vbucket"}`` per vbucket, one ``{"difference"}`` per row."""
    out: list[dict[str, Any]] = [{"consumers": dict(c.names)}]
    for row in c.per_vbucket.to_dict("records"):
        out.append({"vbucket": _plain(row["vbucket"]), "per_vbucket": {str(k): _plain(v) for k, v in row.items()}})
    out += [{"difference": {str(k): _plain(v) for k, v in row.items()}} for row in c.table.to_dict("records")]
    return out


def _cut(values: list[Any], n: int) -> str:
    return ", ".join(map(str, values[:n])) + (f", ... ({len(values) - n} more)" if len(values) > n else "")


def comparison_text(c: Comparison, escape: Callable[[str], str]) -> str:
    """The story, then the per-vbucket counts and the differences as tables (keys and frames shortened), text escaped by ``escape``."""
    from .stats import text_table

    diffs = c.table.drop(columns=["explanation"]).assign(
        keys=[_cut(list(k), 3) for k in c.table["keys"]],
        evidence_a=[_cut(list(e), 6) for e in c.table["evidence_a"]],
        evidence_b=[_cut(list(e), 6) for e in c.table["evidence_b"]],
    )
    story = "".join(escape(line) + "\n" for line in c.story.splitlines())
    return story + "\n== per vbucket\n" + text_table(c.per_vbucket, escape) + "\n\n== differences\n" + text_table(diffs, escape) + "\n"


# ---------------------------------------------------------------------------
# reading captures


def read_consumer(source: str | Path | Iterable[str | Path], **options: Any) -> Consumer:
    """The frames table and the timeline's tables of capture files, in one read.

    ``options`` go to :func:`~dcpinspect.tables.columnar.read_parts` (``server_ports``, ``detect``); a file that
    cannot be read raises :class:`UnreadableCapture` (a ``ValueError``) naming it.
    """
    from ..capture.sets import file_sets, planned
    from ..flows.records import CaptureStats
    from ..timeline import TimelineBuilder
    from .columnar import read_parts
    from .export import pandas_dtype
    from .timeline import timeline_frames
    from .timeline_feed import feed_parts

    paths = [str(source)] if isinstance(source, (str, Path)) else [str(p) for p in source]
    plan = planned(paths, "auto")
    stats = CaptureStats()
    batches: list[Any] = []

    def kept(parts: Iterable[Any]) -> Iterable[Any]:
        for part in parts:
            batches.append(part.batch.select(["frame", "conn_id", "key", "cid"]))
            yield part

    t = feed_parts(kept(read_parts(paths, stats=stats, capture_sets=plan, **options)), TimelineBuilder(file_sets(plan))).timeline()
    t.set_first = dict(stats.set_first)
    import pyarrow as pa

    frames = (
        pa.Table.from_batches(batches).to_pandas(types_mapper=pandas_dtype)
        if batches
        else pd.DataFrame(columns=["frame", "conn_id", "key", "cid"])
    )
    for path, info in stats.files.items():
        if info["error"]:
            raise UnreadableCapture(info["error"] if str(info["error"]).startswith(f"{path}: ") else f"{path}: {info['error']}")
    return frames, timeline_frames(t)


def consumer_from_records(records: Iterable[Any]) -> Consumer:
    """The frames table and the timeline's tables of records: a live client's, a proxy's, or a reader's."""
    from ..timeline import build_timeline
    from .export import frames_df
    from .timeline import timeline_frames

    recs = list(records)
    t = build_timeline(recs)
    return frames_df(recs), timeline_frames(t)


def describe_consumer(source: str, tables: Mapping[str, pd.DataFrame], selector: int | str | None) -> str:
    """How a comparison names a consumer: its DCP_OPEN name or connections, and the source it was read from."""
    conns = consumer_conns(tables, selector)
    named = dict(consumer_names(tables))
    picked = conns if conns is not None else [int(c) for c in tables["connections"]["conn"]] if "connections" in tables else []
    bits = [f"conn {c}" + (f" ({named[c]!r})" if c in named else "") for c in picked]
    return f"{source} " + (", ".join(bits) if bits else "(no connection)")


def default_pair(tables: Mapping[str, pd.DataFrame]) -> tuple[str, str]:
    """The two consumers of one capture when none is named: its two DCP_OPEN names; ``ValueError`` when there are not exactly two."""
    names = list(dict.fromkeys(n for _c, n in consumer_names(tables)))
    if len(names) != 2:
        listed = ", ".join(f"conn {c} {n!r}" for c, n in consumer_names(tables)) or "none"
        raise ValueError(f"one capture with {plural(len(names), 'consumer name')}: name the two to compare (consumers: {listed})")
    return names[0], names[1]


def compare(
    source_a: str | Path | Iterable[Any],
    source_b: str | Path | Iterable[Any] | None = None,
    *,
    conn_a: int | None = None,
    conn_b: int | None = None,
    consumer_a: str | None = None,
    consumer_b: str | None = None,
    vbucket: int | None = None,
    **options: Any,
) -> Comparison:
    """Compare two consumers: of two captures (all their connections unless picked), or two of one capture.

    ``conn_a``/``conn_b`` pick a connection, ``consumer_a``/``consumer_b`` the
    connections that opened DCP with that name.  With one capture and nothing
    picked, its two DCP_OPEN names are compared.  A selector that names nothing
    raises ``ValueError``.  A source is capture paths (``options`` go to
    :func:`read_consumer`) or records, e.g. a live client's ``LiveCapture.records``.
    """
    first = _consumer_of(source_a, **options)
    same = source_b is None or source_b is source_a or (isinstance(source_b, (str, Path)) and str(source_b) == str(source_a))
    second = first if same else _consumer_of(source_b, **options)
    sel_a: int | str | None = conn_a if conn_a is not None else consumer_a
    sel_b: int | str | None = conn_b if conn_b is not None else consumer_b
    if source_b is None and sel_a is None and sel_b is None:
        sel_a, sel_b = default_pair(first[1])
    elif source_b is None and (sel_a is None or sel_b is None):
        raise ValueError("one capture: pick both consumers (a connection or a DCP_OPEN name each)")
    a = select_consumer(*first, sel_a)
    b = select_consumer(*second, sel_b)
    names = {
        "a": describe_consumer(_label(source_a), first[1], sel_a),
        "b": describe_consumer(_label(source_b if source_b is not None else source_a), second[1], sel_b),
    }
    return compare_consumers(a, b, vbucket=vbucket, names=names)


def _paths(source: Any) -> list[str] | None:
    """``source`` as capture paths, or None when it is records."""
    if isinstance(source, (str, Path)):
        return [str(source)]
    if isinstance(source, (list, tuple)) and all(isinstance(p, (str, Path)) for p in source):
        return [str(p) for p in source]
    return None


def _consumer_of(source: Any, **options: Any) -> Consumer:
    paths = _paths(source)
    return read_consumer(paths, **options) if paths is not None else consumer_from_records(source)


def _label(source: Any) -> str:
    paths = _paths(source)
    return ", ".join(paths) if paths is not None else "records"
