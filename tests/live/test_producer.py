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
    # stream 7 is gone but vbucket 0 still has stream 8: an unknown stream id there is 0x8d (producer.cc closeStream)
    assert p.status("DCP_CLOSE_STREAM", vbucket=0, stream_id=7) == 0x8D


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
    # the SEQNO_ADVANCED comes before the OSO end marker (active_stream.cc completeBackfillInner)
    assert [d.name for d in msgs[-2:]] == ["DCP_SEQNO_ADVANCED", "DCP_OSO_SNAPSHOT"] and msgs[-2].extras["seqno"] == 6
    assert msgs[-1].extras["flags"] == 2


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
    """nodes=2: vb 0 is active on node 0 and replicated on node 1; the failover promotes node 1."""
    cluster, p = make(items=0, vbuckets=1, nodes=2)
    b = cluster.buckets["default"]
    for i in range(10):
        b.mutate(f"k{i}")
    p.bootstrap()
    old_uuid = b.vbuckets[0].uuid
    msgs = stream_messages(p.stream_req(0))
    assert msgs[0].extras["end_seqno"] == 10
    rev = cluster.rev
    b.failover(0, lose=4)
    assert b.vbucket_map() == [[1, -1]] and cluster.rev == rev + 1
    p.conn.pump(p.now)
    end = stream_messages(p.drain())
    assert names(end) == ["DCP_STREAM_END"] and end[0].extras["status"] == 2
    assert b.vbuckets[0].failover_log[0][1] == 6
    assert _status(p.stream_req(0, start=6, ss=6, se=6, uuid=old_uuid)) == 0x07  # node 0 holds it no more
    q = Peer(cluster)
    q.conn.node = 1  # the node the new map names
    q.bootstrap()
    ds = q.stream_req(0, start=8, ss=2, se=10, uuid=old_uuid)
    rb = next(d for d in ds if d.name == "DCP_STREAM_REQ")
    assert rb.frame.status == 0x23 and rb.body["rollback_seqno"] == 2  # min(upper=6, snap_start=2)
    ds = q.stream_req(0, start=10, ss=10, se=10, uuid=old_uuid)
    assert next(d for d in ds if d.name == "DCP_STREAM_REQ").body["rollback_seqno"] == 6
    ds = q.stream_req(0, start=6, ss=6, se=6, uuid=old_uuid)
    assert _status(ds) == 0


def test_failover_needs_a_replica() -> None:
    cluster, _ = make(items=2, vbuckets=1)
    with pytest.raises(ValueError, match="nodes >= 2"):
        cluster.buckets["default"].failover(0)
    cluster, _ = make(items=2, vbuckets=1, nodes=2)
    cluster.buckets["default"].failover(0)
    with pytest.raises(ValueError, match="no replica"):
        cluster.buckets["default"].failover(0)


def test_slow_after_was_removed() -> None:
    with pytest.raises(ValueError, match="disk_pressure"):
        make(items=0, slow_after=2.0)
    cluster, _ = make(items=0)
    with pytest.raises(ValueError, match="disk_pressure"):
        cluster.slow_after = 0.5  # what notebooks used to do


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
    p.bootstrap(controls={"enable_noop": "true"})  # no connection_buffer_size: no flow control
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


# ---------------------------------------------------------------------------
# issue 14: the producer rules, sans-IO (each has an over-the-wire twin in test_server_streams.py)


def _rename(p: Peer, name: str) -> Peer:
    """Give a bootstrapped peer's connection another DCP name (the next Peer's DCP_OPEN "test-conn" must not close it)."""
    p.conn.session.open_name = name
    return p


def _markers(ds: list[Dissection]) -> list[Dissection]:
    return [d for d in ds if d.name == "DCP_SNAPSHOT_MARKER"]


def _bounds(d: Dissection) -> tuple[int, int, int]:
    src = d.extras if d.variant == "v1" else d.body
    return (src["start_seqno"], src["end_seqno"], src["flags"])


