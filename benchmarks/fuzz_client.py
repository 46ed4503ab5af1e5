"""The live client against hostile servers: every run ends, with an error or with success, within its timeouts.

    python benchmarks/fuzz_client.py                         # 2000 sans-IO runs + 40 over TCP
    python benchmarks/fuzz_client.py --count 20000 --tcp 200 --seed 7

A hostile server is the project's sans-IO producer (a well-behaved data node)
whose output passes through :class:`Hostile`: every frame goes out as it is,
except one reply of the bootstrap (HELLO ... DCP_STREAM_REQ) chosen by the
run's :class:`Plan`, which is mutated: a wrong opaque, a bad status, cut short
(the framing is lost), replaced by garbage, never sent (and nothing after it:
the server falls silent), cut mid-frame and the connection closed, a SCRAM
server-first with a huge iteration count or a mangled attribute, flipped
bytes, a huge declared body, sent twice, or followed by garbage.

Two drivers:

- ``run_sansio``: :class:`~dcpinspect.live.consumer.DcpConsumer` against the
  producer, no sockets, a fake clock (``dt`` per round trip).  The run must
  end before ``20 x response_timeout`` of fake time.
- ``run_tcp``: :class:`~dcpinspect.live.client.DcpClient` against the hostile
  server on 127.0.0.1: the tests' loopback node (``tests/simnode.py``,
  event-driven: nothing polls the clock) with :class:`Hostile` as its output
  filter.  The client's timeouts run on a fake clock that moves only while
  nothing is in flight (:func:`advance_when_quiet`; ``--real-clock``: the
  event loop's clock).  It must end with a ``ClientError`` or a state (a
  generous real-time deadline only catches a hang).

Every error message must be one line of printable text (the server's bytes
escaped).  Prints the outcomes per mutation; exits 1 on any hang or bad
message.  ``tests/live/test_client_hostile.py`` runs a seeded slice of both.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcpinspect.live.client import ClientError, DcpClient
from dcpinspect.live.cluster import Cluster
from dcpinspect.live.consumer import ConsumerConfig, DcpConsumer
from dcpinspect.live.consumer_states import Phase
from dcpinspect.live.producer import ProducerConnection
from dcpinspect.protocol.enums import Magic, Opcode, Status
from dcpinspect.wire.decoder import FrameDecoder
from dcpinspect.wire.events import Frame

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the loopback node the tests use
from simnode import SimNode

PASSWORD = "hostile-pw"
MUTATIONS = (
    "wrong_opaque",
    "bad_status",
    "truncate",
    "garbage",
    "silence",
    "close_mid_frame",
    "huge_iterations",
    "scram_mangle",
    "flip",
    "huge_body",
    "duplicate",
    "append_garbage",
)
#: replies of the bootstrap that a plan may mutate
BOOTSTRAP = frozenset(
    int(op)
    for op in (
        Opcode.HELLO,
        Opcode.SASL_LIST_MECHS,
        Opcode.SASL_AUTH,
        Opcode.SASL_STEP,
        Opcode.SELECT_BUCKET,
        Opcode.GET_CLUSTER_CONFIG,
        Opcode.GET_ALL_VB_SEQNOS,
        Opcode.STAT,
        Opcode.DCP_OPEN,
        Opcode.DCP_CONTROL,
        Opcode.DCP_STREAM_REQ,
    )
)
#: about how many bootstrap replies a run sees (HELLO, mechs, 2 SASL, select, cluster map, seqnos, open, 3 controls, 2 streams)
REPLIES = 13
_RESPONSE = int(Magic.CLIENT_RESPONSE)
_AUTH_ERROR = int(Status.AUTH_ERROR)


@dataclass(frozen=True)
class Plan:
    """Which bootstrap reply (0-based) is mutated, and how."""

    seed: int
    target: int
    kind: str


def plan(seed: int, kind: str | None = None) -> Plan:
    """The plan of run ``seed`` (``kind``: force a mutation)."""
    rng = random.Random(seed)
    k = kind or rng.choice(MUTATIONS)
    target = 2 if k in ("huge_iterations", "scram_mangle") else rng.randrange(REPLIES)  # 2: the SCRAM server-first
    return Plan(seed, target, k)


def _with_value(raw: bytes, value: bytes) -> bytes:
    """A classic response ``raw`` with its value replaced (header body length adjusted)."""
    keylen, extlen = int.from_bytes(raw[2:4], "big"), raw[4]
    head = bytearray(raw[:24])
    head[8:12] = (extlen + keylen + len(value)).to_bytes(4, "big")
    return bytes(head) + raw[24 : 24 + extlen + keylen] + value


class Hostile:
    """The server's output as a hostile server sends it: the plan's target reply mutated, the rest as it is."""

    def __init__(self, p: Plan) -> None:
        self.plan = p
        self.rng = random.Random(p.seed ^ 0x5EED)
        self.decoder = FrameDecoder()
        self.replies = 0
        self.silent = False  # nothing more is sent (the connection stays open)
        self.close = False  # the connection is to be closed after what filter returned

    def filter(self, data: bytes) -> bytes:
        out = bytearray()
        for ev in self.decoder.feed(data):
            if self.silent or self.close:
                break
            assert isinstance(ev, Frame)
            raw = ev.raw
            if raw[0] == _RESPONSE and raw[1] in BOOTSTRAP:
                if self.replies == self.plan.target:
                    raw = self._mutate(raw)
                self.replies += 1
            out += raw
        return bytes(out)

    def _mutate(self, raw: bytes) -> bytes:
        rng, kind = self.rng, self.plan.kind
        b = bytearray(raw)
        if kind == "wrong_opaque":
            b[12:16] = rng.randrange(1 << 32).to_bytes(4, "big")
        elif kind == "bad_status":
            b[6:8] = rng.choice([int(s) for s in Status if s != int.from_bytes(raw[6:8], "big")] + [0xBEEF]).to_bytes(2, "big")
        elif kind == "truncate":
            return raw[: rng.randrange(1, len(raw))]
        elif kind == "garbage":
            return rng.randbytes(rng.randrange(1, 64))
        elif kind == "silence":
            self.silent = True
            return b""
        elif kind == "close_mid_frame":
            self.close = True
            return raw[: rng.randrange(0, len(raw))]
        elif kind in ("huge_iterations", "scram_mangle"):
            value = raw[24 + raw[4] + int.from_bytes(raw[2:4], "big") :]
            if b"i=" not in value:  # not a server-first after all: a bad status instead
                b[6:8] = _AUTH_ERROR.to_bytes(2, "big")
                return bytes(b)
            attrs = dict(part.split(b"=", 1) for part in value.split(b","))
            if kind == "huge_iterations":
                attrs[b"i"] = str(rng.choice([10**30, 2**31 - 1, 100_001, 2**64])).encode()
            else:
                how = rng.randrange(6)
                if how < 3:
                    attrs.pop((b"r", b"s", b"i")[how])
                elif how == 3:
                    attrs[b"s"] = rng.choice([b"", b"***", b"QUJD"])
                elif how == 4:
                    attrs[b"r"] = b"not-our-nonce"
                else:
                    attrs = {b"e": b"other-error\x1b[2J"}
            return _with_value(raw, b",".join(k + b"=" + v for k, v in attrs.items()))
        elif kind == "flip":
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        elif kind == "huge_body":
            b[8:12] = rng.choice([0x7FFFFFFF, len(raw) - 24 + 10_000_000, len(raw) - 24 + 1]).to_bytes(4, "big")
        elif kind == "duplicate":
            return raw + raw
        elif kind == "append_garbage":
            return raw + rng.randbytes(rng.randrange(1, 64))
        return bytes(b)


@dataclass
class Outcome:
    """How a run ended: ``ok`` (every stream ended), ``error`` (the connection failed), ``waiting`` (see below) or ``hang``."""

    kind: str
    message: str = ""
    elapsed: float = 0.0


def _cluster(seed: int) -> Cluster:
    cluster = Cluster({"alice": PASSWORD}, seed=seed)
    cluster.create_bucket("travel", vbuckets=2, items=6)
    return cluster


def client_config(response_timeout: float) -> ConsumerConfig:
    """The client's configuration for a hostile run (noops at the response timeout: silence is found as fast)."""
    return ConsumerConfig(
        bucket="travel",
        user="alice",
        password=PASSWORD,
        vbuckets=None,
        to_latest=True,
        buffer_size=2000,
        response_timeout=response_timeout,
        noop_interval=max(0.1, response_timeout),
    )


