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

__all__ = ["COMPARE_COLUMNS", "FIELD_TABLES", "HISTORY_COLUMNS", "LAG_COLUMNS", "TIMELINE_COLUMNS", "Field", "fields"]

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
        ("filter", "string", "the stream request's JSON value (collections or scope filter, sid, purge_seqno), as sent"),
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


_SERIES = (
    ("capture_set", "int", "the capture set of the consumer's connection (1-based)"),
    ("conn", "int", "connection number"),
    ("consumer", "string", "DCP_OPEN connection name"),
    ("vbucket", "int", "vbucket"),
    ("stream_id", "int", "DCP stream id (null without stream ids)"),
)
#: table -> (column, type, meaning) of the consumer-lag tables (:mod:`.progress`, ``dcpinspect lag``), in their column order
LAG_COLUMNS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "progress": (
        *_SERIES,
        ("frame", "int", "the frame that changed the consumer seqno or the producer high seqno"),
        ("ts", "timestamp", "its time (UTC)"),
        ("event", "string", "what it was: item, DCP_SEQNO_ADVANCED, snapshot marker, stream request, end, a report, end of capture"),
        ("consumer_seqno", "uint64", "the consumer's last seqno: its stream request's start, raised by items and seqno-advanced"),
        ("producer_high", "uint64", "the producer's high seqno as last seen (on any connection to the same server)"),
        ("high_source", "string", "what last set it: GET_ALL_VB_SEQNOS, STAT vbucket-seqno, snapshot marker, item ..."),
        ("high_frame", "int", "the frame that last set it"),
        ("lag_items", "uint64", "producer_high - consumer_seqno (never below 0)"),
        ("lag_seconds", "float", "seconds since the producer's high seqno rose above consumer_seqno and stayed there (0: caught up)"),
    ),
    "lag": (
        *_SERIES,
        ("rows", "int", "progress rows of the series"),
        ("max_lag_items", "uint64", "the worst lag in items"),
        ("max_lag_items_at", "timestamp", "when (UTC)"),
        ("max_lag_seconds", "float", "the worst lag in seconds"),
        ("max_lag_seconds_at", "timestamp", "when (UTC)"),
        ("end_consumer_seqno", "uint64", "the consumer seqno at the series' last row (the end of the capture or of its stream)"),
        ("end_producer_high", "uint64", "the producer high seqno then"),
        ("end_lag_items", "uint64", "the lag in items then"),
        ("end_lag_seconds", "float", "the lag in seconds then"),
    ),
    "high_seqnos": (
        ("frame", "int", "frame of the GET_ALL_VB_SEQNOS or STAT answer"),
        ("capture_set", "int", "its capture set"),
        ("conn", "int", "connection number"),
        ("vbucket", "int", "vbucket"),
        ("high_seqno", "uint64", "the high seqno it reported"),
        ("source", "string", "GET_ALL_VB_SEQNOS or STAT vbucket-seqno"),
    ),
}


#: table -> (column, type, meaning) of the tables of two consumers compared (:mod:`.compare`, ``dcpinspect compare``)
COMPARE_COLUMNS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "comparison": (
        ("vbucket", "int", "vbucket"),
        ("only_in", "string", "a or b: the consumer that has the items"),
        ("seqno_from", "uint64", "first seqno of the run of items"),
        ("seqno_to", "uint64", "last seqno of the run"),
        ("items", "int", "items in the run"),
        ("keys", "list", "their keys (collection id split out)"),
        ("reason", "string", "rollback, branch, start, filter, ended, dedup or unknown"),
        ("explanation", "string", "the reason in words, naming the frames that show it"),
        ("evidence_a", "list", "frames of consumer a that show it (frame numbers of a's read)"),
        ("evidence_b", "list", "frames of consumer b that show it (frame numbers of b's read)"),
    ),
    "comparison_vbuckets": (
        ("vbucket", "int", "vbucket"),
        ("items_a", "int", "items consumer a received (dropped by a rollback or not)"),
        ("items_b", "int", "items consumer b received"),
        ("common", "int", "items both received (same seqno, key and collection)"),
        ("only_a", "int", "items only a has (or only a holds: b dropped them)"),
        ("only_b", "int", "items only b has"),
        ("last_a", "uint64", "a's highest item seqno"),
        ("last_b", "uint64", "b's highest item seqno"),
        ("diverge_at", "uint64", "the seqno the failover histories diverge at (null: they agree)"),
        ("branches_a", "string", "the failover branches a's logs showed, uuid@seqno, oldest first"),
        ("branches_b", "string", "the failover branches b's logs showed"),
    ),
}
_PAIR = (
    ("capture_set", "int", "the capture set of the two consumers (1-based)"),
    ("consumer_a", "string", "consumer a: a DCP_OPEN name (conn N when not captured), the first of the pair in name order"),
    ("consumer_b", "string", "consumer b: the second"),
)
#: ``analyze --items``: every pair of consumers of each vbucket compared (:mod:`dcpinspect.spark.questions`)
COMPARE_COLUMNS["comparisons"] = (*_PAIR, *COMPARE_COLUMNS["comparison"])
COMPARE_COLUMNS["comparisons_vbuckets"] = (
    *_PAIR,
    *COMPARE_COLUMNS["comparison_vbuckets"],
    ("consumers", "int", "consumers that streamed the vbucket"),
    ("skipped", "int", "of them, left out of the pairs (only the first 16 in name order are compared)"),
)