def test_noop_required_with_collections_or_xattrs_even_without_a_value() -> None:
    cluster, p = make(items=4)
    p.bootstrap(controls={})  # HELLO Collections, no noop
    assert _status(p.stream_req(0)) == 0x83  # an empty value too
    q = Peer(cluster)
    q.bootstrap(features=(JSON,), controls={})  # no collections, no xattrs: noop optional
    assert _status(q.stream_req(0)) == 0
    x = Peer(cluster)
    x.bootstrap(features=(JSON, XATTR), open_flags=0x01 | 0x04, controls={})  # IncludeXattrs
    assert _status(x.stream_req(0)) == 0x83
    assert x.status("DCP_CONTROL", key="enable_noop", value="true") == 0
    assert _status(x.stream_req(0)) == 0


def test_marker_versions_are_chosen_per_marker() -> None:
    cluster, p = make(items=0, vbuckets=1, checkpoint_items=100)
    b = cluster.buckets["default"]
    b.mutate("a")
    b.delete("a")
    b.prepare("p", {"v": 1})
    b.commit("p")
    b.create_collection("c")  # a system event: visible for the MVS
    b.purge(0)  # purges the tombstone at 2 and the completed prepare at 3
    # max_marker_version=2.2 without sync writes: the disk marker is v2.2 with MVS/HCS/HPS 0, memory markers v1
    p.bootstrap(controls={"enable_noop": "true", "max_marker_version": "2.2"})
    (disk,) = _markers(p.stream_req(0))
    assert disk.variant == "v2.2" and disk.body["purge_seqno"] == 3
    assert (disk.body["max_visible_seqno"], disk.body["high_completed_seqno"], disk.body["high_prepared_seqno"]) == (0, 0, 0)
    b.mutate("m")
    p.conn.pump(p.now)
    (mem,) = _markers(p.drain())
    assert mem.variant == "v1" and mem.extras["flags"] & 0x01
    # full sync replication + 2.2: disk v2.2 with MVS/HCS/HPS, memory v2.0 with the MVS
    q = Peer(cluster)
    q.bootstrap(controls={"enable_noop": "true", "max_marker_version": "2.2", "enable_sync_writes": "true", "consumer_name": "r"})
    (disk,) = _markers(q.stream_req(0, end=5))
    assert disk.variant == "v2.2" and disk.body["purge_seqno"] == 3 and disk.body["end_seqno"] == 6
    assert (disk.body["max_visible_seqno"], disk.body["high_completed_seqno"], disk.body["high_prepared_seqno"]) == (6, 3, 3)
    r = Peer(cluster)
    r.bootstrap(controls={"enable_noop": "true", "enable_sync_writes": "true", "consumer_name": "r"})
    ds = r.stream_req(0, start=6, ss=6, se=6, uuid=b.vbuckets[0].uuid)
    b.create_collection("d")  # the only item of the next memory snapshot: a system event counts as visible
    r.conn.pump(r.now)
    (mem,) = _markers(r.drain())
    assert mem.variant == "v2.0" and mem.body["max_visible_seqno"] == 7 and mem.body["high_completed_seqno"] == 0
    # enable_sync_writes alone: prepares and commits, but no MVS/HCS: v1 markers (active_stream.cc supportSyncReplication)
    s = Peer(cluster)
    s.bootstrap(controls={"enable_noop": "true", "enable_sync_writes": "true"})
    b.prepare("q", {"v": 2})  # 8
    ds = stream_messages(s.stream_req(0, start=7, ss=7, se=7, uuid=b.vbuckets[0].uuid))
    assert [d.variant for d in _markers(ds)] == ["v1"] and names(ds)[1:] == ["DCP_PREPARE"]


