"""The replay on a real TCP socket: the asyncio edge of :mod:`dcpinspect.live.replay`.

Inside a running event loop::

    server = ReplayServer(script, pace="fast")
    await server.start()          # server.host, server.port (port 0: a free one)
    ...                           # clients connect; server.connections, each one's divergences
    await server.stop()

1. Each accepted connection gets its own
   :class:`~dcpinspect.live.replay.ReplayConnection` (a fresh replay of the
   same script) on the loop's clock.
2. One task per connection moves bytes: it writes what the replay produced
   (after a drain), then sleeps until the client sends bytes or the replay's
   :meth:`~dcpinspect.live.replay.ReplayConnection.next_wakeup` comes, then
   ticks it.  A reader task feeds the client's bytes in.
3. ``on_divergence(conn, divergence)`` is called for each divergence as it
   happens, ``on_closed(conn)`` once a connection ended (its
   :meth:`~dcpinspect.live.replay.ReplayConnection.summary` is final).
4. :meth:`ReplayServer.divergences` and :meth:`ReplayServer.summaries` are
   the rows of every connection so far (plain dicts: this layer has no
   pandas); :func:`dcpinspect.views.replay_view.divergences_frame` and
   :func:`~dcpinspect.views.replay_view.replay_summary` make DataFrames of
   them, :func:`~dcpinspect.views.replay_view.replay_view` a notebook widget.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from .replay import Divergence, Pace, ReplayConnection
from .replay_script import Script
from .tap import format_endpoint

__all__ = ["ReplayServer", "log"]

log = logging.getLogger("dcpinspect.live.replay")


class ReplayServer:
    """Serve a recorded script to every client that connects.

    Args:
        script: the recorded producer side of one connection.
        host, port: where to listen (port 0: a free one).
        pace: ``captured`` or ``fast``.
        users: user name -> password for SASL (default ``Administrator:password``).
        on_divergence: called with (connection, divergence) as each happens.
        on_closed: called with each connection once it ended.
        source: what the script was recorded from (a capture's path), for views.
    """

    def __init__(
        self,
        script: Script,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        pace: Pace = "captured",
        users: dict[str, str] | None = None,
        on_divergence: Callable[[ReplayConnection, Divergence], None] | None = None,
        on_closed: Callable[[ReplayConnection], None] | None = None,
        source: str = "",
    ) -> None:
        self.script = script
        self.host = host
        self.port = port
        self.pace: Pace = pace
        self.users = users
        self.on_divergence = on_divergence
        self.on_closed = on_closed
        self.source = source
        #: every connection accepted so far, open or ended
        self.connections: list[ReplayConnection] = []
        self._server: asyncio.AbstractServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = asyncio.Condition()

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) once started."""
        return (self.host, self.port)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop it serves on (``None`` before :meth:`start`): a view refreshes there."""
        return self._loop

    @property
    def serving(self) -> bool:
        """Whether it listens (between :meth:`start` and :meth:`stop`)."""
        return self._server is not None

    def divergences(self) -> list[dict[str, Any]]:
        """One row per divergence of every connection so far: conn, at (seconds since it began), kind, asked, recorded, answered."""
        return [row for c in list(self.connections) for row in c.divergence_rows()]

    def summaries(self) -> list[dict[str, Any]]:
        """One row per connection so far: its :meth:`~dcpinspect.live.replay.ReplayConnection.summary`."""
        return [c.summary() for c in list(self.connections)]

    async def start(self) -> ReplayServer:
        """Bind and serve; ``host``/``port`` are then the bound address."""
        self._loop = asyncio.get_running_loop()
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        host, port = self._server.sockets[0].getsockname()[:2]
        self.host, self.port = str(host), int(port)
        return self

    async def stop(self) -> None:
        """Stop listening and end every connection."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def until_closed(self, n: int = 1) -> list[ReplayConnection]:
        """Wait until ``n`` connections have ended; returns them."""
        async with self._closed:
            await self._closed.wait_for(lambda: sum(c.closed for c in self.connections) >= n)
        return [c for c in self.connections if c.closed]

    def _now(self) -> float:
        assert self._loop is not None
        return self._loop.time()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        peer = writer.get_extra_info("peername")
        conn = ReplayConnection(
            self.script,
            pace=self.pace,
            users=self.users,
            address=(self.host, self.port),
            peer=format_endpoint((str(peer[0]), int(peer[1]))) if peer else "",
            now=self._now(),
            serial=len(self.connections) + 1,
        )
        self.connections.append(conn)
        log.info("connection %d from %s accepted", conn.serial, conn.peer or "?")
        wake = asyncio.Event()
        reading = asyncio.create_task(self._read(conn, reader, wake))
        reported = 0
        try:
            while True:
                data = conn.data_to_send()
                if data:
                    writer.write(data)
                    await writer.drain()
                reported = self._report(conn, reported)
                if conn.closed:
                    break
                if conn.want_write:
                    conn.pump(self._now())
                    continue
                at = conn.next_wakeup(self._now())
                with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                    await asyncio.wait_for(wake.wait(), None if at is None else max(0.0, at - self._now()))
                wake.clear()
                conn.tick(self._now())
        except (ConnectionError, OSError):
            conn.close("connection reset")
        finally:
            conn.close(conn.close_reason or "replay stopped")
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reading
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self._report(conn, reported)
            log.info("connection %d closed: %s", conn.serial, conn.close_reason)
            if self.on_closed is not None:
                self.on_closed(conn)
            async with self._closed:
                self._closed.notify_all()
            if task is not None:
                self._tasks.discard(task)

    async def _read(self, conn: ReplayConnection, reader: asyncio.StreamReader, wake: asyncio.Event) -> None:
        try:
            while not conn.closed:
                data = await reader.read(65536)
                if not data:
                    conn.close("client closed the connection")
                    break
                conn.receive(data, self._now())
                wake.set()
        except (ConnectionError, OSError):
            conn.close("connection reset")
        finally:
            wake.set()

    def _report(self, conn: ReplayConnection, reported: int) -> int:
        if self.on_divergence is not None:
            for div in conn.divergences[reported:]:
                self.on_divergence(conn, div)
        return len(conn.divergences)
