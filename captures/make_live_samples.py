"""Record the live sample captures in this folder: ``python captures/make_live_samples.py [NAME ...]``.

Each scenario starts the DCP producer simulator (:class:`dcpinspect.live.sim.Simulator`,
fixed seed) and the tap proxy (:class:`dcpinspect.live.proxy.TapProxy`) on 127.0.0.1,
runs DCP clients against the proxy (client -> proxy -> simulator) and keeps what
the proxy wrote as ``captures/live-<name>.pcap``, with the simulator's own record
of what it did (``Cluster.journal``) as ``captures/live-<name>.journal.json`` - the
ground truth ``tests/live/test_live_samples.py`` checks the timelines against.

Where the stock client (:mod:`dcpinspect.live.consumer`) cannot do what a scenario
needs (two streams on one vbucket, withholding buffer acks, seqno acks,
closing a stream and waiting for its STREAM_END) a small scripted client does
it, built from :func:`dcpinspect.wire.encode`, :class:`~dcpinspect.wire.decoder.FrameDecoder`
and :func:`dcpinspect.wire.dissect` (never hand-packed frames).

The content is deterministic (seeds, keys, values, the order of the steps);
timestamps, the ephemeral ports and where TCP happened to split the byte
streams vary between runs, so the files are not byte-for-byte reproducible.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import struct
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcpinspect import encode
from dcpinspect.capture.read import read_records
from dcpinspect.live.client import DcpClient, run_client
from dcpinspect.live.consumer import ConsumerConfig, DcpConsumer
from dcpinspect.live.proxy import TapProxy
from dcpinspect.live.resume import ResumeState
from dcpinspect.live.sasl import plain_payload
from dcpinspect.live.sim import Simulator, SimulatorThread
from dcpinspect.protocol.enums import Feature, OpenFlag, Status
from dcpinspect.protocol.rules import flow_control_size
from dcpinspect.wire.decoder import FrameDecoder
from dcpinspect.wire.dissect import dissect
from dcpinspect.wire.dissection import DissectContext, Dissection
from dcpinspect.wire.events import Frame

HERE = Path(__file__).parent
USER, PASSWORD = "Administrator", "password"
FOREVER = 2**64 - 1
COLLECTIONS = Feature.COLLECTIONS
#: seconds after which a wait is a failure: a deadline that turns a hang into an error, never a pace
DEADLINE = 60.0


# ---------------------------------------------------------------------------
# plumbing: a simulator and a proxy per scenario


Watcher = Callable[[dict[str, Any]], None]


@dataclass
class Live:
    """A running scenario: the simulator (in its thread) and the proxy in front of it."""

    sim: SimulatorThread
    proxy: TapProxy
    watchers: list[Watcher] = field(default_factory=list)  # called with each journal entry, on the simulator's loop

    def __post_init__(self) -> None:
        self.sim.call(self._watch_journal)

    def _watch_journal(self) -> None:
        """Have the simulator's ``Cluster.note`` also tell :attr:`watchers` (the cluster has no listener hook of its own)."""
        cluster = self.sim.sim.cluster
        note = cluster.note

        def noted(event: str, **fields: Any) -> None:
            note(event, **fields)
            for watch in list(self.watchers):
                watch({"event": event, **fields})

        cluster.note = noted  # type: ignore[method-assign]

    async def until_noted(self, cond: Callable[[dict[str, Any]], bool], what: str) -> None:
        """Wait until the simulator's journal holds an entry ``cond`` accepts (noted already, or when it is noted)."""
        loop = asyncio.get_running_loop()
        found = asyncio.Event()

        def watch(entry: dict[str, Any]) -> None:
            if cond(entry):
                loop.call_soon_threadsafe(found.set)

        def subscribe() -> bool:  # on the simulator's loop: no entry can slip between the look back and the watch
            self.watchers.append(watch)
            return any(cond(e) for e in self.sim.sim.cluster.journal)

        if self.sim.call(subscribe):
            found.set()
        try:
            await within(found.wait(), what)
        finally:
            self.sim.call(self.watchers.remove, watch)

    @property
    def port(self) -> int:
        """Where clients connect (the proxy)."""
        return self.proxy.port

    def journal(self) -> list[dict[str, Any]]:
        """A copy of the simulator's journal, taken on its loop."""
        return self.sim.call(lambda: [dict(e) for e in self.sim.sim.cluster.journal])

    def config(self, name: str, **kw: Any) -> ConsumerConfig:
        """A stock-client configuration for this simulator."""
        return ConsumerConfig(bucket="default", user=USER, password=PASSWORD, name=name, **kw)