def test_sync_writes_alone_and_seqno_acks_with_consumer_name() -> None:
    cluster, p = make(items=0, vbuckets=1)
    b = cluster.buckets["default"]
    sid = b.create_scope("s")
    cid = b.create_collection("c", scope="s")
    b.prepare("x", {"v": 1}, collection="c")
    b.commit("x", collection="c")
    b.prepare("y", {"v": 1}, collection="c")
    b.abort("y", collection="c")
    p.bootstrap(controls={"enable_noop": "true", "enable_sync_writes": "true"})
    assert _status(p.stream_req(0, value={"collections": [f"{cid:x}"]})) == 0x83  # a collections filter is refused
    msgs = stream_messages(p.stream_req(0, value={"scope": f"{sid:x}"}))  # a scope filter is allowed
    assert [d.name for d in msgs if d.name != "DCP_SNAPSHOT_MARKER"] == ["DCP_SYSTEM_EVENT", "DCP_PREPARE", "DCP_COMMIT", "DCP_ABORT"]
    ack = encode("DCP_SEQNO_ACKNOWLEDGED", extras={"prepared_seqno": 3}, vbucket=0, opaque=99)
    (reply,) = p.send(ack)
    assert reply.frame.status == 0x04  # no consumer_name: no acks
    q = Peer(cluster)
    q.bootstrap(controls={"enable_noop": "true", "enable_sync_writes": "true", "consumer_name": "replica-1"})
    assert _status(q.stream_req(0)) == 0
    assert q.send(ack) == []  # accepted: no reply
    assert cluster.journal[-1]["event"] == "seqno_ack"


def test_legacy_client_can_complete_every_snapshot() -> None:
    cluster, p = make(items=0, vbuckets=1, checkpoint_items=100)
    b = cluster.buckets["default"]
    cid = b.create_collection("c")  # seqno 1
    b.mutate("a")  # 2
    b.mutate("in-c", collection="c")  # 3
    b.prepare("p")  # 4: hidden from a client without sync writes
    p.bootstrap(features=(JSON,))
    ds = stream_messages(p.stream_req(0))
    # the disk marker is clamped to what it can reach (MB-47437): the last default-collection item
    assert names(ds) == ["DCP_SNAPSHOT_MARKER", "DCP_MUTATION"] and _bounds(ds[0])[:2] == (0, 2)
    b.mutate("b")  # 5
    b.mutate("in-c-2", collection="c")  # 6
    p.conn.pump(p.now)
    ds = stream_messages(p.drain())
    assert names(ds) == ["DCP_SNAPSHOT_MARKER", "DCP_MUTATION"] and _bounds(ds[0])[1] == 5  # memory: the last item sent
    b.mutate("in-c-3", collection="c")  # 7: rejected by its filter
    p.conn.pump(p.now)
    assert stream_messages(p.drain()) == []  # no marker, nothing
    # a collection-filtered client: items of other collections make neither marker nor SEQNO_ADVANCED
    q = Peer(cluster)
    q.bootstrap()
    assert _status(q.stream_req(0, start=7, ss=7, se=7, uuid=b.vbuckets[0].uuid, value={"collections": [f"{cid:x}"]})) == 0
    b.mutate("d1")
    b.mutate("d2")
    q.conn.pump(q.now)
    assert stream_messages(q.drain()) == []
    b.mutate("in-c-4", collection="c")
    b.prepare("in-c-p", collection="c")  # hidden for this stream: the marker ends on it, SEQNO_ADVANCED says so
    q.conn.pump(q.now)
    ds = stream_messages(q.drain())
    assert names(ds) == ["DCP_SNAPSHOT_MARKER", "DCP_MUTATION", "DCP_SEQNO_ADVANCED"]
    assert _bounds(ds[0])[:2] == (7, 11) and ds[2].extras["seqno"] == 11  # first marker: min(snap_start 7, 10)


