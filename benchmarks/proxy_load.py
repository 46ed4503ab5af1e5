"""Tap proxy under load, loopback only: N concurrent connections x M MB each way, then the unhappy paths.

    python benchmarks/proxy_load.py [--conns 50] [--mb 20] [--pcap OUT]
        [--concurrent 600] [--concurrent-kb 1024] [--churn 20000] [--root TREE]

1. Runs ``python -m dcpinspect proxy --quiet`` (decoding everything it forwards,
   optionally writing a pcap) as a child process between an echo upstream and
   ``--conns`` clients in this process; each client sends ``--mb`` MB of SET
   frames (64 KB values, written in odd chunk sizes) and reads the echo.  The
   sha256 of every byte sent, received by the upstream and echoed back is
   compared per connection; the proxy's peak RSS (VmHWM) and its RSS once
   every connection closed are read before it is stopped with SIGTERM.
2. ``--concurrent`` connections open at once (each moves ``--concurrent-kb``
   KB each way and stays open until all have): byte-exactness, peak RSS, RSS
   per open connection, RSS after they all closed.
3. ``--churn`` short connections (a NOOP and its echo each, 32 at a time):
   byte-exactness and the proxy's RSS every 2,000 connections, RSS per 1,000
   closed connections (the slope over the second half: flat means nothing is
   kept per closed connection).
4. In-process TapProxy: upstream refused, upstream reset, half-close, client
   gone mid-frame - each with its log line, and no task left after ``stop()``.

``--root`` runs the proxy from another source tree (a checkout of an older
version, for before/after numbers).  Bounded (time limit per phase); prints a
results table; exits 0 when every check held, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import logging
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dcpinspect import encode  # noqa: E402
from dcpinspect.live.proxy import TapProxy  # noqa: E402

LOOP = "127.0.0.1"
CHUNKS = (1, 999, 65536, 262_144, 17, 1_000_003)


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in KiB."""
    path = Path(f"/proc/{pid}/status")
    text = path.read_text() if path.exists() else ""
    return {x.split(":")[0]: int(x.split()[1]) for x in text.splitlines() if x.startswith(("VmRSS:", "VmHWM:"))}


async def settled_rss(pid: int, rounds: int = 20) -> int:
    """The process's RSS (KiB) once it stops shrinking (it frees what closed connections held)."""
    last = proc_status(pid).get("VmRSS", 0)
    for _ in range(rounds):
        await asyncio.sleep(0.25)
        now = proc_status(pid).get("VmRSS", 0)
        if now >= last:
            return now
        last = now
    return last


async def start_proxy(up: int, root: Path, pcap: str | None = None) -> tuple[asyncio.subprocess.Process, int]:
    cmd = [sys.executable, "-m", "dcpinspect", "proxy", "--listen", f"{LOOP}:0", "--upstream", f"{LOOP}:{up}", "--quiet"]
    if pcap:
        cmd += ["--pcap", pcap]
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=root, env={"PYTHONPATH": str(root)}
    )
    assert proc.stdout is not None and proc.stderr is not None
    line = (await proc.stdout.readline()).decode()
    _LOGS[proc.pid] = asyncio.create_task(_last_line(proc.stderr))  # read on: a full stderr pipe would stall the proxy's log
    return proc, int(line.rsplit(":", 1)[1])


_LOGS: dict[int, asyncio.Task[str]] = {}


async def _last_line(stream: asyncio.StreamReader) -> str:
    last = ""
    while line := await stream.readline():
        last = line.decode().strip()
    return last


async def stop_proxy(proc: asyncio.subprocess.Process) -> tuple[int | None, str]:
    proc.send_signal(signal.SIGTERM)
    await asyncio.wait_for(proc.wait(), 60)
    return proc.returncode, await _LOGS.pop(proc.pid)


async def echo_server() -> tuple[asyncio.Server, int]:
    async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(1 << 16):
                w.write(data)
                await w.drain()
            w.write_eof()
        except ConnectionError:
            pass
        finally:
            w.close()

    server = await asyncio.start_server(echo, LOOP, 0)
    return server, server.sockets[0].getsockname()[1]


