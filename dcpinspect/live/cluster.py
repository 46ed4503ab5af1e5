"""The simulated data model behind the producer: a cluster of buckets, vbuckets and their histories.

A :class:`Cluster` holds :class:`Bucket` s, each with N :class:`VBucket` s whose
history is a list of :class:`HistoryItem` s in seqno order (mutations,
tombstones, sync-write prepares/commits/aborts, collection system events), a
failover table (newest first, as kv_engine's ``FailoverTable``) and a purge
seqno.  The bucket's methods are the scripted workload and the scenario
controls (fail over a vbucket, purge tombstones, drop a collection...); they may
be called while connections stream: each stream of a
:class:`~dcpinspect.live.producer.ProducerConnection` pulls from its vbucket on
the connection's next ``pump``.

Nothing here speaks the protocol: the connections do (:mod:`.producer`,
:mod:`.producer_streams`).  The cluster knows them only as :class:`Connection`
(a name, a bucket, a way to close them).

>>> cluster = Cluster(seed=1)
>>> bucket = cluster.create_bucket("default", vbuckets=2, items=4)
>>> [vb.high_seqno for vb in bucket.vbuckets]
[2, 2]
>>> bucket.failover(0, lose=1) == bucket.vbuckets[0].uuid
True
"""

from __future__ import annotations

import json
import random
import zlib
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..protocol.enums import Datatype, SystemEvent, VBucketState

__all__ = [
    "DCP_IDLE_TIMEOUT",
    "JOURNAL_MAX",
    "MAX_FAILOVER_ENTRIES",
    "VBUCKET_STATES",
    "Bucket",
    "Cluster",
    "Connection",
    "HistoryItem",
    "Manifest",
    "VBucket",
    "vbucket_for_key",
]

#: kv_engine's max_failover_entries default
MAX_FAILOVER_ENTRIES = 25
#: entries kept in Cluster.journal by default
JOURNAL_MAX = 200_000
#: kv_engine's dcp_idle_timeout default (seconds without anything received -> disconnect, when noops are on)
DCP_IDLE_TIMEOUT = 360.0
#: vbucket state names (as ``Bucket.set_state`` takes them) -> state
VBUCKET_STATES: Mapping[str, int] = {s.name.lower(): int(s) for s in VBucketState}

_ACTIVE = int(VBucketState.ACTIVE)
_JSON = int(Datatype.JSON)
_BEGIN_COLLECTION = int(SystemEvent.BEGIN_COLLECTION)
_END_COLLECTION = int(SystemEvent.END_COLLECTION)
_CREATE_SCOPE = int(SystemEvent.CREATE_SCOPE)


class Connection(Protocol):
    """What the cluster knows of a client connection (a :class:`~dcpinspect.live.producer.ProducerConnection`)."""

    @property
    def dcp_name(self) -> str | None:
        """The DCP_OPEN name (``None`` before DCP_OPEN)."""

    @property
    def bucket(self) -> Bucket | None:
        """The selected bucket."""

    def close(self, reason: str) -> None:
        """Close the connection."""


def vbucket_for_key(key: bytes, vbuckets: int) -> int:
    """The vbucket a key hashes to (CRC32 as the SDKs compute it)."""
    return ((zlib.crc32(key) >> 16) & 0x7FFF) % vbuckets


# ---------------------------------------------------------------------------
# data model


