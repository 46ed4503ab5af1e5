"""The sans-IO producer: frames in via encode, frames out via FrameDecoder + dissect (never with problems)."""

from __future__ import annotations

import doctest
from typing import Any

import pytest
from producerpeer import ALT, COLLECTIONS, JSON, SNAPPY, XATTR, Peer, make, names, stream_messages  # noqa: F401

from dcpinspect import encode
from dcpinspect.live import cluster as cluster_module
from dcpinspect.live import producer as producer_module
from dcpinspect.live.cluster import MAX_FAILOVER_ENTRIES, VBucket
from dcpinspect.protocol.rules import MAX_SEQNO as FOREVER
from dcpinspect.wire.dissection import Dissection

# ---------------------------------------------------------------------------
# the cluster model


def test_failover_table_rules() -> None:
    vb = VBucket(0)
    vb.add_failover_entry(1, 0)
    vb.add_failover_entry(2, 10)
    vb.add_failover_entry(3, 20)
    vb.add_failover_entry(4, 15)  # branch below 20: (3, 20) is dropped
    assert vb.failover_log == [(4, 15), (2, 10), (1, 0)]
    for i in range(40):
        vb.add_failover_entry(100 + i, 15 + i)
    assert len(vb.failover_log) == MAX_FAILOVER_ENTRIES
    seqnos = [s for _, s in vb.failover_log]
    assert seqnos == sorted(seqnos, reverse=True)
    assert vb.failover_log[0] == (139, 54)


# ---------------------------------------------------------------------------
# session


def _status(ds: list[Dissection]) -> int:
    return next(d.frame.status for d in ds if d.name == "DCP_STREAM_REQ")


def test_stream_req_validation_branches() -> None:
    cluster, p = make(items=20)
    p.bootstrap(controls={})
    b = cluster.buckets["default"]
    high = b.vbuckets[0].high_seqno
    assert _status(p.stream_req(0, flags=0x08)) == 0x04  # NoValue stream flag obsolete
    assert _status(p.stream_req(0, flags=0x100 | 0x04)) == 0x04  # cache transfer combination
    assert _status(p.stream_req(7)) == 0x07  # no such vb
    b.set_state(1, "replica")
    assert _status(p.stream_req(1, flags=0x10)) == 0x07  # ActiveVbOnly on a replica
    b.set_state(1, "dead")
    assert _status(p.stream_req(1)) == 0x07
    assert _status(p.stream_req(0, value={"collections": ["0"]})) == 0x83  # noop not enabled
    assert p.status("DCP_CONTROL", key="enable_noop", value="true") == 0
    assert _status(p.stream_req(0, start=5, end=4)) == 0x22
    assert _status(p.stream_req(0, start=5, ss=6, se=8)) == 0x22
    assert _status(p.stream_req(0, start=5, ss=1, se=4)) == 0x22
    assert _status(p.stream_req(0, value={"sid": 3})) == 0x8D  # sid without enable_stream_id
    assert _status(p.stream_req(0, value={"collections": ["99"]})) == 0x88
    assert _status(p.stream_req(0, value={"scope": "77"})) == 0x8C
    assert _status(p.stream_req(0, value={"collections": ["0"], "scope": "0"})) == 0x04
    assert _status(p.stream_req(0, start=high + 5, ss=high + 5, se=high + 5, uuid=b.vbuckets[0].uuid)) == 0x23
    assert _status(p.stream_req(0, start=3, uuid=12345)) == 0x23
    assert _status(p.stream_req(0)) == 0
    assert _status(p.stream_req(0)) == 0x02  # stream exists for (vb, no sid)


def test_stream_req_erange_after_rollback_check_and_to_latest() -> None:
    cluster, p = make(items=20)
    p.bootstrap()
    vb = cluster.buckets["default"].vbuckets[0]
    ds = p.stream_req(0, start=0, end=FOREVER, flags=0x04)  # ToLatest: end := high seqno
    msgs = stream_messages(ds)
    assert msgs[-1].name == "DCP_STREAM_END" and msgs[-1].extras["status"] == 0
    assert max(d.extras.get("by_seqno", 0) for d in msgs) == vb.high_seqno


def test_stream_req_value_needs_collections() -> None:
    _, p = make()
    p.bootstrap(features=(JSON,), controls={"enable_noop": "true"})
    assert _status(p.stream_req(0, value={"collections": ["0"]})) == 0x04


