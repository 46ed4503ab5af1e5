"""Timelines built apart, one per connection, put back together as if one builder had seen everything (pure).

A bulk run (Spark) feeds each connection's records to a builder of its own,
numbering records with keys that sort like the global frame numbers, and ships
each connection's result as a :class:`ConnPart`.  :func:`merge_timelines`
rebuilds what crosses connections - the failover branch trees of each
vbucket's histories, within each capture set, and the rollback explanations - by replaying, in key order, only the records
that can change it (:attr:`ConnPart.control`), with the highest item seqno each
connection had seen before every rollback (:func:`highest_before`, from each
part's :attr:`ConnPart.history`); then it puts streams, anomalies, flow,
noops and stalls in the single-process order.  :meth:`Timeline.renumber`
turns keys into frame numbers afterwards.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Any

from ..flows.records import Record
from ..protocol.enums import Opcode, Status
from ..protocol.session import RESPONSE_MAGICS as _RESPONSES
from ..wire.events import Frame
from .builder import TimelineBuilder
from .model import Anomaly, AnomalyKind, ConnectionInfo, FlowSample, Item, Stream, Timeline

__all__ = ["ConnPart", "SeqnoRises", "highest_before", "merge_timelines", "record_from", "record_tuple", "thin"]

Rises = tuple[Sequence[int], Sequence[int]]  # (keys, seqnos) where a vbucket's highest item seqno rose, in key order
_STREAM_REQ, _ROLLBACK = int(Opcode.DCP_STREAM_REQ), int(Status.ROLLBACK)
_UNANSWERED = frozenset((AnomalyKind.REQUEST_NEVER_ANSWERED, AnomalyKind.NOOP_UNANSWERED))
_FIRST = itemgetter(0)
_NUMBER = attrgetter("number")


@dataclass
class ConnPart:
    """One connection's timeline as built apart (keys, not frame numbers; ``ck``, not the connection id)."""

    ck: int
    first: int  # key of its first record
    info: ConnectionInfo
    streams: list[tuple[int, Stream]]  # (key of the record that created it, Stream)
    runtime: list[tuple[int, Anomaly]]  # (key of the record that raised it, Anomaly)
    final: list[Anomaly]  # end-of-input anomalies, in the builder's order
    flow: list[FlowSample]
    noops: list[dict[str, Any]]
    stalls: list[dict[str, Any]]
    items: list[int]  # item count per stream, in the order of ``streams`` (items may be thinned)
    control: list[tuple[Any, ...]]  # records the merge replays (:func:`record_tuple`)
    history: dict[int, Any]  # vbucket -> where its highest item seqno rose: Rises, or an encoding of them
    item_columns: list[tuple[list[Any], ...]] | None = None  # per stream its items as columns (pickle far faster than Items)


def record_tuple(r: Record) -> tuple[Any, ...]:
    """A record whose event is a frame as a plain tuple (quick to pickle); :func:`record_from` reverses it."""
    ev: Any = r.event
    return (r.number, r.file, r.conn, r.conn_label, r.direction, r.ts, r.ts_first, r.packet, r.packet_first, tuple(ev), r.context)


def record_from(t: tuple[Any, ...]) -> Record:
    """The record of :func:`record_tuple`."""
    return Record(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], Frame(*t[9]), t[10])


def thin(xs: list[Any], n: int) -> list[Any]:
    """At most ``n`` evenly spaced elements of ``xs``, its last one included."""
    if len(xs) <= n:
        return xs
    step = len(xs) / n
    picked = [xs[int(i * step)] for i in range(n - 1)]
    return [*picked, xs[-1]]


class SeqnoRises:
    """Per vbucket, where the highest item seqno seen so far rose: ``(key, seqno)`` pairs, fed items batch by batch."""

    def __init__(self) -> None:
        self.best: dict[int, int] = {}  # vbucket -> highest item seqno so far
        self.rises: dict[int, tuple[list[int], list[int]]] = {}  # vbucket -> (keys, seqnos) where it rose

    def add(self, vb: int, batches: list[list[Item]]) -> None:
        """The next items of ``vb`` (later than any before), one list per stream, each in key order."""
        its: Iterable[Item] = batches[0] if len(batches) == 1 else sorted((it for x in batches for it in x), key=_FIRST)
        best = self.best.get(vb, -1)
        ks, qs = self.rises.setdefault(vb, ([], []))
        for it in its:
            q = it[3]
            if q is not None and q > best:
                best = q
                ks.append(it[0])
                qs.append(q)
        self.best[vb] = best

    @classmethod
    def of(cls, streams: Iterable[Stream]) -> SeqnoRises:
        """The rises of every item of ``streams``."""
        per_vb: dict[int, list[list[Item]]] = {}
        for s in streams:
            per_vb.setdefault(s.vbucket, []).append(s.items)
        out = cls()
        for vb, batches in per_vb.items():
            out.add(vb, batches)
        return out