def _printable(message: str) -> bool:
    return message.isprintable()


def _waiting_for_promised_seqnos(cons: DcpConsumer, prod: ProducerConnection) -> bool:
    """Every open stream has everything the server has and waits for an end it was promised: legal, not a hang.

    A mutated GET_ALL_VB_SEQNOS reply can raise a to-latest client's end seqno
    past the vbucket's real high seqno; the client then waits, answering
    noops, exactly as it would for a quiet open-ended stream.
    """
    if cons.phase != Phase.STREAMING or prod.closed:
        return False
    vbs = prod.cluster.buckets["travel"].vbuckets
    open_ = [s for s in cons.streams.values() if s.status == "streaming"]
    return bool(open_) and all(s.position.seqno >= vbs[s.vbucket].high_seqno and s.end_seqno > vbs[s.vbucket].high_seqno for s in open_)


def run_sansio(p: Plan, *, response_timeout: float = 1.0, dt: float = 0.05) -> Outcome:
    """One run of the sans-IO consumer against the hostile producer with a fake clock."""
    prod = ProducerConnection(_cluster(p.seed))
    cons = DcpConsumer(client_config(response_timeout))
    hostile = Hostile(p)
    now, limit = 0.0, 20 * response_timeout
    while not cons.done and now < limit:
        out = cons.data_to_send()
        if out:
            prod.receive(out, now)
        prod.tick(now)
        data = hostile.filter(prod.data_to_send())
        if data:
            cons.receive(data, now)
        if hostile.close:
            cons.connection_lost()
        cons.tick(now)
        now += dt
    if not cons.done and _waiting_for_promised_seqnos(cons, prod):
        return Outcome("waiting", "streaming: the mutated reply promised seqnos the server never had", now)
    if not cons.done:
        return Outcome("hang", f"phase {cons.phase} after {now:g} s of fake time", now)
    if cons.phase == Phase.FAILED:
        return Outcome("error", cons.failure or "", now)
    return Outcome("ok", "", now)


