r"""A sans-IO DCP producer that behaves like a Couchbase data node (FACTS.md).

No sockets, no asyncio, no clock reads: bytes go in with :meth:`ProducerConnection.receive`,
bytes come out of :meth:`ProducerConnection.data_to_send`, time is passed in.
Frames are built only with :func:`dcpinspect.encode` and requests read only
with :class:`~dcpinspect.decoder.FrameDecoder` + :func:`dcpinspect.dissect`.

The data model: a :class:`Cluster` of :class:`Bucket` s, each with N
:class:`VBucket` s whose history is a list of :class:`Record` s in seqno order
(mutations, tombstones, sync-write prepares/commits/aborts, collection system
events), a failover table (newest first, §7.3) and a purge seqno.  The bucket's
methods are the scripted workload and the scenario controls (fail over a
vbucket, purge tombstones, drop a collection...); they may be called while
connections stream: each stream pulls from its vbucket on the next
:meth:`ProducerConnection.pump`.

>>> from dcpinspect import encode
>>> cluster = Cluster(seed=1)
>>> bucket = cluster.create_bucket("default", vbuckets=2, items=4)
>>> conn = ProducerConnection(cluster)
>>> conn.receive(encode("SASL_AUTH", key="PLAIN", value=b"\0Administrator\0password", opaque=1), now=0.0)
>>> conn.receive(encode("SELECT_BUCKET", key="default", opaque=2), now=0.0)
>>> conn.receive(encode("DCP_OPEN", key="demo", extras={"flags": 1}, opaque=3), now=0.0)
>>> conn.receive(encode("DCP_STREAM_REQ", extras={"end_seqno": 2**64 - 1}, opaque=4), now=0.0)
>>> from dcpinspect import decode
>>> [f.name for f in decode(conn.data_to_send())][-4:]
['DCP_STREAM_REQ', 'DCP_SNAPSHOT_MARKER', 'DCP_MUTATION', 'DCP_MUTATION']
>>> rollback_decision(start=3, snap_start=1, snap_end=4, vb_uuid=1111, failover_log=[(2222, 3), (1111, 0)], high_seqno=10, purge_seqno=0)
RollbackDecision(rollback=True, seqno=1, reason='history diverged at seqno 3 (uuid 1111 superseded); rollback to min(upper=3, snap_start=1)')
"""

from __future__ import annotations

import json
import random
import zlib
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import sasl, spec
from .decoder import FrameDecoder, Garbage
from .dissect import DissectContext, Dissection, dissect
from .encode import encode

__all__ = [
    "FOREVER",
    "MAX_FAILOVER_ENTRIES",
    "Bucket",
    "Cluster",
    "Manifest",
    "ProducerConnection",
    "Record",
    "RollbackDecision",
    "Stream",
    "VBucket",
    "rollback_decision",
    "vbucket_for_key",
]

FOREVER = 2**64 - 1
#: §7.3 max_failover_entries default
MAX_FAILOVER_ENTRIES = 25
#: §6.12 server noop opaques are a counter starting here
NOOP_OPAQUE_BASE = 10000001
#: §7.6 connection_manager_interval: the smallest noop interval the server accepts
CONNECTION_MANAGER_INTERVAL = 0.1
#: entries kept in Cluster.journal by default
JOURNAL_MAX = 200_000
#: §7.6 dcp_idle_timeout default (seconds without anything received -> disconnect, when noops are on)
DCP_IDLE_TIMEOUT = 360.0

VB_ACTIVE, VB_REPLICA, VB_PENDING, VB_DEAD = 1, 2, 3, 4
VB_STATE_NAMES = {"active": VB_ACTIVE, "replica": VB_REPLICA, "pending": VB_PENDING, "dead": VB_DEAD}

# status codes (§3)
OK, ENOENT, EEXISTS, EINVAL, NMVB, NO_BUCKET = 0x00, 0x01, 0x02, 0x04, 0x07, 0x08
AUTH_ERROR, AUTH_CONTINUE, ERANGE, ROLLBACK, EACCESS = 0x20, 0x21, 0x22, 0x23, 0x24
UNKNOWN_FRAME_INFO, UNKNOWN_COMMAND, NOT_SUPPORTED = 0x80, 0x81, 0x83
UNKNOWN_COLLECTION, UNKNOWN_SCOPE, STREAM_ID_INVALID = 0x88, 0x8C, 0x8D

# stream-end statuses (§6.6)
END_OK, END_CLOSED, END_STATE_CHANGED, END_DISCONNECTED, END_SLOW = 0, 1, 2, 3, 4
END_BACKFILL_FAIL, END_ROLLBACK, END_FILTER_EMPTY, END_LOST_PRIVILEGES = 5, 6, 7, 8

# stream-request flags (§6.4)
SR_TAKEOVER, SR_DISK_ONLY, SR_TO_LATEST, SR_NO_VALUE, SR_ACTIVE_VB_ONLY = 0x01, 0x02, 0x04, 0x08, 0x10
SR_STRICT_VB_UUID, SR_FROM_LATEST, SR_IGNORE_PURGED, SR_CACHE_TRANSFER = 0x20, 0x40, 0x80, 0x100
SR_KNOWN = 0x1FF

# DCP_OPEN flags (§6.1)
OPEN_PRODUCER, OPEN_XATTRS, OPEN_NO_VALUE, OPEN_DELETE_TIMES = 0x01, 0x04, 0x08, 0x20
OPEN_NO_VALUE_WITH_DATATYPE, OPEN_DELETED_USER_XATTRS, OPEN_SKIP_DELETES = 0x40, 0x100, 0x200
OPEN_INVALID = 0x02 | 0x10 | 0x80 | ~0x3FF

# snapshot marker flags (§6.7)
SNAP_MEMORY, SNAP_DISK, SNAP_CHECKPOINT = 0x01, 0x02, 0x04

# HELLO features the simulator accepts (§4.1), answered in the client's order
SUPPORTED_FEATURES = frozenset({0x03, 0x04, 0x06, 0x07, 0x08, 0x0A, 0x0B, 0x0C, 0x10, 0x11, 0x12})

#: JSON object of the error map (GET_ERROR_MAP), built from the status table
_ERROR_ATTRS = {0x00: ["success"], 0x20: ["auth"], 0x21: ["special-handling"], 0x23: ["special-handling"], 0x86: ["temp", "retry-later"]}


def vbucket_for_key(key: bytes, vbuckets: int) -> int:
    """The vbucket a key hashes to (CRC32 as the SDKs compute it)."""
    return ((zlib.crc32(key) >> 16) & 0x7FFF) % vbuckets


# ---------------------------------------------------------------------------
# §7.4 rollback decision


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
    """The producer's rollback check for a stream request, exactly as FACTS §7.4 states it.

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
    strict = bool(flags & SR_STRICT_VB_UUID)
    p = 0 if flags & SR_IGNORE_PURGED else purge_seqno
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


# ---------------------------------------------------------------------------
# data model


@dataclass(slots=True)
class Record:
    """One seqno of a vbucket's history.

    ``kind`` is ``mutation``, ``deletion``, ``expiration``, ``prepare``, ``commit``,
    ``abort`` or ``system``.  Commits carry the committed value and ``prepared_seqno``;
    system events carry ``event`` (§6.15 id), ``scope_id``, ``manifest_uid`` and the
    collection/scope name in ``key``.
    """

    seqno: int
    kind: str
    key: bytes
    cid: int = 0
    value: bytes = b""
    datatype: int = 0
    cas: int = 0
    rev_seqno: int = 1
    flags: int = 0
    expiration: int = 0
    delete_time: int = 0
    prepared_seqno: int = 0
    durability: int = 1
    deleted: bool = False
    event: int = 0
    scope_id: int = 0
    manifest_uid: int = 0
    max_ttl: int | None = None

    @property
    def dedup_key(self) -> tuple[Any, ...]:
        """Items sharing this key are deduplicated inside a snapshot (§7.2).

        Prepares/aborts live in the prepared namespace, everything else in the
        committed one; system events are never deduplicated.
        """
        if self.kind == "system":
            return ("system", self.seqno)
        return ("prepared" if self.kind in ("prepare", "abort") else "committed", self.cid, self.key)

    @property
    def is_tombstone(self) -> bool:
        """Deletions, expirations, aborts and deleted commits (what compaction purges)."""
        return self.kind in ("deletion", "expiration", "abort") or (self.kind == "commit" and self.deleted)


@dataclass
class Manifest:
    """The bucket's scopes and collections (ids 0-7 reserved, 0 = ``_default``)."""

    uid: int = 0
    scopes: dict[int, str] = field(default_factory=lambda: {0: "_default"})
    collections: dict[int, tuple[str, int, int | None]] = field(default_factory=lambda: {0: ("_default", 0, None)})
    next_id: int = 8

    def collection_id(self, name: str) -> int:
        """The id of a collection by name (``scope.collection`` or a bare name), or KeyError."""
        scope, _, coll = name.rpartition(".")
        for cid, (cname, sid, _ttl) in self.collections.items():
            if cname == coll and (not scope or self.scopes.get(sid) == scope):
                return cid
        raise KeyError(name)

    def scope_id(self, name: str) -> int:
        """The id of a scope by name, or KeyError."""
        for sid, sname in self.scopes.items():
            if sname == name:
                return sid
        raise KeyError(name)


