"""Every table's fields with their types and meanings: what ``dcpinspect fields`` lists (like ``tshark -G fields``).

Rules:

1. The frames table's fields are read from :data:`~.columns.FRAME_COLUMNS`
   when asked (never copied here): a column added there is listed at once.
2. The timeline tables (:func:`dcpinspect.tables.timeline.timeline_frames`)
   are declared here, table by table, in their column order; a test builds
   the tables from real captures and checks the declaration against them,
   so the two cannot drift apart silently.
3. The display filter's functions and operators come from
   :mod:`.filter`, the module that implements them.

Pure data and the standard library: listing the fields imports no pyarrow.
"""

from __future__ import annotations

from typing import NamedTuple

from .filter import FILTER_FUNCTIONS, FILTER_OPERATORS

__all__ = ["FIELD_TABLES", "TIMELINE_COLUMNS", "Field", "fields"]

_WHERE = (
    ("capture_set", "int", "the capture set of the row's connection (1-based)"),
    ("file", "string", "the capture file of the row's connection"),
)
_STREAM = (
    ("stream", "int", "stream number (row of the streams table)"),
    ("conn", "int", "connection number"),
    *_WHERE,
    ("vbucket", "int", "vbucket"),
)

#: table -> (column, type, meaning) of the timeline tables, in :func:`~dcpinspect.tables.timeline.timeline_frames` order
TIMELINE_COLUMNS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "connections": (
        ("conn", "int", "connection number"),
        *_WHERE,
        ("label", "string", "client ip:port -> server ip:port"),
        ("name", "string", "DCP_OPEN connection name"),
        ("side", "string", "producer or consumer (from DCP_OPEN's flags)"),
        ("open_flags", "int", "DCP_OPEN flags"),
        ("features", "string", "HELLO features negotiated, comma-separated"),
        ("controls", "string", "DCP_CONTROL key=value (outcome), semicolon-separated"),
        ("buffer_size", "int", "flow-control buffer size (connection_buffer_size control)"),
        ("noop_interval", "float", "set_noop_interval control, seconds"),
        ("sasl_mechanism", "string", "SASL mechanism"),
        ("sasl_user", "string", "SASL user"),
        ("bucket", "string", "SELECT_BUCKET bucket"),
        ("bytes_lost", "int", "bytes lost to capture gaps"),
    ),
    "streams": (
        ("stream", "int", "stream number"),
        ("conn", "int", "connection number"),
        *_WHERE,
        ("vbucket", "int", "vbucket"),
        ("stream_id", "int", "DCP stream id (null without stream ids)"),
        ("segment", "int", "segment of the (connection, vbucket, stream id): a new one after each end"),
        ("attempts", "int", "stream requests"),
        ("snapshots", "int", "snapshot markers"),
        ("items", "int", "data messages"),
        ("last_seqno", "uint64", "last item seqno"),
        ("end_status", "string", "DCP_STREAM_END status name (null: no end)"),
        ("end_frame", "int", "frame of the DCP_STREAM_END"),
        ("anomalies", "int", "anomalies found on the stream"),
    ),
    "attempts": (
        *_STREAM,
        ("stream_id", "int", "DCP stream id"),
        ("frame", "int", "frame of the DCP_STREAM_REQ"),
        ("start", "uint64", "start seqno"),
        ("end", "uint64", "end seqno"),
        ("uuid", "uint64", "vbucket UUID asked for"),
        ("snap_start", "uint64", "snapshot start seqno"),
        ("snap_end", "uint64", "snapshot end seqno"),
        ("flags", "int", "stream request flags"),
        ("outcome", "string", "success, rollback, error or pending"),
        ("status", "int", "response status"),
        ("rollback_seqno", "uint64", "rollback seqno of a Rollback (0x23) response"),
        ("failover_log", "list", "failover log of a success response: (uuid, seqno) newest first"),
        ("explanation", "string", "why the server answered as it did (rollbacks)"),
        ("response_frame", "int", "frame of the response"),
        ("status_name", "string", "response status name"),
        ("predicted_rollback", "uint64", "the rollback seqno the failover log predicts"),
    ),
    "snapshots": (
        ("stream", "int", "stream number"),
        ("snapshot", "int", "snapshot number within the stream"),
        ("conn", "int", "connection number"),
        *_WHERE,
        ("vbucket", "int", "vbucket"),
        ("frame", "int", "frame of the snapshot marker"),
        ("start", "uint64", "snapshot start seqno"),
        ("end", "uint64", "snapshot end seqno"),
        ("flags", "int", "marker flags"),
        ("type", "string", "memory/disk and the other flags, in words"),
        ("version", "string", "marker version (v1, v2.0, v2.2)"),
        ("max_visible", "uint64", "max visible seqno (v2)"),
        ("high_completed", "uint64", "high completed seqno (v2, disk)"),
        ("purge_seqno", "uint64", "purge seqno (v2.2)"),
        ("high_prepared", "uint64", "high prepared seqno (v2.2)"),
        ("items", "int", "items received in the snapshot"),
        ("first_seqno", "uint64", "first item seqno"),
        ("last_seqno", "uint64", "last item seqno"),
        ("complete", "bool", "every seqno up to the end was received"),
    ),
    "items": (
        *_STREAM,
        ("frame", "int", "frame of the item"),
        ("ts", "timestamp", "time of the item (UTC)"),
        ("name", "string", "command name (DCP_MUTATION, DCP_DELETION ...)"),
        ("seqno", "uint64", "item seqno"),
        ("snapshot", "int", "snapshot number within the stream"),
    ),
    "failover": (
        *_WHERE,
        ("vbucket", "int", "vbucket"),
        ("history", "int", "history: failover logs that share an entry (one cluster's vbucket)"),
        ("branch", "int", "branch number"),
        ("uuid", "uint64", "vbucket UUID of the branch"),
        ("seqno", "uint64", "seqno the branch starts at"),
        ("first_frame", "int", "frame whose failover log first showed it"),
        ("cut_frame", "int", "frame whose log no longer had it"),
        ("cut_by", "uint64", "UUID of the branch that cut it"),
    ),
    "rollbacks": (
        *_STREAM,
        ("frame", "int", "frame of the DCP_STREAM_REQ"),
        ("response_frame", "int", "frame of the Rollback response"),
        ("uuid", "uint64", "vbucket UUID asked for"),
        ("start", "uint64", "start seqno"),
        ("snap_start", "uint64", "snapshot start seqno"),
        ("snap_end", "uint64", "snapshot end seqno"),
        ("rollback_seqno", "uint64", "rollback seqno the server gave"),
        ("predicted", "uint64", "the rollback seqno the failover log predicts"),
        ("explanation", "string", "why the server rolled back"),
    ),
    "flow": (
        ("conn", "int", "connection number"),
        *_WHERE,
        ("frame", "int", "frame"),
        ("ts", "timestamp", "time (UTC)"),
        ("outstanding", "int", "flow-control bytes outstanding after the frame"),
        ("event", "string", "what changed them: a charged message or an acknowledgement"),
        ("size", "int", "bytes charged or acknowledged"),
    ),
    "noops": (
        ("conn", "int", "connection number"),
        *_WHERE,
        ("frame", "int", "frame of the DCP_NOOP"),
        ("reply_frame", "int", "frame of its response"),
        ("rtt_ns", "int", "round-trip time, ns"),
    ),
    "stalls": (
        ("conn", "int", "connection number"),
        *_WHERE,
        ("frame", "int", "frame where the producer stopped (buffer full)"),
        ("ack_frame", "int", "frame of the acknowledgement that ended it"),
        ("duration_ns", "int", "how long, ns"),
    ),
    "anomalies": (
        ("kind", "string", "anomaly kind"),
        ("conn", "int", "connection number"),
        *_WHERE,
        ("vbucket", "int", "vbucket (null: a connection anomaly)"),
        ("stream_id", "int", "DCP stream id"),
        ("frames", "list", "frames involved"),
        ("first_frame", "int", "first frame involved"),
        ("count", "int", "times seen"),
        ("uncertain", "bool", "bytes were lost: it may be the capture's fault"),
        ("message", "string", "what is wrong"),
    ),
}


