"""The frames a simulated producer streams: snapshot markers and items as the connection's negotiation shapes them.

:mod:`.producer_streams` decides *which* history items a stream sends and
when; this module says what each looks like on the wire, given a
:class:`StreamFormat` (what the connection negotiated, taken once per snapshot):

1. Keys carry a collection id only with HELLO Collections.
2. Values: none with DCP_OPEN NoValue, none but the datatype with
   NoValueWithUnderlyingDatatype, snappy-compressed with
   ``force_value_compression``.
3. A committed sync write is a DCP_COMMIT with ``enable_sync_writes``, else a plain
   mutation or deletion; an expiry is DCP_EXPIRATION only with
   ``enable_expiry_opcode`` *and* IncludeDeleteTimes, and a deletion is v2 with
   IncludeDeleteTimes.
4. A snapshot marker's encoding follows from the optional fields the server fills
   for *that* marker (kv_engine ``DcpSnapshotMarker::encode``, active_stream.cc):
   the max visible seqno with full sync replication (``enable_sync_writes`` +
   ``consumer_name``), the high completed seqno on disk markers with full sync
   replication, the purge seqno on disk markers after ``max_marker_version=2.2``,
   the high prepared seqno on disk markers with both.  A purge or high prepared
   seqno makes it v2.2, else a max visible or high completed seqno v2.0, else v1.
5. System events are flatbuffers (version 2) with ``flatbuffers_system_events``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..protocol.enums import Datatype, MarkerVersion, OpenFlag, SystemEvent
from ..protocol.session import control_on
from ..wire.encode import encode
from .cluster import HistoryItem, VBucket

__all__ = ["StreamFormat", "item_frame", "item_note", "marker_frame", "snappy_compress"]

_SNAPPY = int(Datatype.SNAPPY)


@dataclass(frozen=True, slots=True)
class StreamFormat:
    """What shapes a connection's stream frames (taken from its negotiation)."""

    collections: bool
    #: ``enable_sync_writes``: prepares, commits and aborts are streamed
    sync_writes: bool
    #: ``enable_sync_writes`` + ``consumer_name``: full sync replication (markers carry MVS/HCS)
    sync_replication: bool
    open_flags: int
    controls: dict[str, str]
    #: ``max_marker_version=2.2`` accepted: disk markers carry the purge seqno
    marker_v22: bool


def marker_frame(fmt: StreamFormat, vb: VBucket, start: int, end: int, flags: int, *, disk: bool, **common: Any) -> tuple[bytes, str]:
    """A DCP_SNAPSHOT_MARKER for [start, end] of ``vb``, and its version (``v1``, ``v2.0`` or ``v2.2``)."""
    mvs = hcs = hps = purge = None
    if fmt.sync_replication:
        mvs = vb.max_visible_seqno(end)  # system events count as visible
        if disk:
            hcs = max((r.prepared_seqno for r in vb.log if r.seqno <= end and r.kind in ("commit", "abort")), default=0)
            if fmt.marker_v22:
                hps = max((r.seqno for r in vb.log if r.seqno <= end and r.kind == "prepare"), default=0)
    if fmt.marker_v22 and disk:
        purge = vb.purge_seqno
    if purge is None and hps is None and mvs is None and hcs is None:
        return encode("DCP_SNAPSHOT_MARKER", extras={"start_seqno": start, "end_seqno": end, "flags": flags}, **common), "v1"
    value: dict[str, int] = {"start_seqno": start, "end_seqno": end, "flags": flags, "max_visible_seqno": mvs or 0}
    value["high_completed_seqno"] = hcs or 0
    if purge is None and hps is None:
        return encode("DCP_SNAPSHOT_MARKER", extras={"version": int(MarkerVersion.V2_0)}, value=value, **common), "v2.0"
    value["purge_seqno"] = purge or 0
    value["high_prepared_seqno"] = hps or 0
    return encode("DCP_SNAPSHOT_MARKER", extras={"version": int(MarkerVersion.V2_2)}, value=value, **common), "v2.2"


def item_frame(fmt: StreamFormat, r: HistoryItem, *, vbucket: int, opaque: int, sid: int | None) -> tuple[str, bytes]:
    """The frame of one history item, and its command name."""
    kind = r.kind
    if kind == "commit" and not fmt.sync_writes:
        kind = "deletion" if r.deleted else "mutation"  # committed sync writes arrive as plain items
    common: dict[str, Any] = {"vbucket": vbucket, "opaque": opaque, "key": r.key, "cid": r.cid if fmt.collections else None}
    return _ITEM_FRAMES[kind](fmt, r, sid, common)


def item_note(opcode: str, r: HistoryItem) -> tuple[str, dict[str, Any]]:
    """The journal entry of an item: opcode name, seqno, key (system events: the event id)."""
    fields: dict[str, Any] = {"opcode": opcode, "seqno": r.seqno, "key": r.key.decode("utf-8", "replace")}
    if r.kind == "system":
        fields["system_event"] = r.event
    return ("item", fields)


def snappy_compress(data: bytes) -> bytes:
    """A valid snappy block made of literals only (stdlib; compression ratio ~1)."""
    out = bytearray()
    n = len(data)
    while True:  # varint uncompressed length
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            break
    for i in range(0, len(data), 65536):
        chunk = data[i : i + 65536]
        m = len(chunk) - 1
        if m < 60:
            out.append(m << 2)
        elif m < 256:
            out += bytes((60 << 2, m))
        else:
            out += bytes((61 << 2,)) + m.to_bytes(2, "little")
        out += chunk
    return bytes(out)