@dataclass
class VBucket:
    """One vbucket: state, history, failover table (newest first), purge seqno."""

    id: int
    state: int = VB_ACTIVE
    failover_log: list[tuple[int, int]] = field(default_factory=list)
    log: list[Record] = field(default_factory=list)
    purge_seqno: int = 0
    #: bumped whenever live streams must end (failover, rollback, state change)
    generation: int = 0
    #: the last seqno assigned (kept apart from the log: purged tombstones keep their seqno)
    high_seqno: int = 0

    @property
    def uuid(self) -> int:
        """The newest failover entry's UUID."""
        return self.failover_log[0][0]

    def add_failover_entry(self, uuid: int, seqno: int) -> None:
        """New branch: drop entries above ``seqno``, put it first, cap at 25 (§7.3)."""
        kept = [(u, s) for u, s in self.failover_log if s <= seqno]
        self.failover_log = [(uuid, seqno), *kept][:MAX_FAILOVER_ENTRIES]

    def records(self, lo: int, hi: int) -> list[Record]:
        """Records with lo < seqno <= hi, in seqno order."""
        return [r for r in self.log if lo < r.seqno <= hi]

    def collection_high_seqno(self, cids: Iterable[int]) -> int:
        """The highest seqno touching any of these collections (documents and their system events)."""
        want = set(cids)
        return max((r.seqno for r in self.log if r.cid in want), default=0)


class Bucket:
    """A bucket: vbuckets, the collections manifest, and the workload/scenario methods."""

    def __init__(self, cluster: Cluster, name: str, vbuckets: int) -> None:
        self.cluster = cluster
        self.name = name
        self.manifest = Manifest()
        self.vbuckets = [VBucket(i) for i in range(vbuckets)]
        for vb in self.vbuckets:
            vb.add_failover_entry(cluster.new_uuid(), 0)
            cluster.note("vbucket_created", bucket=name, vb=vb.id, uuid=vb.uuid, seqno=0)
        self._values: dict[tuple[int, bytes], int] = {}  # rev seqno per document

    def __repr__(self) -> str:
        return f"Bucket({self.name!r}, vbuckets={len(self.vbuckets)})"

    # --- workload ---------------------------------------------------------------
    def vbucket_of(self, key: bytes | str) -> VBucket:
        """The vbucket a key lives in."""
        k = key.encode() if isinstance(key, str) else key
        return self.vbuckets[vbucket_for_key(k, len(self.vbuckets))]

    def _cid(self, collection: str | int) -> int:
        cid = collection if isinstance(collection, int) else self.manifest.collection_id(collection)
        if cid not in self.manifest.collections:
            raise KeyError(f"unknown collection {collection!r}")
        return cid

    def _append(self, vb: VBucket, rec: Record) -> Record:
        if vb.state != VB_ACTIVE:
            raise ValueError(f"vbucket {vb.id} is not active")
        rec.seqno = vb.high_seqno = vb.high_seqno + 1
        rec.cas = self.cluster.next_cas()
        if rec.kind != "system":
            dk = (rec.cid, rec.key)
            rev = self._values.get(dk, 0) + (0 if rec.kind in ("prepare", "abort") else 1)
            self._values[dk] = rev
            rec.rev_seqno = max(rev, 1)
        vb.log.append(rec)
        return rec

    def mutate(self, key: bytes | str, value: Any = None, *, collection: str | int = 0, flags: int = 0, expiration: int = 0) -> Record:
        """Store a document (a dict/list/number is JSON-encoded with the JSON datatype)."""
        k = key.encode() if isinstance(key, str) else key
        raw, dt = _value(value if value is not None else {"key": k.decode("utf-8", "replace")})
        return self._append(
            self.vbucket_of(k), Record(0, "mutation", k, self._cid(collection), raw, dt, flags=flags, expiration=expiration)
        )

    def delete(self, key: bytes | str, *, collection: str | int = 0, delete_time: int = 0) -> Record:
        """Delete a document (a tombstone)."""
        k = key.encode() if isinstance(key, str) else key
        return self._append(self.vbucket_of(k), Record(0, "deletion", k, self._cid(collection), delete_time=delete_time))

    def expire(self, key: bytes | str, *, collection: str | int = 0, delete_time: int = 0) -> Record:
        """Expire a document (an expiration tombstone)."""
        k = key.encode() if isinstance(key, str) else key
        return self._append(self.vbucket_of(k), Record(0, "expiration", k, self._cid(collection), delete_time=delete_time))

    def prepare(self, key: bytes | str, value: Any = None, *, collection: str | int = 0, level: int = 1, delete: bool = False) -> Record:
        """A sync-write prepare (durability level 1..3)."""
        k = key.encode() if isinstance(key, str) else key
        raw, dt = (b"", 0) if delete else _value(value if value is not None else {"key": k.decode("utf-8", "replace")})
        return self._append(self.vbucket_of(k), Record(0, "prepare", k, self._cid(collection), raw, dt, durability=level, deleted=delete))

    def _pending_prepare(self, vb: VBucket, cid: int, key: bytes) -> Record:
        for rec in reversed(vb.log):
            if rec.cid == cid and rec.key == key and rec.kind in ("prepare", "commit", "abort"):
                if rec.kind == "prepare":
                    return rec
                break
        raise ValueError(f"no pending prepare for {key!r}")

    def commit(self, key: bytes | str, *, collection: str | int = 0) -> Record:
        """Commit the pending prepare of a key."""
        k = key.encode() if isinstance(key, str) else key
        vb, cid = self.vbucket_of(k), self._cid(collection)
        p = self._pending_prepare(vb, cid, k)
        return self._append(vb, Record(0, "commit", k, cid, p.value, p.datatype, prepared_seqno=p.seqno, deleted=p.deleted))

    def abort(self, key: bytes | str, *, collection: str | int = 0) -> Record:
        """Abort the pending prepare of a key."""
        k = key.encode() if isinstance(key, str) else key
        vb, cid = self.vbucket_of(k), self._cid(collection)
        p = self._pending_prepare(vb, cid, k)
        return self._append(vb, Record(0, "abort", k, cid, prepared_seqno=p.seqno))

    def load(self, items: int, *, prefix: str = "doc-", collection: str | int = 0) -> None:
        """``items`` documents ``prefix0000``... spread over the vbuckets by key hash."""
        for i in range(items):
            self.mutate(f"{prefix}{i:04d}", {"id": i, "name": f"{prefix}{i:04d}", "rev": 1}, collection=collection)

    # --- collections --------------------------------------------------------------
    def _system_event(self, rec_for: Any) -> None:
        for vb in self.vbuckets:
            if vb.state == VB_ACTIVE:
                self._append(vb, rec_for())

    def create_scope(self, name: str) -> int:
        """Create a scope (a CreateScope event in every active vbucket); returns its id."""
        m = self.manifest
        sid = m.next_id
        m.next_id += 1
        m.uid += 1
        m.scopes[sid] = name
        self._system_event(lambda: Record(0, "system", name.encode(), 0, event=3, scope_id=sid, manifest_uid=m.uid))
        self.cluster.note("scope_created", bucket=self.name, name=name, scope_id=sid, manifest_uid=m.uid, seqnos=self._seqnos())
        return sid

    def create_collection(self, name: str, *, scope: str = "_default", max_ttl: int | None = None) -> int:
        """Create a collection (a BeginCollection event in every active vbucket); returns its id."""
        m = self.manifest
        sid = m.scope_id(scope)
        cid = m.next_id
        m.next_id += 1
        m.uid += 1
        m.collections[cid] = (name, sid, max_ttl)
        self._system_event(lambda: Record(0, "system", name.encode(), cid, event=0, scope_id=sid, manifest_uid=m.uid, max_ttl=max_ttl))
        self.cluster.note(
            "collection_created", bucket=self.name, name=name, cid=cid, scope_id=sid, manifest_uid=m.uid, seqnos=self._seqnos()
        )
        return cid

    def drop_collection(self, name: str | int) -> int:
        """Drop a collection (an EndCollection event; its documents disappear from backfills)."""
        m = self.manifest
        cid = self._cid(name)
        _cname, sid, _ttl = m.collections.pop(cid)
        m.uid += 1
        self._system_event(lambda: Record(0, "system", b"", cid, event=1, scope_id=sid, manifest_uid=m.uid))
        self.cluster.note(
            "collection_dropped", bucket=self.name, name=_cname, cid=cid, scope_id=sid, manifest_uid=m.uid, seqnos=self._seqnos()
        )
        return cid

    def _seqnos(self) -> dict[int, int]:
        """The high seqno of each active vbucket (what a collection change just wrote)."""
        return {vb.id: vb.high_seqno for vb in self.vbuckets if vb.state == VB_ACTIVE}

    # --- scenario controls ---------------------------------------------------------
    def failover(self, vbucket: int, *, lose: int = 0) -> int:
        """Fail a vbucket over: the last ``lose`` items are lost, then a new UUID at the new high seqno.

        Live streams of the vbucket end with StateChanged (§6.6: Rollback is sent as
        StateChanged); consumers that saw lost items get a rollback on re-request.
        Returns the new UUID.
        """
        vb = self.vbuckets[vbucket]
        if lose:
            vb.high_seqno = max(vb.high_seqno - lose, 0)
            vb.log = [r for r in vb.log if r.seqno <= vb.high_seqno]
        uuid = self.cluster.new_uuid()
        before = list(vb.failover_log)
        vb.add_failover_entry(uuid, vb.high_seqno)
        vb.state = VB_ACTIVE
        vb.generation += 1
        removed = [[u, s] for u, s in before if (u, s) not in vb.failover_log]
        self.cluster.note("failover", bucket=self.name, vb=vbucket, uuid=uuid, seqno=vb.high_seqno, lost=lose, removed=removed)
        return uuid

    def purge(self, vbucket: int, upto: int | None = None) -> int:
        """Compaction: purge tombstones with seqno <= ``upto`` (default: the high seqno); returns the purge seqno."""
        vb = self.vbuckets[vbucket]
        upto = vb.high_seqno if upto is None else min(upto, vb.high_seqno)
        vb.log = [r for r in vb.log if not (r.seqno <= upto and (r.is_tombstone or r.kind == "prepare"))]
        vb.purge_seqno = max(vb.purge_seqno, upto)
        self.cluster.note("purge", bucket=self.name, vb=vbucket, purge_seqno=vb.purge_seqno, high_seqno=vb.high_seqno)
        return vb.purge_seqno

    def set_state(self, vbucket: int, state: int | str) -> None:
        """Change a vbucket's state (1 active, 2 replica, 3 pending, 4 dead); live streams end (StateChanged)."""
        vb = self.vbuckets[vbucket]
        vb.state = VB_STATE_NAMES[state] if isinstance(state, str) else state
        vb.generation += 1
        self.cluster.note("set_state", bucket=self.name, vb=vbucket, state=vb.state)


