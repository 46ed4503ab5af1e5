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

from dcpinspect.live.cluster import Cluster
from dcpinspect.live.producer import ProducerConnection

LOOP = "127.0.0.1"


class OutputFilter(Protocol):
    """What the node sends passes through this (one per connection): e.g. a hostile server's mutations."""

    close: bool  # set: the connection is closed once the filtered output is written

    def filter(self, data: bytes) -> bytes:
        """The bytes to send instead of ``data``."""
        ...


class SimNode:
    """One :class:`ProducerConnection` on ``cluster`` per TCP connection; use as ``async with SimNode(cluster) as node``."""

    def __init__(self, cluster: Cluster, *, output_filter: Callable[[], OutputFilter] | None = None) -> None:
        self.cluster = cluster
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

    async def __aenter__(self) -> SimNode:
        self.server = await asyncio.start_server(self._serve, LOOP, 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        loop = asyncio.get_running_loop()
        conn = ProducerConnection(self.cluster, now=loop.time())
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
