"""Protocol rules as pure functions of numbers: used by the producer, the consumer and the timeline alike.

1. :func:`rollback_decision` is the producer's check of a stream request against
   its failover table (kv_engine ``FailoverTable::needsRollback``).
2. :func:`flow_control_size` is what a producer charges a message to the
   consumer's flow-control buffer.
3. ``MAX_SEQNO`` is the largest seqno (an open-ended stream's end).

>>> rollback_decision(start=3, snap_start=1, snap_end=4, vb_uuid=1111, failover_log=[(2222, 3), (1111, 0)], high_seqno=10, purge_seqno=0)
RollbackDecision(rollback=True, seqno=1, reason='history diverged at seqno 3 (uuid 1111 superseded); rollback to min(upper=3, snap_start=1)')
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .enums import Opcode, StreamReqFlag
from .session import REQUEST_MAGICS as _REQUESTS
from .session import STREAM_MESSAGES

__all__ = ["MAX_SEQNO", "RollbackDecision", "flow_control_size", "rollback_decision"]

MAX_SEQNO = 2**64 - 1

_PREPARE = int(Opcode.DCP_PREPARE)


def flow_control_size(magic: int, opcode: int, length: int) -> int:
    """Bytes a producer charges to the flow-control buffer for one message of ``length`` bytes (header included).

    The full length for every stream message (markers, items, system events,
    seqno-advanced, OSO, stream-end, set-vbucket-state, cache transfer), plus 2
    for a DCP_PREPARE (MB-46634); 0 for noops, responses and anything else.
    """
    if magic not in _REQUESTS or opcode not in STREAM_MESSAGES:
        return 0
    return length + 2 if opcode == _PREPARE else length


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
        return RollbackDecision(True, 0, f"vb uuid {u} not in the failover log: no common history")
    if s == ss:  # step 5
        se = s
    if se <= upper:  # step 6
        return RollbackDecision(False, 0, f"snapshot end {se} <= {upper}: history in common")
    if s == se:  # step 7
        ss = s
    seqno = upper if upper < ss else ss  # step 8
    why = "high seqno" if upper == high_seqno and oldest_first[-1][0] == u else "history diverged"
    return RollbackDecision(True, seqno, f"{why} at seqno {upper} (uuid {u} superseded); rollback to min(upper={upper}, snap_start={ss})")