@contextlib.contextmanager
def live(out: Path, name: str, **sim: Any) -> Iterator[Live]:
    """Run a simulator and the proxy; on exit write ``out/live-<name>.pcap`` and its journal."""
    pcap = out / f"live-{name}.pcap"
    simulator = Simulator(host="127.0.0.1", port=0, users={USER: PASSWORD}, **sim)
    with simulator.run_in_thread() as st:
        proxy = TapProxy(("127.0.0.1", 0), (st.host, st.port), pcap=pcap)
        with proxy.background():
            session = Live(st, proxy)
            yield session
            _settle(proxy)
        journal = session.journal()
    write_journal(out / f"live-{name}.journal.json", journal)


def _settle(proxy: TapProxy, timeout: float = DEADLINE) -> None:
    """Wait until the proxy has no connection left (every client closed cleanly: FIN, not the proxy's stop)."""
    if not proxy.wait_idle(timeout):
        raise TimeoutError(f"the proxy still had open connections {timeout:g} s after the scenario ended")


def write_journal(path: Path, journal: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> None:
    """One journal entry per line (small, diffable)."""
    lines = [json.dumps(e, sort_keys=True) for e in journal]
    doc = '{"journal": [\n' + ",\n".join(lines) + "\n]"
    if extra:
        doc += ',\n"postprocess": ' + json.dumps(extra, sort_keys=True)
    path.write_text(doc + "}\n")


def run(coro: Awaitable[Any]) -> Any:
    """Run a coroutine to completion (the scenarios' client side runs on this thread's loop)."""

    async def main() -> Any:
        return await coro

    return asyncio.run(main())


async def within(aw: Awaitable[Any], what: str, timeout: float = DEADLINE) -> Any:
    """Await ``aw``; the deadline only turns a hang into an error naming ``what``."""
    try:
        return await asyncio.wait_for(aw, timeout)
    except TimeoutError:
        raise TimeoutError(f"timed out waiting for {what}") from None


async def client_until(client: DcpClient, cond: Callable[[DcpConsumer], bool], what: str) -> None:
    """Wait until ``cond(consumer)`` holds: checked each time the stock client handled what arrived (:meth:`DcpClient.until`)."""
    await within(client.until(cond), what)


# ---------------------------------------------------------------------------
# a scripted client (for what the stock client does not do)


@dataclass
class Scripted:
    """One DCP connection driven step by step.

    Every frame is built with :func:`encode`, every received byte goes through one
    :class:`FrameDecoder` and :func:`dissect` with the connection's negotiated context.
    Noops are answered; buffer acks are sent once ``ack_at`` bytes were consumed
    while ``acking`` is on; seqno acks follow complete snapshots holding prepares
    when ``seqno_acks`` is on.  Waits (:meth:`until`) are woken by each chunk received.
    """

    port: int
    name: str
    acking: bool = True
    ack_at: int = 0
    seqno_acks: bool = False
    ctx: DissectContext = field(default_factory=DissectContext)
    received: list[Dissection] = field(default_factory=list)
    ends: dict[tuple[int, int | None], int] = field(default_factory=dict)
    unacked: int = 0
    flow_control: bool = False
    _opaque: int = 0
    _responses: dict[int, Dissection] = field(default_factory=dict)
    _decoder: FrameDecoder = field(default_factory=FrameDecoder)
    _marker_end: dict[tuple[int, int | None], int] = field(default_factory=dict)
    _prepared: dict[tuple[int, int | None], tuple[int, int]] = field(default_factory=dict)  # key -> (opaque, prepared seqno)
    _reader: asyncio.StreamReader | None = None
    _writer: asyncio.StreamWriter | None = None
    _task: asyncio.Task[None] | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)  # set (and replaced) after each chunk received, and at EOF

    async def __aenter__(self) -> Scripted:
        self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self.port)
        self._task = asyncio.ensure_future(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._writer is not None and self._task is not None
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    # --- sending -----------------------------------------------------------------
    def send(self, name: str, **kw: Any) -> int:
        """Send one frame (a fresh opaque unless given); returns the opaque."""
        if "opaque" not in kw and not kw.get("response"):
            self._opaque += 1
            kw["opaque"] = self._opaque
        assert self._writer is not None
        self._writer.write(encode(name, **kw))
        return int(kw.get("opaque", 0))

    async def request(self, name: str, **kw: Any) -> Dissection:
        """Send a request and wait for its response (same opaque)."""
        return await self.response(self.send(name, **kw))

    async def response(self, opaque: int) -> Dissection:
        """Wait for the response with this opaque."""
        await self.until(lambda: opaque in self._responses, f"the response to opaque {opaque}")
        return self._responses.pop(opaque)

    async def until(self, cond: Callable[[], bool], what: str) -> None:
        """Wait until ``cond()`` holds: checked now and after each chunk received; an error if the server closes first."""

        async def wait() -> None:
            while not cond():
                if self._task is None or self._task.done():
                    raise ConnectionError(f"the connection ended before {what}")
                await self._changed.wait()

        await within(wait(), what)

    async def bootstrap(self, *, features: tuple[int, ...] = (), controls: tuple[tuple[str, str], ...] = ()) -> None:
        """HELLO, SASL PLAIN, SELECT_BUCKET, DCP_OPEN (producer), then the controls (each must succeed)."""
        hello = await self.request("HELLO", key=f"dcpinspect-script/{self.name}", value={"features": [{"feature": f} for f in features]})
        self.ctx = self.ctx.with_features(tuple(int(f["feature"]) for f in hello.body.get("features", [])))
        for name, kw in (
            ("SASL_AUTH", {"key": "PLAIN", "value": plain_payload(USER, PASSWORD)}),
            ("SELECT_BUCKET", {"key": "default"}),
            ("DCP_OPEN", {"key": self.name, "extras": {"seqno": 0, "flags": OpenFlag.PRODUCER}}),
        ):
            d = await self.request(name, **kw)
            assert d.frame.status == Status.SUCCESS, (name, d.frame.status)
        self.ctx = self.ctx.with_open_flags(OpenFlag.PRODUCER)
        for key, value in controls:
            d = await self.request("DCP_CONTROL", key=key, value=value.encode())
            assert d.frame.status == Status.SUCCESS, (key, d.frame.status)
            if key == "enable_stream_id":
                self.ctx = dataclasses.replace(self.ctx, stream_ids=True)
            if key == "connection_buffer_size":
                self.flow_control = int(value) > 0
                self.ack_at = self.ack_at or max(1, int(value) // 2)

    def send_stream(
        self, vb: int, *, start: int = 0, end: int = FOREVER, uuid: int = 0, snap: tuple[int, int] = (0, 0), value: Any = None
    ) -> int:
        """Send a DCP_STREAM_REQ without waiting; returns its opaque."""
        extras = {"start_seqno": start, "end_seqno": end, "vb_uuid": uuid, "snap_start_seqno": snap[0], "snap_end_seqno": snap[1]}
        if value is None:
            return self.send("DCP_STREAM_REQ", vbucket=vb, extras=extras)
        return self.send("DCP_STREAM_REQ", vbucket=vb, extras=extras, value=value, datatype=1)

    async def stream(self, vb: int, **kw: Any) -> Dissection:
        """DCP_STREAM_REQ; returns the response."""
        return await self.response(self.send_stream(vb, **kw))

    def ack(self) -> None:
        """Acknowledge every consumed flow-control byte now."""
        if self.unacked:
            self.send("DCP_BUFFER_ACKNOWLEDGEMENT", extras={"buffer_bytes": self.unacked}, opaque=0)
            self.unacked = 0

    # --- receiving -----------------------------------------------------------------
    async def _read(self) -> None:
        assert self._reader is not None
        try:
            while True:
                data = await self._reader.read(1 << 16)
                if not data:
                    return
                for ev in self._decoder.feed(data):
                    if isinstance(ev, Frame):
                        self._frame(ev)
                self._wake()
        finally:
            self._wake()

    def _wake(self) -> None:
        """Wake every :meth:`until` (each checks its condition again)."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _frame(self, frame: Frame) -> None:
        d = dissect(frame, self.ctx)
        self.received.append(d)
        if d.role == "response":
            self._responses[frame.opaque] = d
            return
        if d.name == "DCP_NOOP":
            self.send("DCP_NOOP", response=True, opaque=frame.opaque)
            return
        if self.flow_control:
            self.unacked += flow_control_size(frame.magic, frame.opcode, frame.length)
        key = (frame.vbucket or 0, d.stream_id)
        if d.name == "DCP_STREAM_END":
            self.ends[key] = int(d.extras["status"])
        elif d.name == "DCP_SNAPSHOT_MARKER":
            src = d.extras if "end_seqno" in d.extras else d.body
            self._marker_end[key] = int(src["end_seqno"])
        elif d.name == "DCP_PREPARE":
            self._prepared[key] = (frame.opaque, int(d.extras["by_seqno"]))
        seqno = d.extras.get("by_seqno", d.extras.get("commit_seqno", d.extras.get("abort_seqno", d.extras.get("seqno"))))
        if self.seqno_acks and isinstance(seqno, int) and seqno >= self._marker_end.get(key, FOREVER) and key in self._prepared:
            opaque, prepared = self._prepared.pop(key)  # the snapshot holding a prepare is complete: ack it
            self.send("DCP_SEQNO_ACKNOWLEDGED", vbucket=key[0], opaque=opaque, extras={"prepared_seqno": prepared})
        if self.acking and self.flow_control and self.unacked >= self.ack_at:
            self.ack()

    async def until_end(self, *keys: tuple[int, int | None]) -> None:
        """Wait for the STREAM_END of every stream key given."""
        await self.until(lambda: all(k in self.ends for k in keys), f"stream ends of {keys}")


def _seqno_of(d: Dissection) -> int | None:
    for name in ("by_seqno", "commit_seqno", "abort_seqno", "seqno"):
        v = d.extras.get(name)
        if isinstance(v, int):
            return v
    return None


# ---------------------------------------------------------------------------
# the scenarios


def plain(out: Path) -> None:
    """Four vbuckets streamed from 0 to their high seqno by the stock client; each ends OK."""
    with live(out, "plain", vbuckets=4, items=24, seed=11, checkpoint_items=4) as lv:
        run(run_client("127.0.0.1", lv.port, lv.config("live-plain", vbuckets=(0, 1, 2, 3), to_latest=True)))


def rollback_retry(out: Path) -> None:
    """Seed 000's story live: a resume state whose history this producer never had -> Rollback to 0 -> retry -> success.

    The state is made by streaming from another simulator (another seed: other vbucket
    UUIDs, the node "rebuilt"), not through the proxy; the capture holds the resume.
    """
    other = Simulator(host="127.0.0.1", port=0, users={USER: PASSWORD}, vbuckets=1, items=12, seed=99)
    with other.run_in_thread() as st:
        cfg = ConsumerConfig(bucket="default", user=USER, password=PASSWORD, name="live-rollback-state", vbuckets=(0,), to_latest=True)
        saved: ResumeState = run(run_client("127.0.0.1", st.port, cfg))
    with live(out, "rollback-retry", vbuckets=1, items=12, seed=0) as lv:
        run(run_client("127.0.0.1", lv.port, lv.config("live-rollback-retry", vbuckets=(0,), to_latest=True, resume=saved)))


def failover_branches(out: Path) -> None:
    """Two failovers of vbucket 0 while the stock client streams it (end seqno 20).

    The first (nothing lost) ends the stream StateChanged; the client re-requests and
    sees the failover log grow.  Five more writes, then the second failover loses 3
    items: StateChanged again, the resume rolls back to the new branch point, the retry
    succeeds with a three-entry log and the stream runs to seqno 20 (OK).
    """
    with live(out, "failover-branches", vbuckets=1, items=10, seed=3) as lv:

        async def scenario() -> None:
            client = DcpClient("127.0.0.1", lv.port, lv.config("live-failover-branches", vbuckets=(0,), end_seqno=20))
            await client.start()

            def at(seqno: int) -> Callable[[DcpConsumer], bool]:
                return lambda c: c.streams[0].position.seqno >= seqno

            def branches(n: int) -> Callable[[DcpConsumer], bool]:
                return lambda c: len(c.streams[0].position.failover_log) == n

            await client_until(client, at(10), "seqno 10")
            lv.sim.failover(0)
            await client_until(client, branches(2), "a failover log of 2 entries")
            for i in range(5):
                lv.sim.mutate(f"after-first-{i}", {"n": i})
            await client_until(client, at(15), "seqno 15")
            lv.sim.failover(0, lose=3)
            await client_until(client, branches(3), "a failover log of 3 entries")
            for i in range(8):
                lv.sim.mutate(f"after-second-{i}", {"n": i})
            await client.wait()

        run(scenario())


def purge_rollback(out: Path) -> None:
    """A client streams vbucket 0 and saves its state; tombstones are written and purged; the resume rolls back to 0."""
    with live(out, "purge-rollback", vbuckets=1, items=10, seed=4) as lv:
        state: ResumeState = run(run_client("127.0.0.1", lv.port, lv.config("live-purge-first", vbuckets=(0,), to_latest=True)))
        for i in range(0, 10, 2):
            lv.sim.delete(f"doc-{i:04d}")
        for i in range(5):
            lv.sim.mutate(f"later-{i}", {"n": i})
        lv.sim.purge(0)
        run(run_client("127.0.0.1", lv.port, lv.config("live-purge-resume", vbuckets=(0,), to_latest=True, resume=state)))


def stream_ids(out: Path) -> None:
    """enable_stream_id: two streams on vbucket 0 (sid 1 from 0, sid 2 resuming at 6) and one on vbucket 1 (sid 3), each to the end."""
    with live(out, "stream-ids", vbuckets=2, items=16, seed=5, checkpoint_items=4) as lv:
        high = {vb: lv.sim.call(lambda v=vb: lv.sim.sim.bucket.vbuckets[v].high_seqno) for vb in (0, 1)}

        async def scenario() -> None:
            async with Scripted(lv.port, "live-stream-ids") as c:
                await c.bootstrap(
                    features=(COLLECTIONS,), controls=(("enable_noop", "true"), ("set_noop_interval", "10"), ("enable_stream_id", "true"))
                )
                uuid0 = lv.sim.call(lambda: lv.sim.sim.bucket.vbuckets[0].uuid)
                # all three requests at once: the two streams of vbucket 0 run side by side
                opaques = [
                    c.send_stream(0, end=high[0], value={"sid": 1}),
                    c.send_stream(0, start=6, end=high[0], uuid=uuid0, snap=(6, 6), value={"sid": 2}),
                    c.send_stream(1, end=high[1], value={"sid": 3}),
                ]
                for opaque in opaques:
                    assert (await c.response(opaque)).frame.status == Status.SUCCESS
                await c.until_end((0, 1), (0, 2), (1, 3))

        run(scenario())


def collections(out: Path) -> None:
    """A stream filtered on collection ``airlines`` while collections are created and dropped; then an unfiltered backfill.

    The filtered stream (stock client, ``{"collections": ["8"]}``) sees the creation of
    ``airlines``, its documents, seqno-advanced over what it does not see (``hotels``),
    the drop, and ends FilterEmpty.  A second connection then streams everything to the
    high seqno: the system events of both collections, no dropped documents.
    """
    with live(out, "collections", vbuckets=2, items=6, seed=6) as lv:
        lv.sim.create_collection("airlines")
        for i in range(6):
            lv.sim.mutate(f"airline-{i:03d}", {"id": i}, collection="airlines")

        async def scenario() -> None:
            cfg = lv.config("live-collections-filtered", vbuckets=(0, 1), stream_value={"collections": ["8"]})
            client = DcpClient("127.0.0.1", lv.port, cfg)
            await client.start()
            highs = {vb: lv.sim.call(lambda v=vb: lv.sim.sim.bucket.vbuckets[v].high_seqno) for vb in (0, 1)}
            await client_until(
                client, lambda c: all(c.streams[vb].position.seqno >= highs[vb] for vb in (0, 1)), "the filtered streams to catch up"
            )
            lv.sim.create_collection("hotels")
            for i in range(4):
                lv.sim.mutate(f"hotel-{i:03d}", {"id": i}, collection="hotels")
            for i in range(6, 8):
                lv.sim.mutate(f"airline-{i:03d}", {"id": i}, collection="airlines")
            lv.sim.drop_collection("airlines")
            await client.wait()

        run(scenario())
        run(run_client("127.0.0.1", lv.port, lv.config("live-collections-all", vbuckets=(0, 1), to_latest=True)))


def acked(prepared: int) -> Callable[[dict[str, Any]], bool]:
    """A journal entry: the seqno ack of the prepare at ``prepared``."""
    return lambda e: e["event"] == "seqno_ack" and e["prepared_seqno"] == prepared


def seen(c: Scripted, seqno: int) -> Callable[[], bool]:
    """``c`` received the message at ``seqno``."""
    return lambda: any(_seqno_of(d) == seqno for d in c.received)


def sync_writes(out: Path) -> None:
    """enable_sync_writes + consumer_name: v2.0 markers, prepare/commit/abort, seqno acks (scripted client)."""
    with live(out, "sync-writes", vbuckets=1, items=4, seed=7) as lv:
        b = lv.sim.sim.bucket

        async def scenario() -> None:
            async with Scripted(lv.port, "live-sync-writes", seqno_acks=True) as c:
                await c.bootstrap(controls=(("enable_sync_writes", "true"), ("consumer_name", "replica-1")))
                await c.stream(0)
                for i in range(4):
                    # each write in a snapshot of its own: prepare, the replica's seqno ack, then commit (or abort)
                    key = f"sync-{i:02d}"
                    prepared: int = lv.sim.call(b.prepare, key, {"id": i}).seqno
                    lv.sim.kick()
                    await lv.until_noted(acked(prepared), f"the seqno ack of {key}")
                    resolved: int = lv.sim.call(b.abort if i == 2 else b.commit, key).seqno
                    lv.sim.kick()
                    await c.until(seen(c, resolved), f"the commit or abort of {key}")
                lv.sim.mutate("plain-after", {"n": 1})
                high = lv.sim.call(lambda: b.vbuckets[0].high_seqno)
                await c.until(seen(c, high), "the last seqno")
                d = await c.request("DCP_CLOSE_STREAM", vbucket=0)
                assert d.frame.status == Status.SUCCESS

        run(scenario())


def flow_control(out: Path) -> None:
    """connection_buffer_size 2048: the consumer stops acking, the producer stalls on a full window; 0.5 s later it acks and the stream ends OK."""
    with live(out, "flow-control", vbuckets=1, items=40, seed=8) as lv:
        high = lv.sim.call(lambda: lv.sim.sim.bucket.vbuckets[0].high_seqno)

        async def scenario() -> None:
            async with Scripted(lv.port, "live-flow-control", acking=False) as c:
                await c.bootstrap(controls=(("connection_buffer_size", "2048"),))
                await c.stream(0, end=high)
                await c.until(lambda: c.unacked >= 2048, "a full window")
                await asyncio.sleep(0.5)  # the stall the capture shows (a duration on purpose, not a wait for something)
                c.acking = True
                c.ack()
                await c.until_end((0, None))

        run(scenario())


def oso(out: Path) -> None:
    """An OSO backfill (enable_out_of_order_snapshots true_with_seqno_advanced) of one collection, stock client."""
    with live(out, "oso", vbuckets=1, items=4, seed=9) as lv:
        lv.sim.create_collection("airlines")
        for i in (5, 3, 9, 1, 7, 2, 8):
            lv.sim.mutate(f"airline-{i:03d}", {"id": i}, collection="airlines")
        for i in range(3):
            lv.sim.mutate(f"doc-late-{i}", {"n": i})
        cfg = lv.config(
            "live-oso",
            vbuckets=(0,),
            to_latest=True,
            stream_value={"collections": ["8"]},
            controls=(("enable_out_of_order_snapshots", "true_with_seqno_advanced"),),
        )
        run(run_client("127.0.0.1", lv.port, cfg))


def stream_ends(out: Path) -> None:
    """Every stream-end reason the simulator produces: OK, Closed, StateChanged, FilterEmpty, then Slow on a second connection.

    Not produced (the simulator does not model them): Disconnected (3), BackfillFail (5),
    Rollback (6; sent as StateChanged anyway), LostPrivileges (8).
    """
    with live(out, "stream-ends", vbuckets=4, items=16, seed=10, slow_after=0.4) as lv:
        lv.sim.create_collection("airlines")
        for i in range(4):
            lv.sim.mutate(f"airline-{i:03d}", {"id": i}, collection="airlines")
        b = lv.sim.sim.bucket
        high = {vb: lv.sim.call(lambda v=vb: b.vbuckets[v].high_seqno) for vb in range(4)}
        vb_airline = lv.sim.call(lambda: b.vbucket_of("airline-000").id)

        async def scenario() -> None:
            async with Scripted(lv.port, "live-stream-ends") as c:
                await c.bootstrap(
                    features=(COLLECTIONS,),
                    controls=(("enable_noop", "true"), ("set_noop_interval", "10"), ("send_stream_end_on_client_close_stream", "true")),
                )
                await c.stream(0, end=high[0])  # OK at the end seqno
                await c.until_end((0, None))
                await c.stream(1)  # Closed after CLOSE_STREAM
                await c.until(lambda: any(d.frame.vbucket == 1 and _seqno_of(d) == high[1] for d in c.received), "vb 1 caught up")
                closed = await c.request("DCP_CLOSE_STREAM", vbucket=1)
                assert closed.frame.status == Status.SUCCESS
                await c.until_end((1, None))
                await c.stream(2)  # StateChanged on failover
                await c.until(lambda: any(d.frame.vbucket == 2 and _seqno_of(d) == high[2] for d in c.received), "vb 2 caught up")
                lv.sim.failover(2)
                await c.until_end((2, None))
                await c.stream(vb_airline, value={"collections": ["8"]})  # FilterEmpty when airlines is dropped
                await c.until(
                    lambda: any(d.frame.vbucket == vb_airline and _seqno_of(d) == high[vb_airline] for d in c.received),
                    "the filtered stream caught up",
                )
                lv.sim.drop_collection("airlines")
                await c.until_end((vb_airline, None))
            async with Scripted(lv.port, "live-stream-ends-slow", acking=False) as c:
                await c.bootstrap(controls=(("connection_buffer_size", "128"),))
                await c.stream(3)  # Slow: the window stays full longer than the producer waits
                await c.until_end((3, None))

        run(scenario())


def loss_reorder(out: Path) -> None:
    """A clean session (stock client, small flow-control buffer: many segments), then made messy on purpose.

    Two consecutive producer segments are swapped early on (TCP reassembly must put
    them back), and a later producer segment holding a snapshot marker is dropped
    (a gap: what follows on that connection is uncertain).  The journal's
    ``postprocess`` says which packets and which frames.
    """
    with tempfile.TemporaryDirectory() as tmp:
        clean_dir = Path(tmp)
        with live(clean_dir, "loss-reorder", vbuckets=1, items=10, seed=12, checkpoint_items=20) as lv:
            b = lv.sim.sim.bucket

            async def scenario() -> None:
                cfg = lv.config("live-loss-reorder", vbuckets=(0,), end_seqno=130, buffer_size=1500, ack_ratio=0.5)
                client = DcpClient("127.0.0.1", lv.port, cfg)
                await client.start()
                await client_until(client, lambda c: c.streams[0].position.seqno >= 10, "seqno 10")
                lv.sim.call(lambda: [b.mutate(f"burst-{i:03d}", {"n": i, "pad": "x" * 40}) for i in range(120)])
                lv.sim.kick()  # one batch of 120 writes: memory snapshots of 20 seqnos, longer than a segment
                await client.wait()

            run(scenario())
        clean = clean_dir / "live-loss-reorder.pcap"
        records = list(read_records([str(clean)]))
        header, packets = read_pcap(clean)
        s2c_packets = sorted({r.packet for r in records if r.direction == "s2c" and r.event.type == "frame" and r.packet == r.packet_first})
        by_packet: dict[int, list[Any]] = {}
        for r in records:
            if r.event.type == "frame":
                by_packet.setdefault(r.packet, []).append(r)
        # swap: the second and third producer data packets (a buffer ack travels between them)
        data_packets = [
            p for p in s2c_packets if any(x.event.name in ("DCP_MUTATION", "DCP_SNAPSHOT_MARKER") for x in by_packet.get(p, []))
        ]
        swap = (data_packets[1], data_packets[2])
        # drop: a later producer packet holding a snapshot marker (the rest of that snapshot follows in the next packets)
        markers = [p for p in data_packets if p > swap[1] and any(x.event.name == "DCP_SNAPSHOT_MARKER" for x in by_packet[p])]
        drop = markers[len(markers) // 2]
        dropped = [
            {"name": x.event.name, "vbucket": x.event.vbucket, "seqno": _frame_seqno(x)}
            for x in records
            if isinstance(x.event, Frame) and drop in (x.packet, x.packet_first)
        ]
        new = [packets[i - 1] for i in range(1, len(packets) + 1) if i != drop]
        ia, ib = new.index(packets[swap[0] - 1]), new.index(packets[swap[1] - 1])
        new[ia], new[ib] = new[ib], new[ia]
        (out / "live-loss-reorder.pcap").write_bytes(header + b"".join(new))
        doc = json.loads((clean_dir / "live-loss-reorder.journal.json").read_text())
        lost = len(packets[drop - 1]) - 16 - 54  # record header, Ethernet + IPv4 + TCP headers
        extra = {"dropped_packet": drop, "dropped_bytes": lost, "dropped_frames": dropped, "swapped_packets": list(swap)}
        write_journal(out / "live-loss-reorder.journal.json", doc["journal"], extra)


def _frame_seqno(rec: Any) -> int | None:
    d = dissect(rec.event, rec.context)
    if d.name == "DCP_SNAPSHOT_MARKER":
        return None
    return _seqno_of(d)


def read_pcap(path: Path) -> tuple[bytes, list[bytes]]:
    """A classic pcap file as (global header, [record header + data, ...])."""
    data = path.read_bytes()
    endian = "<" if data[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    out: list[bytes] = []
    off = 24
    while off + 16 <= len(data):
        incl = struct.unpack_from(endian + "I", data, off + 8)[0]
        out.append(data[off : off + 16 + incl])
        off += 16 + incl
    return data[:24], out


#: name -> the function that records it
SCENARIOS: dict[str, Callable[[Path], None]] = {
    "plain": plain,
    "rollback-retry": rollback_retry,
    "failover-branches": failover_branches,
    "purge-rollback": purge_rollback,
    "stream-ids": stream_ids,
    "collections": collections,
    "sync-writes": sync_writes,
    "flow-control": flow_control,
    "oso": oso,
    "stream-ends": stream_ends,
    "loss-reorder": loss_reorder,
}


def main(argv: list[str] | None = None, out: Path | None = None) -> None:
    """Record every scenario (or those named) into ``out`` (default: this folder)."""
    names = (argv if argv is not None else sys.argv[1:]) or list(SCENARIOS)
    target = out or HERE
    for name in names:
        SCENARIOS[name](target)
        pcap = target / f"live-{name}.pcap"
        print(f"wrote captures/{pcap.name} ({pcap.stat().st_size} bytes) and its journal")


if __name__ == "__main__":
    main()


__all__ = ["SCENARIOS", "Live", "Scripted", "live", "main", "read_pcap", "write_journal"]
