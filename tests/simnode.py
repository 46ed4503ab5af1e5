"""A loopback data node: the sans-IO producer behind an asyncio server on 127.0.0.1, driven by events only.

Used by the live client tests (``sim_node`` fixture in conftest.py) and by
``benchmarks/fuzz_client.py`` (its hostile server is this node with an output
filter).  Nothing here reads or polls the clock to make progress:

1. A connection's :class:`~dcpinspect.live.producer.ProducerConnection` runs
   when the client's bytes arrive, or when :meth:`SimNode.kick` says the
   workload changed (that also ticks it: noops, timeouts).
2. After each of those its output is written, then it is pumped again, until a
   pump produces nothing: no stream waits for a timer to move on.
3. The time passed to the producer is the event loop's clock, read at those
   moments only.
4. :attr:`SimNode.received` and :attr:`SimNode.sent` count the bytes handled and
   written (a received chunk once the producer has taken it); :attr:`SimNode.idle`
   says every connection is open and parked waiting for its client.  A test
   that sees the node idle and the client's byte counters equal to these knows
   nothing is in flight either way: only time can move the connection on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, Protocol

from producerpeer import stream_extras

from dcpinspect import encode
from dcpinspect.flows.session import ConnState
from dcpinspect.live.cluster import Cluster
from dcpinspect.live.producer import ProducerConnection
from dcpinspect.live.sasl import plain_payload
from dcpinspect.protocol.enums import Feature
from dcpinspect.protocol.rules import MAX_SEQNO
from dcpinspect.wire.decoder import FrameDecoder
from dcpinspect.wire.dissect import dissect
from dcpinspect.wire.dissection import Dissection
from dcpinspect.wire.events import Frame

LOOP = "127.0.0.1"
#: the HELLO features a collection-aware client asks for
WIRE_FEATURES = (Feature.COLLECTIONS, Feature.JSON, Feature.ALT_REQUEST_SUPPORT)
#: a safety net only: an awaited event that never comes fails the test instead of hanging it
WIRE_TIMEOUT = 30.0


async def stop_server(server: asyncio.Server, tasks: set[asyncio.Task[Any]]) -> None:
    """Stop listening, cancel the connection handlers and wait until they and the server are gone."""
    server.close()
    for t in list(tasks):
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await server.wait_closed()


class OutputFilter(Protocol):
    """What the node sends passes through this (one per connection): e.g. a hostile server's mutations."""

    close: bool  # set: the connection is closed once the filtered output is written

    def filter(self, data: bytes) -> bytes:
        """The bytes to send instead of ``data``."""
        ...