def test_stream_ids_rules() -> None:
    _, p = make(items=6)
    p.bootstrap(controls={"enable_noop": "true", "enable_stream_id": "true"})
    assert _status(p.stream_req(0)) == 0x8D  # sid required
    assert _status(p.stream_req(0, value={"sid": 0})) == 0x8D
    ds = p.stream_req(0, value={"sid": 7})
    assert _status(ds) == 0
    msgs = stream_messages(ds)
    assert msgs and all(d.stream_id == 7 and d.frame.magic == 0x08 for d in msgs)
    assert _status(p.stream_req(0, value={"sid": 8})) == 0  # a second stream on the same vb
    assert _status(p.stream_req(0, value={"sid": 7})) == 0x02
    assert p.status("DCP_CLOSE_STREAM", vbucket=0) == 0x8D  # sid frame missing
    assert p.status("DCP_CLOSE_STREAM", vbucket=0, stream_id=7) == 0
    assert p.status("DCP_CLOSE_STREAM", vbucket=0, stream_id=7) == 0x01


def test_filter_with_sync_writes_not_supported() -> None:
    _, p = make()
    p.bootstrap(controls={"enable_noop": "true", "enable_sync_writes": "true", "consumer_name": "r1"})
    assert _status(p.stream_req(0, value={"collections": ["0"]})) == 0x83


# ---------------------------------------------------------------------------
# streaming


def test_stream_to_end_dedup_and_end_ok() -> None:
    cluster, p = make(items=0, vbuckets=1)
    b = cluster.buckets["default"]
    for i in range(5):
        b.mutate("a", {"v": i})
    b.mutate("b", {"v": 0})
    b.delete("a")
    p.bootstrap()
    ds = p.stream_req(0, end=7)
    assert _status(ds) == 0
    msgs = stream_messages(ds)
    assert names(msgs) == ["DCP_SNAPSHOT_MARKER", "DCP_MUTATION", "DCP_DELETION", "DCP_STREAM_END"]
    marker = msgs[0]
    assert (marker.extras["start_seqno"], marker.extras["end_seqno"], marker.extras["flags"]) == (0, 7, 0x06)
    assert [d.extras["by_seqno"] for d in msgs[1:3]] == [6, 7]
    assert msgs[-1].extras["status"] == 0
    assert all(d.frame.opaque == p.opaque for d in msgs)


def test_memory_snapshots_follow_new_writes_with_dedup() -> None:
    cluster, p = make(items=0, vbuckets=1, checkpoint_items=100)
    b = cluster.buckets["default"]
    b.mutate("seed")
    p.bootstrap()
    ds = p.stream_req(0, start=1, uuid=b.vbuckets[0].uuid)
    assert names(stream_messages(ds)) == []  # nothing new yet
    for i in range(3):
        b.mutate("k", {"i": i})
    b.mutate("j")
    p.conn.pump(p.now)
    msgs = stream_messages(p.drain())
    assert names(msgs) == ["DCP_SNAPSHOT_MARKER", "DCP_MUTATION", "DCP_MUTATION"]
    assert (msgs[0].extras["start_seqno"], msgs[0].extras["end_seqno"]) == (1, 5)  # first marker: requested start
    assert msgs[0].extras["flags"] & 0x01
    assert [(d.key, d.extras["by_seqno"]) for d in msgs[1:]] == [(b"k", 4), (b"j", 5)]
    b.mutate("z")
    p.conn.pump(p.now)
    msgs = stream_messages(p.drain())
    assert (msgs[0].extras["start_seqno"], msgs[0].extras["end_seqno"]) == (6, 6)  # later: the first item's seqno


def test_deletion_v2_expiration_and_collections_events() -> None:
    cluster, p = make(items=0, vbuckets=1)
    b = cluster.buckets["default"]
    b.mutate("a")
    b.expire("a")
    b.mutate("c")
    b.delete("c", delete_time=1234)
    b.create_collection("fruit", max_ttl=60)
    b.mutate("apple", collection="fruit")
    p.bootstrap(open_flags=0x21, controls={"enable_noop": "true", "enable_expiry_opcode": "true"})
    msgs = stream_messages(p.stream_req(0))
    assert names(msgs) == ["DCP_SNAPSHOT_MARKER", "DCP_EXPIRATION", "DCP_DELETION", "DCP_SYSTEM_EVENT", "DCP_MUTATION"]
    assert msgs[2].variant == "v2" and msgs[2].extras["delete_time"] == 1234
    assert msgs[3].variant == "begin collection v1" and msgs[3].body["max_ttl"] == 60 and msgs[3].key == b"fruit"
    assert msgs[4].cid == msgs[3].body["collection_id"]


