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

A cluster of ``nodes`` data nodes shares one cluster map: with two or more
nodes each vbucket is active on node ``vb % nodes`` and has a replica on node
``(vb + 1) % nodes`` (:meth:`Bucket.vbucket_map`); :meth:`Bucket.failover`
promotes the replica, as a real hard failover does.

>>> cluster = Cluster(seed=1, nodes=2)
>>> bucket = cluster.create_bucket("default", vbuckets=2, items=4)
>>> [vb.high_seqno for vb in bucket.vbuckets]
[2, 2]
>>> bucket.vbucket_map()
[[0, 1], [1, 0]]
>>> bucket.failover(0, lose=1) == bucket.vbuckets[0].uuid
True
>>> bucket.vbucket_map(), bucket.vbuckets[0].failover_log[0][1], cluster.rev
([[1, -1], [1, 0]], 1, 2)
"""

from __future__ import annotations

import json
import random
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ..protocol.enums import Datatype, SystemEvent, VBucketState
from ..protocol.session import DCP_IDLE_TIMEOUT
from .vbucket import MAX_FAILOVER_ENTRIES, HistoryItem, Manifest, VBucket, vbucket_for_key

__all__ = [
    "BACKFILL_IDLE_LIMIT",
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

#: entries kept in Cluster.journal by default
JOURNAL_MAX = 200_000
#: kv_engine's dcp_backfill_idle_limit_seconds default: a backfill stalled this long under disk pressure ends Slow
BACKFILL_IDLE_LIMIT = 720.0
#: vbucket state names (as ``Bucket.set_state`` takes them) -> state
VBUCKET_STATES: Mapping[str, int] = {s.name.lower(): int(s) for s in VBucketState}

_ACTIVE = int(VBucketState.ACTIVE)
_REPLICA = int(VBucketState.REPLICA)
_DEAD = int(VBucketState.DEAD)
_JSON = int(Datatype.JSON)
_BEGIN_COLLECTION = int(SystemEvent.BEGIN_COLLECTION)
_END_COLLECTION = int(SystemEvent.END_COLLECTION)
_CREATE_SCOPE = int(SystemEvent.CREATE_SCOPE)
_NO_NODE = -1
_SLOW_AFTER_REMOVED = (
    "slow_after was removed: a server never ends a stream Slow because the consumer stopped acking "
    "(the producer pauses); Slow comes from a backfill stalled under disk pressure: bucket.disk_pressure(True)"
)


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


class Bucket:
    """A bucket: vbuckets, the collections manifest, and the workload/scenario methods."""

    def __init__(self, cluster: Cluster, name: str, vbuckets: int) -> None:
        self.cluster = cluster
        self.name = name
        self.manifest = Manifest()
        self.vbuckets = [VBucket(i, nodes=cluster.initial_nodes(i)) for i in range(vbuckets)]
        for vb in self.vbuckets:
            vb.add_failover_entry(cluster.new_uuid(), 0)
            cluster.note("vbucket_created", bucket=name, vb=vb.id, uuid=vb.uuid, seqno=0, nodes=list(vb.nodes))
        self._values: dict[tuple[int, bytes], int] = {}  # rev seqno per document
        #: scenario state read by the streams: disk above the backfill idle threshold (backfills stall)
        self.disk_pressure_on = False
        #: vbucket (or None: any) -> how many of its next backfills fail
        self.backfill_failures: dict[int | None, int] = {}
        #: users whose privileges on this bucket were revoked
        self.revoked: set[str] = set()

    def __repr__(self) -> str:
        return f"Bucket({self.name!r}, vbuckets={len(self.vbuckets)})"

    # --- where the vbuckets live ------------------------------------------------------
    def vbucket_map(self) -> list[list[int]]:
        """Vbucket -> [active node, replica nodes...] (-1: none), as the cluster map's vBucketMap."""
        return [list(vb.nodes) for vb in self.vbuckets]

    def state_on(self, vbid: int, node: int) -> int:
        """The state vbucket ``vbid`` has on ``node``: its own state on the active node, replica on a replica, else dead."""
        vb = self.vbuckets[vbid]
        if node == vb.nodes[0]:
            return vb.state
        return _REPLICA if node in vb.nodes[1:] else _DEAD

    def document(self, key: bytes | str, cid: int = 0) -> HistoryItem | None:
        """The current committed version of a document (``None`` if absent or deleted)."""
        k = key.encode() if isinstance(key, str) else key
        for r in reversed(self.vbucket_of(k).log):
            if r.cid == cid and r.key == k and r.kind in ("mutation", "deletion", "expiration", "commit"):
                return None if r.is_tombstone else r
        return None

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

    def _append(self, vb: VBucket, rec: HistoryItem, *, cas: int | None = None) -> HistoryItem:
        if vb.state != _ACTIVE:
            raise ValueError(f"vbucket {vb.id} is not active")
        rec.seqno = vb.high_seqno = vb.high_seqno + 1
        rec.cas = self.cluster.next_cas() if cas is None else cas
        if rec.kind != "system":
            dk = (rec.cid, rec.key)
            rev = self._values.get(dk, 0) + (0 if rec.kind in ("prepare", "abort") else 1)
            self._values[dk] = rev
            rec.rev_seqno = max(rev, 1)
        if not (rec.kind == "system" and rec.event == _CREATE_SCOPE):
            vb.collection_highs[rec.cid] = rec.seqno
        vb.log.append(rec)
        self.cluster.changed()
        return rec

    def mutate(
        self,
        key: bytes | str,
        value: Any = None,
        *,
        collection: str | int = 0,
        flags: int = 0,
        expiration: int = 0,
        datatype: int | None = None,
    ) -> HistoryItem:
        """Store a document (a dict/list/number is JSON-encoded with the JSON datatype; ``datatype`` overrides it)."""
        k = key.encode() if isinstance(key, str) else key
        raw, dt = _value(value if value is not None else {"key": k.decode("utf-8", "replace")})
        dt = dt if datatype is None else datatype
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
        self,
        key: bytes | str,
        value: Any = None,
        *,
        collection: str | int = 0,
        level: int = 1,
        delete: bool = False,
        flags: int = 0,
        expiration: int = 0,
        datatype: int | None = None,
    ) -> HistoryItem:
        """A sync-write prepare (durability level 1..3); its commit carries its value, flags, expiry and CAS."""
        k = key.encode() if isinstance(key, str) else key
        raw, dt = (b"", 0) if delete else _value(value if value is not None else {"key": k.decode("utf-8", "replace")})
        dt = dt if datatype is None or delete else datatype
        rec = HistoryItem(
            0, "prepare", k, self._cid(collection), raw, dt, durability=level, deleted=delete, flags=flags, expiration=expiration
        )
        return self._append(self.vbucket_of(k), rec)

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
        rec = HistoryItem(
            0, "commit", k, cid, p.value, p.datatype, flags=p.flags, expiration=p.expiration, prepared_seqno=p.seqno, deleted=p.deleted
        )
        return self._append(vb, rec, cas=p.cas)  # kv_engine: a commit keeps its prepare's CAS

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
    def _rewind_revs(self, vb: VBucket, docs: set[tuple[int, bytes]]) -> None:
        """The promoted replica never had the lost versions: each document's rev seqno is its last kept version's again."""
        kept = {(r.cid, r.key): r.rev_seqno for r in vb.log if r.kind != "system" and (r.cid, r.key) in docs}
        for dk in docs:
            if dk in kept:
                self._values[dk] = kept[dk]
            else:
                self._values.pop(dk, None)

    def failover(self, vbucket: int, *, lose: int = 0, partial: int = 0) -> int:
        """Hard-fail the vbucket's active node over: its replica is promoted; returns the new UUID.

        The replica may lag: it never received the last ``lose`` items, and the
        last ``partial`` items it has belong to a snapshot it had not completed.
        The promoted copy keeps what it has (the high seqno drops by ``lose``) and
        gets a new failover entry at the end of its last *complete* snapshot
        (kv_engine ``CheckpointManager::getFailoverSeqno``), so a consumer that has
        items above it rolls back to it.  The old node holds the vbucket no more
        (its connections get NotMyVbucket for it), the vbucket has no replica
        until a rebalance, the cluster map's revision is bumped, and every live
        stream of the vbucket ends StateChanged: consumers reconnect to the node
        the new map names.

        Raises ValueError with one node (nothing to promote: create the cluster
        with ``nodes >= 2``) or when the vbucket has no replica left.
        """
        if self.cluster.nodes < 2:
            raise ValueError("failover promotes a replica: it needs a cluster of nodes >= 2 (Cluster(nodes=2) / Simulator(nodes=2))")
        vb = self.vbuckets[vbucket]
        replicas = [n for n in vb.nodes[1:] if n != _NO_NODE]
        if not replicas:
            raise ValueError(f"vbucket {vbucket} has no replica to promote (already failed over)")
        if lose < 0 or partial < 0:
            raise ValueError("lose and partial must be >= 0")
        old, new = vb.nodes[0], replicas[0]
        if lose:
            vb.high_seqno = max(vb.high_seqno - lose, 0)
            lost = {(r.cid, r.key) for r in vb.log if r.seqno > vb.high_seqno and r.kind != "system"}
            vb.log = [r for r in vb.log if r.seqno <= vb.high_seqno]
            self._rewind_revs(vb, lost)
            for cid, high in list(vb.collection_highs.items()):
                if high > vb.high_seqno:
                    vb.collection_highs[cid] = max((r.seqno for r in vb.log if r.cid == cid), default=0)
            vb.purge_seqno = min(vb.purge_seqno, vb.high_seqno)
        seqno = max(vb.high_seqno - partial, 0)
        uuid = self.cluster.new_uuid()
        before = list(vb.failover_log)
        vb.add_failover_entry(uuid, seqno)
        vb.nodes = [new, *[_NO_NODE] * (len(vb.nodes) - 1)]
        vb.state = _ACTIVE
        vb.generation += 1
        self.cluster.rev += 1
        removed = [[u, s] for u, s in before if (u, s) not in vb.failover_log]
        self.cluster.note(
            "failover",
            bucket=self.name,
            vb=vbucket,
            old_node=old,
            new_node=new,
            uuid=uuid,
            seqno=seqno,
            high_seqno=vb.high_seqno,
            lost=lose,
            partial=partial,
            removed=removed,
            rev=self.cluster.rev,
        )
        self.cluster.changed()
        return uuid

    def purge(self, vbucket: int, upto: int | None = None) -> int:
        """Compaction: purge tombstones and completed prepares with seqno <= ``upto`` (default: all); returns the purge seqno.

        The purge seqno becomes the seqno of the newest item purged (never lower
        than before), as kv_engine's compaction sets it, not the high seqno.
        """
        vb = self.vbuckets[vbucket]
        upto = vb.high_seqno if upto is None else min(upto, vb.high_seqno)
        completed = {r.prepared_seqno for r in vb.log if r.kind in ("commit", "abort")}

        gone = []
        for r in vb.log:
            if not r.purged and r.seqno <= upto and (r.is_tombstone or (r.kind == "prepare" and r.seqno in completed)):
                r.purged = True
                gone.append(r.seqno)
        vb.purge_seqno = max([vb.purge_seqno, *gone])
        self.cluster.note("purge", bucket=self.name, vb=vbucket, purge_seqno=vb.purge_seqno, high_seqno=vb.high_seqno, purged=len(gone))
        self.cluster.changed()
        return vb.purge_seqno

    def set_state(self, vbucket: int, state: int | str) -> None:
        """Change a vbucket's state on its active node (1 active, 2 replica, 3 pending, 4 dead); live streams end (StateChanged)."""
        vb = self.vbuckets[vbucket]
        vb.state = VBUCKET_STATES[state] if isinstance(state, str) else state
        vb.generation += 1
        self.cluster.note("set_state", bucket=self.name, vb=vbucket, state=vb.state)
        self.cluster.changed()

    def disk_pressure(self, on: bool = True) -> None:
        """Disk use above ``dcp_backfill_idle_disk_threshold`` and backfills stalled (True), or back to normal.

        While it is on, no backfill makes progress; a stream whose backfill made no
        progress for the cluster's ``backfill_idle_limit`` ends Slow
        (kv_engine ``DCPBackfillDiskToStream::isSlow``).  Streaming from memory goes on.
        """
        self.disk_pressure_on = on
        self.cluster.note("disk_pressure", bucket=self.name, on=on)
        self.cluster.changed()

    def fail_backfills(self, vbucket: int | None = None, *, times: int = 1) -> None:
        """The next ``times`` backfills of ``vbucket`` (None: of any vbucket) fail: their streams end BackfillFail."""
        self.backfill_failures[vbucket] = self.backfill_failures.get(vbucket, 0) + times
        self.cluster.note("backfill_failure_armed", bucket=self.name, vb=vbucket, times=times)
        self.cluster.changed()

    def take_backfill_failure(self, vbucket: int) -> bool:
        """Whether a backfill of ``vbucket`` starting now fails (uses up one armed failure)."""
        for key in (vbucket, None):
            if self.backfill_failures.get(key, 0) > 0:
                self.backfill_failures[key] -= 1
                return True
        return False

    def drop_cursors(self, vbucket: int | None = None) -> int:
        """Memory pressure: drop the checkpoint cursors of the in-memory streams of ``vbucket`` (None: all).

        Only connections that allow it are affected (every connection by default,
        except those whose DCP name contains ``replication`` unless they sent
        ``supports_cursor_dropping=true``; kv_engine ``DcpProducer``).  Their
        streams do not end: they go on with a disk backfill from where they were.
        Returns how many streams were switched.
        """
        n = 0
        for conn in list(self.cluster.connections):
            drop = getattr(conn, "drop_cursors", None)
            if drop is not None and conn.bucket is self:
                n += drop(vbucket)
        self.cluster.note("cursors_dropped", bucket=self.name, vb=vbucket, streams=n)
        self.cluster.changed()
        return n

    def lose_privileges(self, user: str | None = None) -> None:
        """Revoke a user's (None: every user's) DCP privileges on this bucket: their streams end LostPrivileges.

        A non-collection connection sees the end as OK (kv_engine ``mapEndStreamStatus``);
        new stream requests from the user are refused (EACCESS) until :meth:`restore_privileges`.
        """
        users = set(self.cluster.users) if user is None else {user}
        self.revoked |= users
        self.cluster.note("privileges_lost", bucket=self.name, users=sorted(users))
        self.cluster.changed()

    def restore_privileges(self, user: str | None = None) -> None:
        """Give a user (None: everyone) back the privileges :meth:`lose_privileges` took."""
        self.revoked -= set(self.cluster.users) if user is None else {user}
        self.cluster.note("privileges_restored", bucket=self.name, user=user)
        self.cluster.changed()