def _value(value: Any) -> tuple[bytes, int]:
    if isinstance(value, bytes):
        return value, 0
    if isinstance(value, str):
        return value.encode(), 0
    return json.dumps(value, separators=(",", ":")).encode(), 0x01


class Cluster:
    """Buckets, users and the connections streaming from them; deterministic given ``seed``.

    Args:
        users: user name -> password.
        seed: seeds the vbucket UUIDs.
        idle_timeout: §7.6 dcp_idle_timeout (seconds without receiving anything, noops on).
        slow_after: seconds a flow-control window may stay full before the streams end Slow
            (``None``: never).
        checkpoint_items: seqnos per memory snapshot.
        max_batch: bytes one :meth:`ProducerConnection.pump` queues before yielding.
        output_limit: bytes of output a connection holds (produced, not yet taken with
            :meth:`ProducerConnection.data_to_send`) before it stops producing more: requests
            wait unhandled (:attr:`ProducerConnection.want_read` is false) and streams pause,
            flow control or not.  A client that never reads cannot grow a connection's output.
        journal_max: entries kept in :attr:`journal` (the oldest are dropped beyond it).

    :attr:`journal` is the simulator's own record of what it did (the ground truth a
    timeline built from a capture can be checked against): one dict per event, with
    ``event`` one of ``vbucket_created``, ``failover``, ``purge``, ``set_state``,
    ``scope_created``, ``collection_created``, ``collection_dropped`` (bucket-level),
    ``stream_request`` (``decision`` ``success`` / ``rollback`` / ``error`` with the
    ``rollback_seqno`` or ``status``), ``marker``, ``oso``, ``item`` (``opcode`` name and
    ``seqno``: documents, system events, sync writes, seqno-advanced),
    ``set_vbucket_state``, ``stream_end`` (wire ``status``), ``close_stream``,
    ``seqno_ack``, ``buffer_ack`` and ``flow_blocked`` (connection-level).  Stream entries carry the
    connection (``conn``: a serial number, ``name``: the DCP_OPEN name), ``vb`` and
    ``sid``, and are noted when the frame is sent, not when it is queued.
    """

    def __init__(
        self,
        users: Mapping[str, str] | None = None,
        *,
        seed: int = 0,
        idle_timeout: float = DCP_IDLE_TIMEOUT,
        slow_after: float | None = None,
        checkpoint_items: int = 50,
        max_batch: int = 1 << 20,
        output_limit: int = 1 << 20,
        journal_max: int = JOURNAL_MAX,
    ) -> None:
        self.journal: deque[dict[str, Any]] = deque(maxlen=journal_max)
        self._serial = 0
        self.users = dict(users if users is not None else {"Administrator": "password"})
        self.buckets: dict[str, Bucket] = {}
        self.idle_timeout = idle_timeout
        self.slow_after = slow_after
        self.checkpoint_items = checkpoint_items
        self.max_batch = max_batch
        self.output_limit = output_limit
        self.connections: list[ProducerConnection] = []
        self._rng = random.Random(seed)
        self._cas = 0x1700000000000000

    def __repr__(self) -> str:
        return f"Cluster(buckets={sorted(self.buckets)}, connections={len(self.connections)})"

    def note(self, event: str, **fields: Any) -> None:
        """Add an entry to :attr:`journal`."""
        self.journal.append({"event": event, **fields})

    def new_uuid(self) -> int:
        """A fresh vbucket UUID (never 0, §7.3)."""
        return self._rng.randrange(1, 2**64)

    def next_cas(self) -> int:
        """A fresh, increasing CAS."""
        self._cas += 1 << 16
        return self._cas

    def create_bucket(self, name: str = "default", *, vbuckets: int = 4, items: int = 0) -> Bucket:
        """Add a bucket with ``items`` documents in the default collection."""
        b = Bucket(self, name, vbuckets)
        self.buckets[name] = b
        b.load(items)
        return b

    def drop_connections(self, reason: str = "dropped by scenario") -> None:
        """Close every connection (the edge then closes the sockets)."""
        for c in list(self.connections):
            c.close(reason)


# ---------------------------------------------------------------------------
# streams


@dataclass
class Stream:
    """One DCP stream of a connection, keyed by (vbucket, sid)."""

    vb: int
    sid: int | None
    opaque: int
    flags: int
    start: int
    end: int
    generation: int
    #: ``None``: every collection; a set: the filter (legacy streams: ``{0}``)
    cids: frozenset[int] | None
    filtered: bool
    backfill_end: int
    last_queued: int = 0
    first_marker: bool = True
    #: (frame, flow-control size, kind, journal entry noted when it is sent)
    queue: deque[tuple[bytes, int, str, tuple[str, dict[str, Any]] | None]] = field(default_factory=deque)
    ended: bool = False
    end_status: int | None = None
    takeover: str = ""  # "", "pending" (waiting for ack 1), "active" (waiting for ack 2)
    last_sent_seqno: int = 0

    @property
    def key(self) -> tuple[int, int | None]:
        """(vbucket, sid)."""
        return (self.vb, self.sid)


def _snappy_compress(data: bytes) -> bytes:
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


# ---------------------------------------------------------------------------
# the connection