def test_purge_exemption_uses_the_collections_high_seqno() -> None:
    cluster, p = make(items=0, vbuckets=1)
    b = cluster.buckets["default"]
    cid = b.create_collection("c")  # 1
    b.mutate("x", collection="c")  # 2
    b.delete("x", collection="c")  # 3: the collection's high seqno, even once purged
    for i in range(4):
        b.mutate(f"k{i}")  # 4..7
    b.delete("k0")  # 8
    b.delete("k1")  # 9
    b.mutate("k2")  # 10
    assert b.purge(0) == 9  # the newest purged tombstone, not the high seqno 10
    vb = b.vbuckets[0]
    assert vb.collection_high_seqno([cid]) == 3 and vb.collection_high_seqno([0]) == 10
    p.bootstrap()
    uuid = vb.uuid
    flt = {"collections": [f"{cid:x}"]}
    assert _status(p.stream_req(0, start=3, ss=3, se=3, uuid=uuid, value=flt)) == 0  # M=3 <= S=3 < P=9: exempt
    assert next(d for d in p.stream_req(0, start=3, ss=3, se=3, uuid=uuid) if d.name == "DCP_STREAM_REQ").frame.status == 0x02
    q = Peer(cluster)
    q.bootstrap()
    rb = next(d for d in q.stream_req(0, start=3, ss=3, se=3, uuid=uuid) if d.name == "DCP_STREAM_REQ")
    assert rb.frame.status == 0x23 and rb.body["rollback_seqno"] == 0  # unfiltered: purge rollback
    # a legacy stream uses the default collection's high seqno, for the exemption and for ToLatest
    b2 = cluster.create_bucket("other", vbuckets=1)
    b2.mutate("a")  # 1
    b2.delete("a")  # 2
    b2.create_collection("c")  # 3
    b2.mutate("y", collection="c")  # 4
    b2.purge(0)
    legacy = Peer(cluster)
    legacy.conn.receive(encode("SASL_AUTH", key="PLAIN", value=b"\0Administrator\0password", opaque=1), 0.0)
    legacy.conn.receive(encode("SELECT_BUCKET", key="other", opaque=2), 0.0)
    legacy.conn.receive(encode("DCP_OPEN", key="legacy", extras={"flags": 1}, opaque=3), 0.0)
    legacy.drain()
    uuid2 = b2.vbuckets[0].uuid
    assert _status(legacy.stream_req(0, start=1, ss=1, se=1, uuid=uuid2)) == 0x23  # default high 2 > start 1: no exemption
    ds = legacy.stream_req(0, start=0, flags=0x04)  # ToLatest: the default collection's high seqno, not 4
    req = next(e for e in reversed(cluster.journal) if e["event"] == "stream_request")
    assert _status(ds) == 0 and req["stream_end"] == 2
    assert names(stream_messages(ds))[-1] == "DCP_STREAM_END"


def test_dedup_and_the_whole_snapshot_containing_the_end_seqno() -> None:
    cluster, p = make(items=0, vbuckets=1, checkpoint_items=100)
    b = cluster.buckets["default"]
    for i in range(3):
        b.mutate("a", {"v": i})  # 1..3
    b.mutate("b")  # 4
    b.mutate("a", {"v": 9})  # 5
    b.mutate("c")  # 6
    p.bootstrap()
    ds = stream_messages(p.stream_req(0, end=4))
    # the disk snapshot (0, 6] holds end 4: it is sent whole, each key once in its newest version, then STREAM_END(OK)
    assert _bounds(ds[0])[:2] == (0, 6)
    assert [(d.key, d.extras["by_seqno"]) for d in ds if d.name == "DCP_MUTATION"] == [(b"b", 4), (b"a", 5), (b"c", 6)]
    assert ds[-1].name == "DCP_STREAM_END" and ds[-1].extras["status"] == 0
    # memory: the checkpoint snapshot containing the end is sent whole too
    q = Peer(cluster)
    q.bootstrap()
    assert _status(q.stream_req(0, start=6, ss=6, se=6, end=7, uuid=b.vbuckets[0].uuid)) == 0
    b.mutate("d")  # 7
    b.mutate("e")  # 8, same checkpoint
    q.conn.pump(q.now)
    ds = stream_messages(q.drain())
    assert names(ds) == ["DCP_SNAPSHOT_MARKER", "DCP_MUTATION", "DCP_MUTATION", "DCP_STREAM_END"]
    assert _bounds(ds[0])[:2] == (6, 8) and ds[-1].extras["status"] == 0