def test_legacy_stream_default_collection_only_and_deletion_v1() -> None:
    cluster, p = make(items=0, vbuckets=1)
    b = cluster.buckets["default"]
    b.mutate("a")
    b.expire("a")
    b.create_collection("fruit")
    b.mutate("apple", collection="fruit")
    p.bootstrap(features=(JSON,), controls={"enable_noop": "true", "enable_expiry_opcode": "true"})
    msgs = stream_messages(p.stream_req(0))
    assert names(msgs) == ["DCP_SNAPSHOT_MARKER", "DCP_DELETION"]  # expiry as deletion (no delete times)
    assert msgs[1].variant == "v1" and msgs[1].cid is None
    b.drop_collection("_default")
    p2 = Peer(cluster)
    p2.bootstrap(features=(JSON,))
    assert _status(p2.stream_req(0)) == 0x88


def test_sync_writes_visible_only_with_sync_replication() -> None:
    cluster, p = make(items=0, vbuckets=1)
    b = cluster.buckets["default"]
    b.prepare("x", {"v": 1})
    b.commit("x")
    b.prepare("y", {"v": 2})
    b.abort("y")
    b.mutate("z")
    p.bootstrap(controls={"enable_noop": "true", "enable_sync_writes": "true", "consumer_name": "replica"})
    msgs = stream_messages(p.stream_req(0))
    assert msgs[0].variant == "v2.0" and msgs[0].body["max_visible_seqno"] == 5 and msgs[0].body["high_completed_seqno"] == 3
    assert names(msgs[1:]) == ["DCP_PREPARE", "DCP_COMMIT", "DCP_ABORT", "DCP_MUTATION"]
    # without sync replication the commit is a mutation and the rest is hidden
    q = Peer(cluster)
    q.bootstrap()
    msgs = stream_messages(q.stream_req(0))
    assert msgs[0].variant == "v1"
    assert [(d.name, d.extras.get("by_seqno")) for d in msgs[1:]] == [("DCP_MUTATION", 2), ("DCP_MUTATION", 5)]


def test_marker_v22_and_purge_seqno() -> None:
    cluster, p = make(items=4, vbuckets=1)
    b = cluster.buckets["default"]
    b.delete("doc-0001")
    b.purge(0)
    p.bootstrap(controls={"enable_noop": "true", "max_marker_version": "2.2"})
    msgs = stream_messages(p.stream_req(0))
    assert msgs[0].variant == "v2.2" and msgs[0].body["purge_seqno"] == 5
    assert "DCP_DELETION" not in names(msgs)  # purged tombstone not backfilled


def test_oso_backfill_of_one_collection() -> None:
    cluster, p = make(items=0, vbuckets=1)
    b = cluster.buckets["default"]
    cid = b.create_collection("c")
    for k in ("m", "b", "x", "a"):
        b.mutate(k, collection="c")
    b.mutate("other")
    p.bootstrap(controls={"enable_noop": "true", "enable_out_of_order_snapshots": "true_with_seqno_advanced"})
    msgs = stream_messages(p.stream_req(0, value={"collections": [f"{cid:x}"]}))
    assert names(msgs)[0] == "DCP_OSO_SNAPSHOT" and msgs[0].extras["flags"] == 1
    assert [d.key for d in msgs if d.name == "DCP_MUTATION"] == [b"a", b"b", b"m", b"x"]
    assert [d.name for d in msgs[-2:]] == ["DCP_OSO_SNAPSHOT", "DCP_SEQNO_ADVANCED"] and msgs[-1].extras["seqno"] == 6


