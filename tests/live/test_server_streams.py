"""The producer's stream rules over a real TCP socket: a WireClient speaking to SimNode (event-driven, no timing).

Each test is the over-the-wire twin of a sans-IO test in test_producer.py (issue 14,
"The simulator (producer) must", rules 2-18).  Waits are for frames; the clock only
moves the producer where a test sets a limit of 0 (the stalled-backfill limit).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from simnode import WIRE_TIMEOUT, SimNode, WireClient

from dcpinspect import encode
from dcpinspect.live.cluster import Bucket, Cluster
from dcpinspect.live.clustermap import parse_config
from dcpinspect.live.sim import Simulator
from dcpinspect.protocol.enums import Feature
from dcpinspect.wire.dissection import Dissection

JSON_ONLY = (Feature.JSON,)


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 4 * WIRE_TIMEOUT))  # a deadline only: it turns a hang into a failure


def cluster_of(items: int = 0, vbuckets: int = 1, **kw) -> tuple[Cluster, Bucket]:
    cluster = Cluster(seed=3, **kw)
    return cluster, cluster.create_bucket("default", vbuckets=vbuckets, items=items)


def bounds(d: Dissection) -> tuple[int, int, int]:
    src = d.extras if d.variant == "v1" else d.body
    return (src["start_seqno"], src["end_seqno"], src["flags"])


def names(ds: list[Dissection]) -> list[str]:
    return [d.name for d in ds]


async def acking_until(c: WireClient, name: str) -> list[Dissection]:
    """Frames up to ``name``, acknowledging each stream message's bytes as it comes (a consumer that keeps up)."""
    c.send(encode("DCP_BUFFER_ACKNOWLEDGEMENT", extras={"buffer_bytes": 1 << 20}))
    got: list[Dissection] = []
    while not got or got[-1].name != name:
        got.append(await c.next())
        c.send(encode("DCP_BUFFER_ACKNOWLEDGEMENT", extras={"buffer_bytes": len(got[-1].frame.raw)}))
    return got


async def client(node: SimNode, *, name: str = "wire", **kw) -> WireClient:
    c = await WireClient.connect((node.host, node.port))
    await c.bootstrap(name=name, **kw)
    return c


def test_noop_required_with_collections_or_xattrs() -> None:
    async def main() -> None:
        cluster, _ = cluster_of(items=3)
        async with SimNode(cluster) as node:
            c = await client(node, controls={})
            assert (await c.stream_req(0)).frame.status == 0x83  # collections, empty value, no noop
            x = await client(node, name="x", features=(*JSON_ONLY, Feature.XATTR), open_flags=0x05, controls={})
            assert (await x.stream_req(0)).frame.status == 0x83  # IncludeXattrs
            legacy = await client(node, name="legacy", features=JSON_ONLY, controls={})
            assert (await legacy.stream_req(0)).frame.status == 0
            assert await c.status("DCP_CONTROL", key="enable_noop", value="true") == 0
            assert (await c.stream_req(0)).frame.status == 0

    run(main)


def test_marker_versions_per_marker() -> None:
    async def main() -> None:
        cluster, b = cluster_of(checkpoint_items=100)
        b.mutate("a")
        b.delete("a")
        b.prepare("p")
        b.commit("p")
        b.purge(0)
        async with SimNode(cluster) as node:
            c = await client(node, controls={"enable_noop": "true", "max_marker_version": "2.2"})
            assert (await c.stream_req(0)).frame.status == 0
            disk = (await c.until("DCP_SNAPSHOT_MARKER"))[-1]
            assert disk.variant == "v2.2" and disk.body["purge_seqno"] == 3 and disk.body["max_visible_seqno"] == 0
            b.mutate("m")
            mem = (await c.until("DCP_SNAPSHOT_MARKER"))[-1]
            assert mem.variant == "v1" and bounds(mem)[2] & 0x01
            r = await client(
                node,
                name="r",
                controls={"enable_noop": "true", "max_marker_version": "2.2", "enable_sync_writes": "true", "consumer_name": "r"},
            )
            assert (await r.stream_req(0)).frame.status == 0
            disk = (await r.until("DCP_SNAPSHOT_MARKER"))[-1]
            assert disk.variant == "v2.2" and (disk.body["high_completed_seqno"], disk.body["high_prepared_seqno"]) == (3, 3)
            b.mutate("n")
            mem = (await r.until("DCP_SNAPSHOT_MARKER"))[-1]
            assert mem.variant == "v2.0" and mem.body["max_visible_seqno"] == 6
            s = await client(node, name="s", controls={"enable_noop": "true", "enable_sync_writes": "true"})
            assert (await s.stream_req(0)).frame.status == 0
            assert (await s.until("DCP_SNAPSHOT_MARKER"))[-1].variant == "v1"  # sync writes alone: no MVS/HCS

    run(main)


