"""Hostile capture files through both capture paths: 0 failures expected.

    python benchmarks/fuzz_captures.py [--count 5000] [--seed 11] [--memory-mib 200]

Writes a small valid pcap (dcpinspect.capture.pcapwrite) and a pcapng version of it
(nanosecond ``if_tsresol``), then corrupts copies - random bytes overwritten,
truncation, and damage aimed at the fields that declare lengths and times
(pcap snaplen, record lengths and times; pcapng block lengths, packet
timestamps, ``if_tsresol``; a block or record appended that claims more than
the file holds) - and reads each, followed by an intact capture, through

* the row path: ``read_records`` -> ``FrameColumns`` -> Arrow (what ``show``,
  ``summary``, ``timeline`` and ``frames_table(records)`` use);
* the table path: ``read_batches`` (the columnar path) -> Arrow -> pandas (what
  ``frames``, ``frames_table``/``frames_df``, ``analyze`` and the explorer use).

A failure is an exception, the intact capture after the bad one not read in
full, or the two paths disagreeing (tables or per-file reports).  With
``--memory-mib`` the reads run under an address-space limit that much above
what the process holds after a first read, so a corrupt length that reserves
memory fails as ``MemoryError``.  Prints counts per path and exits 1 on any
failure.  tests/test_capture_fuzz.py runs a small slice of this (no memory
limit) on every test run.
"""

from __future__ import annotations

import argparse
import random
import re
import resource
import struct
import tempfile
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from dcpinspect import encode
from dcpinspect.capture.pcapfile import MAX_RECORD
from dcpinspect.capture.pcapwrite import PcapWriter, TcpConversation
from dcpinspect.capture.read import read_records
from dcpinspect.flows.records import CaptureStats
from dcpinspect.tables.columnar import read_batches
from dcpinspect.tables.export import frames_table
from dcpinspect.tables.frames_vector import SCHEMA
from dcpinspect.tables.schema import pandas_dtype

PATHS = ("row", "table")


def sample_pcap(path: Path) -> bytes:
    items = b"".join(
        encode("DCP_MUTATION", extras={"by_seqno": i + 1, "rev_seqno": 1}, key=f"k{i}", value=bytes(40 + i), opaque=7) for i in range(12)
    )
    with PcapWriter(path) as w:
        conv = TcpConversation(w, ("10.0.0.1", 50000), ("10.0.0.2", 11210), mss=200)
        conv.open(1_700_000_000_000_000_000)
        t = conv.send("c2s", encode("DCP_OPEN", key="c", extras={"flags": 1}, opaque=1), 1_700_000_000_010_000_000)
        t = conv.send("s2c", items, t)
        conv.close(t)
    return path.read_bytes()


def as_pcapng(pcap: bytes) -> bytes:
    """The same packets as pcapng (section header, one interface with ns ``if_tsresol``, enhanced packet blocks)."""

    def block(btype: int, body: bytes) -> bytes:
        body += bytes(-len(body) % 4)
        n = 12 + len(body)
        return struct.pack("<II", btype, n) + body + struct.pack("<I", n)

    out = block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    out += block(1, struct.pack("<HHI", 1, 0, 262144) + struct.pack("<HHB3x", 9, 1, 9) + b"\0\0\0\0")
    pos = 24
    while pos < len(pcap):
        sec, frac, caplen, wirelen = struct.unpack_from("<IIII", pcap, pos)
        ts = sec * 1_000_000_000 + frac
        out += block(6, struct.pack("<IIIII", 0, ts >> 32, ts & 0xFFFFFFFF, caplen, wirelen) + pcap[pos + 16 : pos + 16 + caplen])
        pos += 16 + caplen
    return out


def _pcap_records(data: bytes) -> list[int]:
    out, pos = [], 24
    while pos + 16 <= len(data):
        out.append(pos)
        pos += 16 + struct.unpack_from("<I", data, pos + 8)[0]  # always moves on
    return out


def _pcapng_blocks(data: bytes) -> list[tuple[int, int, int]]:
    out, pos = [], 0
    while pos + 8 <= len(data):
        btype, blen = struct.unpack_from("<II", data, pos)
        if blen < 12:
            break
        out.append((pos, btype, blen))
        pos += blen
    return out


def _length(rng: random.Random, old: int) -> int:
    """A corrupt length: huge, at or past the record limit, a little off, or anything."""
    return rng.choice(
        [0xFFFFFFFC, 0xFFFFFFFF, MAX_RECORD, MAX_RECORD + 4, MAX_RECORD - 4, old + 4, old - 4, old * 2, rng.getrandbits(32)]
    ) % (1 << 32)