class ProducerConnection:
    """One client connection to the simulated data node (sans-IO).

    Feed it the client's bytes with :meth:`receive`; take its output with
    :meth:`data_to_send`; call :meth:`tick` periodically (noops, idle
    disconnect, slow-consumer stream ends).  Never raises on peer input:
    malformed requests get an error status, garbage closes the connection
    (:attr:`closed`, :attr:`close_reason`).
    """

    def __init__(self, cluster: Cluster, *, peer: str = "", now: float = 0.0) -> None:
        self.cluster = cluster
        self.peer = peer
        self._decoder = FrameDecoder()
        self._pending = bytearray()  # bytes fed to the decoder that are not yet in an event
        self._inbox: deque[Any] = deque()  # decoded client frames not yet handled (the output was backed up)
        self._out = bytearray()
        self.closed = False
        self.close_reason = ""
        self.features: list[int] = []
        self.agent = ""
        self.user: str | None = None
        self.bucket: Bucket | None = None
        self._scram: sasl.ScramServer | None = None
        self.dcp_name: str | None = None
        self.open_flags = 0
        self.controls: dict[str, str] = {}
        self.streams: dict[tuple[int, int | None], Stream] = {}
        self._rr = 0
        # noop / liveness (§7.6)
        self.noop_enabled = False
        self.noop_interval = 1.0  # choice: kv_engine's dcp_noop_tx_interval default (not in FACTS)
        self._noop_pending = False
        self._noop_sent_at = 0.0
        self._noop_opaque = NOOP_OPAQUE_BASE
        self.last_receive = now
        self.last_send = now
        # flow control (§7.5)
        self.buffer_size = 0
        self.bytes_outstanding = 0
        self._blocked_since: float | None = None
        # scenario controls
        self.paused_until = 0.0
        self.sent_frames = 0
        cluster._serial += 1
        self.serial = cluster._serial
        cluster.connections.append(self)

    def __repr__(self) -> str:
        return f"<ProducerConnection {self.dcp_name or self.peer or id(self)} streams={len(self.streams)} closed={self.closed}>"

    # --- negotiated context ----------------------------------------------------------
    @property
    def collections(self) -> bool:
        """HELLO Collections was accepted."""
        return spec.FEATURE_COLLECTIONS in self.features

    @property
    def sync_replication(self) -> bool:
        """``enable_sync_writes`` + ``consumer_name`` (§7.9)."""
        return self.controls.get("enable_sync_writes") == "true" and bool(self.controls.get("consumer_name"))

    @property
    def stream_ids(self) -> bool:
        """``enable_stream_id`` was accepted."""
        return self.controls.get("enable_stream_id") == "true"

    @property
    def context(self) -> DissectContext:
        """What this connection negotiated, for dissecting its frames."""
        return DissectContext(stream_ids=self.stream_ids).with_features(self.features).with_open_flags(self.open_flags)

    @property
    def marker_version(self) -> str:
        """``v1``, ``v2.0`` or ``v2.2`` (§6.7)."""
        if self.controls.get("max_marker_version") == "2.2":
            return "v2.2"
        return "v2.0" if self.sync_replication else "v1"

    # --- I/O -----------------------------------------------------------------------
    def data_to_send(self) -> bytes:
        """Everything produced since the last call."""
        out = bytes(self._out)
        self._out.clear()
        return out

    @property
    def want_write(self) -> bool:
        """:meth:`pump` has more to do: requests wait, or streams have messages it did not emit yet.

        (Held back by the batch or output limit, not by flow control.)
        """
        if self.closed:
            return False
        return bool(self._inbox) or (not self._window_full() and any(s.queue and not s.ended for s in self.streams.values()))

    @property
    def want_read(self) -> bool:
        """More client bytes are welcome: every request is handled and the output is below ``output_limit``.

        An edge that reads only then holds at most about that much per connection.
        """
        return not self.closed and not self._inbox and len(self._out) < self.cluster.output_limit

    @property
    def output_size(self) -> int:
        """Bytes produced and not yet taken with :meth:`data_to_send`."""
        return len(self._out)

    def close(self, reason: str) -> None:
        """Close the connection (no more output)."""
        if not self.closed:
            self.closed = True
            self.close_reason = reason
            self.streams.clear()
            self._inbox.clear()
        if self in self.cluster.connections:
            self.cluster.connections.remove(self)

    def _send(self, frame: bytes, now: float | None = None) -> None:
        self._out += frame
        self.sent_frames += 1
        if now is not None:
            self.last_send = now

    def _reply(self, d: Dissection, status: int = OK, *, now: float, **kw: Any) -> None:
        f = d.frame
        try:
            raw = encode(f.opcode, response=True, status=status, opaque=f.opaque, **kw)
        except Exception:  # never let a reply we cannot build escape: status only
            raw = encode(f.opcode, response=True, status=status, opaque=f.opaque)
        self._send(raw, now)

    def receive(self, data: bytes, now: float) -> None:
        """Feed bytes from the client; replies and stream data become available in :meth:`data_to_send`.

        Requests are handled in order while the output stays below the cluster's ``output_limit``;
        the rest wait (:attr:`want_read` false) for the next :meth:`pump` after the output was taken.
        """
        if self.closed:
            return
        self.last_receive = now
        self._pending += data
        events = self._decoder.feed(data)
        for ev in events:
            del self._pending[: ev.length]
        if self._pending and self._pending[0] not in spec.MAGICS:
            # the decoder holds garbage back until it resynchronises; the server drops the connection at once
            events.append(Garbage(0, bytes(self._pending[:1]), "invalid magic"))
        self._inbox.extend(events)
        self.pump(now)

    def _handle_inbox(self, now: float) -> None:
        """Handle received requests in order while the output is below the limit."""
        while self._inbox and not self.closed and len(self._out) < self.cluster.output_limit:
            ev = self._inbox.popleft()
            if ev.type != "frame":
                self.close(f"invalid data from the client ({ev.type})")
                return
            try:
                self._handle(dissect(ev, self.context), now)
            except Exception as exc:  # a bug here must not kill the server: drop the connection
                self.close(f"internal error handling {ev.name}: {type(exc).__name__}: {exc}")
                return

    def tick(self, now: float) -> None:
        """Time passes: noops (§7.6), idle disconnect, slow-consumer stream ends, then :meth:`pump`."""
        if self.closed:
            return
        if self.noop_enabled and now - self.last_receive > self.cluster.idle_timeout:
            self.close(f"no reply from the consumer for {self.cluster.idle_timeout:g} s (noop unanswered)")
            return
        if self.noop_enabled and not self._noop_pending and now - max(self.last_send, self._noop_sent_at) >= self.noop_interval:
            self._noop_opaque += 1
            self._send(encode("DCP_NOOP", opaque=self._noop_opaque - 1), now)
            self._noop_pending = True
            self._noop_sent_at = now
        slow = self.cluster.slow_after
        if self._blocked_since is not None and slow is not None and now - self._blocked_since >= slow:
            # choice: the consumer stalled with a full window; the cursor is dropped and the
            # STREAM_END(Slow) goes out past the full window, else it could never arrive (§6.6 status 4)
            for st in list(self.streams.values()):
                if not st.ended:
                    st.queue.clear()
                    frame, size = self._stream_end_frame(st, END_SLOW)
                    self._send(frame, now)
                    self._journal(st, ("stream_end", {"status": self._end_wire(END_SLOW), "reason": END_SLOW, "past_window": True}))
                    self.bytes_outstanding += size
                    self._finish(st)
            self._blocked_since = None
        self.pump(now)

    # --- request dispatch ---------------------------------------------------------------
    def _handle(self, d: Dissection, now: float) -> None:
        f = d.frame
        magic = f.magic
        if magic in (0x81, 0x18):
            self._handle_response(d, now)
            return
        if magic not in (0x80, 0x08):
            self.close(f"unexpected magic 0x{magic:02x} from the client")
            return
        if magic == 0x08:
            if 0x10 not in self.features and f.opcode != 0x52:
                self._reply(d, EINVAL, now=now)
                return
            ids = _frame_ids(f.framing)
            if ids is None or any(i not in spec.REQUEST_FRAME_INFOS for i in ids):
                self._reply(d, UNKNOWN_FRAME_INFO, now=now)
                return
        handler = _HANDLERS.get(f.opcode)
        if handler is None:
            self._reply(d, UNKNOWN_COMMAND, now=now)
            return
        if not _shape_ok(f):
            self._reply(d, EINVAL, now=now)
            return
        if f.opcode not in _PRE_AUTH and self.user is None:
            self._reply(d, EACCESS, now=now)  # choice: unauthenticated connections have no privileges
            return
        handler(self, d, now)

    def _handle_response(self, d: Dissection, now: float) -> None:
        op = d.frame.opcode
        if op == 0x5C and d.frame.opaque == self._noop_opaque - 1:
            self._noop_pending = False
        elif op == 0x5B:  # takeover ack (§7.9)
            for st in self.streams.values():
                if st.takeover and st.opaque == d.frame.opaque:
                    self._takeover_ack(st, now)
                    break

    # --- session -----------------------------------------------------------------
    def _hello(self, d: Dissection, now: float) -> None:
        self.agent = d.key_text
        wanted = [e["feature"] for e in d.body.get("features", [])]
        accepted: list[int] = []
        for code in wanted:
            if code in SUPPORTED_FEATURES and code not in accepted:
                accepted.append(code)
        self.features = accepted
        self._reply(d, value=[(c,) for c in accepted], now=now)

    def _list_mechs(self, d: Dissection, now: float) -> None:
        self._reply(d, value=" ".join(sasl.MECHANISMS), now=now)

    def _sasl_auth(self, d: Dissection, now: float) -> None:
        mech = d.key_text.upper()
        payload = d.frame.value
        self.user = None
        self._scram = None
        if mech == "PLAIN":
            user = sasl.check_plain(payload, self.cluster.users)
            if user is None:
                self._reply(d, AUTH_ERROR, now=now)
            else:
                self.user = user
                self._reply(d, now=now)
            return
        if mech not in sasl.SCRAM_HASHES:
            self._reply(d, AUTH_ERROR, now=now)
            return
        server = sasl.ScramServer(mech, self.cluster.users)
        try:
            first = server.first(payload)
        except sasl.SaslError:
            self._reply(d, AUTH_ERROR, now=now)
            return
        self._scram = server
        self._reply(d, AUTH_CONTINUE, value=first, now=now)

    def _sasl_step(self, d: Dissection, now: float) -> None:
        server, self._scram = self._scram, None
        if server is None or server.mech != d.key_text.upper():
            self._reply(d, EINVAL, now=now)
            return
        try:
            final = server.final(d.frame.value)
        except sasl.SaslError:
            self._reply(d, AUTH_ERROR, now=now)
            return
        self.user = server.user
        self._reply(d, value=final, now=now)

    def _error_map(self, d: Dissection, now: float) -> None:
        version = min(max(int(d.body.get("version", 1)), 1), 2)
        errors = {
            f"{code:x}": {"name": name, "desc": name, "attrs": _ERROR_ATTRS.get(code, ["internal"])} for code, name in spec.STATUS.items()
        }
        self._reply(d, value={"version": version, "revision": 1, "errors": errors}, now=now)

    def _select_bucket(self, d: Dissection, now: float) -> None:
        name = d.key_text
        if name == "@no bucket@":
            self.bucket = None
            self._reply(d, now=now)
        elif name in self.cluster.buckets:
            self.bucket = self.cluster.buckets[name]
            self._reply(d, now=now)
        else:
            self._reply(d, ENOENT, now=now)

    def _noop_kv(self, d: Dissection, now: float) -> None:
        self._reply(d, now=now)

    def _quit(self, d: Dissection, now: float) -> None:
        self._reply(d, now=now)
        self.close("client sent QUIT")

    def _need_bucket(self, d: Dissection, now: float) -> Bucket | None:
        if self.bucket is None:
            self._reply(d, NO_BUCKET, now=now)
        return self.bucket

    def _all_vb_seqnos(self, d: Dissection, now: float) -> None:
        b = self._need_bucket(d, now)
        if b is None:
            return
        state = int(d.extras.get("state", 0))
        cid = d.extras.get("collection_id")
        if state > 4 or (cid is not None and cid not in b.manifest.collections):
            self._reply(d, EINVAL if state > 4 else UNKNOWN_COLLECTION, now=now)
            return
        rows = []
        for vb in b.vbuckets:
            if (state == 0 and vb.state in (VB_ACTIVE, VB_REPLICA, VB_PENDING)) or vb.state == state:
                rows.append((vb.id, vb.high_seqno if cid is None else vb.collection_high_seqno([cid])))
        self._reply(d, value=rows, now=now)

    def _failover_log(self, d: Dissection, now: float) -> None:
        b = self._need_bucket(d, now)
        if b is None:
            return
        vbid = d.frame.vbucket or 0
        if vbid >= len(b.vbuckets) or b.vbuckets[vbid].state == VB_DEAD:
            self._reply(d, NMVB, now=now)
            return
        self._reply(d, value=list(b.vbuckets[vbid].failover_log), now=now)

    def _stat(self, d: Dissection, now: float) -> None:
        b = self._need_bucket(d, now)
        if b is None:
            return
        group, _, arg = d.key_text.partition(" ")
        vbs = b.vbuckets
        if arg:
            if not arg.isdigit() or int(arg) >= len(vbs):
                self._reply(d, NMVB if arg.isdigit() else EINVAL, now=now)
                return
            vbs = [vbs[int(arg)]]
        stats: list[tuple[str, str]] = []
        if group == "failovers":
            for vb in vbs:
                stats.append((f"vb_{vb.id}:num_entries", str(len(vb.failover_log))))
                stats.append((f"vb_{vb.id}:num_erroneous_entries_erased", "0"))
                for i, (uuid, seqno) in enumerate(vb.failover_log):
                    stats += [(f"vb_{vb.id}:{i}:id", str(uuid)), (f"vb_{vb.id}:{i}:seq", str(seqno))]
        elif group == "vbucket-seqno":
            for vb in vbs:
                h = vb.high_seqno
                hps = max((r.seqno for r in vb.log if r.kind == "prepare"), default=0)
                hcs = max((r.prepared_seqno for r in vb.log if r.kind in ("commit", "abort")), default=0)
                mvs = max((r.seqno for r in vb.log if r.kind not in ("prepare", "abort")), default=0)
                for name, value in (
                    ("high_seqno", h),
                    ("abs_high_seqno", h),
                    ("last_persisted_seqno", h),
                    ("uuid", vb.uuid),
                    ("purge_seqno", vb.purge_seqno),
                    ("last_persisted_snap_start", h),
                    ("last_persisted_snap_end", h),
                    ("high_prepared_seqno", hps),
                    ("high_completed_seqno", hcs),
                    ("max_visible_seqno", mvs),
                ):
                    stats.append((f"vb_{vb.id}:{name}", str(value)))
        else:
            self._reply(d, ENOENT, now=now)
            return
        for k, v in stats:
            self._reply(d, key=k, value=v, now=now)
        self._reply(d, now=now)

    # --- DCP ----------------------------------------------------------------------
    def _dcp_conn(self, d: Dissection, now: float) -> bool:
        if self.dcp_name is None:
            # a DCP command on a connection that is not a DCP producer: the server disconnects
            self.close(f"{d.name} on a connection without DCP_OPEN")
            return False
        return True

    def _dcp_open(self, d: Dissection, now: float) -> None:
        if self._need_bucket(d, now) is None:
            return
        flags = int(d.extras.get("flags", 0))
        value = d.frame.value
        bad = (
            not d.key
            or flags & OPEN_INVALID
            or (flags & OPEN_NO_VALUE and flags & OPEN_NO_VALUE_WITH_DATATYPE)
            or (flags & OPEN_DELETED_USER_XATTRS and not flags & OPEN_XATTRS)
            or (flags & OPEN_SKIP_DELETES and not flags & OPEN_PRODUCER)
            or self.dcp_name is not None
        )
        if value:
            obj = _json(value)
            # a JSON value needs the JSON datatype and may only hold consumer_name (consumer connections only)
            if not (d.frame.datatype & 0x01) or not isinstance(obj, dict) or set(obj) - {"consumer_name"} or flags & OPEN_PRODUCER:
                bad = True
        if bad:
            self._reply(d, EINVAL, now=now)
            return
        if not flags & OPEN_PRODUCER:
            self._reply(d, NOT_SUPPORTED, now=now)  # simulator limit: it only plays the producer side
            return
        name = d.key_text
        for other in list(self.cluster.connections):
            if other is not self and other.dcp_name == name and other.bucket is self.bucket:
                other.close(f"DCP connection name {name!r} reused by a new connection")  # §6.1
        self.dcp_name = name
        self.open_flags = flags
        self._reply(d, now=now)

    def _dcp_control(self, d: Dissection, now: float) -> None:
        if not self._dcp_conn(d, now):
            return
        key = d.key_text
        try:
            val = d.frame.value.decode()
        except UnicodeDecodeError:
            val = ""
        status = self._control(key, val) if key and val else EINVAL
        self._reply(d, status, now=now)

    def _control(self, key: str, val: str) -> int:
        """§7.8, the server's accept/reject rule for each key."""
        boolean = val in ("true", "false")
        if key == "enable_noop":
            if not boolean:
                return EINVAL
            self.noop_enabled = val == "true"
        elif key == "set_noop_interval":
            try:
                interval = float(val)
            except ValueError:
                return EINVAL
            if not interval >= CONNECTION_MANAGER_INTERVAL:
                return EINVAL
            self.noop_interval = interval
        elif key == "connection_buffer_size":
            if not val.isdigit():
                return EINVAL
            self.buffer_size = int(val)
        elif key == "stream_buffer_size":
            return NOT_SUPPORTED
        elif key == "set_priority":
            if val not in ("high", "medium", "low"):
                return EINVAL
        elif key in ("supports_cursor_dropping", "supports_cursor_dropping_vulcan", "supports_hifi_MFU"):
            if not boolean:
                return EINVAL
        elif key == "force_value_compression":
            if not boolean or spec.FEATURE_SNAPPY not in self.features:
                return EINVAL
        elif key in ("send_stream_end_on_client_close_stream", "v7_dcp_status_codes", "flatbuffers_system_events", "enable_expiry_opcode"):
            # one-way switches; enable_expiry_opcode is accepted but only effective with IncludeDeleteTimes (see _item)
            if val != "true":
                return EINVAL
        elif key == "enable_stream_id":
            if val != "true":
                return EINVAL
            if self.controls.get("enable_sync_writes") == "true":
                return NOT_SUPPORTED
        elif key == "enable_sync_writes":
            if val != "true":
                return EINVAL
            if self.stream_ids:
                return NOT_SUPPORTED
        elif key == "consumer_name":
            pass  # non-empty (checked by the caller)
        elif key == "enable_out_of_order_snapshots":
            if val not in ("true", "true_with_seqno_advanced"):
                return EINVAL
        elif key == "include_deleted_user_xattrs":
            if val != "true" or not self.open_flags & OPEN_DELETED_USER_XATTRS:
                return EINVAL
        elif key == "change_streams":
            if val != "true":
                return EINVAL
            return NOT_SUPPORTED  # choice: the simulated storage (couchstore-like) keeps no history
        elif key == "max_marker_version":
            # choice: "2.0" accepted as a no-op cap; 2.2 needs collections (EINVAL otherwise)
            if val not in ("2.0", "2.2") or (val == "2.2" and not self.collections):
                return EINVAL
        elif key == "backfill_order":
            if val not in ("round-robin", "sequential"):
                return EINVAL
        elif key == "cache_transfer":
            return NOT_SUPPORTED  # the simulator has the feature disabled
        else:
            return EINVAL
        self.controls[key] = val
        return OK

    def _get_failover_log_dcp(self, d: Dissection, now: float) -> None:
        if self._dcp_conn(d, now):
            self._failover_log(d, now)

    def _stream_req(self, d: Dissection, now: float) -> None:
        if not self._dcp_conn(d, now):
            return
        b = self.bucket
        assert b is not None
        x = d.extras
        flags = int(x["flags"])
        start, end, uuid = int(x["start_seqno"]), int(x["end_seqno"]), int(x["vb_uuid"])
        ss, se = int(x["snap_start_seqno"]), int(x["snap_end_seqno"])
        value = d.frame.value
        parsed_value = _json(value) if value else None
        request: dict[str, Any] = {
            "conn": self.serial,
            "name": self.dcp_name,
            "vb": d.frame.vbucket or 0,
            "sid": parsed_value.get("sid") if isinstance(parsed_value, dict) else None,
            "opaque": d.frame.opaque,
            "flags": flags,
            "start": start,
            "end": end,
            "uuid": uuid,
            "snap_start": ss,
            "snap_end": se,
            "value": parsed_value,
        }

        def err(status: int) -> None:
            self.cluster.note("stream_request", **request, decision="error", status=status)
            self._reply(d, status, now=now)

        # validator rules first (mcbp_validators): flags, value only with collections
        if (
            flags & ~SR_KNOWN
            or flags & SR_NO_VALUE
            or (flags & SR_CACHE_TRANSFER and flags & ~(SR_TAKEOVER | SR_ACTIVE_VB_ONLY | SR_CACHE_TRANSFER))
        ):
            return err(EINVAL)
        obj: dict[str, Any] = {}
        if value:
            parsed = _json(value)
            if not self.collections or not isinstance(parsed, dict):
                return err(EINVAL)
            obj = parsed
        if flags & SR_CACHE_TRANSFER:
            return err(NOT_SUPPORTED)
        # §6.4 order: vb exists -> state -> FromLatest -> noop -> ranges -> filter/sid -> exists -> rollback -> end adjust
        vbid = d.frame.vbucket or 0
        if vbid >= len(b.vbuckets):
            return err(NMVB)
        vb = b.vbuckets[vbid]
        if vb.state not in (VB_ACTIVE, VB_REPLICA) or (flags & SR_ACTIVE_VB_ONLY and vb.state != VB_ACTIVE):
            return err(NMVB)
        if flags & SR_FROM_LATEST:
            start = ss = se = vb.high_seqno
            uuid = uuid or vb.uuid
        if not self.noop_enabled and (self.open_flags & OPEN_XATTRS or value):
            return err(NOT_SUPPORTED)  # §7.6 noop mandatory
        if start > end:
            return err(ERANGE)
        if not ss <= start <= se:
            return err(ERANGE)
        sid = obj.get("sid")
        if self.stream_ids:
            if not isinstance(sid, int) or isinstance(sid, bool) or not 1 <= sid <= 0xFFFF:
                return err(STREAM_ID_INVALID)
        elif sid is not None:
            return err(STREAM_ID_INVALID)
        if "collections" in obj and "scope" in obj:
            return err(EINVAL)
        cids: frozenset[int] | None = None
        if "collections" in obj:
            try:
                wanted = [int(c, 16) for c in obj["collections"]]
            except (TypeError, ValueError):
                return err(EINVAL)
            if any(c not in b.manifest.collections for c in wanted):
                return err(UNKNOWN_COLLECTION)
            cids = frozenset(wanted)
        elif "scope" in obj:
            try:
                scope = int(obj["scope"], 16)
            except (TypeError, ValueError):
                return err(EINVAL)
            if scope not in b.manifest.scopes:
                return err(UNKNOWN_SCOPE)
            cids = frozenset(c for c, (_n, s, _t) in b.manifest.collections.items() if s == scope)
        elif not self.collections:
            if 0 not in b.manifest.collections:
                return err(UNKNOWN_COLLECTION)  # legacy stream of a dropped _default
            cids = frozenset({0})
        filtered = cids is not None and ("collections" in obj or "scope" in obj)
        if filtered and self.sync_replication:
            return err(NOT_SUPPORTED)
        if (vbid, sid) in self.streams and not self.streams[(vbid, sid)].ended:
            return err(EEXISTS)
        try:
            client_purge = int(obj.get("purge_seqno", "0"))
        except (TypeError, ValueError):
            return err(EINVAL)
        decision = rollback_decision(
            start=start,
            snap_start=ss,
            snap_end=se,
            vb_uuid=uuid,
            failover_log=vb.failover_log,
            high_seqno=vb.high_seqno,
            purge_seqno=vb.purge_seqno,
            flags=flags,
            client_purge_seqno=client_purge,
            filtered_max_seqno=vb.collection_high_seqno(cids) if filtered and cids is not None else None,
        )
        if decision.rollback:
            self.cluster.note(
                "stream_request", **request, decision="rollback", status=ROLLBACK, rollback_seqno=decision.seqno, reason=decision.reason
            )
            self._reply(d, ROLLBACK, value={"rollback_seqno": decision.seqno}, now=now)
            return
        high = vb.high_seqno
        if flags & SR_TO_LATEST:
            end = vb.collection_high_seqno(cids) if filtered and cids is not None else high
        elif flags & SR_DISK_ONLY:
            end = high  # everything is persisted in the simulator
        if start > end or start > high:
            return err(ERANGE)
        st = Stream(
            vb=vbid,
            sid=sid if self.stream_ids else None,
            opaque=d.frame.opaque,
            flags=flags,
            start=start,
            end=end,
            generation=vb.generation,
            cids=cids,
            filtered=filtered,
            backfill_end=min(high, end) if start < high else 0,
            last_queued=start,
            last_sent_seqno=start,
        )
        self.streams[st.key] = st
        self.cluster.note(
            "stream_request",
            **request,
            decision="success",
            status=OK,
            stream_end=end,
            high_seqno=high,
            failover_log=[[u, s] for u, s in vb.failover_log],
        )
        self._reply(d, value=list(vb.failover_log), now=now)

    def _close_stream(self, d: Dissection, now: float) -> None:
        if not self._dcp_conn(d, now):
            return
        sid = d.stream_id
        if self.stream_ids != (sid is not None):
            self._reply(d, STREAM_ID_INVALID, now=now)
            return
        st = self.streams.get((d.frame.vbucket or 0, sid))
        if st is None or st.ended:
            self.cluster.note("close_stream", conn=self.serial, name=self.dcp_name, vb=d.frame.vbucket or 0, sid=sid, status=ENOENT)
            self._reply(d, ENOENT, now=now)
            return
        self.cluster.note("close_stream", conn=self.serial, name=self.dcp_name, vb=st.vb, sid=sid, status=OK)
        self._reply(d, now=now)
        st.queue.clear()
        if self.controls.get("send_stream_end_on_client_close_stream") == "true":
            frame, size = self._stream_end_frame(st, END_CLOSED)
            st.queue.append((frame, size, "end", ("stream_end", {"status": self._end_wire(END_CLOSED), "reason": END_CLOSED})))
            st.end_status = END_CLOSED
        else:
            self._finish(st)

    def _buffer_ack(self, d: Dissection, now: float) -> None:
        if not self._dcp_conn(d, now):
            return
        # no response on success (§6.13)
        acked = int(d.extras.get("buffer_bytes", 0))
        self.bytes_outstanding = max(0, self.bytes_outstanding - acked)
        self.cluster.note("buffer_ack", conn=self.serial, name=self.dcp_name, bytes=acked, outstanding=self.bytes_outstanding)

    def _seqno_ack(self, d: Dissection, now: float) -> None:
        if not self._dcp_conn(d, now):
            return
        self.cluster.note(
            "seqno_ack", conn=self.serial, name=self.dcp_name, vb=d.frame.vbucket or 0, prepared_seqno=d.extras.get("prepared_seqno")
        )
        if not self.sync_replication:
            self._reply(d, EINVAL, now=now)  # errors only (§6.17)
        elif self.bucket is not None and (d.frame.vbucket or 0) >= len(self.bucket.vbuckets):
            self._reply(d, NMVB, now=now)

    def _dcp_noop_req(self, d: Dissection, now: float) -> None:
        if self._dcp_conn(d, now):
            self._reply(d, now=now)

    def _consumer_only(self, d: Dissection, now: float) -> None:
        if self._dcp_conn(d, now):
            self._reply(d, EINVAL, now=now)  # producer-side messages sent to a producer

    # --- streaming ------------------------------------------------------------------
    def _window_full(self) -> bool:
        return self.buffer_size > 0 and self.bytes_outstanding >= self.buffer_size

    def pump(self, now: float) -> None:
        """Handle waiting requests, then move stream messages to the output.

        Round robin, respecting flow control (§7.5) and the cluster's ``output_limit``.
        """
        self._handle_inbox(now)
        if self.closed or self.bucket is None:
            return
        if now < self.paused_until:
            return
        budget = min(self.cluster.max_batch, self.cluster.output_limit - len(self._out))
        keys = list(self.streams)
        idle_rounds = 0
        while keys and budget > 0 and idle_rounds < 2:
            progressed = False
            self._rr = (self._rr + 1) % len(keys)
            for key in keys[self._rr :] + keys[: self._rr]:
                st = self.streams.get(key)
                if st is None or st.ended:
                    continue
                if not st.queue:
                    self._fill(st)
                if not st.queue:
                    continue
                if self._window_full():
                    if self._blocked_since is None:
                        self._blocked_since = now
                        self.cluster.note(
                            "flow_blocked",
                            conn=self.serial,
                            name=self.dcp_name,
                            outstanding=self.bytes_outstanding,
                            buffer=self.buffer_size,
                        )
                    return
                frame, size, what, note = st.queue.popleft()
                self._send(frame, now)
                if note is not None:
                    self._journal(st, note)
                self.bytes_outstanding += size if self.buffer_size > 0 else 0
                budget -= len(frame)
                progressed = True
                if what == "end":
                    self._finish(st)
            idle_rounds = 0 if progressed else idle_rounds + 1
            keys = [k for k in self.streams if not self.streams[k].ended]
        if not self._window_full():
            self._blocked_since = None

    def _finish(self, st: Stream) -> None:
        st.ended = True
        self.streams.pop(st.key, None)

    def _end_wire(self, status: int) -> int:
        wire = status
        if wire == END_ROLLBACK:
            wire = END_STATE_CHANGED  # §6.6 statusToFlags
        if not self.collections and wire in (END_FILTER_EMPTY, END_LOST_PRIVILEGES):
            wire = END_OK  # §6.6 mapEndStreamStatus
        return wire

    def _stream_end_frame(self, st: Stream, status: int) -> tuple[bytes, int]:
        raw = encode("DCP_STREAM_END", extras={"status": self._end_wire(status)}, vbucket=st.vb, opaque=st.opaque, stream_id=st.sid)
        return raw, len(raw)

    def _queue_end(self, st: Stream, status: int) -> None:
        self._queue(
            st, self._stream_end_frame(st, status)[0], "end", note=("stream_end", {"status": self._end_wire(status), "reason": status})
        )

    def _journal(self, st: Stream, note: tuple[str, dict[str, Any]]) -> None:
        self.cluster.note(note[0], conn=self.serial, name=self.dcp_name, vb=st.vb, sid=st.sid, **note[1])

    def _queue(self, st: Stream, raw: bytes, what: str, extra: int = 0, note: tuple[str, dict[str, Any]] | None = None) -> None:
        st.queue.append((raw, len(raw) + extra, what, note))

    def _fill(self, st: Stream) -> None:
        b = self.bucket
        assert b is not None
        vb = b.vbuckets[st.vb]
        if vb.generation != st.generation:
            self._queue_end(st, END_STATE_CHANGED)
            return
        if st.takeover:
            return
        if st.filtered and st.cids is not None and not (st.cids & set(b.manifest.collections)) and st.last_queued >= vb.high_seqno:
            self._queue_end(st, END_FILTER_EMPTY)
            return
        if st.last_queued >= st.end:
            self._queue_end(st, END_OK)
            return
        target = min(vb.high_seqno, st.end)
        if target <= st.last_queued:
            if st.flags & SR_TAKEOVER:
                self._queue(
                    st,
                    encode("DCP_SET_VBUCKET_STATE", extras={"state": VB_PENDING}, vbucket=st.vb, opaque=st.opaque),
                    "state",
                    note=("set_vbucket_state", {"state": VB_PENDING}),
                )
                st.takeover = "pending"
            return
        if st.backfill_end and st.first_marker:
            self._snapshot(st, vb, st.last_queued, st.backfill_end, disk=True)
        else:
            hi = min(target, st.last_queued + max(1, self.cluster.checkpoint_items))
            self._snapshot(st, vb, st.last_queued, hi, disk=False)

    def _takeover_ack(self, st: Stream, now: float) -> None:
        b = self.bucket
        assert b is not None
        vb = b.vbuckets[st.vb]
        if st.takeover == "pending":
            vb.state = VB_DEAD
            vb.generation += 1
            st.generation = vb.generation  # the takeover stream itself carries on
            st.takeover = "active"
            self._queue(
                st,
                encode("DCP_SET_VBUCKET_STATE", extras={"state": VB_ACTIVE}, vbucket=st.vb, opaque=st.opaque),
                "state",
                note=("set_vbucket_state", {"state": VB_ACTIVE}),
            )
        elif st.takeover == "active":
            st.takeover = "done"
            self._queue_end(st, END_OK)
        self.pump(now)

    def _visible(self, st: Stream, rec: Record) -> bool:
        if rec.kind == "system":
            return self.collections and (st.cids is None or rec.cid in st.cids or (rec.event in (3, 4) and not st.filtered))
        if st.cids is not None and rec.cid not in st.cids:
            return False
        if rec.kind in ("prepare", "abort"):
            return self.sync_replication
        return True

    def _snapshot(self, st: Stream, vb: VBucket, lo: int, hi: int, *, disk: bool) -> None:
        """Queue one snapshot (lo, hi]: marker + deduplicated items (+ seqno-advanced)."""
        b = self.bucket
        assert b is not None
        recs = vb.records(lo, hi)
        if disk:
            live = set(b.manifest.collections)
            recs = [r for r in recs if r.kind == "system" or r.cid in live]
        latest: dict[tuple[Any, ...], Record] = {}
        for r in recs:
            latest[r.dedup_key] = r  # §7.2: each key at most once per snapshot
        items = sorted((r for r in latest.values() if self._visible(st, r)), key=lambda r: r.seqno)
        if disk and not self.sync_replication:
            # the disk copy of a committed sync write is the commit; hide prepares whose commit is on disk
            items = [r for r in items if r.kind not in ("prepare", "abort")]
        oso = (
            disk
            and st.first_marker
            and st.start == 0
            and self.controls.get("enable_out_of_order_snapshots") in ("true", "true_with_seqno_advanced")
            and st.filtered
            and st.cids is not None
            and len(st.cids) == 1
        )
        first = st.first_marker
        st.first_marker = False
        st.last_queued = hi
        if oso:
            self._queue(
                st,
                encode("DCP_OSO_SNAPSHOT", extras={"flags": 0x01}, vbucket=st.vb, opaque=st.opaque, stream_id=st.sid),
                "oso",
                note=("oso", {"flags": 0x01}),
            )
            for r in sorted(items, key=lambda r: r.key):
                self._item(st, r)
            self._queue(
                st,
                encode("DCP_OSO_SNAPSHOT", extras={"flags": 0x02}, vbucket=st.vb, opaque=st.opaque, stream_id=st.sid),
                "oso",
                note=("oso", {"flags": 0x02}),
            )
            if self.controls.get("enable_out_of_order_snapshots") == "true_with_seqno_advanced" and (
                not items or max(r.seqno for r in items) < hi
            ):
                self._queue(
                    st,
                    encode("DCP_SEQNO_ADVANCED", extras={"seqno": hi}, vbucket=st.vb, opaque=st.opaque, stream_id=st.sid),
                    "sa",
                    note=("item", {"opcode": "DCP_SEQNO_ADVANCED", "seqno": hi}),
                )
            return
        # §7.2 marker start: the requested start for the first marker, else the first item's seqno
        start = lo if first else (items[0].seqno if items else lo + 1)
        flags = (SNAP_DISK | SNAP_CHECKPOINT) if disk else (SNAP_MEMORY | (SNAP_CHECKPOINT if first else 0))
        self._marker(st, vb, start, hi, flags, disk)
        for r in items:
            self._item(st, r)
        if self.collections and (not items or items[-1].seqno < hi):
            # §6.19: the snapshot ends on seqnos this stream does not see
            self._queue(
                st,
                encode("DCP_SEQNO_ADVANCED", extras={"seqno": hi}, vbucket=st.vb, opaque=st.opaque, stream_id=st.sid),
                "sa",
                note=("item", {"opcode": "DCP_SEQNO_ADVANCED", "seqno": hi}),
            )

    def _marker(self, st: Stream, vb: VBucket, start: int, end: int, flags: int, disk: bool) -> None:
        version = self.marker_version
        common: dict[str, Any] = {"vbucket": st.vb, "opaque": st.opaque, "stream_id": st.sid}
        if version == "v1":
            raw = encode("DCP_SNAPSHOT_MARKER", extras={"start_seqno": start, "end_seqno": end, "flags": flags}, **common)
        else:
            upto = [r for r in vb.log if r.seqno <= end]
            mvs = max((r.seqno for r in upto if r.kind not in ("prepare", "abort", "system")), default=0)
            hcs = max((r.prepared_seqno for r in upto if r.kind in ("commit", "abort")), default=0) if disk else 0
            value: dict[str, int] = {
                "start_seqno": start,
                "end_seqno": end,
                "flags": flags,
                "max_visible_seqno": mvs,
                "high_completed_seqno": hcs,
            }
            if version == "v2.2":
                value["purge_seqno"] = vb.purge_seqno
                value["high_prepared_seqno"] = max((r.seqno for r in upto if r.kind == "prepare"), default=0) if disk else 0
            raw = encode("DCP_SNAPSHOT_MARKER", extras={"version": 2 if version == "v2.2" else 0}, value=value, **common)
        self._queue(st, raw, "marker", note=("marker", {"start": start, "end": end, "flags": flags, "version": version}))

    def _payload(self, r: Record) -> tuple[bytes, int]:
        value, dt = r.value, r.datatype | 0x01 if r.datatype & 0x01 else r.datatype
        if self.open_flags & OPEN_NO_VALUE:
            return b"", 0
        if self.open_flags & OPEN_NO_VALUE_WITH_DATATYPE:
            return b"", dt
        if value and self.controls.get("force_value_compression") == "true":
            return _snappy_compress(value), dt | 0x02
        return value, dt

    def _item(self, st: Stream, r: Record) -> None:
        key = {"key": r.key, "cid": r.cid if self.collections else None}
        common: dict[str, Any] = {"vbucket": st.vb, "opaque": st.opaque, **key}
        delete_times = bool(self.open_flags & OPEN_DELETE_TIMES)
        kind = r.kind
        if kind == "commit" and not self.sync_replication:
            kind = "deletion" if r.deleted else "mutation"  # §7.9: committed sync writes arrive as plain items
        if kind == "mutation":
            value, dt = self._payload(r)
            raw = encode(
                "DCP_MUTATION",
                extras={"by_seqno": r.seqno, "rev_seqno": r.rev_seqno, "flags": r.flags, "expiration": r.expiration},
                value=value,
                datatype=dt,
                cas=r.cas,
                stream_id=st.sid,
                **common,
            )
            self._queue(st, raw, "item", note=_item_note("DCP_MUTATION", r))
        elif kind in ("deletion", "expiration"):
            opname = "DCP_DELETION"
            if kind == "expiration" and self.controls.get("enable_expiry_opcode") == "true" and delete_times:
                opname = "DCP_EXPIRATION"
                extras = {"by_seqno": r.seqno, "rev_seqno": r.rev_seqno, "delete_time": r.delete_time}
                raw = encode("DCP_EXPIRATION", extras=extras, cas=r.cas, stream_id=st.sid, **common)
            elif delete_times:
                extras = {"by_seqno": r.seqno, "rev_seqno": r.rev_seqno, "delete_time": r.delete_time}
                raw = encode("DCP_DELETION", variant="v2", extras=extras, cas=r.cas, stream_id=st.sid, **common)
            else:
                raw = encode(
                    "DCP_DELETION",
                    variant="v1",
                    extras={"by_seqno": r.seqno, "rev_seqno": r.rev_seqno},
                    cas=r.cas,
                    stream_id=st.sid,
                    **common,
                )
            self._queue(st, raw, "item", note=_item_note(opname, r))
        elif kind == "prepare":
            value, dt = self._payload(r)
            extras = {
                "by_seqno": r.seqno,
                "rev_seqno": r.rev_seqno,
                "flags": r.flags,
                "expiration": r.expiration,
                "deleted": int(r.deleted),
                "durability_level": r.durability,
            }
            raw = encode("DCP_PREPARE", extras=extras, value=value, datatype=dt, cas=r.cas, **common)
            self._queue(st, raw, "item", extra=2, note=_item_note("DCP_PREPARE", r))  # §7.5: a prepare counts 2 bytes more than its size
        elif kind in ("commit", "abort"):
            name, field_ = ("DCP_COMMIT", "commit_seqno") if kind == "commit" else ("DCP_ABORT", "abort_seqno")
            raw = encode(name, extras={"prepared_seqno": r.prepared_seqno, field_: r.seqno}, **common)
            self._queue(st, raw, "item", note=_item_note(name, r))
        elif kind == "system":
            self._queue(st, self._system_event_frame(st, r), "item", note=_item_note("DCP_SYSTEM_EVENT", r))

    def _system_event_frame(self, st: Stream, r: Record) -> bytes:
        b = self.bucket
        assert b is not None
        common: dict[str, Any] = {"vbucket": st.vb, "opaque": st.opaque, "stream_id": st.sid}
        fb = self.controls.get("flatbuffers_system_events") == "true"
        version = 2 if fb else (1 if r.event == 0 and r.max_ttl is not None else 0)
        extras = {"by_seqno": r.seqno, "event": r.event, "version": version}
        value: dict[str, Any]
        key = r.key
        if r.event == 0:  # BeginCollection
            if fb:
                value = {
                    "uid": r.manifest_uid,
                    "scopeId": r.scope_id,
                    "collectionId": r.cid,
                    "ttlValid": r.max_ttl is not None,
                    "maxTtl": r.max_ttl or 0,
                    "name": r.key.decode(),
                }
            else:
                value = {"manifest_uid": r.manifest_uid, "scope_id": r.scope_id, "collection_id": r.cid}
                if r.max_ttl is not None:
                    value["max_ttl"] = r.max_ttl
        elif r.event == 1:  # EndCollection
            value = (
                {"uid": r.manifest_uid, "scopeId": r.scope_id, "collectionId": r.cid}
                if fb
                else {"manifest_uid": r.manifest_uid, "scope_id": r.scope_id, "collection_id": r.cid}
            )
            key = b""
        elif r.event == 3:  # CreateScope
            value = (
                {"uid": r.manifest_uid, "scopeId": r.scope_id, "name": r.key.decode()}
                if fb
                else {"manifest_uid": r.manifest_uid, "scope_id": r.scope_id}
            )
        else:  # DropScope
            value = {"uid": r.manifest_uid, "scopeId": r.scope_id} if fb else {"manifest_uid": r.manifest_uid, "scope_id": r.scope_id}
            key = b""
        return encode("DCP_SYSTEM_EVENT", extras=extras, key=key, value=value, **common)

    # --- scenario controls ------------------------------------------------------------
    def pause(self, until: float) -> None:
        """Stall this connection's streams until ``until`` (noops still flow)."""
        self.paused_until = until