def test_first_marker_on_resume_starts_at_min_snap_start_first_seqno() -> None:
    cluster, p = make(items=0, vbuckets=1, checkpoint_items=100)
    b = cluster.buckets["default"]
    for i in range(8):
        b.mutate(f"k{i}")
    uuid = b.vbuckets[0].uuid
    p.bootstrap()
    (marker,) = _markers(p.stream_req(0, start=5, ss=3, se=6, uuid=uuid))  # a backfill from 6
    assert _bounds(marker)[:2] == (3, 8)
    q = Peer(cluster)
    q.bootstrap()
    assert _markers(q.stream_req(0, start=8, ss=2, se=8, uuid=uuid)) == []
    b.mutate("k9")
    q.conn.pump(q.now)
    (marker,) = _markers(q.drain())
    assert _bounds(marker)[:2] == (2, 9)


def test_stopped_acking_pauses_and_never_ends_slow() -> None:
    """The old ``slow_after`` behaviour is gone: a full window only pauses the producer, for any time."""
    cluster, p = make(items=0, vbuckets=1)
    b = cluster.buckets["default"]
    for i in range(10):
        b.mutate(f"k{i}", b"x" * 50)
    p.bootstrap(features=(JSON,), controls={"connection_buffer_size": "100"})  # no noop: no idle disconnect either
    ds = stream_messages(p.stream_req(0))
    assert ds and "DCP_STREAM_END" not in names(ds)
    for _ in range(5):
        assert stream_messages(p.tick(10_000.0)) == []
    assert not any(e["event"] == "stream_end" for e in cluster.journal)


def test_slow_only_from_a_backfill_stalled_under_disk_pressure() -> None:
    cluster, p = make(items=20, vbuckets=2, backfill_idle_limit=720.0)
    b = cluster.buckets["default"]
    p.bootstrap(features=(JSON,), controls={"connection_buffer_size": "200"})  # no noop: no idle disconnect in 720 s
    b.disk_pressure(True)
    assert stream_messages(p.stream_req(1)) == []  # stalled: nothing comes
    # vb 0 streams from memory (nothing to backfill) and fills the window
    assert (
        _status(
            p.stream_req(
                0, start=b.vbuckets[0].high_seqno, ss=b.vbuckets[0].high_seqno, se=b.vbuckets[0].high_seqno, uuid=b.vbuckets[0].uuid
            )
        )
        == 0
    )
    for i in range(20):
        b.mutate(f"zz-{i}", b"y" * 40)  # about half of them land in vb 0: more than the window
    p.conn.pump(p.now)
    p.drain()
    assert p.conn.bytes_outstanding >= 200
    p.now += 1.0
    assert [d for d in p.tick(0.0) if d.name == "DCP_STREAM_END"] == []
    p.tick(718.0)
    assert not any(e["event"] == "stream_end" for e in cluster.journal)
    p.tick(2.0)  # past dcp_backfill_idle_limit: vb 1 ends Slow, but its STREAM_END waits behind the full window
    assert [d for d in p.drain() if d.name == "DCP_STREAM_END"] == []
    acked = p.send(encode("DCP_BUFFER_ACKNOWLEDGEMENT", extras={"buffer_bytes": p.conn.bytes_outstanding}))
    ends = [d for d in acked if d.name == "DCP_STREAM_END"]
    assert [(d.frame.vbucket, d.extras["status"]) for d in ends] == [(1, 4)]


def test_backfill_failure_ends_the_stream_backfill_fail() -> None:
    cluster, p = make(items=10, vbuckets=1)
    b = cluster.buckets["default"]
    b.fail_backfills(0)
    p.bootstrap()
    ds = stream_messages(p.stream_req(0))
    assert names(ds) == ["DCP_STREAM_END"] and ds[0].extras["status"] == 5
    assert any(e["event"] == "backfill_failed" for e in cluster.journal)
    assert names(stream_messages(p.stream_req(0)))[0] == "DCP_SNAPSHOT_MARKER"  # one failure only


