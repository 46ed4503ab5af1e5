"""The simulated Couchbase data node on a real TCP socket (the asyncio edge of :mod:`dcpinspect.live.producer`).

Inside a running event loop (Jupyter)::

    sim = Simulator(items=100)
    await sim.start()            # sim.host, sim.port
    sim.failover(0, lose=5)      # scenario controls, callable while streaming
    await sim.stop()

From synchronous code::

    with Simulator(items=100).run_in_thread() as sim:   # returns once listening
        sim.failover(0, lose=5)                         # marshalled onto the simulator's loop

Command line (:mod:`dcpinspect.cli.live`): ``dcpinspect sim --port 0`` prints ``listening on HOST:PORT`` first
(``[HOST]:PORT`` for IPv6) and runs until SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from .cluster import DCP_IDLE_TIMEOUT, Bucket, Cluster
from .producer import ProducerConnection

__all__ = ["MAX_VBUCKETS", "SCENARIOS", "Simulator", "SimulatorThread"]

T = TypeVar("T")

#: vbucket ids are 16 bits: at most this many vbuckets
MAX_VBUCKETS = 1 << 16
#: default :attr:`Simulator.backlog_limit`
BACKLOG_LIMIT = 1 << 20

Scenario = Callable[["Simulator"], Awaitable[None]]


class Simulator:
    """A DCP producer listening on TCP.

    Args:
        host: address to bind (loopback by default).
        port: port to bind (0: pick a free one; see :attr:`port` after :meth:`start`).
        bucket: bucket name.
        vbuckets: number of vbuckets.
        items: documents loaded into the default collection.
        users: user name -> password.
        scenario: name of a scripted scenario (:data:`SCENARIOS`) run after start.
        seed: seeds UUIDs and scenario choices (deterministic runs).
        tick: seconds between liveness ticks (noops, idle and slow-consumer checks).
        idle_timeout: kv_engine's dcp_idle_timeout (seconds without anything received, noops on).
        slow_after: seconds a full flow-control window may last before streams end Slow (``None``: never).
        checkpoint_items: seqnos per memory snapshot.
        backlog_limit: bytes of output per connection above which the simulator stops reading that
            client's requests until it has read its replies (backpressure); the same bound applies to
            output the connection produces but has not written yet, DCP streams included.  Queued
            output stays below about twice this plus one reply.
        on_reading_paused: called with the connection each time its reading stops for backpressure.

    :attr:`peak_backlog` is the largest transport write buffer seen on any connection after a write.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        bucket: str = "default",
        vbuckets: int = 4,
        items: int = 100,
        users: Mapping[str, str] | None = None,
        scenario: str | None = None,
        seed: int = 0,
        tick: float = 0.05,
        idle_timeout: float = DCP_IDLE_TIMEOUT,
        slow_after: float | None = None,
        checkpoint_items: int = 50,
        backlog_limit: int = BACKLOG_LIMIT,
        on_reading_paused: Callable[[ProducerConnection], None] | None = None,
    ) -> None:
        if scenario is not None and scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(sorted(SCENARIOS))}")
        if not 1 <= vbuckets <= MAX_VBUCKETS:
            raise ValueError(f"vbuckets must be 1..{MAX_VBUCKETS} (vbucket ids are 16 bits), not {vbuckets}")
        if backlog_limit < 1:
            raise ValueError("backlog_limit must be positive")
        self.host = host
        self.port = port
        self.scenario = scenario
        self.cluster = Cluster(
            users if users is not None else {"Administrator": "password"},
            seed=seed,
            idle_timeout=idle_timeout,
            slow_after=slow_after,
            checkpoint_items=checkpoint_items,
            output_limit=backlog_limit,
        )
        self.bucket: Bucket = self.cluster.create_bucket(bucket, vbuckets=vbuckets, items=items)
        self.rng = random.Random(seed)
        self.tick_interval = tick
        self.backlog_limit = backlog_limit
        self.on_reading_paused = on_reading_paused
        self.peak_backlog = 0
        self._server: asyncio.AbstractServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._conns: dict[ProducerConnection, tuple[asyncio.StreamWriter, asyncio.Event]] = {}

    def __repr__(self) -> str:
        return f"Simulator({self.host}:{self.port}, bucket={self.bucket.name!r}, connections={len(self._conns)})"

    # --- lifecycle -----------------------------------------------------------------
    @property
    def address(self) -> tuple[str, int]:
        """(host, port) once started."""
        return (self.host, self.port)

    @property
    def running(self) -> bool:
        """Listening."""
        return self._server is not None

    def _now(self) -> float:
        assert self._loop is not None
        return self._loop.time()

    async def start(self) -> Simulator:
        """Bind and start serving; returns self (``host``/``port`` are then the bound address)."""
        if self._server is not None:
            return self
        self._loop = asyncio.get_running_loop()
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        sock = self._server.sockets[0]
        self.host, self.port = sock.getsockname()[:2]
        self._spawn(self._ticker())
        if self.scenario is not None:
            self._spawn(SCENARIOS[self.scenario][1](self))
        return self

    async def stop(self) -> None:
        """Stop listening, drop every connection, cancel the scenario."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for t in list(self._tasks):
            t.cancel()
        for conn, (writer, wake) in list(self._conns.items()):
            conn.close("simulator stopped")
            wake.set()
            writer.close()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)

    async def __aenter__(self) -> Simulator:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def run_in_thread(self) -> SimulatorThread:
        """Run on a private event loop in a daemon thread; returns once listening."""
        return SimulatorThread(self)

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- connections -------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        conn = ProducerConnection(self.cluster, peer=_host_port(str(peer[0]), int(peer[1])) if peer else "", now=self._now())
        # drain() waits while the transport holds more than this (and until it is down to a quarter)
        writer.transport.set_write_buffer_limits(high=self.backlog_limit)
        wake = asyncio.Event()
        readable = asyncio.Event()  # set by the writer: the output is drained and every request handled
        readable.set()
        self._conns[conn] = (writer, wake)
        out = self._spawn(self._writer(conn, writer, wake, readable))
        try:
            while not conn.closed:
                if not readable.is_set():
                    # backpressure: a client that does not read its replies is not read either
                    if self.on_reading_paused is not None:
                        self.on_reading_paused(conn)
                    await readable.wait()
                    continue
                data = await reader.read(65536)
                if not data:
                    conn.close("client closed the connection")
                    break
                conn.receive(data, self._now())
                if not conn.want_read or writer.transport.get_write_buffer_size() > self.backlog_limit:
                    readable.clear()
                wake.set()
        except (ConnectionError, OSError):
            conn.close("connection reset")
        finally:
            conn.close(conn.close_reason or "closed")
            wake.set()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await out

    async def _writer(self, conn: ProducerConnection, writer: asyncio.StreamWriter, wake: asyncio.Event, readable: asyncio.Event) -> None:
        """The only task that writes to ``writer``: every write is preceded by a drain that returned."""
        try:
            while True:
                await wake.wait()
                wake.clear()
                while True:
                    data = conn.data_to_send()
                    if data:
                        writer.write(data)
                        self.peak_backlog = max(self.peak_backlog, writer.transport.get_write_buffer_size())
                    await writer.drain()  # returns at once unless the transport holds more than backlog_limit
                    if conn.want_read:
                        readable.set()
                    if conn.closed or not conn.want_write:
                        break
                    conn.pump(self._now())
                if conn.closed:
                    break
        except (ConnectionError, OSError):
            conn.close("connection reset")
        finally:
            self._conns.pop(conn, None)
            readable.set()  # a reader waiting for the output sees the connection closed
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(self.tick_interval)
            self.kick()

    def kick(self) -> None:
        """Tick every connection now (after a workload change, data flows at once)."""
        now = self._now() if self._loop is not None else 0.0
        for conn, (_writer, wake) in list(self._conns.items()):
            conn.tick(now)
            wake.set()

    @property
    def connections(self) -> list[ProducerConnection]:
        """The live connections."""
        return list(self._conns)

    # --- scenario controls (call on the simulator's loop; SimulatorThread marshals them) ----
    def mutate(self, key: str, value: Any = None, **kw: Any) -> int:
        """Store a document; returns its seqno."""
        seqno = self.bucket.mutate(key, value, **kw).seqno
        self.kick()
        return seqno

    def delete(self, key: str, **kw: Any) -> int:
        """Delete a document; returns the tombstone's seqno."""
        seqno = self.bucket.delete(key, **kw).seqno
        self.kick()
        return seqno

    def failover(self, vbucket: int, *, lose: int = 0) -> int:
        """Fail a vbucket over (optionally losing the last ``lose`` items); returns the new UUID."""
        uuid = self.bucket.failover(vbucket, lose=lose)
        self.kick()
        return uuid

    def purge(self, vbucket: int, upto: int | None = None) -> int:
        """Purge tombstones up to ``upto``; returns the purge seqno."""
        return self.bucket.purge(vbucket, upto)

    def create_collection(self, name: str, *, scope: str = "_default") -> int:
        """Create a collection; returns its id."""
        cid = self.bucket.create_collection(name, scope=scope)
        self.kick()
        return cid

    def drop_collection(self, name: str | int) -> int:
        """Drop a collection; returns its id."""
        cid = self.bucket.drop_collection(name)
        self.kick()
        return cid

    def set_state(self, vbucket: int, state: int | str) -> None:
        """Change a vbucket's state."""
        self.bucket.set_state(vbucket, state)
        self.kick()

    def stall(self, seconds: float) -> None:
        """Stop streaming to every connection for ``seconds`` (noops continue)."""
        now = self._now()
        for conn in self._conns:
            conn.pause(now + seconds)

    def drop_connections(self) -> None:
        """Close every client connection."""
        self.cluster.drop_connections()
        self.kick()
        for _writer, wake in self._conns.values():
            wake.set()


