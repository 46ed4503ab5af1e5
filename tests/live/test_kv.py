"""The simulator as a data node for real clients: HELLO, SASL, error map, SELECT_BUCKET, cluster maps, collections,
stats and the KV commands, sans-IO and over TCP (SimNode), every change streamed over DCP."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import cramjam
import pytest
from producerpeer import FOREVER, Peer, names
from simnode import SimNode

from dcpinspect import encode
from dcpinspect.live.cluster import Cluster, vbucket_for_key
from dcpinspect.live.clustermap import ClusterMap, config_json, parse_config
from dcpinspect.live.producer import SUPPORTED_FEATURES
from dcpinspect.live.sasl import ScramClient, ScramServer, plain_payload
from dcpinspect.protocol.enums import Feature, Status
from dcpinspect.wire.decoder import FrameDecoder
from dcpinspect.wire.dissection import Dissection

SAFETY = 30.0
#: the features the official Python SDK 4.6 asks for, in its order
SDK_HELLO = [0x03, 0x06, 0x07, 0x08, 0x0B, 0x0C, 0x10, 0x0F, 0x11, 0x15, 0x12, 0x17, 0x14, 0x1C, 0x21, 0x0E, 0x0D, 0x1E, 0x0A, 0x04]
#: what the simulator agrees of them: only what it implements
SDK_AGREED = [0x03, 0x06, 0x07, 0x08, 0x0B, 0x10, 0x11, 0x12, 0x0A, 0x04]
KV_FEATURES = (Feature.COLLECTIONS, Feature.JSON, Feature.MUTATION_SEQNO, Feature.XERROR, Feature.ALT_REQUEST_SUPPORT, Feature.SNAPPY)


def kv_peer(cluster: Cluster, features: tuple[int, ...] = KV_FEATURES, node: int = 0) -> Peer:
    p = Peer(cluster)
    p.conn.node = node
    if features:
        assert p.request("HELLO", key="kv", value={"features": [(int(f),) for f in features]}).frame.status == 0
    assert p.status("SASL_AUTH", key="PLAIN", value=plain_payload("Administrator", "password")) == 0
    assert p.status("SELECT_BUCKET", key="default") == 0
    return p


def dcp_peer(cluster: Cluster, name: str, controls: dict[str, str] | None = None) -> Peer:
    """A DCP consumer with its own connection name (a reused name would close the older connection)."""
    p = kv_peer(cluster, features=(Feature.JSON,))
    assert p.status("DCP_OPEN", key=name, extras={"flags": 1}) == 0
    for k, v in (controls or {"enable_noop": "true"}).items():
        assert p.status("DCP_CONTROL", key=k, value=v) == 0, k
    return p


def make(vbuckets: int = 4, **kw: Any) -> tuple[Cluster, Peer]:
    cluster = Cluster(seed=5, **kw)
    cluster.create_bucket("default", vbuckets=vbuckets)
    return cluster, kv_peer(cluster)


def doc(p: Peer, op: str, key: str, *, cid: int | None = 0, **kw: Any) -> Dissection:
    vb = vbucket_for_key(key.encode(), len(p.cluster.buckets["default"].vbuckets))
    if op in ("SET", "ADD", "REPLACE"):
        kw.setdefault("extras", {"flags": 0x02000000, "expiration": 0})
    return p.request(op, key=key, cid=cid, vbucket=kw.pop("vbucket", vb), **kw)


# ---------------------------------------------------------------------------
# bootstrap


def test_hello_agrees_only_what_is_implemented_in_the_clients_order() -> None:
    cluster = Cluster(seed=1)
    cluster.create_bucket("default", vbuckets=4)
    p = Peer(cluster)
    reply = p.request("HELLO", key='{"a":"python/4.6.3","i":"x/y"}', value={"features": [(f,) for f in SDK_HELLO]})
    assert [f["feature"] for f in reply.body["features"]] == SDK_AGREED
    assert {Feature.DUPLEX, Feature.TRACING, Feature.UNORDERED_EXECUTION, Feature.CLUSTERMAP_CHANGE_NOTIFICATION}.isdisjoint(
        SUPPORTED_FEATURES
    )
    assert p.conn.features == tuple(SDK_AGREED)


@pytest.mark.parametrize("mech", ["SCRAM-SHA512", "SCRAM-SHA256", "SCRAM-SHA1"])
def test_scram_with_the_sdks_spaced_nonce(mech: str) -> None:
    _, p = make()
    p.conn.user = None
    nonce = "0x54 0x27 0xfffffffa 0x68 0xffffffb1 0x0d 0x27 0x1d"  # the C++ core's client nonce
    client = ScramClient(mech, "Administrator", "password", nonce=nonce)
    first = p.request("SASL_AUTH", key=mech, value=client.first())
    assert first.frame.status == Status.AUTH_CONTINUE
    attrs = dict(a.split("=", 1) for a in first.frame.value.decode().split(","))
    assert list(attrs) == ["r", "s", "i"] and attrs["i"] == "4096" and attrs["r"].startswith(nonce)
    final = p.request("SASL_STEP", key=mech, value=client.final(first.frame.value))
    assert final.frame.status == 0 and client.verify(final.frame.value) and p.conn.user == "Administrator"


def test_error_map_select_bucket_and_config_before_a_bucket() -> None:
    cluster, p = make()
    emap = p.request("GET_ERROR_MAP", value=(2).to_bytes(2, "big"))
    assert emap.frame.status == 0 and emap.document["revision"] >= 1 and emap.document["errors"]["86"]["attrs"]
    q = Peer(cluster)
    assert q.status("SASL_AUTH", key="PLAIN", value=plain_payload("Administrator", "password")) == 0
    cfg = q.request("GET_CLUSTER_CONFIG")
    assert cfg.frame.status == 0 and cfg.frame.datatype == 0x01
    glob = json.loads(cfg.frame.value)
    assert "vBucketServerMap" not in glob and glob["nodesExt"][0]["services"] == {"kv": 11210}
    assert q.status("SELECT_BUCKET", key="nope") == Status.KEY_ENOENT  # a user allowed every bucket (kv_engine select_bucket)
    assert q.status("SELECT_BUCKET", key="default") == 0


def test_cluster_config_names_every_node_and_the_vbucket_map() -> None:
    cluster = Cluster(seed=1, nodes=2)
    b = cluster.create_bucket("default", vbuckets=8)
    cluster.addresses[0], cluster.addresses[1] = ("127.0.0.1", 40001), ("127.0.0.1", 40002)
    cfg = config_json(cluster, b, node=1)
    assert isinstance(cfg["rev"], int) and isinstance(cfg["collectionsManifestUid"], str)
    assert [n["services"] for n in cfg["nodesExt"]] == [{"kv": 40001}, {"kv": 40002}]
    assert [n["thisNode"] for n in cfg["nodesExt"]] == [False, True]
    assert cfg["vBucketServerMap"]["vBucketMap"] == b.vbucket_map() and cfg["vBucketServerMap"]["numReplicas"] == 1
    m = parse_config(json.dumps(cfg).encode(), connected=("127.0.0.1", 40002))
    nodes = (("127.0.0.1", 40001), ("127.0.0.1", 40002))
    assert m == ClusterMap(cluster.rev, nodes, tuple(map(tuple, b.vbucket_map())), "default", this_node=1)  # thisNode read
    assert [m.active_node(vb) for vb in range(8)] == [row[0] for row in b.vbucket_map()] and m.active_node(8) is None
    assert parse_config(json.dumps(config_json(cluster, None, node=0)).encode(), connected=("h", 1)).bucket is None


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        (b"nope", "not JSON"),
        (b"[]", "not a JSON object"),
        (b'{"rev": 1}', "nodesExt"),
        (b'{"nodesExt": [{"hostname": "h"}]}', "services"),
        (b'{"rev": "3", "nodesExt": [{"services": {"kv": 1}}]}', "rev"),
        (b'{"nodesExt": [{"services": {"kv": "1"}}]}', "services.kv"),
        (b'{"nodesExt": [{"services": {"kv": 1}}], "vBucketServerMap": {"vBucketMap": [[0], [1]]}}', "outside nodesExt"),
    ],
)
def test_parse_config_refuses_what_no_client_could_route_with(config: bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_config(config, connected=("127.0.0.1", 11210))


def test_parse_config_host_placeholders() -> None:
    cfg = b'{"nodesExt": [{"services": {"kv": 5}, "hostname": "$HOST"}, {"services": {"kv": 6}}, {"services": {}, "hostname": "[::1]"}]}'
    assert parse_config(cfg, connected=("10.0.0.9", 5)).nodes == (("10.0.0.9", 5), ("10.0.0.9", 6), ("::1", 0))


def test_cluster_config_known_version_gets_an_empty_reply() -> None:
    cluster, p = make()
    rev = cluster.rev
    assert p.request("GET_CLUSTER_CONFIG", extras={"epoch": 1, "revision": rev}).frame.value == b""
    newer = p.request("GET_CLUSTER_CONFIG", extras={"epoch": 1, "revision": rev - 1})
    assert json.loads(newer.frame.value)["rev"] == rev


def test_collections_manifest_and_collection_ids() -> None:
    cluster, p = make()
    b = cluster.buckets["default"]
    b.create_scope("inventory")
    cid = b.create_collection("airline", scope="inventory")
    manifest = p.request("COLLECTIONS_GET_MANIFEST")
    assert manifest.frame.status == 0
    body = json.loads(manifest.frame.value)
    assert body["uid"] == f"{b.manifest.uid:x}"
    assert {"name": "airline", "uid": f"{cid:x}"} in next(s for s in body["scopes"] if s["name"] == "inventory")["collections"]
    got = p.request("COLLECTIONS_GET_ID", value="inventory.airline")
    assert got.frame.status == 0 and got.extras == {"manifest_uid": b.manifest.uid, "collection_id": cid}
    assert p.request("COLLECTIONS_GET_ID", key="._default").extras["collection_id"] == 0  # empty parts: _default
    assert p.status("COLLECTIONS_GET_ID", value="inventory.nope") == Status.UNKNOWN_COLLECTION
    assert p.status("COLLECTIONS_GET_ID", value="nope.airline") == Status.UNKNOWN_SCOPE
    assert p.status("COLLECTIONS_GET_ID", value="airline") == Status.EINVAL  # exactly one dot


def _stats(p: Peer, key: str) -> dict[str, str]:
    p.opaque += 1
    replies = [d for d in p.send(encode("STAT", key=key, opaque=p.opaque)) if d.frame.opaque == p.opaque]
    assert replies[-1].key_text == "" and replies[-1].frame.value == b"" and all(d.frame.status == 0 for d in replies)
    return {d.key_text: d.frame.value.decode() for d in replies[:-1]}


def test_stat_groups() -> None:
    cluster, p = make()
    b = cluster.buckets["default"]
    for i in range(5):
        b.mutate(f"s{i}", {"i": i})
    default = _stats(p, "")
    assert default["curr_items"] == "5" and "uptime" in default and default["vb_active_num"] == "4"
    d = Peer(cluster)
    d.bootstrap(controls={"enable_noop": "true", "connection_buffer_size": "1000"})
    d.stream_req(0)
    dcp = _stats(p, "dcp")
    assert dcp["eq_dcpq:test-conn:type"] == "producer" and dcp["eq_dcpq:test-conn:noop_enabled"] == "true"
    assert dcp["eq_dcpq:test-conn:max_buffer_bytes"] == "1000" and dcp["eq_dcpq:test-conn:num_streams"] == "1"
    assert "eq_dcpq:test-conn:stream_0_opaque" in dcp
    agg = _stats(p, "dcpagg :")
    assert agg[":total:count"] == "1" and agg["_unknown:producer_count"] == "1"  # no ':' in the name
    seqnos = _stats(p, "vbucket-seqno 2")
    assert seqnos["vb_2:high_seqno"] == str(b.vbuckets[2].high_seqno) and set(seqnos) == {k for k in seqnos if k.startswith("vb_2:")}
    fo = _stats(p, "failovers")
    assert fo["vb_3:num_entries"] == "1" and fo["vb_3:0:id"] == str(b.vbuckets[3].uuid)
    assert p.status("STAT", key="no-such-group") == Status.KEY_ENOENT
    assert p.status("STAT", key="failovers 99") == Status.NOT_MY_VBUCKET


# ---------------------------------------------------------------------------
# KV commands


def test_kv_status_rules() -> None:
    _, p = make()
    assert doc(p, "GET", "a").frame.status == Status.KEY_ENOENT
    assert doc(p, "REPLACE", "a", value=b"1").frame.status == Status.KEY_ENOENT
    assert doc(p, "DELETE", "a").frame.status == Status.KEY_ENOENT
    added = doc(p, "ADD", "a", value=b'{"v": 1}', datatype=1)
    assert added.frame.status == 0 and added.frame.cas
    assert doc(p, "ADD", "a", value=b"2").frame.status == Status.KEY_EEXISTS
    assert doc(p, "ADD", "b", value=b"2", cas=5).frame.status == Status.EINVAL  # ADD takes no CAS
    assert doc(p, "SET", "a", value=b"3", cas=added.frame.cas + 1).frame.status == Status.KEY_EEXISTS
    assert doc(p, "SET", "zz", value=b"3", cas=1).frame.status == Status.KEY_ENOENT
    replaced = doc(p, "REPLACE", "a", value=b'{"v": 2}', datatype=1, cas=added.frame.cas)
    assert replaced.frame.status == 0 and replaced.frame.cas > added.frame.cas
    got = doc(p, "GET", "a")
    assert (got.frame.cas, got.frame.datatype, got.frame.value, got.extras["flags"]) == (replaced.frame.cas, 1, b'{"v": 2}', 0x02000000)
    assert doc(p, "DELETE", "a", cas=added.frame.cas).frame.status == Status.KEY_EEXISTS
    assert doc(p, "DELETE", "a", cas=replaced.frame.cas).frame.status == 0
    assert doc(p, "GET", "a").frame.status == Status.KEY_ENOENT
    assert doc(p, "ADD", "a", value=b"again").frame.status == 0  # a deleted document can be added


def test_mutation_tokens_and_streaming_over_dcp() -> None:
    cluster, p = make(vbuckets=1)
    b = cluster.buckets["default"]
    s = doc(p, "SET", "k1", value=b'{"a": 1}', datatype=1)
    vb = b.vbuckets[0]
    assert s.extras == {"vb_uuid": vb.uuid, "seqno": vb.high_seqno}
    d = doc(p, "DELETE", "k1")
    assert d.extras["seqno"] == s.extras["seqno"] + 1
    c = Peer(cluster)
    c.bootstrap()
    items = [x for x in c.stream_req(0) if x.name in ("DCP_MUTATION", "DCP_DELETION")]
    # one snapshot holds a key once, in its newest version: the deletion
    assert [(x.name, x.key, x.frame.cas, x.extras["by_seqno"]) for x in items] == [("DCP_DELETION", b"k1", d.frame.cas, d.extras["seqno"])]


def test_a_live_stream_sees_each_kv_change() -> None:
    cluster, p = make(vbuckets=1)
    c = Peer(cluster)
    c.bootstrap()
    c.stream_req(0)
    s = doc(p, "SET", "live", value=b'{"x": 1}', datatype=1, extras={"flags": 7, "expiration": 0})
    got = [x for x in c.tick(0.0) if x.name == "DCP_MUTATION"]
    assert [(x.key, x.frame.cas, x.extras["by_seqno"], x.extras["flags"], x.document) for x in got] == [
        (b"live", s.frame.cas, s.extras["seqno"], 7, {"x": 1})
    ]


def test_without_mutation_seqno_there_are_no_extras_and_without_collections_keys_are_plain() -> None:
    cluster = Cluster(seed=5)
    cluster.create_bucket("default", vbuckets=4)
    p = kv_peer(cluster, features=(Feature.JSON,))
    s = doc(p, "SET", "plain", cid=None, value=b"[1]", datatype=1)
    assert s.frame.status == 0 and s.frame.extras_length == 0
    assert cluster.buckets["default"].document(b"plain", 0) is not None


def test_collection_prefixed_keys() -> None:
    cluster, p = make()
    b = cluster.buckets["default"]
    cid = b.create_collection("c1")
    assert doc(p, "SET", "k", cid=cid, value=b'"in c1"', datatype=1).frame.status == 0
    assert doc(p, "GET", "k", cid=cid).frame.value == b'"in c1"'
    assert doc(p, "GET", "k", cid=0).frame.status == Status.KEY_ENOENT
    unknown = doc(p, "SET", "k", cid=99, value=b"x")
    assert unknown.frame.status == Status.UNKNOWN_COLLECTION and json.loads(unknown.frame.value) == {"manifest_uid": f"{b.manifest.uid:x}"}


def test_datatypes_json_detection_snappy_and_refused_bits() -> None:
    cluster, p = make()
    body = b'{"name": "' + b"x" * 200 + b'"}'
    packed = bytes(cramjam.snappy.compress_raw(body))
    assert doc(p, "SET", "z", value=packed, datatype=0x03).frame.status == 0
    got = doc(p, "GET", "z")
    assert (got.frame.value, got.frame.datatype) == (body, 0x01)
    q = kv_peer(cluster, features=(Feature.COLLECTIONS,))  # no JSON, no Snappy agreed
    assert doc(q, "SET", "j", value=b'{"a": 1}', datatype=0x01).frame.status == Status.EINVAL
    assert doc(q, "SET", "j", value=packed, datatype=0x02).frame.status == Status.EINVAL
    assert doc(q, "SET", "j", value=b'{"a": 1}').frame.status == 0
    assert cluster.buckets["default"].document(b"j", 0).datatype == 0x01  # the server detects JSON itself
    assert doc(q, "GET", "j").frame.datatype == 0  # and does not claim it to a client that did not agree
    assert doc(p, "SET", "bad", value=b"\xff\x00 not snappy", datatype=0x02).frame.status == Status.EINVAL


def test_not_my_vbucket_carries_the_config() -> None:
    cluster = Cluster(seed=5, nodes=2)
    b = cluster.create_bucket("default", vbuckets=4)
    p = kv_peer(cluster, node=0)
    key = next(f"k{i}" for i in range(100) if b.vbucket_map()[vbucket_for_key(f"k{i}".encode(), 4)][0] == 1)
    nmvb = doc(p, "SET", key, value=b"1")
    assert nmvb.frame.status == Status.NOT_MY_VBUCKET and nmvb.frame.datatype == 0x01
    assert json.loads(nmvb.frame.value)["vBucketServerMap"]["vBucketMap"] == b.vbucket_map()
    other = kv_peer(cluster, node=1)
    assert doc(other, "SET", key, value=b"1").frame.status == 0
    wrong_vb = (vbucket_for_key(key.encode(), 4) + 2) % 4  # active on node 1 too, but not the key's vbucket
    assert doc(other, "GET", key, vbucket=wrong_vb).frame.status == Status.NOT_MY_VBUCKET


def test_durable_writes_are_prepare_then_commit() -> None:
    cluster, p = make(vbuckets=1)
    sync = dcp_peer(cluster, "sync", {"enable_noop": "true", "enable_sync_writes": "true", "consumer_name": "replica"})
    sync.stream_req(0)
    plain = dcp_peer(cluster, "plain")
    plain.stream_req(0)
    durable = doc(p, "SET", "kd", value=b'{"d": 1}', datatype=1, frame_infos=[(1, bytes([1, 0x23, 0x28]))])
    assert durable.frame.status == 0
    b = cluster.buckets["default"]
    assert [r.kind for r in b.vbuckets[0].log[-2:]] == ["prepare", "commit"]
    prepare, commit = b.vbuckets[0].log[-2:]
    assert commit.cas == prepare.cas == durable.frame.cas  # a commit keeps its prepare's CAS
    assert (commit.datatype, commit.value) == (prepare.datatype, prepare.value) == (1, b'{"d": 1}')
    assert durable.extras["seqno"] == b.vbuckets[0].high_seqno  # kv_engine returns the commit seqno by default
    assert names([x for x in sync.tick(0.0) if x.role == "request" and x.name != "DCP_NOOP"])[-2:] == ["DCP_PREPARE", "DCP_COMMIT"]
    mutation = [x for x in plain.tick(0.0) if x.name == "DCP_MUTATION"][-1]
    assert (mutation.key, mutation.frame.cas, mutation.extras["by_seqno"]) == (b"kd", durable.frame.cas, durable.extras["seqno"])
    assert doc(p, "GET", "kd").frame.value == b'{"d": 1}'
    bad = doc(p, "SET", "kd", value=b"1", frame_infos=[(1, bytes([9]))])
    assert bad.frame.status == Status.DURABILITY_INVALID_LEVEL
    assert doc(p, "DELETE", "kd", frame_infos=[(1, bytes([1]))]).frame.status == 0
    assert [r.kind for r in b.vbuckets[0].log[-2:]] == ["prepare", "commit"] and b.document(b"kd", 0) is None


def test_a_pending_sync_write_blocks_other_writes() -> None:
    cluster, p = make(vbuckets=1)
    cluster.buckets["default"].prepare("busy", {"p": 1})
    assert doc(p, "SET", "busy", value=b"1").frame.status == Status.SYNC_WRITE_IN_PROGRESS


def test_kv_needs_a_bucket_and_authentication() -> None:
    cluster = Cluster(seed=5)
    cluster.create_bucket("default", vbuckets=4)
    p = Peer(cluster)
    assert doc(p, "GET", "x", cid=None).frame.status == Status.EACCESS
    assert p.status("SASL_AUTH", key="PLAIN", value=plain_payload("Administrator", "password")) == 0
    assert doc(p, "GET", "x", cid=None).frame.status == Status.NO_BUCKET


# ---------------------------------------------------------------------------
# over TCP: the SDK's pipelined bootstrap and KV round trip against SimNode


class Wire:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.dec = FrameDecoder()
        self.frames: list[Any] = []
        self.ctx = None

    async def read_until(self, opaque: int) -> list[Any]:
        while not any(f.opaque == opaque and f.magic == 0x81 for f in self.frames):
            data = await asyncio.wait_for(self.reader.read(1 << 16), SAFETY)
            assert data, "closed"
            self.frames += self.dec.feed(data)
        out, self.frames = self.frames, []
        return out


def test_pipelined_bootstrap_and_kv_over_tcp() -> None:
    """The SDK writes HELLO + LIST_MECHS + SCRAM AUTH in one burst, then the rest in another: replies come in order."""

    async def main() -> None:
        cluster = Cluster(seed=9)
        b = cluster.create_bucket("default", vbuckets=64)
        async with SimNode(cluster) as node:
            reader, writer = await asyncio.open_connection(node.host, node.port)
            w = Wire(reader, writer)
            client = ScramClient("SCRAM-SHA512", "Administrator", "password", nonce="0x01 0xfffffffe 0x03")
            hello = encode("HELLO", key='{"a":"t","i":"1/2"}', value={"features": [(f,) for f in SDK_HELLO]}, opaque=1)
            writer.write(
                hello + encode("SASL_LIST_MECHS", opaque=2) + encode("SASL_AUTH", key="SCRAM-SHA512", value=client.first(), opaque=3)
            )
            got = await w.read_until(3)
            assert [(f.opcode, f.opaque, f.status) for f in got] == [(0x1F, 1, 0), (0x20, 2, 0), (0x21, 3, 0x21)]
            writer.write(encode("SASL_STEP", key="SCRAM-SHA512", value=client.final(got[2].value), opaque=4))
            assert client.verify((await w.read_until(4))[0].value)
            writer.write(
                encode("GET_ERROR_MAP", value=(2).to_bytes(2, "big"), opaque=5)
                + encode("SELECT_BUCKET", key="default", opaque=6)
                + encode("GET_CLUSTER_CONFIG", opaque=7)
            )
            got = await w.read_until(7)
            assert [(f.opcode, f.status) for f in got] == [(0xFE, 0), (0x89, 0), (0xB5, 0)]
            cfg = parse_config(got[2].value, connected=(node.host, node.port))
            assert cfg.nodes == ((node.host, node.port),) and len(cfg.vbucket_map) == 64 and cfg.bucket == "default"
            key = b"k1"
            vb = vbucket_for_key(key, 64)
            assert vb == 14  # the SDK's own hash
            writer.write(
                encode(
                    "SET",
                    key=key,
                    cid=0,
                    vbucket=vb,
                    extras={"flags": 0x02000000, "expiration": 0},
                    value=b'{"a": 1}',
                    datatype=1,
                    opaque=8,
                )
                + encode("GET", key=key, cid=0, vbucket=vb, opaque=9)
                + encode("DELETE", key=key, cid=0, vbucket=vb, opaque=10)
            )
            s, g, d = await w.read_until(10)
            assert (s.status, g.status, d.status) == (0, 0, 0)
            assert g.value == b'{"a": 1}' and g.cas == s.cas and g.datatype == 1
            assert int.from_bytes(s.extras[8:], "big") == b.vbuckets[vb].high_seqno - 1 and d.cas > s.cas
            assert int.from_bytes(s.extras[:8], "big") == b.vbuckets[vb].uuid < 2**48
            writer.close()

    asyncio.run(main())


def test_kv_writes_wake_a_dcp_stream_over_tcp() -> None:
    """A KV write on one connection reaches a DCP stream on another (the cluster tells the node to pump)."""

    async def main() -> None:
        cluster = Cluster(seed=9)
        cluster.create_bucket("default", vbuckets=1)
        async with SimNode(cluster) as node:
            dr, dw = await asyncio.open_connection(node.host, node.port)
            dcp = Wire(dr, dw)
            dw.write(
                encode("SASL_AUTH", key="PLAIN", value=plain_payload("Administrator", "password"), opaque=1)
                + encode("SELECT_BUCKET", key="default", opaque=2)
                + encode("DCP_OPEN", key="watch", extras={"flags": 1}, opaque=3)
                + encode(
                    "DCP_STREAM_REQ", extras={"start_seqno": 0, "end_seqno": FOREVER, "snap_start_seqno": 0, "snap_end_seqno": 0}, opaque=4
                )
            )
            assert [f.status for f in await dcp.read_until(4)] == [0, 0, 0, 0]
            kr, kw = await asyncio.open_connection(node.host, node.port)
            kv = Wire(kr, kw)
            kw.write(
                encode("HELLO", key="kv", value={"features": [(0x04,), (0x0B,)]}, opaque=1)
                + encode("SASL_AUTH", key="PLAIN", value=plain_payload("Administrator", "password"), opaque=2)
                + encode("SELECT_BUCKET", key="default", opaque=3)
                + encode("SET", key="w", extras={"flags": 0, "expiration": 0}, value=b'{"w": 1}', datatype=1, opaque=4)
            )
            s = (await kv.read_until(4))[-1]
            assert s.status == 0
            seqno = int.from_bytes(s.extras[8:], "big")
            while not any(f.opcode == 0x57 for f in dcp.frames):
                data = await asyncio.wait_for(dr.read(1 << 16), SAFETY)
                assert data
                dcp.frames += dcp.dec.feed(data)
            m = next(f for f in dcp.frames if f.opcode == 0x57)
            assert (m.key, m.cas, int.from_bytes(m.extras[:8], "big")) == (b"w", s.cas, seqno)
            dw.close()
            kw.close()

    asyncio.run(main())


def test_scram_server_accepts_any_printable_nonce_but_checks_the_proof() -> None:
    users = {"u": "p"}
    for nonce in ("0x54 0x27", "a=b", "~!@#$%^&*()"):
        client = ScramClient("SCRAM-SHA256", "u", "p", nonce=nonce.replace(",", ""))
        server = ScramServer("SCRAM-SHA256", users)
        assert client.verify(server.final(client.final(server.first(client.first()))))


def test_a_snappy_value_is_inflated_only_up_to_the_largest_item() -> None:
    from dcpinspect.live.kv import MAX_INFLATED, inflate_value
    from dcpinspect.live.producer_frames import snappy_compress
    from dcpinspect.wire.framing import encode_leb128

    assert inflate_value(snappy_compress(b'{"a": 1}' * 100)) == b'{"a": 1}' * 100
    assert inflate_value(encode_leb128(MAX_INFLATED + 1) + b"\x00") is None  # refused before inflating
    assert inflate_value(b"not snappy") is None


def test_all_vb_seqnos_lists_the_states_on_this_node() -> None:
    """GET_ALL_VB_SEQNOS answers with the vbuckets in the asked state on the node the connection is on."""
    from dcpinspect.live.producer import ProducerConnection

    cluster = Cluster(seed=3, nodes=2)
    b = cluster.create_bucket("default", vbuckets=4, items=8)
    for node in (0, 1):
        p = Peer(cluster)
        p.conn = ProducerConnection(cluster, node=node)
        p.bootstrap(controls={})
        active = p.request("GET_ALL_VB_SEQNOS", extras={"state": 1})
        assert [e["vbucket"] for e in active.body["vb_seqnos"]] == [vb for vb, row in enumerate(b.vbucket_map()) if row[0] == node]
