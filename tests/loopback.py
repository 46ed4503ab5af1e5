"""Loopback TCP helpers shared by the tap-proxy, sniffer and memcached tests: traffic, an upstream, capture checks."""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from simnode import stop_server
from tshark import opaque_value, tshark_frames

from dcpinspect import dissect, encode
from dcpinspect.capture.read import read_records
from dcpinspect.flows.records import CaptureStats, Record
from dcpinspect.tables.export import frames_table

LOOP = "127.0.0.1"


# -- traffic ------------------------------------------------------------------


def requests(n: int, seed: int, big: int = 3000) -> bytes:
    """``n`` SET/GET/DELETE requests with values of random size (up to ``big`` bytes)."""
    rnd = random.Random(seed)
    out = bytearray()
    for i in range(n):
        op = rnd.choice(("SET", "GET", "DELETE"))
        key = f"key-{seed}-{i}"
        if op == "SET":
            out += encode(
                "SET", key=key, extras={"flags": i, "expiration": 0}, value=rnd.randbytes(rnd.randrange(big)), opaque=i, vbucket=i % 1024
            )
        else:
            out += encode(op, key=key, opaque=i, vbucket=i % 1024)
    return bytes(out)


def responses(n: int, seed: int, big: int = 3000) -> bytes:
    """``n`` GET/SET responses (the server side of a session)."""
    rnd = random.Random(seed + 1)
    out = bytearray()
    for i in range(n):
        if rnd.random() < 0.5:
            out += encode("GET", response=True, extras={"flags": i}, value=rnd.randbytes(rnd.randrange(big)), opaque=i, cas=i + 1)
        else:
            out += encode("SET", response=True, opaque=i, cas=i + 1, status=rnd.choice((0, 1, 2)))
    return bytes(out)


def bulk(total: int, value: int = 60_000) -> bytes:
    """About ``total`` bytes of SET requests with ``value``-byte values."""
    frame = encode("SET", key="bulk", extras={"flags": 0, "expiration": 0}, value=b"\xa5" * value, opaque=7)
    return frame * max(1, total // len(frame))


async def send_chunks(writer: asyncio.StreamWriter, data: bytes, seed: int) -> None:
    """Write ``data`` in random chunk sizes (frames cut anywhere), draining as we go."""
    rnd = random.Random(seed)
    pos = 0
    while pos < len(data):
        n = rnd.choice((1, 7, 24, 100, 1500, 65536, 300_000))
        writer.write(data[pos : pos + n])
        pos += n
        await writer.drain()


async def read_all(reader: asyncio.StreamReader) -> tuple[str, int]:
    """sha256 and length of everything until EOF."""
    h = hashlib.sha256()
    n = 0
    while data := await reader.read(1 << 20):
        h.update(data)
        n += len(data)
    return h.hexdigest(), n


def sha(data: bytes) -> tuple[str, int]:
    return hashlib.sha256(data).hexdigest(), len(data)


class Upstream:
    """A scripted server on 127.0.0.1: per connection, hashes what it gets and sends what ``script`` says."""

    def __init__(self, handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]) -> None:
        self.handler = handler
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[Any]] = set()

    async def _run(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            await self.handler(r, w)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            w.close()
            self.tasks.discard(task)

    async def __aenter__(self) -> tuple[str, int]:
        self.server = await asyncio.start_server(self._run, LOOP, 0)
        return LOOP, self.server.sockets[0].getsockname()[1]

    async def finished(self) -> None:
        """Wait until every connection's handler has returned (their tasks awaited, never polled)."""
        while self.tasks:
            await asyncio.wait(set(self.tasks))

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        await stop_server(self.server, self.tasks)


def run(coro: Awaitable[Any], timeout: float = 120) -> Any:
    """Run ``coro`` on a fresh loop; ``timeout`` is only a deadline that turns a hang into a failure."""

    async def main() -> Any:
        result = await asyncio.wait_for(coro, timeout)
        await asyncio.sleep(0)
        leaked = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert leaked == [], f"tasks left running: {leaked}"
        return result

    return asyncio.run(main())


def live_vs_file(live: list[Record], pcap: Path) -> list[Record]:
    """The records read back from ``pcap`` equal the live ones (numbers, packets, times, events, contexts)."""
    st = CaptureStats()
    back = list(read_records([str(pcap)], stats=st))
    assert st.files[str(pcap)]["error"] is None and st.files[str(pcap)]["problems"] == []
    assert len(back) == len(live)
    assert back == live
    return back


def assert_clean(recs: list[Record]) -> None:
    """Every record is a frame decoded without a problem, and the frames table agrees."""
    assert recs
    bad = [(r.number, r.event.type) for r in recs if r.event.type != "frame"]
    assert bad == []
    assert [(r.number, dissect(r.event, r.context).problems) for r in recs if dissect(r.event, r.context).problems] == []  # type: ignore[arg-type]
    assert all(p == [] for p in frames_table(recs).column("problems").to_pylist())


def tshark_agrees(pcap: Path, recs: list[Record], port: int) -> None:
    """tshark finds the same PDUs in the written capture, frame by frame."""
    pdus = tshark_frames(pcap, ports=[port])
    mine = sorted((r for r in recs if r.event.type == "frame"), key=lambda r: (r.packet, r.event.offset))
    assert len(pdus) == len(mine)
    for p, r in zip(pdus, mine, strict=True):
        fr: Any = r.event
        assert int(str(p["frame.number"])) == r.packet
        assert int(str(p["couchbase.magic"]), 16) == fr.magic
        assert int(str(p["couchbase.opcode"]), 16) == fr.opcode
        assert opaque_value(str(p["couchbase.opaque"])) == fr.opaque
        assert int(str(p["couchbase.total_bodylength"])) == fr.body_length
        if fr.is_response:
            assert int(str(p["couchbase.status"]), 16) == fr.status
        d = dissect(fr, r.context)
        if d.key and d.key_text.isprintable():
            assert p["couchbase.key"] == d.key_text


# -- byte exactness -----------------------------------------------------------