def test_snappy_and_no_value() -> None:
    cluster, p = make(items=3, vbuckets=1)
    p.bootstrap(features=(COLLECTIONS, JSON, SNAPPY), controls={"enable_noop": "true", "force_value_compression": "true"})
    muts = [d for d in stream_messages(p.stream_req(0)) if d.name == "DCP_MUTATION"]
    assert muts and all(d.frame.datatype == 0x03 and isinstance(d.document, dict) for d in muts)
    q = Peer(cluster)
    q.bootstrap(open_flags=0x09)
    muts = [d for d in stream_messages(q.stream_req(0)) if d.name == "DCP_MUTATION"]
    assert muts and all(d.frame.value == b"" and d.frame.datatype == 0 for d in muts)


# ---------------------------------------------------------------------------
# flow control, noops, stream ends


def test_flow_control_arithmetic() -> None:
    cluster, p = make(items=0, vbuckets=1)
    b = cluster.buckets["default"]
    for i in range(10):
        b.mutate(f"k{i}", b"v" * 10)
    p.bootstrap(controls={"enable_noop": "true", "connection_buffer_size": "150"})
    msgs = stream_messages(p.stream_req(0))
    sizes = [len(d.frame.raw) for d in msgs]
    assert sizes[0] == 44  # marker v1
    # it may send while outstanding < buffer: stops right after crossing 150
    assert sum(sizes[:-1]) < 150 <= sum(sizes)
    assert p.conn.bytes_outstanding == sum(sizes)
    assert all(size == 55 + 2 + 1 + 10 for size in sizes[1:])  # mutation 55 + key (cid + "kN") + value
    more = stream_messages(p.send(encode("DCP_BUFFER_ACKNOWLEDGEMENT", extras={"buffer_bytes": sum(sizes)})))
    assert more and p.conn.bytes_outstanding == sum(len(d.frame.raw) for d in more)


def test_prepare_counts_two_extra_bytes() -> None:
    cluster, p = make(items=0, vbuckets=1)
    b = cluster.buckets["default"]
    b.prepare("k", b"vv")
    p.bootstrap(controls={"enable_noop": "true", "enable_sync_writes": "true", "consumer_name": "r", "connection_buffer_size": "100000"})
    msgs = stream_messages(p.stream_req(0))
    assert names(msgs) == ["DCP_SNAPSHOT_MARKER", "DCP_PREPARE"]
    assert len(msgs[0].frame.raw) == 61  # marker v2.0
    assert len(msgs[1].frame.raw) == 55 + 2 + 2  # on the wire: 24 + 31 + key (cid + k) + value
    assert p.conn.bytes_outstanding == 61 + 59 + 2


def test_close_stream_with_and_without_stream_end() -> None:
    cluster, p = make(items=0, vbuckets=1)
    p.bootstrap()
    assert _status(p.stream_req(0)) == 0
    p.opaque += 1
    ds = p.send(encode("DCP_CLOSE_STREAM", vbucket=0, opaque=p.opaque))
    assert names(ds) == ["DCP_CLOSE_STREAM"] and ds[0].frame.status == 0
    assert p.status("DCP_CLOSE_STREAM", vbucket=0) == 0x01
    q = Peer(cluster)
    q.bootstrap(controls={"enable_noop": "true", "send_stream_end_on_client_close_stream": "true"})
    assert _status(q.stream_req(0)) == 0
    q.opaque += 1
    ds = q.send(encode("DCP_CLOSE_STREAM", vbucket=0, opaque=q.opaque))
    assert names(ds) == ["DCP_CLOSE_STREAM", "DCP_STREAM_END"] and ds[1].extras["status"] == 1


def test_failover_ends_stream_state_changed_then_rollback() -> None:
    cluster, p = make(items=0, vbuckets=1)
    b = cluster.buckets["default"]
    for i in range(10):
        b.mutate(f"k{i}")
    p.bootstrap()
    old_uuid = b.vbuckets[0].uuid
    msgs = stream_messages(p.stream_req(0))
    assert msgs[0].extras["end_seqno"] == 10
    b.failover(0, lose=4)
    p.conn.pump(p.now)
    end = stream_messages(p.drain())
    assert names(end) == ["DCP_STREAM_END"] and end[0].extras["status"] == 2
    assert b.vbuckets[0].failover_log[0][1] == 6
    ds = p.stream_req(0, start=8, ss=2, se=10, uuid=old_uuid)
    rb = next(d for d in ds if d.name == "DCP_STREAM_REQ")
    assert rb.frame.status == 0x23 and rb.body["rollback_seqno"] == 2  # min(upper=6, snap_start=2)
    ds = p.stream_req(0, start=10, ss=10, se=10, uuid=old_uuid)
    assert next(d for d in ds if d.name == "DCP_STREAM_REQ").body["rollback_seqno"] == 6
    ds = p.stream_req(0, start=6, ss=6, se=6, uuid=old_uuid)
    assert _status(ds) == 0


