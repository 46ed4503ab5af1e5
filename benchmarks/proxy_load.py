"""Tap proxy under load, loopback only: N concurrent connections x M MB each way, then the unhappy paths.

    python benchmarks/proxy_load.py [--conns 50] [--mb 20] [--pcap OUT]

1. Runs ``python -m dcpinspect proxy --quiet`` (decoding everything it forwards,
   optionally writing a pcap) as a child process between an echo upstream and
   ``--conns`` clients in this process; each client sends ``--mb`` MB of SET
   frames (64 KB values, written in odd chunk sizes) and reads the echo.  The
   sha256 of every byte sent, received by the upstream and echoed back is
   compared per connection; the proxy's peak RSS (VmHWM) is read before it is
   stopped with SIGTERM.
2. In-process TapProxy: upstream refused, upstream reset, half-close, client
   gone mid-frame - each with its log line, and no task left after ``stop()``.

Bounded (time limit per phase); prints a results table; exits 0 when every
check held, 1 otherwise.
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
from dcpinspect.proxy import TapProxy  # noqa: E402

LOOP = "127.0.0.1"
CHUNKS = (1, 999, 65536, 262_144, 17, 1_000_003)


def block() -> bytes:
    frames = [encode("SET", key=f"k{i}", extras={"flags": i, "expiration": 0}, value=bytes([i]) * 65_000, opaque=i) for i in range(16)]
    return b"".join(frames)


async def load(conns: int, mb: int, pcap: str | None, limit: float) -> dict[str, object]:
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
    cmd = [sys.executable, "-m", "dcpinspect", "proxy", "--listen", f"{LOOP}:0", "--upstream", f"{LOOP}:{up}", "--quiet"]
    if pcap:
        cmd += ["--pcap", pcap]
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    assert proc.stdout is not None and proc.stderr is not None
    line = (await proc.stdout.readline()).decode()
    port = int(line.rsplit(":", 1)[1])
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
    status = Path(f"/proc/{proc.pid}/status").read_text() if Path(f"/proc/{proc.pid}/status").exists() else ""
    hwm = next((int(x.split()[1]) for x in status.splitlines() if x.startswith("VmHWM:")), 0)
    proc.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
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
        "proxy exit": proc.returncode,
        "proxy log": err.decode().strip().splitlines()[-1] if err else "",
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
    log = logging.getLogger("dcpinspect.proxy")
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conns", type=int, default=50)
    ap.add_argument("--mb", type=int, default=20)
    ap.add_argument("--pcap", help="let the proxy write its capture here")
    ap.add_argument("--limit", type=float, default=300, help="seconds allowed for the load phase")
    args = ap.parse_args()
    res = asyncio.run(load(args.conns, args.mb, args.pcap, args.limit))
    print(f"## load: {args.conns} connections x {args.mb} MB each way (echo), proxy decoding{' + pcap' if args.pcap else ''}")
    for k, v in res.items():
        print(f"  {k:<22} {v:,.1f}" if isinstance(v, float) else f"  {k:<22} {v}")
    checks = asyncio.run(unhappy())
    print("## unhappy paths")
    print(f"  {'case':<28} {'ok':<5} log / detail")
    for name, ok, detail in checks:
        print(f"  {name:<28} {'yes' if ok else 'NO':<5} {detail}")
    good = res["bytes lost"] == 0 and res["connections altered"] == 0 and res["proxy exit"] == 0 and all(ok for _, ok, _ in checks)
    print("all checks held" if good else "SOME CHECKS FAILED")
    return 0 if good else 1


if __name__ == "__main__":
    raise SystemExit(main())