def _value(value: Any) -> tuple[bytes, int]:
    if isinstance(value, bytes):
        return value, 0
    if isinstance(value, str):
        return value.encode(), 0
    return json.dumps(value, separators=(",", ":")).encode(), _JSON


class Cluster:
    """Buckets, users, data nodes and the connections streaming from them; deterministic given ``seed``.

    Args:
        users: user name -> password.
        nodes: data nodes (one port each at the edge).  With two or more, every
            vbucket has one replica (active on ``vb % nodes``, replica on ``(vb + 1) % nodes``).
        seed: seeds the vbucket UUIDs.
        idle_timeout: kv_engine's dcp_idle_timeout (seconds without receiving anything, noops on).
        slow_after: removed (must be ``None``): kv_engine never ends a stream Slow because
            the consumer stopped acking; see :meth:`Bucket.disk_pressure`.
        backfill_idle_limit: seconds a backfill may make no progress under disk pressure
            before its stream ends Slow (kv_engine's ``dcp_backfill_idle_limit_seconds``).
        checkpoint_items: seqnos per checkpoint (memory snapshots never cross a multiple of it).
        max_batch: bytes one :meth:`~dcpinspect.live.producer.ProducerConnection.pump` queues before yielding.
        output_limit: bytes of output a connection holds (produced, not yet taken with
            :meth:`~dcpinspect.live.producer.ProducerConnection.data_to_send`) before it stops producing more: requests
            wait unhandled (:attr:`~dcpinspect.live.producer.ProducerConnection.want_read` is false) and streams pause,
            flow control or not.  A client that never reads cannot grow a connection's output.
        journal_max: entries kept in :attr:`journal` (the oldest are dropped beyond it).

    :attr:`addresses` holds each node's (host, port) once an edge listens for it;
    :attr:`rev` is the cluster map's revision (bumped when a vbucket map changes);
    :attr:`on_change` is called (by :meth:`changed`) after any data change, so an
    edge can wake its streaming connections: it must not run them re-entrantly
    (the Simulator schedules a kick on its loop).

    :attr:`journal` is the simulator's own record of what it did (the ground truth a
    timeline built from a capture can be checked against): one dict per event, with
    ``event`` one of ``vbucket_created``, ``failover`` (``old_node``/``new_node``),
    ``purge``, ``set_state``, ``scope_created``, ``collection_created``,
    ``collection_dropped``, ``disk_pressure``, ``backfill_failure_armed``,
    ``cursors_dropped``, ``privileges_lost``, ``privileges_restored``, ``disconnect``
    (bucket/cluster-level), ``stream_request`` (``decision`` ``success`` / ``rollback``
    / ``error`` with the ``rollback_seqno`` or ``status``), ``marker``, ``oso``,
    ``item`` (``opcode`` name and ``seqno``: documents, system events, sync writes,
    seqno-advanced), ``set_vbucket_state``, ``stream_end`` (wire ``status``, internal
    ``reason``; ``status`` None for Disconnected, which is never sent),
    ``stream_replaced``, ``cursor_dropped``, ``backfill_failed``, ``close_stream``,
    ``seqno_ack``, ``buffer_ack`` and ``flow_blocked`` (connection-level).  Stream
    entries carry the connection (``conn``: a serial number, ``name``: the DCP_OPEN
    name), ``vb`` and ``sid``, and are noted when the frame is sent, not when it is queued.
    """

    def __init__(
        self,
        users: Mapping[str, str] | None = None,
        *,
        nodes: int = 1,
        seed: int = 0,
        idle_timeout: float = DCP_IDLE_TIMEOUT,
        slow_after: float | None = None,
        backfill_idle_limit: float = BACKFILL_IDLE_LIMIT,
        checkpoint_items: int = 50,
        max_batch: int = 1 << 20,
        output_limit: int = 1 << 20,
        journal_max: int = JOURNAL_MAX,
    ) -> None:
        if slow_after is not None:
            raise ValueError(_SLOW_AFTER_REMOVED)
        if nodes < 1:
            raise ValueError(f"nodes must be >= 1, not {nodes}")
        self.journal: deque[dict[str, Any]] = deque(maxlen=journal_max)
        self._serial = 0  # the last connection serial handed out
        self.users = dict(users if users is not None else {"Administrator": "password"})
        self.buckets: dict[str, Bucket] = {}
        self.nodes = nodes
        #: (host, port) of each node, filled by the edge that listens for it
        self.addresses: list[tuple[str, int] | None] = [None] * nodes
        #: the cluster map's revision
        self.rev = 1
        #: called by :meth:`changed` (the edge's wake-up; must not run connections re-entrantly)
        self.on_change: Callable[[], None] | None = None
        self.idle_timeout = idle_timeout
        self.backfill_idle_limit = backfill_idle_limit
        self.checkpoint_items = checkpoint_items
        self.max_batch = max_batch
        self.output_limit = output_limit
        self.connections: list[Connection] = []
        self._rng = random.Random(seed)
        self._cas = 0x1700000000000000

    @property
    def slow_after(self) -> None:
        """Removed: always ``None`` (setting it raises ValueError, see :meth:`Bucket.disk_pressure`)."""
        return None

    @slow_after.setter
    def slow_after(self, value: float | None) -> None:
        if value is not None:
            raise ValueError(_SLOW_AFTER_REMOVED)

    def __repr__(self) -> str:
        return f"Cluster(nodes={self.nodes}, buckets={sorted(self.buckets)}, connections={len(self.connections)})"

    def note(self, event: str, **fields: Any) -> None:
        """Add an entry to :attr:`journal`."""
        self.journal.append({"event": event, **fields})

    def changed(self) -> None:
        """Data changed outside a connection's own pump: tell the edge (:attr:`on_change`)."""
        if self.on_change is not None:
            self.on_change()

    def new_uuid(self) -> int:
        """A fresh vbucket UUID: 48 bits, never 0 (kv_engine ``FailoverTable::generateUuid``: next() >> 16)."""
        while True:
            uuid = self._rng.getrandbits(64) >> 16
            if uuid:
                return uuid

    def next_cas(self) -> int:
        """A fresh, increasing CAS."""
        self._cas += 1 << 16
        return self._cas

    def initial_nodes(self, vbid: int) -> list[int]:
        """Where a new vbucket lives: [active] with one node, [active, replica] with more."""
        if self.nodes == 1:
            return [0]
        return [vbid % self.nodes, (vbid + 1) % self.nodes]

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

    def drop_connections(self, reason: str = "dropped by scenario", *, node: int | None = None) -> int:
        """Close every connection (of one node, or all): their streams end Disconnected, which is never sent.

        The edge then closes the sockets.  Returns how many connections were closed.
        """
        conns = [c for c in self.connections if node is None or getattr(c, "node", 0) == node]
        self.note("disconnect", reason=reason, node=node, connections=len(conns))
        for c in conns:
            disconnect = getattr(c, "disconnect_streams", None)
            if disconnect is not None:
                disconnect(reason)
            c.close(reason)
        self.changed()
        return len(conns)