def test_sync_writes_alone_and_seqno_acks() -> None:
    async def main() -> None:
        cluster, b = cluster_of()
        cid = b.create_collection("c")
        b.prepare("x")
        b.commit("x")
        async with SimNode(cluster) as node:
            c = await client(node, controls={"enable_noop": "true", "enable_sync_writes": "true"})
            assert (await c.stream_req(0, value={"collections": [f"{cid:x}"]})).frame.status == 0x83
            assert (await c.stream_req(0, value={"scope": "0"})).frame.status == 0
            got = await c.until("DCP_COMMIT")
            assert "DCP_PREPARE" in names(got)
            ack = encode("DCP_SEQNO_ACKNOWLEDGED", extras={"prepared_seqno": 2}, vbucket=0, opaque=77)
            c.send(ack)
            assert (await c.until(lambda d: d.role == "response")).pop().frame.status == 0x04
            r = await client(node, name="r", controls={"enable_noop": "true", "enable_sync_writes": "true", "consumer_name": "r"})
            assert (await r.stream_req(0)).frame.status == 0
            r.send(ack)
            # accepted: no reply; the NOOP request answered next proves nothing came before it
            assert (await r.request("NOOP")).frame.status == 0
            assert not [d for d in r.backlog if d.role == "response"]

    run(main)


def test_oso_seqno_advanced_before_the_end_marker() -> None:
    async def main() -> None:
        cluster, b = cluster_of()
        cid = b.create_collection("c")
        for k in ("m", "b"):
            b.mutate(k, collection="c")
        b.mutate("other")
        async with SimNode(cluster) as node:
            c = await client(node, controls={"enable_noop": "true", "enable_out_of_order_snapshots": "true_with_seqno_advanced"})
            assert (await c.stream_req(0, value={"collections": [f"{cid:x}"]})).frame.status == 0
            got = await c.until(lambda d: d.name == "DCP_OSO_SNAPSHOT" and d.extras["flags"] == 2)
            assert names(got)[-2:] == ["DCP_SEQNO_ADVANCED", "DCP_OSO_SNAPSHOT"] and got[-2].extras["seqno"] == 4

    run(main)


def test_legacy_client_completes_every_snapshot() -> None:
    async def main() -> None:
        cluster, b = cluster_of(checkpoint_items=100)
        b.create_collection("c")
        b.mutate("a")  # 2
        b.mutate("in-c", collection="c")  # 3
        async with SimNode(cluster) as node:
            c = await client(node, features=JSON_ONLY, controls={})
            assert (await c.stream_req(0)).frame.status == 0
            disk = await c.until("DCP_MUTATION")
            assert bounds(disk[0])[:2] == (0, 2)  # clamped to what it can reach
            b.mutate("b")  # 4
            b.mutate("in-c-2", collection="c")  # 5
            mem = await c.until("DCP_MUTATION")
            assert bounds(mem[0])[1] == 4  # ends at the last item sent
            b.mutate("in-c-3", collection="c")  # rejected by the filter: nothing
            b.mutate("z")  # 7
            nxt = await c.until("DCP_MUTATION")
            assert names(nxt) == ["DCP_SNAPSHOT_MARKER", "DCP_MUTATION"] and bounds(nxt[0])[:2] == (7, 7)

    run(main)


def test_purge_exemption_and_purge_seqno() -> None:
    async def main() -> None:
        cluster, b = cluster_of()
        cid = b.create_collection("c")  # 1
        b.mutate("x", collection="c")  # 2
        b.delete("x", collection="c")  # 3
        for i in range(3):
            b.mutate(f"k{i}")  # 4..6
        b.delete("k0")  # 7
        b.mutate("k1")  # 8
        assert b.purge(0) == 7  # the newest purged tombstone
        uuid = b.vbuckets[0].uuid
        async with SimNode(cluster) as node:
            c = await client(node)
            ok = await c.stream_req(0, start=3, uuid=uuid, value={"collections": [f"{cid:x}"]})
            assert ok.frame.status == 0
            d = await client(node, name="d")
            rb = await d.stream_req(0, start=3, uuid=uuid)
            assert rb.frame.status == 0x23 and rb.body["rollback_seqno"] == 0
            stats = await d.request("STAT", key="vbucket-seqno 0")
            found = {stats.key_text: stats.frame.value}
            while stats.key:
                stats = await d.next()
                found[stats.key_text] = stats.frame.value
            assert found["vb_0:purge_seqno"] == b"7"

    run(main)


