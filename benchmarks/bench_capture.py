"""Capture -> frames: dcpinspect against tshark on the same generated capture.

    python benchmarks/bench_capture.py [--frames 1000000] [--big] [--keep DIR]

Writes a pcap of N DCP_MUTATION frames (several connections, interleaved,
TCP segments cut every 1448 bytes without regard to frame boundaries), then
measures in one run:

* tshark ``-T fields -e couchbase.opcode -e couchbase.vbucket`` with TCP
  desegmentation (Wireshark's couchbase dissector) - frames/s;
* ``dcpinspect.tables.export.frames_table`` (every column of the frames table) -
  frames/s and the ratio to tshark (target >= 15x);
* the streaming record iterator alone (``read_records``) - frames/s;
* peak RSS of the streaming path in a child process, for this capture and
  (``--big``) one five times larger: it should stay flat.

A benchmark, not a test: it prints and exits 0.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dcpinspect import encode
from dcpinspect.capture.pcapwrite import PcapWriter, TcpConversation

MSS = 1448
CONNS = 4


def write_capture(path: Path, frames: int) -> int:
    """Write ``frames`` mutations over CONNS interleaved connections; return the bytes of DCP payload."""
    templates = []
    for i in range(256):
        key = f"doc-{i:06d}"
        value = b'{"type":"beer","name":"n%d","abv":%d.%d,"notes":"%s"}' % (i, i % 13, i % 10, b"x" * (40 * (i % 4)))
        templates.append(
            encode(
                "DCP_MUTATION",
                extras={"by_seqno": 1, "rev_seqno": 1},
                key=key,
                value=value,
                datatype=1,
                vbucket=i % 64,
                opaque=0x1000 + i % CONNS,
                cas=0x17A0C5E8F2B40000 + i,
            )
        )
    streams = [bytearray() for _ in range(CONNS)]
    for n in range(frames):
        t = bytearray(templates[n % 256])
        t[24:32] = (n + 1).to_bytes(8, "big")
        streams[n % CONNS] += t
    ts = 1_700_000_000_000_000_000
    with PcapWriter(path) as w:
        convs = [TcpConversation(w, (f"10.0.{c}.1", 40000 + c), ("10.0.0.2", 11210), mss=MSS) for c in range(CONNS)]
        for conv in convs:
            conv.open(ts)
            ts += 10_000
        offs = [0] * CONNS
        active = list(range(CONNS))
        while active:  # interleave the connections segment by segment
            for c in list(active):
                chunk = bytes(streams[c][offs[c] : offs[c] + MSS])
                if not chunk:
                    active.remove(c)
                    continue
                offs[c] += len(chunk)
                ts = convs[c].send("s2c", chunk, ts)
        for conv in convs:
            conv.close(ts)
    return sum(len(s) for s in streams)


def time_tshark(path: Path) -> tuple[float, int] | None:
    exe = shutil.which("tshark")
    if exe is None:
        return None
    cmd = [
        exe,
        "-r",
        str(path),
        "-o",
        "tcp.desegment_tcp_streams:TRUE",
        "-d",
        "tcp.port==11210,couchbase",
        "-T",
        "fields",
        "-e",
        "couchbase.opcode",
        "-e",
        "couchbase.vbucket",
        "-E",
        "occurrence=a",
    ]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    dt = time.perf_counter() - t
    pdus = sum(len(line.split("\t")[0].split(",")) for line in proc.stdout.splitlines() if line.split("\t")[0])
    return dt, pdus


def time_table(path: Path) -> tuple[float, int]:
    from dcpinspect.tables.export import frames_table

    t = time.perf_counter()
    table = frames_table(str(path))
    return time.perf_counter() - t, table.num_rows


def time_stream(path: Path) -> tuple[float, int]:
    from dcpinspect.capture.read import read_records

    t = time.perf_counter()
    n = sum(1 for _ in read_records([str(path)]))
    return time.perf_counter() - t, n


def child_rss(path: Path, table: bool = False) -> tuple[float, str]:
    """Peak RSS (MiB) of a fresh process running the streaming path (or building the table)."""
    # VmHWM, not ru_maxrss: Linux carries the parent's high-water mark into a forked child
    work = (
        "from dcpinspect.tables.export import frames_table\nt=frames_table(sys.argv[1])\nn=t.num_rows\nextra=f'{t.nbytes/2**20:.0f}'\n"
        if table
        else "from dcpinspect.capture.read import read_records\nn=sum(1 for _ in read_records([sys.argv[1]]))\nextra=''\n"
    )
    code = (
        "import sys\n" + work + "hwm=[l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\nprint(n, hwm, extra)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True).stdout.split()
    return int(out[1]) / 1024, (out[2] if len(out) > 2 else "")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--frames", type=int, default=1_000_000)
    p.add_argument("--quick", action="store_true", help="100,000 frames")
    p.add_argument("--big", action="store_true", help="also measure RSS on a capture 5x larger")
    p.add_argument("--keep", help="write the captures here and keep them")
    args = p.parse_args()
    n = 100_000 if args.quick else args.frames
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="dcpinspect-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        cap = work / "mutations.pcap"
        t = time.perf_counter()
        payload = write_capture(cap, n)
        print(
            f"capture: {n:,} mutations, {CONNS} connections, {cap.stat().st_size / 2**20:.0f} MiB ({payload / 2**20:.0f} MiB of DCP), written in {time.perf_counter() - t:.1f}s"
        )
        ts = time_tshark(cap)
        table = time_table(cap)
        stream = time_stream(cap)
        rows = []
        if ts is not None:
            rows.append(("tshark -T fields (opcode, vbucket)", ts[1], ts[0]))
        rows.append(("dcpinspect frames table (all columns)", table[1], table[0]))
        rows.append(("dcpinspect streaming records", stream[1], stream[0]))
        print(f"{'measurement':<40} {'frames':>10} {'seconds':>9} {'frames/s':>12}  vs tshark")
        for label, count, dt in rows:
            ratio = f"{(count / dt) / (ts[1] / ts[0]):.1f}x" if ts and ts[1] else "-"
            print(f"{label:<40} {count:>10,} {dt:>9.2f} {count / dt:>12,.0f}  {ratio}")
        print("target: frames table >= 15x tshark's frames/s")
        rss, _ = child_rss(cap)
        print(f"peak RSS, streaming path: {rss:.0f} MiB for {cap.stat().st_size / 2**20:.0f} MiB")
        rss, nbytes = child_rss(cap, table=True)
        print(f"peak RSS, frames table: {rss:.0f} MiB for {cap.stat().st_size / 2**20:.0f} MiB (the Arrow table itself: {nbytes} MiB)")
        if args.big:
            big = work / "mutations-5x.pcap"
            write_capture(big, 5 * n)
            rss, _ = child_rss(big)
            print(f"peak RSS, streaming path: {rss:.0f} MiB for {big.stat().st_size / 2**20:.0f} MiB")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