class SimNode:
    """One :class:`ProducerConnection` on ``cluster`` per TCP connection; use as ``async with SimNode(cluster) as node``.

    ``node`` is the data node it plays (its address goes to ``cluster.addresses[node]``);
    several SimNodes on one cluster make a multi-node cluster.  While it runs, a
    change of the cluster's data (``cluster.changed()``) kicks it on the next loop turn.
    """

    def __init__(self, cluster: Cluster, node: int = 0, *, output_filter: Callable[[], OutputFilter] | None = None) -> None:
        self.cluster = cluster
        self.node = node
        self.output_filter = output_filter
        self.host = LOOP
        self.port = 0
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[Any]] = set()
        #: bytes the producers took from their clients, and bytes written to them (after the output filter)
        self.received = 0
        self.sent = 0
        #: connections the node has ended (their end may still be on its way to the client)
        self.closed = 0
        self._waiting = 0  # connections parked waiting for their client (or a kick)
        self._wakes: dict[ProducerConnection, asyncio.Event] = {}
        self._previous_on_change: Callable[[], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def idle(self) -> bool:
        """No connection ended, and each waits for its client (or a kick): what it had to send is written, nothing is being handled."""
        return self.closed == 0 and self._waiting == len(self._wakes)

    @property
    def connections(self) -> list[ProducerConnection]:
        """The producer side of each open connection."""
        return list(self._wakes)

    def kick(self) -> None:
        """The cluster changed (or time passed): every connection ticks and sends what it has."""
        for wake in self._wakes.values():
            wake.set()

    def _on_change(self) -> None:
        if self._previous_on_change is not None:
            self._previous_on_change()
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.kick)  # never re-entrantly: the change may come from a connection's pump

    async def __aenter__(self) -> SimNode:
        self.server = await asyncio.start_server(self._serve, LOOP, 0)
        self.port = self.server.sockets[0].getsockname()[1]
        self.cluster.addresses[self.node] = (LOOP, self.port)
        self._loop = asyncio.get_running_loop()
        self._previous_on_change = self.cluster.on_change
        self.cluster.on_change = self._on_change
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.cluster.on_change = self._previous_on_change
        self._loop = None
        await stop_server(self.server, self.tasks)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        loop = asyncio.get_running_loop()
        conn = ProducerConnection(self.cluster, node=self.node, now=loop.time())
        out = self.output_filter() if self.output_filter is not None else None
        wake = self._wakes[conn] = asyncio.Event()
        read: asyncio.Future[bytes] = asyncio.ensure_future(reader.read(1 << 16))
        try:
            while not conn.closed and await self._flush(conn, writer, out, loop):
                woken = asyncio.ensure_future(wake.wait())
                self._waiting += 1
                try:
                    await asyncio.wait((read, woken), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    self._waiting -= 1
                    woken.cancel()
                if read.done():
                    data = read.result()
                    if not data:
                        break
                    conn.receive(data, loop.time())
                    self.received += len(data)
                    read = asyncio.ensure_future(reader.read(1 << 16))
                if wake.is_set():
                    wake.clear()
                    conn.tick(loop.time())
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            read.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await read
            conn.close("socket closed")
            self._wakes.pop(conn, None)
            self.closed += 1
            writer.close()
            self.tasks.discard(task)

    async def _flush(
        self, conn: ProducerConnection, writer: asyncio.StreamWriter, out: OutputFilter | None, loop: asyncio.AbstractEventLoop
    ) -> bool:
        """Write the output, pumping until nothing more comes; whether the connection stays open."""
        while True:
            data = conn.data_to_send()
            if out is not None:
                data = out.filter(data)
            if data:
                writer.write(data)
                self.sent += len(data)
                await writer.drain()
            if out is not None and out.close:
                return False
            if conn.closed:
                return False
            conn.pump(loop.time())
            if not conn.output_size:
                return True


class WireClient:
    """A minimal DCP consumer over a real TCP socket (for the over-the-wire producer tests).

    Frames are built with :func:`~dcpinspect.encode` and read with FrameDecoder +
    dissect in the context the connection negotiated (every frame must dissect
    cleanly).  It answers the producer's noops by itself; everything else it
    keeps, in order, for :meth:`next` / :meth:`until`.  Nothing here waits for time
    to pass: every wait is for bytes (with :data:`WIRE_TIMEOUT` as a safety net).
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.dec = FrameDecoder()
        self.state = ConnState()
        self.backlog: list[Dissection] = []
        self.opaque = 0
        self.eof = False

    @classmethod
    async def connect(cls, address: tuple[str, int]) -> WireClient:
        return cls(*await asyncio.open_connection(*address))

    def send(self, raw: bytes) -> None:
        self.state.observe("c2s", Frame(0, raw))
        self.writer.write(raw)

    async def _read(self) -> None:
        data = await asyncio.wait_for(self.reader.read(1 << 16), WIRE_TIMEOUT)
        if not data:
            self.eof = True
            raise ConnectionError("the node closed the connection")
        for ev in self.dec.feed(data):
            assert ev.type == "frame", ev
            d = dissect(ev, self.state.context)
            assert not d.problems, (d.name, d.variant, d.problems)
            if d.role == "response":
                self.state.observe("s2c", ev)
            if d.name == "DCP_NOOP" and d.role == "request":
                self.send(encode("DCP_NOOP", response=True, opaque=d.frame.opaque))
                continue
            self.backlog.append(d)

    async def next(self) -> Dissection:
        while not self.backlog:
            await self._read()
        return self.backlog.pop(0)

    async def until(self, want: str | Callable[[Dissection], bool]) -> list[Dissection]:
        """Every frame up to and including the first that is ``want`` (a command name, or a predicate)."""
        test = (lambda d: d.name == want) if isinstance(want, str) else want
        got: list[Dissection] = []
        while True:
            d = await self.next()
            got.append(d)
            if test(d):
                return got

    async def closed(self) -> bool:
        """Read until the node closes the connection; True then (frames received before go to the backlog)."""
        try:
            while True:
                await self._read()
        except ConnectionError:
            return True

    async def request(self, name: str, **kw: Any) -> Dissection:
        """Send a request and wait for its response (frames in between stay in the backlog, in order)."""
        self.opaque += 1
        opaque = self.opaque
        self.send(encode(name, opaque=opaque, **kw))
        kept: list[Dissection] = []
        while True:
            if not self.backlog:
                await self._read()
                continue
            d = self.backlog.pop(0)
            if d.role == "response" and d.frame.opaque == opaque:
                self.backlog[:0] = kept
                return d
            kept.append(d)

    async def status(self, name: str, **kw: Any) -> int:
        return (await self.request(name, **kw)).frame.status

    async def bootstrap(
        self,
        *,
        features: tuple[int, ...] = WIRE_FEATURES,
        name: str = "wire",
        open_flags: int = 0x01,
        controls: dict[str, str] | None = None,
        bucket: str = "default",
    ) -> None:
        if features:
            assert (await self.request("HELLO", key="wire", value={"features": [(f,) for f in features]})).frame.status == 0
        assert await self.status("SASL_AUTH", key="PLAIN", value=plain_payload("Administrator", "password")) == 0
        assert await self.status("SELECT_BUCKET", key=bucket) == 0
        assert await self.status("DCP_OPEN", key=name, extras={"flags": open_flags}) == 0
        for k, v in ({"enable_noop": "true"} if controls is None else controls).items():
            assert await self.status("DCP_CONTROL", key=k, value=v) == 0, k

    async def stream_req(
        self,
        vb: int = 0,
        *,
        start: int = 0,
        end: int = MAX_SEQNO,
        uuid: int = 0,
        ss: int | None = None,
        se: int | None = None,
        flags: int = 0,
        value: Any = None,
    ) -> Dissection:
        """A DCP_STREAM_REQ and its response."""
        extras = stream_extras(start=start, end=end, uuid=uuid, ss=ss, se=se, flags=flags)
        return await self.request("DCP_STREAM_REQ", extras=extras, vbucket=vb, value=value, datatype=0x01 if value else 0)

    def close(self) -> None:
        self.writer.close()
