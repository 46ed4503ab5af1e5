"""Record the live sample captures in this folder: ``python captures/make_live_samples.py [NAME ...]``.

Each scenario starts the simulated data node(s) (:class:`dcpinspect.live.sim.Simulator`,
fixed seed) on 127.0.0.1, runs DCP clients against them and keeps the capture as
``captures/live-<name>.pcap``, with the simulator's own record of what it did
(``Cluster.journal``) as ``captures/live-<name>.journal.json`` - the ground truth
``tests/live/test_live_samples.py`` checks the timelines against.

How the bytes are captured:

* one data node: through the tap proxy (:class:`dcpinspect.live.proxy.TapProxy`,
  client -> proxy -> simulator), and the simulator advertises the proxy's address
  as its node in the cluster map (``Simulator.advertise``), so a client that follows
  the map (the stock client, the official SDK's bucket connection) stays behind the
  proxy: the map in the capture names the port the capture shows;
* several data nodes (a failover promotes a replica on another node): the clients'
  own capture (:class:`dcpinspect.live.tap.LiveCapture`, one for the scenario, fed
  by every connection of every client), because a client following the map
  connects to each node's own port.  The bytes are those the client's sockets
  carried, in the order the client saw them.

Where the stock client (:mod:`dcpinspect.live.consumer`) cannot do what a scenario
needs (two streams on one vbucket, withholding buffer acks, seqno acks,
closing a stream and waiting for its STREAM_END, a stream per stream-end reason)
a small scripted client does it, built from :func:`dcpinspect.wire.encode`,
:class:`~dcpinspect.wire.decoder.FrameDecoder` and :func:`dcpinspect.wire.dissect`
(never hand-packed frames).  The ``sdk`` sample runs the official Couchbase Python
SDK (PyPI ``couchbase``) in a subprocess.

The content is deterministic (seeds, keys, values, the order of the steps);
timestamps, the ephemeral ports, where TCP happened to split the byte streams and
(where writes race a live stream) how memory snapshots were cut vary between runs,
so the files are not byte-for-byte reproducible.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
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
from dcpinspect.live.consumer import ConsumerConfig
from dcpinspect.live.proxy import TapProxy
from dcpinspect.live.resume import ResumeState
from dcpinspect.live.sasl import plain_payload
from dcpinspect.live.sim import Simulator, SimulatorThread
from dcpinspect.live.tap import LiveCapture, LiveConnection
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
# plumbing: a simulator and a proxy (or the clients' own capture) per scenario


Watcher = Callable[[dict[str, Any]], None]


@dataclass
class Live:
    """A running scenario: the simulator (in its thread) and what records it (the proxy, or a shared client capture)."""

    sim: SimulatorThread
    proxy: TapProxy | None = None
    capture: LiveCapture | None = None
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
        """Where clients connect: the proxy, else node 0."""
        return self.proxy.port if self.proxy is not None else self.sim.port

    def node_port(self, node: int) -> int:
        """Node ``node``'s own port (several nodes: clients connect there directly)."""
        assert self.proxy is None
        return self.sim.sim.addresses[node][1]

    def high(self, vb: int) -> int:
        """Vbucket ``vb``'s high seqno now."""
        return int(self.sim.call(lambda: self.sim.sim.bucket.vbuckets[vb].high_seqno))

    def uuid(self, vb: int) -> int:
        """Vbucket ``vb``'s current UUID."""
        return int(self.sim.call(lambda: self.sim.sim.bucket.vbuckets[vb].uuid))

    def keys_in(self, vb: int, prefix: str, n: int) -> list[str]:
        """The first ``n`` keys ``prefix-000``, ``prefix-001``... that hash to vbucket ``vb``."""
        bucket = self.sim.sim.bucket
        keys: list[str] = []
        i = 0
        while len(keys) < n:
            key = f"{prefix}-{i:03d}"
            if bucket.vbucket_of(key).id == vb:
                keys.append(key)
            i += 1
        return keys

    def journal(self) -> list[dict[str, Any]]:
        """A copy of the simulator's journal, taken on its loop."""
        return self.sim.call(lambda: [dict(e) for e in self.sim.sim.cluster.journal])

    def config(self, name: str, **kw: Any) -> ConsumerConfig:
        """A stock-client configuration for this simulator."""
        return ConsumerConfig(bucket="default", user=USER, password=PASSWORD, name=name, **kw)

    def client(self, config: ConsumerConfig) -> DcpClient:
        """A stock client of node 0 (through the proxy, or recorded into the scenario's capture)."""
        return DcpClient("127.0.0.1", self.port, config, capture=self.capture)