async def concurrent(conns: int, kb: int, root: Path, limit: float) -> dict[str, object]:
    """``conns`` connections open at once, each moving ``kb`` KB each way; RSS while open and after all closed."""
    server, up = await echo_server()
    proc, port = await start_proxy(up, root)
    base = await settled_rss(proc.pid)
    unit = encode("SET", key="k", extras={"flags": 0, "expiration": 0}, value=b"\xa5" * 16_000, opaque=1)
    data = unit * max(1, kb * 1024 // len(unit))
    all_moved = asyncio.Event()
    moved = 0
    bad = 0

    async def client() -> None:
        nonlocal moved, bad
        r, w = await asyncio.open_connection(LOOP, port)
        reading = asyncio.create_task(r.readexactly(len(data)))
        for off in range(0, len(data), 65536):
            w.write(data[off : off + 65536])
            await w.drain()
        if await reading != data:
            bad += 1
        moved += 1
        if moved == conns:
            all_moved.set()
        await all_moved.wait()  # every connection stays open until all have moved their bytes
        w.close()
        await w.wait_closed()

    t0 = time.perf_counter()
    tasks = [asyncio.create_task(client()) for _ in range(conns)]
    await asyncio.wait_for(all_moved.wait(), limit)
    open_rss = proc_status(proc.pid).get("VmRSS", 0)
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - t0
    after = await settled_rss(proc.pid)
    hwm = proc_status(proc.pid).get("VmHWM", 0)
    code, last = await stop_proxy(proc)
    server.close()
    await server.wait_closed()
    return {
        "connections open at once": conns,
        "bytes each way": conns * len(data),
        "seconds": elapsed,
        "connections altered": bad,
        "proxy RSS before MB": base / 1024,
        "proxy RSS all open MB": open_rss / 1024,
        "proxy peak RSS MB": hwm / 1024,
        "peak KB per open conn": (hwm - base) / conns,
        "proxy RSS after close MB": after / 1024,
        "proxy exit": code,
        "proxy log": last,
    }


async def churn(total: int, root: Path, limit: float, parallel: int = 32) -> dict[str, object]:
    """``total`` short connections (a NOOP and its echo each); the proxy's RSS every 2,000."""
    server, up = await echo_server()
    proc, port = await start_proxy(up, root)
    noop = encode("NOOP", opaque=0x5EED)
    done = 0
    bad = 0
    samples: list[tuple[int, int]] = [(0, await settled_rss(proc.pid))]
    sem = asyncio.Semaphore(parallel)

    async def one() -> None:
        nonlocal done, bad
        async with sem:
            r, w = await asyncio.open_connection(LOOP, port)
            w.write(noop)
            w.write_eof()
            if await r.read() != noop:
                bad += 1
            w.close()
            await w.wait_closed()
            done += 1

    t0 = time.perf_counter()
    step = 2000
    for start in range(0, total, step):
        await asyncio.wait_for(asyncio.gather(*(one() for _ in range(min(step, total - start)))), limit)
        samples.append((done, await settled_rss(proc.pid, rounds=4)))
    elapsed = time.perf_counter() - t0
    hwm = proc_status(proc.pid).get("VmHWM", 0)
    code, last = await stop_proxy(proc)
    server.close()
    await server.wait_closed()
    half = [x for x in samples if x[0] >= total // 2] or samples
    slope = (half[-1][1] - half[0][1]) / max(1, (half[-1][0] - half[0][0]) / 1000)
    return {
        "connections": total,
        "seconds": elapsed,
        "connections altered": bad,
        "RSS MB at 0/25/50/75/100%": " / ".join(f"{samples[round(i * (len(samples) - 1) / 4)][1] / 1024:.1f}" for i in range(5)),
        "RSS KB per 1,000 closed": slope,
        "proxy peak RSS MB": hwm / 1024,
        "proxy exit": code,
        "proxy log": last,
    }


def block() -> bytes:
    frames = [encode("SET", key=f"k{i}", extras={"flags": i, "expiration": 0}, value=bytes([i]) * 65_000, opaque=i) for i in range(16)]
    return b"".join(frames)


async def load(conns: int, mb: int, pcap: str | None, limit: float, root: Path = ROOT) -> dict[str, object]:
    received: dict[int, tuple[str, int]] = {}

    async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        h, n = hashlib.sha256(), 0
        idx = -1
        try:
            while data := await r.read(1 << 20):
                if idx < 0:
                    idx = struct.unpack_from(">I", data, 12)[0]  # the first frame's opaque names the connection
                h.update(data)
                n += len(data)
                w.write(data)
                await w.drain()
            w.write_eof()
        finally:
            received[idx] = (h.hexdigest(), n)
            w.close()

    server = await asyncio.start_server(echo, LOOP, 0)
    up = server.sockets[0].getsockname()[1]
    proc, port = await start_proxy(up, root, pcap)
    unit = block()
    reps = max(1, -(-mb * 1_000_000 // len(unit)))  # at least ``mb`` MB

    async def client(i: int) -> tuple[tuple[str, int], tuple[str, int]]:
        r, w = await asyncio.open_connection(LOOP, port)
        first = bytearray(unit)
        first[12:16] = struct.pack(">I", i)
        sent, got = hashlib.sha256(), hashlib.sha256()
        n_got = 0

        async def reader() -> None:
            nonlocal n_got
            while data := await r.read(1 << 20):
                got.update(data)
                n_got += len(data)

        rt = asyncio.create_task(reader())
        k = 0
        for rep in range(reps):
            data = bytes(first) if rep == 0 else unit
            sent.update(data)
            pos = 0
            while pos < len(data):
                step = CHUNKS[(i + k) % len(CHUNKS)]
                k += 1
                w.write(data[pos : pos + step])
                pos += step
                await w.drain()
        w.write_eof()
        await rt
        w.close()
        return (sent.hexdigest(), reps * len(unit)), (got.hexdigest(), n_got)

    t0 = time.perf_counter()
    results = await asyncio.wait_for(asyncio.gather(*(client(i) for i in range(conns))), limit)
    elapsed = time.perf_counter() - t0
    for _ in range(200):
        if len(received) >= conns:
            break
        await asyncio.sleep(0.01)
    after = await settled_rss(proc.pid)
    hwm = proc_status(proc.pid).get("VmHWM", 0)
    code, last = await stop_proxy(proc)
    server.close()
    await server.wait_closed()
    lost = altered = 0
    for i, (sent, got) in enumerate(results):
        for a, b in ((sent, received.get(i, ("", 0))), (sent, got)):
            if a[1] != b[1]:
                lost += abs(a[1] - b[1])
            elif a[0] != b[0]:
                altered += 1
    total = sum(s[1] for s, _ in results)
    return {
        "connections": conns,
        "bytes each way": total,
        "seconds": elapsed,
        "MB/s each way": total / elapsed / 1e6,
        "bytes lost": lost,
        "connections altered": altered,
        "proxy peak RSS MB": hwm / 1024,
        "proxy RSS after close MB": after / 1024,
        "proxy exit": code,
        "proxy log": last,
    }


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def unhappy() -> list[tuple[str, bool, str]]:
    out: list[tuple[str, bool, str]] = []
    handler = Lines()
    log = logging.getLogger("dcpinspect.live.proxy")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False

    def last(word: str) -> str:
        return next((m for m in reversed(handler.lines) if word in m), "(no log line)")

    # refused
    with socket.socket() as s:
        s.bind((LOOP, 0))
        dead = s.getsockname()[1]
    proxy = await TapProxy(upstream=(LOOP, dead)).start()
    r, w = await asyncio.open_connection(LOOP, proxy.port)
    with contextlib.suppress(ConnectionError):
        eof = await asyncio.wait_for(r.read(), 5) == b""
    w.close()
    await proxy.stop()
    out.append(("upstream refused", eof and proxy.refused == 1, last("unreachable")))

    async def rst_server(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.read(24)
        w.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        w.transport.abort()

    async def sink_then_reply(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        data = await r.read()
        w.write(hashlib.sha256(data).digest())
        await w.drain()
        w.close()

    async def sink(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        got.append(await r.read())
        w.close()

    got: list[bytes] = []
    for name, handler_fn in (("upstream reset", rst_server), ("half-close", sink_then_reply), ("client gone mid-frame", sink)):
        srv = await asyncio.start_server(handler_fn, LOOP, 0)
        proxy = await TapProxy(upstream=srv.sockets[0].getsockname()[:2], on_record=lambda r: None).start()
        r, w = await asyncio.open_connection(LOOP, proxy.port)
        frame = encode("SET", key="k", extras={"flags": 0, "expiration": 0}, value=b"x" * 5000)
        ok = False
        if name == "upstream reset":
            w.write(frame)
            try:
                await asyncio.wait_for(r.read(), 5)
            except ConnectionResetError:
                ok = True
            detail = last("reset")
        elif name == "half-close":
            w.write(frame * 100)
            w.write_eof()
            ok = await asyncio.wait_for(r.read(), 5) == hashlib.sha256(frame * 100).digest()
            detail = "reply arrived after the client's EOF"
        else:
            w.write(frame + frame[:1000])
            await w.drain()
            w.close()
            for _ in range(300):
                if got:
                    break
                await asyncio.sleep(0.01)
            ok = got == [frame + frame[:1000]]
            detail = f"upstream got {len(got[0]) if got else 0} bytes then EOF; records: {proxy.records} (frame + truncated)"
            ok = ok and proxy.records == 2
        w.close()
        await proxy.stop()
        srv.close()
        await srv.wait_closed()
        out.append((name, ok, detail))
    await asyncio.sleep(0)
    leaked = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    out.append(("no tasks left after stop()", not leaked, f"{len(leaked)} tasks"))
    log.removeHandler(handler)
    return out


def _table(title: str, res: dict[str, object]) -> None:
    print(title)
    for k, v in res.items():
        print(f"  {k:<28} {v:,.1f}" if isinstance(v, float) else f"  {k:<28} {v}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conns", type=int, default=50)
    ap.add_argument("--mb", type=int, default=20)
    ap.add_argument("--pcap", help="let the proxy write its capture here")
    ap.add_argument("--limit", type=float, default=300, help="seconds allowed for each load phase")
    ap.add_argument("--concurrent", type=int, default=600, help="connections open at once (0: skip)")
    ap.add_argument("--concurrent-kb", type=int, default=1024, help="KB each of them moves each way")
    ap.add_argument("--churn", type=int, default=20_000, help="short connections, one after another (0: skip)")
    ap.add_argument("--root", type=Path, default=ROOT, help="source tree the proxy runs from")
    args = ap.parse_args()
    good = True
    if args.conns:
        res = asyncio.run(load(args.conns, args.mb, args.pcap, args.limit, args.root))
        _table(f"## load: {args.conns} connections x {args.mb} MB each way (echo), proxy decoding{' + pcap' if args.pcap else ''}", res)
        good = good and res["bytes lost"] == 0 and res["connections altered"] == 0 and res["proxy exit"] == 0
    if args.concurrent:
        res = asyncio.run(concurrent(args.concurrent, args.concurrent_kb, args.root, args.limit))
        _table(f"## {args.concurrent} connections open at once, {args.concurrent_kb} KB each way each", res)
        good = good and res["connections altered"] == 0 and res["proxy exit"] == 0
    if args.churn:
        res = asyncio.run(churn(args.churn, args.root, args.limit))
        _table(f"## churn: {args.churn:,} short connections (NOOP + echo), 32 at a time", res)
        good = good and res["connections altered"] == 0 and res["proxy exit"] == 0
    if args.root == ROOT:
        checks = asyncio.run(unhappy())
        print("## unhappy paths")
        print(f"  {'case':<28} {'ok':<5} log / detail")
        for name, ok, detail in checks:
            print(f"  {name:<28} {'yes' if ok else 'NO':<5} {detail}")
        good = good and all(ok for _, ok, _ in checks)
    print("all checks held" if good else "SOME CHECKS FAILED")
    return 0 if good else 1


if __name__ == "__main__":
    raise SystemExit(main())