def _payload(fmt: StreamFormat, r: HistoryItem) -> tuple[bytes, int]:
    if fmt.open_flags & OpenFlag.NO_VALUE:
        return b"", 0
    if fmt.open_flags & OpenFlag.NO_VALUE_WITH_UNDERLYING_DATATYPE:
        return b"", r.datatype
    if r.value and control_on("force_value_compression", fmt.controls):
        return snappy_compress(r.value), r.datatype | _SNAPPY
    return r.value, r.datatype


def _mutation(fmt: StreamFormat, r: HistoryItem, sid: int | None, common: dict[str, Any]) -> tuple[str, bytes]:
    value, dt = _payload(fmt, r)
    extras = {"by_seqno": r.seqno, "rev_seqno": r.rev_seqno, "flags": r.flags, "expiration": r.expiration}
    return "DCP_MUTATION", encode("DCP_MUTATION", extras=extras, value=value, datatype=dt, cas=r.cas, stream_id=sid, **common)


def _deletion(fmt: StreamFormat, r: HistoryItem, sid: int | None, common: dict[str, Any]) -> tuple[str, bytes]:
    """DCP_EXPIRATION (asked for, with delete times), DCP_DELETION v2 (delete times) or v1."""
    delete_times = bool(fmt.open_flags & OpenFlag.INCLUDE_DELETE_TIMES)
    extras = {"by_seqno": r.seqno, "rev_seqno": r.rev_seqno}
    if r.kind == "expiration" and control_on("enable_expiry_opcode", fmt.controls) and delete_times:
        extras["delete_time"] = r.delete_time
        return "DCP_EXPIRATION", encode("DCP_EXPIRATION", extras=extras, cas=r.cas, stream_id=sid, **common)
    if delete_times:
        extras["delete_time"] = r.delete_time
        return "DCP_DELETION", encode("DCP_DELETION", variant="v2", extras=extras, cas=r.cas, stream_id=sid, **common)
    return "DCP_DELETION", encode("DCP_DELETION", variant="v1", extras=extras, cas=r.cas, stream_id=sid, **common)


def _prepare(fmt: StreamFormat, r: HistoryItem, sid: int | None, common: dict[str, Any]) -> tuple[str, bytes]:
    del sid  # sync writes and stream ids exclude each other
    value, dt = _payload(fmt, r)
    extras = {
        "by_seqno": r.seqno,
        "rev_seqno": r.rev_seqno,
        "flags": r.flags,
        "expiration": r.expiration,
        "deleted": int(r.deleted),
        "durability_level": r.durability,
    }
    return "DCP_PREPARE", encode("DCP_PREPARE", extras=extras, value=value, datatype=dt, cas=r.cas, **common)


def _commit(fmt: StreamFormat, r: HistoryItem, sid: int | None, common: dict[str, Any]) -> tuple[str, bytes]:
    del fmt, sid
    return "DCP_COMMIT", encode("DCP_COMMIT", extras={"prepared_seqno": r.prepared_seqno, "commit_seqno": r.seqno}, **common)


def _abort(fmt: StreamFormat, r: HistoryItem, sid: int | None, common: dict[str, Any]) -> tuple[str, bytes]:
    del fmt, sid
    return "DCP_ABORT", encode("DCP_ABORT", extras={"prepared_seqno": r.prepared_seqno, "abort_seqno": r.seqno}, **common)


def _system_event(fmt: StreamFormat, r: HistoryItem, sid: int | None, common: dict[str, Any]) -> tuple[str, bytes]:
    """A collection or scope event: flatbuffers (version 2) if asked for, else the JSON-era layouts (key: the name)."""
    fb = control_on("flatbuffers_system_events", fmt.controls)
    version = 2 if fb else (1 if r.event == SystemEvent.BEGIN_COLLECTION and r.max_ttl is not None else 0)
    extras = {"by_seqno": r.seqno, "event": r.event, "version": version}
    value, key = _system_event_value(r, fb)
    raw = encode("DCP_SYSTEM_EVENT", extras=extras, key=key, value=value, vbucket=common["vbucket"], opaque=common["opaque"], stream_id=sid)
    return "DCP_SYSTEM_EVENT", raw


def _system_event_value(r: HistoryItem, fb: bool) -> tuple[dict[str, Any], bytes]:
    """A system event's value (flatbuffers fields or the JSON-era ones) and key (the name; none for drops)."""
    ids = {"uid": r.manifest_uid, "scopeId": r.scope_id} if fb else {"manifest_uid": r.manifest_uid, "scope_id": r.scope_id}
    if r.event == SystemEvent.BEGIN_COLLECTION:
        if fb:
            name = r.key.decode()
            return {**ids, "collectionId": r.cid, "ttlValid": r.max_ttl is not None, "maxTtl": r.max_ttl or 0, "name": name}, r.key
        value = {**ids, "collection_id": r.cid}
        if r.max_ttl is not None:
            value["max_ttl"] = r.max_ttl
        return value, r.key
    if r.event == SystemEvent.END_COLLECTION:
        return {**ids, "collectionId" if fb else "collection_id": r.cid}, b""
    if r.event == SystemEvent.CREATE_SCOPE:
        return ({**ids, "name": r.key.decode()} if fb else ids), r.key
    return ids, b""  # DropScope


_ITEM_FRAMES: dict[str, Callable[[StreamFormat, HistoryItem, int | None, dict[str, Any]], tuple[str, bytes]]] = {
    "mutation": _mutation,
    "deletion": _deletion,
    "expiration": _deletion,
    "prepare": _prepare,
    "commit": _commit,
    "abort": _abort,
    "system": _system_event,
}
