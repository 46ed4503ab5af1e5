"""The client follows the cluster map as real clients do: one DCP connection per data node it needs, each vbucket
streamed from its active node, moved on StateChanged / NOT_MY_VBUCKET, rolled back where the new node says so.

Sans-IO: :class:`ClusterConsumer` against one sans-IO producer per node of a ``Cluster(nodes=2)`` (fake clock).
Over TCP: :class:`DcpClient` against ``Simulator(nodes=2)`` and against two loopback nodes (tests/simnode.py) of one
cluster; event-driven, every wait is on the client's progress (the deadlines only turn a hang into a failure)."""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from simnode import SimNode

from dcpinspect import FrameDecoder, dissect
from dcpinspect.flows.records import Record
from dcpinspect.live.client import ClientError, DcpClient, load_state, run_client
from dcpinspect.live.cluster import Bucket, Cluster
from dcpinspect.live.consumer import ConsumerConfig
from dcpinspect.live.consumer_cluster import ClusterConsumer, address_text
from dcpinspect.live.consumer_states import ConsumerEvent, Phase, StreamStatus
from dcpinspect.live.producer import ProducerConnection
from dcpinspect.live.resume import ResumeState, VbState
from dcpinspect.live.sim import Simulator
from dcpinspect.protocol.enums import Magic, Opcode, Status
from dcpinspect.wire.events import Frame

PASSWORD = "n0des-pw"
#: the nodes' addresses in the sans-IO tests (nothing listens there: the driver routes by address)
ADDRESSES = [("10.0.0.1", 11210), ("10.0.0.2", 11210)]
ITEM_KINDS = ("mutation", "deletion", "expiration", "prepare", "commit", "abort", "system_event")


def run(coro: Awaitable[Any], timeout: float = 120) -> Any:
    """Run ``coro``; the deadline is there to turn a hang into a failure, never to wait for something."""
    return asyncio.run(asyncio.wait_for(coro, timeout))  # type: ignore[arg-type]


def config(**kw: Any) -> ConsumerConfig:
    base: dict[str, Any] = {"bucket": "travel", "user": "alice", "password": PASSWORD, "vbuckets": None, "buffer_size": 2000}
    base.update(kw)
    return ConsumerConfig(**base)


def two_nodes(items: int = 60, vbuckets: int = 4, seed: int = 3) -> tuple[Cluster, Bucket]:
    c = Cluster({"alice": PASSWORD}, nodes=2, seed=seed)
    return c, c.create_bucket("travel", vbuckets=vbuckets, items=items)


def highs(bucket: Bucket) -> dict[int, tuple[int, int]]:
    """Each vbucket's (high seqno, newest uuid) where it is active."""
    return {vb.id: (vb.high_seqno, vb.failover_log[0][0]) for vb in bucket.vbuckets}


def positions(state: ResumeState) -> dict[int, tuple[int, int]]:
    return {vb: (st.seqno, st.vb_uuid) for vb, st in sorted(state.vbuckets.items())}


# --- sans-IO: the fleet against one producer per node ----------------------------------------------