def test_purge_overtaking_a_pending_backfill_ends_rollback_sent_as_state_changed() -> None:
    cluster, p = make(items=10, vbuckets=1)
    b = cluster.buckets["default"]
    b.delete("doc-0001")
    b.delete("doc-0002")
    vb = b.vbuckets[0]
    p.bootstrap()
    b.disk_pressure(True)
    assert stream_messages(p.stream_req(0, start=2, ss=2, se=2, uuid=vb.uuid)) == []  # the backfill waits
    b.purge(0)
    b.disk_pressure(False)
    p.conn.pump(p.now)
    ds = stream_messages(p.drain())
    assert names(ds) == ["DCP_STREAM_END"] and ds[0].extras["status"] == 2
    end = next(e for e in reversed(cluster.journal) if e["event"] == "stream_end")
    assert end["reason"] == 6 and end["status"] == 2


def test_lost_privileges_ends_streams_8_or_0_without_collections() -> None:
    cluster, p = make(items=4, vbuckets=1)
    b = cluster.buckets["default"]
    _rename(p, "p").bootstrap()
    _rename(p, "p")
    q = Peer(cluster)
    q.bootstrap(features=(JSON,))
    p.stream_req(0)
    q.stream_req(0)
    b.lose_privileges("Administrator")
    p.conn.pump(p.now)
    q.conn.pump(q.now)
    assert [d.extras["status"] for d in p.drain() if d.name == "DCP_STREAM_END"] == [8]
    assert [d.extras["status"] for d in q.drain() if d.name == "DCP_STREAM_END"] == [0]
    assert _status(p.stream_req(0)) == 0x24
    b.restore_privileges("Administrator")
    assert _status(p.stream_req(0)) == 0


def test_disconnect_ends_streams_disconnected_without_a_message() -> None:
    cluster, p = make(items=4, vbuckets=1)
    p.bootstrap()
    p.stream_req(0)
    assert cluster.drop_connections("scenario") == 1
    assert p.conn.closed and p.drain() == []
    end = next(e for e in reversed(cluster.journal) if e["event"] == "stream_end")
    assert end["status"] is None and end["reason"] == 3 and end["why"] == "scenario"


def test_cursor_dropping_switches_to_a_backfill_without_ending() -> None:
    cluster, p = make(items=4, vbuckets=1, checkpoint_items=100)
    b = cluster.buckets["default"]
    high = b.vbuckets[0].high_seqno
    uuid = b.vbuckets[0].uuid
    p.bootstrap()
    _rename(p, "p")
    assert _status(p.stream_req(0, start=high, ss=high, se=high, uuid=uuid)) == 0
    repl = Peer(cluster)
    repl.bootstrap()
    repl.conn.session.open_name = "replication:n0->n1:default"  # kv_engine: no cursor dropping for replication names
    assert _status(repl.stream_req(0, start=high, ss=high, se=high, uuid=uuid)) == 0
    assert b.drop_cursors(0) == 1
    b.mutate("k1")
    b.mutate("k2")
    p.conn.pump(p.now)
    ds = stream_messages(p.drain())
    assert names(ds) == ["DCP_SNAPSHOT_MARKER", "DCP_MUTATION", "DCP_MUTATION"] and _bounds(ds[0])[2] == 0x06  # disk
    b.mutate("k3")
    p.conn.pump(p.now)
    (mem,) = _markers(p.drain())
    assert _bounds(mem)[2] == 0x05  # 17: the first memory snapshot after a backfill carries the Checkpoint flag
    repl.conn.pump(repl.now)
    assert [_bounds(m)[2] & 0x03 for m in _markers(repl.drain())] == [0x01]  # still in memory
    assert repl.status("DCP_CONTROL", key="supports_cursor_dropping", value="true") == 0
    assert b.drop_cursors(0) == 2


