"""The tap proxy on real loopback TCP: bytes identical both ways, records equal to the written pcap, tshark agrees,
and the unhappy paths (refused upstream, reset, half-close, client gone mid-frame, a broken tap)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import logging
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from loopback import LOOP, Upstream, assert_clean, bulk, live_vs_file, read_all, requests, responses, run, send_chunks, sha, tshark_agrees
from paths import ROOT
from tshark import needs_tshark

from dcpinspect import encode
from dcpinspect.capture.read import capture_segments, read_records
from dcpinspect.cli.live import parse_address
from dcpinspect.flows.records import CaptureStats, Record
from dcpinspect.live.proxy import TapProxy
from dcpinspect.live.tap import LiveConnection
from dcpinspect.tables.columns import JSON_COLUMNS


def test_bytes_identical_both_ways_concurrent_and_records_equal_the_pcap(tmp_path: Path) -> None:
    """Several concurrent connections (one of 20 MB), both directions at once, chunked anywhere."""
    pcap = tmp_path / "tap.pcap"
    received: dict[int, tuple[str, int]] = {}
    plans = {i: (requests(300, seed=i), responses(300, seed=i)) for i in range(6)}
    plans[6] = (bulk(20_000_000), responses(50, seed=6))

    async def server(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        hello = await r.readexactly(24)  # the first request's header says which plan
        idx = struct.unpack_from(">I", hello, 12)[0] >> 24
        rest = asyncio.create_task(read_all(r))
        await send_chunks(w, plans[idx][1], seed=idx)
        w.write_eof()
        received[idx] = await rest  # everything after the first header

    async def client(port: int, idx: int) -> tuple[str, int]:
        r, w = await asyncio.open_connection(LOOP, port)
        first = bytearray(plans[idx][0])
        first[12:16] = struct.pack(">I", idx << 24)  # the opaque of the first request names the plan
        plans[idx] = (bytes(first), plans[idx][1])
        reading = asyncio.create_task(read_all(r))
        await send_chunks(w, plans[idx][0], seed=100 + idx)
        w.write_eof()  # half-close: the answers keep coming
        got = await reading
        w.close()
        await w.wait_closed()
        return got

    live: list[Record] = []
    upstream = Upstream(server)

    async def main() -> TapProxy:
        async with upstream as up:
            proxy = await TapProxy(upstream=up, pcap=pcap, on_record=live.append).start()
            results = await asyncio.gather(*(client(proxy.port, i) for i in plans))
            await upstream.finished()  # the server reads on after its own EOF
            assert await asyncio.to_thread(proxy.wait_idle, 60)  # every connection ends by FIN, none is cut by stop()
            await proxy.stop()
        for i, got in enumerate(results):
            assert got == sha(plans[i][1]), f"s2c bytes of connection {i} differ"
            assert received[i] == sha(plans[i][0][24:]), f"c2s bytes of connection {i} differ"
        return proxy

    proxy = run(main())
    assert proxy.connections == len(plans) and proxy.decode_errors == 0
    assert proxy.bytes == {"c2s": sum(len(p[0]) for p in plans.values()), "s2c": sum(len(p[1]) for p in plans.values())}
    back = live_vs_file(live, pcap)
    assert_clean(back)
    assert proxy.records == len(live)
    # each connection decodes to exactly what was sent
    by_conn: dict[tuple[int, str], bytes] = {}
    for r in back:
        by_conn[r.conn, r.direction] = by_conn.get((r.conn, r.direction), b"") + r.event.raw  # type: ignore[union-attr]
    sent = {p[0] for p in plans.values()} | {p[1] for p in plans.values()}
    assert set(by_conn.values()) == sent


@needs_tshark
def test_tshark_agrees_with_the_written_capture(tmp_path: Path) -> None:
    pcap = tmp_path / "tap.pcap"
    c2s, s2c = requests(150, seed=1, big=200_000), responses(150, seed=1, big=100_000)

    async def server(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        got = await r.readexactly(len(c2s))
        assert got == c2s
        await send_chunks(w, s2c, seed=3)

    live: list[Record] = []

    async def main() -> int:
        async with Upstream(server) as up:
            proxy = await TapProxy(upstream=up, pcap=pcap, on_record=live.append).start()
            r, w = await asyncio.open_connection(LOOP, proxy.port)
            await send_chunks(w, c2s, seed=2)
            assert await r.readexactly(len(s2c)) == s2c
            w.close()
            await w.wait_closed()
            assert await asyncio.to_thread(proxy.wait_idle, 60)  # closed by FIN both ways, not cut by stop()
            await proxy.stop()
            return up[1]

    port = run(main())
    back = live_vs_file(live, pcap)
    assert_clean(back)
    assert len(back) == 300
    tshark_agrees(pcap, back, port)


# -- unhappy paths ------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOP, 0))
        return int(s.getsockname()[1])


def test_refused_upstream_closes_the_client_with_a_clear_log_line(caplog: pytest.LogCaptureFixture) -> None:
    port = _free_port()  # nothing listens there

    async def main() -> TapProxy:
        proxy = await TapProxy(upstream=(LOOP, port)).start()
        r, w = await asyncio.open_connection(LOOP, proxy.port)
        w.write(encode("GET", key="k"))
        with contextlib.suppress(ConnectionError):
            assert await asyncio.wait_for(r.read(), 30) == b""
        w.close()
        await proxy.stop()
        return proxy

    with caplog.at_level(logging.WARNING, logger="dcpinspect.live.proxy"):
        proxy = run(main())
    assert proxy.refused == 1
    assert any(f"upstream {LOOP}:{port} unreachable" in m and "client connection closed" in m for m in caplog.messages), caplog.messages


def _rst(w: asyncio.StreamWriter) -> None:
    w.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    w.transport.abort()


def test_upstream_reset_is_passed_on_and_recorded(tmp_path: Path) -> None:
    pcap = tmp_path / "rst.pcap"
    reply = encode("GET", response=True, value=b"v" * 100, opaque=1)
    replied = asyncio.Event()

    async def server(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readexactly(len(encode("GET", key="k", opaque=1)))
        w.write(reply)
        await w.drain()
        await replied.wait()  # the reply went through the proxy to the client: only now the reset
        _rst(w)

    live: list[Record] = []

    async def main() -> type[BaseException] | None:
        async with Upstream(server) as up:
            proxy = await TapProxy(upstream=up, pcap=pcap, on_record=live.append).start()
            r, w = await asyncio.open_connection(LOOP, proxy.port)
            w.write(encode("GET", key="k", opaque=1))
            assert await r.readexactly(len(reply)) == reply
            replied.set()
            err: type[BaseException] | None = None
            try:
                rest = await asyncio.wait_for(r.read(), 30)
                assert rest == b""
            except ConnectionResetError as exc:
                err = type(exc)
            w.close()
            await proxy.stop()
            assert not proxy._tasks
            return err

    err = run(main())
    assert err is ConnectionResetError  # the client sees the reset, not a clean EOF
    back = live_vs_file(live, pcap)
    assert [r.event.name for r in back if r.event.type == "frame"] == ["GET", "GET"]  # type: ignore[union-attr]


def test_client_reset_is_passed_on() -> None:
    seen: list[str] = []
    request = encode("GET", key="k")
    forwarded, ended = asyncio.Event(), asyncio.Event()

    async def server(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            await r.readexactly(len(request))
            forwarded.set()
            data = await r.read()
            seen.append(f"eof after {len(data)}")
        except ConnectionResetError:
            seen.append("reset")
        finally:
            ended.set()

    async def main() -> None:
        async with Upstream(server) as up:
            proxy = await TapProxy(upstream=up).start()
            _, w = await asyncio.open_connection(LOOP, proxy.port)
            w.write(request)
            await w.drain()
            await forwarded.wait()  # the proxy passed the request on: now the reset
            _rst(w)
            await ended.wait()  # the server saw how its connection ended
            await proxy.stop()

    run(main())
    assert seen == ["reset"]


def test_half_close_keeps_the_other_direction_running() -> None:
    """The server answers only after the client's EOF (a sink that replies with its digest)."""
    data = requests(500, seed=9)

    async def server(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        digest, n = await read_all(r)  # until the client's FIN, passed on by the proxy
        for _ in range(200):
            w.write(encode("STAT", response=True, key="sha256", value=digest.encode(), opaque=n))
            await w.drain()

    async def main() -> tuple[list[Any], TapProxy]:
        out: list[Any] = []
        async with Upstream(server) as up:
            proxy = await TapProxy(upstream=up, on_record=out.append).start()
            r, w = await asyncio.open_connection(LOOP, proxy.port)
            await send_chunks(w, data, seed=1)
            w.write_eof()
            answer = await asyncio.wait_for(r.read(), 10)
            w.close()
            await proxy.stop()
        return [answer, out], proxy

    (answer, recs), _ = run(main())
    one = encode("STAT", response=True, key="sha256", value=hashlib.sha256(data).hexdigest().encode(), opaque=len(data))
    assert answer == one * 200
    assert sum(1 for r in recs if r.direction == "s2c") == 200


def test_client_gone_mid_frame(tmp_path: Path) -> None:
    pcap = tmp_path / "cut.pcap"
    frame = encode("SET", key="k", extras={"flags": 0, "expiration": 0}, value=b"x" * 1000, opaque=5)
    sent = frame + frame[:500]
    got: list[bytes] = []
    ended = asyncio.Event()

    async def server(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            got.append(await r.read())
        finally:
            ended.set()

    live: list[Record] = []

    async def main() -> None:
        async with Upstream(server) as up:
            proxy = await TapProxy(upstream=up, pcap=pcap, on_record=live.append).start()
            _, w = await asyncio.open_connection(LOOP, proxy.port)
            w.write(sent)
            await w.drain()
            w.close()
            await w.wait_closed()
            await ended.wait()  # the server read up to the EOF the proxy passed on
            assert await asyncio.to_thread(proxy.wait_idle, 60)  # the proxy closed the connection itself
            await proxy.stop()

    run(main())
    assert got == [sent]
    back = live_vs_file(live, pcap)
    assert [(r.direction, r.event.type, r.event.length) for r in back] == [("c2s", "frame", len(frame)), ("c2s", "truncated", 500)]


def test_a_broken_tap_never_touches_forwarding(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    data = requests(200, seed=4)

    def boom(self: LiveConnection, direction: str, data: bytes, ts: int | None = None) -> None:
        raise ValueError("decoder exploded")

    monkeypatch.setattr(LiveConnection, "data", boom)

    async def server(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while chunk := await r.read(65536):
            w.write(chunk)
            await w.drain()

    def bad_consumer(rec: Record) -> None:
        raise RuntimeError("consumer bug")

    async def main() -> TapProxy:
        async with Upstream(server) as up:
            proxy = await TapProxy(upstream=up, on_record=bad_consumer).start()
            r, w = await asyncio.open_connection(LOOP, proxy.port)
            reading = asyncio.create_task(read_all(r))
            await send_chunks(w, data, seed=5)
            w.write_eof()
            assert await reading == sha(data)
            w.close()
            await proxy.stop()
        return proxy

    with caplog.at_level(logging.ERROR, logger="dcpinspect.live.proxy"):
        proxy = run(main())
    assert proxy.decode_errors == 1  # logged once, then the tap of that connection is off
    assert any("decoder exploded" in m and "forwarding goes on" in m for m in caplog.messages)


def test_stop_with_open_connections_leaks_nothing(tmp_path: Path) -> None:
    noop = encode("NOOP")
    arrived: list[bytes] = []
    all_arrived = asyncio.Event()

    async def server(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        arrived.append(await r.readexactly(len(noop)))
        if len(arrived) == 5:
            all_arrived.set()
        await r.read()

    async def main() -> None:
        async with Upstream(server) as up:
            proxy = await TapProxy(upstream=up, pcap=tmp_path / "x.pcap").start()
            conns = [await asyncio.open_connection(LOOP, proxy.port) for _ in range(5)]
            for _, w in conns:
                w.write(noop)
                await w.drain()
            await all_arrived.wait()  # each NOOP was forwarded, so queued for the tap before it
            await proxy.stop()  # connections still open: cancelled, capture flushed
            for r, w in conns:
                with contextlib.suppress(ConnectionError):
                    await asyncio.wait_for(r.read(), 30)
                w.close()

    run(main())  # asserts no task is left
    recs = list(read_records([str(tmp_path / "x.pcap")]))
    assert [r.event.name for r in recs] == ["NOOP"] * 5  # type: ignore[union-attr]


def test_background_thread_from_sync_code() -> None:
    """Synchronous code (blocking sockets) uses the proxy through its own loop thread."""
    stop = threading.Event()
    srv = socket.create_server((LOOP, 0))

    def echo() -> None:
        srv.settimeout(30)
        conn, _ = srv.accept()
        with conn:
            while chunk := conn.recv(65536):
                conn.sendall(chunk)
        stop.set()

    t = threading.Thread(target=echo, daemon=True)
    t.start()
    recs: list[Record] = []
    data = requests(100, seed=8)
    with (
        TapProxy(upstream=srv.getsockname(), on_record=recs.append).background() as proxy,
        socket.create_connection((LOOP, proxy.port)) as c,
    ):
        c.sendall(data)
        c.shutdown(socket.SHUT_WR)
        got = bytearray()
        while chunk := c.recv(65536):
            got += chunk
    assert stop.wait(30)  # the echo thread saw the proxy's FIN
    t.join(30)
    srv.close()
    assert bytes(got) == data
    assert sum(1 for r in recs if r.event.type == "frame") == 200


def test_parse_address_for_listening_and_upstream() -> None:
    """The proxy's two addresses use the one syntax (the full table is in test_cli_live.py)."""
    assert parse_address("127.0.0.1:0", listen=True) == ("127.0.0.1", 0)
    assert parse_address("[::1]:11210") == ("::1", 11210)
    assert parse_address("11210") == parse_address(":11210") == ("127.0.0.1", 11210)
    for bad in ("host", "host:", "h:70000", ":0"):
        with pytest.raises(ValueError):
            parse_address(bad)


# -- command line -------------------------------------------------------------


def _echo_server() -> tuple[socket.socket, threading.Thread]:
    srv = socket.create_server((LOOP, 0))

    def serve() -> None:
        srv.settimeout(60)  # a deadline only (it includes the proxy's start-up)
        with contextlib.suppress(OSError):
            conn, _ = srv.accept()
            with conn:
                while chunk := conn.recv(65536):
                    conn.sendall(chunk)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return srv, t


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "text"])
def test_cli_prints_its_address_first_and_flushes_on_sigterm(tmp_path: Path, as_json: bool) -> None:
    pcap = tmp_path / "cli.pcap"
    srv, _ = _echo_server()
    up = srv.getsockname()
    cmd = [sys.executable, "-m", "dcpinspect", "proxy", "--listen", "127.0.0.1:0", "--upstream", f"{up[0]}:{up[1]}", "--pcap", str(pcap)]
    if as_json:
        cmd.append("--json")
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("listening on 127.0.0.1:")
        port = int(first.rsplit(":", 1)[1])
        assert port != 0
        frames = encode("SET", key="a", extras={"flags": 0, "expiration": 0}, value=b"1", opaque=1) + encode("GET", key="a", opaque=2)
        with socket.create_connection((LOOP, port)) as c:
            c.sendall(frames)
            c.shutdown(socket.SHUT_WR)
            got = b""
            while chunk := c.recv(65536):
                got += chunk
        assert got == frames
        lines = [proc.stdout.readline() for _ in range(4)]  # 2 frames each way (the echo)
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        srv.close()
    assert proc.returncode == 0, err
    assert rest == ""
    if as_json:
        rows = [json.loads(line) for line in lines]
        assert all(tuple(row) == JSON_COLUMNS for row in rows)
        assert [(row["dir"], row["name"], row["key"], row["problems"]) for row in rows] == [
            ("c2s", "SET", "a", []),
            ("c2s", "GET", "a", []),
            ("s2c", "SET", "a", []),
            ("s2c", "GET", "a", []),
        ]
    else:
        assert "c2s SET request vb=0 opaque=0x00000001 key='a'" in lines[0]
    recs = list(read_records([str(pcap)]))
    assert [r.event.name for r in recs] == ["SET", "GET", "SET", "GET"]  # type: ignore[union-attr]
    assert "stopped: 1 connection, " in err


def test_cli_bad_address_exits_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dcpinspect", "proxy", "--listen", "nonsense", "--upstream", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 2 and "bad address 'nonsense'" in proc.stderr and proc.stderr.count("\n") == 1


# -- forwarding never waits on output or decoding --------------------------------------------------------------


def small_sets(n: int) -> bytes:
    """``n`` SET requests with 100-byte values: many records per MB."""
    return b"".join(encode("SET", key=f"k{i}", extras={"flags": 0, "expiration": 0}, value=b"v" * 100, opaque=i) for i in range(n))


async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    while chunk := await r.read(65536):
        w.write(chunk)
        await w.drain()
    w.write_eof()


async def transfer(port: int, data: bytes) -> bytes:
    """Send ``data`` through the proxy to the echo upstream (half-closing), return what came back."""
    r, w = await asyncio.open_connection(LOOP, port)
    reading = asyncio.create_task(r.read(-1))
    w.write(data)
    await w.drain()
    w.write_eof()
    got = await reading
    w.close()
    await w.wait_closed()
    return got


class BlockedOutput:
    """A text stream whose write() blocks until ``release`` is set (a paused pager)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()

    def write(self, text: str) -> int:
        self.entered.set()
        self.release.wait()
        return len(text)

    def flush(self) -> None:
        pass


def test_blocked_output_never_stops_forwarding() -> None:
    """Records print on a thread of their own: an output that never returns drops records (counted), never bytes."""
    from dcpinspect.cli.live import stopped_line
    from dcpinspect.cli.output import RecordPrinter

    data = small_sets(30_000)  # 4 MB, 60,000 records with the echo
    out = BlockedOutput()
    printer = RecordPrinter(out, as_json=False, limit=100)  # type: ignore[arg-type]

    async def main() -> TapProxy:
        async with Upstream(echo) as up:
            proxy = await TapProxy(upstream=up, on_record=printer.add).start()
            assert await transfer(proxy.port, data) == data
            await asyncio.to_thread(out.entered.wait, 30)  # the printer is stuck in write()
            assert out.entered.is_set()
            assert await asyncio.wait_for(transfer(proxy.port, encode("NOOP", opaque=9)), 30) == encode("NOOP", opaque=9)
            await proxy.wait_decoded()
            await proxy.stop()
        return proxy

    try:
        proxy = run(main())
        assert proxy.records == 60_002 and proxy.tap_skipped == 0
        assert printer.dropped > 0
        assert not printer.close(timeout=0.01)  # the output is still blocked: close() does not hang
        line = stopped_line(proxy, printer, flushed=False)
        assert f"{printer.dropped} records not shown" in line and "still blocked" in line
    finally:
        out.release.set()
    assert printer.close(timeout=30)


def test_blocked_stderr_never_blocks_logging() -> None:
    """The proxy's log lines go through a bounded queue too: a stderr that never returns drops lines, never blocks a caller."""
    import logging

    from dcpinspect.cli.output import LogLines, QueuedLogHandler

    err = BlockedOutput()
    lines = LogLines(err, prefix="dcpinspect proxy: ")  # type: ignore[arg-type]
    logger = logging.getLogger("dcpinspect.test-blocked-stderr")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = QueuedLogHandler(lines)
    logger.addHandler(handler)
    try:
        for i in range(5_000):  # would block on the first line if written on this thread
            logger.info("connection %d from %s", i, "\x1b[31mpeer")
        assert err.entered.wait(30)
        assert lines.dropped > 0 and len(lines.queue) <= lines.limit
        assert not lines.close(timeout=0.01)
    finally:
        logger.removeHandler(handler)
        err.release.set()
    assert lines.close(timeout=30)


def test_log_lines_are_escaped_and_announce_drops() -> None:
    import logging

    from dcpinspect.cli.output import LogLines, QueuedLogHandler

    out = io.StringIO()
    lines = LogLines(out, prefix="p: ")
    lines.dropped = lines._unannounced = 3
    logger = logging.getLogger("dcpinspect.test-log-lines")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = QueuedLogHandler(lines)
    logger.addHandler(handler)
    try:
        logger.info("from %s", "\x1b[2Jevil")
    finally:
        logger.removeHandler(handler)
    assert lines.close(timeout=30)
    text = out.getvalue()
    assert "\x1b" not in text and "p: from " in text
    assert "p: 3 log lines not shown (stderr could not keep up)" in text


def test_cli_with_stdout_never_read_forwards_and_reports_drops() -> None:
    """``dcpinspect proxy | pager`` with the pager paused: the pipe fills, forwarding goes on, the drops are in the summary."""
    data = small_sets(30_000)

    async def main() -> tuple[int | None, bytes]:
        async with Upstream(echo) as up:
            cmd = ["-m", "dcpinspect", "proxy", "--listen", "127.0.0.1:0", "--upstream", f"{up[0]}:{up[1]}"]
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            proc = await asyncio.create_subprocess_exec(
                sys.executable, *cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=env
            )
            try:
                assert proc.stdout is not None
                port = int((await proc.stdout.readline()).decode().rsplit(":", 1)[1])  # then stdout is not read until the end
                assert await transfer(port, data) == data
                assert await asyncio.wait_for(transfer(port, encode("NOOP", opaque=9)), 30) == encode("NOOP", opaque=9)
                proc.send_signal(signal.SIGTERM)
                _, err = await asyncio.wait_for(proc.communicate(), 60)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
        return proc.returncode, err

    code, err = run(main(), timeout=120)
    assert code == 0, err
    summary = [line for line in err.decode().splitlines() if "stopped:" in line]
    assert len(summary) == 1 and "records not shown (the output could not keep up)" in summary[0], err
    assert "60002 records" in summary[0]


# -- not memcached binary: forwarded exactly, decoded a bounded amount, said once ------------------------------


def client_hello() -> bytes:
    """A TLS 1.2 record carrying a ClientHello (what a TLS client sends first)."""
    rnd = random.Random(5)
    body = b"\x03\x03" + rnd.randbytes(32) + b"\x00" + b"\x00\x04\x13\x01\x00\xff" + b"\x01\x00" + b"\x00\x00"
    hs = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + len(hs).to_bytes(2, "big") + hs


@pytest.mark.parametrize("kind", ["tls", "random"])
def test_not_memcached_is_forwarded_exactly_and_said_once(tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture) -> None:
    from dcpinspect.live.tap import JUNK_LIMIT

    rnd = random.Random(11)
    data = (client_hello() if kind == "tls" else b"") + rnd.randbytes(2_000_000)
    recs: list[Record] = []

    async def main() -> TapProxy:
        async with Upstream(echo) as up:
            proxy = await TapProxy(upstream=up, on_record=recs.append, pcap=tmp_path / "x.pcap").start()
            assert await transfer(proxy.port, data) == data
            await proxy.stop()
        return proxy

    with caplog.at_level(logging.INFO, logger="dcpinspect.live.proxy"):
        proxy = run(main())
    notices = [m for m in caplog.messages if "not decoded" in m and "stopped" not in m]
    why = "TLS" if kind == "tls" else "not memcached binary"
    assert len(notices) == 1 and f": {why}, not decoded" in notices[0], notices
    assert proxy.undecoded == 1 and proxy.bytes == {"c2s": len(data), "s2c": len(data)}
    decoded = sum(r.event.length for r in recs)
    assert decoded == 0 if kind == "tls" else 0 < decoded <= 4 * JUNK_LIMIT
    streams: dict[int, bytearray] = {}
    for seg in capture_segments([str(tmp_path / "x.pcap")], CaptureStats()):  # the pcap holds every byte, in order
        streams.setdefault(seg.sport, bytearray()).extend(seg.payload)
    assert sorted(map(bytes, streams.values())) == [data, data]


def test_sasl_request_reflected_by_the_upstream_is_masked_in_the_pcap(tmp_path: Path) -> None:
    """An upstream that echoes: the SASL request comes back server-to-client, and is masked there too."""
    pcap = tmp_path / "echo.pcap"
    auth = encode("SASL_AUTH", key="PLAIN", value=b"\x00bob\x00hunter2-secret", opaque=1)

    async def main() -> None:
        async with Upstream(echo) as up:
            proxy = await TapProxy(upstream=up, pcap=pcap).start()
            assert await transfer(proxy.port, auth) == auth
            await proxy.stop()

    run(main())
    assert b"hunter2" not in pcap.read_bytes()
    back = [(r.direction, r.event.raw) for r in read_records([str(pcap)])]  # type: ignore[union-attr]
    masked = auth.replace(b"hunter2-secret", b"*" * 14)
    assert back == [("c2s", masked), ("s2c", masked)]