class Pump:
    """Drives a :class:`ClusterConsumer` against the sans-IO producers of a cluster's nodes, with a fake clock."""

    def __init__(self, cluster: Cluster, cfg: ConsumerConfig, *, unreachable: frozenset[int] = frozenset()) -> None:
        cluster.addresses[:] = ADDRESSES[: cluster.nodes]
        self.cluster = cluster
        self.fleet = ClusterConsumer(cfg, ADDRESSES[0])
        self.unreachable = unreachable
        self.producers: dict[int, ProducerConnection] = {}
        self.events: list[ConsumerEvent] = []
        self.sent: dict[int, list[Frame]] = {}
        self.now = 0.0

    def step(self) -> None:
        fleet = self.fleet
        for link_id in fleet.wanted():
            node = ADDRESSES.index(fleet.links[link_id].address)
            if node in self.unreachable:
                self.events += fleet.connect_failed(link_id, f"cannot connect to {ADDRESSES[node][0]}:{ADDRESSES[node][1]}: refused")
                continue
            self.producers[link_id] = ProducerConnection(self.cluster, node=node, now=self.now)
            self.events += fleet.connected(link_id, self.now)
        for link_id, prod in list(self.producers.items()):
            out = fleet.data_to_send(link_id)
            if out:
                self.sent.setdefault(link_id, []).extend(f for f in FrameDecoder().feed(out) if isinstance(f, Frame))
                prod.receive(out, self.now)
            prod.tick(self.now)
            data = prod.data_to_send()
            if data:
                self.events += fleet.receive(link_id, data, self.now)
            if prod.closed and not fleet.closable(link_id):
                self.events += fleet.connection_lost(link_id)
            if fleet.closable(link_id):
                prod.close("client closed")
                del self.producers[link_id]
        self.events += fleet.tick(self.now)
        self.now += 0.01

    def until(self, predicate: Callable[[], bool], limit: int = 20000) -> None:
        for _ in range(limit):
            if predicate() or self.fleet.done:
                return
            self.step()

    def caught_up(self, bucket: Bucket, vbuckets: int | None = None) -> bool:
        """Every vbucket streams (``vbuckets``: that many of them) and has everything its active copy has."""
        streams = self.fleet.streams
        return len(streams) == (vbuckets or len(bucket.vbuckets)) and all(
            st.status is StreamStatus.STREAMING and st.position.seqno == bucket.vbuckets[vb].high_seqno for vb, st in streams.items()
        )


def test_sansio_each_vbucket_streams_from_its_active_node() -> None:
    cluster, bucket = two_nodes()
    p = Pump(cluster, config())
    p.until(lambda: p.caught_up(bucket))
    assert p.caught_up(bucket), p.fleet.failure
    assert sorted(link.address for link in p.fleet.links.values()) == ADDRESSES  # one connection per node
    for link_id, link in p.fleet.links.items():
        node = ADDRESSES.index(link.address)
        assert link.consumer is not None and link.consumer.node_index == node
        reqs = [f.vbucket for f in p.sent[link_id] if f.opcode == Opcode.DCP_STREAM_REQ]
        assert sorted(reqs) == [vb for vb, row in enumerate(bucket.vbucket_map()) if row[0] == node]
        names = [dissect(f).name for f in p.sent[link_id]]
        assert names.index("SELECT_BUCKET") < names.index("GET_CLUSTER_CONFIG") < names.index("DCP_OPEN")  # each its own bootstrap
    kinds = [e.kind for e in p.events]
    assert not {"malformed", "unexpected", "error", "stream_failed"} & set(kinds)
    assert {e.node for e in p.events} == {address_text(a) for a in ADDRESSES}


def test_sansio_failover_moves_the_stream_and_rolls_back() -> None:
    cluster, bucket = two_nodes()
    p = Pump(cluster, config())
    p.until(lambda: p.caught_up(bucket))
    had = p.fleet.state.vbuckets[1].seqno
    old = bucket.vbucket_map()[1][0]
    bucket.failover(1, lose=3)
    for i in range(12):
        bucket.mutate(f"after-{i}", i)
    p.until(lambda: p.caught_up(bucket) and p.fleet.streams[1].rollbacks > 0)
    assert p.caught_up(bucket), p.fleet.failure
    assert positions(p.fleet.state) == highs(bucket)
    moved = [e for e in p.events if e.kind == "moved" and e.vbucket == 1]
    new = bucket.vbucket_map()[1][0]
    assert new != old and moved[-1].data["handoff"].address == ADDRESSES[new]
    rb = [e for e in p.events if e.kind == "rollback" and e.vbucket == 1]
    assert len(rb) == 1 and rb[0].data["rollback_seqno"] <= had - 3 and rb[0].node == address_text(ADDRESSES[new])
    # the old node's connection asked for the map again after the StateChanged; the vbucket streams on the new node
    owner = next(
        link
        for link in p.fleet.links.values()
        if link.consumer is not None and 1 in link.consumer.streams and link.address == ADDRESSES[new]
    )
    assert owner.consumer is not None and owner.consumer.streams[1].status is StreamStatus.STREAMING