def test_close_stream_leaves_queued_messages_and_a_new_request_replaces_the_dead_stream() -> None:
    cluster, p = make(items=0, vbuckets=1, checkpoint_items=2)
    b = cluster.buckets["default"]
    p.bootstrap(controls={"enable_noop": "true", "send_stream_end_on_client_close_stream": "true", "connection_buffer_size": "60"})
    assert _status(p.stream_req(0)) == 0
    for i in range(4):
        b.mutate(f"k{i}")
    p.conn.pump(p.now)
    first = stream_messages(p.drain())
    assert names(first) == ["DCP_SNAPSHOT_MARKER", "DCP_MUTATION"]  # the window is full, the rest is queued
    p.opaque += 1
    ds = p.send(encode("DCP_CLOSE_STREAM", vbucket=0, opaque=p.opaque))
    assert names(ds) == ["DCP_CLOSE_STREAM"] and ds[0].frame.status == 0
    ds = stream_messages(p.send(encode("DCP_BUFFER_ACKNOWLEDGEMENT", extras={"buffer_bytes": 10_000})))
    assert names(ds)[0] == "DCP_MUTATION"  # queued messages follow the close response...
    while names(ds)[-1] != "DCP_STREAM_END":
        ds += stream_messages(p.send(encode("DCP_BUFFER_ACKNOWLEDGEMENT", extras={"buffer_bytes": 10_000})))
    assert ds[-1].extras["status"] == 1  # ...then STREAM_END(Closed)
    # a new request while the STREAM_END is held behind a full window: accepted at once, the dead stream is replaced
    high = b.vbuckets[0].high_seqno
    assert _status(p.stream_req(0, start=high, ss=high, se=high, uuid=b.vbuckets[0].uuid)) == 0
    b.mutate("k9")
    b.mutate("k10")
    p.conn.pump(p.now)
    assert stream_messages(p.drain())  # the window is full again
    p.opaque += 1
    p.send(encode("DCP_CLOSE_STREAM", vbucket=0, opaque=p.opaque))
    assert p.status("DCP_CLOSE_STREAM", vbucket=0) == 0x01  # already dead
    assert _status(p.stream_req(0, start=high + 2, ss=high + 2, se=high + 2, uuid=b.vbuckets[0].uuid)) == 0
    assert any(e["event"] == "stream_replaced" for e in cluster.journal)
    b.mutate("k11")
    ds = stream_messages(p.send(encode("DCP_BUFFER_ACKNOWLEDGEMENT", extras={"buffer_bytes": 10_000})))
    assert names(ds) == ["DCP_SNAPSHOT_MARKER", "DCP_MUTATION"]  # the new stream's: the old STREAM_END went with the dead stream


def test_close_stream_without_stream_end_sends_nothing_more() -> None:
    cluster, p = make(items=0, vbuckets=1, checkpoint_items=2)
    b = cluster.buckets["default"]
    p.bootstrap(controls={"enable_noop": "true", "connection_buffer_size": "60"})
    assert _status(p.stream_req(0)) == 0
    for i in range(4):
        b.mutate(f"k{i}")
    p.conn.pump(p.now)
    assert stream_messages(p.drain())
    p.opaque += 1
    assert names(p.send(encode("DCP_CLOSE_STREAM", vbucket=0, opaque=p.opaque))) == ["DCP_CLOSE_STREAM"]
    assert stream_messages(p.send(encode("DCP_BUFFER_ACKNOWLEDGEMENT", extras={"buffer_bytes": 10_000}))) == []


def test_stream_request_value_checks() -> None:
    cluster, p = make(items=4, vbuckets=1)
    b = cluster.buckets["default"]
    b.delete("doc-0002")
    purge = b.purge(0)
    uuid = b.vbuckets[0].uuid
    p.bootstrap()
    assert _status(p.stream_req(0, value={"foo": 1})) == 0x04  # none of the known keys
    assert _status(p.stream_req(0, start=1, uuid=uuid, value={"purge_seqno": purge})) == 0x04  # a number: refused
    assert _status(p.stream_req(0, start=1, uuid=uuid)) == 0x23  # start below the purge seqno
    ds = p.stream_req(0, start=1, uuid=uuid, value={"purge_seqno": str(purge)})  # a decimal string is read: P_c == P
    assert _status(ds) == 0