class FakeClock:
    """The client's clock in a TCP run: it moves only when :func:`advance_when_quiet` moves it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.reads = 0  # how often the client read it (it does once per turn of its loop)

    def __call__(self) -> float:
        self.reads += 1
        return self.now


async def advance_when_quiet(client: DcpClient, node: SimNode, clock: FakeClock, step: float, limit: float) -> None:
    """Move ``clock`` on by ``step`` each time the run is quiet, until ``limit`` (fake seconds); returns when the client ended.

    Quiet: the node is idle, it took every byte the client wrote and the client read every byte
    it wrote, and the client has run with the time of the last step.  Then nothing but time can
    happen, so a timeout the client reports is the one the plan provoked, however slow the machine.
    Woken by the client's progress (:meth:`DcpClient.until`: what it read, or its ``tick``), never by this clock.
    """
    seen = 0

    def quiet(_consumer: DcpConsumer) -> bool:
        return clock.reads > seen and node.idle and client.bytes["c2s"] == node.received and node.sent == client.bytes["s2c"]

    while clock.now < limit:
        try:
            await client.until(quiet)
        except ClientError:
            return
        if client.consumer is None or client.consumer.done:
            return
        seen = clock.reads
        clock.now += step


async def run_tcp(p: Plan, *, response_timeout: float = 0.5, safety: float = 60.0, fake_clock: bool = True) -> Outcome:
    """One run of :class:`DcpClient` against the hostile server on 127.0.0.1.

    With ``fake_clock`` the client's timeouts run on a :class:`FakeClock` that moves only while the
    connection is quiet (:func:`advance_when_quiet`, steps of a quarter of ``response_timeout``, at
    most ``20 x response_timeout``): which request times out never depends on the machine's speed,
    and ``elapsed`` is fake time.  Without it they run on the event loop's clock.  ``safety`` (real
    seconds) only turns a hang into a ``hang`` outcome.
    """
    async with SimNode(_cluster(p.seed), output_filter=lambda: Hostile(p)) as node:
        loop = asyncio.get_running_loop()
        clock = FakeClock() if fake_clock else None
        start = loop.time()

        def elapsed() -> float:
            return clock.now if clock is not None else loop.time() - start

        client = DcpClient(node.host, node.port, client_config(response_timeout), connect_timeout=5, tick=0.05, clock=clock)
        await client.start()
        ended = asyncio.ensure_future(client.wait())
        waits: list[asyncio.Future[Any]] = [ended]
        limit = 20 * response_timeout
        if clock is not None:
            waits.append(asyncio.ensure_future(advance_when_quiet(client, node, clock, response_timeout / 4, limit)))
        deadline = start + safety
        try:
            await asyncio.wait(waits, timeout=safety, return_when=asyncio.FIRST_COMPLETED)
            if not ended.done() and (clock is None or clock.now < limit):  # the driver saw the client end first
                await asyncio.wait([ended], timeout=max(0.0, deadline - loop.time()))
            if not ended.done():
                why = f"{safety:g} s" if clock is None or clock.now < limit else f"{limit:g} s of fake time"
                return Outcome("hang", f"no end within {why}", elapsed())
            try:
                ended.result()
            except ClientError as exc:
                return Outcome("error", str(exc), elapsed())
            return Outcome("ok", "", elapsed())
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)


def check(p: Plan, o: Outcome) -> str | None:
    """What is wrong with an outcome (``None``: nothing)."""
    if o.kind == "hang":
        return f"seed {p.seed} {p.kind} at reply {p.target}: hang ({o.message})"
    if not _printable(o.message):
        return f"seed {p.seed} {p.kind}: unescaped error message {o.message!r}"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=2000, help="sans-IO runs")
    ap.add_argument("--tcp", type=int, default=40, help="runs over TCP on 127.0.0.1")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--real-clock", action="store_true", help="TCP runs time out on the event loop's clock, not a fake one")
    args = ap.parse_args(argv)
    counts: Counter[tuple[str, str, str]] = Counter()
    problems: list[str] = []
    for i in range(args.count):
        p = plan(args.seed * 1_000_003 + i)
        o = run_sansio(p)
        counts["sans-io", p.kind, o.kind] += 1
        if (why := check(p, o)) is not None:
            problems.append(why)

    async def tcp_runs() -> None:
        for i in range(args.tcp):
            p = plan(args.seed * 7_000_001 + i, MUTATIONS[i % len(MUTATIONS)])
            o = await run_tcp(p, fake_clock=not args.real_clock)
            counts["tcp", p.kind, o.kind] += 1
            if (why := check(p, o)) is not None:
                problems.append(why)

    if args.tcp:
        asyncio.run(tcp_runs())
    width = max(len(k) for k in MUTATIONS)
    for driver in ("sans-io", "tcp"):
        rows = sorted({k for d, k, _ in counts if d == driver})
        if rows:
            print(f"{driver}:")
        for kind in rows:
            cells = ", ".join(f"{o} {counts[driver, kind, o]}" for o in ("ok", "error", "waiting", "hang") if counts[driver, kind, o])
            print(f"  {kind:<{width}}  {cells}")
    total: Counter[str] = Counter()
    for (_d, _k, how), n in counts.items():
        total[how] += n
    print(f"total: {dict(total)}; problems: {len(problems)}")
    for line in problems[:20]:
        print("  " + line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