def test_dedup_and_end_seqno_inside_a_snapshot() -> None:
    async def main() -> None:
        cluster, b = cluster_of(checkpoint_items=100)
        for i in range(3):
            b.mutate("a", {"v": i})
        b.mutate("b")  # 4
        b.mutate("a", {"v": 9})  # 5
        b.mutate("c")  # 6
        async with SimNode(cluster) as node:
            c = await client(node)
            assert (await c.stream_req(0, end=4)).frame.status == 0
            got = await c.until("DCP_STREAM_END")
            assert bounds(got[0])[:2] == (0, 6) and got[-1].extras["status"] == 0
            assert [(d.key, d.extras["by_seqno"]) for d in got if d.name == "DCP_MUTATION"] == [(b"b", 4), (b"a", 5), (b"c", 6)]

    run(main)


def test_first_marker_on_resume() -> None:
    async def main() -> None:
        cluster, b = cluster_of(checkpoint_items=100)
        for i in range(8):
            b.mutate(f"k{i}")
        async with SimNode(cluster) as node:
            c = await client(node)
            assert (await c.stream_req(0, start=5, ss=3, se=6, uuid=b.vbuckets[0].uuid)).frame.status == 0
            marker = (await c.until("DCP_SNAPSHOT_MARKER"))[-1]
            assert bounds(marker)[:2] == (3, 8)

    run(main)


def test_full_window_pauses_never_slow_and_slow_from_disk_pressure() -> None:
    async def main() -> None:
        cluster, b = cluster_of(items=30, vbuckets=2, backfill_idle_limit=0.0)
        async with SimNode(cluster) as node:
            c = await client(node, controls={"enable_noop": "true", "connection_buffer_size": "100"})
            assert (await c.stream_req(0)).frame.status == 0
            await c.until("DCP_MUTATION")  # the window fills: the stream pauses
            (conn,) = node.connections
            assert conn.bytes_outstanding >= 100
            node.kick()
            node.kick()  # time passes, the window stays full: nothing ends
            assert (await c.request("NOOP")).frame.status == 0
            assert "DCP_STREAM_END" not in names(c.backlog)
            # Slow: a backfill stalled under disk pressure (limit 0 here) ends its stream; the STREAM_END waits behind the window
            b.disk_pressure(True)
            assert (await c.stream_req(1)).frame.status == 0
            node.kick()
            assert (await c.request("NOOP")).frame.status == 0
            assert "DCP_STREAM_END" not in names(c.backlog)
            c.send(encode("DCP_BUFFER_ACKNOWLEDGEMENT", extras={"buffer_bytes": 1 << 20}))
            end = (await c.until(lambda d: d.name == "DCP_STREAM_END" and d.frame.vbucket == 1))[-1]
            assert end.extras["status"] == 4

    run(main)


def test_backfill_fail_rollback_lost_privileges_and_disconnect() -> None:
    async def main() -> None:
        cluster, b = cluster_of(items=10)
        b.delete("doc-0001")
        async with SimNode(cluster) as node:
            c = await client(node)
            b.fail_backfills(0)
            assert (await c.stream_req(0)).frame.status == 0
            assert (await c.until("DCP_STREAM_END"))[-1].extras["status"] == 5  # BackfillFail
            b.disk_pressure(True)
            assert (await c.stream_req(0, start=2, uuid=b.vbuckets[0].uuid)).frame.status == 0  # its backfill waits
            b.purge(0)
            b.disk_pressure(False)
            assert (await c.until("DCP_STREAM_END"))[-1].extras["status"] == 2  # Rollback, sent as StateChanged
            assert (await c.stream_req(0)).frame.status == 0
            await c.until("DCP_MUTATION")
            legacy = await client(node, name="legacy", features=JSON_ONLY, controls={})
            assert (await legacy.stream_req(0)).frame.status == 0
            await legacy.until("DCP_MUTATION")
            b.lose_privileges()
            assert (await c.until("DCP_STREAM_END"))[-1].extras["status"] == 8
            assert (await legacy.until("DCP_STREAM_END"))[-1].extras["status"] == 0  # no collections: OK
            b.restore_privileges()
            assert (await c.stream_req(0)).frame.status == 0
            await c.until("DCP_MUTATION")
            cluster.drop_connections("scenario")
            assert await c.closed()
            assert "DCP_STREAM_END" not in names(c.backlog)  # Disconnected is never sent
            assert any(e["event"] == "stream_end" and e["reason"] == 3 and e["status"] is None for e in cluster.journal)

    run(main)


