"""The report's unit: one capture set - its files, its part of the timeline, its frames, and where its time starts.

Theory of operation
-------------------
A run may hold unrelated recordings (capture sets, :mod:`dcpinspect.capture.sets`);
the report draws each apart, with time counted from the set's own start, so
that a file of 2025 beside one of 2026 never shares an axis.  :func:`split_sets`
cuts a :class:`~dcpinspect.timeline.model.Timeline` into one
:class:`SetPart` per set - a timeline of the same shape holding only that
set's connections, streams, branches, flow, noops, stalls and anomalies - so
the plots of :mod:`dcpinspect.views.plots` draw a set without knowing sets
exist.  :func:`history_timeline` cuts a set's part once more, to one failover
history of one vbucket (a branch tree of its own).

Rules:

1. A connection belongs to its ``ConnectionInfo.capture_set``; a stream,
   flow sample, noop and stall to its connection's set; a branch to the set
   of the frame whose failover log first showed it; an anomaly to its
   connection's set, else to the set of its first frame (:meth:`Timeline.locate`).
2. A frame's set and number within its set come from the frames table's
   ``capture_set``/``set_frame`` columns where present, else from
   :meth:`Timeline.locate`.
3. The timeline given is never changed: the parts hold the same objects in
   new lists and dicts.
4. Sets are numbered as the reader numbered them; a timeline without sets is
   one set, number 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..timeline import Stream, Timeline

__all__ = ["SetPart", "branch_set", "history_timeline", "locate", "set_of_conn", "split_sets", "stream_history"]


@dataclass
class SetPart:
    """One capture set as the report shows it."""

    number: int
    files: list[str]  # in reading order
    reason: str  # why these files are one set ("" when unknown)
    timeline: Timeline  # the set's part of the run's timeline
    streams: list[int] = field(default_factory=list)  # indices of its streams in the run's timeline
    start_ts: int | None = None  # ns: the set's first frame's time (None: unknown)
    end_ts: int | None = None  # ns: the latest time seen in the set (None: unknown)
    frames: int | None = None  # rows of the frames table in the set (None: only a sample was seen)
    first_frame: int = 1  # run frame number of its first frame


def set_of_conn(t: Timeline) -> dict[int, int]:
    """Connection id -> its capture set."""
    return {c: int(getattr(info, "capture_set", 1) or 1) for c, info in t.connections.items()}


def branch_set(t: Timeline, b: Any) -> int:
    """The capture set of a branch: that of the frame whose failover log first showed it (its ``capture_set`` when sets are unknown)."""
    if getattr(t, "set_first", None):
        return locate(t, b.first_frame)[0]
    return int(getattr(b, "capture_set", 1) or 1)


def locate(t: Timeline, frame: int) -> tuple[int, int]:
    """``(capture set, frame within the set)`` of a run frame number (one set, number 1, when the timeline knows none)."""
    where = getattr(t, "locate", None)
    if where is None:
        return 1, frame
    cs, n = where(frame)
    return int(cs), int(n)


def _anomaly_set(t: Timeline, conns: Mapping[int, int], a: Any) -> int:
    if a.conn is not None and a.conn in conns:
        return conns[a.conn]
    return locate(t, a.frames[0])[0] if a.frames else 1


def split_sets(t: Timeline, sets: Sequence[Any] | None = None, status: Sequence[Mapping[str, Any]] = ()) -> list[SetPart]:
    """One :class:`SetPart` per capture set, in set order.

    ``sets`` are the reader's :class:`~dcpinspect.capture.sets.CaptureSet`
    objects (``number``, ``files``, ``reason``) when known; otherwise the sets
    and their files are gathered from the timeline and the per-file
    ``status`` rows (their ``capture_set``, else the set of the connections
    seen in the file).
    """
    conns = set_of_conn(t)
    files: dict[int, list[str]] = {}
    given = bool(sets)
    reasons: dict[int, str] = {}
    for s in sets or ():
        files[int(s.number)] = [str(f) for f in s.files]
        reasons[int(s.number)] = str(getattr(s, "reason", "") or "")
    if not sets:
        for row in status:
            if row.get("capture_set") is not None:
                files.setdefault(int(row["capture_set"]), []).append(str(row.get("path") or ""))
    numbers = set(files) | set(conns.values()) | {branch_set(t, b) for bs in t.branches.values() for b in bs}
    numbers |= set(getattr(t, "set_first", {}) or {})
    if not numbers:
        numbers = {1}
    of_file = {f: n for n, fs in files.items() for f in fs}
    for c, info in t.connections.items():  # the reader's plan knows each file's set
        conns[c] = of_file.get(getattr(info, "file", ""), conns[c])
    parts = {n: _empty_part(t, n, files.get(n, []), reasons.get(n, "")) for n in sorted(numbers)}
    _fill(t, parts, conns, add_files=not given)
    return list(parts.values())


def _empty_part(t: Timeline, n: int, files: list[str], reason: str) -> SetPart:
    sub = Timeline(connections={}, streams=[], branches={}, logs={}, flow=[], noops=[], anomalies=[], stalls=[], high_seqnos={})
    first = (getattr(t, "set_first", {}) or {}).get(n, 1)
    return SetPart(number=n, files=list(files), reason=reason, timeline=sub, first_frame=int(first))


def _fill(t: Timeline, parts: dict[int, SetPart], conns: Mapping[int, int], *, add_files: bool) -> None:
    def part(cs: int) -> Timeline:
        return parts[cs].timeline if cs in parts else parts[min(parts)].timeline

    for c, info in t.connections.items():
        part(conns[c]).connections[c] = info
        p = parts.get(conns[c])
        if add_files and p is not None and info.file and info.file not in p.files:
            p.files.append(info.file)
    for i, s in enumerate(t.streams):
        cs = conns.get(s.conn, 1)
        part(cs).streams.append(s)
        (parts[cs] if cs in parts else parts[min(parts)]).streams.append(i)
    for vb, branches in t.branches.items():
        for b in branches:
            part(branch_set(t, b)).branches.setdefault(vb, []).append(b)
    for f in t.flow:
        part(conns.get(f.conn, 1)).flow.append(f)
    for n in t.noops:
        part(conns.get(n["conn"], 1)).noops.append(n)
    for st in t.stalls:
        part(conns.get(st["conn"], 1)).stalls.append(st)
    for a in t.anomalies:
        part(_anomaly_set(t, conns, a)).anomalies.append(a)
    for vb, (frame, seqno) in t.high_seqnos.items():
        part(locate(t, frame)[0]).high_seqnos[vb] = (frame, seqno)
    for vb, logs in t.logs.items():
        for frame, log in logs:
            part(locate(t, frame)[0]).logs.setdefault(vb, []).append((frame, log))
    for p in parts.values():
        p.timeline.set_first = {p.number: p.first_frame}


def stream_history(s: Stream, uuids: Mapping[int, set[int]]) -> int | None:
    """The history (of ``uuids``: history -> its branches' uuids) a stream's requests and logs name, or None."""
    named = {at.uuid for at in s.attempts} | {u for at in s.attempts for u, _q in at.failover_log}
    for h, us in uuids.items():
        if named & us:
            return h
    return None


def history_timeline(part: Timeline, vbucket: int, history: int, branches: Iterable[Any]) -> Timeline:
    """A set's timeline cut to one failover history of one vbucket: its branches, and the streams on the vbucket that name it.

    Streams on the vbucket that name no history of it are kept with its first history.
    """
    mine = list(branches)
    per_history: dict[int, set[int]] = {}
    for b in part.branches.get(vbucket, []):
        per_history.setdefault(int(getattr(b, "history", 1)), set()).add(b.uuid)
    first = min(per_history, default=history)
    streams = [s for s in part.streams if s.vbucket == vbucket and (stream_history(s, per_history) or first) == history]
    return dataclasses.replace(
        part,
        streams=streams,
        branches={vbucket: mine},
        high_seqnos={vbucket: part.high_seqnos[vbucket]} if vbucket in part.high_seqnos else {},
        anomalies=[],
    )
