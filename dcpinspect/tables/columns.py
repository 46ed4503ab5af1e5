"""The frames table: its columns (defined once) and a column-by-column builder (pure).

Every consumer - pandas, parquet, CSV, JSON lines, Spark - takes its schema
from :data:`FRAME_COLUMNS`.  :class:`FrameColumns` fills plain Python lists
column by column from records (never a list of per-frame dicts); ``tables.py``
turns them into one Arrow table.

uint64 convention: CAS, vbucket UUIDs and seqnos (``end seqno`` is often
2^64-1) are unsigned 64-bit.  They stay ``uint64`` in Arrow and parquet,
become pandas' nullable ``UInt64``, print as JSON numbers, and (Spark has no
unsigned types) become ``decimal(20,0)`` there.  Missing values are nulls;
so is a time no ``timestamp[ns]`` can hold (:data:`~dcpinspect.flows.reassembly.TS_UNKNOWN`,
a packet whose timestamp was out of range).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..flows.reassembly import TS_MAX, TS_UNKNOWN
from ..flows.records import Record
from ..protocol.enums import Datatype, Opcode
from ..protocol.session import SEQNO_FIELD
from ..protocol.spec import ALT_MAGICS, STATUS
from ..wire.dissect import dissect
from ..wire.dissection import Dissection

__all__ = [
    "COLUMN_NAMES",
    "DCP_COLUMNS",
    "DICTIONARY_COLUMNS",
    "FIELD_COLUMNS",
    "FRAME_COLUMNS",
    "FRAME_VALUE_COLUMNS",
    "JSON_COLUMNS",
    "JSON_INVALID",
    "JSON_NOT_CHECKED",
    "JSON_VALID",
    "STATISTICS_COLUMNS",
    "FrameColumns",
    "dcp_values",
]

#: the ``json_check`` column's values
JSON_VALID, JSON_INVALID, JSON_NOT_CHECKED = "valid", "invalid", "not checked"
_NOT_JSON = "not valid JSON"  # what every JSON problem of the dissector says

#: the columns every row takes from its record: (name, Arrow type, description)
_RECORD_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("file", "string", "capture file"),
    ("frame", "int64", "record number in the run (1-based, in order of completion; each capture set's frames are contiguous)"),
    ("capture_set", "int32", "the capture set (files of one recording, read as one capture; 1-based)"),
    ("set_frame", "int64", "record number within its capture set (1-based): with the file, what `show FILE --frame N` takes"),
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
)
#: the columns a frame fills (null for garbage, truncated frames and gaps, but for ``problems``)
_FRAME_VALUE_COLUMNS: tuple[tuple[str, str, str], ...] = (
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
    ("json_check", "string", "a value flagged JSON: valid, invalid or not checked (null when no value is flagged JSON)"),
    ("problems", "list<string>", "protocol problems (and the reason for garbage/truncated/gap)"),
)
#: (name, Arrow type, description) - the one definition of the frames table
FRAME_COLUMNS: tuple[tuple[str, str, str], ...] = _RECORD_COLUMNS + _FRAME_VALUE_COLUMNS
COLUMN_NAMES = tuple(c[0] for c in FRAME_COLUMNS)
#: the columns a frame fills, ``problems`` last (every event fills that one)
FRAME_VALUE_COLUMNS = tuple(c[0] for c in _FRAME_VALUE_COLUMNS)
#: the columns of ``dcpinspect frames --json`` (one object per line)
JSON_COLUMNS = (
    "file",
    "capture_set",
    "set_frame",
    "conn_id",
    "conn",
    "dir",
    "ts",
    "frame",
    "type",
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

#: the string columns with few distinct values: parquet stores them dictionary-encoded (the rest plain: as small, and a quarter faster to write)
DICTIONARY_COLUMNS = ("file", "conn", "dir", "type", "name", "role", "status_name", "json_check")

#: the columns whose parquet statistics (min/max per row group) are written: not the keys' or problems' (no query filters
#: on their ranges; writing them costs a tenth of the write)
STATISTICS_COLUMNS = tuple(n for n in COLUMN_NAMES if n not in ("key", "problems"))

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
_STREAM_REQ_COLUMNS = (
    ("req_flags", "flags"),
    ("req_start", "start_seqno"),
    ("req_end", "end_seqno"),
    ("req_vb_uuid", "vb_uuid"),
    ("req_snap_start", "snap_start_seqno"),
    ("req_snap_end", "snap_end_seqno"),
)
#: (opcode, response?) -> the DCP columns its fields fill: (column, field), the field found in the extras, else the value
FIELD_COLUMNS: Mapping[tuple[int, bool], tuple[tuple[str, str], ...]] = {
    (Opcode.DCP_SNAPSHOT_MARKER, False): (("snap_start", "start_seqno"), ("snap_end", "end_seqno"), ("snap_flags", "flags")),
    (Opcode.DCP_STREAM_END, False): (("stream_end_status", "status"),),
    (Opcode.DCP_STREAM_END, True): (("stream_end_status", "status"),),
    (Opcode.DCP_STREAM_REQ, False): _STREAM_REQ_COLUMNS,
    (Opcode.DCP_STREAM_REQ, True): (("rollback_seqno", "rollback_seqno"),),
    (Opcode.DCP_BUFFER_ACKNOWLEDGEMENT, False): (("buffer_bytes", "buffer_bytes"),),
    (Opcode.DCP_BUFFER_ACKNOWLEDGEMENT, True): (("buffer_bytes", "buffer_bytes"),),
}


def dcp_values(opcode: int, response: bool, ext: Mapping[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
    """The DCP columns of one frame from its decoded extras and body.

    ``seqno`` is the field :data:`~dcpinspect.protocol.session.SEQNO_FIELD`
    names, ``rev_seqno`` any extras field of that name, ``failover_entries``
    the length of a response's failover log; the rest are in
    :data:`FIELD_COLUMNS`.  ``ext`` values may be arrays (one group of frames
    at once); a column that does not apply is absent.  ``opcode`` is -1 for
    the UPR draft.
    """
    out: dict[str, Any] = {}
    seq = SEQNO_FIELD.get(opcode)
    if seq is not None and seq in ext:
        out["seqno"] = ext[seq]
    if "rev_seqno" in ext:
        out["rev_seqno"] = ext["rev_seqno"]
    for column, name in FIELD_COLUMNS.get((opcode, response), ()):
        value = ext[name] if name in ext else body.get(name)
        if value is not None:
            out[column] = value
    log = body.get("failover_log")
    if isinstance(log, list) and response:
        out["failover_entries"] = len(log)
    return out


_JSON = int(Datatype.JSON)


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
        c["capture_set"].append(rec.capture_set)
        c["set_frame"].append(rec.number - rec.set_base)
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
            for name in FRAME_VALUE_COLUMNS[:-1]:
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
            alt = h[0] in ALT_MAGICS
            sections = ((h[2] >> 8) + (h[2] & 0xFF) if alt else h[2]) + h[3]
            c["body_length"].append(h[6])
            c["value_length"].append(h[6] - sections)
            if h[4] & _JSON and h[6] > sections:
                c["json_check"].append(JSON_INVALID if any(_NOT_JSON in p.message for p in d.problems) else JSON_VALID)
            else:
                c["json_check"].append(None)
        else:
            c["body_length"].append(h[3])
            c["value_length"].append(None)
            c["json_check"].append(None)
        c["problems"].append([p.message for p in d.problems])

    def extend(self, records: Iterable[Record]) -> FrameColumns:
        """Append many records."""
        for r in records:
            self.add(r)
        return self


def _status_name(status: int) -> str:
    return STATUS.get(status, f"unknown 0x{status:04x}")