def test_cursor_drop_switches_to_a_backfill_and_the_next_memory_snapshot_is_a_checkpoint() -> None:
    async def main() -> None:
        cluster, b = cluster_of(items=3, checkpoint_items=100)
        high = b.vbuckets[0].high_seqno
        async with SimNode(cluster) as node:
            c = await client(node)
            assert (await c.stream_req(0, start=high, uuid=b.vbuckets[0].uuid)).frame.status == 0
            assert b.drop_cursors(0) == 1
            b.mutate("k1")
            disk = await c.until("DCP_MUTATION")
            assert bounds(disk[0])[2] == 0x06  # a disk snapshot, and the stream goes on
            b.mutate("k2")
            mem = await c.until("DCP_MUTATION")
            assert bounds(mem[0])[2] == 0x05  # memory + Checkpoint after the backfill
            assert "DCP_STREAM_END" not in names(disk + mem)

    run(main)


def test_close_stream_queued_messages_then_closed_and_replacement() -> None:
    async def main() -> None:
        cluster, b = cluster_of(checkpoint_items=2)
        async with SimNode(cluster) as node:
            controls = {"enable_noop": "true", "send_stream_end_on_client_close_stream": "true", "connection_buffer_size": "60"}
            c = await client(node, controls=controls)
            assert (await c.stream_req(0)).frame.status == 0
            for i in range(4):
                b.mutate(f"k{i}")
            await c.until("DCP_MUTATION")  # then the window is full
            close = await c.request("DCP_CLOSE_STREAM", vbucket=0)
            assert close.frame.status == 0
            assert not c.backlog
            after = await acking_until(c, "DCP_STREAM_END")
            assert "DCP_MUTATION" in names(after) and after[-1].extras["status"] == 1
            # a new request while a dead stream's STREAM_END is held behind the window replaces it at once
            high = b.vbuckets[0].high_seqno
            assert (await c.stream_req(0, start=high, uuid=b.vbuckets[0].uuid)).frame.status == 0
            b.mutate("k8")
            b.mutate("k9")
            await c.until("DCP_MUTATION")
            assert (await c.request("DCP_CLOSE_STREAM", vbucket=0)).frame.status == 0
            assert (await c.stream_req(0, start=high + 2, uuid=b.vbuckets[0].uuid)).frame.status == 0
            b.mutate("k10")
            got = await acking_until(c, "DCP_MUTATION")
            assert names(got) == ["DCP_SNAPSHOT_MARKER", "DCP_MUTATION"] and got[-1].extras["by_seqno"] == high + 3
            # an unknown stream id on a vbucket that has streams
            s = await client(node, name="sids", controls={"enable_noop": "true", "enable_stream_id": "true"})
            assert (await s.stream_req(0, value={"sid": 5})).frame.status == 0
            assert (await s.request("DCP_CLOSE_STREAM", vbucket=0, stream_id=6)).frame.status == 0x8D

    run(main)


def test_stream_request_value_checks() -> None:
    async def main() -> None:
        cluster, b = cluster_of(items=4)
        b.delete("doc-0002")
        purge = b.purge(0)
        uuid = b.vbuckets[0].uuid
        async with SimNode(cluster) as node:
            c = await client(node)
            assert (await c.stream_req(0, value={"foo": 1})).frame.status == 0x04
            assert (await c.stream_req(0, start=1, uuid=uuid, value={"purge_seqno": purge})).frame.status == 0x04
            assert (await c.stream_req(0, start=1, uuid=uuid)).frame.status == 0x23
            assert (await c.stream_req(0, start=1, uuid=uuid, value={"purge_seqno": str(purge)})).frame.status == 0

    run(main)