def _host_port(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets (``[::1]:11210``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class SimulatorThread:
    """A :class:`Simulator` on its own event loop in a daemon thread (for synchronous code).

    Control methods are forwarded to the simulator's loop and wait for the result.
    Use as a context manager or call :meth:`stop`.
    """

    def __init__(self, sim: Simulator, *, timeout: float = 10.0) -> None:
        self.sim = sim
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="dcpinspect-sim", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            raise TimeoutError("simulator did not start")
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self.sim.start())
        except BaseException as exc:
            self._error = exc
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()
        self._loop.close()

    @property
    def host(self) -> str:
        """Bound host."""
        return self.sim.host

    @property
    def port(self) -> int:
        """Bound port."""
        return self.sim.port

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` on the simulator's loop and return its result."""

        async def run() -> T:
            return fn(*args, **kwargs)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.sim, name)
        if callable(attr) and name in _FORWARDED:
            return lambda *a, **kw: self.call(attr, *a, **kw)
        return attr

    def stop(self) -> None:
        """Stop the simulator and its thread."""
        if self._loop.is_closed() or not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.sim.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> SimulatorThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_FORWARDED = frozenset(
    {"mutate", "delete", "failover", "purge", "create_collection", "drop_collection", "set_state", "stall", "drop_connections", "kick"}
)


# ---------------------------------------------------------------------------
# named scenarios


async def _steady(sim: Simulator) -> None:
    """A mutation every 100 ms on a random existing document."""
    i = 0
    while True:
        await asyncio.sleep(0.1)
        i += 1
        n = sim.rng.randrange(max(1, 100))
        sim.mutate(f"doc-{n:04d}", {"id": n, "rev": i})


async def _failover(sim: Simulator) -> None:
    """Writes for 1 s, then vbucket 0 fails over losing its last 3 items (consumers must roll back); writes go on."""
    steady = asyncio.ensure_future(_steady(sim))
    try:
        await asyncio.sleep(1.0)
        sim.failover(0, lose=min(3, sim.bucket.vbuckets[0].high_seqno))
        await asyncio.Event().wait()
    finally:
        steady.cancel()


async def _purge(sim: Simulator) -> None:
    """Deletes a few documents then purges the tombstones of every vbucket (resuming below the purge seqno rolls back to 0)."""
    for n in range(0, 20, 2):
        with contextlib.suppress(KeyError, ValueError):
            sim.delete(f"doc-{n:04d}")
    for vb in range(len(sim.bucket.vbuckets)):
        sim.purge(vb)
    await asyncio.Event().wait()


async def _collections(sim: Simulator) -> None:
    """Creates scope ``inventory`` with collection ``airlines``, writes to it, drops it after 2 s."""
    sim.bucket.create_scope("inventory")
    sim.create_collection("airlines", scope="inventory")
    for i in range(20):
        sim.mutate(f"airline-{i:03d}", {"id": i}, collection="inventory.airlines")
    await asyncio.sleep(2.0)
    sim.drop_collection("inventory.airlines")
    await asyncio.Event().wait()


async def _sync_writes(sim: Simulator) -> None:
    """A prepare every 200 ms, committed (or every third one aborted) 100 ms later."""
    i = 0
    while True:
        key = f"sync-{i % 10:02d}"
        sim.bucket.prepare(key, {"id": i})
        sim.kick()
        await asyncio.sleep(0.1)
        (sim.bucket.abort if i % 3 == 2 else sim.bucket.commit)(key)
        sim.kick()
        await asyncio.sleep(0.1)
        i += 1


async def _flaky(sim: Simulator) -> None:
    """Writes continuously; every 3 s all connections are dropped."""
    steady = asyncio.ensure_future(_steady(sim))
    try:
        while True:
            await asyncio.sleep(3.0)
            sim.drop_connections()
    finally:
        steady.cancel()


#: name -> (description, coroutine taking the simulator)
SCENARIOS: dict[str, tuple[str, Scenario]] = {
    "steady": ("a mutation every 100 ms", _steady),
    "failover": ("vbucket 0 fails over after 1 s losing 3 items (rollback)", _failover),
    "purge": ("tombstones purged at start (rollback to 0 below the purge seqno)", _purge),
    "collections": ("scope/collection created, written, dropped after 2 s", _collections),
    "sync-writes": ("prepare/commit/abort every 200 ms", _sync_writes),
    "flaky": ("connections dropped every 3 s", _flaky),
}
