r"""The data-node surface of a simulated connection: cluster map, collections, stats and the KV commands.

Mixed into :class:`~dcpinspect.live.producer.ProducerConnection` (its dispatch
table names these handlers).  Enough of a Couchbase data node for real clients
(the official SDKs bootstrap from it; kv_engine's rules are cited per handler):

1. GET_CLUSTER_CONFIG (0xb5): the global config without a bucket, the bucket's
   after SELECT_BUCKET (:func:`~dcpinspect.live.clustermap.config_json`); with the
   16-byte known-version extras an empty reply when the client is up to date.
2. COLLECTIONS_GET_MANIFEST (0xba) and COLLECTIONS_GET_ID (0xbb, path
   ``scope.collection``; 12-byte extras: manifest uid u64 + collection id u32).
3. STAT groups: the default one (empty key), ``dcp``, ``dcpagg``, ``vbucket-seqno``
   and ``failovers``: one response per stat, then one with an empty key.
4. GET / SET / ADD / REPLACE / DELETE with collection-prefixed keys when HELLO
   Collections was agreed, flags/expiry extras, datatype (snappy values are
   inflated), CAS, and 16-byte mutation extras (vbucket uuid + seqno) when HELLO
   MutationSeqno was agreed.  The vbucket must be active on this connection's
   node (else NotMyVbucket with the bucket's config); a durability frame info makes
   the write a sync write (prepare then commit, replied after the commit).  Every
   change goes through the bucket's workload methods, so it streams over DCP, and
   then tells the cluster (``changed``) so streaming connections wake up.

Simulator limits: documents live in the vbucket their key hashes to (a request
naming another vbucket is NotMyVbucket); no xattr or subdoc commands; expiry
times are stored as given, and nothing expires by itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

from ..flows.session import ConnState
from ..protocol.enums import Datatype, Feature, Opcode, Status, VBucketState
from ..protocol.session import control_on
from ..wire.dissection import Dissection
from ..wire.framing import decode_leb128, parse_frame_infos
from ..wire.values import inflate_snappy
from .cluster import Bucket, Cluster, HistoryItem, vbucket_for_key
from .clustermap import config_json

__all__ = ["STAT_GROUPS", "DataNodeMixin", "inflate_value"]

#: the STAT groups the simulator answers (the default group is the empty key)
STAT_GROUPS: tuple[str, ...] = ("", "dcp", "dcpagg", "vbucket-seqno", "failovers")
#: the most a snappy value may inflate to (kv_engine's default max item size is 20 MiB)
MAX_INFLATED = 20 * 1024 * 1024

_ACTIVE = int(VBucketState.ACTIVE)
_DEAD = int(VBucketState.DEAD)
_JSON, _SNAPPY, _XATTR = int(Datatype.JSON), int(Datatype.SNAPPY), int(Datatype.XATTR)
_DURABILITY = 1  # frame info id: DurabilityRequirement
_LEVELS = range(1, 4)
_NAME = re.compile(r"[A-Za-z0-9_%-]{1,251}")
_VERSION = "7.6.0-dcpinspect"
_VBUCKET_SEQNO_STATS = (
    "high_seqno",
    "abs_high_seqno",
    "last_persisted_seqno",
    "uuid",
    "purge_seqno",
    "last_persisted_snap_start",
    "last_persisted_snap_end",
    "high_prepared_seqno",
    "high_completed_seqno",
    "max_visible_seqno",
)
#: datatype bit -> the HELLO feature a client must have agreed to set it (kv_engine daemon/mcbp_validators.cc)
_DATATYPE_FEATURES = ((_JSON, Feature.JSON), (_SNAPPY, Feature.SNAPPY), (_XATTR, Feature.XATTR))


def inflate_value(data: bytes) -> bytes | None:
    """A snappy request value inflated, or ``None``: not snappy, or above the largest item the server stores."""
    length, _used, _problem = decode_leb128(data, 0)
    if length is None or length > MAX_INFLATED:
        return None
    out, problem = inflate_snappy(data)
    return out if problem is None else None


def _strip_xattrs(value: bytes) -> bytes:
    """The document body without its xattr section (u32 length + pairs)."""
    if len(value) < 4:
        return b""
    return value[4 + int.from_bytes(value[:4], "big") :]


def _looks_json(value: bytes) -> bool:
    try:
        json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return False
    return True


class DataNodeMixin:
    """KV, collections, cluster-map and stat commands of a producer connection."""

    # --- supplied by the connection -------------------------------------------------------
    cluster: Cluster
    bucket: Bucket | None
    session: ConnState
    node: int
    serial: int
    closed: bool

    @property
    def features(self) -> tuple[int, ...]:
        """The HELLO features the connection agreed (the connection's)."""
        raise NotImplementedError

    def _reply(self, d: Dissection, status: int = Status.SUCCESS, *, now: float, **kw: Any) -> None:
        raise NotImplementedError

    def _need_bucket(self, d: Dissection, now: float) -> Bucket | None:
        raise NotImplementedError

    # --- vbuckets on this node -------------------------------------------------------------
    def vbucket_state(self, b: Bucket, vbid: int) -> int:
        """The state ``vbid`` has on this connection's node (dead: no copy here)."""
        return int(b.state_on(vbid, self.node))

    def holds_vbucket(self, b: Bucket, vbid: int) -> bool:
        """Whether this node has a copy of ``vbid`` (in any state, dead included)."""
        if not 0 <= vbid < len(b.vbuckets):
            return False
        return self.cluster.nodes <= 1 or self.node in b.vbucket_map()[vbid] or self.vbucket_state(b, vbid) != _DEAD

    def _json_reply(self, d: Dissection, status: int, obj: Any, *, now: float) -> None:
        self._reply(d, status, value=json.dumps(obj, separators=(",", ":")).encode(), datatype=_JSON, now=now)

    # --- cluster map ------------------------------------------------------------------
    def _cluster_config(self, d: Dissection, now: float) -> None:
        """The cluster map (kv_engine daemon/protocol/mcbp/cluster_config_executor.cc).

        An empty reply instead when the (epoch, revision) the client says it knows is not older.
        """
        cfg = config_json(self.cluster, self.bucket, node=self.node)
        known = d.extras
        if "epoch" in known and (int(known["epoch"]), int(known["revision"])) >= (cfg["revEpoch"], cfg["rev"]):
            self._reply(d, now=now)
            return
        self._json_reply(d, Status.SUCCESS, cfg, now=now)

    # --- collections -----------------------------------------------------------------
    def _collections_manifest(self, d: Dissection, now: float) -> None:
        """The bucket's manifest as kv_engine answers COLLECTIONS_GET_MANIFEST (ids and uid in hex strings)."""
        b = self._need_bucket(d, now)
        if b is None:
            return
        m = b.manifest
        scopes = []
        for sid, sname in sorted(m.scopes.items()):
            colls = []
            for cid, (cname, csid, ttl) in sorted(m.collections.items()):
                if csid == sid:
                    entry: dict[str, Any] = {"name": cname, "uid": f"{cid:x}"}
                    if ttl is not None:
                        entry["maxTTL"] = ttl
                    colls.append(entry)
            scopes.append({"name": sname, "uid": f"{sid:x}", "collections": colls})
        self._json_reply(d, Status.SUCCESS, {"uid": f"{m.uid:x}", "scopes": scopes}, now=now)

    def _collection_id(self, d: Dissection, now: float) -> None:
        """A collection's id (kv_engine engines/ep/src/collections/manager.cc ``getCollectionID``).

        The path ``scope.collection`` is in the key, else the value; an empty part is ``_default``;
        exactly one dot, valid names.
        """
        b = self._need_bucket(d, now)
        if b is None:
            return
        path = (d.frame.key or d.frame.value).decode("utf-8", "replace")
        scope, dot, coll = path.partition(".")
        scope, coll = scope or "_default", coll or "_default"
        if path.count(".") != 1 or not dot or not _NAME.fullmatch(scope) or not _NAME.fullmatch(coll):
            self._reply(d, Status.EINVAL, now=now)
            return
        m = b.manifest
        uid = {"manifest_uid": f"{m.uid:x}"}
        sid = next((i for i, name in m.scopes.items() if name == scope), None)
        if sid is None:
            self._json_reply(d, Status.UNKNOWN_SCOPE, uid, now=now)
            return
        cid = next((i for i, (name, s, _t) in m.collections.items() if name == coll and s == sid), None)
        if cid is None:
            self._json_reply(d, Status.UNKNOWN_COLLECTION, uid, now=now)
            return
        self._reply(d, extras={"manifest_uid": m.uid, "collection_id": cid}, now=now)

    # --- stats ---------------------------------------------------------------------------
    def _stat(self, d: Dissection, now: float) -> None:
        """STAT ``group [arg]``: one response per stat (key = name, value = ASCII), then an empty one.

        Groups: the default (empty key), ``dcp``, ``dcpagg <separator>``, ``vbucket-seqno [vb]``,
        ``failovers [vb]``; any other is KeyEnoent.  Every group but the default needs a bucket.
        """
        group, _, arg = d.key_text.partition(" ")
        if group not in STAT_GROUPS:
            self._reply(d, Status.KEY_ENOENT, now=now)
            return
        b = self.bucket
        if group and b is None:
            self._reply(d, Status.NO_BUCKET, now=now)
            return
        try:
            stats = list(_STAT_BUILDERS[group](self, b, arg, now))
        except _StatError as exc:
            self._reply(d, exc.status, now=now)
            return
        for k, v in stats:
            self._reply(d, key=k, value=str(v), now=now)
        self._reply(d, now=now)

    def _stats_default(self, b: Bucket | None, arg: str, now: float) -> Iterator[tuple[str, Any]]:
        del arg
        conns = self.cluster.connections
        yield from (("pid", 1), ("uptime", int(now)), ("version", _VERSION))  # uptime: the node's own clock
        yield ("curr_connections", len(conns))
        if b is not None:
            states = [self.vbucket_state(b, vb.id) for vb in b.vbuckets]
            items = sum(1 for _ in _live_documents(b))
            yield from (("curr_items", items), ("curr_items_tot", items), ("ep_bucket_type", "persistent"))
            yield ("ep_max_vbuckets", len(b.vbuckets))
            for name, state in (("active", VBucketState.ACTIVE), ("replica", VBucketState.REPLICA), ("pending", VBucketState.PENDING)):
                yield (f"vb_{name}_num", states.count(int(state)))
            yield ("ep_dcp_count", len(_dcp_connections(self.cluster, b)))

    def _stats_vbucket_seqno(self, b: Bucket | None, arg: str, now: float) -> Iterator[tuple[str, Any]]:
        assert b is not None
        for vb in self._stat_vbuckets(b, arg):
            h = vb.high_seqno
            hps = max((r.seqno for r in vb.log if r.kind == "prepare"), default=0)
            hcs = max((r.prepared_seqno for r in vb.log if r.kind in ("commit", "abort")), default=0)
            mvs = max((r.seqno for r in vb.log if r.kind not in ("prepare", "abort")), default=0)
            values = (h, h, h, vb.uuid, vb.purge_seqno, h, h, hps, hcs, mvs)
            yield from ((f"vb_{vb.id}:{name}", value) for name, value in zip(_VBUCKET_SEQNO_STATS, values, strict=True))

    def _stats_failovers(self, b: Bucket | None, arg: str, now: float) -> Iterator[tuple[str, Any]]:
        """kv_engine engines/ep/src/failover-table.cc ``addStats`` (entry 0 is the newest)."""
        assert b is not None
        for vb in self._stat_vbuckets(b, arg):
            yield (f"vb_{vb.id}:num_entries", len(vb.failover_log))
            yield (f"vb_{vb.id}:num_erroneous_entries_erased", 0)
            for i, (uuid, seqno) in enumerate(vb.failover_log):
                yield (f"vb_{vb.id}:{i}:id", uuid)
                yield (f"vb_{vb.id}:{i}:seq", seqno)

    def _stat_vbuckets(self, b: Bucket, arg: str) -> list[Any]:
        if not arg:
            return [vb for vb in b.vbuckets if self.holds_vbucket(b, vb.id)]
        if not arg.isascii() or not arg.isdigit():
            raise _StatError(Status.EINVAL)
        vbid = int(arg)
        if not self.holds_vbucket(b, vbid):
            raise _StatError(Status.NOT_MY_VBUCKET)
        return [b.vbuckets[vbid]]

    def _stats_dcp(self, b: Bucket | None, arg: str, now: float) -> Iterator[tuple[str, Any]]:
        """Per DCP connection ``eq_dcpq:<name>:<stat>``, per stream ``...:stream_<vb>_<stat>``.

        As kv_engine engines/ep/src/dcp/producer.cc and active_stream.cc ``addStats`` name them.
        """
        del arg
        assert b is not None
        conns = _dcp_connections(self.cluster, b)
        yield from (("ep_dcp_count", len(conns)), ("ep_dcp_producer_count", len(conns)), ("ep_dcp_consumer_count", 0))
        for c in conns:
            p = f"eq_dcpq:{c.dcp_name}:"
            controls: dict[str, str] = getattr(c, "controls", {})
            buffer_size = int(getattr(c, "buffer_size", 0))
            streams = list(getattr(c, "streams", {}).values())
            yield from (
                (p + "type", "producer"),
                (p + "created", int(getattr(c, "serial", 0))),
                (p + "flow_control", "enabled" if buffer_size else "disabled"),
                (p + "max_buffer_bytes", buffer_size),
                (p + "unacked_bytes", int(getattr(c, "bytes_outstanding", 0))),
                (p + "items_sent", int(getattr(c, "sent_frames", 0))),
                (p + "noop_enabled", str(bool(getattr(c, "noop_enabled", False))).lower()),
                (p + "noop_tx_interval", f"{float(getattr(c, 'noop_interval', 0.0)):g}s"),
                (p + "noop_wait", str(bool(getattr(c, "_noop_pending", False))).lower()),
                (
                    p + "send_stream_end_on_client_close_stream",
                    str(control_on("send_stream_end_on_client_close_stream", controls)).lower(),
                ),
                (p + "enable_stream_id", str(control_on("enable_stream_id", controls)).lower()),
                (p + "synchronous_replication", str(control_on("enable_sync_writes", controls)).lower()),
                (p + "num_streams", len(streams)),
            )
            for st in streams:
                sp = f"{p}stream_{st.vb}_"
                yield from (
                    (sp + "opaque", st.opaque),
                    (sp + "flags", f"0x{st.flags:x}"),
                    (sp + "state", "dead" if st.dead else "backfilling" if st.backfill_end else "in-memory"),
                    (sp + "start_seqno", st.start),
                    (sp + "end_seqno", st.end),
                    (sp + "last_sent_seqno", getattr(st, "last_queued", 0)),
                )

    def _stats_dcpagg(self, b: Bucket | None, arg: str, now: float) -> Iterator[tuple[str, Any]]:
        """DCP connections grouped by the part of their name before the separator, plus ``<sep>total``.

        As kv_engine engines/ep/src/ep_engine.cc ``ConnAggStatBuilder`` (separator ``:`` unless given).
        """
        assert b is not None
        sep = arg or ":"
        groups: dict[str, list[Any]] = {}
        conns = _dcp_connections(self.cluster, b)
        for c in conns:
            name = str(c.dcp_name)
            groups.setdefault(name.split(sep, 1)[0] if sep in name else "_unknown", []).append(c)
        groups[f"{sep}total"] = conns
        for prefix, members in groups.items():
            yield from (
                (f"{prefix}:count", len(members)),
                (f"{prefix}:producer_count", len(members)),
                (f"{prefix}:activestream_count", sum(len(getattr(c, "streams", {})) for c in members)),
                (f"{prefix}:passivestream_count", 0),
                (f"{prefix}:items_sent", sum(int(getattr(c, "sent_frames", 0)) for c in members)),
                (f"{prefix}:items_remaining", 0),
                (f"{prefix}:backoff", 0),
            )

    # --- KV ----------------------------------------------------------------------------
    def _kv_target(self, d: Dissection, now: float) -> tuple[Bucket, int, bytes, int] | None:
        """(bucket, collection id, key, vbucket) of a KV request, or ``None`` once it has been answered with an error."""
        b = self._need_bucket(d, now)
        if b is None:
            return None
        f = d.frame
        key = d.key if isinstance(d.key, bytes) else bytes(d.frame.key)
        cid = 0
        if Feature.COLLECTIONS in self.features:
            if d.cid is None:
                self._reply(d, Status.EINVAL, now=now)  # no valid LEB128 prefix
                return None
            cid = int(d.cid)
        if not key or len(key) > 250:
            self._reply(d, Status.EINVAL, now=now)
            return None
        vbid = f.vbucket or 0
        if (
            vbid >= len(b.vbuckets)
            or self.vbucket_state(b, vbid) != _ACTIVE
            or b.vbuckets[vbid].state != _ACTIVE
            or vbucket_for_key(key, len(b.vbuckets)) != vbid
        ):
            self._json_reply(d, Status.NOT_MY_VBUCKET, config_json(self.cluster, b, node=self.node), now=now)
            return None
        if cid not in b.manifest.collections:
            self._json_reply(d, Status.UNKNOWN_COLLECTION, {"manifest_uid": f"{b.manifest.uid:x}"}, now=now)
            return None
        return b, cid, key, vbid

    def _durability(self, d: Dissection, now: float) -> int | None:
        """The durability level a request asks for (0: none), or ``None`` once answered with an error."""
        infos, _problem = parse_frame_infos(d.frame.framing)
        for info in infos:
            if info.id != _DURABILITY:
                continue
            level = info.payload[0] if info.payload else 0
            timeout = int.from_bytes(info.payload[1:3], "big") if len(info.payload) >= 3 else None
            if level not in _LEVELS:
                self._reply(d, Status.DURABILITY_INVALID_LEVEL, now=now)
                return None
            if len(info.payload) not in (1, 3) or timeout in (0, 0xFFFF):
                self._reply(d, Status.EINVAL, now=now)
                return None
            return level
        return 0

    def _token(self, b: Bucket, vbid: int, rec: HistoryItem) -> dict[str, Any]:
        """The reply's CAS and, with HELLO MutationSeqno, the 16-byte extras (vbucket uuid, seqno)."""
        kw: dict[str, Any] = {"cas": rec.cas}
        if Feature.MUTATION_SEQNO in self.features:
            kw["extras"] = {"vb_uuid": b.vbuckets[vbid].uuid, "seqno": rec.seqno}
        return kw

    def _kv_get(self, d: Dissection, now: float) -> None:
        target = self._kv_target(d, now)
        if target is None:
            return
        b, cid, key, _vbid = target
        doc = b.document(key, cid)
        if doc is None:
            self._reply(d, Status.KEY_ENOENT, now=now)
            return
        value, datatype = doc.value, doc.datatype
        if datatype & _XATTR:
            value, datatype = _strip_xattrs(value), datatype & ~_XATTR
        if Feature.JSON not in self.features:
            datatype &= ~_JSON
        self._reply(d, extras={"flags": doc.flags}, value=value, datatype=datatype, cas=doc.cas, now=now)

    def _kv_value(self, d: Dissection, now: float) -> tuple[bytes, int] | None:
        """The request's value and datatype as stored, or ``None`` once answered with an error.

        Snappy values are inflated; JSON is detected when the client did not agree to say it.
        """
        f = d.frame
        datatype = f.datatype
        features = self.features
        if any(datatype & bit and feature not in features for bit, feature in _DATATYPE_FEATURES) or datatype & ~(_JSON | _SNAPPY | _XATTR):
            self._reply(d, Status.EINVAL, now=now)
            return None
        value = bytes(f.value)
        if datatype & _SNAPPY:
            inflated = inflate_value(value)
            if inflated is None:
                self._reply(d, Status.EINVAL, now=now)
                return None
            value, datatype = inflated, datatype & ~_SNAPPY
        if Feature.JSON not in features:
            body = _strip_xattrs(value) if datatype & _XATTR else value
            datatype = (datatype & ~_JSON) | (_JSON if _looks_json(body) else 0)
        return value, datatype

    def _kv_store(self, d: Dissection, now: float) -> None:
        """SET / ADD / REPLACE (kv_engine engines/ep/src/ep_engine.cc ``storeIfInner``).

        ADD of an existing document and a CAS mismatch are KeyExists, REPLACE of a missing one
        KeyEnoent, ADD with a CAS EINVAL.
        """
        op = d.frame.opcode
        cas = d.frame.cas
        if op == Opcode.ADD and cas:
            self._reply(d, Status.EINVAL, now=now)
            return
        target = self._kv_target(d, now)
        if target is None:
            return
        b, cid, key, vbid = target
        level = self._durability(d, now)
        stored = self._kv_value(d, now) if level is not None else None
        if level is None or stored is None:
            return
        value, datatype = stored
        doc = b.document(key, cid)
        status = _store_status(op, cas, doc)
        if status == Status.SUCCESS and _pending_sync_write(b, vbid, cid, key):
            status = Status.SYNC_WRITE_IN_PROGRESS
        if status != Status.SUCCESS:
            self._reply(d, status, now=now)
            return
        flags, expiration = int(d.extras.get("flags", 0)), int(d.extras.get("expiration", 0))
        if level:
            b.prepare(key, value, collection=cid, level=level, flags=flags, expiration=expiration, datatype=datatype)
            rec = b.commit(key, collection=cid)
        else:
            rec = b.mutate(key, value, collection=cid, flags=flags, expiration=expiration, datatype=datatype)
        self._reply(d, now=now, **self._token(b, vbid, rec))

    def _kv_delete(self, d: Dissection, now: float) -> None:
        """DELETE: a missing document is KeyEnoent, a CAS mismatch KeyExists."""
        target = self._kv_target(d, now)
        if target is None:
            return
        b, cid, key, vbid = target
        level = self._durability(d, now)
        if level is None:
            return
        doc = b.document(key, cid)
        status = Status.KEY_ENOENT if doc is None else Status.KEY_EEXISTS if d.frame.cas and d.frame.cas != doc.cas else Status.SUCCESS
        if status == Status.SUCCESS and _pending_sync_write(b, vbid, cid, key):
            status = Status.SYNC_WRITE_IN_PROGRESS
        if status != Status.SUCCESS:
            self._reply(d, status, now=now)
            return
        if level:
            b.prepare(key, collection=cid, level=level, delete=True)
            rec = b.commit(key, collection=cid)
        else:
            rec = b.delete(key, collection=cid)
        self._reply(d, now=now, **self._token(b, vbid, rec))


class _StatError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


_STAT_BUILDERS: dict[str, Callable[[DataNodeMixin, Bucket | None, str, float], Iterator[tuple[str, Any]]]] = {
    "": DataNodeMixin._stats_default,
    "dcp": DataNodeMixin._stats_dcp,
    "dcpagg": DataNodeMixin._stats_dcpagg,
    "vbucket-seqno": DataNodeMixin._stats_vbucket_seqno,
    "failovers": DataNodeMixin._stats_failovers,
}


def _dcp_connections(cluster: Cluster, b: Bucket) -> list[Any]:
    return [c for c in cluster.connections if getattr(c, "bucket", None) is b and getattr(c, "dcp_name", None) is not None]


def _store_status(op: int, cas: int, doc: HistoryItem | None) -> int:
    if op == Opcode.ADD:
        return Status.KEY_EEXISTS if doc is not None else Status.SUCCESS
    if doc is None:
        return Status.KEY_ENOENT if op == Opcode.REPLACE or cas else Status.SUCCESS
    return Status.KEY_EEXISTS if cas and cas != doc.cas else Status.SUCCESS


def _pending_sync_write(b: Bucket, vbid: int, cid: int, key: bytes) -> bool:
    """Whether the key has a prepare that is neither committed nor aborted (a sync write in progress)."""
    for r in reversed(b.vbuckets[vbid].log):
        if r.cid == cid and r.key == key and r.kind in ("prepare", "commit", "abort"):
            return r.kind == "prepare"
    return False


def _live_documents(b: Bucket) -> Iterator[tuple[int, bytes]]:
    seen: set[tuple[int, bytes]] = set()
    for vb in b.vbuckets:
        for r in reversed(vb.log):
            k = (r.cid, r.key)
            if r.kind in ("prepare", "abort", "system") or k in seen:
                continue
            seen.add(k)
            if not r.is_tombstone:
                yield k
