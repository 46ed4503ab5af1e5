"""Per-stream timelines: the story of each DCP stream, rebuilt from records (pure, incremental).

Theory of operation: a :class:`TimelineBuilder` takes
:class:`~dcpinspect.flows.records.Record` objects one at a time (live) or in
bulk (a capture) - the result is the same either way - and keeps, per
connection, what it negotiated and which requests await an answer, and per
stream segment its attempts (every DCP_STREAM_REQ and its outcome), snapshots
with the items inside them, and its end.  Across connections it groups the
failover logs of each vbucket into histories - never across capture sets
(``TimelineBuilder(capture_sets)``: file -> set), within one only logs that
share an entry - each a branch tree, and explains each rollback by replaying
the producer's rule on its stream's own history.  :func:`~dcpinspect.timeline.merge.merge_timelines`
puts per-connection timelines built apart (Spark) back together.

Modules, bottom up: :mod:`.model` (the data), :mod:`.transitions` (a stream
segment's life as a table), :mod:`.rollback` (failover branches, rollback
explanations), :mod:`.core` (the builder's state and shared moves),
:mod:`.streams` (stream requests, answers and messages), :mod:`.runs`
(runs of item messages taken in bulk, where that provably changes nothing),
:mod:`.builder` (records in, timeline out: the dispatch tables and the
connection's commands), :mod:`.merge` (per-connection parts merged and
renumbered).

Rules:

1. Pure: no I/O, no clock, no heavy imports; the tables (pandas) and the
   views (matplotlib) read a :class:`Timeline`, never the other way round.
2. The timeline never decodes bytes itself: a frame's meaning comes from the
   table through :func:`~dcpinspect.wire.dissect.dissect`, asked at most once
   per frame.  The only shortcuts are the item fast path, which reads an item's
   seqno with the table's own extras struct, and item runs, whose seqnos a
   bulk reader reads at the offsets :data:`~dcpinspect.timeline.runs.ITEM_RUN_LAYOUTS`
   takes from those structs.
3. Each frame is dispatched once, by a table keyed on its opcode (every opcode
   of the protocol table has an entry; anything else is an anomaly).
4. A stream segment changes state only through ``TRANSITIONS``; an input the
   table does not allow becomes an anomaly, never an exception.
5. Protocol facts and rules are not written here: opcodes, statuses and flags
   come from :mod:`~dcpinspect.protocol.enums`, behaviour sets from
   :mod:`~dcpinspect.protocol.session`, the rollback rule, the flow-control
   sizes and the dedup rule from :mod:`~dcpinspect.protocol.rules`, how each
   request is answered (once, several times, maybe not at all) from
   :mod:`~dcpinspect.protocol.exchanges`, and the connection context
   from the one tracker, :class:`~dcpinspect.flows.session.ConnState`.
6. Every anomaly names its frames; what may be the capture's fault (bytes
   lost before it, the connection's start not captured) is marked uncertain.
7. Memory is bounded where a capture is unbounded: merged repeats, capped
   pending requests, and with ``max_items`` thinned items and flow samples.
"""

from ..protocol.rules import MAX_SEQNO
from .builder import TimelineBuilder, build_timeline
from .model import (
    Anomaly,
    AnomalyKind,
    Attempt,
    Branch,
    ConnectionInfo,
    FlowSample,
    HistoryKey,
    Item,
    Snapshot,
    Stream,
    StreamState,
    Timeline,
    stream_label,
)

__all__ = [
    "MAX_SEQNO",
    "Anomaly",
    "AnomalyKind",
    "Attempt",
    "Branch",
    "ConnectionInfo",
    "FlowSample",
    "HistoryKey",
    "Item",
    "Snapshot",
    "Stream",
    "StreamState",
    "Timeline",
    "TimelineBuilder",
    "build_timeline",
    "stream_label",
]
