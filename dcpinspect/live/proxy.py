"""A byte-exact tap proxy: forward TCP both ways unchanged, decode what passed.

:class:`TapProxy` listens (127.0.0.1 by default), opens one upstream
connection per accepted client and pumps bytes both ways with asyncio streams.
**Forwarding never waits on the tap**: each chunk read from one side is
written to the other side and handed, with its timestamp, to a bounded queue;
one decoding thread takes it from there into the shared
:class:`~dcpinspect.live.tap.LiveCapture` (records and, optionally, a pcap).
When the decoder falls more than ``tap_limit`` bytes behind, the chunks it
cannot take are not decoded (the capture shows a gap, counted in
:attr:`TapProxy.tap_skipped`) - forwarding goes on at full speed.  A failure of
the tap is caught, logged once and switches the tap of that connection off.
Backpressure between the two sockets is respected (every write awaits
``drain``), so the memory of a connection is bounded by the read size, the
stream limit and the transports' write buffers; :func:`release_memory` hands
freed heap back to the system when connections end.

A connection that is plainly not memcached binary (TLS, or
:data:`~dcpinspect.live.tap.JUNK_LIMIT` bytes without a frame) is still forwarded
byte for byte, but no longer decoded: one log line says so.

Half-close is propagated (EOF one way: ``write_eof`` on the other side, the
other direction keeps running), a reset is passed on as a reset, an upstream
that refuses is a clear log line and a closed client.  ``stop()`` closes the
listener, cancels every connection task and flushes the capture;
``wait_idle()`` (a hook for tests and scripts) blocks until every accepted
connection has ended on its own, so that they close by FIN, not by ``stop()``.

In a notebook (a running event loop)::

    proxy = TapProxy(upstream=("127.0.0.1", 11210), pcap="tap.pcap")
    await proxy.start()          # proxy.port
    ...
    await proxy.stop()

From synchronous code, the proxy runs its own loop in a thread::

    with TapProxy(upstream=("127.0.0.1", 11210)).background() as proxy:
        ...                      # connect to ("127.0.0.1", proxy.port)
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import socket
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..flows.records import Record
from .tap import LiveCapture, LiveConnection, format_endpoint

__all__ = ["TapProxy", "log", "release_memory"]

log = logging.getLogger("dcpinspect.live.proxy")

#: bytes read from a socket at a time (and the stream reader's limit: it buffers at most twice this)
READ_SIZE = 64 * 1024
#: a transport's write buffer above which ``drain`` waits
WRITE_HIGH = 64 * 1024
#: bytes forwarded but not yet decoded, over all connections, beyond which chunks are not decoded (a gap)
TAP_LIMIT = 32 * 1024 * 1024
#: give freed heap back to the system after this many connections ended (and whenever none is open)
RELEASE_EVERY = 256


def release_memory() -> bool:
    """Return freed heap to the system (glibc's ``malloc_trim``); ``False`` where there is none.

    CPython frees the buffers of a closed connection, but glibc keeps the
    pages in its arenas: without this a proxy's RSS stays at its peak after
    its connections end.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


_TRIM: list[Any] = []


def _malloc_trim() -> Any:
    if not _TRIM:
        fn = None
        if sys.platform.startswith("linux"):
            try:
                fn = ctypes.CDLL(None).malloc_trim
                fn.argtypes = [ctypes.c_size_t]
                fn.restype = ctypes.c_int
            except (OSError, AttributeError):
                fn = None
        _TRIM.append(fn)
    return _TRIM[0]


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close ``writer``'s socket with an RST (SO_LINGER 0), dropping unsent bytes."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Tap:
    """The decoding side of one proxied connection: the forwarding side only queues, the decoding thread runs it.

    Never raises into forwarding; a failure switches the tap of this connection off (logged once).
    """

    __slots__ = ("conn", "proxy", "where")

    def __init__(self, proxy: TapProxy, client: tuple[str, int], server: tuple[str, int]) -> None:
        self.proxy = proxy
        self.conn: LiveConnection | None = None
        self.where = f"{format_endpoint(client)} -> {format_endpoint(server)}"
        proxy._put((self._open, client, server, time.time_ns()), 0)

    # -- the forwarding side (event loop) --------------------------------------

    def data(self, direction: str, data: bytes) -> None:
        """Queue ``data`` for decoding; beyond the proxy's ``tap_limit`` it is skipped (a gap), never waited for."""
        proxy = self.proxy
        n = len(data)
        if proxy._queued + n > proxy.tap_limit:
            proxy.tap_skipped += n
            proxy._put((self._skip, direction, n), 0)
        else:
            proxy._put((self._data, direction, data, time.time_ns()), n)

    def close(self, *, reset: bool, by: str) -> None:
        """Queue the end of the connection."""
        self.proxy._put((self._close, reset, by, time.time_ns()), 0)

    # -- the decoding side (thread) --------------------------------------------

    def _guard(self, fn: Callable[[], object]) -> None:
        try:
            fn()
        except Exception as exc:
            self.proxy.decode_errors += 1
            log.error("decode error on %s (tap of this connection off, forwarding goes on): %r", self.where, exc)
            self.conn = None

    def _open(self, client: tuple[str, int], server: tuple[str, int], ts: int) -> None:
        cap = self.proxy.capture

        def go() -> None:
            self.conn = cap.connection(client, server, ts)

        self._guard(go)

    def _data(self, direction: str, data: bytes, ts: int) -> None:
        conn = self.conn
        if conn is not None:
            self._guard(lambda: conn.data(direction, data, ts))

    def _skip(self, direction: str, n: int) -> None:
        conn = self.conn
        if conn is not None:
            self._guard(lambda: conn.skip(direction, n))

    def _close(self, reset: bool, by: str, ts: int) -> None:
        conn = self.conn
        if conn is not None:
            self._guard(lambda: conn.close(ts, reset=reset, by=by))
            self.conn = None
        self.proxy._ended()


class TapProxy:
    """A tap proxy from ``listen`` to ``upstream``: every byte forwarded unchanged, and decoded.

    Args:
        listen: address to listen on (port 0: a free port, see :attr:`port`).
        upstream: the server every accepted connection is forwarded to.
        pcap: write the capture of every proxied connection to this pcap file.
        on_record: called with every decoded record, on the proxy's decoding
            thread (never on the forwarding path).  Without it the records are
            counted, not kept (memory stays bounded).
        reveal_secrets: the records' contexts show SASL secrets instead of masking them.
        keep_secrets: write SASL secrets into the pcap as they were (by default
            their bytes are overwritten with ``*`` in the file; forwarding is never touched).
        label: the ``file`` column of the records (default: the pcap path, or ``live``).
        read_size: bytes read from a socket at a time (the stream reader buffers at most twice this).
        tap_limit: bytes forwarded but not yet decoded beyond which chunks are
            not decoded (counted in :attr:`tap_skipped`).
    """

    def __init__(
        self,
        listen: tuple[str, int] = ("127.0.0.1", 0),
        upstream: tuple[str, int] = ("127.0.0.1", 11210),
        *,
        pcap: str | Path | None = None,
        on_record: Callable[[Record], None] | None = None,
        reveal_secrets: bool = False,
        keep_secrets: bool = False,
        label: str | None = None,
        read_size: int = READ_SIZE,
        tap_limit: int = TAP_LIMIT,
    ) -> None:
        self.listen = listen
        self.upstream = upstream
        self.pcap = pcap
        self.read_size = read_size
        self.tap_limit = tap_limit
        self.reveal_secrets = reveal_secrets
        self._user_on_record = on_record
        self.capture = LiveCapture(
            pcap=pcap,
            on_record=self._on_record,
            label=label,
            reveal_secrets=reveal_secrets,
            keep_secrets=keep_secrets,
            on_notice=self._on_notice,
        )
        #: counters: connections accepted, upstream failures, bytes forwarded per direction, records, tap errors,
        #: bytes forwarded but not decoded (the decoder was more than ``tap_limit`` behind)
        self.connections = 0
        self.refused = 0
        self.bytes = {"c2s": 0, "s2c": 0}
        self.records = 0
        self.decode_errors = 0
        self.tap_skipped = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._idle = threading.Condition()  # notified whenever a connection's task ends (see wait_idle)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped = False
        # the decoding thread's queue: (function, *args) items, and the bytes they hold
        self._queue: deque[tuple[int, tuple[Any, ...] | None]] = deque()
        self._queued = 0
        self._cond = threading.Condition()
        self._decoder: threading.Thread | None = None
        self._ended_count = 0

    @property
    def undecoded(self) -> int:
        """Connections forwarded but no longer decoded (TLS, not memcached binary)."""
        return self.capture.undecoded

    def _on_record(self, rec: Record) -> None:
        self.records += 1
        if self._user_on_record is not None:
            try:
                self._user_on_record(rec)
            except Exception as exc:  # a consumer's bug must not stop the proxy
                self.decode_errors += 1
                log.error("on_record callback failed on record %d: %r", rec.number, exc)

    def _on_notice(self, conn: LiveConnection, why: str) -> None:
        log.warning(
            "%s -> %s: %s, not decoded (its bytes are forwarded as they are)",
            format_endpoint(conn.client),
            format_endpoint(conn.server),
            why,
        )

    # -- the decoding thread ------------------------------------------------

    def _put(self, item: tuple[Any, ...] | None, size: int) -> None:
        """Queue ``(function, *args)`` for the decoding thread (``None``: the end); ``size`` bytes it holds."""
        with self._cond:
            self._queue.append((size, item))
            self._queued += size
            self._cond.notify()

    def _decode_loop(self) -> None:
        """Run the queued tap work in order until ``None`` is queued; then close the capture."""
        q, cond = self._queue, self._cond
        while True:
            with cond:
                while not q:
                    cond.wait()
                size, item = q.popleft()
                self._queued -= size
            if item is None:
                break
            item[0](*item[1:])
        try:
            self.capture.close()
        except Exception as exc:
            log.error("closing the capture failed: %r", exc)

    def _ended(self) -> None:
        """A connection's tap closed (decoding thread): hand freed memory back when many ended, or all."""
        self._ended_count += 1
        if self._ended_count >= RELEASE_EVERY or (self.capture.open == 0 and self._ended_count >= 16):
            self._ended_count = 0
            release_memory()

    @property
    def port(self) -> int:
        """The port actually listened on (after :meth:`start`)."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("the proxy is not started")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` listened on (after :meth:`start`)."""
        return self.listen[0], self.port

    async def start(self) -> TapProxy:
        """Start listening (on the running event loop) and the decoding thread."""
        self._loop = asyncio.get_running_loop()
        self._server = await asyncio.start_server(self._accept, self.listen[0], self.listen[1], limit=self.read_size)
        self._decoder = threading.Thread(target=self._decode_loop, name="dcpinspect-proxy-tap", daemon=True)
        self._decoder.start()
        log.info("listening on %s, forwarding to %s", format_endpoint(self.address), format_endpoint(self.upstream))
        return self

    async def stop(self) -> None:
        """Stop listening, end every connection (their tasks are awaited), decode what is queued and flush the capture."""
        if self._stopped:
            return
        self._stopped = True
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await self.wait_decoded()
        decoder = self._decoder
        if decoder is not None:
            self._put(None, 0)
            await asyncio.to_thread(decoder.join)
            self._decoder = None
        else:
            try:
                self.capture.close()
            except Exception as exc:
                log.error("closing the capture failed: %r", exc)

    async def wait_decoded(self) -> None:
        """Wait until everything forwarded so far went through the decoder (its records emitted)."""
        if self._decoder is None:
            return
        done = threading.Event()
        self._put((done.set,), 0)
        await asyncio.to_thread(done.wait)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no accepted connection is being proxied any more; ``False`` if ``timeout`` passed first.

        A hook for tests and scripts: once the clients closed, wait here for the
        proxy to finish closing their connections (FIN passed on, the tap's close
        queued) before :meth:`stop`, which would otherwise cancel them.  Woken by
        each connection's end, never by polling.  A connection still in the
        kernel's accept queue is not counted.  Thread-safe; it blocks, so never
        call it on the proxy's own event loop - from a coroutine:
        ``await asyncio.to_thread(proxy.wait_idle, 60)``.
        """
        with self._idle:
            return self._idle.wait_for(lambda: not self._tasks, timeout)

    # -- sync use -----------------------------------------------------------

    def start_background(self) -> TapProxy:
        """Run the proxy on its own event loop in a daemon thread (for synchronous code)."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self.start())
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._thread = threading.Thread(target=run, name="dcpinspect-proxy", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        return self

    def stop_background(self, timeout: float = 10.0) -> None:
        """Stop a proxy started with :meth:`start_background` (waits for its thread)."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        fut = asyncio.run_coroutine_threadsafe(self.stop(), loop)
        fut.result(timeout)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        self._thread = None

    @contextlib.contextmanager
    def background(self) -> Iterator[TapProxy]:
        """``with proxy.background():`` - :meth:`start_background` ... :meth:`stop_background`."""
        self.start_background()
        try:
            yield self
        finally:
            self.stop_background()

    # -- connections --------------------------------------------------------

    async def _accept(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(c_reader, c_writer)
        except asyncio.CancelledError:
            pass  # stop(): ending cancelled would make asyncio 3.11's stream callback log an error
        finally:
            with self._idle:
                self._tasks.discard(task)
                self._idle.notify_all()

    async def _serve(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        peer = c_writer.get_extra_info("peername")
        client = (str(peer[0]), int(peer[1]))
        try:
            u_reader, u_writer = await asyncio.open_connection(self.upstream[0], self.upstream[1], limit=self.read_size)
        except (TimeoutError, OSError) as exc:
            self.refused += 1
            log.warning(
                "upstream %s unreachable for client %s (%s): client connection closed",
                format_endpoint(self.upstream),
                format_endpoint(client),
                exc,
            )
            c_writer.close()
            with contextlib.suppress(OSError):
                await c_writer.wait_closed()
            return
        except asyncio.CancelledError:
            c_writer.close()
            raise
        for w in (c_writer, u_writer):
            w.transport.set_write_buffer_limits(high=WRITE_HIGH)
        upeer = u_writer.get_extra_info("peername")
        server = (str(upeer[0]), int(upeer[1]))
        tap = _Tap(self, client, server)
        log.info("connection %s -> %s", format_endpoint(client), format_endpoint(server))
        ends: dict[str, str] = {}  # direction -> "eof" | "reset" | "error", in order of ending
        pumps = [
            asyncio.create_task(self._pump(c_reader, u_writer, "c2s", tap, ends)),
            asyncio.create_task(self._pump(u_reader, c_writer, "s2c", tap, ends)),
        ]
        try:
            _, pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            if any(ends.get(d) == "reset" for d in ends):
                for t in pending:
                    t.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
        except asyncio.CancelledError:
            for t in pumps:
                t.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            _reset(c_writer)
            _reset(u_writer)
            tap.close(reset=True, by="c2s")
            raise
        first = next(iter(ends), "c2s")
        reset = "reset" in ends.values()
        by = next((d for d, how in ends.items() if how == "reset"), first)
        if reset:
            _reset(c_writer)
            _reset(u_writer)
            log.info(
                "connection %s -> %s reset by the %s side",
                format_endpoint(client),
                format_endpoint(server),
                "client" if by == "c2s" else "server",
            )
        else:
            for w in (c_writer, u_writer):
                w.close()
            for w in (c_writer, u_writer):
                with contextlib.suppress(OSError, asyncio.CancelledError):
                    await w.wait_closed()
        tap.close(reset=reset, by=by)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str, tap: _Tap, ends: dict[str, str]
    ) -> None:
        """Forward ``reader`` -> ``writer`` until EOF; then half-close ``writer``."""
        counts = self.bytes
        size = self.read_size
        try:
            while True:
                data = await reader.read(size)
                if not data:
                    break
                writer.write(data)  # forward first ...
                counts[direction] += len(data)
                tap.data(direction, data)  # ... decode after (never raises)
                await writer.drain()
        except (ConnectionResetError, BrokenPipeError) as exc:
            ends.setdefault(direction, "reset")
            log.info("%s: %s while forwarding %s", tap.where, exc.__class__.__name__, direction)
            return
        except OSError as exc:
            ends.setdefault(direction, "reset")
            log.warning("%s: %r while forwarding %s", tap.where, exc, direction)
            return
        ends.setdefault(direction, "eof")
        if writer.can_write_eof() and not writer.is_closing():
            try:
                writer.write_eof()
            except OSError:
                ends[direction] = "reset"