def test_sansio_not_my_vbucket_on_a_stale_map_moves_the_stream() -> None:
    """The map changes between the bootstrap's GET_CLUSTER_CONFIG and the stream request: NOT_MY_VBUCKET, map again, move."""
    cluster, bucket = two_nodes()
    p = Pump(cluster, config(vbuckets=(0,)))
    p.until(lambda: p.fleet.consumer is not None and p.fleet.consumer.phase is Phase.OPEN)
    assert bucket.vbucket_map()[0][0] == 0
    bucket.failover(0)  # vbucket 0 goes to node 1 before it is requested from node 0
    p.until(lambda: p.caught_up(bucket, 1))
    assert p.caught_up(bucket, 1), p.fleet.failure
    statuses = [e for e in p.events if e.kind == "rerequest" and "not my vbucket" in e.message]
    assert statuses and statuses[0].node == address_text(ADDRESSES[0])
    assert p.fleet.streams[0].status is StreamStatus.STREAMING and positions(p.fleet.state)[0] == highs(bucket)[0]
    assert [e.node for e in p.events if e.kind == "stream_started"] == [address_text(ADDRESSES[1])]


def test_sansio_an_unreachable_node_is_one_line_naming_it_and_the_state_is_kept() -> None:
    cluster, bucket = two_nodes(vbuckets=2)
    resume = ResumeState(
        "travel",
        {1: VbState(vb_uuid=bucket.vbuckets[1].uuid, seqno=2, snap_start=2, snap_end=2, failover_log=[(bucket.vbuckets[1].uuid, 0)])},
    )
    p = Pump(cluster, config(resume=resume), unreachable=frozenset({1}))
    p.until(lambda: False, limit=500)
    assert p.fleet.done and p.fleet.failure == "cannot connect to 10.0.0.2:11210: refused"
    assert p.fleet.state.vbuckets[1] == resume.vbuckets[1]  # the stream that could not move keeps its position
    assert [e.kind for e in p.events].count("error") == 1


def test_sansio_one_node_is_one_connection() -> None:
    cluster = Cluster({"alice": PASSWORD}, seed=1)
    bucket = cluster.create_bucket("travel", vbuckets=4, items=40)
    p = Pump(cluster, config(to_latest=True))
    p.until(lambda: False)
    assert p.fleet.done and p.fleet.failure is None and list(p.fleet.links) == [0]
    assert positions(p.fleet.state) == highs(bucket) and [e.kind for e in p.events].count("done") == 1


def test_sansio_never_a_noop_request_and_acks_within_what_was_received() -> None:
    cluster, bucket = two_nodes(items=200)
    p = Pump(cluster, config(buffer_size=700, noop_interval=0.5))
    p.until(lambda: p.caught_up(bucket) and p.now > 3.0)
    for link_id, frames in p.sent.items():
        assert not any(f.opcode == Opcode.DCP_NOOP and f.magic == Magic.CLIENT_REQUEST for f in frames)
        replies = [f for f in frames if f.opcode == Opcode.DCP_NOOP]
        assert replies and all(f.magic == Magic.CLIENT_RESPONSE for f in replies)  # answered, each with the server's opaque
        acked = sum(int.from_bytes(f.extras[:4], "big") for f in frames if f.opcode == Opcode.DCP_BUFFER_ACKNOWLEDGEMENT)
        consumer = p.fleet.links[link_id].consumer
        assert consumer is not None and 0 < acked == consumer.acked_total <= consumer.consumed_total


# --- over TCP ---------------------------------------------------------------------------------------


def _received(evs: list[ConsumerEvent]) -> dict[int, list[int]]:
    """Per vbucket, the item seqnos received, with what each rollback discarded taken out."""
    got: dict[int, list[int]] = {}
    for e in evs:
        if e.vbucket is None:
            continue
        if e.kind in ITEM_KINDS:
            got.setdefault(e.vbucket, []).append(int(e.data["seqno"]))
        elif e.kind == "rollback":
            got[e.vbucket] = [s for s in got.get(e.vbucket, []) if s <= e.data["rollback_seqno"]]
    return got