def aimed(rng: random.Random, out: bytearray, fmt: str) -> None:
    """Damage one field that declares a length or a time (in place)."""
    pack = struct.pack_into
    if fmt == "pcap":
        recs = _pcap_records(bytes(out))
        what = rng.randrange(4)
        if what == 0:
            pack("<I", out, 16, rng.choice([0, 0xFFFFFFFF, MAX_RECORD, rng.getrandbits(32)]))  # snaplen
        elif what == 1 and recs:
            at = rng.choice(recs)
            pack("<I", out, at + 8, _length(rng, struct.unpack_from("<I", out, at + 8)[0]))
        elif what == 2 and recs:
            pack("<II", out, rng.choice(recs), rng.getrandbits(32), rng.choice([0xFFFFFFFF, rng.getrandbits(32)]))
        else:
            n = _length(rng, 64)
            out += struct.pack("<IIII", 1_700_000_100, 0, n, n) + bytes(rng.randrange(64))
        return
    blocks = _pcapng_blocks(bytes(out))
    epbs = [b for b in blocks if b[1] == 6]
    what = rng.randrange(5)
    if what == 0 and blocks:  # a block length, leading or trailing
        at, _btype, blen = rng.choice(blocks)
        pack("<I", out, at + 4 if rng.random() < 0.7 else at + blen - 4, _length(rng, blen))
    elif what == 1 and epbs:  # a packet's timestamp: high word or one bit
        at = rng.choice(epbs)[0]
        if rng.random() < 0.5:
            pack("<I", out, at + 12, rng.choice([0xFFFFFFFF, 0x80000000, rng.getrandbits(32)]))
        else:
            out[at + 12 + rng.randrange(8)] ^= 1 << rng.randrange(8)
    elif what == 2:  # if_tsresol: any byte, or one bit of it
        i = bytes(out).find(struct.pack("<HH", 9, 1))
        if i >= 0:
            out[i + 4] = rng.randrange(256) if rng.random() < 0.5 else out[i + 4] ^ (1 << rng.randrange(8))
    elif what == 3 and epbs:  # a packet's captured length
        at = rng.choice(epbs)[0]
        pack("<I", out, at + 20, _length(rng, struct.unpack_from("<I", out, at + 20)[0]))
    else:  # a block appended that claims more than the file holds
        btype = rng.choice([0x0A0D0D0A, 1, 3, 6, 0x0BAD])
        body = struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1) if btype == 0x0A0D0D0A else bytes(20)
        out += struct.pack("<II", btype, _length(rng, 64) & ~3) + body + bytes(rng.randrange(64))


def mutate(rng: random.Random, data: bytes, fmt: str) -> bytes:
    """A corrupted copy of ``data`` (intact): often one aimed field, random bytes, sometimes cut short."""
    out = bytearray(data)
    if rng.random() < 0.6:
        aimed(rng, out, fmt)  # first: the fields are found by walking the intact structure
    for _ in range(rng.randrange(0 if rng.random() < 0.3 else 1, 30)):
        out[rng.randrange(len(out))] = rng.randrange(256)
    if rng.random() < 0.3:
        del out[rng.randrange(len(out)) :]
    return bytes(out)


@dataclass
class Tally:
    """What one path did with the corrupted files."""

    files: int = 0
    failures: int = 0
    not_readable: int = 0
    problems: int = 0
    rows: int = 0
    reported: Counter[str] = field(default_factory=Counter)  # file problems and errors by kind
    kinds: Counter[tuple[str, str, int]] = field(default_factory=Counter)
    first: list[str] = field(default_factory=list)  # the first traceback of each kind

    def failed(self, what: str, detail: str) -> None:
        self.failures += 1
        sig = (what, detail, 0)
        if sig not in self.kinds:
            self.first.append(f"{what}: {detail}")
        self.kinds[sig] += 1

    def crashed(self, exc: BaseException) -> None:
        self.failures += 1
        tb = traceback.extract_tb(exc.__traceback__)[-1]
        sig = (type(exc).__name__, Path(tb.filename).name, tb.lineno or 0)
        if sig not in self.kinds:
            self.first.append("".join(traceback.format_exception(exc)))
        self.kinds[sig] += 1