def test_takeover_markers_ack_and_the_exchange() -> None:
    async def main() -> None:
        cluster, b = cluster_of(items=3, checkpoint_items=100)
        high = b.vbuckets[0].high_seqno
        async with SimNode(cluster) as node:
            c = await client(node)
            b.disk_pressure(True)  # hold the stream (its backfill) until a write is in memory
            assert (await c.stream_req(0, start=high - 1, uuid=b.vbuckets[0].uuid, flags=0x01)).frame.status == 0
            b.mutate("late")
            b.disk_pressure(False)
            got = await c.until(lambda d: d.name == "DCP_SNAPSHOT_MARKER" and bounds(d)[2] & 0x01)
            assert bounds(got[-1])[2] & 0x08  # the memory marker asks for an ack
            assert not any(bounds(m)[2] & 0x08 for m in got[:-1] if m.name == "DCP_SNAPSHOT_MARKER")  # the disk one does not
            await c.until("DCP_MUTATION")
            assert (await c.request("NOOP")).frame.status == 0
            assert "DCP_SET_VBUCKET_STATE" not in names(c.backlog)  # waits for the marker ack
            c.send(encode("DCP_SNAPSHOT_MARKER", response=True, opaque=got[-1].frame.opaque))
            pending = (await c.until("DCP_SET_VBUCKET_STATE"))[-1]
            assert pending.extras["state"] == 3
            c.send(encode("DCP_SET_VBUCKET_STATE", response=True, opaque=pending.frame.opaque))
            active = (await c.until("DCP_SET_VBUCKET_STATE"))[-1]
            assert active.extras["state"] == 1 and b.vbuckets[0].state == 4
            c.send(encode("DCP_SET_VBUCKET_STATE", response=True, opaque=pending.frame.opaque))
            assert (await c.until("DCP_STREAM_END"))[-1].extras["status"] == 0

    run(main)


def test_failover_across_two_nodes_and_the_new_map() -> None:
    async def main() -> None:
        cluster, b = cluster_of(items=0, vbuckets=2, nodes=2)
        vb = b.vbuckets[0]
        keys = (k for k in (f"x{i}" for i in range(1000)) if b.vbucket_of(k) is vb)
        for _ in range(10):
            b.mutate(next(keys))
        async with SimNode(cluster, 0) as n0, SimNode(cluster, 1) as n1:
            c = await client(n0)
            old = (await c.stream_req(0)).body["failover_log"][0]["vb_uuid"]
            assert 0 < old < 2**48
            await c.until(lambda d: d.name == "DCP_MUTATION" and d.extras["by_seqno"] == 10)
            b.failover(0, lose=2, partial=3)  # the replica lacked 2 items and had 3 of an incomplete snapshot
            assert (await c.until("DCP_STREAM_END"))[-1].extras["status"] == 2
            assert (await c.stream_req(0, start=10, uuid=old)).frame.status == 0x07
            config = await c.request("GET_CLUSTER_CONFIG")
            cmap = parse_config(config.frame.value, connected=(n0.host, n0.port))
            assert cmap.rev == cluster.rev and cmap.active_node(0) == 1 and cmap.nodes[1] == (n1.host, n1.port)
            c2 = await WireClient.connect(cmap.nodes[1])
            await c2.bootstrap()
            rb = await c2.stream_req(0, start=10, uuid=old)
            assert rb.frame.status == 0x23 and rb.body["rollback_seqno"] == 5  # the end of its last complete snapshot
            ok = await c2.stream_req(0, start=5, uuid=old)
            assert [e["vb_seqno"] for e in ok.body["failover_log"]][:1] == [5]
            got = await c2.until(lambda d: d.name == "DCP_MUTATION" and d.extras["by_seqno"] == 8)
            assert got[0].name == "DCP_SNAPSHOT_MARKER"

    run(main)


def test_simulator_runs_one_port_per_node_and_the_failover_scenario_needs_two() -> None:
    async def main() -> None:
        async with Simulator(items=10, vbuckets=2, nodes=3) as sim:
            assert len({p for _h, p in sim.addresses}) == 3 and sim.cluster.addresses == sim.addresses
            c = await WireClient.connect(sim.addresses[2])
            await c.bootstrap()
            # vb 1 is active on node 1 and replicated on node 2: a replica streams, ActiveVbOnly refuses it
            assert (await c.stream_req(1, flags=0x10)).frame.status == 0x07
            assert (await c.stream_req(1)).frame.status == 0
            assert (await c.stream_req(0)).frame.status == 0x07  # vb 0: nodes 0 and 1 only
        assert Simulator(scenario="failover").nodes == 2

    run(main)
