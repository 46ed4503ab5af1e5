"""The simulated Couchbase data node on a real TCP socket (the asyncio edge of :mod:`dcpinspect.live.producer`).

Inside a running event loop (Jupyter)::

    sim = Simulator(items=100, nodes=2)
    await sim.start()            # sim.host, sim.port (node 0); sim.addresses (every node)
    sim.failover(0, lose=5)      # scenario controls, callable while streaming
    await sim.stop()

From synchronous code::

    with Simulator(items=100, nodes=2).run_in_thread() as sim:   # returns once listening
        sim.failover(0, lose=5)                                  # marshalled onto the simulator's loop

Each data node listens on its own port of the same host; every node serves the
same :class:`~dcpinspect.live.cluster.Cluster` (one cluster map), each
connection as the node it was made to.

Command line (:mod:`dcpinspect.cli.live`): ``dcpinspect sim --listen :0`` prints ``listening on HOST:PORT`` first
(``[HOST]:PORT`` for IPv6) and runs until SIGINT/SIGTERM.

1. Every connection is logged on :data:`log` (``dcpinspect.live.sim``): accepted
   (peer, node), its DCP_OPEN name once it opened, closed (why, what it did).
   The simulator never prints; the command line sends the log to stderr.
2. :attr:`Simulator.totals` counts over every connection, open or closed
   (connections, frames each way, streams, items, bytes each way);
   :meth:`Simulator.summary` is the one line the command prints on stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from .cluster import BACKFILL_IDLE_LIMIT, DCP_IDLE_TIMEOUT, Bucket, Cluster
from .producer import ProducerConnection
from .scenarios import SCENARIO_NODES, SCENARIOS
from .tap import counted, format_endpoint

__all__ = ["MAX_VBUCKETS", "SCENARIOS", "SCENARIO_NODES", "Simulator", "SimulatorThread", "log"]

log = logging.getLogger("dcpinspect.live.sim")

T = TypeVar("T")

#: vbucket ids are 16 bits: at most this many vbuckets
MAX_VBUCKETS = 1 << 16
#: default :attr:`Simulator.backlog_limit`
BACKLOG_LIMIT = 1 << 20


#: what :attr:`Simulator.totals` counts
_TOTALS = ("connections", "frames_in", "frames_out", "streams", "items", "bytes_in", "bytes_out")


class Simulator:
    """A DCP producer listening on TCP.

    Args:
        host: address to bind (loopback by default).
        port: port to bind (0: pick a free one; see :attr:`port` after :meth:`start`).
        bucket: bucket name.
        vbuckets: number of vbuckets.
        items: documents loaded into the default collection.
        users: user name -> password.
        nodes: data nodes, one port each (``None``: what the scenario needs, else 1); with
            two or more every vbucket has a replica and :meth:`failover` promotes it.
        scenario: name of a scripted scenario (:data:`SCENARIOS`) run after start.
        seed: seeds UUIDs and scenario choices (deterministic runs).
        tick: seconds between liveness ticks (noops, idle and stalled-backfill checks).
        idle_timeout: kv_engine's dcp_idle_timeout (seconds without anything received, noops on).
        slow_after: removed (must be ``None``): a server never ends a stream Slow because the
            consumer stopped acking; use :meth:`disk_pressure` (Slow after ``backfill_idle_limit``).
        backfill_idle_limit: seconds a backfill stalled under disk pressure lasts before its stream ends Slow.
        checkpoint_items: seqnos per checkpoint.
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
        nodes: int | None = None,
        scenario: str | None = None,
        seed: int = 0,
        tick: float = 0.05,
        idle_timeout: float = DCP_IDLE_TIMEOUT,
        slow_after: float | None = None,
        backfill_idle_limit: float = BACKFILL_IDLE_LIMIT,
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
        need = SCENARIO_NODES.get(scenario or "", 1)
        if nodes is None:
            nodes = need
        if nodes < need:
            raise ValueError(f"scenario {scenario!r} needs nodes >= {need}")
        self.host = host
        self.port = port
        self.scenario = scenario
        self.cluster = Cluster(
            users if users is not None else {"Administrator": "password"},
            nodes=nodes,
            seed=seed,
            idle_timeout=idle_timeout,
            slow_after=slow_after,
            backfill_idle_limit=backfill_idle_limit,
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
        self._servers: list[asyncio.Server] = []
        self._listening: list[tuple[str, int]] = []  # where each node listens (the map may name other addresses)
        self._kick_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._conns: dict[ProducerConnection, tuple[asyncio.StreamWriter, asyncio.Event]] = {}
        self._closed_totals = dict.fromkeys(_TOTALS, 0)  # of the connections that ended
        self._conn_bytes: dict[ProducerConnection, list[int]] = {}  # bytes in, out of each open connection
        self._all_ended: asyncio.Event | None = None  # set when the last open connection ended (while stopping)

    def __repr__(self) -> str:
        return f"Simulator({self.host}:{self.port}, bucket={self.bucket.name!r}, connections={len(self._conns)})"

    # --- lifecycle -----------------------------------------------------------------
    @property
    def address(self) -> tuple[str, int]:
        """(host, port) of node 0 once started."""
        return (self.host, self.port)

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """(host, port) where every node listens once started (node i at index i)."""
        return list(self._listening)

    def advertise(self, node: int, address: tuple[str, int]) -> None:
        """Have the cluster map name ``address`` for ``node`` (e.g. a tap proxy in front of it); its rev goes up."""
        if not 0 <= node < self.cluster.nodes:
            raise ValueError(f"no node {node}: the simulator runs {self.cluster.nodes}")
        self.cluster.addresses[node] = (str(address[0]), int(address[1]))
        self.cluster.rev += 1

    @property
    def nodes(self) -> int:
        """How many data nodes the simulator runs."""
        return self.cluster.nodes

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
        try:
            for node in range(self.cluster.nodes):
                # node 0 on the port asked for, the others on free ports of the same host
                server = await asyncio.start_server(functools.partial(self._serve, node=node), self.host, self.port if node == 0 else 0)
                self._servers.append(server)
                host, port = server.sockets[0].getsockname()[:2]
                self._listening.append((str(host), int(port)))
                self.cluster.addresses[node] = (str(host), int(port))
        except OSError:
            for server in self._servers:
                server.close()
            self._servers.clear()
            raise
        self._server = self._servers[0]
        self.host, self.port = self.cluster.addresses[0] or (self.host, self.port)
        self.cluster.on_change = self._changed
        self._spawn(self._ticker())
        if self.scenario is not None:
            self._spawn(SCENARIOS[self.scenario][1](self))
        return self

    async def stop(self) -> None:
        """Stop listening, drop every connection, cancel the scenario."""
        self._server = None
        servers, self._servers = self._servers, []
        self.cluster.on_change = None
        for server in servers:
            server.close()
        for t in list(self._tasks):
            t.cancel()
        for conn, (writer, wake) in list(self._conns.items()):
            conn.close("simulator stopped")
            wake.set()
            writer.close()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for server in servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)
        if self._conn_bytes:  # their handlers log them closed (a bounded wait: a handler stuck elsewhere is not waited for)
            self._all_ended = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._all_ended.wait(), 5.0)

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

    # --- counters ------------------------------------------------------------------------
    @property
    def totals(self) -> dict[str, int]:
        """Counts over every connection so far, open or closed.

        ``connections``, ``frames_in`` (from clients), ``frames_out``, ``streams`` (opened),
        ``items`` (DCP items sent), ``bytes_in``, ``bytes_out``.
        """
        out = dict(self._closed_totals)
        for conn, nbytes in list(self._conn_bytes.items()):
            for k, v in _conn_counts(conn, nbytes).items():
                out[k] += v
        return out

    def summary(self) -> str:
        """One line: ``stopped: 2 connections, 812 frames (12 in, 800 out), 4 streams, 400 items, 520 bytes in, 61234 bytes out``."""
        t = self.totals
        return (
            f"stopped: {counted(t['connections'], 'connection')}, {counted(t['frames_in'] + t['frames_out'], 'frame')} "
            f"({t['frames_in']} in, {t['frames_out']} out), {counted(t['streams'], 'stream')}, {counted(t['items'], 'item')}, "
            f"{counted(t['bytes_in'], 'byte')} in, {counted(t['bytes_out'], 'byte')} out"
        )

    def _ended(self, conn: ProducerConnection, where: str) -> None:
        """A connection is gone: its counts move to the closed totals, one log line says what it did."""
        nbytes = self._conn_bytes.pop(conn, None)
        if nbytes is None:
            return
        c = _conn_counts(conn, nbytes)
        for k, v in c.items():
            self._closed_totals[k] += v
        if not self._conn_bytes and self._all_ended is not None:
            self._all_ended.set()
        name = f", DCP {conn.dcp_name!r}" if conn.dcp_name is not None else ""
        log.info(
            "%s closed (%s)%s: %s in, %s out, %s, %s",
            where,
            conn.close_reason or "closed",
            name,
            counted(c["frames_in"], "frame"),
            counted(c["frames_out"], "frame"),
            counted(c["streams"], "stream"),
            counted(c["items"], "item"),
        )

    # --- connections -------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, node: int = 0) -> None:
        peer = writer.get_extra_info("peername")
        conn = ProducerConnection(
            self.cluster, node=node, peer=format_endpoint((str(peer[0]), int(peer[1]))) if peer else "", now=self._now()
        )
        where = f"connection {conn.serial} from {conn.peer or '?'}" + (f" to node {node}" if self.cluster.nodes > 1 else "")
        log.info("%s accepted", where)
        nbytes = self._conn_bytes[conn] = [0, 0]
        named = False
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
                nbytes[0] += len(data)
                conn.receive(data, self._now())
                if not named and conn.dcp_name is not None:
                    named = True
                    log.info("%s: DCP_OPEN %r", where, conn.dcp_name)
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
            self._ended(conn, where)

    async def _writer(self, conn: ProducerConnection, writer: asyncio.StreamWriter, wake: asyncio.Event, readable: asyncio.Event) -> None:
        """The only task that writes to ``writer``: every write is preceded by a drain that returned."""
        try:
            while True:
                await wake.wait()
                wake.clear()
                while True:
                    data = conn.data_to_send()
                    if data:
                        nbytes = self._conn_bytes.get(conn)
                        if nbytes is not None:
                            nbytes[1] += len(data)
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

    def _changed(self) -> None:
        """The cluster's data changed: kick every connection soon (never re-entrantly; thread-safe)."""
        loop = self._loop
        if loop is None or loop.is_closed() or self._kick_scheduled:
            return
        self._kick_scheduled = True
        loop.call_soon_threadsafe(self._scheduled_kick)

    def _scheduled_kick(self) -> None:
        self._kick_scheduled = False
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

    def prepare(self, key: str, value: Any = None, **kw: Any) -> int:
        """A sync-write prepare (see :meth:`~dcpinspect.live.cluster.Bucket.prepare`); returns its seqno."""
        seqno = self.bucket.prepare(key, value, **kw).seqno
        self.kick()
        return seqno

    def commit(self, key: str, **kw: Any) -> int:
        """Commit the pending prepare of ``key``; returns the commit's seqno."""
        seqno = self.bucket.commit(key, **kw).seqno
        self.kick()
        return seqno

    def abort(self, key: str, **kw: Any) -> int:
        """Abort the pending prepare of ``key``; returns the abort's seqno."""
        seqno = self.bucket.abort(key, **kw).seqno
        self.kick()
        return seqno

    def failover(self, vbucket: int, *, lose: int = 0, partial: int = 0) -> int:
        """Fail a vbucket's active node over to its replica (needs ``nodes >= 2``); returns the new UUID.

        See :meth:`~dcpinspect.live.cluster.Bucket.failover` (``lose``: items the replica
        never got; ``partial``: items of a snapshot it had not completed).
        """
        uuid = self.bucket.failover(vbucket, lose=lose, partial=partial)
        self.kick()
        return uuid

    def disk_pressure(self, on: bool = True) -> None:
        """Disk use above the backfill threshold, backfills stalled; a stalled backfill ends Slow after ``backfill_idle_limit``."""
        self.bucket.disk_pressure(on)
        self.kick()

    def fail_backfills(self, vbucket: int | None = None, *, times: int = 1) -> None:
        """The next ``times`` backfills of ``vbucket`` (None: any) fail: their streams end BackfillFail."""
        self.bucket.fail_backfills(vbucket, times=times)
        self.kick()

    def drop_cursors(self, vbucket: int | None = None) -> int:
        """Drop the checkpoint cursors of in-memory streams: they switch to a disk backfill without ending."""
        n = self.bucket.drop_cursors(vbucket)
        self.kick()
        return n

    def lose_privileges(self, user: str | None = None) -> None:
        """Revoke a user's (None: everyone's) privileges on the bucket: their streams end LostPrivileges."""
        self.bucket.lose_privileges(user)
        self.kick()

    def restore_privileges(self, user: str | None = None) -> None:
        """Undo :meth:`lose_privileges`."""
        self.bucket.restore_privileges(user)
        self.kick()

    def purge(self, vbucket: int, upto: int | None = None) -> int:
        """Purge tombstones up to ``upto``; returns the purge seqno (the newest purged tombstone's seqno)."""
        seqno = self.bucket.purge(vbucket, upto)
        self.kick()
        return seqno

    def create_collection(self, name: str, *, scope: str = "_default", max_ttl: int | None = None) -> int:
        """Create a collection (``max_ttl``: its maximum TTL in seconds, sent in a v1 BeginCollection event); returns its id."""
        cid = self.bucket.create_collection(name, scope=scope, max_ttl=max_ttl)
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

    def drop_connections(self, node: int | None = None) -> None:
        """Close every client connection (of one node, or all): the streams end Disconnected, nothing is sent."""
        self.cluster.drop_connections(node=node)
        self.kick()
        for _writer, wake in self._conns.values():
            wake.set()


def _conn_counts(conn: ProducerConnection, nbytes: list[int]) -> dict[str, int]:
    return {
        "connections": 1,
        "frames_in": conn.received_frames,
        "frames_out": conn.sent_frames,
        "streams": conn.streams_opened,
        "items": conn.items_sent,
        "bytes_in": nbytes[0],
        "bytes_out": nbytes[1],
    }


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
    {
        "mutate",
        "delete",
        "prepare",
        "commit",
        "abort",
        "failover",
        "purge",
        "create_collection",
        "drop_collection",
        "set_state",
        "stall",
        "drop_connections",
        "kick",
        "advertise",
        "disk_pressure",
        "fail_backfills",
        "drop_cursors",
        "lose_privileges",
        "restore_privileges",
    }
)