@contextlib.contextmanager
def live(out: Path, name: str, *, users: dict[str, str] | None = None, advertise_proxy: bool = False, **sim: Any) -> Iterator[Live]:
    """Run a simulator (and, with one node, the proxy); on exit write ``out/live-<name>.pcap`` and its journal.

    With one node the proxy records; with ``advertise_proxy`` the cluster map names the
    proxy's address as the node (for clients that connect where the map says).  With
    several nodes the clients record their own connections into :attr:`Live.capture`
    (they must close them).
    """
    pcap = out / f"live-{name}.pcap"
    simulator = Simulator(host="127.0.0.1", port=0, users=users or {USER: PASSWORD}, **sim)
    with simulator.run_in_thread() as st:
        if simulator.nodes > 1:
            with LiveCapture(pcap=pcap, on_record=_discard) as capture:
                session = Live(st, capture=capture)
                yield session
        else:
            proxy = TapProxy(("127.0.0.1", 0), (st.host, st.port), pcap=pcap)
            with proxy.background():
                if advertise_proxy:
                    st.advertise(0, ("127.0.0.1", proxy.port))
                session = Live(st, proxy=proxy)
                yield session
                _settle(proxy)
        journal = session.journal()
    write_journal(out / f"live-{name}.journal.json", journal)


def _discard(_rec: Any) -> None:
    """Records are not kept while recording (the pcap is what counts)."""


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


async def client_until(client: DcpClient, cond: Callable[[DcpClient], bool], what: str) -> None:
    """Wait until ``cond(client)`` holds: checked each time the stock client handled what arrived (:meth:`DcpClient.until`).

    ``cond`` looks at :attr:`DcpClient.streams` (every node's streams, wherever each vbucket streams now).
    """
    await within(client.until(lambda _consumer: cond(client)), what)


