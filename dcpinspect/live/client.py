"""A live DCP client: the asyncio edge around the sans-IO consumers of :mod:`.consumer_cluster`.

It connects to the node given, then to each data node the cluster map names
active for a vbucket it streams (one DCP connection per node, as real clients
do; a server without cluster maps keeps everything on the first connection),
moves bytes between the sockets and the sans-IO
:class:`~dcpinspect.live.consumer_cluster.ClusterConsumer`, hands every byte
both ways to a :class:`~dcpinspect.live.tap.LiveCapture` (so the frames become
records live, exactly as a capture would give them, and optionally a pcap), and
persists the resume state of every vbucket as JSON.

1. The pcap and the state file are flushed together at least every
   ``flush_interval`` seconds while the client runs (a timer on the event
   loop, not the arrival of data: a silent stream is flushed too), and on exit,
   however it ends (every stream ended, :meth:`DcpClient.request_stop`, a
   cancelled task, a failure).  The pcap is flushed first: the saved state never
   names a seqno whose frame is not in the file.
2. The state file is replaced atomically (a reader never sees half a file), and
   only when the state changed; it holds each vbucket's last *consistent* point
   (a complete snapshot), so a resume from it never needs a rollback of our own making.

    state = await run_client("127.0.0.1", 11210, ConsumerConfig(bucket="b", user="u", password=pw, to_latest=True))

Works inside a running event loop (Jupyter: ``await run_client(...)`` or
``DcpClient(...).start()``) and from plain code (:func:`run_client_sync`).
``dcpinspect client HOST:PORT ...`` is its command line (:mod:`dcpinspect.cli.live`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..flows.records import Record
from .consumer import ConsumerConfig, DcpConsumer
from .consumer_cluster import ClusterConsumer, address_text
from .consumer_states import ConsumerEvent
from .consumer_streams import StreamInfo
from .resume import ResumeState
from .tap import LiveCapture, LiveConnection

__all__ = ["ClientError", "DcpClient", "load_state", "run_client", "run_client_sync", "save_state"]


class ClientError(Exception):
    """The connection failed (refused, authentication, server gone): a one-line reason.

    ``state`` holds the resume state as far as it got (already saved if a state file was given).
    """

    def __init__(self, message: str, state: ResumeState | None = None) -> None:
        super().__init__(message)
        self.state = state


def load_state(path: str | Path) -> ResumeState | None:
    """The resume state saved at ``path`` (``None`` if the file does not exist; ``ClientError`` if unreadable)."""
    p = Path(path)
    if not p.exists():
        return None
    try:
        return ResumeState.from_json(p.read_text())
    except (OSError, ValueError) as exc:
        raise ClientError(f"cannot read the state file {p}: {exc}") from None


def save_state(path: str | Path, state: ResumeState | str) -> None:
    """Write ``state`` (or its JSON text) to ``path`` atomically (a reader never sees half a file)."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(state if isinstance(state, str) else state.to_json())
    os.replace(tmp, p)