def _item_note(opcode: str, r: Record) -> tuple[str, dict[str, Any]]:
    """The journal entry of an item: opcode name, seqno, key (system events: the event id)."""
    fields: dict[str, Any] = {"opcode": opcode, "seqno": r.seqno, "key": r.key.decode("utf-8", "replace")}
    if r.kind == "system":
        fields["system_event"] = r.event
    return ("item", fields)


def _json(value: bytes) -> Any:
    try:
        return json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return None


def _frame_ids(framing: bytes) -> list[int] | None:
    """Frame-info ids of a request's flexible framing extras (None if malformed, §1.3)."""
    ids: list[int] = []
    i = 0
    while i < len(framing):
        b = framing[i]
        i += 1
        fid, ln = b >> 4, b & 0x0F
        if fid == 15:
            if i >= len(framing):
                return None
            fid += framing[i]
            i += 1
        if ln == 15:
            if i >= len(framing):
                return None
            ln += framing[i]
            i += 1
        i += ln
        if i > len(framing):
            return None
        ids.append(fid)
    return ids


def _shape_ok(frame: Any) -> bool:
    """The request's extras length is one the table allows for its command (validator rule)."""
    cmd = spec.COMMANDS.get(frame.opcode)
    if cmd is None:
        return True
    lens = {v.extras_len for v in cmd.request if not v.any_extras}
    if lens and frame.extras_length not in lens:
        return False
    if frame.opcode in (0x53, 0x52, 0x54, 0x5D, 0x5C, 0x61, 0x96):
        return not frame.key
    return True


_PRE_AUTH = frozenset({0x1F, 0x20, 0x21, 0x22, 0xFE, 0x0A, 0x07})

_HANDLERS: dict[int, Any] = {
    0x07: ProducerConnection._quit,
    0x0A: ProducerConnection._noop_kv,
    0x10: ProducerConnection._stat,
    0x1F: ProducerConnection._hello,
    0x20: ProducerConnection._list_mechs,
    0x21: ProducerConnection._sasl_auth,
    0x22: ProducerConnection._sasl_step,
    0x48: ProducerConnection._all_vb_seqnos,
    0x89: ProducerConnection._select_bucket,
    0x96: ProducerConnection._failover_log,
    0xFE: ProducerConnection._error_map,
    0x50: ProducerConnection._dcp_open,
    0x51: ProducerConnection._consumer_only,
    0x52: ProducerConnection._close_stream,
    0x53: ProducerConnection._stream_req,
    0x54: ProducerConnection._get_failover_log_dcp,
    0x5C: ProducerConnection._dcp_noop_req,
    0x5D: ProducerConnection._buffer_ack,
    0x5E: ProducerConnection._dcp_control,
    0x61: ProducerConnection._seqno_ack,
}