class Field(NamedTuple):
    """One field of one table: what ``dcpinspect fields`` prints a line of."""

    table: str
    name: str
    type: str
    meaning: str


#: the tables ``dcpinspect fields --table`` knows: frames, filter (the filter's functions and operators), then the timeline's
FIELD_TABLES: tuple[str, ...] = ("frames", "filter", *TIMELINE_COLUMNS)


def fields(table: str | None = None) -> list[Field]:
    """The fields of ``table`` (one of :data:`FIELD_TABLES`), or of every table; ``ValueError`` for an unknown table."""
    from .columns import FRAME_COLUMNS

    if table is not None and table not in FIELD_TABLES:
        raise ValueError(f"unknown table {table!r} (one of {', '.join(FIELD_TABLES)})")
    out: list[Field] = []
    if table in (None, "frames"):
        out += [Field("frames", n, t, m) for n, t, m in FRAME_COLUMNS]
    if table in (None, "filter"):
        out += [Field("filter", syntax, "function", m) for syntax, m in FILTER_FUNCTIONS]
        out += [Field("filter", syntax, "operator", m) for syntax, m in FILTER_OPERATORS]
    for name, cols in TIMELINE_COLUMNS.items():
        if table in (None, name):
            out += [Field(name, n, t, m) for n, t, m in cols]
    return out