def test_failover_uuids_are_48_bit_and_the_promoted_entry_sits_at_the_last_complete_snapshot() -> None:
    cluster, _ = make(items=0, vbuckets=4, nodes=2)
    b = cluster.buckets["default"]
    assert all(0 < vb.uuid < 2**48 for vb in b.vbuckets)
    assert all(0 < cluster.new_uuid() < 2**48 for _ in range(1000))
    assert b.vbucket_map() == [[0, 1], [1, 0], [0, 1], [1, 0]]
    assert [b.state_on(1, n) for n in (0, 1)] == [2, 1]
    vb = b.vbuckets[1]
    keys = (k for k in (f"x{i}" for i in range(1000)) if b.vbucket_of(k) is vb)
    for _ in range(10):
        b.mutate(next(keys))
    high = vb.high_seqno
    uuid = b.failover(1, lose=2, partial=3)  # the replica lacks 2 items, and its last 3 form an incomplete snapshot
    assert vb.failover_log[0] == (uuid, high - 5) and vb.high_seqno == high - 2
    assert b.vbucket_map()[1] == [0, -1] and b.state_on(1, 1) == 4 and b.state_on(1, 0) == 1
    event = next(e for e in reversed(cluster.journal) if e["event"] == "failover")
    assert (event["old_node"], event["new_node"], event["seqno"]) == (1, 0, high - 5)


def test_takeover_disk_marker_has_no_ack_flag() -> None:
    _, p = make(items=3, vbuckets=1, checkpoint_items=100)
    p.bootstrap()
    ds = stream_messages(p.stream_req(0, flags=0x01))
    assert names(ds)[-1] == "DCP_SET_VBUCKET_STATE"  # nothing in memory: straight to pending
    assert not _bounds(_markers(ds)[0])[2] & 0x08  # a backfill's marker is not a TakeoverSend one


def test_takeover_memory_marker_waits_for_its_ack() -> None:
    cluster, p = make(items=3, vbuckets=1, checkpoint_items=100)
    b = cluster.buckets["default"]
    high = b.vbuckets[0].high_seqno
    p.bootstrap()
    p.conn.pause(1.0)  # hold the streams while a write arrives
    assert _status(p.stream_req(0, start=high, ss=high, se=high, uuid=b.vbuckets[0].uuid, flags=0x01)) == 0
    b.mutate("late")
    p.now = 1.0
    p.conn.pump(p.now)
    ds = stream_messages(p.drain())
    assert names(ds) == ["DCP_SNAPSHOT_MARKER", "DCP_MUTATION"] and _bounds(ds[0])[2] & 0x08  # Ack flag
    assert stream_messages(p.tick(10.0)) == []  # no SET_VBUCKET_STATE before the marker is acknowledged
    ds = stream_messages(p.send(encode("DCP_SNAPSHOT_MARKER", response=True, opaque=ds[0].frame.opaque)))
    assert names(ds) == ["DCP_SET_VBUCKET_STATE"] and ds[0].extras["state"] == 3


def test_purge_seqno_is_read_as_the_rule_reads_it() -> None:
    """The producer and the timeline's replay read ``purge_seqno`` with the same rule (std::stoull on a string)."""
    from dcpinspect.protocol.rules import client_purge_seqno

    for raw, status in ((" 23", 0), ("+5", 0), ("x", 0x04), (23, 0x04)):
        _, p = make(items=4)
        p.bootstrap()
        got = _status(p.stream_req(0, value={"purge_seqno": raw}))
        assert got == status and (client_purge_seqno({"purge_seqno": raw}) is None) == (status != 0), raw