def streamed_to(client: DcpClient, vb: int) -> int:
    """The seqno the stock client's stream of ``vb`` reached (-1: no stream yet)."""
    st = client.streams.get(vb)
    return -1 if st is None else st.position.seqno


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
    With a ``capture``, every byte sent and received is recorded into it (the
    scenario's own capture, when no proxy sits in between).
    """

    port: int
    name: str
    user: str = USER
    password: str = PASSWORD
    capture: LiveCapture | None = None
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
    _conn: LiveConnection | None = None
    _eof: bool = False

    async def __aenter__(self) -> Scripted:
        self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self.port)
        if self.capture is not None:
            local, peer = self._writer.get_extra_info("sockname"), self._writer.get_extra_info("peername")
            self._conn = self.capture.connection((str(local[0]), int(local[1])), (str(peer[0]), int(peer[1])))
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
        if self._conn is not None:
            self._conn.close(by="s2c" if self._eof else "c2s")

    # --- sending -----------------------------------------------------------------
    def send(self, name: str, **kw: Any) -> int:
        """Send one frame (a fresh opaque unless given); returns the opaque."""
        if "opaque" not in kw and not kw.get("response"):
            self._opaque += 1
            kw["opaque"] = self._opaque
        assert self._writer is not None
        raw = encode(name, **kw)
        if self._conn is not None:
            self._conn.data("c2s", raw)
        self._writer.write(raw)
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
            ("SASL_AUTH", {"key": "PLAIN", "value": plain_payload(self.user, self.password)}),
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
                    self._eof = True
                    return
                if self._conn is not None:
                    self._conn.data("s2c", data)
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
    """Two data nodes; each vbucket fails over once while the stock client streams both (end seqno 20).

    Vbucket 1 (active on node 1, replica on node 0) fails over with nothing lost: its
    stream on node 1 ends StateChanged, the client fetches the new cluster map and
    re-requests it on node 0: Success with a two-entry failover log, no rollback.
    Vbucket 0 (active on node 0, at seqno 10) gets five more writes, then fails over to
    node 1 without its last 3: StateChanged on node 0, the client re-requests it on
    node 1 from 15, Rollback to the new branch point 12, the retry succeeds.  Both
    streams then run to seqno 20 (OK).  Recorded by the client itself (it follows the
    map to each node's own port).
    """
    with live(out, "failover-branches", nodes=2, vbuckets=2, items=16, seed=3) as lv:

        def at(vb: int, seqno: int) -> Callable[[DcpClient], bool]:
            return lambda c: streamed_to(c, vb) >= seqno

        def branches(vb: int, n: int) -> Callable[[DcpClient], bool]:
            return lambda c: vb in c.streams and len(c.streams[vb].position.failover_log) == n

        def write(vb: int, prefix: str, upto: int) -> None:
            for key in lv.keys_in(vb, prefix, upto - lv.high(vb)):
                lv.sim.mutate(key, {"vb": vb})

        write(0, "before", 10)

        async def scenario() -> None:
            client = lv.client(lv.config("live-failover-branches", vbuckets=(0, 1), end_seqno=20))
            await client.start()
            highs = {vb: lv.high(vb) for vb in (0, 1)}
            await client_until(client, lambda c: all(at(vb, highs[vb])(c) for vb in (0, 1)), "both vbuckets caught up")
            lv.sim.failover(1)  # nothing lost: node 0 takes vbucket 1 over
            await client_until(client, branches(1, 2), "vbucket 1 re-requested on node 0")
            write(0, "before-loss", 15)
            await client_until(client, at(0, 15), "vbucket 0 at seqno 15")
            lv.sim.failover(0, lose=3)  # node 1 takes vbucket 0 over without its last 3 items
            await client_until(client, branches(0, 2), "vbucket 0 rolled back and re-requested on node 1")
            for vb in (0, 1):
                write(vb, f"after-failover-{vb}", 20)
            await within(client.wait(), "both streams to end at seqno 20")

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

    Before it starts, ``airlines`` and then ``hotels`` are created and written (each
    vbucket's history ends with hotels).  The filtered stream (stock client,
    ``{"collections": ["8"]}``) backfills the creation of ``airlines`` and its
    documents in one disk snapshot per vbucket, closed by a SEQNO_ADVANCED to the
    snapshot end over the hotels it does not see.  While it streams, airlines and
    hotels are written (memory snapshots: only the airlines, no marker and no
    seqno-advanced for the hotels), then ``airlines`` is dropped (system event) and
    the streams end FilterEmpty.  A second connection then streams everything to the
    high seqno: the system events of both collections, no dropped documents.
    """
    with live(out, "collections", vbuckets=2, items=6, seed=6) as lv:
        lv.sim.create_collection("airlines")
        for i in range(6):
            lv.sim.mutate(f"airline-{i:03d}", {"id": i}, collection="airlines")
        lv.sim.create_collection("hotels")
        for key in [k for vb in (0, 1) for k in lv.keys_in(vb, "hotel", 2)]:
            lv.sim.mutate(key, {"name": key}, collection="hotels")

        async def scenario() -> None:
            cfg = lv.config("live-collections-filtered", vbuckets=(0, 1), stream_value={"collections": ["8"]})
            client = lv.client(cfg)
            await client.start()
            highs = {vb: lv.high(vb) for vb in (0, 1)}
            await client_until(client, lambda c: all(streamed_to(c, vb) >= highs[vb] for vb in (0, 1)), "the filtered backfills")
            for key in [k for vb in (0, 1) for k in lv.keys_in(vb, "airline-late", 1)]:
                lv.sim.mutate(key, {"name": key}, collection="airlines")
            for key in [k for vb in (0, 1) for k in lv.keys_in(vb, "hotel-late", 1)]:
                lv.sim.mutate(key, {"name": key}, collection="hotels")
            lv.sim.drop_collection("airlines")
            await within(client.wait(), "FilterEmpty")

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
    """connection_buffer_size 2048: the consumer stops acking and the producer just stalls on the full window.

    Nothing ends: a server never ends a stream because its consumer stopped acking.
    0.5 s later the consumer acks and the stream runs to its end seqno (OK).
    """
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


READER, READER_PASSWORD = "reader", "reader-password"


def stream_ends(out: Path) -> None:
    """Every stream-end status a server sends, each produced as kv_engine produces it (scripted clients, two nodes).

    On node 0 (active for the even vbuckets), connection ``live-stream-ends``
    (collections, user ``reader``): OK (0) at an end seqno; StateChanged (2) when the
    vbucket fails over to node 1; FilterEmpty (7) when the only collection of a
    filtered stream is dropped; BackfillFail (5) on an armed backfill failure;
    Rollback sent as StateChanged (2) when a purge overtakes a backfill stalled under
    disk pressure; Slow (4) when a backfill stays stalled under disk pressure past the
    backfill idle limit.  Connection ``live-stream-ends-close`` (a 256-byte window,
    ``send_stream_end_on_client_close_stream``): CLOSE_STREAM while a memory snapshot
    waits behind the full window; the close response goes first, the queued items
    follow once acked, then Closed (1).  Last, user ``reader`` loses its privileges:
    LostPrivileges (8) on the collections connection, OK (0) on connection
    ``live-stream-ends-legacy`` (no HELLO Collections).  Disconnected (3) is never on
    the wire: a dropped connection's streams just stop.  Recorded by the clients.
    """
    users = {USER: PASSWORD, READER: READER_PASSWORD}
    with live(out, "stream-ends", users=users, nodes=2, vbuckets=8, items=48, seed=10) as lv:
        b = lv.sim.sim.bucket
        cluster = lv.sim.sim.cluster
        cid = lv.sim.create_collection("airlines")
        vb_airline = 6  # active on node 0; the collection's only documents live there
        for key in lv.keys_in(vb_airline, "airline", 4):
            lv.sim.mutate(key, {"name": key}, collection="airlines")
        node0 = lv.node_port(0)

        def caught_up(c: Scripted, vb: int) -> Callable[[], bool]:
            high = lv.high(vb)
            return lambda: any(d.frame.vbucket == vb and (_seqno_of(d) or 0) >= high for d in c.received if d.role == "request")

        def ended(c: Scripted, vb: int, n: int) -> Callable[[], bool]:
            """The ``n``-th STREAM_END of ``vb`` on ``c`` arrived."""
            return lambda: sum(1 for d in c.received if d.name == "DCP_STREAM_END" and d.frame.vbucket == vb) >= n

        async def scenario() -> None:
            controls = (("enable_noop", "true"), ("set_noop_interval", "10"))
            async with Scripted(node0, "live-stream-ends", user=READER, password=READER_PASSWORD, capture=lv.capture) as c:
                await c.bootstrap(features=(COLLECTIONS,), controls=controls)
                # OK: the end seqno reached
                await c.stream(0, end=lv.high(0))
                await c.until(ended(c, 0, 1), "OK")
                # StateChanged: vbucket 4 fails over to node 1
                await c.stream(4)
                await c.until(caught_up(c, 4), "vb 4 caught up")
                lv.sim.failover(4)
                await c.until(ended(c, 4, 1), "StateChanged")
                # FilterEmpty: the filter's only collection is dropped
                await c.stream(vb_airline, value={"collections": [f"{cid:x}"]})
                await c.until(caught_up(c, vb_airline), "the filtered stream caught up")
                lv.sim.drop_collection("airlines")
                await c.until(ended(c, vb_airline, 1), "FilterEmpty")
                # BackfillFail: the next backfill of vbucket 0 fails
                lv.sim.fail_backfills(0)
                await c.stream(0)
                await c.until(ended(c, 0, 2), "BackfillFail")
                # Rollback (sent as StateChanged): tombstones above the resume point, purged while its backfill is stalled
                start, uuid = lv.high(2), lv.uuid(2)
                for key in [f"doc-{i:04d}" for i in range(48) if b.vbucket_of(f"doc-{i:04d}").id == 2][:3]:
                    lv.sim.delete(key)  # three tombstones above the resume point
                lv.sim.disk_pressure(True)
                assert (await c.stream(2, start=start, uuid=uuid, snap=(start, start))).frame.status == Status.SUCCESS
                lv.sim.purge(2)
                lv.sim.disk_pressure(False)
                await c.until(ended(c, 2, 1), "Rollback as StateChanged")
                # Slow: a backfill stalled under disk pressure past the (here small) backfill idle limit
                lv.sim.call(setattr, cluster, "backfill_idle_limit", 0.5)
                lv.sim.disk_pressure(True)
                await c.stream(vb_airline)
                await c.until(ended(c, vb_airline, 2), "Slow")
                lv.sim.disk_pressure(False)
                # Closed, with queued messages after the close response (another connection, a small window)
                async with Scripted(node0, "live-stream-ends-close", acking=False, capture=lv.capture) as cl:
                    await cl.bootstrap(controls=(("connection_buffer_size", "256"), ("send_stream_end_on_client_close_stream", "true")))
                    start = lv.high(2)
                    await cl.stream(2, start=start, uuid=lv.uuid(2), snap=(start, start))
                    keys = lv.keys_in(2, "queued", 10)
                    lv.sim.call(lambda: [b.mutate(k, {"n": i}) for i, k in enumerate(keys)])
                    lv.sim.kick()  # one memory snapshot of 10 items: the 256-byte window holds two or three
                    await lv.until_noted(lambda e: e["event"] == "flow_blocked" and e.get("name") == cl.name, "the full window")
                    closed = await cl.request("DCP_CLOSE_STREAM", vbucket=2)
                    assert closed.frame.status == Status.SUCCESS
                    cl.acking = True
                    cl.ack()
                    await cl.until_end((2, None))
                # LostPrivileges: 8 on the collections connection, 0 on a legacy one
                async with Scripted(node0, "live-stream-ends-legacy", user=READER, password=READER_PASSWORD, capture=lv.capture) as lg:
                    await lg.bootstrap()
                    await c.stream(0)
                    await lg.stream(2)
                    await c.until(caught_up(c, 0), "vb 0 caught up")
                    await lg.until(caught_up(lg, 2), "vb 2 caught up on the legacy connection")
                    lv.sim.lose_privileges(READER)
                    await c.until(ended(c, 0, 3), "LostPrivileges")
                    await lg.until_end((2, None))

        run(scenario())


#: the official SDK's side of the ``sdk`` sample: prints one JSON line with its results (CAS and mutation tokens)
SDK_SCRIPT = r"""
import json, sys
from datetime import timedelta
from couchbase.auth import PasswordAuthenticator
from couchbase.cluster import Cluster
from couchbase.diagnostics import ServiceType
from couchbase.durability import DurabilityLevel, ServerDurability
from couchbase.exceptions import DocumentNotFoundException
from couchbase.options import ClusterOptions, ClusterTimeoutOptions, UpsertOptions, WaitUntilReadyOptions

port, collection = int(sys.argv[1]), sys.argv[2]
timeouts = ClusterTimeoutOptions(
    bootstrap_timeout=timedelta(seconds=15), connect_timeout=timedelta(seconds=5),
    kv_timeout=timedelta(seconds=5), kv_durable_timeout=timedelta(seconds=10),
)
auth = PasswordAuthenticator(sys.argv[3], sys.argv[4])
cluster = Cluster(f"couchbase://127.0.0.1:{port}", ClusterOptions(auth, timeout_options=timeouts))
out = []
try:
    cluster.wait_until_ready(timedelta(seconds=15), WaitUntilReadyOptions(service_types=[ServiceType.KeyValue]))
    bucket = cluster.bucket("default")

    def token(kind, key, r):
        t = r.mutation_token()
        out.append({"op": kind, "key": key, "cas": r.cas, "vb": t.partition_id, "seqno": t.sequence_number})

    for name in ("_default", collection):
        coll = bucket.scope("_default").collection(name)
        key = f"sdk-{name}"
        token("upsert", key, coll.upsert(key, {"n": 1, "in": name}))
        assert coll.get(key).content_as[dict] == {"n": 1, "in": name}
        token("upsert", key + "-kept", coll.upsert(key + "-kept", {"kept": True}))
        token("remove", key, coll.remove(key))
        try:
            coll.get(key)
            raise AssertionError("a removed document was found")
        except DocumentNotFoundException:
            pass
    coll = bucket.default_collection()
    durable = UpsertOptions(durability=ServerDurability(DurabilityLevel.MAJORITY))
    token("durable", "sdk-durable", coll.upsert("sdk-durable", {"durable": True}, durable))
finally:
    cluster.close()
print("RESULT " + json.dumps(out), flush=True)
"""


async def run_sdk(port: int, collection: str) -> list[dict[str, Any]]:
    """Run :data:`SDK_SCRIPT` against ``port``; its results (an error with its output if it failed)."""
    if importlib.util.find_spec("couchbase") is None:
        raise RuntimeError("the sdk sample needs the official Couchbase SDK: pip install couchbase")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        SDK_SCRIPT,
        str(port),
        collection,
        USER,
        PASSWORD,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        raw, _ = await asyncio.wait_for(proc.communicate(), 2 * DEADLINE)  # a deadline only: it ends by itself in seconds
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise TimeoutError("the SDK did not finish") from None
    output = raw.decode(errors="replace")
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the SDK failed (exit {proc.returncode}):\n{output}")
    result: list[dict[str, Any]] = json.loads(lines[-1][len("RESULT ") :])
    return result


def sdk(out: Path) -> None:
    """The official Couchbase Python SDK writes through the proxy while the stock client streams every vbucket.

    The SDK bootstraps (HELLO, SCRAM-SHA512, the global cluster config, then its bucket
    connection to the kv port that config names: the proxy), upserts, gets and removes
    documents in the default collection and in ``airlines``, and makes one durable write.
    The stock client (sync writes enabled) streams all eight vbuckets from 0 and stops
    (CLOSE_STREAM) once it has seen the seqno of every mutation token the SDK reported.
    """
    with live(out, "sdk", vbuckets=8, items=0, seed=13, advertise_proxy=True) as lv:
        lv.sim.create_collection("airlines")
        vbs = tuple(range(8))

        async def scenario() -> None:
            client = lv.client(lv.config("live-sdk-watch", vbuckets=vbs, controls=(("enable_sync_writes", "true"),)))
            await client.start()
            highs = {vb: lv.high(vb) for vb in vbs}
            await client_until(client, lambda c: all(streamed_to(c, vb) >= highs[vb] for vb in vbs), "every stream caught up")
            results = await run_sdk(lv.port, "airlines")
            want: dict[int, int] = {}
            for r in results:
                want[r["vb"]] = max(want.get(r["vb"], 0), r["seqno"])
            await client_until(client, lambda c: all(streamed_to(c, vb) >= s for vb, s in want.items()), "the SDK's writes streamed")
            await within(client.stop(), "the client to close its streams")

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
                client = lv.client(cfg)
                await client.start()
                await client_until(client, lambda c: streamed_to(c, 0) >= 10, "seqno 10")
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
    "sdk": sdk,
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