def highest_before(
    parts: list[ConnPart], rollbacks: list[int], rises: Callable[[Any], Rises] | None = None
) -> tuple[dict[int, list[tuple[int, int, int]]], dict[tuple[int, int], int]]:
    """(rollback key -> [(vbucket, ck, highest seqno connection ck had seen before it)], (vbucket, ck) -> its highest at the end).

    Per connection, so that the replay counts each in its own capture set and
    history.  ``rises`` reads a part's :attr:`~ConnPart.history` entry (none:
    the entries are :data:`Rises` already).
    """
    at: dict[int, list[tuple[int, int, int]]] = {}
    end: dict[tuple[int, int], int] = {}
    for p in parts:
        for vb, entry in p.history.items():
            ks, qs = entry if rises is None else rises(entry)
            if not len(ks):
                continue
            end[(vb, p.ck)] = int(qs[-1])
            for t in rollbacks:
                i = bisect_left(ks, t)
                if i:
                    at.setdefault(t, []).append((vb, p.ck, int(qs[i - 1])))
    return {t: sorted(xs) for t, xs in sorted(at.items())}, end


def merge_timelines(
    parts: list[ConnPart],
    frames_of: Callable[[list[int]], list[int]] | None = None,
    rises: Callable[[Any], Rises] | None = None,
    capture_sets: Mapping[str, int] | None = None,
) -> tuple[Timeline, dict[int, int]]:
    """The single-process :class:`~dcpinspect.timeline.model.Timeline` (still in keys) from the per-connection parts.

    Returns the timeline and the true item count of each stream (by index;
    items may have been thinned).  :meth:`Timeline.renumber` then turns keys
    into frame numbers; with ``frames_of`` (many keys -> frame numbers) the
    items get theirs here, made once.  ``rises`` reads the parts' histories
    (see :func:`highest_before`).  ``capture_sets`` (file -> capture set)
    places each connection in the set of its first record's file
    (:attr:`ConnectionInfo.file`); without it each keeps the set its part was
    built with.
    """
    parts = sorted(parts, key=attrgetter("first"))
    for p in parts:
        if capture_sets is not None:
            p.info.capture_set = capture_sets.get(p.info.file, 1)
        _items_back(p, frames_of)
    rt = _replay(parts, rises)
    explained = {
        (s.conn, a.frame): (a.explanation, a.predicted, a.log_frame) for s in rt.streams for a in s.attempts if a.outcome == "rollback"
    }
    # the single-process order
    streams = [s for _, s in sorted(((k, s) for p in parts for k, s in p.streams), key=_FIRST)]
    for s in streams:
        for a in s.attempts:
            if a.outcome == "rollback" and (s.conn, a.frame) in explained:
                a.explanation, a.predicted, a.log_frame = explained[(s.conn, a.frame)]
    order = {id(s): i for i, s in enumerate(streams)}
    runtime = [a for _, a in sorted(((k, a) for p in parts for k, a in p.runtime), key=_FIRST)]
    unanswered = [a for p in parts for a in p.final if a.kind in _UNANSWERED]
    last_attempt: dict[tuple[int | None, int], int] = {(s.conn, s.attempts[-1].frame): order[id(s)] for s in streams if s.attempts}
    unended = sorted(
        (a for p in parts for a in p.final if a.kind == AnomalyKind.STREAM_NEVER_ENDED),
        key=lambda a: last_attempt.get((a.conn, a.frames[0]), 0),
    )
    rest = [a for p in parts for a in p.final if a.kind not in _UNANSWERED and a.kind != AnomalyKind.STREAM_NEVER_ENDED]
    flow = list(heapq.merge(*(p.flow for p in parts), key=attrgetter("frame")))
    noops = list(heapq.merge(*(p.noops for p in parts), key=itemgetter("reply_frame")))
    stalls = list(heapq.merge(*(p.stalls for p in parts), key=itemgetter("ack_frame")))
    anomalies = runtime + unanswered + unended + rest
    merged = Timeline(
        {p.ck: p.info for p in parts}, streams, rt.branches, rt.logs, flow, noops, anomalies, stalls, dict(rt.high_seqnos), rt.history_logs
    )
    counts: dict[int, int] = {}
    for p in parts:
        for (_, st), n in zip(p.streams, p.items, strict=True):
            counts[order[id(st)]] = n
    return merged, counts


def _items_back(p: ConnPart, frames_of: Callable[[list[int]], list[int]] | None) -> None:
    """The part's items from their columns (with ``frames_of``, their keys made frame numbers)."""
    if p.item_columns is None:
        return
    for (_, st), cols in zip(p.streams, p.item_columns, strict=True):
        made = (frames_of(cols[0]), *cols[1:]) if cols and frames_of is not None else cols
        st.items = list(map(Item._make, zip(*made, strict=True))) if made else []
    p.item_columns = None


def _replay(parts: list[ConnPart], rises: Callable[[Any], Rises] | None) -> Timeline:
    """What crosses connections (failover branches, rollback explanations): one builder fed every part's control records."""
    replay = TimelineBuilder()
    for p in parts:
        replay.place(p.ck, p.info.capture_set, p.info.file)
    controls = [[record_from(t) for t in p.control] for p in parts]
    rollbacks = sorted(
        r.number
        for recs in controls
        for r in recs
        if (fr := r.event).magic in _RESPONSES and fr.opcode == _STREAM_REQ and fr.status == _ROLLBACK  # type: ignore[union-attr]
    )
    pending_hi, end_hi = highest_before(parts, rollbacks, rises)
    for r in heapq.merge(*controls, key=_NUMBER):
        for vb, ck, q in pending_hi.pop(r.number, ()):
            replay.observe_seqno(vb, q, ck)
        replay.feed(r)
    for (vb, ck), q in sorted(end_hi.items()):
        replay.observe_seqno(vb, q, ck)
    return replay.timeline(final=False)