@dataclass(slots=True)
class HistoryItem:
    """One seqno of a vbucket's history.

    ``kind`` is ``mutation``, ``deletion``, ``expiration``, ``prepare``, ``commit``,
    ``abort`` or ``system``.  Commits carry the committed value and ``prepared_seqno``;
    system events carry ``event`` (a :class:`~dcpinspect.protocol.enums.SystemEvent`), ``scope_id``, ``manifest_uid`` and the
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
        """Items sharing this key are deduplicated inside a snapshot (as a checkpoint deduplicates them).

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
    state: int = _ACTIVE
    failover_log: list[tuple[int, int]] = field(default_factory=list)
    log: list[HistoryItem] = field(default_factory=list)
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
        """New branch: drop entries above ``seqno``, put it first, cap at :data:`MAX_FAILOVER_ENTRIES`."""
        kept = [(u, s) for u, s in self.failover_log if s <= seqno]
        self.failover_log = [(uuid, seqno), *kept][:MAX_FAILOVER_ENTRIES]

    def records(self, lo: int, hi: int) -> list[HistoryItem]:
        """HistoryItems with lo < seqno <= hi, in seqno order."""
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

    def _append(self, vb: VBucket, rec: HistoryItem) -> HistoryItem:
        if vb.state != _ACTIVE:
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

    def mutate(self, key: bytes | str, value: Any = None, *, collection: str | int = 0, flags: int = 0, expiration: int = 0) -> HistoryItem:
        """Store a document (a dict/list/number is JSON-encoded with the JSON datatype)."""
        k = key.encode() if isinstance(key, str) else key
        raw, dt = _value(value if value is not None else {"key": k.decode("utf-8", "replace")})
        return self._append(
            self.vbucket_of(k), HistoryItem(0, "mutation", k, self._cid(collection), raw, dt, flags=flags, expiration=expiration)
        )

    def delete(self, key: bytes | str, *, collection: str | int = 0, delete_time: int = 0) -> HistoryItem:
        """Delete a document (a tombstone)."""
        k = key.encode() if isinstance(key, str) else key
        return self._append(self.vbucket_of(k), HistoryItem(0, "deletion", k, self._cid(collection), delete_time=delete_time))

    def expire(self, key: bytes | str, *, collection: str | int = 0, delete_time: int = 0) -> HistoryItem:
        """Expire a document (an expiration tombstone)."""
        k = key.encode() if isinstance(key, str) else key
        return self._append(self.vbucket_of(k), HistoryItem(0, "expiration", k, self._cid(collection), delete_time=delete_time))

    def prepare(
        self, key: bytes | str, value: Any = None, *, collection: str | int = 0, level: int = 1, delete: bool = False
    ) -> HistoryItem:
        """A sync-write prepare (durability level 1..3)."""
        k = key.encode() if isinstance(key, str) else key
        raw, dt = (b"", 0) if delete else _value(value if value is not None else {"key": k.decode("utf-8", "replace")})
        return self._append(
            self.vbucket_of(k), HistoryItem(0, "prepare", k, self._cid(collection), raw, dt, durability=level, deleted=delete)
        )

    def _pending_prepare(self, vb: VBucket, cid: int, key: bytes) -> HistoryItem:
        for rec in reversed(vb.log):
            if rec.cid == cid and rec.key == key and rec.kind in ("prepare", "commit", "abort"):
                if rec.kind == "prepare":
                    return rec
                break
        raise ValueError(f"no pending prepare for {key!r}")

    def commit(self, key: bytes | str, *, collection: str | int = 0) -> HistoryItem:
        """Commit the pending prepare of a key."""
        k = key.encode() if isinstance(key, str) else key
        vb, cid = self.vbucket_of(k), self._cid(collection)
        p = self._pending_prepare(vb, cid, k)
        return self._append(vb, HistoryItem(0, "commit", k, cid, p.value, p.datatype, prepared_seqno=p.seqno, deleted=p.deleted))

    def abort(self, key: bytes | str, *, collection: str | int = 0) -> HistoryItem:
        """Abort the pending prepare of a key."""
        k = key.encode() if isinstance(key, str) else key
        vb, cid = self.vbucket_of(k), self._cid(collection)
        p = self._pending_prepare(vb, cid, k)
        return self._append(vb, HistoryItem(0, "abort", k, cid, prepared_seqno=p.seqno))

    def load(self, items: int, *, prefix: str = "doc-", collection: str | int = 0) -> None:
        """``items`` documents ``prefix0000``... spread over the vbuckets by key hash."""
        for i in range(items):
            self.mutate(f"{prefix}{i:04d}", {"id": i, "name": f"{prefix}{i:04d}", "rev": 1}, collection=collection)

    # --- collections --------------------------------------------------------------
    def _system_event(self, rec_for: Any) -> None:
        for vb in self.vbuckets:
            if vb.state == _ACTIVE:
                self._append(vb, rec_for())

    def create_scope(self, name: str) -> int:
        """Create a scope (a CreateScope event in every active vbucket); returns its id."""
        m = self.manifest
        sid = m.next_id
        m.next_id += 1
        m.uid += 1
        m.scopes[sid] = name
        self._system_event(lambda: HistoryItem(0, "system", name.encode(), 0, event=_CREATE_SCOPE, scope_id=sid, manifest_uid=m.uid))
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
        self._system_event(
            lambda: HistoryItem(0, "system", name.encode(), cid, event=_BEGIN_COLLECTION, scope_id=sid, manifest_uid=m.uid, max_ttl=max_ttl)
        )
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
        self._system_event(lambda: HistoryItem(0, "system", b"", cid, event=_END_COLLECTION, scope_id=sid, manifest_uid=m.uid))
        self.cluster.note(
            "collection_dropped", bucket=self.name, name=_cname, cid=cid, scope_id=sid, manifest_uid=m.uid, seqnos=self._seqnos()
        )
        return cid

    def _seqnos(self) -> dict[int, int]:
        """The high seqno of each active vbucket (what a collection change just wrote)."""
        return {vb.id: vb.high_seqno for vb in self.vbuckets if vb.state == _ACTIVE}

    # --- scenario controls ---------------------------------------------------------
    def failover(self, vbucket: int, *, lose: int = 0) -> int:
        """Fail a vbucket over: the last ``lose`` items are lost, then a new UUID at the new high seqno.

        Live streams of the vbucket end with StateChanged (kv_engine sends Rollback as
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
        vb.state = _ACTIVE
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
        vb.state = VBUCKET_STATES[state] if isinstance(state, str) else state
        vb.generation += 1
        self.cluster.note("set_state", bucket=self.name, vb=vbucket, state=vb.state)


def _value(value: Any) -> tuple[bytes, int]:
    if isinstance(value, bytes):
        return value, 0
    if isinstance(value, str):
        return value.encode(), 0
    return json.dumps(value, separators=(",", ":")).encode(), _JSON


class Cluster:
    """Buckets, users and the connections streaming from them; deterministic given ``seed``.

    Args:
        users: user name -> password.
        seed: seeds the vbucket UUIDs.
        idle_timeout: kv_engine's dcp_idle_timeout (seconds without receiving anything, noops on).
        slow_after: seconds a flow-control window may stay full before the streams end Slow
            (``None``: never).
        checkpoint_items: seqnos per memory snapshot.
        max_batch: bytes one :meth:`~dcpinspect.live.producer.ProducerConnection.pump` queues before yielding.
        output_limit: bytes of output a connection holds (produced, not yet taken with
            :meth:`~dcpinspect.live.producer.ProducerConnection.data_to_send`) before it stops producing more: requests
            wait unhandled (:attr:`~dcpinspect.live.producer.ProducerConnection.want_read` is false) and streams pause,
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
        self._serial = 0  # the last connection serial handed out
        self.users = dict(users if users is not None else {"Administrator": "password"})
        self.buckets: dict[str, Bucket] = {}
        self.idle_timeout = idle_timeout
        self.slow_after = slow_after
        self.checkpoint_items = checkpoint_items
        self.max_batch = max_batch
        self.output_limit = output_limit
        self.connections: list[Connection] = []
        self._rng = random.Random(seed)
        self._cas = 0x1700000000000000

    def __repr__(self) -> str:
        return f"Cluster(buckets={sorted(self.buckets)}, connections={len(self.connections)})"

    def note(self, event: str, **fields: Any) -> None:
        """Add an entry to :attr:`journal`."""
        self.journal.append({"event": event, **fields})

    def new_uuid(self) -> int:
        """A fresh vbucket UUID (never 0: 0 means "no uuid" in a stream request)."""
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

    def register(self, conn: Connection) -> int:
        """Add a new connection; returns its serial number (1, 2, ... in order of arrival)."""
        self._serial += 1
        self.connections.append(conn)
        return self._serial

    def unregister(self, conn: Connection) -> None:
        """Forget a closed connection."""
        if conn in self.connections:
            self.connections.remove(conn)

    def drop_connections(self, reason: str = "dropped by scenario") -> None:
        """Close every connection (the edge then closes the sockets)."""
        for c in list(self.connections):
            c.close(reason)