def _row_path(paths: list[str], _rng: random.Random) -> tuple[pa.Table, CaptureStats]:
    st = CaptureStats()
    return frames_table(list(read_records(paths, stats=st))), st


def _table_path(paths: list[str], rng: random.Random) -> tuple[pa.Table, CaptureStats]:
    st = CaptureStats()
    table = pa.Table.from_batches(list(read_batches(paths, stats=st, rows=rng.choice([3, 64, 65536]))), schema=SCHEMA)
    table.to_pandas(types_mapper=pandas_dtype)  # what frames_df hands back
    return table, st


def run(count: int, seed: int, tmp: Path) -> tuple[dict[str, Tally], int]:
    """``count`` corrupted captures through both paths; returns each path's tally and how many times the paths disagreed."""
    rng = random.Random(seed)
    samples = {"pcap": sample_pcap(tmp / "s.pcap")}
    samples["pcapng"] = as_pcapng(samples["pcap"])
    intact = {}
    for fmt, data in samples.items():
        intact[fmt] = tmp / f"intact.{fmt}"
        intact[fmt].write_bytes(data)
    want: dict[str, dict[str, Any]] = {}
    for fmt, p in intact.items():
        st = CaptureStats()
        list(read_records([str(p)], stats=st))
        want[fmt] = st.files[str(p)]
    tallies = {name: Tally() for name in PATHS}
    readers: dict[str, Callable[[list[str], random.Random], tuple[pa.Table, CaptureStats]]] = {"row": _row_path, "table": _table_path}
    disagree = 0
    for _ in range(count):
        fmt = rng.choice(["pcap", "pcapng"])
        after = rng.choice(["pcap", "pcapng"])
        path = tmp / f"x.{fmt}"
        path.write_bytes(mutate(rng, samples[fmt], fmt))
        paths = [str(path), str(intact[after])]
        done: dict[str, tuple[pa.Table, CaptureStats]] = {}
        for name in PATHS:
            t = tallies[name]
            t.files += 1
            try:
                table, st = done[name] = readers[name](paths, random.Random(rng.random()))
            except Exception as exc:  # MemoryError included: a corrupt length reserved what the file cannot hold
                t.crashed(exc)
                continue
            info = st.files[str(path)]
            t.not_readable += bool(info["error"])
            t.problems += len(info["problems"])
            for text in [*info["problems"], *([info["error"].partition(": ")[2]] if info["error"] else [])]:
                t.reported[re.split(r" \(|:|;| \d", text, maxsplit=1)[0]] += 1
            t.rows += table.num_rows
            if info["error"] and "byte offset" not in info["error"]:
                t.failed("error without a byte offset", info["error"])
            if st.files[paths[1]] != want[after]:
                t.failed("the intact capture after a bad one was not read in full", repr(st.files[paths[1]]))
        if len(done) == len(PATHS):
            (a, sa), (b, sb) = done["row"], done["table"]
            if not a.equals(b) or sa.files != sb.files:
                disagree += 1
    return tallies, disagree


def _limit_memory(mib: int) -> None:
    """Cap the address space at what the process maps now plus ``mib`` MiB."""
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * resource.getpagesize()
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = mapped + (mib << 20)
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--count", type=int, default=5_000, help="corrupted captures (default 5000)")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--memory-mib", type=int, default=200, help="address space allowed above the start (0: no limit)")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="dcpinspect-fuzz-"))
    run(2, args.seed + 1, tmp)  # warm up: imports, thread pools and arenas are mapped before the limit
    if args.memory_mib:
        _limit_memory(args.memory_mib)
    tallies, disagree = run(args.count, args.seed, tmp)
    print(f"fuzz_captures: {args.count} corrupted captures (seed {args.seed}), each read followed by an intact capture")
    for name, label in (("row", "read_records -> FrameColumns"), ("table", "read_batches (columnar)")):
        t = tallies[name]
        print(
            f"  {name:5} path ({label}): {t.files} files, {t.failures} failures, {t.not_readable} not readable, "
            f"{t.problems} file problems, {t.rows} table rows"
        )
        for sig, n in t.kinds.most_common():
            print(f"    {n} x {sig}")
    print("  reported (row path): " + ", ".join(f"{n} {kind}" for kind, n in tallies["row"].reported.most_common()))
    print(f"  paths disagree on {disagree} of {args.count} captures")
    for name in PATHS:
        for text in tallies[name].first:
            print(f"--- first {name}-path failure of its kind:\n{text}")
    return 1 if disagree or any(t.failures for t in tallies.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