def test_slow_consumer_stream_end() -> None:
    cluster, p = make(items=0, vbuckets=1, slow_after=2.0)
    b = cluster.buckets["default"]
    for i in range(10):
        b.mutate(f"k{i}", b"x" * 50)
    p.bootstrap(controls={"enable_noop": "true", "connection_buffer_size": "100"})
    assert _status(p.stream_req(0)) == 0
    assert stream_messages(p.tick(1.0)) == []
    ds = stream_messages(p.tick(1.5))
    assert names(ds) == ["DCP_STREAM_END"] and ds[0].extras["status"] == 4


def test_filter_empty_when_collection_dropped() -> None:
    cluster, p = make(items=0, vbuckets=1)
    b = cluster.buckets["default"]
    cid = b.create_collection("c")
    b.mutate("a", collection="c")
    p.bootstrap()
    assert _status(p.stream_req(0, value={"collections": [f"{cid:x}"]})) == 0
    b.drop_collection("c")
    p.conn.pump(p.now)
    msgs = stream_messages(p.drain())
    assert names(msgs)[-2:] == ["DCP_SYSTEM_EVENT", "DCP_STREAM_END"]
    assert msgs[-2].variant == "end collection v0" and msgs[-1].extras["status"] == 7


def test_takeover_set_vbucket_state_exchange() -> None:
    cluster, p = make(items=3, vbuckets=1)
    p.bootstrap()
    msgs = stream_messages(p.stream_req(0, flags=0x01))
    assert msgs[-1].name == "DCP_SET_VBUCKET_STATE" and msgs[-1].extras["state"] == 3
    ds = p.send(encode("DCP_SET_VBUCKET_STATE", response=True, opaque=msgs[-1].frame.opaque))
    assert names(ds) == ["DCP_SET_VBUCKET_STATE"] and ds[0].extras["state"] == 1
    assert cluster.buckets["default"].vbuckets[0].state == 4
    ds = p.send(encode("DCP_SET_VBUCKET_STATE", response=True, opaque=msgs[-1].frame.opaque))
    assert names(ds) == ["DCP_STREAM_END"] and ds[0].extras["status"] == 0


def test_system_events_flatbuffers() -> None:
    cluster, p = make(items=0, vbuckets=1)
    b = cluster.buckets["default"]
    b.create_scope("s")
    b.create_collection("c", scope="s")
    b.drop_collection("s.c")
    p.bootstrap(controls={"enable_noop": "true", "flatbuffers_system_events": "true"})
    msgs = stream_messages(p.stream_req(0))
    assert [d.variant for d in msgs[1:4]] == ["create scope v2", "begin collection v2", "end collection v2"]
    assert msgs[2].body["name"] == "c"


# ---------------------------------------------------------------------------
# malformed input never escapes as an exception


def test_streams_without_flow_control_stop_at_the_output_limit() -> None:
    cluster, p = make(items=3000, vbuckets=1, output_limit=16 * 1024, max_batch=4096)
    p.bootstrap(controls={})  # no connection_buffer_size: no flow control
    p.opaque += 1
    extras = {"flags": 0, "start_seqno": 0, "end_seqno": FOREVER, "vb_uuid": 0, "snap_start_seqno": 0, "snap_end_seqno": 0}
    p.conn.receive(encode("DCP_STREAM_REQ", extras=extras, vbucket=0, opaque=p.opaque), p.now)
    for _ in range(50):  # the edge ticks on while the client takes nothing
        p.now += 0.05
        p.conn.tick(p.now)
        assert p.conn.output_size < cluster.output_limit + cluster.max_batch
    got = stream_messages(p.drain())
    assert 0 < len(got) < 3000 and p.conn.want_write  # the rest follows once the output is taken
    while p.conn.want_write:
        p.conn.pump(p.now)
        got += stream_messages(p.drain())
    assert sum(d.name == "DCP_MUTATION" for d in got) == 3000


@pytest.mark.parametrize("module", [cluster_module, producer_module], ids=["cluster", "producer"])
def test_module_examples_run(module: Any) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
