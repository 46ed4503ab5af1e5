"""The producer's session rules over a real TCP socket: noops and liveness, DCP_CONTROL replies, DCP commands
before DCP_OPEN, failover logs.

The node here is the sans-IO ProducerConnection behind a loopback asyncio server whose clock the test moves
(``ClockNode.advance``), so noop intervals and the 360 s idle timeout pass without waiting.  To know that the
node sent nothing, the client makes a KV NOOP round trip: TCP keeps order, so anything the node had written
before answering it arrives first.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from simnode import stop_server

from dcpinspect import encode
from dcpinspect.live.cluster import Cluster
from dcpinspect.live.producer import ProducerConnection
from dcpinspect.live.sasl import plain_payload
from dcpinspect.protocol.enums import Feature, OpenFlag, Status
from dcpinspect.protocol.session import CONTROL_KEYS, DCP_IDLE_TIMEOUT, NOOP_OPAQUE_BASE, control_status
from dcpinspect.wire.decoder import FrameDecoder
from dcpinspect.wire.events import Frame

LOOP = "127.0.0.1"
SAFETY = 30.0  # a deadline only: every wait is for an event


class ClockNode:
    """ProducerConnections on a loopback server; time moves only when the test calls :meth:`advance`."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.now = 1000.0
        self.port = 0
        self.conns: dict[ProducerConnection, asyncio.StreamWriter] = {}
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[Any]] = set()

    async def __aenter__(self) -> ClockNode:
        self.server = await asyncio.start_server(self._serve, LOOP, 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        await stop_server(self.server, self.tasks)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        conn = ProducerConnection(self.cluster, now=self.now)
        self.conns[conn] = writer
        try:
            while await self._flush(conn, writer):
                data = await reader.read(1 << 16)
                if not data:
                    break
                conn.receive(data, self.now)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            conn.close("socket closed")
            self.conns.pop(conn, None)
            writer.close()
            self.tasks.discard(task)

    async def _flush(self, conn: ProducerConnection, writer: asyncio.StreamWriter) -> bool:
        while True:
            data = conn.data_to_send()
            if data:
                writer.write(data)
                await writer.drain()
            if conn.closed:
                writer.close()
                return False
            conn.pump(self.now)
            if not conn.output_size:
                return True

    async def advance(self, seconds: float) -> None:
        """Time passes: every connection ticks (noops, idle timeout) and its output is written."""
        self.now += seconds
        for conn, writer in list(self.conns.items()):
            conn.tick(self.now)
            await self._flush(conn, writer)


class Client:
    """A raw client: frames out, frames in; :meth:`sync` returns what the node sent before a KV NOOP's reply."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.dec = FrameDecoder()
        self.inbox: list[Frame] = []
        self.opaque = 0

    @classmethod
    async def connect(cls, port: int) -> Client:
        reader, writer = await asyncio.open_connection(LOOP, port)
        return cls(reader, writer)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()

    def send(self, *frames: bytes) -> None:
        self.writer.write(b"".join(frames))

    async def _more(self) -> bool:
        data = await asyncio.wait_for(self.reader.read(1 << 16), SAFETY)
        if not data:
            return False
        for ev in self.dec.feed(data):
            assert ev.type == "frame", ev
            self.inbox.append(ev)
        return True

    async def reply(self, opaque: int) -> tuple[list[Frame], Frame]:
        """(the frames before it, the response with this opaque)."""
        while True:
            for i, f in enumerate(self.inbox):
                if f.magic in (0x81, 0x18) and f.opaque == opaque:
                    before, self.inbox = self.inbox[:i], self.inbox[i + 1 :]
                    return before, f
            assert await self._more(), "the node closed the connection"

    async def request(self, name: str | int, **kw: Any) -> Frame:
        self.opaque += 1
        self.send(encode(name, opaque=self.opaque, **kw))
        _, f = await self.reply(self.opaque)
        return f

    async def sync(self) -> list[Frame]:
        """The frames the node sent before answering a KV NOOP sent now."""
        self.opaque += 1
        self.send(encode("NOOP", opaque=self.opaque))
        before, f = await self.reply(self.opaque)
        assert f.status == 0
        return before

    async def closed_by_peer(self) -> bool:
        """Read until the node closes the connection (True) - frames it sends meanwhile are kept."""
        while await self._more():
            pass
        return True

    async def bootstrap(
        self, *, features: tuple[int, ...] = (Feature.COLLECTIONS, Feature.JSON), controls: dict[str, str] | None = None
    ) -> None:
        if features:
            assert (await self.request("HELLO", key="wire", value={"features": [(int(f),) for f in features]})).status == 0
        assert (await self.request("SASL_AUTH", key="PLAIN", value=plain_payload("Administrator", "password"))).status == 0
        assert (await self.request("SELECT_BUCKET", key="default")).status == 0
        assert (await self.request("DCP_OPEN", key=f"wire-{id(self)}", extras={"flags": int(OpenFlag.PRODUCER)})).status == 0
        for k, v in (controls or {}).items():
            assert (await self.request("DCP_CONTROL", key=k, value=v)).status == 0, k


def _cluster(**kw: Any) -> Cluster:
    cluster = Cluster(seed=3, **kw)
    cluster.create_bucket("default", vbuckets=2, items=4)
    return cluster


def _noops(frames: list[Frame]) -> list[int]:
    return [f.opaque for f in frames if f.magic == 0x80 and f.opcode == 0x5C]


# ---------------------------------------------------------------------------
# rule 1: noops


def test_noops_over_tcp_every_interval_one_at_a_time() -> None:
    async def main() -> None:
        async with ClockNode(_cluster()) as node:
            c = await Client.connect(node.port)
            await c.bootstrap(controls={"enable_noop": "true"})  # the default interval: 20 s
            await node.advance(19.9)
            assert _noops(await c.sync()) == []
            await node.advance(0.1)
            assert _noops(await c.sync()) == [NOOP_OPAQUE_BASE]
            await node.advance(30.0)  # unanswered: no second noop
            assert _noops(await c.sync()) == []
            c.send(encode("DCP_NOOP", response=True, opaque=NOOP_OPAQUE_BASE))
            assert await c.sync() == []  # the reply is handled (in order, before the sync)
            await node.advance(0.0)  # 30 s since the last noop: the next goes at once
            assert _noops(await c.sync()) == [NOOP_OPAQUE_BASE + 1]
            c.send(encode("DCP_NOOP", response=True, opaque=NOOP_OPAQUE_BASE + 1))
            await c.sync()
            await node.advance(19.9)
            assert _noops(await c.sync()) == []
            await node.advance(0.1)
            assert _noops(await c.sync()) == [NOOP_OPAQUE_BASE + 2]
            await c.close()

    asyncio.run(main())


def test_noops_over_tcp_keep_their_period_while_a_stream_flows() -> None:
    async def main() -> None:
        cluster = Cluster(seed=3)
        b = cluster.create_bucket("default", vbuckets=1)
        async with ClockNode(cluster) as node:
            c = await Client.connect(node.port)
            await c.bootstrap(controls={"enable_noop": "true", "set_noop_interval": "5"})
            extras = {"start_seqno": 0, "end_seqno": 2**64 - 1, "snap_start_seqno": 0, "snap_end_seqno": 0}
            assert (await c.request("DCP_STREAM_REQ", extras=extras, vbucket=0)).status == 0
            seen: list[float] = []
            mutations = 0
            for i in range(20):  # a mutation every second, each one streamed
                b.mutate(f"k{i}", {"i": i})
                await node.advance(1.0)
                frames = await c.sync()
                mutations += sum(1 for f in frames if f.opcode == 0x57)
                for opaque in _noops(frames):
                    seen.append(node.now)
                    c.send(encode("DCP_NOOP", response=True, opaque=opaque))
            assert mutations == 20
            assert [t - 1000.0 for t in seen] == [5.0, 10.0, 15.0, 20.0]
            await c.close()

    asyncio.run(main())


def test_idle_timeout_over_tcp_counts_from_the_last_thing_received() -> None:
    async def main() -> None:
        async with ClockNode(_cluster()) as node:
            c = await Client.connect(node.port)
            await c.bootstrap(controls={"enable_noop": "true"})
            await node.advance(DCP_IDLE_TIMEOUT - 0.5)  # a noop is waiting, unanswered
            assert _noops(await c.sync()) == [NOOP_OPAQUE_BASE]  # still open (and the sync is heard)
            await node.advance(DCP_IDLE_TIMEOUT - 0.5)
            await c.sync()
            await node.advance(DCP_IDLE_TIMEOUT + 0.5)
            assert await asyncio.wait_for(c.closed_by_peer(), SAFETY)

    asyncio.run(main())


def test_no_idle_disconnect_over_tcp_without_noops() -> None:
    async def main() -> None:
        async with ClockNode(_cluster()) as node:
            c = await Client.connect(node.port)
            await c.bootstrap()
            await node.advance(10 * DCP_IDLE_TIMEOUT)
            assert await c.sync() == []
            await c.close()

    asyncio.run(main())


@pytest.mark.parametrize("frame", ["request", "wrong opaque"])
def test_a_noop_request_or_a_stray_noop_reply_over_tcp_disconnects(frame: str) -> None:
    async def main() -> None:
        async with ClockNode(_cluster()) as node:
            c = await Client.connect(node.port)
            await c.bootstrap(controls={"enable_noop": "true"})
            await node.advance(20.0)
            assert _noops(await c.sync()) == [NOOP_OPAQUE_BASE]
            if frame == "request":
                c.send(encode("DCP_NOOP", opaque=77))
            else:
                c.send(encode("DCP_NOOP", response=True, opaque=NOOP_OPAQUE_BASE + 1))
            assert await asyncio.wait_for(c.closed_by_peer(), SAFETY)
            assert not any(f.opcode == 0x5C and f.magic == 0x81 for f in c.inbox)  # the request is not answered

    asyncio.run(main())


# ---------------------------------------------------------------------------
# rule 13: DCP_CONTROL replies are the table's, over the wire

WIRE_VALUES = ["true", "false", "yes", "2.2", "2.0", "0.05", "1.5", "nan", "1024", "4294967296", " 9", "high", "sequential", "x"]


@pytest.mark.parametrize(
    "features", [(Feature.COLLECTIONS, Feature.JSON), (Feature.JSON,), (Feature.SNAPPY,)], ids=["collections", "json", "snappy"]
)
def test_control_replies_over_tcp_follow_the_table(features: tuple[int, ...]) -> None:
    async def main() -> None:
        async with ClockNode(_cluster()) as node:
            for key in [*CONTROL_KEYS, "no_such_key"]:
                c = await Client.connect(node.port)
                await c.bootstrap(features=features)
                conn = list(node.conns)[-1]  # this client's connection: the newest
                for value in WIRE_VALUES:
                    want = control_status(
                        key, value, features=frozenset(int(f) for f in features), open_flags=1, controls=dict(conn.controls)
                    )
                    got = (await c.request("DCP_CONTROL", key=key, value=value)).status
                    assert got == want, (key, value, hex(got), hex(want))
                await c.close()

    asyncio.run(main())


def test_max_marker_version_and_cache_transfer_over_tcp() -> None:
    async def main() -> None:
        async with ClockNode(_cluster()) as node:
            legacy = await Client.connect(node.port)
            await legacy.bootstrap(features=(Feature.JSON,))
            assert (await legacy.request("DCP_CONTROL", key="max_marker_version", value="2.2")).status == Status.NOT_SUPPORTED
            assert (await legacy.request("DCP_CONTROL", key="cache_transfer", value="true")).status == Status.SUCCESS
            modern = await Client.connect(node.port)
            await modern.bootstrap()
            assert (await modern.request("DCP_CONTROL", key="max_marker_version", value="2.2")).status == Status.SUCCESS
            assert (await modern.request("DCP_CONTROL", key="connection_buffer_size", value="4294967295")).status == Status.SUCCESS
            assert (await modern.request("DCP_CONTROL", key="connection_buffer_size", value="4294967296")).status == Status.EINVAL
            await legacy.close()
            await modern.close()

    asyncio.run(main())


# ---------------------------------------------------------------------------
# rule 15 (part): DCP commands before DCP_OPEN, failover logs


def test_dcp_commands_before_open_over_tcp_are_einval_and_the_connection_stays() -> None:
    async def main() -> None:
        cluster = _cluster()
        cluster.buckets["default"].set_state(1, "dead")
        async with ClockNode(cluster) as node:
            c = await Client.connect(node.port)
            assert (await c.request("SASL_AUTH", key="PLAIN", value=plain_payload("Administrator", "password"))).status == 0
            assert (await c.request("SELECT_BUCKET", key="default")).status == 0
            assert (await c.request("DCP_GET_FAILOVER_LOG", vbucket=0)).status == Status.EINVAL
            assert (await c.request("DCP_CONTROL", key="enable_noop", value="true")).status == Status.EINVAL
            assert (await c.request("DCP_NOOP")).status == Status.EINVAL
            extras = {"start_seqno": 0, "end_seqno": 2**64 - 1, "snap_start_seqno": 0, "snap_end_seqno": 0}
            assert (await c.request("DCP_STREAM_REQ", extras=extras)).status == Status.EINVAL
            log = await c.request("GET_FAILOVER_LOG", vbucket=1)  # 0x96 on any connection; a dead vbucket keeps its log
            assert log.status == 0 and len(log.value) == 16 * len(cluster.buckets["default"].vbuckets[1].failover_log)
            assert (await c.request("DCP_OPEN", key="late", extras={"flags": 1})).status == 0
            dcp_log = await c.request("DCP_GET_FAILOVER_LOG", vbucket=1)
            assert dcp_log.status == 0 and dcp_log.value == log.value
            assert await c.sync() == []
            await c.close()

    asyncio.run(main())
