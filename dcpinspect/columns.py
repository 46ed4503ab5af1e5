"""The frames table: its columns (defined once) and a column-by-column builder (pure).

Every consumer - pandas, parquet, CSV, JSON lines, Spark - takes its schema
from :data:`FRAME_COLUMNS`.  :class:`FrameColumns` fills plain Python lists
column by column from records (never a list of per-frame dicts); ``tables.py``
turns them into one Arrow table.

uint64 convention: CAS, vbucket UUIDs and seqnos (``end seqno`` is often
2^64-1) are unsigned 64-bit.  They stay ``uint64`` in Arrow and parquet,
become pandas' nullable ``UInt64``, print as JSON numbers, and (Spark has no
unsigned types) become ``decimal(20,0)`` there.  Missing values are nulls;
so is a time no ``timestamp[ns]`` can hold (:data:`~dcpinspect.flows.TS_UNKNOWN`,
a packet whose timestamp was out of range).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .dissect import Dissection, dissect
from .flows import TS_MAX, TS_UNKNOWN
from .records import Record

__all__ = ["DCP_COLUMNS", "FRAME_COLUMNS", "JSON_COLUMNS", "FrameColumns", "dcp_values"]

#: (name, Arrow type, description) - the one definition of the frames table
FRAME_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("file", "string", "capture file"),
    ("frame", "int64", "record number in the capture (1-based, in order of completion)"),
    ("conn_id", "int32", "connection number"),
    ("conn", "string", "client ip:port -> server ip:port"),
    ("dir", "string", "c2s (client to server) or s2c"),
    ("ts", "timestamp[ns]", "time of the packet that completed the frame (UTC; null if its timestamp was out of range)"),
    ("ts_first", "timestamp[ns]", "time of the packet the frame started in"),
    ("packet", "int64", "packet that completed the frame"),
    ("packet_first", "int64", "packet the frame started in"),
    ("type", "string", "frame, garbage, truncated or gap"),
    ("offset", "int64", "position in its direction's byte stream"),
    ("length", "int64", "bytes"),
    ("magic", "uint8", "magic byte"),
    ("opcode", "uint8", "opcode"),
    ("name", "string", "command name (DCP_MUTATION, unknown 0xNN)"),
    ("role", "string", "request or response (from the magic, not the direction)"),
    ("vbucket", "uint16", "vbucket (requests)"),
    ("status", "uint16", "status (responses)"),
    ("status_name", "string", "status name"),
    ("opaque", "uint32", "opaque as the docs show it (big-endian integer)"),
    ("cas", "uint64", "CAS"),
    ("datatype", "uint8", "datatype bits"),
    ("key", "string", "key text (collection id split out when negotiated)"),
    ("cid", "uint32", "collection id (when collections were negotiated)"),
    ("stream_id", "uint16", "DCP stream id (flexible framing)"),
    ("seqno", "uint64", "the item's seqno: by seqno, seqno-advanced, commit/abort/prepared seqno"),
    ("rev_seqno", "uint64", "rev seqno"),
    ("snap_start", "uint64", "snapshot marker start seqno"),
    ("snap_end", "uint64", "snapshot marker end seqno"),
    ("snap_flags", "uint32", "snapshot marker flags"),
    ("stream_end_status", "uint32", "DCP_STREAM_END status"),
    ("req_flags", "uint32", "stream request flags"),
    ("req_start", "uint64", "stream request start seqno"),
    ("req_end", "uint64", "stream request end seqno"),
    ("req_vb_uuid", "uint64", "stream request vbucket UUID"),
    ("req_snap_start", "uint64", "stream request snapshot start"),
    ("req_snap_end", "uint64", "stream request snapshot end"),
    ("failover_entries", "int32", "failover-log entries in a response"),
    ("rollback_seqno", "uint64", "rollback seqno of a 0x23 stream-request response"),
    ("buffer_bytes", "uint32", "DCP_BUFFER_ACKNOWLEDGEMENT bytes"),
    ("body_length", "uint32", "declared total body length"),
    ("value_length", "uint32", "value bytes"),
    ("problems", "list<string>", "protocol problems (and the reason for garbage/truncated/gap)"),
)
COLUMN_NAMES = tuple(c[0] for c in FRAME_COLUMNS)
#: the columns of ``dcpinspect frames --json`` (one object per line)
JSON_COLUMNS = (
    "file",
    "conn",
    "dir",
    "ts",
    "frame",
    "magic",
    "opcode",
    "name",
    "vbucket",
    "status",
    "opaque",
    "cas",
    "key",
    "cid",
    "seqno",
    "stream_id",
    "problems",
)

#: opcode -> the extras field holding the seqno the ``seqno`` column shows
SEQNO_FIELD = {
    0x57: "by_seqno",
    0x58: "by_seqno",
    0x59: "by_seqno",
    0x5F: "by_seqno",
    0x60: "by_seqno",
    0x61: "prepared_seqno",
    0x62: "commit_seqno",
    0x63: "abort_seqno",
    0x64: "seqno",
}


#: the DCP columns filled by :func:`dcp_values`
DCP_COLUMNS = (
    "seqno",
    "rev_seqno",
    "snap_start",
    "snap_end",
    "snap_flags",
    "stream_end_status",
    "req_flags",
    "req_start",
    "req_end",
    "req_vb_uuid",
    "req_snap_start",
    "req_snap_end",
    "failover_entries",
    "rollback_seqno",
    "buffer_bytes",
)
_REQ_FIELDS = (
    ("req_flags", "flags"),
    ("req_start", "start_seqno"),
    ("req_end", "end_seqno"),
    ("req_vb_uuid", "vb_uuid"),
    ("req_snap_start", "snap_start_seqno"),
    ("req_snap_end", "snap_end_seqno"),
)
_SNAP_FIELDS = (("snap_start", "start_seqno"), ("snap_end", "end_seqno"), ("snap_flags", "flags"))


def dcp_values(opcode: int, response: bool, ext: Mapping[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
    """The DCP columns of one frame from its decoded extras and body.

    ``ext`` values may be arrays (one group of frames at once); a column that
    does not apply is absent.  ``opcode`` is -1 for the UPR draft.
    """
    out: dict[str, Any] = {}
    seq = SEQNO_FIELD.get(opcode)
    if seq is not None and seq in ext:
        out["seqno"] = ext[seq]
    if "rev_seqno" in ext:
        out["rev_seqno"] = ext["rev_seqno"]
    if opcode == 0x56 and not response:
        src = ext if "start_seqno" in ext else body
        out.update((col, src[name]) for col, name in _SNAP_FIELDS if name in src)
    if opcode == 0x55 and "status" in ext:
        out["stream_end_status"] = ext["status"]
    if opcode == 0x53 and not response:
        out.update((col, ext[name]) for col, name in _REQ_FIELDS if name in ext)
    if opcode == 0x53 and response and body.get("rollback_seqno") is not None:
        out["rollback_seqno"] = body["rollback_seqno"]
    log = body.get("failover_log")
    if isinstance(log, list) and response:
        out["failover_entries"] = len(log)
    if opcode == 0x5D and "buffer_bytes" in ext:
        out["buffer_bytes"] = ext["buffer_bytes"]
    return out


class FrameColumns:
    """Column lists for the frames table, appended to one record at a time."""

    def __init__(self) -> None:
        self.cols: dict[str, list[Any]] = {name: [] for name in COLUMN_NAMES}
        self.rows = 0

    def add(self, rec: Record, d: Dissection | None = None) -> None:
        """Append one record (a frame is dissected with its connection's context)."""
        c = self.cols
        ev = rec.event
        self.rows += 1
        c["file"].append(rec.file)
        c["frame"].append(rec.number)
        c["conn_id"].append(rec.conn)
        c["conn"].append(rec.conn_label)
        c["dir"].append(rec.direction)
        ts, ts_first = rec.ts, rec.ts_first
        c["ts"].append(ts if TS_UNKNOWN < ts <= TS_MAX else None)
        c["ts_first"].append(ts_first if TS_UNKNOWN < ts_first <= TS_MAX else None)
        c["packet"].append(rec.packet)
        c["packet_first"].append(rec.packet_first)
        c["type"].append(ev.type)
        c["offset"].append(ev.offset)
        c["length"].append(ev.length)
        if ev.type != "frame":
            for name in COLUMN_NAMES[12:-1]:
                c[name].append(None)
            c["problems"].append([f"{ev.length} bytes missing from the capture" if ev.type == "gap" else ev.reason])  # type: ignore[union-attr]
            return
        if d is None:
            d = dissect(ev, rec.context)  # type: ignore[arg-type]
        fr = d.frame
        h = fr.header  # unpacked once: the Frame properties would unpack it again each
        mcbp = fr.dialect == "mcbp"
        response = d.role == "response"
        op = h[1] if mcbp else h[0]
        c["magic"].append(h[0] if mcbp else None)
        c["opcode"].append(op)
        c["name"].append(d.name)
        c["role"].append(d.role)
        c["vbucket"].append(None if response or not mcbp else h[5])
        status = h[5] if response and mcbp else None
        c["status"].append(status)
        c["status_name"].append(None if status is None else _status_name(status))
        c["opaque"].append(h[7] if mcbp else h[2])
        c["cas"].append(h[8] if mcbp else None)
        c["datatype"].append(h[4] if mcbp else None)
        c["key"].append(d.key_text if d.key else None)
        # a LEB128 id past 32 bits is reported by dissect as a problem; the column holds only valid ids
        c["cid"].append(d.cid if d.cid is None or d.cid <= 0xFFFFFFFF else None)
        c["stream_id"].append(d.stream_id)
        vals = dcp_values(op if mcbp else -1, response, d.extras, d.body)
        for name in DCP_COLUMNS:
            c[name].append(vals.get(name))
        if mcbp:
            alt = h[0] in (0x08, 0x18)
            sections = ((h[2] >> 8) + (h[2] & 0xFF) if alt else h[2]) + h[3]
            c["body_length"].append(h[6])
            c["value_length"].append(h[6] - sections)
        else:
            c["body_length"].append(h[3])
            c["value_length"].append(None)
        c["problems"].append([p.message for p in d.problems])

    def extend(self, records: Iterable[Record]) -> FrameColumns:
        """Append many records."""
        for r in records:
            self.add(r)
        return self


def _status_name(status: int) -> str:
    from .spec import STATUS

    return STATUS.get(status, f"unknown 0x{status:04x}")