_ROLLBACK = (
    ("capture_set", "int", "the capture set of the rollback's connection (1-based)"),
    ("file", "string", "its capture file"),
    ("conn", "int", "the connection the rollback was answered on"),
    ("consumer", "string", "DCP_OPEN connection name (conn N when not captured)"),
    ("stream", "int", "stream number"),
    ("vbucket", "int", "vbucket"),
    ("stream_id", "int", "DCP stream id (null without stream ids)"),
    ("frame", "int", "frame of the DCP_STREAM_REQ"),
    ("response_frame", "int", "frame of the Rollback response"),
    ("uuid", "uint64", "the branch abandoned: the vbucket UUID the request sent"),
    ("rollback_seqno", "uint64", "rollback seqno the server gave"),
)
#: table -> (column, type, meaning) of the key-history tables (:mod:`.history`, ``dcpinspect key``), in their column order
HISTORY_COLUMNS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "key_versions": (
        ("capture_set", "int", "the capture set of the item's connection (1-based)"),
        ("file", "string", "its capture file"),
        ("conn", "int", "connection number"),
        ("consumer", "string", "DCP_OPEN connection name (conn N when not captured)"),
        ("lineage", "string", "the consumer whose history it continues (a resume under another name), else the consumer"),
        ("stream", "int", "stream number"),
        ("vbucket", "int", "vbucket"),
        ("stream_id", "int", "DCP stream id (null without stream ids)"),
        ("frame", "int", "frame of the item"),
        ("ts", "timestamp", "time of the item (UTC)"),
        ("name", "string", "DCP_MUTATION, DELETION, EXPIRATION, PREPARE, COMMIT or ABORT"),
        ("sync_write", "bool", "a prepare, commit or abort"),
        ("key", "string", "key text (collection id split out)"),
        ("cid", "uint32", "collection id (null without HELLO Collections: the default collection)"),
        ("seqno", "uint64", "item seqno"),
        ("cas", "uint64", "CAS"),
        ("cas_time", "timestamp", "the CAS as its HLC time (UTC; null for a CAS that is no time)"),
        ("rev_seqno", "uint64", "rev seqno"),
        ("snapshot", "int", "snapshot number within the stream (-1: before any marker)"),
        ("snap_type", "string", "the snapshot's type: memory/disk and the other flags, in words"),
        ("snap_start", "uint64", "snapshot start seqno"),
        ("snap_end", "uint64", "snapshot end seqno"),
        ("fate", "string", "superseded in snapshot, superseded, re-delivered, rolled back or current"),
        ("fate_frame", "int", "the item or rollback response that decided the fate"),
        ("fate_seqno", "uint64", "its seqno (the rollback seqno for a rollback)"),
        ("dedup_violation", "bool", "superseded inside a snapshot whose marker forbids duplicates"),
    ),
    "rollback_losses": (
        *_ROLLBACK,
        ("items", "int", "items the consumer had received above the rollback seqno on that branch"),
        ("keys", "list", "their documents (key, and cid when not the default collection)"),
        ("first_seqno", "uint64", "lowest seqno cut"),
        ("last_seqno", "uint64", "highest seqno cut"),
        ("redelivered", "int", "documents the new branch re-sent (a mutation or commit after the rollback)"),
        ("possibly_lost", "int", "documents deleted, expired or not re-sent before the capture ended"),
        ("lost_keys", "list", "the possibly lost documents"),
    ),
    "rollback_lost_keys": (
        *_ROLLBACK,
        ("key", "string", "key text"),
        ("cid", "uint32", "collection id"),
        ("versions", "int", "items of the document the rollback cut"),
        ("lost_seqno", "uint64", "seqno of the last version cut"),
        ("lost_cas", "uint64", "its CAS"),
        ("lost_frame", "int", "its frame"),
        ("status", "string", "redelivered or possibly lost"),
        ("new_seqno", "uint64", "seqno of the first item of the document after the rollback"),
        ("new_frame", "int", "its frame"),
        ("new_name", "string", "its command"),
        ("same_version", "bool", "it has the lost version's CAS"),
        ("reason", "string", "what happened to the document, in words"),
    ),
}


class Field(NamedTuple):
    """One field of one table: what ``dcpinspect fields`` prints a line of."""

    table: str
    name: str
    type: str
    meaning: str


#: the tables ``dcpinspect fields --table`` knows: frames, filter (the filter's functions and operators), then the timeline's
FIELD_TABLES: tuple[str, ...] = ("frames", "filter", *TIMELINE_COLUMNS, *LAG_COLUMNS, *COMPARE_COLUMNS, *HISTORY_COLUMNS)


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
    for name, cols in (*TIMELINE_COLUMNS.items(), *LAG_COLUMNS.items(), *COMPARE_COLUMNS.items(), *HISTORY_COLUMNS.items()):
        if table in (None, name):
            out += [Field(name, n, t, m) for n, t, m in cols]
    return out