def test_simulator_two_nodes_failover_end_to_end() -> None:
    """Stream every vbucket of a two-node simulator, fail one over: the client follows the map to the promoted node,
    rolls back there, and ends with the simulator's data: no seqno lost or received twice beyond what the rollback explains."""
    sim = Simulator(bucket="travel", vbuckets=4, items=60, users={"alice": PASSWORD}, seed=7, tick=0.02, nodes=2)

    async def main() -> tuple[ResumeState, list[ConsumerEvent], DcpClient]:
        await sim.start()
        try:
            evs: list[ConsumerEvent] = []
            client = DcpClient(sim.host, sim.port, config(), on_event=evs.append)
            await client.start()

            def caught_up(_c: Any) -> bool:
                st = client.streams
                vbs = sim.bucket.vbuckets
                return len(st) == len(vbs) and all(
                    s.status == "streaming" and s.position.seqno == vbs[vb].high_seqno for vb, s in st.items()
                )

            await client.until(caught_up)
            assert client.fleet is not None and len(client.fleet.links) == 2
            sim.failover(1, lose=3)
            for i in range(20):
                sim.mutate(f"after-{i}", {"i": i})
            await client.until(lambda c: caught_up(c) and any(e.kind == "rollback" and e.vbucket == 1 for e in evs))
            return await client.stop(), evs, client
        finally:
            await sim.stop()

    state, evs, client = run(main())
    assert positions(state) == highs(sim.bucket)
    got = _received(evs)
    for vb in sim.bucket.vbuckets:
        seqnos = got.get(vb.id, [])
        assert len(seqnos) == len(set(seqnos)), f"vb {vb.id}: a seqno received twice"
        assert set(seqnos) == {r.seqno for r in vb.log}, f"vb {vb.id}: seqnos lost"
    moved = [e for e in evs if e.kind == "moved" and e.vbucket == 1]
    new = sim.bucket.vbucket_map()[1][0]
    assert moved and moved[-1].data["handoff"].address == sim.addresses[new]
    assert [e.node for e in evs if e.kind == "stream_started" and e.vbucket == 1][-1] == address_text(sim.addresses[new])
    assert not {"malformed", "unexpected", "error", "stream_failed"} & {e.kind for e in evs}
    assert client.streams[1].rollbacks == 1


def test_two_loopback_nodes_resume_after_failover_records_every_connection(tmp_path: Path) -> None:
    """A saved state, a failover while the client is away, a new run: the vbucket is requested from the promoted node,
    rolled back on the wire, and the state file ends equal to the cluster; every connection's frames are recorded."""
    cl, bucket = two_nodes(items=80)
    state_file = tmp_path / "state.json"
    records: list[Record] = []

    async def session() -> tuple[ResumeState, list[ConsumerEvent]]:
        evs: list[ConsumerEvent] = []
        async with SimNode(cl, 0) as n0, SimNode(cl, 1):
            st = await run_client(
                "127.0.0.1", n0.port, config(to_latest=True), on_event=evs.append, on_record=records.append, state_path=state_file
            )
        return st, evs

    first, _ = run(session())
    assert positions(first) == highs(bucket) and load_state(state_file) == first
    bucket.failover(2, lose=5)
    bucket.mutate("later", {"x": 1})
    records.clear()
    second, evs = run(session())
    assert positions(second) == highs(bucket) and load_state(state_file) == second
    rb = [e for e in evs if e.kind == "rollback"]
    assert [e.vbucket for e in rb] == [2] and rb[0].data["rollback_seqno"] <= first.vbuckets[2].seqno - 5
    wire = [dissect(r.event, r.context) for r in records if r.event.type == "frame"]  # type: ignore[arg-type]
    refused = [d for d in wire if d.name == "DCP_STREAM_REQ" and d.frame.status == Status.ROLLBACK]
    assert len(refused) == 1 and refused[0].body["rollback_seqno"] == rb[0].data["rollback_seqno"]
    assert len({r.conn for r in records}) == 2  # both nodes' connections


