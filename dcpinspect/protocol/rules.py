"""Protocol rules as pure functions of numbers: used by the producer, the consumer and the timeline alike.

1. :func:`rollback_decision` is the producer's check of a stream request against
   its failover table (kv_engine ``FailoverTable::needsRollback``).
2. :func:`flow_control_size` is what a producer charges a message to the
   consumer's flow-control buffer.
3. ``MAX_SEQNO`` is the largest seqno (an open-ended stream's end).
4. :func:`from_latest` is the producer's rewrite of a FromLatest stream
   request before that check, and :func:`client_purge_seqno` how it reads the
   ``purge_seqno`` of a stream request's value.
5. ``STREAM_ID_MESSAGES`` are the stream messages that carry the stream-id
   frame on a connection with stream ids.
6. ``KEY_SPACES`` and ``DUPLICATES_ALLOWED`` are the dedup rule: within one
   snapshot a key appears once per key space, unless its marker carries one
   of those flags.
7. ``REPLIES`` says, per DCP opcode, whether the receiver of the request
   answers it: most stream messages are never answered on success.

>>> rollback_decision(start=3, snap_start=1, snap_end=4, vb_uuid=1111, failover_log=[(2222, 3), (1111, 0)], high_seqno=10, purge_seqno=0)
RollbackDecision(rollback=True, seqno=1, reason='history diverged at seqno 3 (uuid 0x0000000000000457 superseded); rollback to min(upper=3, snap_start=1)')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .enums import Opcode, SnapshotFlag, StreamReqFlag
from .session import REQUEST_MAGICS as _REQUESTS
from .session import STREAM_MESSAGES
from .spec import HEADER_SIZE

__all__ = [
    "DUPLICATES_ALLOWED",
    "KEY_SPACES",
    "MAX_SEQNO",
    "REPLIES",
    "STREAM_ID_MESSAGES",
    "RollbackDecision",
    "client_purge_seqno",
    "flow_control_size",
    "from_latest",
    "rollback_decision",
]

MAX_SEQNO = 2**64 - 1

_PREPARE, _CACHE_TRANSFER_END = int(Opcode.DCP_PREPARE), int(Opcode.DCP_CACHE_TRANSFER_END)

#: the stream messages that carry the stream-id frame (``22 hi lo``) when the connection enabled stream ids: not
#: DCP_SET_VBUCKET_STATE (kv_engine engines/ep/src/dcp/response.h ``SetVBucketState``: no sid), nor the sync-write
#: messages (a connection has stream ids or sync writes, never both)
STREAM_ID_MESSAGES: frozenset[int] = frozenset(
    STREAM_MESSAGES - {int(op) for op in (Opcode.DCP_SET_VBUCKET_STATE, Opcode.DCP_PREPARE, Opcode.DCP_COMMIT, Opcode.DCP_ABORT)}
)


#: item opcode -> its key space within a snapshot: kv_engine keeps committed items and prepares apart (a checkpoint's
#: committed and prepared key indexes, engines/ep/src/checkpoint.cc ``queueDirty``; a disk snapshot's two namespaces),
#: so a key may appear once in each; a commit over an item of the same key opens a new checkpoint (a new snapshot)
KEY_SPACES: Mapping[int, int] = {
    **dict.fromkeys((int(op) for op in (Opcode.DCP_MUTATION, Opcode.DCP_DELETION, Opcode.DCP_EXPIRATION, Opcode.DCP_COMMIT)), 0),
    **dict.fromkeys((int(op) for op in (Opcode.DCP_PREPARE, Opcode.DCP_ABORT)), 1),
}
#: marker flags under which a snapshot may deliver a key more than once (change streams: History, MayContainDuplicates)
DUPLICATES_ALLOWED = int(SnapshotFlag.HISTORY | SnapshotFlag.MAY_CONTAIN_DUPLICATES)


def flow_control_size(magic: int, opcode: int, length: int) -> int:
    """Bytes a producer charges to the flow-control buffer for one message of ``length`` bytes (header included).

    The full length for every stream message (markers, items, system events,
    seqno-advanced, OSO, stream-end, set-vbucket-state, cache transfer), plus 2
    for a DCP_PREPARE (MB-46634); a DCP_CACHE_TRANSFER_END is charged its 24
    header bytes even when it carries a stream id (kv_engine
    engines/ep/src/dcp/response.h ``CacheTransferToActiveStreamResponse``);
    0 for noops, responses and anything else.
    """
    if magic not in _REQUESTS or opcode not in STREAM_MESSAGES:
        return 0
    if opcode == _PREPARE:
        return length + 2
    return HEADER_SIZE if opcode == _CACHE_TRANSFER_END else length


def client_purge_seqno(value: Any) -> int | None:
    """The ``purge_seqno`` a producer reads from a stream request's JSON value (``None``: none given, or one it refuses).

    kv_engine (engines/ep/src/collections/vbucket_filter.cc) takes it only as a
    string and reads it with ``std::stoull``: leading blanks, an optional sign
    and the leading digits (a minus wraps round); a number is refused (EINVAL).

    >>> client_purge_seqno({"purge_seqno": "23"}), client_purge_seqno({"purge_seqno": 23}), client_purge_seqno({})
    (23, None, None)
    """
    raw = value.get("purge_seqno") if isinstance(value, dict) else None
    if not isinstance(raw, str):
        return None
    text = raw.lstrip(" \t\n\v\f\r")
    sign = text[:1] if text[:1] in ("+", "-") else ""
    digits = text[len(sign) :]
    n = len(digits) - len(digits.lstrip("0123456789"))
    if n == 0:
        return None
    seqno = int(digits[:n])
    if seqno > MAX_SEQNO:
        return None  # out of range: std::stoull throws
    return (-seqno) % (MAX_SEQNO + 1) if sign == "-" else seqno


def from_latest(
    *, flags: int, start: int, snap_start: int, snap_end: int, vb_uuid: int, high_seqno: int, latest_uuid: int
) -> tuple[int, int, int, int]:
    """(start, snap_start, snap_end, vb_uuid) as the producer checks a stream request: FromLatest rewritten.

    With flag 0x40 FromLatest the start and the snapshot become the vbucket's
    high seqno, and a uuid of 0 the newest failover entry's (kv_engine
    engines/ep/src/dcp/producer.cc ``streamRequest``, before the rollback check).

    >>> from_latest(flags=0x40, start=0, snap_start=0, snap_end=0, vb_uuid=0, high_seqno=9, latest_uuid=7)
    (9, 9, 9, 7)
    """
    if not flags & StreamReqFlag.FROM_LATEST:
        return start, snap_start, snap_end, vb_uuid
    return high_seqno, high_seqno, high_seqno, vb_uuid or latest_uuid


@dataclass(frozen=True, slots=True)
class RollbackDecision:
    """Outcome of :func:`rollback_decision`: ``rollback`` and, if so, the seqno to roll back to."""

    rollback: bool
    seqno: int
    reason: str


def rollback_decision(
    *,
    start: int,
    snap_start: int,
    snap_end: int,
    vb_uuid: int,
    failover_log: Sequence[tuple[int, int]],
    high_seqno: int,
    purge_seqno: int,
    flags: int = 0,
    client_purge_seqno: int = 0,
    filtered_max_seqno: int | None = None,
) -> RollbackDecision:
    """The producer's rollback check for a stream request, step by step as kv_engine's ``FailoverTable::needsRollback`` takes it (REFERENCE.md, "rollback").

    Args:
        start: the request's start seqno S.
        snap_start: the request's snapshot start SS.
        snap_end: the request's snapshot end SE.
        vb_uuid: the request's vbucket UUID U.
        failover_log: the producer's failover table, newest entry first, as ``(uuid, seqno)``.
        high_seqno: the vbucket's high seqno H.
        purge_seqno: the vbucket's purge seqno P (treated as 0 with flag 0x80 IgnorePurgedTombstones).
        flags: the stream-request flags (0x20 StrictVbUuid, 0x80 IgnorePurgedTombstones matter).
        client_purge_seqno: P_c, the ``purge_seqno`` of the request's JSON value (0 if absent).
        filtered_max_seqno: M, the highest seqno of the filtered collections for a
            collection-filtered stream; ``None`` for an unfiltered stream.

    Returns:
        ``RollbackDecision(False, 0, why)`` or ``RollbackDecision(True, seqno, why)``;
        the end seqno plays no part in the decision (ERANGE checks come after it).
    """
    strict = bool(flags & StreamReqFlag.STRICT_VB_UUID)
    p = 0 if flags & StreamReqFlag.IGNORE_PURGED_TOMBSTONES else purge_seqno
    s, ss, se, u = start, snap_start, snap_end, vb_uuid
    upper = high_seqno  # step 1
    if s == 0 and (not strict or u == 0):  # step 2
        return RollbackDecision(False, 0, "start seqno 0: nothing to roll back")
    if s < p and s != 0 and client_purge_seqno != p:  # step 3
        m = filtered_max_seqno
        if not (m is not None and m <= s < p and m <= p):
            return RollbackDecision(True, 0, f"purge seqno {p} greater than start seqno {s}")
    # step 4: oldest -> newest
    oldest_first = list(reversed(failover_log))
    for i, (uuid, _seqno) in enumerate(oldest_first):
        if uuid == u:
            if i + 1 < len(oldest_first):
                upper = oldest_first[i + 1][1]
            break
    else:
        return RollbackDecision(True, 0, f"vb uuid 0x{u:016x} not in the failover log: no common history")
    if s == ss:  # step 5
        se = s
    if se <= upper:  # step 6
        return RollbackDecision(False, 0, f"snapshot end {se} <= {upper}: history in common")
    if s == se:  # step 7
        ss = s
    seqno = upper if upper < ss else ss  # step 8
    if upper == high_seqno and oldest_first[-1][0] == u:  # the newest branch: the producer has less than the client
        why = f"snapshot end {se} beyond the high seqno {upper} of the newest branch (uuid 0x{u:016x})"
    else:
        why = f"history diverged at seqno {upper} (uuid 0x{u:016x} superseded)"
    return RollbackDecision(True, seqno, f"{why}; rollback to min(upper={upper}, snap_start={ss})")


# --- replies: whether the receiver answers each DCP request -------------------------------------------------------

#: DCP opcode -> whether the receiver of the request answers it with a response (magic 0x81), in words (kv_engine's
#: docs/dcp/documentation/commands/*.md, daemon/mcbp_validators.cc).  "errors only": nothing on success; the command's
#: doc says the receiver answers a failure.  The producer's stream messages are not answered, except a marker with the
#: Ack flag (takeover), DCP_SET_VBUCKET_STATE (the producer waits for it) and DCP_NOOP (the reply is mandatory).
REPLIES: Mapping[Opcode, str] = {
    Opcode.DCP_OPEN: "yes, status only",
    Opcode.DCP_ADD_STREAM: "yes, with the stream's opaque in its extras",
    Opcode.DCP_CLOSE_STREAM: "yes, status only",
    Opcode.DCP_STREAM_REQ: "yes: the failover log, or the rollback seqno",
    Opcode.DCP_GET_FAILOVER_LOG: "yes: the failover log",
    Opcode.DCP_STREAM_END: "no (errors only)",
    Opcode.DCP_SNAPSHOT_MARKER: "only if the Ack flag is set",
    Opcode.DCP_MUTATION: "no (errors only)",
    Opcode.DCP_DELETION: "no",
    Opcode.DCP_EXPIRATION: "no",
    Opcode.DCP_FLUSH: "never sent (obsolete since 3.0)",
    Opcode.DCP_SET_VBUCKET_STATE: "yes (the producer waits for it)",
    Opcode.DCP_NOOP: "yes, mandatory",
    Opcode.DCP_BUFFER_ACKNOWLEDGEMENT: "no",
    Opcode.DCP_CONTROL: "yes, status only",
    Opcode.DCP_SYSTEM_EVENT: "no",
    Opcode.DCP_PREPARE: "no",
    Opcode.DCP_SEQNO_ACKNOWLEDGED: "no (errors only)",
    Opcode.DCP_COMMIT: "no",
    Opcode.DCP_ABORT: "no",
    Opcode.DCP_SEQNO_ADVANCED: "no",
    Opcode.DCP_OSO_SNAPSHOT: "no",
    Opcode.DCP_CACHE_TRANSFER: "no",
    Opcode.DCP_CACHE_TRANSFER_END: "no",
}