class DcpClient:
    """One DCP client connection.

    Args:
        host, port: the server (memcached / the simulator).
        config: what to stream; if its ``resume`` is ``None`` and ``state_path`` exists, that state is used.
        on_record: called with every frame's :class:`~dcpinspect.flows.records.Record` as it completes (both directions).
            Without it (and without ``pcap``/``capture``) the frames are not turned into records at all;
            the client keeps only per-vbucket state and counters, however long the stream.
        on_event: called with every :class:`~dcpinspect.live.consumer_states.ConsumerEvent`.
        pcap: also write the connection to this pcap file.
        state_path: persist the resume state here (JSON): every ``flush_interval`` and on exit.
        capture: an existing :class:`LiveCapture` to add this connection to (``pcap``/``on_record`` then unused).
        connect_timeout: seconds to connect.
        tick: seconds between the consumer's clock ticks when nothing arrives.
        flush_interval: seconds of ``clock`` between flushes of the pcap and the state file while running.
        keep_secrets: write SASL secrets into the pcap as sent (default: overwritten with ``*``).
        reveal_secrets: the records' contexts show SASL secrets (what ``on_record`` consumers render).
        hold_acks: start with buffer acknowledgements withheld (see :attr:`hold_acks`).
        clock: the time source of the consumer's timeouts (replies, noops) and of the state saves
            (default: the event loop's clock).  A test can pass a fake clock and advance it only
            while it knows the server is silent; ``tick`` and ``connect_timeout`` stay real time.

    :attr:`bytes` counts the bytes written to and read from the socket (``c2s``, ``s2c``),
    :attr:`frames` the frames received, :attr:`flushes` the periodic flushes done.
    """

    def __init__(
        self,
        host: str,
        port: int,
        config: ConsumerConfig,
        *,
        on_record: Callable[[Record], None] | None = None,
        on_event: Callable[[ConsumerEvent], None] | None = None,
        pcap: str | Path | None = None,
        state_path: str | Path | None = None,
        capture: LiveCapture | None = None,
        connect_timeout: float = 10.0,
        tick: float = 0.2,
        flush_interval: float = 1.0,
        keep_secrets: bool = False,
        reveal_secrets: bool = False,
        hold_acks: bool = False,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if not flush_interval > 0:
            raise ValueError("flush_interval must be positive")
        self.host = host
        self.port = port
        self.config = config
        self.on_record = on_record
        self.on_event = on_event
        self.pcap = pcap
        self.state_path = state_path
        self.capture = capture
        self.connect_timeout = connect_timeout
        self.tick = tick
        self.flush_interval = flush_interval
        self.keep_secrets = keep_secrets
        self.reveal_secrets = reveal_secrets
        self.clock = clock
        #: bytes written to (``c2s``) and read from (``s2c``) the socket so far
        self.bytes = {"c2s": 0, "s2c": 0}
        #: periodic flushes of the pcap and the state file done so far (see :meth:`flush`)
        self.flushes = 0
        #: the first connection's consumer (the only one on a single node)
        self.consumer: DcpConsumer | None = None
        #: every connection of the client (one per data node it streams from), once it runs
        self.fleet: ClusterConsumer | None = None
        self._hold_acks = hold_acks
        self._stop = False
        self._task: asyncio.Task[ResumeState] | None = None
        self._progress = asyncio.Event()  # set (and replaced) each time the client handled data or a tick
        self._ended = False
        # while running: the links' tasks and wake-ups, the capture, state saving
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._wakes: dict[int, asyncio.Event] = {}
        self._fleet_done = asyncio.Event()
        self._clock: Callable[[], float] = clock or (lambda: 0.0)
        self._live_capture: LiveCapture | None = None
        self._own_capture = True
        self._last_flush = 0.0
        self._saved: str | None = None  # the state file's text as last written
        self._flush_error: str | None = None  # why a periodic flush failed (the client then stops)
        self._closing = False

    @property
    def state(self) -> ResumeState | None:
        """The resume state so far, of every vbucket on every node (``None`` before it started)."""
        return self.fleet.state if self.fleet is not None else None

    @property
    def streams(self) -> dict[int, StreamInfo]:
        """Every vbucket's stream, from the connection that streams it now."""
        return self.fleet.streams if self.fleet is not None else {}

    @property
    def hold_acks(self) -> bool:
        """Buffer acknowledgements are withheld: a stalled consumer (flow control); set back to ``False`` to acknowledge again."""
        return self._hold_acks

    @hold_acks.setter
    def hold_acks(self, value: bool) -> None:
        self._hold_acks = bool(value)
        if self.fleet is not None:
            self.fleet.hold_acks = self._hold_acks
            for wake in self._wakes.values():
                wake.set()  # acks held back go out now

    async def start(self) -> None:
        """Run in the background on the current event loop (see :meth:`wait`, :meth:`stop`)."""
        self._task = asyncio.ensure_future(self.run())

    async def wait(self) -> ResumeState:
        """Wait for a :meth:`start`-ed client to finish; its result (or its ``ClientError``)."""
        if self._task is None:
            raise RuntimeError("the client was not started")
        return await self._task

    async def until(self, predicate: Callable[[DcpConsumer], bool]) -> DcpConsumer:
        """Wait until ``predicate(consumer)`` holds; returns the consumer.

        ``consumer`` is the first connection's (:attr:`consumer`); on several nodes, look at
        :attr:`streams` / :attr:`state` (every node's) from the predicate.
        The predicate is checked now and after each time the client handled what arrived (or a tick
        passed).  Raises the client's ``ClientError`` if it ended with one first, else ``ClientError``
        if it ended without the predicate ever holding.  Wrap in ``asyncio.wait_for`` for a deadline.
        """
        while True:
            consumer = self.consumer
            if consumer is not None and predicate(consumer):
                return consumer
            task = self._task
            if self._ended or (task is not None and task.done()):
                if task is not None:
                    await task
                raise ClientError("the client ended before the awaited condition held", self.state)
            waiter = asyncio.ensure_future(self._progress.wait())
            try:
                await asyncio.wait([waiter] if task is None else [waiter, task], return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()

    def _progressed(self) -> None:
        done, self._progress = self._progress, asyncio.Event()
        done.set()

    async def stop(self) -> ResumeState:
        """Close the streams, finish, save the state; returns it."""
        self.request_stop()
        return await self.wait()

    def request_stop(self) -> None:
        """Ask a running client to close its streams and finish (what SIGINT/SIGTERM do); returns at once.

        :meth:`run` then returns normally, with the pcap and the state file flushed.
        """
        self._stop = True
        for wake in self._wakes.values():
            wake.set()

    @property
    def frames(self) -> int:
        """Frames received from the servers so far."""
        return self.fleet.frames_received if self.fleet is not None else 0

    def flush(self) -> None:
        """Flush the pcap, then write the state file if the state changed (the order keeps them consistent)."""
        if self._live_capture is not None:
            self._live_capture.flush()
        if self.state_path is not None and self.fleet is not None:
            text = self.fleet.state.to_json()
            if text != self._saved:
                save_state(self.state_path, text)
                self._saved = text

    async def run(self) -> ResumeState:
        """Connect and stream until every stream ended (or :meth:`stop`); returns the final resume state.

        Raises:
            ClientError: cannot connect, authentication failed, the server went away, or another fatal failure.
        """
        self._ended = False
        try:
            return await self._run()
        finally:
            self._ended = True
            self._progressed()

    async def _run(self) -> ResumeState:
        config = self.config
        if config.resume is None and self.state_path is not None:
            saved = load_state(self.state_path)
            if saved is not None:
                if saved.bucket and saved.bucket != config.bucket:
                    raise ClientError(f"the state file {self.state_path} is for bucket {saved.bucket!r}, not {config.bucket!r}")
                config = dataclasses.replace(config, resume=saved)
        self._clock = self.clock or asyncio.get_running_loop().time
        fleet = self.fleet = ClusterConsumer(config, (self.host, self.port), now=self._clock())
        fleet.hold_acks = self._hold_acks
        self._own_capture = self.capture is None
        self._live_capture = self.capture
        if self._live_capture is None and (self.pcap is not None or self.on_record is not None):
            # records go to on_record or nowhere: a LiveCapture without a callback would keep every one
            try:
                self._live_capture = LiveCapture(
                    pcap=self.pcap,
                    on_record=self.on_record or _discard,
                    keep_secrets=self.keep_secrets,
                    reveal_secrets=self.reveal_secrets,
                )
            except OSError as exc:
                raise ClientError(f"cannot write the pcap {self.pcap}: {exc.strerror or exc}") from None
        self._tasks, self._wakes = {}, {}
        self._fleet_done = asyncio.Event()
        self._last_flush = self._clock()
        self._flush_error = None
        self._closing = False
        flusher = asyncio.ensure_future(self._flusher()) if self._live_capture is not None or self.state_path is not None else None
        try:
            self._start_links()
            while not fleet.done:
                for link_id, task in [(k, t) for k, t in self._tasks.items() if t.done()]:
                    task.result()  # a bug in a link's loop surfaces here
                    del self._tasks[link_id]  # a finished link is waited on no more (else the wait returns at once)
                    self._wakes.pop(link_id, None)
                if fleet.done:
                    break
                self._start_links()
                if not self._tasks:  # every link ended its consumer, yet the fleet is not done: never silent
                    raise ClientError("every connection ended with streams unfinished", fleet.state)
                waiter: asyncio.Future[Any] = asyncio.ensure_future(self._fleet_done.wait())
                try:
                    await asyncio.wait([waiter, *self._tasks.values()], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
        finally:
            if flusher is not None:
                flusher.cancel()
            for task in self._tasks.values():
                task.cancel()
            await asyncio.gather(*self._tasks.values(), *([flusher] if flusher else []), return_exceptions=True)
            capture = self._live_capture
            if capture is not None:
                if self._own_capture:
                    capture.close()
                else:
                    capture.flush()
            if self.state_path is not None:
                self._saved = fleet.state.to_json()
                try:
                    save_state(self.state_path, self._saved)
                except OSError as exc:
                    raise ClientError(f"cannot save the state to {self.state_path}: {exc.strerror or exc}", fleet.state) from None
        if self._flush_error is not None:
            raise ClientError(self._flush_error, fleet.state)
        if fleet.failure is not None:
            raise ClientError(fleet.failure, fleet.state)
        return fleet.state

    async def _flusher(self) -> None:
        """Flush every ``flush_interval`` of the clock, data or not (sleeps at most ``tick`` at a time: a fake clock is followed too)."""
        while True:
            due = self._last_flush + self.flush_interval
            now = self._clock()
            if now >= due:
                self._last_flush = now
                try:
                    self.flush()
                except OSError as exc:  # the files cannot be written: stop, and say so (ClientError from run)
                    self._flush_error = f"cannot write {exc.filename or 'the output files'}: {exc.strerror or exc}"
                    self.request_stop()
                    return
                self.flushes += 1
                self._progressed()
                continue
            await asyncio.sleep(min(self.tick, due - now))

    def _start_links(self) -> None:
        """Connect the links the client asks for (one per data node it streams from)."""
        assert self.fleet is not None
        for link_id in self.fleet.wanted():
            self._wakes[link_id] = asyncio.Event()
            self._tasks[link_id] = asyncio.ensure_future(self._link(link_id))

    def _handled(self, events: list[ConsumerEvent]) -> None:
        """After the client handled something: events out, links woken (one link's data may queue another's), state saved."""
        assert self.fleet is not None
        self._events(events)
        self._start_links()
        for link_id, wake in self._wakes.items():
            if self.fleet.has_output(link_id) or self.fleet.closable(link_id):
                wake.set()  # what one link read may queue another's bytes (a stream handed over) or end it
        if self.fleet.done:
            self._fleet_done.set()
        self._progressed()

    async def _link(self, link_id: int) -> None:
        """One connection: connect, then move bytes between its socket and the client until its consumer ends."""
        fleet, config = self.fleet, self.config
        assert fleet is not None
        host, port = fleet.links[link_id].address
        wake = self._wakes[link_id]
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), self.connect_timeout)
        except TimeoutError:
            self._handled(fleet.connect_failed(link_id, f"cannot connect to {address_text((host, port))}: timed out"))
            return
        except OSError as exc:
            self._handled(fleet.connect_failed(link_id, f"cannot connect to {address_text((host, port))}: {exc.strerror or exc}"))
            return
        conn: LiveConnection | None = None
        if self._live_capture is not None:
            local = writer.get_extra_info("sockname") or ("0.0.0.0", 0)
            peer = writer.get_extra_info("peername") or (host, port)
            conn = self._live_capture.connection((str(local[0]), int(local[1])), (str(peer[0]), int(peer[1])))
        events = fleet.connected(link_id, self._clock())
        if link_id == 0:
            self.consumer = fleet.consumer
        self._handled(events)
        closed_by = "c2s"

        async def send() -> None:
            out = fleet.data_to_send(link_id)
            if not out:
                return
            if conn is not None:
                conn.data("c2s", out)
            writer.write(out)
            self.bytes["c2s"] += len(out)
            # a server that never reads must not block the client forever
            await asyncio.wait_for(writer.drain(), config.response_timeout)

        read: asyncio.Future[bytes] = asyncio.ensure_future(reader.read(1 << 16))
        try:
            while True:
                try:
                    await send()
                    if self._stop and not self._closing and not fleet.done:
                        self._closing = True
                        self._handled(fleet.close_streams(self._clock()))
                        await send()  # the CLOSE_STREAMs
                except TimeoutError:
                    self._handled(fleet.connection_failed(link_id, f"the server read nothing for {config.response_timeout:g} s"))
                except OSError as exc:
                    self._handled(fleet.connection_failed(link_id, f"connection error: {exc.strerror or exc}"))
                if fleet.closable(link_id):
                    break
                # (streams closing: read on until their STREAM_END(Closed) or the timeout: the server may send queued messages first)
                wake.clear()
                woken: asyncio.Future[Any] = asyncio.ensure_future(wake.wait())
                try:
                    await asyncio.wait([read, woken], timeout=self.tick, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    woken.cancel()
                data: bytes | None = None
                if read.done():
                    try:
                        data = read.result()
                    except OSError as exc:
                        data = b""
                        self._events([ConsumerEvent("error", f"connection error: {exc.strerror or exc}", node=address_text((host, port)))])
                    if data:
                        read = asyncio.ensure_future(reader.read(1 << 16))
                now = self._clock()
                events = []
                if data == b"":
                    closed_by = "s2c"
                    events += fleet.connection_lost(link_id)
                elif data:
                    self.bytes["s2c"] += len(data)
                    if conn is not None:
                        conn.data("s2c", data)
                    events += fleet.receive(link_id, data, now)
                events += fleet.tick(now)
                self._handled(events)
                if data == b"" and fleet.closable(link_id):
                    break
        finally:
            read.cancel()
            with contextlib.suppress(OSError, RuntimeError, asyncio.CancelledError):
                await read
            with contextlib.suppress(OSError, RuntimeError):
                writer.close()
                await writer.wait_closed()
            if conn is not None:
                conn.close(by=closed_by)

    def _events(self, events: list[ConsumerEvent]) -> None:
        if self.on_event is not None:
            for ev in events:
                self.on_event(ev)

    def run_sync(self) -> ResumeState:
        """:meth:`run` from synchronous code (also when an event loop is already running in this thread)."""
        return _sync(self.run)


def _discard(_rec: Record) -> None:
    """An ``on_record`` that keeps nothing."""


async def run_client(
    host: str,
    port: int,
    config: ConsumerConfig,
    *,
    on_record: Callable[[Record], None] | None = None,
    on_event: Callable[[ConsumerEvent], None] | None = None,
    pcap: str | Path | None = None,
    state_path: str | Path | None = None,
    **options: Any,
) -> ResumeState:
    """Stream from ``host:port`` until every stream ended; returns the resume state (see :class:`DcpClient`)."""
    client = DcpClient(host, port, config, on_record=on_record, on_event=on_event, pcap=pcap, state_path=state_path, **options)
    return await client.run()


def run_client_sync(host: str, port: int, config: ConsumerConfig, **kw: Any) -> ResumeState:
    """:func:`run_client` for synchronous code (runs in a thread if this thread already has a running loop)."""
    return _sync(lambda: run_client(host, port, config, **kw))


def _sync(make: Callable[[], Any]) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = asyncio.run(make())
        except BaseException as exc:
            result["error"] = exc

    t = threading.Thread(target=target, name="dcpinspect-client")
    t.start()
    t.join()
    if "error" in result:
        raise result["error"]
    return result["value"]