def test_an_unreachable_node_fails_in_one_line_naming_it_and_keeps_the_state(tmp_path: Path) -> None:
    cl, bucket = two_nodes(vbuckets=2, items=20)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # nothing listens there once the socket is closed
    resume = ResumeState("travel", {vb.id: VbState(vb.uuid, 3, 3, 3, [(vb.uuid, 0)]) for vb in bucket.vbuckets})
    state_file = tmp_path / "state.json"

    async def main() -> None:
        async with SimNode(cl, 0) as n0:
            cl.addresses[1] = ("127.0.0.1", dead)
            await run_client("127.0.0.1", n0.port, config(resume=resume), state_path=state_file)

    with pytest.raises(ClientError) as info:
        run(main())
    message = str(info.value)
    assert message.startswith(f"cannot connect to 127.0.0.1:{dead}: ") and "\n" not in message
    assert info.value.state is not None and info.value.state.vbuckets[1] == resume.vbuckets[1]
    saved = load_state(state_file)
    assert saved is not None and saved.vbuckets[1] == resume.vbuckets[1] and saved.vbuckets[0].seqno >= 3


def test_one_node_simulator_stays_on_one_connection() -> None:
    sim = Simulator(bucket="travel", vbuckets=4, items=30, users={"alice": PASSWORD}, seed=2, tick=0.02)

    async def main() -> tuple[ResumeState, DcpClient]:
        await sim.start()
        try:
            client = DcpClient(sim.host, sim.port, config(to_latest=True))
            return await client.run(), client
        finally:
            await sim.stop()

    state, client = run(main())
    assert positions(state) == highs(sim.bucket)
    assert client.fleet is not None and list(client.fleet.links) == [0]
    assert client.consumer is not None and client.consumer.cluster_map is not None and client.consumer.node_index == 0


def test_counts_carry_over_when_a_stream_moves() -> None:
    cluster, bucket = two_nodes()
    p = Pump(cluster, config())
    p.until(lambda: p.caught_up(bucket))
    before, moves = Counter(p.fleet.streams[3].counts), p.fleet.streams[3].moves  # vb 3 moved once at the bootstrap
    bucket.failover(3)
    p.until(lambda: p.fleet.streams[3].moves > moves and p.caught_up(bucket))
    assert p.fleet.streams[3].counts == before and p.fleet.streams[3].moves == moves + 1 == 2


def test_a_finished_link_is_not_waited_on_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bootstrap node holds none of the asked vbuckets: its link ends at once while the other streams on.

    The client's main loop must then wait on the running link only: a finished task in its wait set would make
    every wait return at once (a busy loop).
    """
    import dcpinspect.live.client as client_module

    sim = Simulator(bucket="travel", vbuckets=4, items=8, users={"alice": PASSWORD}, seed=7, nodes=2)
    waits = 0
    real_wait = asyncio.wait

    async def counted(*args: Any, **kw: Any) -> Any:
        nonlocal waits
        waits += 1
        return await real_wait(*args, **kw)

    async def main() -> None:
        nonlocal waits
        await sim.start()
        try:
            elsewhere = next(vb for vb, row in enumerate(sim.bucket.vbucket_map()) if row[0] == 1)
            client = DcpClient(sim.host, sim.port, config(vbuckets=(elsewhere,)))  # asks node 0 for a node-1 vbucket
            monkeypatch.setattr(client_module.asyncio, "wait", counted)
            await client.start()
            await client.until(lambda c: client.streams.get(elsewhere) is not None and client.streams[elsewhere].status == "streaming")
            waits = 0
            for i in range(20):
                seqno = sim.mutate(f"w{i}", {"i": i}) if sim.bucket.vbucket_of(f"w{i}").id == elsewhere else None
                if seqno is not None:
                    await client.until(lambda c, s=seqno: client.streams[elsewhere].position.seqno >= s)
            # a finished link leaves the set the main loop waits on (else every wait would return at once)
            assert all(not t.done() for t in client._tasks.values()), client._tasks
            assert waits < 50, f"{waits} waits in the main loop"
            await client.stop()
        finally:
            monkeypatch.undo()
            await sim.stop()

    run(main())
